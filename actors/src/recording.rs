//! `--record FILE`: every input the gate applied, in the replay format
//! ([`crate::replay_format`]),
//! stamped with the millisecond it was applied at (design §9), so that
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

use poolgate_core::{Command, Observation, PlanningPolicy, PoolDefinition, Time};

use crate::replay_format::{write_into, Line};

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
    /// The line being written, kept from line to line.
    scratch: Vec<u8>,
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
                scratch: Vec::with_capacity(256),
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
        self.record(0, Some(&Line::settings(window, policy)), true);
        if let Some((durable, grace)) = restored {
            if *durable != poolgate_core::Durable::default() {
                self.record(0, Some(&Line::restored(durable, grace)), true);
            }
        }
        self.command(Time::ZERO, &Command::DefinePool(pool.clone()));
    }

    /// An observation that changed `node`'s view, applied at `at`.
    pub(crate) fn observation(&self, at: Time, node: &str, observation: &Observation) {
        let line = Line::observation(node, observation);
        self.record(at.as_millis(), Some(&line), false);
    }

    /// A command the pool accepted at `at`.
    pub(crate) fn command(&self, at: Time, command: &Command) {
        // Commands are rare and worth seeing at once.
        self.record(at.as_millis(), Some(&Line::command(command, None)), true);
    }

    /// Flushes what is buffered (the gate published an event).
    pub(crate) fn flush(&self) {
        self.record(0, None, true);
    }

    /// Flushes and records nothing more (the gate stopped acting).
    pub(crate) fn close(&self) {
        self.record(0, None, true);
        self.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .closed = true;
    }

    /// Writes `line` stamped `at_ms` (none: only flushes, if due).
    fn record(&self, at_ms: u64, line: Option<&Line<'_>>, flush_now: bool) {
        let mut sink = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sink.closed {
            return;
        }
        let sink = &mut *sink;
        let mut written = Ok(());
        if let Some(line) = line {
            sink.scratch.clear();
            write_into(&mut sink.scratch, at_ms, line);
            sink.scratch.push(b'\n');
            written = sink.out.write_all(&sink.scratch);
        }
        if flush_now || sink.flushed.elapsed() >= FLUSH_EVERY {
            written = written.and_then(|()| sink.out.flush());
            sink.flushed = std::time::Instant::now();
        }
        if let Err(e) = written {
            crate::telemetry::guarded(|| {
                metrics::counter!("poolgate_record_errors_total").increment(1)
            });
            crate::telemetry::said!(error, error = %e, "recording: a record could not be written");
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
