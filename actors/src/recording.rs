//! `--record FILE`: every input the gate applied, in the replay format,
//! stamped with the millisecond it was applied at (SPEC §9), so that
//! `poolgate replay FILE` prints exactly the events the live gate
//! published.
//!
//! The pool actor writes: first a `settings` record and a `define_pool`
//! with the first pool, then each observation that changed a node's view
//! (duplicates and stale facts change nothing and are left out) and each
//! command the pool accepted (refused ones changed nothing), in the order
//! the pool applied them. Identity is recorded as its fingerprint, never
//! the bytes. Not recorded, hence not replayable: the failure of the
//! gate's own actors (`internal`) and a restart of the pool actor.

use std::io::Write;
use std::sync::{Arc, Mutex};

use poolgate_core::{Command, Observation, OnReadinessLost, PlanningPolicy, PoolDefinition, Time};
use serde_json::{json, Value};

/// Where applied inputs are written; cheap to clone.
#[derive(Clone)]
pub struct Recording {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recording")
    }
}

impl Recording {
    /// Records into `out` (a file, usually).
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Recording {
            out: Arc::new(Mutex::new(out)),
        }
    }

    /// The opening records: the settings, then the first pool.
    pub(crate) fn start(
        &self,
        window: std::time::Duration,
        policy: PlanningPolicy,
        pool: &PoolDefinition,
    ) {
        let policy_name = match policy.on_readiness_lost {
            OnReadinessLost::Wait => "wait",
            OnReadinessLost::Abort => "abort",
        };
        self.write(&json!({
            "at_ms": 0,
            "type": "settings",
            "window_ms": window.as_millis() as u64,
            "on_readiness_lost": policy_name,
            "wait_timeout_ms": policy.wait_timeout.map(|t| t.as_millis() as u64),
        }));
        self.command(Time::ZERO, &Command::DefinePool(pool.clone()));
    }

    /// An observation that changed `node`'s view, applied at `at`.
    pub(crate) fn observation(&self, at: Time, node: &str, observation: &Observation) {
        let mut record = match observation {
            Observation::Known => json!({"type": "known"}),
            Observation::Forgotten => json!({"type": "forgotten"}),
            Observation::Swim { state, incarnation } => {
                json!({"type": "swim", "state": state.to_string(), "incarnation": incarnation})
            }
            Observation::Available => json!({"type": "available"}),
            Observation::Unavailable => json!({"type": "unavailable"}),
            Observation::Identity(fingerprint) => {
                json!({"type": "identity", "fingerprint": hex::encode(fingerprint.as_bytes())})
            }
            Observation::Faulted { reason } => {
                json!({"type": "faulted", "reason": reason.as_str()})
            }
            Observation::Recovered => json!({"type": "recovered"}),
        };
        record["node"] = json!(node);
        self.stamped(at, record);
    }

    /// A command the pool accepted at `at`.
    pub(crate) fn command(&self, at: Time, command: &Command) {
        let record = match command {
            Command::DefinePool(definition) => json!({
                "type": "define_pool",
                "pool": definition.id().as_str(),
                "members": definition.members().iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            }),
            Command::BeginPlanning { run, epoch } => {
                let mut record = json!({"type": "begin_planning", "run": run.as_str()});
                if let Some(epoch) = epoch {
                    record["epoch"] = json!(epoch.0);
                }
                record
            }
            Command::CommitPlan {
                run,
                required,
                epoch,
            } => {
                let mut record = json!({
                    "type": "commit_plan",
                    "run": run.as_str(),
                    "required": required.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                });
                if let Some(epoch) = epoch {
                    record["epoch"] = json!(epoch.0);
                }
                record
            }
            Command::FinishRun { run } => json!({"type": "finish_run", "run": run.as_str()}),
        };
        self.stamped(at, record);
    }

    fn stamped(&self, at: Time, record: Value) {
        let mut line = json!({"at_ms": at.as_millis()});
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), record) {
            line.extend(fields);
        }
        self.write(&line);
    }

    fn write(&self, record: &Value) {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = writeln!(out, "{record}").and_then(|()| out.flush());
        if let Err(e) = written {
            metrics::counter!("poolgate_record_errors_total").increment(1);
            tracing::error!(error = %e, "recording: a record could not be written");
        }
    }
}
