//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/...`,
//! HTTP/1.1, keys and values in base64), enough for the replicas of design
//! §12: ranges, conditioned transactions and leases.
//!
//! The gateway is part of every etcd v3 server, so nothing is generated at
//! build time (no `protoc`) and a machine with only the Rust toolchain
//! builds it. Connections are kept alive between calls, over TLS to
//! `https://` endpoints (a CA of one's own, a client certificate: see
//! [`TlsFiles`]). Calls are blocking, each bounded by one deadline from
//! name resolution to the answer's last byte, and run off the actors'
//! thread (the store's writes on a blocking-pool thread, the
//! leadership on a thread of its own). An endpoint that fails is left for
//! the next one; the error of a call that no endpoint answered names them
//! all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod json;
mod tls;

pub(crate) use json::{b64, created_at, kvs, modified_at, prefix_range, put, range, revision};
use json::{int, prefix_end};
pub use tls::TlsFiles;

/// How many renewals a lease gets per TTL (a leader's and a requester's
/// session alike): a renewal is never more than a tenth of the TTL old
/// when an etcd election begins.
pub(crate) const RENEWALS_PER_TTL: u32 = 10;

/// The longest response read, in bytes (the records are a few KiB).
pub const MAX_RESPONSE: usize = 4 << 20;

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// No endpoint answered.
    #[error("etcd unreachable ({0})")]
    Unreachable(String),
    /// An endpoint answered with an error.
    #[error("etcd at {endpoint} refused {call}: {message}")]
    Refused {
        /// The endpoint.
        endpoint: String,
        /// The gateway path.
        call: &'static str,
        /// What etcd said.
        message: String,
    },
}

/// One `http://host:port` or `https://host:port` endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// As configured.
    text: String,
    /// `scheme://host:port`.
    base: String,
    /// Whether it is `https`.
    tls: bool,
}

/// A key and what etcd holds under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A client of one etcd cluster.
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<Endpoint>,
    /// The endpoint that answered last: tried first.
    preferred: AtomicUsize,
    timeout: Duration,
    /// etcd's own auth: the user, its password, and the token they gave.
    auth: Option<Auth>,
    /// The HTTP client: kept-alive connections, and the TLS of `https`.
    agent: ureq::Agent,
    /// What this client's answers told of etcd's raft term and outages.
    terms: std::sync::Mutex<Terms>,
}

/// What a client saw of etcd that puts a lease's time left in doubt: the
/// highest raft term any answer's header named, when it last rose, whether
/// its last call went unanswered, and when etcd last answered again after
/// that. etcd's new raft leader gives every lease a fresh TTL as it takes
/// over, and renewals a member held while etcd could not apply them land
/// when it can (an operator's trial: a requester gone for 4 s had its
/// lease renewed as a paused etcd leader resumed): a lease read soon after
/// either may be alive by etcd's hand, or its holder's past, not its
/// holder's present.
#[derive(Debug, Default)]
struct Terms {
    seen: u64,
    rose_at: Option<Instant>,
    unanswered: bool,
    back_at: Option<Instant>,
}

/// etcd's own authentication (its `Debug` shows no password or token).
struct Auth {
    user: String,
    password: String,
    token: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth {{ user: {:?}, .. }}", self.user)
    }
}

impl Etcd {
    /// A client of the cluster at `endpoints` (`http://host:port` each),
    /// every call bounded by `timeout` whatever the endpoints tried.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Etcd, String> {
        if endpoints.is_empty() {
            return Err("no endpoint".into());
        }
        let endpoints = endpoints
            .iter()
            .map(|text| parse_endpoint(text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Etcd {
            endpoints,
            preferred: AtomicUsize::new(0),
            timeout,
            auth: None,
            agent: agent(ureq::tls::TlsConfig::default()),
            terms: std::sync::Mutex::default(),
        })
    }

    /// Speaks TLS to the `https` endpoints as `files` say: trusting the
    /// authorities of `ca_file`, presenting `cert_file` and `key_file`.
    /// Refused when no endpoint is `https` (the files would guard
    /// nothing).
    pub fn with_tls(mut self, files: &TlsFiles) -> Result<Self, String> {
        if !files.any() {
            return Ok(self);
        }
        if let Some(plain) = self.endpoints.iter().find(|e| !e.tls) {
            return Err(format!(
                "{}: TLS files are given, and this endpoint is plain http (give every endpoint as https://)",
                plain.text
            ));
        }
        self.agent = agent(files.config()?);
        Ok(self)
    }

    /// Authenticates as `user` with `password` (etcd's own auth): every
    /// call carries the token etcd gives for them, asked again when etcd
    /// says it is no longer valid.
    pub fn with_auth(mut self, user: &str, password: &str) -> Self {
        self.auth = Some(Auth {
            user: user.to_string(),
            password: password.to_string(),
            token: std::sync::Mutex::new(None),
        });
        self
    }

    /// The endpoints, as configured.
    pub fn endpoints(&self) -> String {
        let texts: Vec<&str> = self.endpoints.iter().map(|e| e.text.as_str()).collect();
        texts.join(", ")
    }

    /// What `key` holds, if anything.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        Ok(kvs(&answer).into_iter().next())
    }

    /// Every key under `prefix`.
    pub fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        Ok(kvs(&answer))
    }

    /// Every key under `prefix`, without the values.
    pub fn keys_under(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, EtcdError> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)), "keys_only": true }),
        )?;
        Ok(kvs(&answer).into_iter().map(|kv| kv.key).collect())
    }

    /// Puts `value` under `key`, unconditionally.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), EtcdError> {
        self.call(
            "/v3/kv/put",
            &json!({ "key": b64(key), "value": b64(value) }),
        )
        .map(drop)
    }

    /// Deletes `key`.
    pub fn delete(&self, key: &[u8]) -> Result<(), EtcdError> {
        self.call("/v3/kv/deleterange", &json!({ "key": b64(key) }))
            .map(drop)
    }

    /// Deletes every key under `prefix`; how many there were.
    pub fn delete_prefix(&self, prefix: &[u8]) -> Result<u64, EtcdError> {
        let answer = self.call(
            "/v3/kv/deleterange",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        Ok(int(&answer["deleted"]).unsigned_abs())
    }

    /// Whether the member this client reaches first is the raft leader of
    /// its cluster.
    pub fn member_is_leader(&self) -> Result<bool, EtcdError> {
        let answer = self.call("/v3/maintenance/status", &json!({}))?;
        // Member ids are uint64, written as strings: compared as given
        // (an id above i64::MAX does not parse as an int64).
        let id = |value: &Value| match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let me = id(&answer["header"]["member_id"]);
        Ok(!me.is_empty() && me != "0" && me != "null" && id(&answer["leader"]) == me)
    }

    /// A transaction: `success` if every comparison holds, else `failure`.
    /// Whether it succeeded, and the responses of the branch taken.
    pub fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<(bool, Value), EtcdError> {
        let answer = self.call(
            "/v3/kv/txn",
            &json!({ "compare": compare, "success": success, "failure": failure }),
        )?;
        let succeeded = answer["succeeded"].as_bool().unwrap_or(false);
        Ok((succeeded, answer))
    }

    /// A new lease of `ttl` (whole seconds, at least 1): its id and the TTL
    /// etcd granted (it raises TTLs below its minimum).
    pub fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        let seconds = ttl.as_secs().max(1);
        let answer = self.call("/v3/lease/grant", &json!({ "TTL": seconds }))?;
        let id = int(&answer["ID"]);
        let granted = int(&answer["TTL"]);
        if id == 0 || granted <= 0 {
            return Err(self.refused("/v3/lease/grant", &answer));
        }
        Ok((id, Duration::from_secs(granted.unsigned_abs())))
    }

    /// Renews lease `id`: the TTL it has again, `None` if it is gone.
    pub fn keep_alive(&self, id: i64) -> Result<Option<Duration>, EtcdError> {
        let answer = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        // A streamed call reports a failure inside the stream, with 200.
        if answer.get("result").is_none() {
            return Err(self.refused("/v3/lease/keepalive", &answer));
        }
        let ttl = int(&answer["result"]["TTL"]);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl.unsigned_abs())))
    }

    /// As [`Etcd::keep_alive`], for a lease that `key` is on: "gone" is
    /// taken only once a linearizable read finds `key` gone or on another
    /// lease. A member whose lessor is behind its log (just elected, its
    /// applies lagging) answers "not found" for a lease that lives; the
    /// key, deleted in the same apply as its lease's end, says whether it
    /// does. While it holds, the answer is an error: tried again.
    pub fn keep_alive_on(&self, id: i64, key: &[u8]) -> Result<Option<Duration>, EtcdError> {
        match self.keep_alive(id)? {
            Some(ttl) => Ok(Some(ttl)),
            None => match self.get(key)? {
                Some(kv) if kv.lease == id => Err(EtcdError::Refused {
                    endpoint: self.endpoints[self.preferred.load(Ordering::Relaxed)]
                        .text
                        .clone(),
                    call: "/v3/lease/keepalive",
                    message: format!(
                        "lease {id} said gone while {} is still on it (a member's lessor behind its log): tried again",
                        String::from_utf8_lossy(key)
                    ),
                }),
                _ => Ok(None),
            },
        }
    }

    /// How long lease `id` has left and the TTL it was granted, `None` if
    /// it is gone. What is left is full again after each renewal: a lease
    /// whose holder stopped renewing it shows the time since.
    pub fn time_to_live(&self, id: i64) -> Result<Option<(Duration, Duration)>, EtcdError> {
        let answer = self.call("/v3/lease/timetolive", &json!({ "ID": id.to_string() }))?;
        let (left, granted) = (int(&answer["TTL"]), int(&answer["grantedTTL"]));
        Ok((left > 0 && granted > 0).then(|| {
            (
                Duration::from_secs(left.unsigned_abs()),
                Duration::from_secs(granted.unsigned_abs()),
            )
        }))
    }

    /// Ends lease `id` at once (its keys go with it).
    pub fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .map(drop)
    }

    fn refused(&self, call: &'static str, answer: &Value) -> EtcdError {
        EtcdError::Refused {
            endpoint: self.endpoints[self.preferred.load(Ordering::Relaxed)]
                .text
                .clone(),
            call,
            message: answer.to_string(),
        }
    }

    /// POSTs `body` to `path` (see [`Etcd::call_with`]), with the auth
    /// token if there is a user.
    fn call(&self, path: &'static str, body: &Value) -> Result<Value, EtcdError> {
        let Some(auth) = &self.auth else {
            return self.call_with(path, body, None);
        };
        // The lock is let go before authenticating (which takes it).
        let cached = lock(&auth.token).clone();
        let token = match cached {
            Some(token) => token,
            None => self.authenticate(auth)?,
        };
        match self.call_with(path, body, Some(&token)) {
            Err(EtcdError::Refused { message, .. }) if token_refused(&message) => {
                // Expired (etcd's simple tokens last 5 minutes) or revoked:
                // asked again, once.
                let token = self.authenticate(auth)?;
                self.call_with(path, body, Some(&token))
            }
            other => other,
        }
    }

    /// Watches the keys from `key` up to `range_end` (excluded) for
    /// `span` at most, calling `changed` once for each batch of changes
    /// etcd reports; `Ok` when the span ends, `Err` when the watch could
    /// not be made or broke (the caller looks for itself meanwhile, and
    /// watches again). One endpoint per call: the one that answered last.
    pub fn watch_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        span: Duration,
        mut changed: impl FnMut(),
    ) -> Result<(), EtcdError> {
        use std::io::{BufRead as _, Read as _};
        let index = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
        let endpoint = &self.endpoints[index];
        let unreachable = |e: String| EtcdError::Unreachable(format!("{}: {e}", endpoint.text));
        let body = json!({ "create_request": { "key": b64(key), "range_end": b64(range_end) } });
        let mut request = self
            .agent
            .post(format!("{}/v3/watch", endpoint.base))
            .config()
            .timeout_global(Some(span))
            .build()
            .header("Content-Type", "application/json");
        let token = self
            .auth
            .as_ref()
            .and_then(|auth| lock(&auth.token).clone());
        if let Some(token) = &token {
            request = request.header("Authorization", token.as_str());
        }
        let mut response = request
            .send(body.to_string())
            .map_err(|e| unreachable(describe(&e, span)))?;
        if response.status().as_u16() != 200 {
            // Moved on: the next call tries the next endpoint.
            self.preferred.store(index + 1, Ordering::Relaxed);
            return Err(unreachable(format!("HTTP {}", response.status())));
        }
        let reader = response.body_mut().with_config().limit(u64::MAX).reader();
        let mut lines = std::io::BufReader::new(reader);
        let mut line = String::new();
        loop {
            line.clear();
            let limit = u64::try_from(MAX_RESPONSE).unwrap_or(u64::MAX);
            match (&mut lines).take(limit + 1).read_line(&mut line) {
                Ok(0) => return Err(unreachable("the watch ended".into())),
                Ok(_) if line.len() > MAX_RESPONSE => {
                    return Err(unreachable(format!(
                        "a watch message over {MAX_RESPONSE} bytes"
                    )))
                }
                Ok(_) => {
                    let Ok(message) = serde_json::from_str::<Value>(&line) else {
                        return Err(unreachable("a watch message that is not JSON".into()));
                    };
                    let result = &message["result"];
                    if !message["error"].is_null() || result["canceled"].as_bool() == Some(true) {
                        return Err(unreachable(format!("the watch was cancelled: {line}")));
                    }
                    if result["events"].as_array().is_some_and(|e| !e.is_empty()) {
                        changed();
                    }
                }
                // The span is over (ureq's deadline): a watch well kept.
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Ok(()),
                Err(e) if e.to_string().contains("timeout") => return Ok(()),
                Err(e) => return Err(unreachable(e.to_string())),
            }
        }
    }

    /// A new token for `auth`'s user.
    fn authenticate(&self, auth: &Auth) -> Result<String, EtcdError> {
        let answer = self.call_with(
            "/v3/auth/authenticate",
            &json!({ "name": auth.user, "password": auth.password }),
            None,
        )?;
        let token = answer["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| EtcdError::Refused {
                endpoint: self.endpoints(),
                call: "/v3/auth/authenticate",
                message: "no token in the answer".into(),
            })?;
        *lock(&auth.token) = Some(token.clone());
        Ok(token)
    }

    /// Notes the raft term `answer`'s header names, and that etcd answered.
    fn saw_term(&self, answer: &Value) {
        let mut terms = lock(&self.terms);
        if std::mem::take(&mut terms.unanswered) {
            terms.back_at = Some(Instant::now());
        }
        let Ok(term) = u64::try_from(int(&answer["header"]["raft_term"])) else {
            return;
        };
        if term > terms.seen {
            // The first term this client sees is where it starts, not a
            // rise.
            if terms.seen > 0 {
                terms.rose_at = Some(Instant::now());
            }
            terms.seen = term;
        }
    }

    /// When this client last saw etcd's raft term rise (etcd elected a
    /// raft leader, which gave every lease a fresh TTL); none if every
    /// answer it had named one term.
    pub fn raft_term_rose_at(&self) -> Option<Instant> {
        lock(&self.terms).rose_at
    }

    /// Since when what etcd says is left of a lease may not be its
    /// holder's doing now: the later of the last rise of etcd's raft term
    /// and the last time etcd answered this client again after a call of
    /// it went unanswered (renewals held meanwhile land then); none if
    /// neither happened since this client began.
    pub fn leases_in_doubt_since(&self) -> Option<Instant> {
        let terms = lock(&self.terms);
        terms.rose_at.max(terms.back_at)
    }

    /// POSTs `body` to `path` (with `token`, if any), trying the endpoint
    /// that answered last first, then the others.
    ///
    /// One deadline covers the whole call: each endpoint left gets an
    /// equal share of what remains, so a member that accepts connections
    /// and never answers (paused, partitioned) costs a share, not the
    /// call.
    fn call_with(
        &self,
        path: &'static str,
        body: &Value,
        token: Option<&str>,
    ) -> Result<Value, EtcdError> {
        let first = self.preferred.load(Ordering::Relaxed);
        let deadline = Instant::now() + self.timeout;
        let mut failures = Vec::new();
        let count = self.endpoints.len();
        for step in 0..count {
            let index = (first + step) % count;
            let endpoint = &self.endpoints[index];
            let left = deadline.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(count - step).unwrap_or(1);
            if share.is_zero() {
                failures.push(format!(
                    "{}: not tried (the call's deadline passed)",
                    endpoint.text
                ));
                continue;
            }
            match post(&self.agent, endpoint, path, body, token, share) {
                Ok((200, answer)) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    self.saw_term(&answer);
                    return Ok(answer);
                }
                Ok((status, answer)) => {
                    let message = answer["message"]
                        .as_str()
                        .or_else(|| answer["error"].as_str())
                        .map_or_else(|| format!("HTTP {status}"), str::to_string);
                    if unavailable(&message) {
                        failures.push(format!("{}: {message}", endpoint.text));
                        continue;
                    }
                    return Err(EtcdError::Refused {
                        endpoint: endpoint.text.clone(),
                        call: path,
                        message,
                    });
                }
                Err(e) => failures.push(format!("{}: {e}", endpoint.text)),
            }
        }
        lock(&self.terms).unanswered = true;
        Err(EtcdError::Unreachable(failures.join("; ")))
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether etcd refused a call for its token (expired, revoked, or the
/// server restarted with its simple tokens gone).
fn token_refused(message: &str) -> bool {
    [
        "invalid auth token",
        "token is expired",
        "user name is empty",
        "authentication failed",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Errors that say "ask another member" rather than "no".
fn unavailable(message: &str) -> bool {
    [
        "no leader",
        "timed out",
        "unavailable",
        "not capable",
        "stopped",
    ]
    .iter()
    .any(|m| message.contains(m))
}

fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    let form = "an etcd endpoint is http://host:port or https://host:port";
    let (tls, rest) = match (text.strip_prefix("https://"), text.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(format!("{text}: {form}")),
    };
    let authority = rest.trim_end_matches('/');
    let valid = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid || authority.contains('/') {
        return Err(format!("{text}: {form}"));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(Endpoint {
        text: text.to_string(),
        base: format!("{scheme}://{authority}"),
        tls,
    })
}

/// The HTTP client every call goes through: connections kept alive
/// between calls (a few per endpoint), no proxy from the environment, no
/// redirect followed, statuses handed back rather than made errors.
fn agent(tls: ureq::tls::TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .max_idle_connections_per_host(4)
        .max_idle_age(Duration::from_secs(30))
        .user_agent("poolgate")
        .tls_config(tls)
        .build()
        .into()
}

/// One request, bounded by `timeout` from name resolution to the last
/// byte; the status and the first JSON value of the body.
fn post(
    agent: &ureq::Agent,
    endpoint: &Endpoint,
    path: &str,
    body: &Value,
    token: Option<&str>,
    timeout: Duration,
) -> Result<(u16, Value), String> {
    let mut request = agent
        .post(format!("{}{path}", endpoint.base))
        .config()
        .timeout_global(Some(timeout))
        .build()
        .header("Content-Type", "application/json");
    if let Some(token) = token {
        request = request.header("Authorization", token);
    }
    let mut response = request
        .send(body.to_string())
        .map_err(|e| describe(&e, timeout))?;
    let status = response.status().as_u16();
    let bytes = response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE as u64)
        .read_to_vec()
        .map_err(|e| describe(&e, timeout))?;
    Ok((status, first_value(&bytes)?))
}

/// What went wrong with a call, in words an operator can act on.
fn describe(error: &ureq::Error, timeout: Duration) -> String {
    match error {
        ureq::Error::Timeout(_) => format!("no answer within {timeout:?}"),
        ureq::Error::BodyExceedsLimit(_) => format!("a response over {MAX_RESPONSE} bytes"),
        other => other.to_string(),
    }
}

/// The first JSON value of a body: a streamed call (lease keep-alive)
/// answers one value per line.
fn first_value(body: &[u8]) -> Result<Value, String> {
    let first = body
        .split(|b| *b == b'\n')
        .find(|line| !line.iter().all(u8::is_ascii_whitespace))
        .unwrap_or(&[]);
    if first.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(first).map_err(|_| {
        "an answer that is not etcd's (not JSON): is this an etcd v3 client URL?".to_string()
    })
}

#[cfg(test)]
mod tests;
