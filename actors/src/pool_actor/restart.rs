//! When the pool actor fails: its supervisor restarts it, readiness starts
//! over (a fresh window, the epoch still rising, every node actor telling
//! its facts again) and the committed run stays with its run actor; a
//! pool actor that fails too often is given up and the gate ends.

use std::time::Duration;

use actix::{ActorContext, Context};

use super::PoolActor;
use crate::clock::TimerSlot;
use crate::messages::Resync;
use crate::telemetry;

impl actix::Supervised for PoolActor {
    /// After a failure readiness starts over: every summary is forgotten, a
    /// fresh window is needed, the epoch keeps rising, and each node actor
    /// reports its facts again. The committed run stays with its actor,
    /// which is not the pool's and did not fail with it; a run the core
    /// holds committed with no actor left to guard it faults `internal`.
    /// Runs' outcomes not yet told are told (stored first), never dropped.
    /// A panic in here ends the supervisor, and the gate with it (see
    /// `Drop`).
    fn restarting(&mut self, ctx: &mut Context<Self>) {
        if self.shut {
            // Stopped for good (`Shutdown`, or a restart given up): the
            // context is kept only while a handle still holds the address,
            // with nothing running.
            return;
        }
        telemetry::actor_restarted("pool");
        #[cfg(any(test, feature = "testing"))]
        if let Some(crate::messages::InjectPoolFault::PanicAndFailRestart) = self.armed {
            self.armed = None;
            panic!("injected failure of the pool actor's restart");
        }
        // The old timers died with the old context; epochs held back for
        // a write are moot (readiness starts over).
        self.timer = TimerSlot::default();
        self.untold.clear();
        self.out.retain(crate::publisher::is_outcome);
        let now = self.applied_at(self.clock.now());
        self.core.restart(now, &mut self.out);
        self.reguard();
        self.recount_blocked();
        for candidate in self.core.readiness().candidates() {
            if let Some(addr) = self.router.route(&candidate.node) {
                addr.do_send(Resync { at: now });
            }
        }
        self.flush(ctx);
    }
}

/// A pool actor that fails [`RESTARTS_IN_PERIOD`] times within this
/// period (by the gate's clock) is given up: the gate ends rather than
/// restart in a loop (a fault that comes back at every restart).
pub const RESTART_PERIOD: Duration = Duration::from_secs(10);

/// See [`RESTART_PERIOD`].
pub const RESTARTS_IN_PERIOD: usize = 10;

impl PoolActor {
    /// Runs `work` (a handler's, or a callback's of the actor's own); a
    /// panic anywhere in it (the core, the actor's code, or a hook of the
    /// embedder's it calls, such as a tracing layer) stops the actor, and
    /// its supervisor restarts it from the core, the one copy of the
    /// pool's state (see `Supervised::restarting`). `None` on a failure.
    pub(super) fn contained<R>(
        &mut self,
        ctx: &mut Context<Self>,
        work: impl FnOnce(&mut Self, &mut Context<Self>) -> R,
    ) -> Option<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(any(test, feature = "testing"))]
            if let Some(crate::messages::InjectPoolFault::PanicAlways) = self.armed {
                panic!("injected persistent pool actor fault");
            }
            work(self, ctx)
        })) {
            Ok(result) => Some(result),
            Err(_) => {
                self.failed(ctx);
                None
            }
        }
    }

    /// The actor failed: its supervisor restarts it, unless it failed
    /// [`RESTARTS_IN_PERIOD`] times within [`RESTART_PERIOD`]; then the
    /// gate ends (see [`PoolActor::wind_down`]).
    pub(super) fn failed(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        self.failures.retain(|at| now - *at < RESTART_PERIOD);
        self.failures.push(now);
        let pool = self.core.readiness().id().clone();
        if self.failures.len() >= RESTARTS_IN_PERIOD {
            telemetry::said!(error, %pool, failures = RESTARTS_IN_PERIOD, within = ?RESTART_PERIOD, "pool actor failed too often; given up");
            self.wind_down(true);
        } else {
            telemetry::said!(error, %pool, "pool actor failed; restarting it");
        }
        ctx.stop();
    }

    /// Stops for good (once): every subscription ends, the node actors and
    /// the run actor stop, the store and the recording are let go, and
    /// what waited to be told is dropped with the gate. Said at `ERROR`
    /// when the actor `failed`, at `WARN` when the gate was stopped,
    /// naming a committed run left unguarded.
    pub(super) fn wind_down(&mut self, failed: bool) {
        if std::mem::replace(&mut self.shut, true) {
            return;
        }
        let pool = self.core.readiness().id();
        if let Some(reservations) = &self.reservations {
            reservations.release_pool(pool);
        }
        match (self.core.committed_run(), failed) {
            (Some((run, _)), true) => {
                telemetry::said!(error, %pool, %run, "the pool actor failed and cannot be restarted: the gate stopped, and its committed run is no longer guarded by it")
            }
            (None, true) => {
                telemetry::said!(error, %pool, "the pool actor failed and cannot be restarted: the gate stopped")
            }
            (Some((run, _)), false) => {
                telemetry::said!(warn, %pool, %run, "the gate stopped with a run committed: the run is no longer guarded by it")
            }
            (None, false) => {}
        }
        self.publisher.close();
        for node in self.router.drain() {
            node.do_send(crate::messages::StopNode);
        }
        self.run = None;
        self.store = None;
        self.untold.clear();
        self.unwritten.clear();
        self.out.clear();
        if let Some(recording) = self.recording.take() {
            recording.close();
        }
    }

    /// After a restart: a run the core holds committed whose actor is
    /// gone (the failure came between the commit and the actor's start,
    /// or took the actor too) faults `internal`.
    pub(super) fn reguard(&mut self) {
        let Some((run, _)) = self.core.committed_run() else {
            return;
        };
        if self.run.as_ref().is_some_and(|addr| addr.connected()) {
            return;
        }
        let run = run.clone();
        let events = self.run_actor_lost(&run);
        self.run_answered(&run, true, events);
    }
}
