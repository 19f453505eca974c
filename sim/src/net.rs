//! A SWIM cluster in memory: foca members exchanging datagrams over a
//! modelled network, on a virtual millisecond clock. Nothing here reads the
//! wall clock or a socket, so one seed gives one run.
//!
//! Member 0 is the orchestrator's: its view goes through the real adapter
//! (the watching codec and the
//! [`MembershipTracker`](poolgate::live::swim::MembershipTracker)) and comes
//! out as [`SwimFact`] facts, stamped with the virtual instant (its timing
//! for the tracker benchmark is the `timing` module's). Members 1..=N are
//! the nodes `n1`…`nN`. Every member repairs what foca leaves undone once
//! a virtual second, as a live member does once a second
//! ([`drive::Repair`]): suspicions time out everywhere, and member 0's
//! whole view is checked against what its tracker told.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use foca::Timer;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

pub use super::stats::NetStats;
use super::timing::TimedTracker;
pub use super::timing::{TrackerReplay, BASELINE_EVERY};
use poolgate::live::swim::drive;
use poolgate::live::swim::tracker::SwimFact;
use poolgate::live::swim::watch::{Changes, WatchingCodec};
use poolgate::live::swim::SwimIdentity;

/// How datagrams travel.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkModel {
    /// The probability that a datagram is lost.
    pub loss: f64,
    /// Every datagram takes at least this long.
    pub base_delay_ms: u64,
    /// Plus an exponentially distributed delay with this mean.
    pub mean_extra_ms: f64,
    /// With this probability a datagram is late (a queue, a retransmit
    /// below, a stalled receiver) ...
    pub tail_probability: f64,
    /// ... by up to this many milliseconds more (uniform).
    pub tail_ms: u64,
}

impl Default for NetworkModel {
    /// A LAN: 1 ms plus 1 ms on average, one datagram in 200 up to 200 ms
    /// late, no loss.
    fn default() -> Self {
        Self {
            loss: 0.0,
            base_delay_ms: 1,
            mean_extra_ms: 1.0,
            tail_probability: 0.005,
            tail_ms: 200,
        }
    }
}

/// Members split in two groups that cannot reach each other for a while.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// From this virtual instant ...
    pub from_ms: u64,
    /// ... until this one (exclusive).
    pub until_ms: u64,
    /// Members with an index below this are on one side, the rest on the
    /// other (member 0, the orchestrator's, is always on the first side).
    pub split: usize,
}

enum Event {
    Deliver {
        to: usize,
        data: Vec<u8>,
    },
    Timer {
        member: usize,
        life: u32,
        timer: Timer<SwimIdentity>,
    },
    /// A member's once-a-second repair ([`drive::Repair`]).
    Repair {
        member: usize,
        life: u32,
    },
    /// The orchestrator's answer to a node that asked about a member it
    /// probed in vain: that member's agent connection shows it alive.
    Vouched {
        member: usize,
        life: u32,
        probed: SwimIdentity,
        number: foca::ProbeNumber,
    },
}

/// Events by virtual millisecond, each instant's in the order they were
/// scheduled (what a heap ordered by (instant, sequence) gives, without
/// sifting every event through it).
#[derive(Default)]
struct Queue {
    instants: BTreeMap<u64, Vec<Event>>,
}

impl Queue {
    fn push(&mut self, at: u64, event: Event) {
        self.instants.entry(at).or_default().push(event);
    }

    fn next_at(&self) -> Option<u64> {
        self.instants.first_key_value().map(|(at, _)| *at)
    }

    /// Every event due at `at` scheduled so far, in order.
    fn take_at(&mut self, at: u64) -> Option<Vec<Event>> {
        match self.instants.first_entry() {
            Some(first) if *first.key() == at => Some(first.remove()),
            _ => None,
        }
    }
}

/// What a member's foca asked for, held until the network takes it.
#[derive(Default)]
struct Asked {
    outgoing: Vec<(SocketAddr, Vec<u8>)>,
    timers: Vec<(Duration, Timer<SwimIdentity>)>,
}

impl drive::Host for Asked {
    fn send(
        &mut self,
        to: SwimIdentity,
        data: bytes::Bytes,
        _header: Option<&foca::Header<SwimIdentity>>,
    ) {
        self.outgoing.push((to.addr, data.to_vec()));
    }

    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>) {
        self.timers.push((after, timer));
    }
}

struct Member {
    /// foca, the probe under way and the repair, driven as the live
    /// member drives its own.
    driver: drive::Driver,
    up: bool,
    /// Bumped at each restart: timers of an earlier life are ignored.
    life: u32,
    generation: u64,
    /// Stopped until this instant (SIGSTOP, a paused VM): what comes for
    /// it meanwhile waits (see [`Network::pause`]).
    paused_until: u64,
}

/// How long after a pause a member's late timers run: the live member
/// reads the datagrams that came in meanwhile first (its `CATCH_UP`).
const CATCH_UP_MS: u64 = 100;

/// The simulated cluster.
pub struct Network {
    now: u64,
    queue: Queue,
    members: Vec<Member>,
    rng: StdRng,
    seed: u64,
    model: NetworkModel,
    partition: Option<Partition>,
    config: foca::Config,
    /// Member 0's tracker, timed for the tracker benchmark.
    tracker: TimedTracker,
    changes: Changes,
    observed: Vec<SwimFact>,
    stats: NetStats,
    /// Whether agent connections vouch for members whose probes go
    /// unanswered (as the live cluster does, design §15).
    vouching: bool,
}

/// The address of member `index`: 10.0.0.0/8 plus the index, port 7946.
pub fn address(index: usize) -> SocketAddr {
    let host = u32::try_from(index).unwrap_or(u32::MAX) & 0x00ff_ffff;
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(0x0a00_0000 | host), 7946))
}

fn index_of(addr: SocketAddr) -> Option<usize> {
    match addr {
        SocketAddr::V4(v4) => usize::try_from(u32::from(*v4.ip()) & 0x00ff_ffff).ok(),
        SocketAddr::V6(_) => None,
    }
}

/// The node id of member `index` (1-based; member 0 is the orchestrator's).
pub fn node_name(index: usize) -> String {
    format!("n{index}")
}

impl Network {
    /// `nodes` node members plus the orchestrator's member 0, each running
    /// foca with `config`; nobody has joined yet.
    pub fn new(nodes: usize, config: foca::Config, model: NetworkModel, seed: u64) -> Self {
        let (codec, changes) = WatchingCodec::watched(Default::default());
        let mut network = Network {
            now: 0,
            queue: Queue::default(),
            members: Vec::with_capacity(nodes + 1),
            rng: StdRng::seed_from_u64(seed),
            seed,
            model,
            partition: None,
            config,
            tracker: TimedTracker::default(),
            changes,
            observed: Vec::new(),
            stats: NetStats::default(),
            vouching: false,
        };
        let orchestrator = network.foca(0, "orchestrator".into(), 1, codec);
        network.members.push(orchestrator);
        for index in 1..=nodes {
            let foca = network.foca(index, node_name(index), 1, WatchingCodec::unwatched());
            network.members.push(foca);
        }
        for index in 0..network.members.len() {
            network.schedule_repair(index);
        }
        network
    }

    /// Member `index`'s next repair, a repair period from now.
    fn schedule_repair(&mut self, index: usize) {
        let Some(member) = self.members.get(index) else {
            return;
        };
        let life = member.life;
        let at = self.now + millis(drive::REPAIR_EVERY);
        self.schedule(
            at,
            Event::Repair {
                member: index,
                life,
            },
        );
    }

    fn foca(&self, index: usize, node: String, generation: u64, codec: WatchingCodec) -> Member {
        let identity = SwimIdentity::new(node, address(index), generation);
        let seed = self
            .seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((index as u64) << 20)
            .wrapping_add(generation);
        Member {
            driver: drive::Driver::new(
                identity,
                self.config.clone(),
                StdRng::seed_from_u64(seed),
                codec,
            ),
            up: true,
            life: 0,
            generation,
            paused_until: 0,
        }
    }

    /// Whether agent connections vouch for members whose probes go
    /// unanswered over UDP (design §15): each node holds one to the
    /// orchestrator (member 0), over TCP, which the loss model does not
    /// touch (a partition cuts it, a crash closes it). The orchestrator
    /// vouches for its own probes at once; a node's question and answer
    /// take a millisecond each way; a node with no connection to ask over
    /// accuses nobody.
    pub fn set_vouching(&mut self, on: bool) {
        self.vouching = on;
    }

    /// Whether member `index`'s agent connection to member 0 carries
    /// frames now (both up, no partition between them).
    fn connected(&self, index: usize) -> bool {
        let up = |i: usize| self.members.get(i).is_some_and(|m| m.up);
        let cut = self.partition.as_ref().is_some_and(|cut| {
            (index < cut.split) != (0 < cut.split)
                && (cut.from_ms..cut.until_ms).contains(&self.now)
        });
        up(0) && up(index) && !cut
    }

    /// Whether the orchestrator vouches for `probed` now: its agent
    /// connection is up and it is the identity of the member's life; or
    /// the orchestrator doubts itself (design §15): every node's
    /// connection, two or more, is silent at once (cut by a partition; a
    /// crashed node's is closed, not silent).
    fn vouches(&self, probed: &SwimIdentity) -> bool {
        index_of(probed.addr)
            .filter(|i| *i > 0)
            .and_then(|i| Some((i, self.members.get(i)?)))
            .is_some_and(|(i, m)| m.generation == probed.generation && self.connected(i))
            || self.doubts_itself()
    }

    /// Whether every connection to the orchestrator that is not closed,
    /// two or more, is silent now.
    fn doubts_itself(&self) -> bool {
        let mut silent = 0;
        for index in 1..self.members.len() {
            if !self.members[index].up || !self.members[0].up {
                continue;
            }
            if self.connected(index) {
                return false;
            }
            silent += 1;
        }
        silent >= 2
    }

    /// The generation of member `index`'s SWIM identity now: its life's,
    /// or higher once it renewed it after being declared down.
    pub fn identity_generation(&self, index: usize) -> Option<u64> {
        Some(self.members.get(index)?.driver.identity().generation)
    }

    /// The virtual instant, in milliseconds.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// How many members (the orchestrator's included).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members at all (never: member 0 is always there).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Real nanoseconds each member-0 tracker call took, call by call (the
    /// distribution: one call preempted by the OS weighs on the mean
    /// alone).
    pub fn tracker_call_ns(&self) -> &[u32] {
        self.tracker.call_ns()
    }

    /// Real nanoseconds of a call with nothing noted made right after each
    /// member-0 call while the tracker is timed ([`super::SimSettings`]'s
    /// `time_tracker`), in order: the
    /// same code as most calls with its caches warm, to tell the tracker's
    /// work from the cache misses the other members' work between two
    /// member-0 calls causes.
    pub fn tracker_again_ns(&self) -> &[u32] {
        self.tracker.again_ns()
    }

    /// Also times the old whole-view walk on one member-0 call in
    /// [`BASELINE_EVERY`], records member 0's input and makes the control
    /// call (for the benchmark; it changes nothing else). Set before the
    /// first call ([`SimSettings::time_tracker`](super::SimSettings)), so
    /// the recordings line up with [`Network::tracker_call_ns`] call for
    /// call.
    pub(super) fn time_baseline(&mut self, on: bool) {
        self.tracker.time_baseline(on);
    }

    /// Runs a fresh tracker on member 0's recorded input after the first
    /// `from` calls (fed untimed, to build its state), in tight timed
    /// loops with warm caches: every call in order; the calls that noted
    /// something alone (the others change nothing, so the tracker ends in
    /// the same state); the calls that noted nothing alone. Each the
    /// fastest of five passes (a pass the OS preempted says nothing of the
    /// tracker). `None` unless the tracker is timed ([`super::SimSettings`]'s
    /// `time_tracker`).
    pub fn replay_tracker(&self, from: u64) -> Option<TrackerReplay> {
        self.tracker.replay(from)
    }

    /// Changes the loss probability from now on.
    pub fn set_loss(&mut self, loss: f64) {
        self.model.loss = loss;
    }

    /// Cuts the network in two for a while.
    pub fn partition(&mut self, partition: Option<Partition>) {
        self.partition = partition;
    }

    /// Starts from a converged cluster instead of a cold start: every
    /// member already holds every other as alive (what the joins would
    /// have gossiped), so no join traffic is simulated. For figures of the
    /// steady state at sizes where the cold start's gossip would dominate
    /// the simulation's cost. Member 0's view goes through the tracker as
    /// any change would.
    pub fn converge(&mut self) {
        let everyone: Vec<foca::Member<SwimIdentity>> = self
            .members
            .iter()
            .map(|m| foca::Member::alive(m.driver.identity().clone()))
            .collect();
        for index in 0..self.members.len() {
            let member = &mut self.members[index];
            let own = member.driver.identity().clone();
            let others = everyone.iter().filter(|m| *m.id() != own).cloned();
            // Told by the simulation: nothing to gossip on, but for member
            // 0, whose foca must note the states for its tracker (it then
            // gossips what everyone knows, which changes nothing).
            let _ = member.driver.apply(others.collect(), index == 0);
            self.drain(index);
        }
    }

    /// Member `index` announces itself to member 0 (the seed).
    pub fn join(&mut self, index: usize) {
        self.announce(index, 0);
    }

    /// Member `from` announces itself to the member at `to`'s address.
    pub fn announce(&mut self, from: usize, to: usize) {
        let Some(member) = self.members.get_mut(from) else {
            return;
        };
        if !member.up {
            return;
        }
        // A refused announce (to ourselves) changes nothing.
        let _ = member.driver.announce(SwimIdentity::seed(address(to)));
        self.drain(from);
    }

    /// Member `index` stops answering, as a crashed process would.
    pub fn crash(&mut self, index: usize) {
        if let Some(member) = self.members.get_mut(index) {
            member.up = false;
        }
    }

    /// Member `index` stops for `ms` (SIGSTOP, a paused VM), then goes on:
    /// the datagrams sent to it meanwhile wait in its socket and are read
    /// when it resumes, its timers run late, after them.
    pub fn pause(&mut self, index: usize, ms: u64) {
        let until = self.now + ms;
        if let Some(member) = self.members.get_mut(index) {
            member.paused_until = member.paused_until.max(until);
        }
    }

    /// When an event for a paused member is to run instead, if it is.
    fn resumes(&self, event: &Event) -> Option<u64> {
        let (index, catch_up) = match event {
            Event::Deliver { to, .. } => (*to, 0),
            Event::Timer { member, .. }
            | Event::Repair { member, .. }
            | Event::Vouched { member, .. } => (*member, CATCH_UP_MS),
        };
        let until = self.members.get(index)?.paused_until;
        (until > self.now).then_some(until + catch_up)
    }

    /// Member `index` comes back as a new process: a new generation, an
    /// empty view, announcing itself to the seed.
    pub fn restart(&mut self, index: usize) {
        let Some(old) = self.members.get(index) else {
            return;
        };
        let (node, generation, life) = (
            old.driver.identity().node.clone(),
            old.generation + 1,
            old.life + 1,
        );
        let mut member = self.foca(index, node, generation, WatchingCodec::unwatched());
        member.life = life;
        self.members[index] = member;
        self.schedule_repair(index);
        self.join(index);
    }

    /// Whether member `index` is up.
    pub fn is_up(&self, index: usize) -> bool {
        self.members.get(index).is_some_and(|m| m.up)
    }

    /// How many members member `index` counts as active.
    pub fn active_members(&self, index: usize) -> usize {
        self.members
            .get(index)
            .map_or(0, |m| m.driver.foca().num_members())
    }

    /// The instant of the next scheduled event, if any.
    pub fn next_at(&self) -> Option<u64> {
        self.queue.next_at()
    }

    /// Runs every event due at the next instant, if it is at or before
    /// `until`; returns that instant. The orchestrator's facts wait in
    /// [`Network::take_observed`].
    pub fn step(&mut self, until: u64) -> Option<u64> {
        let at = self.next_at().filter(|at| *at <= until)?;
        self.now = at;
        // Events scheduled for this very instant while it runs come after.
        while let Some(events) = self.queue.take_at(at) {
            for event in events {
                self.run(event);
            }
        }
        Some(at)
    }

    /// Moves the clock to `at` without running anything (nothing may be
    /// due before it).
    pub fn advance_to(&mut self, at: u64) {
        self.now = self.now.max(at);
    }

    /// Member 0's whole view, as foca lists it: each member's identity,
    /// its state and incarnation as the tracker reports them (the
    /// generation folded in: `generation << 16 | incarnation`).
    pub fn whole_view(&self) -> Vec<(SwimIdentity, poolgate_actors::core::SwimState, u64)> {
        use poolgate_actors::core::SwimState;
        let Some(orchestrator) = self.members.first() else {
            return Vec::new();
        };
        orchestrator
            .driver
            .foca()
            .iter_membership_state()
            .map(|member| {
                let id = member.id().clone();
                let state = match member.state() {
                    foca::State::Alive => SwimState::Alive,
                    foca::State::Suspect => SwimState::Suspect,
                    foca::State::Down => SwimState::Dead,
                };
                let incarnation = (id.generation << 16) | u64::from(member.incarnation());
                (id, state, incarnation)
            })
            .collect()
    }

    /// The facts member 0's tracker reported since the last call.
    pub fn take_observed(&mut self) -> Vec<SwimFact> {
        std::mem::take(&mut self.observed)
    }

    fn run(&mut self, event: Event) {
        if let Some(at) = self.resumes(&event) {
            self.schedule(at, event);
            return;
        }
        match event {
            Event::Deliver { to, data } => {
                let Some(member) = self.members.get_mut(to) else {
                    return;
                };
                if !member.up {
                    self.stats.undeliverable += 1;
                    return;
                }
                // foca refuses what it cannot use; the network may carry it.
                let _ = member.driver.datagram(&data);
                self.drain(to);
            }
            Event::Timer {
                member: index,
                life,
                timer,
            } => {
                let Some(member) = self.members.get_mut(index) else {
                    return;
                };
                if !member.up || member.life != life {
                    return;
                }
                let unanswered = member.driver.unanswered(&timer);
                let mut ack_now = false;
                if let Some((probed, number)) = unanswered.filter(|_| self.vouching) {
                    if index == 0 {
                        ack_now = self.vouches(&probed);
                    } else if !self.connected(index) {
                        // No orchestrator to ask: no accusation.
                        ack_now = true;
                    } else if self.vouches(&probed) {
                        // Asked over the agent connection; answered from
                        // the evidence the orchestrator holds then (a no
                        // lets the suspicion stand).
                        self.schedule(
                            self.now + 2,
                            Event::Vouched {
                                member: index,
                                life,
                                probed,
                                number,
                            },
                        );
                    }
                }
                if ack_now {
                    self.stats.vouched += 1;
                }
                let member = &mut self.members[index];
                let _ = member.driver.timer(timer, |_, _| ack_now);
                self.drain(index);
            }
            Event::Vouched {
                member: index,
                life,
                probed,
                number,
            } => {
                let current = self
                    .members
                    .get(index)
                    .is_some_and(|m| m.up && m.life == life);
                if current && self.connected(index) {
                    let member = &mut self.members[index];
                    // A late answer (its probe over) changes nothing.
                    if !matches!(member.driver.vouched(&probed, number), Ok(false)) {
                        self.stats.vouched += 1;
                        self.drain(index);
                    }
                }
            }
            Event::Repair {
                member: index,
                life,
            } => {
                let Some(member) = self.members.get_mut(index) else {
                    return;
                };
                if member.life != life {
                    return;
                }
                if member.up {
                    self.repair(index);
                }
                // A crashed member's clock goes on: it repairs again if it
                // comes back in this life.
                self.schedule_repair(index);
            }
        }
    }

    /// Member `index`'s repair: its expired suspicions declared down (and
    /// gossiped), and for member 0 its whole view told to the tracker.
    fn repair(&mut self, index: usize) {
        let now = Duration::from_millis(self.now);
        let member = &mut self.members[index];
        // foca refuses what it cannot use; nothing else to do then.
        if let Ok(expired @ 1..) = member.driver.expire_suspicions(now) {
            self.stats.suspicions_expired += expired as u64;
            self.drain(index);
        }
        if index == 0 {
            let facts = self.members[0]
                .driver
                .whole_view(self.tracker.tracker_mut());
            self.observed.extend(facts);
        }
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.queue.push(at, event);
    }

    /// Does what member `index`'s foca asked for; for member 0, runs the
    /// tracker on what changed.
    fn drain(&mut self, index: usize) {
        let member = &mut self.members[index];
        let life = member.life;
        let mut asked = Asked::default();
        let replaced = member.driver.drain(&mut asked);
        let Asked { outgoing, timers } = asked;
        if index == 0 {
            let noted = self.changes.take();
            let changed = self
                .tracker
                .call(&mut self.stats, noted, replaced, member.driver.foca());
            self.observed.extend(changed);
        }
        for (after, timer) in timers {
            let at = self.now + millis(after);
            self.schedule(
                at,
                Event::Timer {
                    member: index,
                    life,
                    timer,
                },
            );
        }
        for (to, data) in outgoing {
            self.send(index, to, data);
        }
    }

    fn send(&mut self, from: usize, to: SocketAddr, data: Vec<u8>) {
        self.stats.sent += 1;
        let Some(to) = index_of(to).filter(|i| *i < self.members.len()) else {
            self.stats.undeliverable += 1;
            return;
        };
        if let Some(cut) = &self.partition {
            let across = (from < cut.split) != (to < cut.split);
            if across && (cut.from_ms..cut.until_ms).contains(&self.now) {
                self.stats.cut += 1;
                return;
            }
        }
        if self.model.loss > 0.0 && self.rng.random::<f64>() < self.model.loss {
            self.stats.lost += 1;
            return;
        }
        let delay = self.delay();
        self.schedule(self.now + delay, Event::Deliver { to, data });
    }

    /// One datagram's delay: base + exponential, sometimes a tail.
    fn delay(&mut self) -> u64 {
        let model = &self.model;
        let uniform: f64 = self.rng.random::<f64>();
        // Inverse transform: -mean × ln(1 - u) is exponential with that mean.
        let extra = -model.mean_extra_ms * (1.0 - uniform).ln();
        let mut delay = model.base_delay_ms + extra.round() as u64;
        if model.tail_probability > 0.0 && self.rng.random::<f64>() < model.tail_probability {
            delay += self.rng.random_range(0..=model.tail_ms);
        }
        delay
    }
}

/// A foca duration on the millisecond clock, rounded up (a timer never
/// fires early).
fn millis(duration: Duration) -> u64 {
    let ms = duration.as_millis();
    let whole = u64::try_from(ms).unwrap_or(u64::MAX);
    if Duration::from_millis(whole) < duration {
        whole + 1
    } else {
        whole
    }
}
