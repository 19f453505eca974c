//! What the member is told (actix messages) and how it answers each.

use super::*;

/// Announce this member to seeds known by address.
#[derive(Debug)]
pub struct Join {
    /// The seeds' socket addresses.
    pub seeds: Vec<SocketAddr>,
}

impl Message for Join {
    type Result = ();
}

/// Announce this member to seeds known by address: a node agent that
/// lost its orchestrator sends this. A member back from an absence (it
/// stalled: its timers ran late within the last second, or it was cut
/// off: it heard no datagram for a probe period) refutes first whatever
/// suspicion of it was raised meanwhile (see [`drive::Driver::join_again`]); one
/// whose SWIM went on (only its agent connection was cut, or its
/// orchestrator froze) was suspected of nothing, and only announces: a
/// refutation is a change of the node in the gate, which would come
/// before the orchestrator's own word that the node is unavailable.
#[derive(Debug)]
pub struct JoinAgain {
    /// The seeds' socket addresses.
    pub seeds: Vec<SocketAddr>,
}

impl Message for JoinAgain {
    type Result = ();
}

/// A datagram arrived.
#[derive(Debug)]
pub struct Datagram {
    /// Its bytes.
    pub data: Vec<u8>,
    /// Where it came from.
    pub from: SocketAddr,
}

impl Message for Datagram {
    type Result = ();
}

/// A timer foca asked for is due.
#[derive(Debug)]
pub struct FocaTimer {
    pub(super) timer: Timer<SwimIdentity>,
    /// When it was due.
    pub(super) due: std::time::Instant,
}

/// The timers held since one came late are released (see [`LATE`]).
#[derive(Debug)]
pub(super) struct ReleaseLate;

impl Message for ReleaseLate {
    type Result = ();
}

/// A timer handled this late means this member itself was stalled
/// (stopped, starved of CPU, its host paused): the datagrams that came
/// in meanwhile (the acks of its probes among them) are read first, for
/// [`CATCH_UP`], so that it judges nobody on time it lost itself (as
/// Lifeguard's local health awareness has it). The late timer, and every
/// one after it until then, is held and handed to foca in the order they
/// were due ([`drive::LateTimers`]).
pub const LATE: Duration = Duration::from_millis(250);

/// How long a late timer is put off.
pub const CATCH_UP: Duration = Duration::from_millis(100);

/// A stall found this long before a [`JoinAgain`] is the absence it
/// comes back from.
const STALL_RECENT: Duration = Duration::from_secs(1);

impl Message for FocaTimer {
    type Result = ();
}

/// Stop answering at once, as a crashed process would (the socket closes).
#[derive(Debug)]
pub struct Crash;

impl Message for Crash {
    type Result = ();
}

/// Replace the gossip keyring (key rotation: add a key everywhere, then
/// make it first everywhere, then remove the old one).
#[derive(Debug)]
pub struct SetKeyring {
    /// The new ring.
    pub keyring: Keyring,
}

impl Message for SetKeyring {
    type Result = ();
}

impl Handler<SetKeyring> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: SetKeyring, _ctx: &mut Context<Self>) {
        *self
            .keyring
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = msg.keyring;
    }
}

/// Tell `0` this member's generation now and whenever foca renews its
/// identity (a node signs it in its frames, design §11).
#[derive(Debug)]
pub struct WatchGeneration(pub tokio::sync::watch::Sender<u64>);

impl Message for WatchGeneration {
    type Result = ();
}

impl Handler<WatchGeneration> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: WatchGeneration, _ctx: &mut Context<Self>) {
        msg.0.send_replace(self.driver.identity().generation);
        self.own_generation = Some(msg.0);
    }
}

/// Take `generation` as this member's own (a node agent taking its node
/// back from a process that signed ahead of it, design §8): foca declares
/// the identity before it down and gossips the new one, and the watcher
/// of [`WatchGeneration`] is told, so the node's frames sign it.
#[derive(Debug)]
pub struct Renew {
    /// The new generation, above every earlier one of the node's.
    pub generation: u64,
}

impl Message for Renew {
    type Result = ();
}

impl Handler<Renew> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Renew, ctx: &mut Context<Self>) {
        let result = self.driver.renew(msg.generation);
        let changed = result.is_ok();
        self.report(result);
        if let (true, Some(own)) = (changed, &self.own_generation) {
            own.send_replace(msg.generation);
        }
        self.drain(ctx);
    }
}

/// Decide address conflicts by the identities nodes signed, for as long as
/// the member lives (see [`crate::live::swim::identity::Arbiter`]).
#[derive(Debug)]
pub struct UseSigned(pub crate::live::swim::identity::SignedView);

impl Message for UseSigned {
    type Result = ();
}

impl Handler<UseSigned> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: UseSigned, _ctx: &mut Context<Self>) {
        self.arbiter.by_signed(msg.0, None);
    }
}

/// Keep and report only members of these names (the orchestrator's
/// registry): a made-up member costs the tracker nothing.
#[derive(Debug)]
pub struct OnlyMembers(pub std::collections::HashSet<String>);

impl Message for OnlyMembers {
    type Result = ();
}

impl Handler<OnlyMembers> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: OnlyMembers, _ctx: &mut Context<Self>) {
        self.tracker.only(msg.0);
    }
}

/// Hands the member's reports to a gate's `sink` from now on, starting
/// with its whole current view, under `token`: a replica's member, kept
/// warm while it follows, feeds each term's gate from what it already
/// knows. The attachment brings what the gate wants of the member: only
/// the names of its registry kept, address conflicts decided by the
/// identities its nodes signed.
pub struct Attach {
    /// Names this attachment, for [`Detach`].
    pub token: u64,
    /// Where the reports go.
    pub sink: MembershipSink,
    /// The identities the gate's nodes signed.
    pub signed: crate::live::swim::identity::SignedView,
    /// Whether the term still lasts: the signed identities decide only
    /// then.
    pub term_lasts: TermLasts,
    /// The registry's names.
    pub only: std::collections::HashSet<String>,
    /// Who vouches for a member whose probe went unanswered while the
    /// term lasts (its nodes' agent connections).
    pub vouching: Vouching,
}

impl Message for Attach {
    type Result = ();
}

impl Handler<Attach> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Attach, _ctx: &mut Context<Self>) {
        self.arbiter.by_signed(msg.signed, Some(msg.term_lasts));
        self.tracker.only(msg.only);
        self.sink = Some(msg.sink);
        self.attached = Some(msg.token);
        self.vouching = msg.vouching;
        // The new term starts from the whole view, fresh: members in
        // doubt before it began are held back until alive again.
        let view = self.whole_view();
        let (before_term, told) = crate::live::swim::fresh::BeforeTerm::attach(view);
        self.before_term = before_term;
        let held = self.before_term.held();
        if held > 0 {
            metrics::counter!("poolgate_swim_held_before_term_total").increment(held as u64);
            tracing::info!(
                held,
                "a fresh view: members suspect or down before this term began are not told to it until they are alive again"
            );
        }
        self.emit(told);
    }
}

/// Stops reporting to the gate of attachment `0`; a later attachment's
/// gate is not touched (a term stopped late does not deafen the next).
#[derive(Debug)]
pub struct Detach(pub u64);

impl Message for Detach {
    type Result = ();
}

impl Handler<Detach> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Detach, _ctx: &mut Context<Self>) {
        if self.attached == Some(msg.0) {
            self.sink = None;
            self.attached = None;
            // The term's signed identities stop being kept when the term
            // ends: held on, they would decide address conflicts by a
            // node's last life (a node restarted under the next leader
            // would lose every conflict here, and renew, and lose again).
            // A follower decides them as every other member does.
            self.arbiter.by_generation();
            self.before_term = crate::live::swim::fresh::BeforeTerm::default();
            // Kept warm for a later term, it follows: it accuses nobody.
            self.vouching = Vouching::Everyone;
        }
    }
}

/// How many other members this member knows.
#[derive(Debug)]
pub struct MemberCount;

impl Message for MemberCount {
    type Result = usize;
}

impl Handler<MemberCount> for SwimMember {
    type Result = usize;

    fn handle(&mut self, _msg: MemberCount, _ctx: &mut Context<Self>) -> usize {
        self.driver.foca().num_members()
    }
}

/// Leave the cluster gracefully, then stop.
#[derive(Debug)]
pub struct Leave;

impl Message for Leave {
    type Result = ();
}

impl Handler<Join> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) {
        let seeds = self.others(msg.seeds);
        self.announce_to(seeds);
        self.drain(ctx);
    }
}

impl Handler<JoinAgain> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: JoinAgain, ctx: &mut Context<Self>) {
        let now = std::time::Instant::now();
        let unheard = now.saturating_duration_since(self.heard_at) >= self.probe_period;
        let seeds = self.others(msg.seeds);
        // The late timers of a stall may still wait behind this message:
        // decided once they have run.
        ctx.run_later(CATCH_UP, move |member, ctx| {
            let stalled = member.stalled_at.is_some_and(|at| at + STALL_RECENT >= now);
            if unheard || stalled {
                member.join_again(seeds);
            } else {
                member.announce_to(seeds);
            }
            member.drain(ctx);
        });
    }
}

impl Handler<Datagram> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Datagram, ctx: &mut Context<Self>) {
        // A datagram that opened under the keyring makes its source heard
        // (see `reflect`). One foca cannot use (garbage, oversized, our
        // own) is dropped: the network is not trusted to be well-formed.
        let now = std::time::Instant::now();
        self.heard_at = now;
        self.bound.heard(msg.from, now);
        let result = self.driver.datagram(&msg.data);
        self.report(result);
        self.drain(ctx);
    }
}

impl Handler<FocaTimer> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: FocaTimer, ctx: &mut Context<Self>) {
        let now = std::time::Instant::now();
        if now.saturating_duration_since(msg.due) > LATE {
            self.stalled_at = Some(now);
        }
        match self.late.offer(msg.timer, msg.due, now, LATE) {
            drive::Offered::Run(timer) => self.run_timer(timer, ctx),
            drive::Offered::Held { first } => {
                metrics::counter!("poolgate_swim_timers_deferred_total").increment(1);
                if first {
                    ctx.notify_later(ReleaseLate, CATCH_UP);
                }
            }
        }
    }
}

impl Handler<ReleaseLate> for SwimMember {
    type Result = ();

    fn handle(&mut self, _: ReleaseLate, ctx: &mut Context<Self>) {
        for timer in self.late.release() {
            self.run_timer(timer, ctx);
        }
    }
}

impl SwimMember {
    /// Hands foca one of its timers (the member's own agent connection
    /// asked about a probe about to turn indirect first).
    fn run_timer(&mut self, timer: foca::Timer<SwimIdentity>, ctx: &mut Context<Self>) {
        // A probe unanswered over UDP when foca turns to indirect probes:
        // the member's own agent connection may vouch for it.
        let (vouching, asked, answer_within) =
            (&self.vouching, &mut self.asked, self.answer_within);
        let result = self.driver.timer(timer, |probed, number| match vouching {
            Vouching::Nobody => false,
            Vouching::Everyone => true,
            Vouching::Here(lives) => {
                let lives = lives(probed);
                if lives {
                    metrics::counter!("poolgate_swim_vouched_total").increment(1);
                }
                lives
            }
            Vouching::Orchestrator(ask) => {
                if ask.try_send((probed.clone(), number)).is_ok() {
                    *asked = Some((probed.clone(), number));
                    let probed = probed.clone();
                    ctx.run_later(answer_within, move |member, ctx| {
                        member.unanswered(probed, number, ctx);
                    });
                    false
                } else {
                    // Not asked: no word from the orchestrator, so no
                    // accusation.
                    metrics::counter!("poolgate_swim_vouch_unasked_total").increment(1);
                    true
                }
            }
        });
        self.report(result);
        self.drain(ctx);
    }
}

impl SwimMember {
    /// The orchestrator did not answer about probe `number` of `probed` in
    /// time: with no word that the member's connection is silent, it is
    /// not accused.
    fn unanswered(
        &mut self,
        probed: SwimIdentity,
        number: foca::ProbeNumber,
        ctx: &mut Context<Self>,
    ) {
        if self.asked.as_ref() != Some(&(probed.clone(), number))
            || !self.driver.probing(&probed, number)
        {
            return;
        }
        self.asked = None;
        metrics::counter!("poolgate_swim_vouch_unanswered_total").increment(1);
        let result = self.driver.vouched(&probed, number);
        self.report(result);
        self.drain(ctx);
    }
}

/// The orchestrator's answer about probe `probe` of `probed`: whether the
/// member's agent connection shows it `alive`. Alive, foca is handed that
/// member's ack if the probe is still under way; not, the probe stands
/// unanswered (the member may be suspected).
#[derive(Debug)]
pub struct Vouched {
    /// The member probed.
    pub probed: SwimIdentity,
    /// foca's number for the probe.
    pub probe: foca::ProbeNumber,
    /// The answer.
    pub alive: bool,
}

impl Message for Vouched {
    type Result = ();
}

impl Handler<Vouched> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Vouched, ctx: &mut Context<Self>) {
        let Vouched {
            probed,
            probe: number,
            alive,
        } = msg;
        if self.asked.as_ref() == Some(&(probed.clone(), number)) {
            self.asked = None;
        }
        if !alive {
            return;
        }
        match self.driver.vouched(&probed, number) {
            Ok(false) => {
                metrics::counter!("poolgate_swim_vouched_late_total").increment(1);
                return;
            }
            Ok(true) => metrics::counter!("poolgate_swim_vouched_total").increment(1),
            refused => self.report(refused),
        }
        self.drain(ctx);
    }
}

/// From now on, `0` vouches for members whose probes go unanswered (a
/// node's member: [`Vouching::Orchestrator`]).
#[derive(Debug)]
pub struct SetVouching(pub Vouching);

impl Message for SetVouching {
    type Result = ();
}

impl Handler<SetVouching> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: SetVouching, _ctx: &mut Context<Self>) {
        self.vouching = msg.0;
    }
}

impl Handler<Crash> for SwimMember {
    type Result = ();

    fn handle(&mut self, _msg: Crash, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Leave> for SwimMember {
    type Result = ();

    fn handle(&mut self, _msg: Leave, ctx: &mut Context<Self>) {
        self.leaving = true;
        let result = self.driver.leave();
        self.report(result);
        self.drain(ctx);
        ctx.stop();
    }
}
