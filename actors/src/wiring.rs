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

    /// The current point on the timeline.
    pub fn now(&self) -> Time {
        Time::from_offset(self.origin.elapsed())
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
            tracing::info!(event = event.name(), at = %event.at(), details = ?event, "gate event");
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

/// One timer of an actor, armed for the core's next deadline.
///
/// The message it delivers carries the generation it was armed for; a
/// message of an older generation (a timer that was re-armed or cancelled
/// while its message was in flight) is recognised by [`TimerSlot::fired`] and
/// ignored.
#[derive(Default, Debug)]
pub struct TimerSlot {
    armed: Option<(Time, SpawnHandle)>,
    generation: u64,
}

impl TimerSlot {
    /// Arms the timer for `deadline`, cancelling the previous one, unless it
    /// is already armed for exactly that deadline.
    pub fn rearm<A, M>(
        &mut self,
        ctx: &mut Context<A>,
        clock: &Clock,
        deadline: Option<Time>,
        message: impl FnOnce(u64, Time) -> M,
    ) where
        A: Actor<Context = Context<A>> + Handler<M>,
        M: Message + 'static,
    {
        if self.armed.as_ref().map(|(at, _)| *at) == deadline {
            return;
        }
        if let Some((_, handle)) = self.armed.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = deadline {
            self.generation += 1;
            let handle = ctx.notify_later(message(self.generation, at), clock.until(at));
            self.armed = Some((at, handle));
        }
    }

    /// Whether a timer message of `generation` is the one currently armed.
    pub fn fired(&mut self, generation: u64) -> bool {
        if self.armed.is_some() && generation == self.generation {
            self.armed = None;
            true
        } else {
            false
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
    /// Observations that repeated the view.
    pub duplicate: AtomicU64,
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
