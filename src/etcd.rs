//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/...`,
//! HTTP/1.1, keys and values in base64), enough for the replicas of SPEC
//! §12: ranges, conditioned transactions and leases.
//!
//! The gateway is part of every etcd v3 server, so nothing is generated at
//! build time (no `protoc`) and a machine with only the Rust toolchain
//! builds it. Calls are blocking, each bounded by a timeout, and run off
//! the actors' thread (the store's writes on a blocking-pool thread, the
//! leadership on a thread of its own). An endpoint that fails is left for
//! the next one; the error of a call that no endpoint answered names them
//! all.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
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

/// One `http://host:port` endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    text: String,
    authority: String,
}

/// A key and what etcd holds under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
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
        })
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
    pub fn get(&self, key: &[u8]) -> Result<Option<Kv>, EtcdError> {
        let answer = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        Ok(kvs(&answer).into_iter().next())
    }

    /// Every key under `prefix`.
    pub fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        Ok(kvs(&answer))
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
            match post(endpoint, path, body, token, share) {
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
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(format!(
            "{text}: an etcd endpoint is http://host:port (https is not supported: reach a TLS cluster through a local gateway)"
        ));
    };
    let authority = rest.trim_end_matches('/');
    let valid = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid || authority.contains('/') {
        return Err(format!("{text}: an etcd endpoint is http://host:port"));
    }
    Ok(Endpoint {
        text: text.to_string(),
        authority: authority.to_string(),
    })
}

/// One request on a connection of its own; the status and the JSON body.
fn post(
    endpoint: &Endpoint,
    path: &str,
    body: &Value,
    token: Option<&str>,
    timeout: Duration,
) -> std::io::Result<(u16, Value)> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> = endpoint.authority.to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "did not resolve");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or(last)?;
    stream.set_nodelay(true)?;
    let body = body.to_string();
    let authorization = token
        .map(|t| format!("Authorization: {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        endpoint.authority,
        body.len()
    );
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&chunk[..n]);
                if response.len() > MAX_RESPONSE {
                    return Err(std::io::Error::other(format!(
                        "a response over {MAX_RESPONSE} bytes"
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                ))
            }
            Err(e) => return Err(e),
        }
    }
    parse_response(&response)
}

/// Status and JSON body of an HTTP/1.1 response read to its end
/// (`Connection: close`), chunked or not.
fn parse_response(response: &[u8]) -> std::io::Result<(u16, Value)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("a response without headers"))?;
    let head = std::str::from_utf8(&response[..split]).map_err(|_| bad("headers not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| bad("no HTTP status"))?;
    let chunked = lines.any(|line| {
        let lower = line.to_ascii_lowercase();
        lower.starts_with("transfer-encoding:") && lower.contains("chunked")
    });
    let raw = &response[split + 4..];
    let body = if chunked {
        dechunk(raw).ok_or_else(|| bad("a chunked body cut short"))?
    } else {
        raw.to_vec()
    };
    // A streamed call (lease keep-alive) answers one JSON value per line.
    let first = body
        .split(|b| *b == b'\n')
        .find(|line| !line.iter().all(u8::is_ascii_whitespace))
        .unwrap_or(&[]);
    let value = if first.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(first).map_err(|_| {
            bad("an answer that is not etcd's (not JSON): is this an etcd v3 client URL?")
        })?
    };
    Ok((status, value))
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
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
pub fn kvs(answer: &Value) -> Vec<Kv> {
    answer["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| Kv {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_host_port() {
        assert!(parse_endpoint("http://127.0.0.1:2379").is_ok());
        assert!(parse_endpoint("http://etcd-1:2379/").is_ok());
        for bad in [
            "https://a:1",
            "127.0.0.1:2379",
            "http://a",
            "http://:1",
            "http://a:0",
            "http://a:1/x",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_chunked_streamed_answer_gives_its_first_value() {
        let response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"a\":\"1\"}\r\n1\r\n\n\r\n0\r\n\r\n";
        let (status, value) = parse_response(response).unwrap();
        assert_eq!((status, int(&value["a"])), (200, 1));
        let plain = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 20\r\n\r\n{\"message\":\"no lea\"}";
        assert_eq!(parse_response(plain).unwrap().0, 503);
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab")
                .is_err()
        );
        assert!(parse_response(b"garbage").is_err());
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
