//! The simulated network's counters and its adapter's, kept by the
//! network (`net`) and the tracker's timing (`timing`) alike.

/// Counters of the network and of the orchestrator's adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Lost by the loss model.
    pub lost: u64,
    /// Dropped by a partition.
    pub cut: u64,
    /// Dropped because the receiver was down.
    pub undeliverable: u64,
    /// foca calls of member 0 (datagrams, timers, announcements); the
    /// tracker's time on each is in [`Network::tracker_call_ns`](super::net::Network::tracker_call_ns).
    pub tracker_calls: u64,
    /// Member states the codec noted (what the tracker looked at).
    pub noted: u64,
    /// Facts the tracker reported.
    pub observed: u64,
    /// Calls on which the baseline walk was also timed.
    pub baseline_calls: u64,
    /// Real time the baseline walk took on them, in nanoseconds.
    pub baseline_ns: u64,
    /// Suspicions a member declared down at its repair, having held them
    /// past the limit (`drive::Repair`).
    pub suspicions_expired: u64,
    /// Probes unanswered over UDP whose member the orchestrator vouched
    /// for by its agent connection ([`Network::set_vouching`](super::net::Network::set_vouching)).
    pub vouched: u64,
}
