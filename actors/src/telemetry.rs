//! Metrics through the `metrics` facade: the embedder installs whichever
//! recorder (exporter) it likes; without one every call is a no-op.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `poolgate_observations_total` | counter | `outcome`: applied, duplicate, stale, non_candidate |
//! | `poolgate_rejected_total` | counter | `error`: the rejection code |
//! | `poolgate_window_restarts_total` | counter | `cause`: the reason of the view change |
//! | `poolgate_time_to_ready_seconds` | histogram | — (from losing or first forming to `PoolReady`) |
//! | `poolgate_runs_faulted_total` | counter | `reason` |
//! | `poolgate_candidates_blocked` | gauge | `condition`: each blocker |

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use poolgate_core::{Blocker, Reason, Verdict};

/// Runs `emit` (a call into the embedder's metrics recorder) so that a
/// recorder that panics costs its own figure, never the actor that
/// counts: the panic is caught and said once per process.
pub fn guarded(emit: impl FnOnce()) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(emit)).is_err()
        && !SAID.swap(true, Ordering::Relaxed)
    {
        logged(|| {
            tracing::error!("the metrics recorder panicked: the figure is lost, the gate goes on")
        });
    }
}

/// Runs `log` (a tracing call, which runs the embedder's layers) so that
/// a layer that panics costs that line, never the actor that logs. The
/// panic is counted (`poolgate_hook_panics_total{hook="tracing"}`), not
/// logged: the layer that panicked would be the one to say it.
pub fn logged(log: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(log)).is_err() {
        // A recorder that panics too loses this figure (not said: said
        // through the layer that just panicked).
        let _ = std::panic::catch_unwind(|| {
            metrics::counter!("poolgate_hook_panics_total", "hook" => "tracing").increment(1)
        });
    }
}

/// A tracing event of the gate's, as `tracing::$level!` would make it,
/// run through [`logged`]: an embedder's layer that panics on it costs
/// the line, never the actor (or the caller) that logs.
macro_rules! said {
    ($level:ident, $($arg:tt)+) => {
        $crate::telemetry::logged(|| tracing::$level!($($arg)+))
    };
}
pub(crate) use said;

/// One observation's fate.
pub fn observation(outcome: &'static str) {
    guarded(|| metrics::counter!("poolgate_observations_total", "outcome" => outcome).increment(1));
}

/// A refused input or command.
pub fn rejected(error: &'static str) {
    guarded(|| metrics::counter!("poolgate_rejected_total", "error" => error).increment(1));
}

/// The convergence window started over (a change while converging or
/// ready).
pub fn window_restart(cause: Reason) {
    guarded(|| {
        metrics::counter!("poolgate_window_restarts_total", "cause" => cause.as_str()).increment(1)
    });
}

/// How long forming took, to `PoolReady`.
pub fn time_to_ready(seconds: f64) {
    guarded(|| metrics::histogram!("poolgate_time_to_ready_seconds").record(seconds));
}

/// A run faulted.
pub fn run_faulted(reason: Reason) {
    guarded(|| {
        metrics::counter!("poolgate_runs_faulted_total", "reason" => reason.as_str()).increment(1)
    });
}

/// One of the gate's actors failed and was restarted (or its run faulted
/// in its place).
pub fn actor_restarted(actor: &'static str) {
    guarded(|| metrics::counter!("poolgate_actor_restarts_total", "actor" => actor).increment(1));
}

/// How many candidates each condition blocks, kept incrementally (O(1)
/// per change) and published as gauges.
#[derive(Debug, Default)]
pub struct BlockedGauges {
    counts: [i64; Blocker::ALL.len()],
}

impl BlockedGauges {
    /// Counts afresh from every candidate's verdict (after a redefinition
    /// or a restart).
    pub fn recount(&mut self, verdicts: impl IntoIterator<Item = Verdict>) {
        let mut counts = [0i64; Blocker::ALL.len()];
        for verdict in verdicts {
            for (i, blocker) in Blocker::ALL.iter().enumerate() {
                counts[i] += i64::from(verdict.has(*blocker));
            }
        }
        self.counts = counts;
        for (i, blocker) in Blocker::ALL.iter().enumerate() {
            guarded(|| {
                metrics::gauge!("poolgate_candidates_blocked", "condition" => blocker.as_str())
                    .set(counts[i] as f64)
            });
        }
    }

    /// A candidate's verdict went from `before` to `after`.
    pub fn changed(&mut self, before: Verdict, after: Verdict) {
        for (i, blocker) in Blocker::ALL.iter().enumerate() {
            let delta = i64::from(after.has(*blocker)) - i64::from(before.has(*blocker));
            if delta != 0 {
                self.counts[i] += delta;
                let count = self.counts[i];
                guarded(|| {
                    metrics::gauge!("poolgate_candidates_blocked", "condition" => blocker.as_str())
                        .set(count as f64)
                });
            }
        }
    }
}

/// Observations that never changed a view, counted for reports.
#[derive(Debug, Default)]
pub struct IgnoredCounts {
    /// SWIM observations older than the view.
    pub stale: AtomicU64,
    /// Observations about nodes outside the candidate pool.
    pub non_candidate: AtomicU64,
}

impl IgnoredCounts {
    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
