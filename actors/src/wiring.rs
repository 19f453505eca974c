//! What the three actors share: the clock that turns core [`Time`] into
//! timers, the event publisher, the generation-tagged timer slot, and the
//! router from node id to node actor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message, SpawnHandle};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::core::{Event, NodeId, Time};
use crate::node_actor::NodeActor;

/// The gate's timeline: core [`Time`] is the offset from `origin`. Under
/// tokio's paused clock this is virtual time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A timeline that starts now.
    pub fn start() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// The current point on the timeline, in whole milliseconds (the
    /// resolution of the replay format, so a live run can be recorded and
    /// replayed exactly).
    pub fn now(&self) -> Time {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Time::from_millis(ms)
    }

    /// The tokio instant of a point on the timeline.
    pub fn instant(&self, at: Time) -> Instant {
        self.origin + at.offset()
    }

    /// How long from now until `at` (zero if it has passed).
    pub fn until(&self, at: Time) -> Duration {
        self.instant(at).saturating_duration_since(Instant::now())
    }
}

/// Sends every event to every subscriber, in the order published.
///
/// Each subscriber has its own unbounded channel: events are few (one per
/// readiness or run transition, never one per observation), and a subscriber
/// must not miss one. A dropped receiver is removed at the next publish.
#[derive(Clone, Default, Debug)]
pub struct Publisher {
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Event>>>>,
}

impl Publisher {
    /// A new subscription; it sees every event published from now on.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().push(tx);
        rx
    }

    /// Publishes and drains `events`.
    pub fn publish(&self, events: &mut Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut subscribers = self.lock();
        for event in events.drain(..) {
            log_decision(&event);
            subscribers.retain(|tx| tx.send(event.clone()).is_ok());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::UnboundedSender<Event>>> {
        // A panic elsewhere while holding the lock leaves the list intact.
        self.subscribers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Each decision as a tracing event with structured fields (identity shows
/// only as fingerprints, in `PoolReady`'s count of them).
fn log_decision(event: &Event) {
    let at = event.at().as_millis();
    match event {
        Event::PoolReady {
            pool,
            epoch,
            members,
            ..
        } => {
            tracing::info!(at_ms = at, %pool, epoch = epoch.0, members = members.len(), "gate event: pool_ready")
        }
        Event::ReadinessLost {
            pool,
            epoch,
            node,
            reason,
            ..
        } => {
            let node = node.as_ref().map(NodeId::as_str).unwrap_or("");
            tracing::info!(at_ms = at, %pool, epoch = epoch.0, node, %reason, "gate event: readiness_lost")
        }
        Event::PlanningStarted { run, epoch, .. } | Event::PlanningResumed { run, epoch, .. } => {
            tracing::info!(at_ms = at, %run, epoch = epoch.0, event = event.name(), "gate event: planning")
        }
        Event::PlanningSuspended { run, .. } | Event::RunFinished { run, .. } => {
            tracing::info!(at_ms = at, %run, event = event.name(), "gate event: run")
        }
        Event::PlanningAborted { run, reason, .. } => {
            tracing::info!(at_ms = at, %run, reason = ?reason, "gate event: planning_aborted")
        }
        Event::RunCommitted {
            run,
            epoch,
            required,
            ..
        } => {
            tracing::info!(at_ms = at, %run, epoch = epoch.0, required = required.len(), "gate event: run_committed")
        }
        Event::RunFaulted {
            run, node, reason, ..
        } => {
            tracing::info!(at_ms = at, %run, %node, %reason, "gate event: run_faulted")
        }
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

/// Which node actor holds which candidate. Written by the pool actor when
/// the pool is (re)defined, read by the embedding handle to route input.
#[derive(Debug, Default)]
pub struct Router {
    nodes: RwLock<HashMap<NodeId, Addr<NodeActor>>>,
    /// What was ignored, and why.
    pub ignored: IgnoredCounts,
}

impl Router {
    /// The node actor of a candidate, or `None` for a non-candidate.
    pub fn route(&self, node: &NodeId) -> Option<Addr<NodeActor>> {
        self.read().get(node).cloned()
    }

    pub(crate) fn insert(&self, node: NodeId, addr: Addr<NodeActor>) {
        self.write().insert(node, addr);
    }

    pub(crate) fn remove(&self, node: &NodeId) -> Option<Addr<NodeActor>> {
        self.write().remove(node)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeId, Addr<NodeActor>>> {
        self.nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<NodeId, Addr<NodeActor>>> {
        self.nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
