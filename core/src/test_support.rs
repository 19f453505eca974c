//! Short constructors shared by the core's unit tests.

use crate::{NodeId, RunId, Time};

/// The instant `ms` milliseconds after the start.
pub(crate) fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

/// A node id known to be valid.
pub(crate) fn node(name: &str) -> NodeId {
    NodeId::new(name).expect("a valid node id")
}

/// A run id known to be valid.
pub(crate) fn run(name: &str) -> RunId {
    RunId::new(name).expect("a valid run id")
}
