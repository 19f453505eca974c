//! An independent model of the gate, written from the words of design §1–3
//! and §5 (the quoted lines), not from the core's code: facts in maps,
//! readiness by a full scan, timers by comparison. It reads scenario records
//! as JSON and produces the events a replay must print.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// "Per candidate node the gate holds exactly these facts (its view)".
#[derive(Clone, Default, PartialEq, Eq, Debug)]
struct View {
    known: bool,
    /// Membership state and incarnation; `None` is "never seen".
    swim: Option<(String, u64)>,
    available: bool,
    /// The identity's SHA-256 fingerprint.
    identity: Option<String>,
    fault: Option<String>,
}

impl View {
    /// "ready iff known ∧ state = alive ∧ available ∧ identity present ∧
    /// ¬faulted".
    fn ready(&self) -> bool {
        self.known
            && self.swim.as_ref().is_some_and(|(s, _)| s == "alive")
            && self.available
            && self.identity.is_some()
            && self.fault.is_none()
    }
}

/// "With current state S at incarnation i, a new observation at incarnation
/// j applies iff: …"
fn applies(current: &Option<(String, u64)>, new: &str, j: u64) -> bool {
    let Some((s, i)) = current else {
        // "About a node never seen, alive, dead and left apply and a
        // suspicion is stale."
        return new != "suspect";
    };
    let (s, i) = (s.as_str(), *i);
    let down = |state: &str| state == "dead" || state == "left";
    match new {
        "alive" => j > i,
        "suspect" => j >= i && (s == "alive" || (s == "suspect" && j > i)),
        // "dead / left: j ≥ i and S is not already dead/left at ≥ j"
        _ => j >= i && !(down(s) && i >= j),
    }
}

/// "the reason is cut to 1 KiB on a character boundary and each control
/// character becomes U+FFFD" (a fault is never lost to its wording).
fn safe_reason(text: &str) -> String {
    let replaced: String = text
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    let mut end = replaced.len().min(1024);
    while !replaced.is_char_boundary(end) {
        end -= 1;
    }
    replaced[..end].to_string()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Planning,
    /// Suspended under `wait`, giving up at the instant held (if any).
    Suspended(Option<u64>),
    Committed,
}

#[derive(Debug, Clone)]
struct Run {
    id: String,
    stage: Stage,
    required: BTreeSet<String>,
}

/// The model gate.
#[derive(Clone)]
pub struct Model {
    window: u64,
    abort: bool,
    wait_timeout: Option<u64>,
    pool: String,
    views: BTreeMap<String, View>,
    /// The current epoch while Ready.
    ready: Option<u64>,
    /// When `PoolReady` is due, while every candidate is ready.
    due: Option<u64>,
    epochs: u64,
    run: Option<Run>,
    /// The events so far.
    pub out: Vec<Value>,
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
            views: members
                .iter()
                .map(|m| (m.to_string(), View::default()))
                .collect(),
            ready: None,
            due: None,
            epochs: 0,
            run: None,
            out: Vec::new(),
        }
    }

    /// The next instant a timer is due, if any.
    pub fn next_timer(&self) -> Option<u64> {
        [self.due, self.wait_deadline()].into_iter().flatten().min()
    }

    /// Applies one record: "Observations stamped at a time T are applied
    /// before timers due at T", so first every timer due strictly before.
    pub fn input(&mut self, line: usize, record: &Value) {
        let at = record["at_ms"].as_u64().unwrap();
        self.fire_timers(Some(at));
        let text = |field: &str| record[field].as_str().unwrap().to_string();
        let list = |field: &str| -> Vec<String> {
            record[field]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let refusal = match record["type"].as_str().unwrap() {
            "define_pool" => self.define_pool(at, text("pool"), list("members")),
            "begin_planning" => self.begin_planning(at, text("run"), record["epoch"].as_u64()),
            "commit_plan" => {
                self.commit_plan(at, text("run"), list("required"), record["epoch"].as_u64())
            }
            "finish_run" => self.finish_run(at, text("run")),
            kind => self.observe(at, &text("node"), kind, record),
        };
        if let Err(error) = refusal {
            self.out
                .push(json!({"at_ms": at, "event": "rejected", "line": line, "error": error}));
        }
    }

    /// Fires every timer due strictly before `at` ("Observations stamped
    /// at a time T are applied before timers due at T").
    #[allow(dead_code)]
    pub fn advance(&mut self, at: u64) {
        self.fire_timers(Some(at));
    }

    /// After the last record: "keeps advancing virtual time until no timer
    /// is pending".
    pub fn finish(&mut self) {
        self.fire_timers(None);
    }

    fn define_pool(
        &mut self,
        at: u64,
        pool: String,
        members: Vec<String>,
    ) -> Result<(), &'static str> {
        let distinct: BTreeSet<&String> = members.iter().collect();
        if members.is_empty() || distinct.len() != members.len() {
            return Err("invalid_pool");
        }
        // "It is rejected while a run is committed."
        if self
            .run
            .as_ref()
            .is_some_and(|r| r.stage == Stage::Committed)
        {
            return Err("run_committed");
        }
        // "nodes that stay candidates keep their facts, new candidates start
        // with none, readiness restarts"
        self.views.retain(|node, _| members.contains(node));
        for member in members {
            self.views.entry(member).or_default();
        }
        self.view_changed(at, Value::Null, "pool_redefined");
        self.pool = pool;
        Ok(())
    }

    fn begin_planning(
        &mut self,
        at: u64,
        run: String,
        epoch: Option<u64>,
    ) -> Result<(), &'static str> {
        let current = self.current_epoch(epoch)?;
        if self.run.is_some() {
            return Err("run_in_progress");
        }
        self.out
            .push(json!({"at_ms": at, "event": "planning_started", "pool": self.pool, "run": run, "epoch": current}));
        self.run = Some(Run {
            id: run,
            stage: Stage::Planning,
            required: BTreeSet::new(),
        });
        Ok(())
    }

    fn commit_plan(
        &mut self,
        at: u64,
        run: String,
        required: Vec<String>,
        epoch: Option<u64>,
    ) -> Result<(), &'static str> {
        if required.is_empty() {
            return Err("invalid_plan");
        }
        if self.run.as_ref().is_none_or(|r| r.id != run) {
            return Err("unknown_run");
        }
        let current = self.current_epoch(epoch)?;
        if required.iter().any(|n| !self.views.contains_key(n)) {
            return Err("not_candidate");
        }
        let active = self.run.as_mut().unwrap();
        if active.stage != Stage::Planning {
            return Err("run_not_planning");
        }
        active.stage = Stage::Committed;
        active.required = required.into_iter().collect();
        self.out.push(json!({"at_ms": at, "event": "run_committed", "pool": self.pool, "run": run, "epoch": current, "required": active.required}));
        Ok(())
    }

    fn finish_run(&mut self, at: u64, run: String) -> Result<(), &'static str> {
        match &self.run {
            Some(r) if r.id == run && r.stage == Stage::Committed => {
                self.out.push(
                    json!({"at_ms": at, "event": "run_finished", "pool": self.pool, "run": run}),
                );
                self.run = None;
                Ok(())
            }
            Some(r) if r.id == run => Err("run_not_committed"),
            _ => Err("unknown_run"),
        }
    }

    /// "accepted only while Ready"; "stale_epoch when an epoch is given and
    /// is not the current one".
    fn current_epoch(&self, given: Option<u64>) -> Result<u64, &'static str> {
        let current = self.ready.ok_or("pool_not_ready")?;
        match given {
            Some(given) if given != current => Err("stale_epoch"),
            _ => Ok(current),
        }
    }

    fn observe(
        &mut self,
        at: u64,
        node: &str,
        kind: &str,
        record: &Value,
    ) -> Result<(), &'static str> {
        let mut fingerprint = None;
        if kind == "identity" {
            // "standard base64 with padding, in its canonical form"; 1 B to
            // 16 KiB; "Invalid identity material … is rejected".
            let material = record["material"].as_str().unwrap();
            match base64::engine::general_purpose::STANDARD.decode(material) {
                Ok(bytes) if !bytes.is_empty() && bytes.len() <= 16 * 1024 => {
                    fingerprint = Some(hex::encode(Sha256::digest(&bytes)));
                }
                _ => return Err("invalid_identity"),
            }
        }
        // "Observations about nodes outside the candidate pool are ignored".
        let Some(before) = self.views.get(node).cloned() else {
            return Ok(());
        };
        let mut view = before.clone();
        // The reason names what was observed.
        let reason = match kind {
            "known" => {
                view.known = true;
                "view_changed"
            }
            "forgotten" => {
                view.known = false;
                view.identity = None;
                "unknown"
            }
            "swim" => {
                let state = record["state"].as_str().unwrap();
                let incarnation = record["incarnation"].as_u64().unwrap();
                if !applies(&view.swim, state, incarnation) {
                    return Ok(()); // stale: ignored and counted
                }
                view.swim = Some((state.to_string(), incarnation));
                if state == "alive" {
                    "view_changed"
                } else {
                    state
                }
            }
            "available" => {
                view.available = true;
                "view_changed"
            }
            "unavailable" => {
                view.available = false;
                "unavailable"
            }
            "identity" => match view.identity.replace(fingerprint.unwrap()) {
                Some(_) => "identity_changed",
                None => "view_changed",
            },
            "faulted" => {
                view.fault = Some(safe_reason(record["reason"].as_str().unwrap()));
                view.available = false;
                "faulted"
            }
            "recovered" => {
                view.fault = None;
                "view_changed"
            }
            other => panic!("unknown record type {other}"),
        };
        // "a duplicate is not a change; an incarnation bump or identity
        // rotation is"
        if view == before {
            return Ok(());
        }
        self.views.insert(node.to_string(), view);
        self.view_changed(at, json!(node), reason);
        // "After commit, a required node that becomes suspect, dead or left,
        // faulted, unavailable, forgotten, or changes identity faults the run
        // at once".
        let loses = [
            "suspect",
            "dead",
            "left",
            "faulted",
            "unavailable",
            "unknown",
            "identity_changed",
        ];
        let faults = self.run.as_ref().is_some_and(|r| {
            r.stage == Stage::Committed && r.required.contains(node) && loses.contains(&reason)
        });
        if faults {
            let run = self.run.take().unwrap();
            self.out.push(json!({"at_ms": at, "event": "run_faulted", "pool": self.pool, "run": run.id, "node": node, "reason": reason}));
        }
        Ok(())
    }

    /// "Any view change while Ready emits readiness_lost … and returns to
    /// forming"; the window starts again at `at`.
    fn view_changed(&mut self, at: u64, node: Value, reason: &str) {
        if let Some(epoch) = self.ready.take() {
            self.out.push(json!({"at_ms": at, "event": "readiness_lost", "pool": self.pool, "epoch": epoch, "node": node, "reason": reason}));
            self.planning_loses_readiness(at);
        }
        // "PoolReady is emitted at t0 + window … iff every candidate is
        // ready at t0 and no view change happens in (t0, t0 + window]".
        self.due = self
            .views
            .values()
            .all(View::ready)
            .then_some(at + self.window);
    }

    /// "Readiness lost while planning, policy abort: planning_aborted …
    /// Policy wait: planning_suspended".
    fn planning_loses_readiness(&mut self, at: u64) {
        let Some(run) = self.run.as_mut().filter(|r| r.stage == Stage::Planning) else {
            return;
        };
        if self.abort {
            self.out.push(json!({"at_ms": at, "event": "planning_aborted", "pool": self.pool, "run": run.id, "reason": "readiness_lost"}));
            self.run = None;
        } else {
            run.stage = Stage::Suspended(self.wait_timeout.map(|t| at + t));
            self.out
                .push(json!({"at_ms": at, "event": "planning_suspended", "pool": self.pool, "run": run.id}));
        }
    }

    fn wait_deadline(&self) -> Option<u64> {
        match self.run.as_ref()?.stage {
            Stage::Suspended(deadline) => deadline,
            _ => None,
        }
    }

    /// Fires, in time order, the timers due strictly before `limit` (all of
    /// them for `None`). "When both fall due at the same instant, PoolReady
    /// wins."
    fn fire_timers(&mut self, limit: Option<u64>) {
        while let Some(at) = self.next_timer().filter(|t| limit.is_none_or(|l| *t < l)) {
            if self.due == Some(at) {
                self.pool_ready(at);
            } else {
                let run = self.run.take().unwrap();
                self.out.push(json!({"at_ms": at, "event": "planning_aborted", "pool": self.pool, "run": run.id, "reason": "wait_timeout"}));
            }
        }
    }

    /// "Each PoolReady carries the pool id, a new epoch, the sorted member
    /// list and each member's identity fingerprint"; a suspended run
    /// resumes on it.
    fn pool_ready(&mut self, at: u64) {
        assert!(
            self.views.values().all(View::ready),
            "PoolReady with a candidate not ready"
        );
        self.due = None;
        self.epochs += 1;
        let epoch = self.epochs;
        self.ready = Some(epoch);
        let members: Vec<&String> = self.views.keys().collect();
        let fingerprints: BTreeMap<&String, &String> = self
            .views
            .iter()
            .map(|(n, v)| (n, v.identity.as_ref().unwrap()))
            .collect();
        self.out.push(json!({"at_ms": at, "event": "pool_ready", "pool": self.pool, "epoch": epoch, "members": members, "fingerprints": fingerprints}));
        if let Some(run) = self.run.as_mut() {
            if matches!(run.stage, Stage::Suspended(_)) {
                run.stage = Stage::Planning;
                self.out.push(json!({"at_ms": at, "event": "planning_resumed", "pool": self.pool, "run": run.id, "epoch": epoch}));
            }
        }
    }
}
