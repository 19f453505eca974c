//! The events' way out: every subscriber gets every event, in order, and
//! each decision is logged as a structured tracing event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use poolgate_core::{Event, NodeId};

pub use tokio::sync::mpsc::error::TryRecvError;

/// How many events wait for one subscriber at most; a subscriber that
/// falls further behind loses the newest and is told ([`EventStream::lagged`]).
pub const EVENT_QUEUE: usize = 1024;

/// Sends every event to every subscriber, in the order published.
///
/// Each subscriber has its own bounded queue of [`EVENT_QUEUE`] events
/// (events are few: one per readiness or run transition, never one per
/// observation); one that never reads costs at most that, and counts what
/// it lost. The events of the gate's start (the restore events) are kept
/// for the first subscriber if none is there yet, so they reach an
/// embedder that subscribes after an `.await`. A dropped subscription is
/// removed at the next publish.
#[derive(Clone, Default)]
pub struct Publisher {
    inner: Arc<Mutex<Subscribers>>,
    /// While it says no, nothing is published (and the publisher closes).
    fence: Arc<std::sync::OnceLock<Fence>>,
    /// Closed ([`Publisher::close`]): nothing is published any more. An
    /// atomic, read on every input without taking the subscribers' lock.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether the gate may still act (a replica's leadership, SPEC §12).
pub type Fence = Arc<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("inner", &self.inner)
            .field("fenced", &self.fence.get().is_some())
            .field(
                "closed",
                &self.closed.load(std::sync::atomic::Ordering::Acquire),
            )
            .finish()
    }
}

#[derive(Default, Debug)]
struct Subscribers {
    live: Vec<Subscriber>,
    /// Until the first subscription: what it will start with.
    before_first: Option<Vec<Event>>,
    subscribed: bool,
}

#[derive(Debug)]
struct Subscriber {
    tx: mpsc::Sender<Event>,
    lost: Arc<AtomicU64>,
}

/// A subscription to the gate's events, in the order they were published.
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::Receiver<Event>,
    lost: Arc<AtomicU64>,
}

impl EventStream {
    /// The next event; `None` once the gate's actors have stopped and every
    /// `Gate` handle is dropped (a handle keeps the stream open).
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is waiting ([`TryRecvError::Empty`] if none,
    /// [`TryRecvError::Disconnected`] once the stream is over).
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        self.rx.try_recv()
    }

    /// How many events this subscription lost by falling [`EVENT_QUEUE`]
    /// events behind (0 for a subscriber that keeps up).
    pub fn lagged(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Publisher {
    /// A new subscription: every event published from now on, and for the
    /// first subscription also the events of the gate's start.
    pub fn subscribe(&self) -> EventStream {
        let mut inner = self.lock();
        let backlog = if inner.subscribed {
            Vec::new()
        } else {
            inner.subscribed = true;
            inner.before_first.take().unwrap_or_default()
        };
        let (stream, subscriber) = channel();
        for event in backlog {
            subscriber.offer(event);
        }
        if !self.closed.load(std::sync::atomic::Ordering::Acquire) {
            inner.add(subscriber);
        }
        stream
    }

    /// A subscription to what is published from now on only (the gate's
    /// own waits, which must not take the first subscriber's backlog).
    pub(crate) fn subscribe_from_now(&self) -> EventStream {
        let (stream, subscriber) = channel();
        let mut inner = self.lock();
        if !self.closed.load(std::sync::atomic::Ordering::Acquire) {
            inner.add(subscriber);
        }
        stream
    }

    /// Publishes and drains `events`.
    pub fn publish(&self, events: &mut Vec<Event>) {
        self.publish_kept(events, false);
    }

    /// Publishes and drains the events of the gate's start, also kept for
    /// the first subscription if there is none yet.
    pub fn publish_start(&self, events: &mut Vec<Event>) {
        self.publish_kept(events, true);
    }

    /// Publishes nothing from now on and ends every subscription (their
    /// `recv` gives `None` once drained): the gate stopped acting.
    pub fn close(&self) {
        // Set before the lock is taken: a subscription made under the lock
        // after this sees it and is not kept.
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        let mut inner = self.lock();
        inner.live.clear();
        inner.before_first = None;
    }

    /// Publishes only while `fence` says yes; the first time it says no,
    /// the publisher closes. Set once.
    pub fn fence_with(&self, fence: Fence) {
        let _ = self.fence.set(fence);
    }

    /// Whether [`Publisher::close`] was called, or the fence said no.
    pub fn is_closed(&self) -> bool {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        if self.fence.get().is_some_and(|fence| !fence()) {
            self.close();
            return true;
        }
        false
    }

    fn publish_kept(&self, events: &mut Vec<Event>, keep: bool) {
        if events.is_empty() {
            return;
        }
        if self.is_closed() {
            events.clear();
            return;
        }
        let mut inner = self.lock();
        for event in events.drain(..) {
            log_decision(&event);
            if keep && !inner.subscribed {
                let held = inner.before_first.get_or_insert_with(Vec::new);
                if held.len() < EVENT_QUEUE {
                    held.push(event.clone());
                }
            }
            inner
                .live
                .retain(|subscriber| subscriber.offer(event.clone()));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        // A panic elsewhere while holding the lock leaves the list intact.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Subscribers {
    /// Adds `subscriber`, first removing the subscriptions dropped since
    /// the last publish: a quiet pool publishes nothing, and subscriptions
    /// made and dropped meanwhile (each `wait_ready` makes one) must not
    /// pile up.
    fn add(&mut self, subscriber: Subscriber) {
        self.live.retain(|s| !s.tx.is_closed());
        self.live.push(subscriber);
    }
}

fn channel() -> (EventStream, Subscriber) {
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let lost = Arc::new(AtomicU64::new(0));
    let stream = EventStream {
        rx,
        lost: Arc::clone(&lost),
    };
    (stream, Subscriber { tx, lost })
}

impl Subscriber {
    /// Queues `event`; `false` once the subscription is dropped.
    fn offer(&self, event: Event) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                if self.lost.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        queue = EVENT_QUEUE,
                        "an event subscriber fell behind: it loses events from now on (EventStream::lagged counts them)"
                    );
                }
                metrics::counter!("poolgate_events_lagged_total").increment(1);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
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
        // `Event` is non-exhaustive: an event of a newer core is logged
        // by its name.
        _ => tracing::info!(at_ms = at, event = event.name(), "gate event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_made_and_dropped_on_a_quiet_gate_do_not_pile_up() {
        // Embedder: 20,000 `wait_ready` calls on a ready pool (each one a
        // subscription, dropped at once) kept 67 MB until the next event.
        let publisher = Publisher::default();
        let kept = publisher.subscribe();
        for _ in 0..20_000 {
            drop(publisher.subscribe_from_now());
        }
        assert!(
            publisher.lock().live.len() <= 2,
            "{}",
            publisher.lock().live.len()
        );
        drop(kept);
    }
}
