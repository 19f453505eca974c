//! One member's foca and what it keeps beside it, driven as a value:
//! inputs in (a datagram, a timer, the repair's tick, an answer about a
//! probe), requests out through a [`Host`]. The live member (UDP, actix
//! timers, the wall clock) and the simulator (memory, virtual time) hold
//! one each and do only their I/O: the order of the calls, the probe's
//! notes and the repair are this file's alone.

use std::time::Duration;

use foca::{AccumulatingRuntime, Member, State, Timer};

use super::{drain, join_again, vouched, whole_view, Host, Probes, Repair, Replaced, SwimFoca};
use crate::live::swim::identity::SwimIdentity;
use crate::live::swim::tracker::{MembershipTracker, SwimFact};
use crate::live::swim::watch::WatchingCodec;

/// A foca call the member's foca refused, and which one (for a counter
/// and a debug line: the network is not trusted to be well-formed).
#[derive(Debug)]
pub struct Refused {
    /// What was asked: `datagram`, `timer`, `vouch`, `expire`, …
    pub call: &'static str,
    /// foca's answer.
    pub error: foca::Error,
}

/// What a driver call gives back: `Ok`, or the refusal.
pub type Driven = Result<(), Refused>;

fn refused(call: &'static str) -> impl Fn(foca::Error) -> Refused {
    move |error| Refused { call, error }
}

/// One member's foca, its runtime, the probe under way and the repair.
/// Each input is one call; what foca asked for meanwhile waits in the
/// runtime until [`Driver::drain`] hands it to the host.
pub struct Driver {
    foca: SwimFoca,
    runtime: AccumulatingRuntime<SwimIdentity>,
    probes: Probes,
    repair: Repair,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("identity", self.foca.identity())
            .field("probes", &self.probes)
            .field("repair", &self.repair)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// A member of identity `identity` running foca with `config`, its
    /// `rng` and `codec`; its suspicions stand at most its suspicion
    /// timeout plus a probe period ([`Repair::for_config`]).
    pub fn new(
        identity: SwimIdentity,
        config: foca::Config,
        rng: rand::rngs::StdRng,
        codec: WatchingCodec,
    ) -> Self {
        let repair = Repair::for_config(&config);
        Self {
            foca: foca::Foca::new(identity, config, rng, codec),
            runtime: AccumulatingRuntime::new(),
            probes: Probes::default(),
            repair,
        }
    }

    /// The foca driven, to read.
    pub fn foca(&self) -> &SwimFoca {
        &self.foca
    }

    /// This member's identity.
    pub fn identity(&self) -> &SwimIdentity {
        self.foca.identity()
    }

    /// A datagram received (opened under the keyring): read for the probe
    /// under way when it may answer it, then handed to foca.
    pub fn datagram(&mut self, data: &[u8]) -> Driven {
        if self.probes.awaits_ack() {
            if let Some(header) = super::header(data) {
                self.probes.received(&header);
            }
        }
        self.foca
            .handle_data(data, &mut self.runtime)
            .map_err(refused("datagram"))
    }

    /// One of foca's timers, due. When it turns a probe still unanswered
    /// to indirect probes, `vouch` is asked first (the probed member and
    /// foca's number for the probe): `true` hands foca the member's ack
    /// now ([`Probes`]); `false` leaves the probe unanswered (the host may
    /// still answer later, [`Driver::vouched`]).
    pub fn timer(
        &mut self,
        timer: Timer<SwimIdentity>,
        vouch: impl FnOnce(&SwimIdentity, foca::ProbeNumber) -> bool,
    ) -> Driven {
        let mut first = Ok(());
        if let Some((probed, number)) = self.probes.unanswered(&timer) {
            if vouch(&probed, number) {
                first = self.vouched(&probed, number).map(drop);
            }
        }
        let handled = self
            .foca
            .handle_timer(timer, &mut self.runtime)
            .map_err(refused("timer"));
        first.and(handled)
    }

    /// `probed`'s life vouched for by other evidence while probe `number`
    /// is under way: foca is handed the ack it would have sent. `Ok(false)`
    /// when that probe is over (a late answer is for its probe only).
    pub fn vouched(
        &mut self,
        probed: &SwimIdentity,
        number: foca::ProbeNumber,
    ) -> Result<bool, Refused> {
        if !self.probes.is_current(probed, number) {
            return Ok(false);
        }
        vouched(&mut self.foca, probed, number, &mut self.runtime).map_err(refused("vouch"))?;
        Ok(true)
    }

    /// The probe `timer` turns to indirect probes, if its ping went
    /// unanswered: what [`Driver::timer`] asks its `vouch` about.
    pub fn unanswered(
        &self,
        timer: &Timer<SwimIdentity>,
    ) -> Option<(SwimIdentity, foca::ProbeNumber)> {
        self.probes.unanswered(timer)
    }

    /// Whether probe `number` of `probed` is the one under way.
    pub fn probing(&self, probed: &SwimIdentity, number: foca::ProbeNumber) -> bool {
        self.probes.is_current(probed, number)
    }

    /// The repair's tick (every [`super::REPAIR_EVERY`] of the member's
    /// own clock, `now`: any origin, never going back): every suspicion
    /// held past the limit is declared down here, and gossiped. Returns
    /// how many.
    pub fn expire_suspicions(&mut self, now: Duration) -> Result<usize, Refused> {
        let expired = self.repair.expired(self.foca.iter_membership_state(), now);
        let count = expired.len();
        if count > 0 {
            self.foca
                .apply_many(expired.into_iter(), true, &mut self.runtime)
                .map_err(refused("expire"))?;
        }
        Ok(count)
    }

    /// One fact per member of the whole view, for the repair's check of
    /// what the tracker told (see [`Repair`]).
    pub fn whole_view(&self, tracker: &mut MembershipTracker) -> Vec<SwimFact> {
        whole_view(
            tracker,
            self.foca.iter_membership_state(),
            self.foca.identity(),
        )
    }

    /// Announces this member to `seed`.
    pub fn announce(&mut self, seed: SwimIdentity) -> Driven {
        self.foca
            .announce(seed, &mut self.runtime)
            .map_err(refused("announce"))
    }

    /// Back from an absence: refutes any suspicion of this member raised
    /// meanwhile, at the incarnation its datagrams speak at, and announces
    /// it to `seeds`: a suspicion of itself at that incarnation is news to
    /// foca, which raises its incarnation and gossips, and the announces
    /// carry the new one (design §15).
    pub fn join_again(&mut self, seeds: impl IntoIterator<Item = SwimIdentity>) -> Driven {
        let incarnation = self.probes.incarnation();
        join_again(&mut self.foca, incarnation, seeds, &mut self.runtime)
            .map_err(refused("join again"))
    }

    /// Takes `generation` as this member's own: foca declares the identity
    /// before it down and gossips the new one.
    pub fn renew(&mut self, generation: u64) -> Driven {
        let mut renewed = self.foca.identity().clone();
        renewed.generation = generation;
        self.foca
            .change_identity(renewed, &mut self.runtime)
            .map_err(refused("renew"))
    }

    /// Leaves the cluster (foca's "defunct" follows).
    pub fn leave(&mut self) -> Driven {
        self.foca
            .leave_cluster(&mut self.runtime)
            .map_err(refused("leave"))
    }

    /// Applies member states as if learnt (`gossip`: passed on).
    pub fn apply(&mut self, members: Vec<Member<SwimIdentity>>, gossip: bool) -> Driven {
        self.foca
            .apply_many(members.into_iter(), gossip, &mut self.runtime)
            .map_err(refused("apply"))
    }

    /// Hands `host` what foca asked for since the last drain, in foca's
    /// order ("you are down" only to a member held down here), each probe noted as sent first (a ping withheld
    /// by the host is still a probe under way, which may be vouched for);
    /// returns the renames among them, for the tracker.
    pub fn drain(&mut self, host: &mut impl Host) -> Vec<Replaced> {
        let mut noting = Noting {
            host,
            probes: &mut self.probes,
        };
        drain(&mut self.runtime, &mut noting, &self.foca)
    }

    /// The state foca holds for `id`, if it holds it.
    pub fn state_of(&self, id: &SwimIdentity) -> Option<State> {
        self.foca
            .iter_membership_state()
            .find(|m| m.id() == id)
            .map(Member::state)
    }
}

/// A host whose sends note the probe under way first.
struct Noting<'h, 'p, H> {
    host: &'h mut H,
    probes: &'p mut Probes,
}

impl<H: Host> Host for Noting<'_, '_, H> {
    fn send(
        &mut self,
        to: SwimIdentity,
        data: bytes::Bytes,
        header: Option<&foca::Header<SwimIdentity>>,
    ) {
        if let Some(header) = header {
            self.probes.sent(header);
        }
        self.host.send(to, data, header);
    }

    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>) {
        self.host.schedule(after, timer);
    }

    fn notified(&mut self, notification: foca::OwnedNotification<SwimIdentity>) {
        self.host.notified(notification);
    }
}
