//! One way to drive foca, shared by the live member (UDP and actix
//! timers), the simulator and the tracker's tests (memory and virtual
//! time), as one transport seam serves a gossip library over UDP and in
//! memory alike.
//!
//! foca asks for what it needs through an [`AccumulatingRuntime`]: datagrams
//! to send, timers to set, notifications. [`drain`] hands each to a
//! [`Host`] in foca's order and gives back the renames, and [`track`]
//! turns what foca applied since into the tracker's facts.

use std::time::Duration;

use foca::{AccumulatingRuntime, OwnedNotification, Timer};

use super::identity::SwimIdentity;
use super::tracker::{MembershipTracker, SwimFact};
use super::watch::Changes;

/// Where a foca instance's requests go.
pub trait Host {
    /// A datagram foca wants sent.
    fn send(&mut self, to: SwimIdentity, data: bytes::Bytes);
    /// A timer foca wants back after `after`.
    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>);
    /// What else foca says (renames are [`drain`]'s answer instead).
    fn notified(&mut self, notification: OwnedNotification<SwimIdentity>) {
        let _ = notification;
    }
}

/// An identity foca replaced by another at the same address: (old, new).
pub type Replaced = (SwimIdentity, SwimIdentity);

/// Hands what foca asked for to `host`: the datagrams, then the timers,
/// then the notifications; returns the renames among them.
pub fn drain(
    runtime: &mut AccumulatingRuntime<SwimIdentity>,
    host: &mut impl Host,
) -> Vec<Replaced> {
    while let Some((to, data)) = runtime.to_send() {
        host.send(to, data);
    }
    while let Some((after, timer)) = runtime.to_schedule() {
        host.schedule(after, timer);
    }
    let mut replaced = Vec::new();
    while let Some(notification) = runtime.to_notify() {
        match notification {
            OwnedNotification::Rename(old, new) => replaced.push((old, new)),
            other => host.notified(other),
        }
    }
    replaced
}

/// What foca applied since the last call, as the tracker's facts, the
/// member's own identity left out.
pub fn track(
    tracker: &mut MembershipTracker,
    changes: &Changes,
    own: &SwimIdentity,
    replaced: Vec<Replaced>,
) -> Vec<SwimFact> {
    let states = changes.take().into_iter().filter(|m| m.id() != own);
    tracker.changed(states, replaced)
}
