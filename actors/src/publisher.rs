//! The events' way out: every subscriber gets every event, in order, and
//! each decision is logged as a structured tracing event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::telemetry;
use poolgate_core::{Event, NodeId};

pub use tokio::sync::mpsc::error::TryRecvError;

/// How many events wait for one subscriber at most; a subscriber that
/// falls further behind loses readiness events first, never a run's
/// outcome while any other event waits, and is told
/// ([`EventStream::lagged`]).
pub const EVENT_QUEUE: usize = 1024;

/// Sends every event to every subscriber, in the order published.
///
/// Each subscriber has its own bounded queue of [`EVENT_QUEUE`] events
/// (events are few: one per readiness or run transition, never one per
/// observation); one that never reads costs at most that, and counts what
/// it lost: readiness chatter first, a run's outcome never while chatter
/// waits. The events of the gate's start (the restore events) are kept
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
    /// The last write of the durable state failed (and none since
    /// succeeded): what the gate tells is held back.
    unwritten: Arc<std::sync::atomic::AtomicBool>,
    /// A fleet's publisher, which also gets every event published here
    /// (one stream over all of a fleet's pools).
    forward: Arc<std::sync::OnceLock<Publisher>>,
}

/// Whether the gate may still act (a replica's leadership, design §12).
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
    queue: Arc<Queue>,
}

/// One subscription's queue, shared by the publisher (which offers) and
/// the stream (which takes): at most [`EVENT_QUEUE`] events, readiness
/// chatter shed first (see [`Queue::offer`]).
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<Waiting>,
    ready: tokio::sync::Notify,
    lost: AtomicU64,
}

#[derive(Debug, Default)]
struct Waiting {
    events: std::collections::VecDeque<Event>,
    /// No event will come any more (the publisher closed, or is gone).
    ended: bool,
    /// The stream was dropped: the publisher forgets the queue.
    dropped: bool,
}

/// A subscription to the gate's events, in the order they were published.
#[derive(Debug)]
pub struct EventStream {
    queue: Arc<Queue>,
}

/// Whether `event` ends (or commits) a run: never shed for lag.
pub(crate) fn is_outcome(event: &Event) -> bool {
    matches!(
        event,
        Event::RunCommitted { .. }
            | Event::RunFaulted { .. }
            | Event::RunFinished { .. }
            | Event::PlanningAborted { .. }
    )
}

impl Queue {
    fn held(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `event`; `false` once the stream is dropped. A full queue
    /// sheds readiness chatter, never a run's outcome: an outcome takes
    /// the place of the oldest event that is not one (that event is
    /// lost and counted); other events beyond the bound are lost and
    /// counted. Only a queue holding nothing but [`EVENT_QUEUE`] unread
    /// outcomes loses one.
    fn offer(&self, event: Event) -> bool {
        let mut held = self.held();
        if held.dropped {
            return false;
        }
        if held.events.len() >= EVENT_QUEUE {
            let shed = match is_outcome(&event) {
                true => held.events.iter().position(|e| !is_outcome(e)),
                false => None,
            };
            match shed {
                Some(oldest) => {
                    held.events.remove(oldest);
                }
                None => {
                    drop(held);
                    self.lose();
                    return true;
                }
            }
            self.lose();
        }
        held.events.push_back(event);
        drop(held);
        self.ready.notify_one();
        true
    }

    fn lose(&self) {
        if self.lost.fetch_add(1, Ordering::Relaxed) == 0 {
            crate::telemetry::said!(warn,
                queue = EVENT_QUEUE,
                "an event subscriber fell behind: it loses readiness events from now on, never a run's outcome (EventStream::lagged counts them)"
            );
        }
        crate::telemetry::guarded(|| {
            metrics::counter!("poolgate_events_lagged_total").increment(1)
        });
    }

    fn end(&self) {
        self.held().ended = true;
        self.ready.notify_one();
    }

    /// The oldest event waiting.
    fn take(&self) -> Result<Event, TryRecvError> {
        let mut held = self.held();
        match held.events.pop_front() {
            Some(event) => Ok(event),
            None if held.ended => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.queue.end();
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.queue.held().dropped = true;
    }
}

impl EventStream {
    /// The next event; `None` once the gate's actors have stopped and every
    /// `Gate` handle is dropped (a handle keeps the stream open), or the
    /// gate was stopped, and every event published before is read.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            // Registered before the look, so a wake between the look and
            // the wait is not missed.
            let notified = self.queue.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.queue.take() {
                Ok(event) => return Some(event),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => notified.await,
            }
        }
    }

    /// The next event if one is waiting ([`TryRecvError::Empty`] if none,
    /// [`TryRecvError::Disconnected`] once the stream is over).
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        self.queue.take()
    }

    /// How many events this subscription lost by falling [`EVENT_QUEUE`]
    /// events behind (0 for a subscriber that keeps up). Readiness events
    /// are lost first; a run's outcome (`run_committed`, `run_faulted`,
    /// `run_finished`, `planning_aborted`) only when [`EVENT_QUEUE`]
    /// outcomes wait unread.
    pub fn lagged(&self) -> u64 {
        self.queue.lost.load(Ordering::Relaxed)
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
            subscriber.queue.offer(event);
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

    /// Every event published here from now on is also published on
    /// `fleet` (a fleet's one stream over its pools). Set once.
    pub(crate) fn forward_to(&self, fleet: Publisher) {
        let _ = self.forward.set(fleet);
    }

    /// Publishes only while `fence` says yes; the first time it says no,
    /// the publisher closes. Set once.
    pub fn fence_with(&self, fence: Fence) {
        let _ = self.fence.set(fence);
    }

    /// Notes whether the last write of the durable state failed.
    pub fn note_written(&self, written: bool) {
        self.unwritten
            .store(!written, std::sync::atomic::Ordering::Release);
    }

    /// Whether the last write of the durable state failed.
    pub fn is_unwritten(&self) -> bool {
        self.unwritten.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether [`Publisher::close`] was called, or the fence said no.
    pub fn is_closed(&self) -> bool {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        if self.fence.get().is_some_and(|fence| !fence_allows(fence)) {
            self.close();
            return true;
        }
        false
    }

    /// What a pool's publisher forwards: published as the pool's own are,
    /// but logged once (by the pool's publisher).
    fn publish_forwarded(&self, events: &mut Vec<Event>, keep: bool) {
        if self.is_closed() {
            events.clear();
            return;
        }
        let mut inner = self.lock();
        for event in events.drain(..) {
            inner.offer(event, keep);
        }
    }

    fn publish_kept(&self, events: &mut Vec<Event>, keep: bool) {
        if events.is_empty() {
            return;
        }
        if self.is_closed() {
            events.clear();
            return;
        }
        if let Some(fleet) = self.forward.get() {
            let mut copies = events.clone();
            fleet.publish_forwarded(&mut copies, keep);
        }
        let mut inner = self.lock();
        for event in events.drain(..) {
            telemetry::logged(|| log_decision(&event));
            inner.offer(event, keep);
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
    /// Offers `event` to every subscriber, and keeps it for the first one
    /// if `keep` and none came yet.
    fn offer(&mut self, event: Event, keep: bool) {
        if keep && !self.subscribed {
            let held = self.before_first.get_or_insert_with(Vec::new);
            if held.len() < EVENT_QUEUE {
                held.push(event.clone());
            }
        }
        self.live
            .retain(|subscriber| subscriber.queue.offer(event.clone()));
    }

    /// Adds `subscriber`, first removing the subscriptions dropped since
    /// the last publish: a quiet pool publishes nothing, and subscriptions
    /// made and dropped meanwhile (each `wait_ready` makes one) must not
    /// pile up.
    fn add(&mut self, subscriber: Subscriber) {
        self.live.retain(|s| !s.queue.held().dropped);
        self.live.push(subscriber);
    }
}

/// Asks the embedder's fence; a fence that panics says no (the gate
/// stops acting: the safe side of a leadership it cannot confirm).
fn fence_allows(fence: &Fence) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fence())) {
        Ok(allows) => allows,
        Err(_) => {
            crate::telemetry::said!(error, "the gate's fence panicked: the gate stops acting");
            false
        }
    }
}

fn channel() -> (EventStream, Subscriber) {
    let queue = Arc::new(Queue::default());
    (
        EventStream {
            queue: Arc::clone(&queue),
        },
        Subscriber { queue },
    )
}

/// Each decision as a tracing event with structured fields (identity shows
/// only as fingerprints, in `PoolReady`'s count of them).
fn log_decision(event: &Event) {
    let at = event.at().as_millis();
    let pool = event.pool();
    match event {
        Event::PoolReady { epoch, members, .. } => {
            tracing::info!(at_ms = at, %pool, epoch = epoch.0, members = members.len(), "gate event: pool_ready")
        }
        Event::ReadinessLost {
            epoch,
            node,
            reason,
            ..
        } => {
            let node = node.as_ref().map(NodeId::as_str).unwrap_or("");
            tracing::info!(at_ms = at, %pool, epoch = epoch.0, node, %reason, "gate event: readiness_lost")
        }
        Event::PlanningStarted { run, epoch, .. } | Event::PlanningResumed { run, epoch, .. } => {
            tracing::info!(at_ms = at, %pool, %run, epoch = epoch.0, event = event.name(), "gate event: planning")
        }
        Event::PlanningSuspended { run, .. } | Event::RunFinished { run, .. } => {
            tracing::info!(at_ms = at, %pool, %run, event = event.name(), "gate event: run")
        }
        Event::PlanningAborted { run, reason, .. } => {
            tracing::info!(at_ms = at, %pool, %run, reason = ?reason, "gate event: planning_aborted")
        }
        Event::RunCommitted {
            run,
            epoch,
            required,
            ..
        } => {
            tracing::info!(at_ms = at, %pool, %run, epoch = epoch.0, required = required.len(), "gate event: run_committed")
        }
        Event::RunFaulted {
            run, node, reason, ..
        } => {
            tracing::info!(at_ms = at, %pool, %run, %node, %reason, "gate event: run_faulted")
        }
        // `Event` is non-exhaustive: an event of a newer core is logged
        // by its name.
        _ => tracing::info!(at_ms = at, %pool, event = event.name(), "gate event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use poolgate_core::{Epoch, PoolId, Reason, RunId, Time};

    fn chatter(i: u64) -> Event {
        Event::ReadinessLost {
            at: Time::from_millis(i),
            pool: PoolId::new("p").unwrap(),
            epoch: Epoch(i),
            node: Some(NodeId::new("n1").unwrap()),
            reason: Reason::Suspect,
        }
    }

    fn fault(i: u64) -> Event {
        Event::RunFaulted {
            at: Time::from_millis(i),
            pool: PoolId::new("p").unwrap(),
            run: RunId::new(&format!("r{i}")).unwrap(),
            node: NodeId::new("n1").unwrap(),
            reason: Reason::Dead,
        }
    }

    #[test]
    fn a_slow_subscriber_loses_readiness_chatter_never_a_runs_outcome() {
        // Issue 29, reproduction 4: after 1,200 unread readiness events,
        // run_faulted was lost (lagged() = 181).
        let publisher = Publisher::default();
        let mut slow = publisher.subscribe();
        let mut events: Vec<Event> = (0..1200).map(chatter).collect();
        events.push(fault(1200));
        events.push(chatter(1201));
        publisher.publish(&mut events);
        let mut read = Vec::new();
        while let Ok(event) = slow.try_recv() {
            read.push(event);
        }
        assert_eq!(read.len(), EVENT_QUEUE);
        assert_eq!(slow.lagged(), 1202 - EVENT_QUEUE as u64);
        // The outcome is there, after every event kept that came before it.
        let at = read
            .iter()
            .position(|e| *e == fault(1200))
            .expect("run_faulted kept");
        assert!(read[..at].iter().all(|e| e.at().as_millis() < 1200));
        assert_eq!(
            at,
            EVENT_QUEUE - 1,
            "nothing after it was kept (the queue was full)"
        );
        // In order throughout.
        assert!(read.windows(2).all(|w| w[0].at() < w[1].at()));
    }

    #[test]
    fn only_a_queue_of_unread_outcomes_loses_an_outcome_and_counts_it() {
        let publisher = Publisher::default();
        let mut slow = publisher.subscribe();
        let mut events: Vec<Event> = (0..EVENT_QUEUE as u64 + 3).map(fault).collect();
        publisher.publish(&mut events);
        assert_eq!(slow.lagged(), 3);
        let mut count = 0;
        while slow.try_recv().is_ok() {
            count += 1;
        }
        assert_eq!(count, EVENT_QUEUE);
    }

    #[actix_rt::test]
    async fn a_stream_ends_when_the_publisher_closes_after_what_was_published() {
        let publisher = Publisher::default();
        let mut stream = publisher.subscribe();
        publisher.publish(&mut vec![chatter(1)]);
        let waiting = tokio::spawn(async move {
            let first = stream.recv().await;
            let second = stream.recv().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        publisher.close();
        let (first, second) = waiting.await.unwrap();
        assert_eq!(first, Some(chatter(1)));
        assert_eq!(second, None);
        // A subscription made after the close ends at once.
        assert_eq!(publisher.subscribe().recv().await, None);
    }

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
