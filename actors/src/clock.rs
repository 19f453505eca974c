//! The gate's clock, and timers as data.
//!
//! [`Clock`] turns core [`Time`] into tokio instants (virtual time under a
//! paused clock); [`TimerSlot`] is one actor's timer, armed for the core's
//! next deadline and tagged with a generation so a late one is ignored.

use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message, SpawnHandle};
use tokio::time::Instant;

use poolgate_core::Time;

/// How far ahead of the gate's clock [`crate::Gate::submit`] takes a
/// stamp.
pub const SUBMIT_AHEAD: Duration = Duration::from_secs(60);

/// The gate's timeline: core [`Time`] is the offset from `origin`. Under
/// tokio's paused clock this is virtual time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    /// The wall clock's time at `origin`, to say a point of the timeline
    /// where the timeline itself means nothing (see [`Clock::wall`]).
    origin_wall: std::time::SystemTime,
}

/// Where a timer beyond the clock's range is put.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

impl Clock {
    /// A timeline that starts now.
    pub fn start() -> Self {
        Self {
            origin: Instant::now(),
            origin_wall: std::time::SystemTime::now(),
        }
    }

    /// The current point on the timeline, in whole milliseconds (the
    /// resolution of the replay format, so a live run can be recorded and
    /// replayed exactly).
    pub fn now(&self) -> Time {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Time::from_millis(ms)
    }

    /// The tokio instant of a point on the timeline; a point too far out
    /// for the clock (a window of `Duration::MAX`, say) is about 30 years
    /// away, as tokio's own far future is, never a panic.
    pub fn instant(&self, at: Time) -> Instant {
        self.origin
            .checked_add(at.offset())
            .or_else(|| Instant::now().checked_add(FAR_FUTURE))
            .unwrap_or_else(Instant::now)
    }

    /// The wall clock's time at `at`, as it read when the timeline began
    /// (one mapping for the clock's life, so a point always reads the
    /// same). Under a paused clock the timeline runs apart from the wall.
    pub fn wall(&self, at: Time) -> std::time::SystemTime {
        self.origin_wall
            .checked_add(at.offset())
            .unwrap_or(self.origin_wall)
    }

    /// How long from now until `at` (zero if it has passed).
    pub fn until(&self, at: Time) -> Duration {
        self.instant(at).saturating_duration_since(Instant::now())
    }
}

/// One timer of an actor, armed for the core's next deadline.
///
/// Re-arming is lazy: when the deadline moves later (every view change
/// while converging does that), the armed timer is kept; it fires early, the
/// core finds nothing due, and the timer is armed again for the new
/// deadline. A view change thus costs no timer allocation. Only a deadline
/// earlier than the armed one cancels and re-arms.
///
/// The message carries the generation it was armed for; [`TimerSlot::fired`]
/// accepts only the current one and answers with the instant it was armed
/// for, so a late or forged message cannot fire anything.
#[derive(Default, Debug)]
pub struct TimerSlot {
    armed: Option<(Time, SpawnHandle)>,
    generation: u64,
}

impl TimerSlot {
    /// Makes sure a timer fires at or before `deadline`.
    pub fn rearm<A, M>(
        &mut self,
        ctx: &mut Context<A>,
        clock: &Clock,
        deadline: Option<Time>,
        message: impl FnOnce(u64) -> M,
    ) where
        A: Actor<Context = Context<A>> + Handler<M>,
        M: Message + 'static,
    {
        let Some(at) = deadline else {
            // An armed timer with nothing due fires as a no-op.
            return;
        };
        match self.armed {
            Some((armed, _)) if armed <= at => return,
            Some((_, handle)) => {
                ctx.cancel_future(handle);
            }
            None => {}
        }
        self.generation += 1;
        let handle = ctx.notify_later(message(self.generation), clock.until(at));
        self.armed = Some((at, handle));
    }

    /// If a timer message of `generation` is the one currently armed, the
    /// instant it was armed for.
    pub fn fired(&mut self, generation: u64) -> Option<Time> {
        match self.armed {
            Some((at, _)) if generation == self.generation => {
                self.armed = None;
                Some(at)
            }
            _ => None,
        }
    }
}
