//! One way to drive foca, shared by the live member (UDP and actix
//! timers), the simulator and the tracker's tests (memory and virtual
//! time), as one transport seam serves a gossip library over UDP and in
//! memory alike.
//!
//! foca asks for what it needs through an [`AccumulatingRuntime`]: datagrams
//! to send, timers to set, notifications. [`drain`] hands each to a
//! [`Host`] in foca's order and gives back the renames, and [`track`]
//! turns what foca applied since into the tracker's facts. Once every
//! [`REPAIR_EVERY`] of the member's own clock, [`Repair`] does what foca
//! leaves undone: a suspicion learnt by gossip timed out here too, and
//! (for the member that feeds a gate) foca's whole view checked against
//! what the tracker told.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use foca::{AccumulatingRuntime, Member, OwnedNotification, State, Timer};

use super::identity::SwimIdentity;
use super::tracker::{MembershipTracker, SwimFact};
use super::watch::{Changes, WatchingCodec};

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
    /// What else foca says (renames are [`drain`]'s answer instead).
    fn notified(&mut self, notification: OwnedNotification<SwimIdentity>) {
        let _ = notification;
    }
}

/// An identity foca replaced by another at the same address: (old, new).
pub type Replaced = (SwimIdentity, SwimIdentity);

/// Hands what foca asked for to `host`: the datagrams, then the timers,
/// then the notifications; returns the renames among them. `view` is the
/// foca that asked: "you are down" goes only to a member it holds down
/// ([`told_down`]).
pub fn drain(
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
pub fn told_down(
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
/// (foca does not say it otherwise; see [`join_again`]).
///
/// When foca turns to indirect probes (`Timer::SendIndirectProbe`), a
/// probe still unanswered ([`Probes::unanswered`]) may be vouched for by
/// other evidence of the member's life: its agent connection's signed
/// heartbeats, which the orchestrator holds (design §15). [`vouched`] then
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
pub fn vouched(
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
pub fn join_again(
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
/// - **The whole view, checked** ([`whole_view`]): the tracker follows
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
pub fn whole_view<'m>(
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
mod tests {
    use super::*;
    use crate::live::swim::member::SwimFoca;
    use crate::live::swim::watch::WatchingCodec;
    use crate::live::swim::SwimTimings;
    use poolgate_actors::core::SwimState;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn identity(node: &str, port: u16) -> SwimIdentity {
        SwimIdentity::local(node, port)
    }

    /// The orchestrator's foca, alone.
    fn orchestrators_foca() -> SwimFoca {
        let (codec, _changes) = WatchingCodec::watched();
        foca::Foca::new(
            identity("orchestrator", 1),
            SwimTimings::default().foca_config(4),
            StdRng::seed_from_u64(1),
            codec,
        )
    }

    /// The orchestrator's foca probing node-4 (which never answers), and
    /// the two timers that probe asked for, with their delays: its
    /// `SendIndirectProbe` and the next `ProbeRandomMember`.
    #[allow(clippy::type_complexity)]
    fn probing() -> (
        SwimFoca,
        AccumulatingRuntime<SwimIdentity>,
        (Duration, Timer<SwimIdentity>),
        (Duration, Timer<SwimIdentity>),
    ) {
        let mut foca = orchestrators_foca();
        let mut runtime = AccumulatingRuntime::new();
        foca.apply_many(
            std::iter::once(Member::alive(identity("node-4", 2))),
            true,
            &mut runtime,
        )
        .unwrap();
        let asked = |runtime: &mut AccumulatingRuntime<SwimIdentity>| {
            let mut asked: Vec<_> = std::iter::from_fn(|| runtime.to_schedule()).collect();
            asked.sort_by_key(|(after, _)| *after);
            asked
        };
        let start = asked(&mut runtime)
            .into_iter()
            .find(|(_, t)| matches!(t, Timer::ProbeRandomMember(_)))
            .expect("probing starts");
        foca.handle_timer(start.1, &mut runtime).unwrap();
        let mut asked = asked(&mut runtime).into_iter();
        let (indirect, next) = (asked.next().unwrap(), asked.next().unwrap());
        assert!(matches!(indirect.1, Timer::SendIndirectProbe { .. }));
        assert!(matches!(next.1, Timer::ProbeRandomMember(_)));
        (foca, runtime, indirect, next)
    }

    #[test]
    fn timers_that_came_late_and_out_of_order_reach_foca_in_the_order_they_were_due() {
        // A stall: the probe's `SendIndirectProbe` (due a round trip after
        // the ping) and the next `ProbeRandomMember` (due a probe period
        // after the last) both expired while the member was stopped, and
        // the runtime fired them the other way round.
        let late = Duration::from_millis(250);
        let stalled = std::time::Instant::now();
        let woke = stalled + Duration::from_secs(5);
        // As they fired: foca finds its probe cycle cut short, and the
        // probe of a member that never answered comes to nothing.
        let (mut foca, mut runtime, _, next) = probing();
        assert_eq!(
            foca.handle_timer(next.1, &mut runtime),
            Err(foca::Error::IncompleteProbeCycle)
        );
        let node4 = |foca: &SwimFoca| {
            foca.iter_membership_state()
                .find(|m| m.id().node == "node-4")
                .map(|m| m.state())
        };
        assert_eq!(node4(&foca), Some(State::Alive));
        // Held, and released in the order they were due.
        let (mut foca, mut runtime, indirect, next) = probing();
        let mut held = LateTimers::default();
        assert!(matches!(
            held.offer(next.1.clone(), stalled + next.0, woke, late),
            Offered::Held { first: true }
        ));
        assert!(matches!(
            held.offer(indirect.1.clone(), stalled + indirect.0, woke, late),
            Offered::Held { first: false }
        ));
        // One on time behind them waits its turn too.
        let on_time = Timer::RemoveDown(identity("node-9", 9));
        assert!(matches!(
            held.offer(on_time.clone(), woke, woke, late),
            Offered::Held { first: false }
        ));
        let released = held.release();
        assert_eq!(released, vec![indirect.1, next.1.clone(), on_time]);
        for timer in released.into_iter().take(2) {
            assert_eq!(foca.handle_timer(timer, &mut runtime), Ok(()));
        }
        // The probe ran its course: node-4, silent, is suspected.
        assert_eq!(node4(&foca), Some(State::Suspect));
        // Nothing held now: a timer on time runs at once.
        assert!(matches!(
            held.offer(next.1, woke, woke, late),
            Offered::Run(_)
        ));
    }

    #[test]
    fn a_suspicion_learnt_by_gossip_is_timed_out_here_and_the_member_declared_down() {
        // A member that hears of B only as suspect (gossip, no probe of its
        // own failed) arms no timer in foca: B would stay suspect for good.
        let mut foca = orchestrators_foca();
        let mut runtime = AccumulatingRuntime::new();
        let b = identity("node-4", 2);
        let heard = [
            Member::new(b.clone(), 3, State::Alive),
            Member::new(b.clone(), 3, State::Suspect),
        ];
        foca.apply_many(heard.into_iter(), true, &mut runtime)
            .unwrap();
        let limit = Duration::from_secs(3);
        let mut repair = Repair::new(limit);
        let start = Duration::from_secs(100);
        assert!(
            repair
                .expired(foca.iter_membership_state(), start)
                .is_empty(),
            "not yet"
        );
        let later = start + limit - Duration::from_millis(1);
        assert!(repair
            .expired(foca.iter_membership_state(), later)
            .is_empty());
        let expired = repair.expired(foca.iter_membership_state(), start + limit);
        assert_eq!(expired.len(), 1);
        foca.apply_many(expired.into_iter(), true, &mut runtime)
            .unwrap();
        let state = foca
            .iter_membership_state()
            .find(|m| m.id() == &b)
            .map(|m| m.state());
        assert_eq!(state, Some(State::Down));
    }

    /// One probe of `x` by a member that holds only `x`, its ping lost:
    /// `vouch` says whether `x`'s life is vouched for when foca turns to
    /// indirect probes. Returns `x`'s state once the next probe began.
    fn one_lost_probe(vouch: bool) -> State {
        let mut foca = orchestrators_foca();
        let mut runtime = AccumulatingRuntime::new();
        let x = identity("node-4", 2);
        foca.apply_many(
            [Member::new(x.clone(), 0, State::Alive)].into_iter(),
            true,
            &mut runtime,
        )
        .unwrap();
        let mut probes = Probes::default();
        let mut timers = Vec::new();
        let mut take = |runtime: &mut AccumulatingRuntime<SwimIdentity>, probes: &mut Probes| {
            // Every datagram is lost; the pings are noted as sent.
            while let Some((_, data)) = runtime.to_send() {
                let header =
                    foca::Codec::decode_header(&mut foca::PostcardCodec, &data[..]).unwrap();
                probes.sent(&header);
            }
            while let Some((_, timer)) = runtime.to_schedule() {
                timers.push(timer);
            }
            while runtime.to_notify().is_some() {}
            std::mem::take(&mut timers)
        };
        let first = |timers: &[Timer<SwimIdentity>], probe: bool| {
            timers
                .iter()
                .find(|t| {
                    matches!(t, Timer::ProbeRandomMember(_)) == probe
                        && matches!(
                            t,
                            Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. }
                        )
                })
                .cloned()
                .unwrap()
        };
        let scheduled = take(&mut runtime, &mut probes);
        foca.handle_timer(first(&scheduled, true), &mut runtime)
            .unwrap();
        let scheduled = take(&mut runtime, &mut probes);
        let indirect = first(&scheduled, false);
        let next_probe = first(&scheduled, true);
        let (probed, number) = probes
            .unanswered(&indirect)
            .expect("the ping went unanswered");
        assert_eq!(probed, x);
        if vouch {
            vouched(&mut foca, &probed, number, &mut runtime).unwrap();
            assert!(
                probes.unanswered(&indirect).is_some(),
                "the note is of datagrams only"
            );
        }
        foca.handle_timer(indirect, &mut runtime).unwrap();
        take(&mut runtime, &mut probes);
        foca.handle_timer(next_probe, &mut runtime).unwrap();
        let state = foca
            .iter_membership_state()
            .find(|m| m.id() == &x)
            .map(|m| m.state())
            .unwrap();
        state
    }

    #[test]
    fn a_lost_probe_of_a_member_vouched_for_raises_no_suspicion() {
        assert_eq!(one_lost_probe(false), State::Suspect, "unanswered: suspect");
        assert_eq!(one_lost_probe(true), State::Alive, "vouched for: alive");
    }

    #[test]
    fn only_the_probe_under_way_unanswered_is_offered_for_vouching() {
        let (x, y) = (identity("node-4", 2), identity("node-5", 3));
        let header = |src: &SwimIdentity, dst: &SwimIdentity, message| foca::Header {
            src: src.clone(),
            src_incarnation: 0,
            dst: dst.clone(),
            message,
        };
        let own = identity("orchestrator", 1);
        let indirect = |probed: &SwimIdentity| Timer::SendIndirectProbe {
            probed_id: probed.clone(),
            token: 0,
        };
        let mut probes = Probes::default();
        assert_eq!(probes.unanswered(&indirect(&x)), None, "nothing pinged");
        probes.sent(&header(&own, &x, foca::Message::Ping(7)));
        assert_eq!(probes.unanswered(&indirect(&x)), Some((x.clone(), 7)));
        assert_eq!(probes.unanswered(&indirect(&y)), None, "another member");
        assert!(probes.is_current(&x, 7) && !probes.is_current(&x, 6));
        assert!(probes.awaits_ack());
        // An ack of another probe, or from another member, answers nothing.
        probes.received(&header(&x, &own, foca::Message::Ack(6)));
        probes.received(&header(&y, &own, foca::Message::Ack(7)));
        assert!(probes.unanswered(&indirect(&x)).is_some());
        probes.received(&header(&x, &own, foca::Message::Ack(7)));
        assert_eq!(probes.unanswered(&indirect(&x)), None, "answered");
        assert!(!probes.awaits_ack());
        // The next ping starts over.
        probes.sent(&header(&own, &y, foca::Message::Ping(8)));
        assert_eq!(probes.unanswered(&indirect(&y)), Some((y, 8)));
    }

    /// node-1 back from an absence joins the leader's member again; a
    /// suspicion of it raised meanwhile by a third member, whose word
    /// reached neither, then lands as that member's verdict (foca's
    /// `Down` at the incarnation it suspected). Returns the leader's last
    /// fact about node-1 before the verdict and the verdict, as its
    /// tracker tells them to the gate. `again`: node-1 joins as
    /// [`join_again`] has it; otherwise it only announces, as it did.
    fn a_late_verdict(again: bool) -> [(SwimState, u64); 2] {
        let node = identity("node-1", 5);
        let (codec, changes) = WatchingCodec::watched();
        let mut leader = foca::Foca::new(
            identity("orchestrator", 1),
            SwimTimings::default().foca_config(4),
            StdRng::seed_from_u64(1),
            codec,
        );
        let (codec, _) = WatchingCodec::watched();
        let mut back = foca::Foca::new(
            node.clone(),
            SwimTimings::default().foca_config(4),
            StdRng::seed_from_u64(2),
            codec,
        );
        let (mut at_leader, mut at_node) = (AccumulatingRuntime::new(), AccumulatingRuntime::new());
        let mut probes = Probes::default();
        leader
            .apply_many(
                [Member::new(node.clone(), 0, State::Alive)].into_iter(),
                true,
                &mut at_leader,
            )
            .unwrap();
        let seed = SwimIdentity::seed(leader.identity().addr);
        if again {
            join_again(&mut back, probes.incarnation(), [seed], &mut at_node).unwrap();
        } else {
            back.announce(seed, &mut at_node).unwrap();
        }
        while let Some((to, data)) = at_node.to_send() {
            probes.sent(&header(&data).unwrap());
            if to.addr == leader.identity().addr {
                leader.handle_data(&data, &mut at_leader).unwrap();
            }
        }
        let mut tracker = MembershipTracker::default();
        let before = track(&mut tracker, &changes, leader.identity(), Vec::new());
        let verdict = Member::new(node.clone(), 0, State::Down);
        leader
            .apply_many([verdict].into_iter(), true, &mut at_leader)
            .unwrap();
        let after = track(&mut tracker, &changes, leader.identity(), Vec::new());
        let last = |facts: Vec<SwimFact>| {
            let fact = facts
                .into_iter()
                .rfind(|f| f.update.node.as_str() == "node-1")
                .unwrap();
            (fact.update.state, fact.update.incarnation)
        };
        [last(before), last(after)]
    }

    #[test]
    fn a_member_joining_again_outranks_a_suspicion_raised_while_it_was_away() {
        use poolgate_actors::core::Membership;
        let admitted = |[(state, incarnation), (verdict, at)]: [(SwimState, u64); 2]| {
            Membership::Seen { state, incarnation }.admits(verdict, at)
        };
        // As it was: the gate holds node-1 alive at the incarnation the
        // verdict names, and takes the verdict for a death.
        let announced = a_late_verdict(false);
        assert_eq!(announced[1].0, SwimState::Dead);
        assert!(admitted(announced), "{announced:?}");
        // Joined again: alive at a higher incarnation, the verdict stale.
        let joined = a_late_verdict(true);
        assert_eq!(joined[0].0, SwimState::Alive);
        assert!(joined[0].1 > announced[0].1, "{joined:?}");
        assert!(!admitted(joined), "{joined:?}");
    }

    /// A ping from `src` at `incarnation` to `dst`, as a datagram.
    fn ping(src: SwimIdentity, incarnation: foca::Incarnation, dst: &SwimIdentity) -> Vec<u8> {
        let header = foca::Header {
            src,
            src_incarnation: incarnation,
            dst: dst.clone(),
            message: foca::Message::Ping(3),
        };
        let mut datagram = Vec::new();
        foca::Codec::encode_header(&mut foca::PostcardCodec, &header, &mut datagram).unwrap();
        datagram
    }

    /// What `foca` asks to send, by message, and what [`drain`] sends of
    /// it.
    fn asked_and_sent(
        foca: &SwimFoca,
        runtime: &mut AccumulatingRuntime<SwimIdentity>,
    ) -> (
        Vec<foca::Message<SwimIdentity>>,
        Vec<foca::Message<SwimIdentity>>,
    ) {
        struct Sent(Vec<foca::Message<SwimIdentity>>);
        impl Host for Sent {
            fn send(
                &mut self,
                _: SwimIdentity,
                _: bytes::Bytes,
                header: Option<&foca::Header<SwimIdentity>>,
            ) {
                self.0.extend(header.map(|h| h.message.clone()));
            }
            fn schedule(&mut self, _: Duration, _: Timer<SwimIdentity>) {}
        }
        let mut copy = AccumulatingRuntime::new();
        let mut asked = Vec::new();
        while let Some((to, data)) = runtime.to_send() {
            asked.extend(header(&data).map(|h| h.message));
            foca::Runtime::send_to(&mut copy, to, &data);
        }
        let mut sent = Sent(Vec::new());
        drain(&mut copy, &mut sent, foca);
        (asked, sent.0)
    }

    #[test]
    fn only_a_member_held_down_is_told_it_is_down() {
        let mut foca = orchestrators_foca();
        let mut runtime = AccumulatingRuntime::new();
        let x = identity("node-1", 2);
        let state = |incarnation, state| [Member::new(x.clone(), incarnation, state)].into_iter();
        foca.apply_many(state(0, State::Suspect), true, &mut runtime)
            .unwrap();
        // Refuted; then the suspicion at 0 times out.
        foca.apply_many(state(1, State::Alive), true, &mut runtime)
            .unwrap();
        asked_and_sent(&foca, &mut runtime);
        let timer = Timer::ChangeSuspectToDown {
            member_id: x.clone(),
            incarnation: 0,
            token: foca::TimerToken::default(),
        };
        foca.handle_timer(timer, &mut runtime).unwrap();
        let (asked, sent) = asked_and_sent(&foca, &mut runtime);
        assert!(
            asked.contains(&foca::Message::TurnUndead),
            "foca asks to tell the member it is down: {asked:?}"
        );
        assert!(!sent.contains(&foca::Message::TurnUndead), "{sent:?}");
        let held = foca.iter_membership_state().find(|m| m.id() == &x);
        assert_eq!(held.map(Member::state), Some(State::Alive));
        // Held down, and still speaking: told.
        foca.apply_many(state(1, State::Down), true, &mut runtime)
            .unwrap();
        asked_and_sent(&foca, &mut runtime);
        let datagram = ping(x.clone(), 1, foca.identity());
        foca.handle_data(&datagram, &mut runtime).unwrap();
        let (_, sent) = asked_and_sent(&foca, &mut runtime);
        assert!(sent.contains(&foca::Message::TurnUndead), "{sent:?}");
    }

    /// At the leader, a node's renewed identity loses the address
    /// conflict to the one the node signed until its next frame signs
    /// the new one: foca answers it "you are down", and each answer made
    /// it renew again. It is not told.
    #[test]
    fn a_renewed_identity_not_signed_yet_is_not_told_it_is_down() {
        use crate::live::swim::identity::{with_signed, SignedView};
        let mut foca = orchestrators_foca();
        let mut runtime = AccumulatingRuntime::new();
        let signed = identity("node-1", 2);
        let renewed = SwimIdentity {
            generation: 2,
            ..signed.clone()
        };
        let view: SignedView = Default::default();
        view.write()
            .unwrap()
            .insert(signed.addr, ("node-1".into(), signed.generation));
        foca.apply_many(
            [Member::new(signed.clone(), 0, State::Alive)].into_iter(),
            true,
            &mut runtime,
        )
        .unwrap();
        asked_and_sent(&foca, &mut runtime);
        let datagram = ping(renewed, 0, foca.identity());
        with_signed(Some(&view), || foca.handle_data(&datagram, &mut runtime)).unwrap();
        let (asked, sent) = asked_and_sent(&foca, &mut runtime);
        assert!(asked.contains(&foca::Message::TurnUndead), "{asked:?}");
        assert!(!sent.contains(&foca::Message::TurnUndead), "{sent:?}");
        let held = foca
            .iter_membership_state()
            .find(|m| m.id().addr == signed.addr);
        assert_eq!(
            held.map(|m| (m.id().clone(), m.state())),
            Some((signed, State::Alive))
        );
    }

    #[test]
    fn a_refuted_suspicion_starts_over() {
        let b = identity("node-4", 2);
        let limit = Duration::from_secs(3);
        let mut repair = Repair::new(limit);
        let start = Duration::ZERO;
        let suspect = |incarnation| vec![Member::new(b.clone(), incarnation, State::Suspect)];
        repair.expired(suspect(3).iter(), start);
        // Refuted, then suspected again at the new incarnation: its own clock.
        let soon = start + Duration::from_secs(2);
        repair.expired(suspect(4).iter(), soon);
        assert!(repair.expired(suspect(4).iter(), start + limit).is_empty());
        assert_eq!(repair.expired(suspect(4).iter(), soon + limit).len(), 1);
        // Alive again: nothing held.
        let alive = [Member::new(b.clone(), 5, State::Alive)];
        assert!(repair.expired(alive.iter(), soon + limit * 2).is_empty());
        assert_eq!(repair.held(), 0);
    }

    #[test]
    fn the_whole_view_gives_each_name_and_address_once_at_its_newest_generation() {
        let own = identity("orchestrator", 1);
        let old = identity("node-4", 2);
        let new = SwimIdentity {
            generation: 2,
            ..old.clone()
        };
        let members = [
            Member::new(own.clone(), 0, State::Alive),
            Member::new(old.clone(), 7, State::Down),
            Member::new(new.clone(), 0, State::Alive),
        ];
        let mut tracker = MembershipTracker::default();
        let facts = whole_view(&mut tracker, members.iter(), &own);
        assert_eq!(facts.len(), 1, "{facts:?}");
        assert_eq!(facts[0].update.node.as_str(), "node-4");
        assert_eq!(
            facts[0].update.state,
            poolgate_actors::core::SwimState::Alive
        );
    }
}
