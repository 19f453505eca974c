//! One way to drive foca, shared by the live member (UDP and actix
//! timers), the simulator and the tracker's tests (memory and virtual
//! time), as one transport seam serves a gossip library over UDP and in
//! memory alike.
//!
//! A [`Driver`] is one member as a value: its foca, the probe under way
//! ([`Probes`]) and the repair ([`Repair`]). Each input is one call (a
//! datagram, a timer, the repair's tick, an answer about a probe); what
//! foca asked for meanwhile ([`AccumulatingRuntime`]: datagrams to send,
//! timers to set, notifications) goes to a [`Host`] in foca's order on
//! [`Driver::drain`], which gives back the renames, and [`track`] turns
//! what foca applied since into the tracker's facts. The hosts do only
//! their I/O: the live member (`member/`) seals and sends over UDP and
//! sets actix timers; the simulator queues datagrams and timers on its
//! virtual clock. Once every [`REPAIR_EVERY`] of the member's own clock,
//! the repair does what foca leaves undone: a suspicion learnt by gossip
//! timed out here too, and (for the member that feeds a gate) foca's whole
//! view checked against what the tracker told.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use foca::{AccumulatingRuntime, Member, OwnedNotification, State, Timer};

use super::identity::SwimIdentity;
use super::tracker::{MembershipTracker, SwimFact};
use super::watch::{Changes, WatchingCodec};

mod driver;
pub use driver::{Driven, Driver, Refused};

/// A foca instance as poolgate runs it: postcard on the wire, the codec
/// noting the membership changes.
pub type SwimFoca =
    foca::Foca<SwimIdentity, WatchingCodec, rand::rngs::StdRng, foca::NoCustomBroadcast>;

/// Where a foca instance's requests go.
pub trait Host {
    /// A datagram foca wants sent, and its header (read once here).
    fn send(
        &mut self,
        to: SwimIdentity,
        data: bytes::Bytes,
        header: Option<&foca::Header<SwimIdentity>>,
    );
    /// A timer foca wants back after `after`.
    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>);
    /// What else foca says (renames are [`Driver::drain`]'s answer instead).
    fn notified(&mut self, notification: OwnedNotification<SwimIdentity>) {
        let _ = notification;
    }
}

/// An identity foca replaced by another at the same address: (old, new).
pub type Replaced = (SwimIdentity, SwimIdentity);

/// Hands what foca asked for to `host`: the datagrams, then the timers,
/// then the notifications; returns the renames among them. `view` is the
/// foca that asked: "you are down" goes only to a member it holds down
/// (`told_down`).
fn drain(
    runtime: &mut AccumulatingRuntime<SwimIdentity>,
    host: &mut impl Host,
    view: &SwimFoca,
) -> Vec<Replaced> {
    while let Some((to, data)) = runtime.to_send() {
        let header = header(&data);
        if !told_down(view, &to, header.as_ref()) {
            host.send(to, data, header.as_ref());
        }
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

/// Whether a datagram (its `header`), bound for `to`, tells it "you are
/// down" (foca's `TurnUndead`) though `view` does not hold it down: such
/// a datagram is not sent (counted). foca 2.0 sends it when its suspicion of a member
/// times out even if the member refuted the suspicion meanwhile (the
/// courtesy does not look at whether the down was applied), and to a
/// sender that lost an address conflict here (at the leader: a node's
/// renewed identity before the node signed it). Told, the member renews
/// its identity, needlessly; at the leader each renewal lost the conflict
/// again and was told again, a storm (an operator's trial: 4 to 91
/// renewals within 55 ms after a node's stall, 6 times in 40, and twice
/// a `dead` that would fault a run, when the signature caught up with a
/// renewal while the identity before it was gossiped down). A member
/// really held down here is still told, and renews to come back.
fn told_down(
    view: &SwimFoca,
    to: &SwimIdentity,
    header: Option<&foca::Header<SwimIdentity>>,
) -> bool {
    if header.is_none_or(|h| h.message != foca::Message::TurnUndead) {
        return false;
    }
    let held_down = view
        .iter_membership_state()
        .any(|m| m.id() == to && m.state() == State::Down);
    if !held_down {
        metrics::counter!("poolgate_swim_down_notices_withheld_total").increment(1);
    }
    !held_down
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

/// What a member's own datagrams show: the probe it has under way (the
/// member its latest ping went to, foca's number for that probe, and
/// whether the member's ack came back), and the incarnation it speaks at
/// (foca does not say it otherwise; see [`Driver::join_again`]).
///
/// When foca turns to indirect probes (`Timer::SendIndirectProbe`), a
/// probe still unanswered ([`Probes::unanswered`]) may be vouched for by
/// other evidence of the member's life: its agent connection's signed
/// heartbeats, which the orchestrator holds (design §15). [`Driver::vouched`] then
/// hands foca the ack the member would have sent, and foca counts the
/// probe answered: no suspicion is raised of a member that proves it
/// lives over TCP while UDP loses its probes, as memberlist falls back on
/// a TCP probe. A member that is gone has no fresh heartbeats: it is
/// never vouched for, and found as before.
#[derive(Debug, Default)]
pub struct Probes {
    pinged: Option<(SwimIdentity, foca::ProbeNumber)>,
    acked: bool,
    incarnation: foca::Incarnation,
}

impl Probes {
    /// Notes a datagram this member sends (its header).
    pub fn sent(&mut self, header: &foca::Header<SwimIdentity>) {
        self.incarnation = header.src_incarnation;
        if let foca::Message::Ping(number) = header.message {
            self.pinged = Some((header.dst.clone(), number));
            self.acked = false;
        }
    }

    /// Notes a datagram this member received (its header).
    pub fn received(&mut self, header: &foca::Header<SwimIdentity>) {
        if let (foca::Message::Ack(number), Some((probed, pinged))) =
            (&header.message, &self.pinged)
        {
            if header.src == *probed && number == pinged {
                self.acked = true;
            }
        }
    }

    /// The incarnation of this member's latest datagram.
    pub fn incarnation(&self) -> foca::Incarnation {
        self.incarnation
    }

    /// Whether an ack is awaited (a datagram received can answer the
    /// probe under way): only then is its header worth reading.
    pub fn awaits_ack(&self) -> bool {
        self.pinged.is_some() && !self.acked
    }

    /// The probe `timer` turns to indirect probes for, if its ping went
    /// unanswered.
    pub fn unanswered(
        &self,
        timer: &Timer<SwimIdentity>,
    ) -> Option<(SwimIdentity, foca::ProbeNumber)> {
        match (timer, &self.pinged) {
            (Timer::SendIndirectProbe { probed_id, .. }, Some((probed, number)))
                if probed_id == probed && !self.acked =>
            {
                Some((probed.clone(), *number))
            }
            _ => None,
        }
    }

    /// Whether the probe under way is of `probed`, numbered `number` (an
    /// answer that comes back late is for this probe only).
    pub fn is_current(&self, probed: &SwimIdentity, number: foca::ProbeNumber) -> bool {
        self.pinged
            .as_ref()
            .is_some_and(|(p, n)| p == probed && *n == number)
    }
}

/// The header of an encoded foca datagram, if it has one.
pub fn header(data: &[u8]) -> Option<foca::Header<SwimIdentity>> {
    foca::Codec::<SwimIdentity>::decode_header(&mut foca::PostcardCodec, data).ok()
}

/// Hands `foca` the ack `probed` would have sent to probe `number` (its
/// life vouched for by other evidence: see [`Probes`]), as the datagram it
/// would have been, from `probed` at the incarnation `foca` holds for it.
/// Nothing when `foca` does not hold `probed` as an active member.
fn vouched(
    foca: &mut SwimFoca,
    probed: &SwimIdentity,
    number: foca::ProbeNumber,
    runtime: &mut AccumulatingRuntime<SwimIdentity>,
) -> Result<(), foca::Error> {
    use foca::Codec;
    let Some(incarnation) = foca
        .iter_members()
        .find(|m| m.id() == probed)
        .map(Member::incarnation)
    else {
        return Ok(());
    };
    let header = foca::Header {
        src: probed.clone(),
        src_incarnation: incarnation,
        dst: foca.identity().clone(),
        message: foca::Message::Ack(number),
    };
    let mut datagram = bytes::BytesMut::new();
    foca::PostcardCodec
        .encode_header(&header, &mut datagram)
        .map_err(|e| foca::Error::Encode(Box::new(e)))?;
    foca.handle_data(&datagram, runtime)
}

/// Announces `foca` to `seeds` as a member back from an absence (its
/// process stalled, its host cut off, its orchestrator lost), after
/// refuting at once whatever suspicion of it was raised meanwhile:
/// foca takes a suspicion of itself at `incarnation`, the one it speaks
/// at ([`Probes::incarnation`]), as news, raises its incarnation and
/// gossips, and the announces carry the new one.
///
/// A suspicion raised while the member was away by a member whose word
/// reached nobody else is otherwise refuted by nobody: it ends, a
/// suspicion timeout later, in foca's `Down`, which overrides `alive` at
/// any incarnation, and the orchestrator's gate, which holds the member
/// alive at the same incarnation, takes it for a death. Refuted first,
/// the member is held at a higher incarnation by every member it speaks
/// to (the seeds at once), and that late verdict is stale there (design
/// §15; `tests/live/main.rs` has an insider say such a verdict after a
/// node's stop: without this, the run committed since faulted `dead`).
fn join_again(
    foca: &mut SwimFoca,
    incarnation: foca::Incarnation,
    seeds: impl IntoIterator<Item = SwimIdentity>,
    runtime: &mut AccumulatingRuntime<SwimIdentity>,
) -> Result<(), foca::Error> {
    let own = foca.identity().clone();
    foca.apply_many(
        std::iter::once(Member::new(own, incarnation, State::Suspect)),
        true,
        &mut *runtime,
    )?;
    for seed in seeds {
        foca.announce(seed, &mut *runtime)?;
    }
    Ok(())
}

/// The timers foca asked for that came late, held and handed back in the
/// order they were due. A member stalled (stopped, starved of CPU, its
/// host paused) finds every timer that fell due meanwhile expired at once,
/// and the runtime fires expired timers in no set order: foca's probe
/// cycle, handed its next `ProbeRandomMember` before the current probe's
/// `SendIndirectProbe`, skips that probe's indirect round and reports
/// `IncompleteProbeCycle` ("BUG! Probe cycle finished without running its
/// full course", seen after node stalls in an operator's trial). A late
/// timer is held (the member reads what came in meanwhile first, for its
/// catch-up), and so is every timer after it until the held ones are
/// released, together, by due time.
#[derive(Debug, Default)]
pub struct LateTimers {
    held: Vec<(std::time::Instant, u64, Timer<SwimIdentity>)>,
    offered: u64,
}

/// What [`LateTimers::offer`] made of a timer.
#[derive(Debug)]
pub enum Offered {
    /// On time, and none held: hand it to foca now.
    Run(Timer<SwimIdentity>),
    /// Held until [`LateTimers::release`]; `first`: none was held before
    /// it, so the release is to be scheduled now.
    Held {
        /// The first held since the last release.
        first: bool,
    },
}

impl LateTimers {
    /// `timer`, due at `due`, fires at `now`; `late`: how late a timer
    /// may fire before it is held.
    pub fn offer(
        &mut self,
        timer: Timer<SwimIdentity>,
        due: std::time::Instant,
        now: std::time::Instant,
        late: Duration,
    ) -> Offered {
        if self.held.is_empty() && now.saturating_duration_since(due) <= late {
            return Offered::Run(timer);
        }
        let first = self.held.is_empty();
        self.offered += 1;
        self.held.push((due, self.offered, timer));
        Offered::Held { first }
    }

    /// The timers held, in the order they were due (those due at one
    /// instant in the order they came).
    pub fn release(&mut self) -> Vec<Timer<SwimIdentity>> {
        let mut held = std::mem::take(&mut self.held);
        held.sort_by_key(|(due, offered, _)| (*due, *offered));
        held.into_iter().map(|(_, _, timer)| timer).collect()
    }
}

/// How often a member repairs what foca leaves undone ([`Repair`]). The
/// whole-view walk costs about 5 µs at 100 members and 1 ms at 4,096.
pub const REPAIR_EVERY: Duration = Duration::from_secs(1);

/// What every member does once every [`REPAIR_EVERY`] on top of foca, the
/// same in the live member (on the wall clock) and the simulator (on its
/// virtual one).
///
/// - **Suspicions time out at every member.** foca times a suspicion out
///   only at the member that raised it; one that learnt it by gossip and
///   missed the refutation (it joined after the refutation was gossiped)
///   held it for good: on the rig, a fresh orchestrator kept a node of a
///   healed host suspect, never ready again. SWIM's rule is that every
///   member times a suspicion out; down, the member is told so when it
///   next speaks and rejoins under a renewed identity.
/// - **The whole view, checked** ([`Driver::whole_view`]): the tracker follows
///   what foca encodes as it applies it; a state foca applied without
///   encoding it in that call (seen on the rig: a member first heard of
///   as suspect, then refuted, after a host was cut off and healed) would
///   otherwise stay untold, leaving the node blocked for good.
#[derive(Debug)]
pub struct Repair {
    /// How long a suspicion may stand before this member declares the
    /// suspect down itself (SWIM's suspicion timeout plus a probe period).
    limit: Duration,
    /// Members held suspect: at which incarnation, since when (on the
    /// caller's clock).
    suspected: HashMap<SwimIdentity, (u16, Duration)>,
}

impl Repair {
    /// Suspicions stand at most `limit` here.
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            suspected: HashMap::new(),
        }
    }

    /// The limit for foca's `config`: its suspicion timeout plus a probe
    /// period (foca's own timer, at the member that raised the suspicion,
    /// fires first).
    pub fn for_config(config: &foca::Config) -> Self {
        Self::new(
            config
                .suspect_to_down_after
                .saturating_add(config.probe_period),
        )
    }

    /// Follows the suspicions among `members` (foca's whole membership)
    /// and returns, as `Down` updates to apply (`apply_many(…, true, …)`,
    /// so they are gossiped), those held at one incarnation for the limit
    /// or longer. `now` is the caller's clock: any origin, never going
    /// back.
    pub fn expired<'m>(
        &mut self,
        members: impl Iterator<Item = &'m Member<SwimIdentity>>,
        now: Duration,
    ) -> Vec<Member<SwimIdentity>> {
        let mut still = HashMap::new();
        for member in members.filter(|m| m.state() == State::Suspect) {
            let since = match self.suspected.get(member.id()) {
                Some((incarnation, since)) if *incarnation == member.incarnation() => *since,
                _ => now,
            };
            still.insert(member.id().clone(), (member.incarnation(), since));
        }
        self.suspected = still;
        self.suspected
            .iter()
            .filter(|(_, (_, since))| now.saturating_sub(*since) >= self.limit)
            .map(|(id, (incarnation, _))| Member::new(id.clone(), *incarnation, State::Down))
            .collect()
    }

    /// How many suspicions are followed now.
    pub fn held(&self) -> usize {
        self.suspected.len()
    }
}

/// One fact per member of foca's whole membership `members`, `own` left
/// out, as the tracker gives them: the newest generation of each name and
/// address (an earlier life still listed as down must not speak over it).
/// The table the facts go to keeps those that differ from what it holds.
fn whole_view<'m>(
    tracker: &mut MembershipTracker,
    members: impl Iterator<Item = &'m Member<SwimIdentity>>,
    own: &SwimIdentity,
) -> Vec<SwimFact> {
    let mut newest: HashMap<(&str, SocketAddr), &Member<SwimIdentity>> = HashMap::new();
    for member in members.filter(|m| m.id() != own) {
        let id = member.id();
        let slot = newest.entry((id.node.as_str(), id.addr)).or_insert(member);
        if id.generation > slot.id().generation {
            *slot = member;
        }
    }
    let states: Vec<Member<SwimIdentity>> = newest.into_values().cloned().collect();
    tracker.changed(states, Vec::new())
}

#[cfg(test)]
mod tests;
