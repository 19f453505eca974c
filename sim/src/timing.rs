//! The tracker benchmark's instrumentation, apart from the simulated
//! network it measures: member 0's tracker timed call by call, a control
//! call, the whole-view walk it replaced as a baseline, and a replay of its
//! recorded input with warm caches (`examples/swim_sim.rs`, BENCHMARKS.md).

use std::net::SocketAddr;
use std::time::Instant;

use super::stats::NetStats;
use poolgate::live::swim::drive::Replaced;
use poolgate::live::swim::member::SwimFoca;
use poolgate::live::swim::tracker::{MembershipTracker, SwimFact};
use poolgate::live::swim::SwimIdentity;

/// Member 0's tracker, each call timed; with the baseline on, also the
/// control call, the whole-view walk and a record of its input.
#[derive(Debug, Default)]
pub(super) struct TimedTracker {
    tracker: MembershipTracker,
    /// Real nanoseconds of each call.
    call_ns: Vec<u32>,
    /// Real nanoseconds of a call that notes nothing, made right after each
    /// (the same code with warm caches: the control for `call_ns`), while
    /// the baseline is timed.
    again_ns: Vec<u32>,
    baseline: Option<WholeViewWalk>,
}

impl TimedTracker {
    /// The tracker itself, untimed (the whole-view check of the repair).
    pub(super) fn tracker_mut(&mut self) -> &mut MembershipTracker {
        &mut self.tracker
    }

    /// The tracker on what member 0's foca noted, timed; the facts it
    /// reports.
    pub(super) fn call(
        &mut self,
        stats: &mut NetStats,
        noted: Vec<foca::Member<SwimIdentity>>,
        replaced: Vec<Replaced>,
        foca: &SwimFoca,
    ) -> Vec<SwimFact> {
        let own = foca.identity();
        if let Some(baseline) = self.baseline.as_mut() {
            baseline.record(&noted, &replaced, own);
        }
        let started = Instant::now();
        stats.noted += noted.len() as u64;
        let states = noted.into_iter().filter(|m| m.id() != own);
        let changed = self.tracker.changed(states, replaced);
        self.call_ns.push(nanos_since(started));
        stats.tracker_calls += 1;
        if self.baseline.is_some() {
            // The control: a call that notes nothing, at once.
            let started = Instant::now();
            std::hint::black_box(self.tracker.changed(Vec::new(), Vec::new()));
            self.again_ns.push(nanos_since(started));
        }
        stats.observed += changed.len() as u64;
        if let Some(baseline) = self.baseline.as_mut() {
            if stats.tracker_calls.is_multiple_of(BASELINE_EVERY) {
                let started = Instant::now();
                std::hint::black_box(baseline.walk(foca));
                stats.baseline_ns += u64::try_from(started.elapsed().as_nanos()).unwrap_or(0);
                stats.baseline_calls += 1;
            }
        }
        changed
    }

    pub(super) fn call_ns(&self) -> &[u32] {
        &self.call_ns
    }

    pub(super) fn again_ns(&self) -> &[u32] {
        &self.again_ns
    }

    pub(super) fn time_baseline(&mut self, on: bool) {
        self.baseline = on.then(WholeViewWalk::default);
    }

    /// See [`super::net::Network::replay_tracker`].
    pub(super) fn replay(&self, from: u64) -> Option<TrackerReplay> {
        let recorded = &self.baseline.as_ref()?.inputs;
        let from = usize::try_from(from)
            .unwrap_or(usize::MAX)
            .min(recorded.len());
        let (warm_up, timed) = recorded.split_at(from);
        let (ns, updates) = fastest_replay(warm_up, timed, |_| true);
        let busy = timed.iter().filter(|i| !notes_nothing(i));
        Some(TrackerReplay {
            calls: timed.len() as u64,
            ns,
            updates,
            busy_calls: busy.clone().count() as u64,
            busy_states: busy.map(|(s, r)| (s.len() + r.len()) as u64).sum(),
            busy_ns: fastest_replay(warm_up, timed, |i| !notes_nothing(i)).0,
            idle_calls: timed.iter().filter(|i| notes_nothing(i)).count() as u64,
            idle_ns: fastest_replay(warm_up, timed, notes_nothing).0,
        })
    }
}

/// The cost of what the tracker did before it was fed changes: after
/// every foca call, walk member 0's whole membership and compare each
/// member with what was reported (a key made and looked up per member).
/// Timed on one call in [`BASELINE_EVERY`], beside the tracker, to compare
/// the two in one run.
///
/// It also records member 0's tracker input, call by call, so the tracker
/// can be timed again on the same input with warm caches
/// ([`Network::replay_tracker`](super::net::Network::replay_tracker)): inside the simulation, the other members'
/// work between two calls of member 0 evicts everything it touched.
#[derive(Debug, Default)]
struct WholeViewWalk {
    seen: std::collections::HashMap<(String, SocketAddr), (u8, u16, u64)>,
    inputs: Vec<TrackerInput>,
}

/// One call's input to the tracker: member states, then replaced identities.
type TrackerInput = (
    Vec<foca::Member<SwimIdentity>>,
    Vec<(SwimIdentity, SwimIdentity)>,
);

/// The tracker timed again on member 0's recorded input, with warm caches
/// ([`Network::replay_tracker`](super::net::Network::replay_tracker)); times in real nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackerReplay {
    /// Calls replayed.
    pub calls: u64,
    /// All of them, in order.
    pub ns: u64,
    /// Updates they gave (member states that changed for the gate).
    pub updates: u64,
    /// Calls that noted a member state or a replaced identity.
    pub busy_calls: u64,
    /// States and replaced identities in them.
    pub busy_states: u64,
    /// Those calls alone.
    pub busy_ns: u64,
    /// Calls that noted nothing.
    pub idle_calls: u64,
    /// Those calls alone.
    pub idle_ns: u64,
}

/// Feeds a fresh tracker `warm_up` untimed, then the calls of `timed` that
/// `keep` keeps in a tight loop; the fastest of five passes, in real
/// nanoseconds, and the updates those calls gave. Dropping calls that
/// note nothing leaves the tracker's state as it was.
fn fastest_replay(
    warm_up: &[TrackerInput],
    timed: &[TrackerInput],
    keep: impl Fn(&TrackerInput) -> bool,
) -> (u64, u64) {
    let mut fastest = u64::MAX;
    let mut updates = 0usize;
    for _ in 0..5 {
        let mut tracker = MembershipTracker::default();
        for (states, replaced) in warm_up.iter().cloned() {
            std::hint::black_box(tracker.changed(states, replaced));
        }
        let inputs: Vec<TrackerInput> = timed.iter().filter(|i| keep(i)).cloned().collect();
        updates = 0;
        let started = Instant::now();
        for (states, replaced) in inputs {
            updates += tracker.changed(states, replaced).len();
        }
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        std::hint::black_box(updates);
        fastest = fastest.min(ns);
    }
    (fastest, updates as u64)
}

/// Whether a call noted no member state and no replaced identity.
fn notes_nothing((states, replaced): &TrackerInput) -> bool {
    states.is_empty() && replaced.is_empty()
}

/// Real nanoseconds since `started`, saturated to fit a `u32` (4.29 s).
fn nanos_since(started: Instant) -> u32 {
    u32::try_from(started.elapsed().as_nanos()).unwrap_or(u32::MAX)
}

/// One member-0 call in this many also times the baseline walk.
pub const BASELINE_EVERY: u64 = 16;

impl WholeViewWalk {
    fn record(
        &mut self,
        noted: &[foca::Member<SwimIdentity>],
        replaced: &[(SwimIdentity, SwimIdentity)],
        own: &SwimIdentity,
    ) {
        let states = noted.iter().filter(|m| m.id() != own).cloned().collect();
        self.inputs.push((states, replaced.to_vec()));
    }

    fn walk(&mut self, foca: &SwimFoca) -> usize {
        let mut changed = 0;
        for member in foca.iter_membership_state() {
            let id = member.id();
            let state = (member.state() as u8, member.incarnation(), id.generation);
            let key = (id.node.clone(), id.addr);
            if self.seen.get(&key) != Some(&state) {
                self.seen.insert(key, state);
                changed += 1;
            }
        }
        changed
    }
}
