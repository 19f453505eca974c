//! The events' way out: every subscriber gets every event, in order, and
//! each decision is logged as a structured tracing event.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use poolgate_core::{Event, NodeId};

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
