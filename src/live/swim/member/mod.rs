//! `SwimMember`: an actor that owns a foca instance and its UDP socket.
//!
//! foca does no I/O: the actor feeds it datagrams (`handle_data`) and
//! timer events (`handle_timer`), then drains what foca asked for: datagrams
//! to send, timers to schedule (actix `notify_later`), notifications to log.
//! After each call the tracker turns the member states foca applied
//! (noted by its codec, see [`super::watch`]) into facts for the sink, if
//! there is one; the sink's table says which were new.
//!
//! Every datagram is sealed on the way out and opened on the way in with
//! the cluster's [`Keyring`]; one that no key opens is dropped and counted
//! (`poolgate_gossip_rejected_total`), never parsed. Datagrams reach the
//! actor through a bounded mailbox: when it is full the datagram is dropped
//! and counted (`poolgate_gossip_dropped_total`), as a full socket buffer
//! would drop it. foca's refusals are counted too
//! (`poolgate_swim_errors_total`, by call).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message};
use foca::{OwnedNotification, Timer};
use rand::rngs::StdRng;
use tokio::net::UdpSocket;

use super::drive;
use super::tracker::{MembershipTracker, SwimFact, GENERATION_LIMIT};
use super::watch::{Changes, WatchingCodec};
use crate::config::endpoint::Endpoint;
pub use crate::config::{SwimTimings, DEFAULT_INDIRECT_PROBES};
use crate::live::swim::identity::{Arbiter, SwimIdentity};
use crate::live::wire::Keyring;
use crate::live::LiveError;

/// How many received datagrams may wait for the actor.
pub const DATAGRAM_QUEUE: usize = 1024;

/// A generation for a member starting now: the boot time in unix
/// milliseconds, so a restarted process outranks its earlier life.
pub fn boot_generation() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_millis())
        .unwrap_or(u64::MAX)
        .min(GENERATION_LIMIT - 1)
}

/// The address a member bound to `local` advertises: `advertise`
/// resolved (port 0 = the bound port), else `local`, which must then be a
/// specified address (`0.0.0.0` and `::` reach nobody).
pub fn advertised(
    local: SocketAddr,
    advertise: Option<&Endpoint>,
) -> Result<SocketAddr, LiveError> {
    let Some(advertise) = advertise else {
        if local.ip().is_unspecified() {
            return Err(LiveError::Unadvertised(local));
        }
        return Ok(local);
    };
    let mut addr = advertise
        .resolve_like(local)
        .map_err(|e| LiveError::Resolve {
            key: "swim.advertise",
            message: e.to_string(),
        })?;
    if addr.port() == 0 {
        addr.set_port(local.port());
    }
    if addr.ip().is_unspecified() {
        return Err(LiveError::Unadvertised(addr));
    }
    if addr.ip().is_loopback() && !local.ip().is_loopback() {
        tracing::warn!(%advertise, %addr, "swim.advertise resolves to a loopback address: members on other hosts cannot reach this one");
    }
    Ok(addr)
}

/// Where membership facts go (the orchestrator's table of SWIM facts, its
/// checks, then the gate); says whether the fact was new to it (a repeat
/// of what it holds changes nothing).
pub type MembershipSink = Box<dyn FnMut(SwimFact) -> bool + Send>;

impl SwimTimings {
    /// foca's configuration for a cluster of about `cluster_size` members
    /// (the CLI's and the tests' SWIM members; foca's type is not part of
    /// the API).
    #[doc(hidden)]
    pub fn foca_config(&self, cluster_size: u32) -> foca::Config {
        let size = NonZeroU32::new(cluster_size.max(1)).unwrap_or(NonZeroU32::MIN);
        let mut config = foca::Config::new_lan(size);
        config.probe_period = self.probe_period;
        config.probe_rtt = self.probe_rtt;
        config.suspect_to_down_after = self.suspicion_timeout;
        if let Some(indirect) = std::num::NonZeroUsize::new(self.indirect_probes) {
            config.num_indirect_probes = indirect;
        }
        if let Some(gossip) = config.periodic_gossip.as_mut() {
            gossip.frequency = (self.probe_period / 5).max(Duration::from_millis(20));
        }
        config
    }
}

pub use super::drive::SwimFoca;

/// One SWIM member on a UDP socket.
pub struct SwimMember {
    /// foca, the probe under way and the repair, driven as one value.
    driver: drive::Driver,
    /// This member's node id, for its log lines.
    node: String,
    /// Sends go through a plain non-blocking socket (a datagram is sent or
    /// lost at once); receives through a tokio clone of it.
    sender: std::net::UdpSocket,
    receiving: Option<std::net::UdpSocket>,
    tracker: MembershipTracker,
    /// The member states foca applied since the last drain.
    changes: Changes,
    sink: Option<MembershipSink>,
    /// Stops the receiving thread when the member stops.
    receiver: Option<tokio::sync::oneshot::Sender<()>>,
    /// Shared with the receiving task; replaced whole on rotation.
    keyring: Arc<RwLock<Keyring>>,
    /// The origin of the repair's clock.
    started: std::time::Instant,
    /// Told this member's generation whenever foca renews its identity.
    own_generation: Option<tokio::sync::watch::Sender<u64>>,
    /// Told to leave: foca's "defunct" that follows is the leave, said as
    /// such, not a death.
    leaving: bool,
    /// How this member decides address conflicts: by the identities its
    /// nodes signed while an attached term lasts (the orchestrator's
    /// member), else by generation. Its codec hands it to every identity
    /// foca decodes.
    arbiter: Arbiter,
    /// Rejoins are logged at most this often (a storm of them means
    /// another member claims this one's address).
    rejoins: crate::live::throttle::Throttle,
    /// The attachment whose gate the sink feeds (see [`Attach`]).
    attached: Option<u64>,
    /// What the attached term is not told of the view before it began.
    before_term: crate::live::swim::fresh::BeforeTerm,
    /// Where this member may send, by what it has heard.
    bound: crate::live::swim::reflect::SendBound,
    /// Who vouches for a member whose probe went unanswered.
    vouching: Vouching,
    /// The probe the orchestrator was asked about, its answer awaited.
    asked: Option<(SwimIdentity, foca::ProbeNumber)>,
    /// How long an answer is awaited: half of what is left of the probe
    /// period once foca turns to indirect probes.
    answer_within: Duration,
    /// foca's probe period: a member that heard no datagram for as long
    /// may have been cut off, and suspected.
    probe_period: Duration,
    /// When this member last received a datagram.
    heard_at: std::time::Instant,
    /// When this member last found its own timers late (it stalled).
    stalled_at: Option<std::time::Instant>,
    /// The timers held since one came late (see `LATE`).
    late: drive::LateTimers,
}

/// The name every orchestrator's SWIM member goes by.
pub const ORCHESTRATOR: &str = "orchestrator";

/// Who vouches for a SWIM member whose probe by this member went
/// unanswered over UDP, by the member's own agent connection (design §15;
/// see [`drive::Probes`]).
#[derive(Clone, Default)]
pub enum Vouching {
    /// Nobody: foca's probes alone.
    #[default]
    Nobody,
    /// Every member: this member accuses nobody (a replica's member while
    /// it follows: the nodes' frames go to the leader, so it has no
    /// evidence of its own, and a suspicion it raised on UDP loss alone,
    /// gossiped, would fault the leader's runs). It still learns every
    /// suspicion the others raise, and times them out.
    Everyone,
    /// This process, at once: whether the member's agent connection
    /// shows it alive now (the leading orchestrator's member).
    Here(Arc<dyn Fn(&SwimIdentity) -> bool + Send + Sync>),
    /// The orchestrator, asked over this node's agent connection; its
    /// answer comes back as [`Vouched`] (a node's member). Only its word
    /// that the member's own connection is silent too lets this member
    /// accuse: a question its bounded queue cannot take, or one not
    /// answered within half what is left of the probe period (no
    /// connection, an orchestrator stalled or changing hands), accuses
    /// nobody, as a follower does.
    Orchestrator(tokio::sync::mpsc::Sender<(SwimIdentity, foca::ProbeNumber)>),
}

impl std::fmt::Debug for Vouching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vouching::Nobody => "Nobody",
            Vouching::Everyone => "Everyone",
            Vouching::Here(_) => "Here",
            Vouching::Orchestrator(_) => "Orchestrator",
        })
    }
}

impl SwimMember {
    /// Binds `bind` and starts a member named `node` at `generation`
    /// (see [`boot_generation`]), sealing its gossip with `keyring`. Its
    /// identity carries `advertise` (resolved now; port 0 is the bound
    /// port), or the bound address when there is none. Returns its address
    /// and the advertised socket address. Must be called inside a running
    /// actix `System`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        node: &str,
        bind: SocketAddr,
        advertise: Option<&Endpoint>,
        generation: u64,
        config: foca::Config,
        rng: StdRng,
        sink: Option<MembershipSink>,
        keyring: Keyring,
    ) -> Result<(Addr<SwimMember>, SocketAddr), LiveError> {
        let bound = |source| LiveError::Bind {
            socket: "SWIM (UDP)",
            addr: bind,
            source,
        };
        let sender = std::net::UdpSocket::bind(bind).map_err(bound)?;
        sender.set_nonblocking(true).map_err(bound)?;
        let local = sender.local_addr().map_err(bound)?;
        let receiving = sender.try_clone().map_err(bound)?;
        let addr = advertised(local, advertise)?;
        let identity = SwimIdentity::new(node, addr, generation);
        let arbiter = Arbiter::default();
        let (codec, changes) = WatchingCodec::watched(arbiter.clone());
        let answer_within = config.probe_period.saturating_sub(config.probe_rtt) / 2;
        let probe_period = config.probe_period;
        let member = SwimMember {
            node: identity.node.clone(),
            driver: drive::Driver::new(identity, config, rng, codec),
            sender,
            receiving: Some(receiving),
            tracker: MembershipTracker::default(),
            changes,
            sink,
            receiver: None,
            keyring: Arc::new(RwLock::new(keyring)),
            started: std::time::Instant::now(),
            own_generation: None,
            leaving: false,
            arbiter,
            rejoins: crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY),
            attached: None,
            before_term: crate::live::swim::fresh::BeforeTerm::default(),
            bound: crate::live::swim::reflect::SendBound::default(),
            vouching: Vouching::Nobody,
            asked: None,
            answer_within,
            probe_period,
            heard_at: std::time::Instant::now(),
            stalled_at: None,
            late: drive::LateTimers::default(),
        };
        Ok((member.start(), addr))
    }

    /// Does what foca asked for, then reports membership changes.
    fn drain(&mut self, ctx: &mut Context<Self>) {
        let mut host = UdpHost {
            sender: &self.sender,
            keyring: &self.keyring,
            ctx,
            node: &self.node,
            rejoins: &mut self.rejoins,
            own_generation: self.own_generation.as_ref(),
            bound: &mut self.bound,
            leaving: self.leaving,
            started: self.started,
        };
        let replaced = self.driver.drain(&mut host);
        let changed = drive::track(
            &mut self.tracker,
            &self.changes,
            self.driver.identity(),
            replaced,
        );
        self.emit(changed);
    }

    /// Hands the tracker's facts to the sink; how many were new to it.
    fn emit(&mut self, facts: Vec<SwimFact>) -> usize {
        let Some(sink) = self.sink.as_mut() else {
            return 0;
        };
        let mut new = 0;
        for fact in facts {
            if !self.before_term.admits(&fact) {
                continue;
            }
            let update = &fact.update;
            tracing::trace!(node = %update.node, addr = %fact.addr, state = %update.state, incarnation = update.incarnation, "SWIM fact");
            new += usize::from(sink(fact));
        }
        new
    }

    fn report<T>(&self, result: Result<T, drive::Refused>) {
        if let Err(drive::Refused { call, error }) = result {
            metrics::counter!("poolgate_swim_errors_total", "call" => call).increment(1);
            tracing::debug!(node = %self.node, %error, "{call} refused");
        }
    }
}

impl SwimMember {
    /// Hands the sink every member of foca's whole view (the wanted ones);
    /// the sink's table keeps what differs from what it holds, and says so.
    fn reconcile(&mut self) {
        let facts = self.whole_view();
        let new = self.emit(facts);
        if new > 0 {
            metrics::counter!("poolgate_swim_reconciled_total").increment(new as u64);
            tracing::debug!(count = new, "SWIM states found by the whole-view check");
        }
    }

    /// One fact per member of foca's whole membership ([`drive::Driver::whole_view`]).
    fn whole_view(&mut self) -> Vec<SwimFact> {
        self.driver.whole_view(&mut self.tracker)
    }

    /// The repair's tick ([`drive::Repair`]): every member held suspect
    /// past the limit declared down, then, for the member that feeds a
    /// gate, the whole view checked against what the tracker told.
    fn repair(&mut self, ctx: &mut Context<Self>) {
        match self.driver.expire_suspicions(self.started.elapsed()) {
            Ok(0) => {}
            Ok(count) => {
                metrics::counter!("poolgate_swim_suspicions_expired_total").increment(count as u64);
                tracing::debug!(count, "suspicions held past the timeout: declared down");
                self.drain(ctx);
            }
            refused => self.report(refused),
        }
        if self.sink.is_some() {
            self.reconcile();
        }
    }
}

impl Actor for SwimMember {
    type Context = Context<Self>;

    /// Datagrams are received and opened on a thread of their own, so a
    /// flood of garbage costs that thread's CPU, not the actors' thread
    /// (where probes are answered and timers fire).
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(DATAGRAM_QUEUE);
        if tokio::runtime::Handle::try_current().is_err() {
            // First run while its System is being dropped (stopped right
            // after start): no timers can be set, and nothing to do.
            return ctx.stop();
        }
        ctx.run_interval(drive::REPAIR_EVERY, |member, ctx| member.repair(ctx));
        let Some(socket) = self.receiving.take() else {
            return;
        };
        let me = ctx.address();
        let keyring = Arc::clone(&self.keyring);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        self.receiver = Some(stop);
        let spawned = std::thread::Builder::new()
            .name("swim-receive".into())
            .spawn(move || receive(socket, keyring, me, stopped));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the SWIM receiving thread");
            ctx.stop();
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(receiver) = self.receiver.take() {
            // The thread may have ended already; nothing to stop then.
            let _ = receiver.send(());
        }
    }
}

/// The receiving thread: opens each datagram with the keyring and hands
/// it to the member, until the member stops.
fn receive(
    socket: std::net::UdpSocket,
    keyring: Arc<RwLock<Keyring>>,
    member: Addr<SwimMember>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return tracing::error!(error = %e, "SWIM receiving thread: no runtime"),
    };
    runtime.block_on(async move {
        let socket = match UdpSocket::from_std(socket) {
            Ok(socket) => socket,
            Err(e) => return tracing::error!(error = %e, "SWIM receiving thread: no socket"),
        };
        let mut buffer = vec![0u8; 65_536];
        let mut recent = Recent::new(std::time::Instant::now());
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                received = socket.recv_from(&mut buffer) => match received {
                    Ok((len, from)) => {
                        let key = recent.key(&buffer[..len]);
                        if recent.seen(key) {
                            metrics::counter!("poolgate_gossip_duplicates_total").increment(1);
                            continue;
                        }
                        let Some(data) = read(&keyring).open(&buffer[..len]) else {
                            metrics::counter!("poolgate_gossip_rejected_total").increment(1);
                            continue;
                        };
                        recent.remember(key, std::time::Instant::now());
                        if member.try_send(Datagram { data, from }).is_err() {
                            if !member.connected() {
                                return;
                            }
                            metrics::counter!("poolgate_gossip_dropped_total").increment(1);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "receive failed"),
                },
            }
        }
    });
}

/// Whether a term still lasts, by its own clock (a leader frozen past its
/// lease knows on waking that it no longer leads, before it has stepped
/// down).
pub use crate::live::swim::identity::TermLasts;

impl SwimMember {
    /// `seeds` but this member's own address (replicas list one another,
    /// each itself among them: foca refuses its own announce as data from
    /// itself, an error counted for nothing).
    fn others(&self, mut seeds: Vec<SocketAddr>) -> Vec<SocketAddr> {
        let own = self.driver.identity().addr;
        seeds.retain(|seed| *seed != own);
        seeds
    }

    /// Announces this member to `seeds`.
    fn announce_to(&mut self, seeds: Vec<SocketAddr>) {
        for seed in seeds {
            let result = self.driver.announce(SwimIdentity::seed(seed));
            self.report(result);
        }
    }

    /// Refutes at once any suspicion of this member raised while it was
    /// away, then announces it to `seeds` (see [`drive::Driver::join_again`]).
    fn join_again(&mut self, seeds: Vec<SocketAddr>) {
        let seeds = seeds.into_iter().map(SwimIdentity::seed);
        let result = self.driver.join_again(seeds);
        metrics::counter!("poolgate_swim_refuted_on_return_total").increment(1);
        self.report(result);
    }
}

mod messages;
#[cfg(test)]
mod tests;
mod udp;

pub use messages::*;
use udp::{read, UdpHost};
pub use udp::{Recent, PROBE_COPY_AFTER};
