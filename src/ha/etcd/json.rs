//! What etcd's JSON gateway speaks: keys and values in base64, int64s
//! as strings, and the bodies of the calls the replicas make.

use base64::Engine as _;
use serde_json::{json, Value};

use super::KeyValue;

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
pub(super) fn int(value: &Value) -> i64 {
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
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
