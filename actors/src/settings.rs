//! What a gate (a pool) is started with: its definition, window and
//! planning policy, and optionally a store and a recording; checked by
//! one set of rules, whether built in code or read from `config.toml`.

use std::time::Duration;

use poolgate_core::{PlanningPolicy, PoolDefinition};

use crate::error::GateError;
use crate::recording::Recording;
use crate::store::DurableSettings;

/// What the gate needs to start: the first pool, its window and the
/// planning policy; optionally a store and a recording.
///
/// Built by [`GateSettings::new`], which checks it as `config.toml` is
/// checked, then [`GateSettings::with_durable`] and
/// [`GateSettings::with_recording`]. The fields can be read and changed;
/// [`Gate::try_start`](crate::Gate::try_start) checks them again.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GateSettings {
    /// The first candidate pool.
    pub definition: PoolDefinition,
    /// How long the view must hold still before `PoolReady`.
    pub window: Duration,
    /// What planning does when readiness is lost before commit.
    pub policy: PlanningPolicy,
    /// Where to keep epochs and the active run across restarts, and what
    /// was kept; `None` keeps them in memory only.
    pub durable: Option<DurableSettings>,
    /// Where to record every applied input (`--record`), if anywhere.
    pub record: Option<Recording>,
}

/// The longest duration a setting takes (as `config.toml` refuses longer).
pub const MAX_SETTING: Duration = Duration::from_secs(365 * 24 * 3600);

/// What is wrong with `d` as a setting's duration, if anything: the one
/// rule for durations built in code and parsed from `config.toml`.
pub fn duration_problem(d: Duration) -> Option<&'static str> {
    if d.is_zero() {
        Some("must be longer than zero")
    } else if d > MAX_SETTING {
        Some("must be at most 365 days (no timer here waits longer)")
    } else if !d.subsec_nanos().is_multiple_of(1_000_000) {
        Some("must be a whole number of milliseconds")
    } else {
        None
    }
}

/// What is wrong with `wait` as the planning policy's wait timeout over
/// a convergence window of `window`, if anything: the one rule for
/// settings built in code and parsed from `config.toml` (a wait no longer
/// than the window could never see a `PoolReady`).
pub fn wait_timeout_problem(wait: Duration, window: Duration) -> Option<&'static str> {
    (wait <= window).then_some("is not longer than the convergence window")
}

impl GateSettings {
    /// Settings for `definition` with its convergence `window` and the
    /// planning `policy`, in memory only and not recorded; refused
    /// ([`GateError::InvalidSettings`]) as `config.toml` would refuse them.
    pub fn new(
        definition: PoolDefinition,
        window: Duration,
        policy: PlanningPolicy,
    ) -> Result<GateSettings, GateError> {
        let settings = GateSettings {
            definition,
            window,
            policy,
            durable: None,
            record: None,
        };
        settings.check().map_err(GateError::InvalidSettings)?;
        Ok(settings)
    }

    /// The same settings, with epochs and the active run kept in
    /// `durable`'s store (and restored from what it held); refused if its
    /// restore grace is not a valid duration.
    pub fn with_durable(mut self, durable: DurableSettings) -> Result<GateSettings, GateError> {
        self.durable = Some(durable);
        self.check().map_err(GateError::InvalidSettings)?;
        Ok(self)
    }

    /// The same settings, with every applied input recorded to `recording`.
    pub fn with_recording(mut self, recording: Recording) -> GateSettings {
        self.record = Some(recording);
        self
    }

    /// Checks settings built in code as `config.toml`'s are checked: the
    /// window and the restore grace longer than zero, whole milliseconds,
    /// at most 365 days; a wait timeout longer than the window.
    pub fn check(&self) -> Result<(), String> {
        let span = |what: &str, d: Duration| match duration_problem(d) {
            Some(problem) => Err(format!("{what} ({d:?}) {problem}")),
            None => Ok(()),
        };
        span("the convergence window", self.window)?;
        if let Some(wait) = self.policy.wait_timeout {
            span("the wait timeout", wait)?;
            if let Some(problem) = wait_timeout_problem(wait, self.window) {
                return Err(format!(
                    "the wait timeout ({wait:?}) {problem} ({:?})",
                    self.window
                ));
            }
        }
        if let Some(durable) = &self.durable {
            span("the restore grace", durable.restore_grace)?;
        }
        Ok(())
    }
}
