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

use base64::Engine as _;
use serde_json::{json, Value};

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

/// The TLS of `https://` endpoints: whom to trust, and who we are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates of the authorities that sign etcd's server
    /// certificates (`[state] ca_file`); none: Mozilla's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The client's PEM certificate chain (`[state] cert_file`), with
    /// `key_file`, for etcd's `--client-cert-auth`.
    pub cert_file: Option<std::path::PathBuf>,
    /// The client's PEM private key (`[state] key_file`).
    pub key_file: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The TLS configuration these files make; an error names the file
    /// and the key (never what a key file holds).
    fn config(&self) -> Result<ureq::tls::TlsConfig, String> {
        use ureq::tls::{ClientCert, PemItem, RootCerts, TlsConfig};
        let read = |path: &std::path::Path, key: &str| {
            std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()))
        };
        let mut tls = TlsConfig::builder();
        if let Some(path) = &self.ca_file {
            let pem = read(path, "ca_file")?;
            let mut roots = Vec::new();
            for item in ureq::tls::parse_pem(&pem) {
                if let Ok(PemItem::Certificate(cert)) = item {
                    roots.push(cert);
                }
            }
            if roots.is_empty() {
                return Err(format!(
                    "ca_file {}: no PEM certificate in it",
                    path.display()
                ));
            }
            tls = tls.root_certs(RootCerts::new_with_certs(&roots));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert_path), Some(key_path)) => {
                let pem = read(cert_path, "cert_file")?;
                let chain: Vec<_> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(PemItem::Certificate(cert)) => Some(cert),
                        _ => None,
                    })
                    .collect();
                if chain.is_empty() {
                    return Err(format!(
                        "cert_file {}: no PEM certificate in it",
                        cert_path.display()
                    ));
                }
                let pem = read(key_path, "key_file")?;
                let key = ureq::tls::parse_pem(&pem)
                    .find_map(|item| match item {
                        Ok(PemItem::PrivateKey(key)) => Some(key),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        format!("key_file {}: no PEM private key in it", key_path.display())
                    })?;
                tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            (Some(_), None) => return Err("cert_file needs key_file too".into()),
            (None, Some(_)) => return Err("key_file needs cert_file too".into()),
        }
        Ok(tls.build())
    }
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

/// The base64 etcd's gateway speaks.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(value: &Value) -> Vec<u8> {
    value
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// An int64 as the gateway writes it (a string), or a number; 0 if absent.
fn int(value: &Value) -> i64 {
    match value {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The key-values of a range response.
pub fn kvs(answer: &Value) -> Vec<KeyValue> {
    answer["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| KeyValue {
                    key: unb64(&kv["key"]),
                    value: unb64(&kv["value"]),
                    create_revision: int(&kv["create_revision"]),
                    mod_revision: int(&kv["mod_revision"]),
                    lease: int(&kv["lease"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The revision a response was taken at.
pub fn revision(answer: &Value) -> i64 {
    int(&answer["header"]["revision"])
}

/// The end of the range of every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A transaction comparison: `key` was created at `revision` (0: it does
/// not exist).
pub fn created_at(key: &[u8], revision: i64) -> Value {
    json!({ "target": "CREATE", "key": b64(key), "create_revision": revision.to_string() })
}

/// A transaction comparison: `key` was last changed at `revision` (0: it
/// does not exist).
pub fn modified_at(key: &[u8], revision: i64) -> Value {
    json!({ "target": "MOD", "key": b64(key), "mod_revision": revision.to_string() })
}

/// A transaction operation: put `value` under `key` (with `lease`, if not 0).
pub fn put(key: &[u8], value: &[u8], lease: i64) -> Value {
    let mut put = json!({ "key": b64(key), "value": b64(value) });
    if lease != 0 {
        put["lease"] = Value::String(lease.to_string());
    }
    json!({ "request_put": put })
}

/// A transaction operation: read `key`.
pub fn range(key: &[u8]) -> Value {
    json!({ "request_range": { "key": b64(key) } })
}

/// A transaction's read of every key under `prefix`.
pub fn prefix_range(prefix: &[u8]) -> Value {
    json!({ "request_range": { "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted etcd on 127.0.0.1: answers each call by its path with
    /// `answer(path)` (HTTP 200, JSON), for as long as the test runs.
    fn scripted(answer: fn(&str) -> String) -> String {
        use std::io::{BufRead as _, Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(stream);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                        let mut length = 0;
                        loop {
                            let mut header = String::new();
                            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                                return;
                            }
                            if header.trim().is_empty() {
                                break;
                            }
                            if let Some(n) =
                                header.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                length = n.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        let said = answer(&path);
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{said}",
                            said.len()
                        );
                        if reader.get_mut().write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        endpoint
    }

    /// A member whose lessor is behind its log says "not found" (TTL 0)
    /// of a lease that lives: while the lease's key holds on it, that is
    /// a failed renewal, not the lease's end; once the key is gone, or on
    /// another lease, the lease is gone.
    #[test]
    fn a_lease_said_gone_is_believed_once_its_key_is_gone_too() {
        let client = |endpoint: String| Etcd::new(&[endpoint], Duration::from_secs(2)).unwrap();
        // etcd's answers: the lease said gone; `/p/leader` on lease
        // `lease`, created at `created`.
        fn gone() -> String {
            r#"{"result":{"ID":"7","TTL":"0"}}"#.into()
        }
        fn leader_on(lease: i64, created: i64) -> String {
            serde_json::json!({"kvs": [{
                "key": b64(b"/p/leader"), "value": "",
                "create_revision": created.to_string(), "mod_revision": created.to_string(),
                "lease": lease.to_string(),
            }]})
            .to_string()
        }
        // The key still on lease 7: tried again.
        let lagging = client(scripted(|path| match path {
            "/v3/lease/keepalive" => gone(),
            _ => leader_on(7, 5),
        }));
        let said = lagging.keep_alive_on(7, b"/p/leader").unwrap_err();
        assert!(said.to_string().contains("tried again"), "{said}");
        // The key gone: the lease is gone.
        let ended = client(scripted(|path| match path {
            "/v3/lease/keepalive" => gone(),
            _ => "{}".into(),
        }));
        assert_eq!(ended.keep_alive_on(7, b"/p/leader").unwrap(), None);
        // The key on another lease (taken): gone.
        let taken = client(scripted(|path| match path {
            "/v3/lease/keepalive" => gone(),
            _ => leader_on(8, 9),
        }));
        assert_eq!(taken.keep_alive_on(7, b"/p/leader").unwrap(), None);
        // Renewed: its TTL, the key not read.
        let renewed = client(scripted(|path| match path {
            "/v3/lease/keepalive" => r#"{"result":{"ID":"7","TTL":"10"}}"#.into(),
            _ => "not json".into(),
        }));
        assert_eq!(
            renewed.keep_alive_on(7, b"/p/leader").unwrap(),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn endpoints_are_http_or_https_host_port() {
        assert!(!parse_endpoint("http://127.0.0.1:2379").unwrap().tls);
        assert!(parse_endpoint("http://etcd-1:2379/").is_ok());
        let tls = parse_endpoint("https://etcd-1:2379").unwrap();
        assert!(tls.tls);
        assert_eq!(tls.base, "https://etcd-1:2379");
        for bad in [
            "ftp://a:1",
            "127.0.0.1:2379",
            "http://a",
            "https://:1",
            "http://a:0",
            "http://a:1/x",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_streamed_answer_gives_its_first_value_and_what_is_not_json_is_named() {
        assert_eq!(
            int(&first_value(b"{\"a\":\"1\"}\n{\"a\":\"2\"}\n").unwrap()["a"]),
            1
        );
        assert_eq!(first_value(b"\n  \n").unwrap(), Value::Null);
        let why = first_value(b"<html>").unwrap_err();
        assert!(why.contains("not JSON"), "{why}");
    }

    #[test]
    fn tls_files_given_with_plain_endpoints_or_half_a_client_pair_are_refused() {
        let at =
            |endpoint: &str| Etcd::new(&[endpoint.to_string()], Duration::from_secs(1)).unwrap();
        let files = TlsFiles {
            ca_file: Some("ca.pem".into()),
            ..TlsFiles::default()
        };
        let why = at("http://127.0.0.1:2379").with_tls(&files).unwrap_err();
        assert!(why.contains("plain http"), "{why}");
        let https = || at("https://127.0.0.1:2379");
        let half = TlsFiles {
            cert_file: Some("client.pem".into()),
            ..TlsFiles::default()
        };
        let why = https().with_tls(&half).unwrap_err();
        assert!(why.contains("needs key_file"), "{why}");
        let missing = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let why = https().with_tls(&missing).unwrap_err();
        assert!(why.contains("ca_file /nonexistent/ca.pem"), "{why}");
        assert!(https().with_tls(&TlsFiles::default()).is_ok());
    }

    #[test]
    fn a_prefix_range_ends_after_every_key_under_it() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn no_endpoint_answering_names_them_all() {
        // A port nobody listens on, found by binding and dropping it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let etcd = Etcd::new(std::slice::from_ref(&endpoint), Duration::from_millis(300)).unwrap();
        match etcd.get(b"k") {
            Err(EtcdError::Unreachable(why)) => assert!(why.contains(&endpoint), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
