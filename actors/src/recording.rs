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
///
/// Lines are buffered and flushed at least every [`FLUSH_EVERY`] and
/// whenever the gate publishes an event, so a crash loses at most that
/// much of the tail.
#[derive(Clone)]
pub struct Recording {
    out: Arc<Mutex<Sink>>,
}

/// How long a recorded line may wait in the buffer.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

struct Sink {
    out: Box<dyn Write + Send>,
    flushed: std::time::Instant,
    closed: bool,
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
            out: Arc::new(Mutex::new(Sink {
                out,
                flushed: std::time::Instant::now(),
                closed: false,
            })),
        }
    }

    /// The opening records: the settings, what the gate restored (if it
    /// restored anything: a `restored` record, so the recording replays
    /// from the same state), then the first pool.
    pub(crate) fn start(
        &self,
        window: std::time::Duration,
        policy: PlanningPolicy,
        pool: &PoolDefinition,
        restored: Option<(&poolgate_core::Durable, std::time::Duration)>,
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
        if let Some((durable, grace)) = restored {
            if *durable != poolgate_core::Durable::default() {
                self.write(&json!({
                    "at_ms": 0,
                    "type": "restored",
                    "durable": durable,
                    "restore_grace_ms": grace.as_millis() as u64,
                }));
            }
        }
        self.command(Time::ZERO, &Command::DefinePool(pool.clone()));
    }

    /// An observation that changed `node`'s view, applied at `at`.
    pub(crate) fn observation(&self, at: Time, node: &str, observation: &Observation) {
        let node = quoted(node);
        let at = at.as_millis();
        let line = match observation {
            Observation::Known => format!(r#"{{"at_ms":{at},"type":"known","node":{node}}}"#),
            Observation::Forgotten => {
                format!(r#"{{"at_ms":{at},"type":"forgotten","node":{node}}}"#)
            }
            Observation::Swim { state, incarnation } => format!(
                r#"{{"at_ms":{at},"type":"swim","node":{node},"state":"{state}","incarnation":{incarnation}}}"#
            ),
            Observation::Available => {
                format!(r#"{{"at_ms":{at},"type":"available","node":{node}}}"#)
            }
            Observation::Unavailable => {
                format!(r#"{{"at_ms":{at},"type":"unavailable","node":{node}}}"#)
            }
            Observation::Identity(fingerprint) => format!(
                r#"{{"at_ms":{at},"type":"identity","node":{node},"fingerprint":"{}"}}"#,
                hex::encode(fingerprint.as_bytes())
            ),
            Observation::Faulted { reason } => format!(
                r#"{{"at_ms":{at},"type":"faulted","node":{node},"reason":{}}}"#,
                quoted(reason.as_str())
            ),
            Observation::Recovered => {
                format!(r#"{{"at_ms":{at},"type":"recovered","node":{node}}}"#)
            }
        };
        self.line(&line, false);
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
        let mut line = json!({"at_ms": at.as_millis()});
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), record) {
            line.extend(fields);
        }
        // Commands are rare and worth seeing at once.
        self.line(&line.to_string(), true);
    }

    /// Flushes what is buffered (the gate published an event).
    pub(crate) fn flush(&self) {
        self.line("", true);
    }

    /// Flushes and records nothing more (the gate stopped acting).
    pub(crate) fn close(&self) {
        self.line("", true);
        self.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .closed = true;
    }

    fn write(&self, record: &Value) {
        self.line(&record.to_string(), true);
    }

    fn line(&self, line: &str, flush_now: bool) {
        let mut sink = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sink.closed {
            return;
        }
        let mut written = if line.is_empty() {
            Ok(())
        } else {
            writeln!(sink.out, "{line}")
        };
        if flush_now || sink.flushed.elapsed() >= FLUSH_EVERY {
            written = written.and_then(|()| sink.out.flush());
            sink.flushed = std::time::Instant::now();
        }
        if let Err(e) = written {
            metrics::counter!("poolgate_record_errors_total").increment(1);
            tracing::error!(error = %e, "recording: a record could not be written");
        }
    }
}

/// A string as a JSON string.
fn quoted(text: &str) -> String {
    // Serialising a string cannot fail.
    serde_json::to_string(text).unwrap_or_default()
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
