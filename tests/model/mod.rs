//! A small model of SPEC §1–3, written apart from the core and as plainly
//! as possible: facts in maps, readiness by a full scan, timers by
//! comparison. It reads scenario records as JSON and produces the events
//! the replay should print, so the two can be compared.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Clone, Default, PartialEq, Eq, Debug)]
struct Facts {
    known: bool,
    swim: Option<(String, u64)>,
    available: bool,
    identity: Option<String>,
    fault: Option<String>,
}

impl Facts {
    fn ready(&self) -> bool {
        self.known
            && matches!(&self.swim, Some((s, _)) if s == "alive")
            && self.available
            && self.identity.is_some()
            && self.fault.is_none()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Planning,
    Suspended(Option<u64>),
    Committed,
}

#[derive(Debug)]
struct Run {
    id: String,
    phase: Phase,
    required: BTreeSet<String>,
}

/// The model gate.
pub struct Model {
    window: u64,
    abort: bool,
    wait_timeout: Option<u64>,
    pool: String,
    facts: BTreeMap<String, Facts>,
    ready_epoch: Option<u64>,
    converge_at: Option<u64>,
    last_change: u64,
    epochs: u64,
    run: Option<Run>,
    /// The events so far.
    pub out: Vec<Value>,
}

fn admits(current: &Option<(String, u64)>, state: &str, j: u64) -> bool {
    let Some((s, i)) = current else {
        return state != "suspect";
    };
    let i = *i;
    let down = s == "dead" || s == "left";
    match state {
        "alive" => j > i,
        "suspect" => j >= i && (s == "alive" || (s == "suspect" && j > i)),
        _ => j >= i && !(down && i >= j),
    }
}

impl Model {
    /// A model gate with the config's pool and policy.
    pub fn new(
        pool: &str,
        members: &[&str],
        window: u64,
        abort: bool,
        wait_timeout: Option<u64>,
    ) -> Self {
        Model {
            window,
            abort,
            wait_timeout,
            pool: pool.to_string(),
            facts: members
                .iter()
                .map(|m| (m.to_string(), Facts::default()))
                .collect(),
            ready_epoch: None,
            converge_at: None,
            last_change: 0,
            epochs: 0,
            run: None,
            out: Vec::new(),
        }
    }

    /// Applies one record (after the timers due strictly before it).
    pub fn input(&mut self, line: usize, record: &Value) {
        let at = record["at_ms"].as_u64().unwrap();
        self.fire_before(Some(at));
        let kind = record["type"].as_str().unwrap();
        let node = record["node"].as_str().unwrap_or_default().to_string();
        let reject = |model: &mut Model, error: &str| {
            model
                .out
                .push(json!({"at_ms": at, "event": "rejected", "line": line, "error": error}));
        };
        match kind {
            "define_pool" => {
                let members: Vec<String> = record["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_str().unwrap().to_string())
                    .collect();
                let distinct: BTreeSet<&String> = members.iter().collect();
                if members.is_empty() || distinct.len() != members.len() {
                    return reject(self, "invalid_pool");
                }
                if matches!(&self.run, Some(r) if r.phase == Phase::Committed) {
                    return reject(self, "run_committed");
                }
                self.lose_readiness(at, Value::Null, "pool_redefined");
                self.facts.retain(|n, _| members.contains(n));
                for m in members {
                    self.facts.entry(m).or_default();
                }
                self.pool = record["pool"].as_str().unwrap().to_string();
                self.restart_window(at);
            }
            "begin_planning" => {
                let Some(epoch) = self.ready_epoch else {
                    return reject(self, "pool_not_ready");
                };
                if record["epoch"].as_u64().is_some_and(|e| e != epoch) {
                    return reject(self, "stale_epoch");
                }
                if self.run.is_some() {
                    return reject(self, "run_in_progress");
                }
                let run = record["run"].as_str().unwrap().to_string();
                self.out.push(
                    json!({"at_ms": at, "event": "planning_started", "run": run, "epoch": epoch}),
                );
                self.run = Some(Run {
                    id: run,
                    phase: Phase::Planning,
                    required: BTreeSet::new(),
                });
            }
            "commit_plan" => {
                let run = record["run"].as_str().unwrap();
                if self.run.as_ref().is_none_or(|r| r.id != run) {
                    return reject(self, "unknown_run");
                }
                let Some(epoch) = self.ready_epoch else {
                    return reject(self, "pool_not_ready");
                };
                if record["epoch"].as_u64().is_some_and(|e| e != epoch) {
                    return reject(self, "stale_epoch");
                }
                let required: BTreeSet<String> = record["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_str().unwrap().to_string())
                    .collect();
                if required.iter().any(|n| !self.facts.contains_key(n)) {
                    return reject(self, "not_candidate");
                }
                let active = self.run.as_mut().unwrap();
                if active.phase != Phase::Planning {
                    return reject(self, "run_not_planning");
                }
                active.phase = Phase::Committed;
                active.required = required.clone();
                self.out.push(json!({"at_ms": at, "event": "run_committed", "run": run, "epoch": epoch, "required": required}));
            }
            "finish_run" => {
                let run = record["run"].as_str().unwrap();
                match &self.run {
                    Some(r) if r.id == run && r.phase == Phase::Committed => {
                        self.out
                            .push(json!({"at_ms": at, "event": "run_finished", "run": run}));
                        self.run = None;
                    }
                    Some(r) if r.id == run => reject(self, "run_not_committed"),
                    _ => reject(self, "unknown_run"),
                }
            }
            _ => {
                let mut identity = None;
                if kind == "identity" {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(record["material"].as_str().unwrap());
                    match bytes {
                        Ok(b) if !b.is_empty() && b.len() <= 16 * 1024 => {
                            identity = Some(hex::encode(Sha256::digest(&b)))
                        }
                        _ => return reject(self, "invalid_identity"),
                    }
                }
                self.observe(at, &node, kind, record, identity);
            }
        }
    }

    /// Fires every timer still pending.
    pub fn finish(&mut self) {
        self.fire_before(None);
    }

    fn observe(
        &mut self,
        at: u64,
        node: &str,
        kind: &str,
        record: &Value,
        identity: Option<String>,
    ) {
        let Some(before) = self.facts.get(node).cloned() else {
            return; // not a candidate
        };
        let mut after = before.clone();
        let reason = match kind {
            "known" => {
                after.known = true;
                "view_changed"
            }
            "forgotten" => {
                after.known = false;
                after.identity = None;
                "unknown"
            }
            "swim" => {
                let state = record["state"].as_str().unwrap();
                let inc = record["incarnation"].as_u64().unwrap();
                if !admits(&before.swim, state, inc) {
                    return;
                }
                after.swim = Some((state.to_string(), inc));
                if state == "alive" {
                    "view_changed"
                } else {
                    state
                }
            }
            "available" => {
                after.available = true;
                "view_changed"
            }
            "unavailable" => {
                after.available = false;
                "unavailable"
            }
            "identity" => {
                after.identity = identity;
                if before.identity.is_some() {
                    "identity_changed"
                } else {
                    "view_changed"
                }
            }
            "faulted" => {
                after.fault = Some(record["reason"].as_str().unwrap().to_string());
                after.available = false;
                "faulted"
            }
            "recovered" => {
                after.fault = None;
                "view_changed"
            }
            other => panic!("unknown record type {other}"),
        };
        if after == before {
            return;
        }
        let lost_required = (before.ready() && !after.ready()) || reason == "identity_changed";
        self.facts.insert(node.to_string(), after);
        self.lose_readiness(at, json!(node), reason);
        self.restart_window(at);
        let faults = matches!(&self.run, Some(r) if r.phase == Phase::Committed && r.required.contains(node));
        if faults && lost_required {
            let run = self.run.take().unwrap();
            self.out.push(json!({"at_ms": at, "event": "run_faulted", "run": run.id, "node": node, "reason": reason}));
        }
    }

    fn lose_readiness(&mut self, at: u64, node: Value, reason: &str) {
        let Some(epoch) = self.ready_epoch.take() else {
            return;
        };
        self.out.push(json!({"at_ms": at, "event": "readiness_lost", "pool": self.pool, "epoch": epoch, "node": node, "reason": reason}));
        if let Some(run) = &mut self.run {
            if run.phase == Phase::Planning {
                if self.abort {
                    self.out.push(json!({"at_ms": at, "event": "planning_aborted", "run": run.id, "reason": "readiness_lost"}));
                    self.run = None;
                } else {
                    run.phase = Phase::Suspended(self.wait_timeout.map(|t| at + t));
                    self.out
                        .push(json!({"at_ms": at, "event": "planning_suspended", "run": run.id}));
                }
            }
        }
    }

    fn restart_window(&mut self, at: u64) {
        self.last_change = at;
        self.converge_at = if self.facts.values().all(Facts::ready) {
            Some(at + self.window)
        } else {
            None
        };
    }

    /// Fires timers due strictly before `limit` (all of them for `None`),
    /// in time order; a PoolReady wins a tie with a wait timeout.
    fn fire_before(&mut self, limit: Option<u64>) {
        loop {
            let wait = match &self.run {
                Some(Run {
                    phase: Phase::Suspended(Some(w)),
                    ..
                }) => Some(*w),
                _ => None,
            };
            let next = match (self.converge_at, wait) {
                (Some(c), Some(w)) if w < c => (w, false),
                (Some(c), _) => (c, true),
                (None, Some(w)) => (w, false),
                (None, None) => return,
            };
            if limit.is_some_and(|l| next.0 >= l) {
                return;
            }
            let at = next.0;
            if next.1 {
                // The contract's invariants, checked where PoolReady is made:
                // every candidate ready, and a full quiet window behind it.
                assert!(
                    self.facts.values().all(Facts::ready),
                    "PoolReady with a candidate not ready"
                );
                assert!(
                    at >= self.last_change + self.window,
                    "PoolReady inside the window"
                );
                self.converge_at = None;
                self.epochs += 1;
                let epoch = self.epochs;
                self.ready_epoch = Some(epoch);
                let members: Vec<&String> = self.facts.keys().collect();
                let fingerprints: BTreeMap<&String, &String> = self
                    .facts
                    .iter()
                    .map(|(n, f)| (n, f.identity.as_ref().unwrap()))
                    .collect();
                self.out.push(json!({"at_ms": at, "event": "pool_ready", "pool": self.pool, "epoch": epoch, "members": members, "fingerprints": fingerprints}));
                if let Some(run) = &mut self.run {
                    if matches!(run.phase, Phase::Suspended(_)) {
                        run.phase = Phase::Planning;
                        self.out.push(json!({"at_ms": at, "event": "planning_resumed", "run": run.id, "epoch": epoch}));
                    }
                }
            } else {
                let run = self.run.take().unwrap();
                self.out.push(json!({"at_ms": at, "event": "planning_aborted", "run": run.id, "reason": "wait_timeout"}));
            }
        }
    }
}
