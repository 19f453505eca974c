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
use foca::{AccumulatingRuntime, Foca, OwnedNotification, Timer};
use rand::rngs::StdRng;
use tokio::net::UdpSocket;

use super::drive;
use super::identity::{with_signed, SwimIdentity};
use super::tracker::{MembershipTracker, SwimFact, GENERATION_LIMIT};
use super::watch::{Changes, WatchingCodec};
use crate::config::endpoint::Endpoint;
pub use crate::config::{SwimTimings, DEFAULT_INDIRECT_PROBES};
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

/// How long after a probe datagram (ping, ack, and the indirect probe's
/// four) the same sealed bytes go out again. Each probe message is sent
/// twice and the receiver drops the copy it already has ([`Recent`]), so a
/// probe leg is lost only when both copies are: at 15% random loss a
/// direct probe then fails 4.4% of the time instead of 28%, and an
/// indirect path of four legs 8.7% instead of 48%. the gate faults a committed
/// run at the first suspicion of a required node and foca has no fallback
/// of its own (memberlist probes over TCP when UDP probes fail); on the
/// multi-host rig at 15% loss the copies took poolgate from one false
/// fault in 10 minutes to none (BENCHMARKS.md, "Separate hosts"). The
/// copy waits a little so that a burst that took the first may have
/// passed; gossip and joins are not copied (they are repeated anyway).
pub const PROBE_COPY_AFTER: Duration = Duration::from_millis(15);

/// Whether a foca message is part of a probe (its loss can make a live
/// member suspect).
fn is_probe(message: &foca::Message<SwimIdentity>) -> bool {
    use foca::Message;
    matches!(
        message,
        Message::Ping(_)
            | Message::Ack(_)
            | Message::PingReq { .. }
            | Message::IndirectPing { .. }
            | Message::IndirectAck { .. }
            | Message::ForwardedAck { .. }
    )
}

/// Sends one datagram. UDP: a datagram that cannot be sent now is lost,
/// as on the wire; SWIM tolerates loss.
fn send(socket: &std::net::UdpSocket, datagram: &[u8], to: SocketAddr) {
    if let Err(e) = socket.send_to(datagram, to) {
        tracing::debug!(%to, error = %e, "datagram not sent");
    }
}

/// The datagrams received lately, to drop a second copy (see
/// [`PROBE_COPY_AFTER`]) or a replay within about [`Recent::SPAN`]. Only
/// datagrams that opened are remembered, so garbage cannot push real ones
/// out. Bounded: two sets of at most [`Recent::CAPACITY`] keyed hashes.
pub struct Recent {
    current: std::collections::HashSet<u64>,
    previous: std::collections::HashSet<u64>,
    since: std::time::Instant,
    hasher: std::hash::RandomState,
}

impl Recent {
    /// How long a datagram is remembered, at least (at most twice this).
    pub const SPAN: Duration = Duration::from_secs(1);
    /// How many datagrams one set holds; a fuller set starts a new span.
    pub const CAPACITY: usize = 16_384;

    /// Nothing remembered yet.
    pub fn new(now: std::time::Instant) -> Self {
        Self {
            current: std::collections::HashSet::new(),
            previous: std::collections::HashSet::new(),
            since: now,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// The key `datagram` is remembered under.
    pub fn key(&self, datagram: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, datagram)
    }

    /// Whether a datagram with `key` was remembered lately.
    pub fn seen(&self, key: u64) -> bool {
        self.current.contains(&key) || self.previous.contains(&key)
    }

    /// Remembers a datagram that opened.
    pub fn remember(&mut self, key: u64, now: std::time::Instant) {
        if now.duration_since(self.since) >= Self::SPAN || self.current.len() >= Self::CAPACITY {
            self.previous = std::mem::take(&mut self.current);
            self.since = now;
        }
        self.current.insert(key);
    }
}

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
    foca: SwimFoca,
    runtime: AccumulatingRuntime<SwimIdentity>,
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
    /// What this member repairs on top of foca, once every
    /// [`drive::REPAIR_EVERY`].
    repair: drive::Repair,
    /// The origin of the repair's clock.
    started: std::time::Instant,
    /// Told this member's generation whenever foca renews its identity.
    own_generation: Option<tokio::sync::watch::Sender<u64>>,
    /// Told to leave: foca's "defunct" that follows is the leave, said as
    /// such, not a death.
    leaving: bool,
    /// The identities nodes signed, deciding address conflicts (the
    /// orchestrator's member only), while the term they belong to lasts.
    signed: Option<super::identity::SignedView>,
    /// Whether the attached term still lasts (see [`Attach`]); none: for
    /// as long as the view is kept.
    term_lasts: Option<TermLasts>,
    /// Rejoins are logged at most this often (a storm of them means
    /// another member claims this one's address).
    rejoins: crate::live::throttle::Throttle,
    /// The attachment whose gate the sink feeds (see [`Attach`]).
    attached: Option<u64>,
    /// What the attached term is not told of the view before it began.
    before_term: super::fresh::BeforeTerm,
    /// Where this member may send, by what it has heard.
    bound: super::reflect::SendBound,
    /// The probe under way, as this member's datagrams show it.
    probes: drive::Probes,
    /// Who vouches for a member whose probe went unanswered.
    vouching: Vouching,
    /// The probe the orchestrator was asked about, its answer awaited.
    asked: Option<(SwimIdentity, foca::ProbeNumber)>,
    /// How long an answer is awaited: half of what is left of the probe
    /// period once foca turns to indirect probes.
    answer_within: Duration,
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
        let identity = SwimIdentity {
            node: node.to_string(),
            addr,
            generation,
        };
        let (codec, changes) = WatchingCodec::watched();
        let repair = drive::Repair::for_config(&config);
        let answer_within = config.probe_period.saturating_sub(config.probe_rtt) / 2;
        let member = SwimMember {
            foca: Foca::new(identity, config, rng, codec),
            runtime: AccumulatingRuntime::new(),
            sender,
            receiving: Some(receiving),
            tracker: MembershipTracker::default(),
            changes,
            sink,
            receiver: None,
            keyring: Arc::new(RwLock::new(keyring)),
            repair,
            started: std::time::Instant::now(),
            own_generation: None,
            leaving: false,
            signed: None,
            term_lasts: None,
            rejoins: crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY),
            attached: None,
            before_term: super::fresh::BeforeTerm::default(),
            bound: super::reflect::SendBound::default(),
            probes: drive::Probes::default(),
            vouching: Vouching::Nobody,
            asked: None,
            answer_within,
        };
        Ok((member.start(), addr))
    }

    /// Does what foca asked for, then reports membership changes.
    fn drain(&mut self, ctx: &mut Context<Self>) {
        let mut host = UdpHost {
            sender: &self.sender,
            keyring: &self.keyring,
            ctx,
            node: &self.foca.identity().node,
            rejoins: &mut self.rejoins,
            own_generation: self.own_generation.as_ref(),
            bound: &mut self.bound,
            leaving: self.leaving,
            probes: &mut self.probes,
        };
        let replaced = drive::drain(&mut self.runtime, &mut host);
        let changed = drive::track(
            &mut self.tracker,
            &self.changes,
            self.foca.identity(),
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

    fn report(&self, what: &'static str, result: Result<(), foca::Error>) {
        if let Err(e) = result {
            metrics::counter!("poolgate_swim_errors_total", "call" => what).increment(1);
            tracing::debug!(node = %self.foca.identity().node, error = %e, "{what} refused");
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

    /// One fact per member of foca's whole membership ([`drive::whole_view`]).
    fn whole_view(&mut self) -> Vec<SwimFact> {
        drive::whole_view(
            &mut self.tracker,
            self.foca.iter_membership_state(),
            self.foca.identity(),
        )
    }

    /// Declares down every member held suspect past the limit
    /// ([`drive::Repair`]).
    fn expire_suspicions(&mut self, ctx: &mut Context<Self>) {
        let expired = self
            .repair
            .expired(self.foca.iter_membership_state(), self.started.elapsed());
        if expired.is_empty() {
            return;
        }
        metrics::counter!("poolgate_swim_suspicions_expired_total").increment(expired.len() as u64);
        tracing::debug!(
            count = expired.len(),
            "suspicions held past the timeout: declared down"
        );
        let signed = self.signed_now();
        let (foca, runtime) = (&mut self.foca, &mut self.runtime);
        let result = with_signed(signed.as_ref(), || {
            foca.apply_many(expired.into_iter(), true, runtime)
        });
        self.report("expire", result);
        self.drain(ctx);
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
        ctx.run_interval(drive::REPAIR_EVERY, |member, ctx| {
            if member.sink.is_some() {
                member.reconcile();
            }
            member.expire_suspicions(ctx);
        });
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

/// Announce this member to seeds known by address.
#[derive(Debug)]
pub struct Join {
    /// The seeds' socket addresses.
    pub seeds: Vec<SocketAddr>,
}

impl Message for Join {
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
    timer: Timer<SwimIdentity>,
    /// When it was due.
    due: std::time::Instant,
    /// Put off once already (see [`LATE`]).
    deferred: bool,
}

/// A timer handled this late means this member itself was stalled
/// (stopped, starved of CPU, its host paused): the datagrams that came
/// in meanwhile (the acks of its probes among them) are read first, for
/// [`CATCH_UP`], so that it judges nobody on time it lost itself (as
/// Lifeguard's local health awareness has it). A timer is put off once.
pub const LATE: Duration = Duration::from_millis(250);

/// How long a late timer is put off.
pub const CATCH_UP: Duration = Duration::from_millis(100);

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

/// The live member's side of foca's requests: datagrams sealed and sent
/// over UDP (probes twice), timers on the actor's context.
struct UdpHost<'a, 'c> {
    sender: &'a std::net::UdpSocket,
    keyring: &'a RwLock<Keyring>,
    ctx: &'c mut Context<SwimMember>,
    node: &'a str,
    rejoins: &'a mut crate::live::throttle::Throttle,
    own_generation: Option<&'a tokio::sync::watch::Sender<u64>>,
    bound: &'a mut super::reflect::SendBound,
    leaving: bool,
    probes: &'a mut drive::Probes,
}

impl drive::Host for UdpHost<'_, '_> {
    fn send(&mut self, to: SwimIdentity, data: bytes::Bytes) {
        // A ping is noted as sent even when withheld: unanswered, it may
        // be vouched for.
        let header = drive::header(&data);
        if let Some(header) = &header {
            self.probes.sent(header);
        }
        if !self.bound.may_send(to.addr, std::time::Instant::now()) {
            metrics::counter!("poolgate_swim_sends_withheld_total").increment(1);
            return;
        }
        let sealed = read(self.keyring).seal(&data);
        send(self.sender, &sealed, to.addr);
        if header.is_some_and(|h| is_probe(&h.message)) {
            self.ctx.run_later(PROBE_COPY_AFTER, move |member, _| {
                if member.bound.may_send(to.addr, std::time::Instant::now()) {
                    send(&member.sender, &sealed, to.addr)
                } else {
                    metrics::counter!("poolgate_swim_sends_withheld_total").increment(1);
                }
            });
        }
    }

    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>) {
        let due = std::time::Instant::now() + after;
        self.ctx.notify_later(
            FocaTimer {
                timer,
                due,
                deferred: false,
            },
            after,
        );
    }

    fn notified(&mut self, notification: OwnedNotification<SwimIdentity>) {
        match notification {
            OwnedNotification::Defunct if self.leaving => {
                tracing::info!(node = %self.node, "left the SWIM cluster")
            }
            OwnedNotification::Defunct => {
                tracing::warn!(node = %self.node, "declared down; identity defunct")
            }
            OwnedNotification::Rejoin(renewed) => {
                metrics::counter!("poolgate_swim_rejoins_total").increment(1);
                if let Some(held) = self.rejoins.allow(std::time::Instant::now()) {
                    tracing::info!(node = %renewed.node, generation = renewed.generation, held, "declared down: rejoined under a renewed identity (many in a row mean another member claims this address: a second process with this node's config, or an insider)");
                }
                if let Some(own) = self.own_generation {
                    own.send_replace(renewed.generation);
                }
            }
            other => tracing::debug!(node = %self.node, ?other, "foca"),
        }
    }
}

fn read(keyring: &RwLock<Keyring>) -> std::sync::RwLockReadGuard<'_, Keyring> {
    keyring
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        msg.0.send_replace(self.foca.identity().generation);
        self.own_generation = Some(msg.0);
    }
}

/// Whether a term still lasts, by its own clock (a leader frozen past its
/// lease knows on waking that it no longer leads, before it has stepped
/// down).
pub type TermLasts = Arc<dyn Fn() -> bool + Send + Sync>;

impl SwimMember {
    /// The signed view that decides address conflicts now: none once the
    /// attached term is over. A deposed leader woken from a freeze reads
    /// the datagrams that waited before its term is detached; decided by
    /// its nodes' last lives, a node restarted under the next leader would
    /// lose the conflict here and be declared down (an operator's finding:
    /// the next leader faulted a run over it).
    fn signed_now(&self) -> Option<super::identity::SignedView> {
        // The term's clock is asked only when there is a view to decide by
        // (a follower's member, and every node's, has none).
        let signed = self.signed.as_ref()?;
        let lasts = self.term_lasts.as_ref().is_none_or(|lasts| lasts());
        lasts.then(|| Arc::clone(signed))
    }
}

/// Decide address conflicts by the identities nodes signed (the
/// orchestrator's member; see [`super::identity::with_signed`]).
#[derive(Debug)]
pub struct UseSigned(pub super::identity::SignedView);

impl Message for UseSigned {
    type Result = ();
}

impl Handler<UseSigned> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: UseSigned, _ctx: &mut Context<Self>) {
        self.signed = Some(msg.0);
        self.term_lasts = None;
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
    pub signed: super::identity::SignedView,
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
        self.signed = Some(msg.signed);
        self.term_lasts = Some(msg.term_lasts);
        self.tracker.only(msg.only);
        self.sink = Some(msg.sink);
        self.attached = Some(msg.token);
        self.vouching = msg.vouching;
        // The new term starts from the whole view, fresh: members in
        // doubt before it began are held back until alive again.
        let view = self.whole_view();
        let (before_term, told) = super::fresh::BeforeTerm::attach(view);
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
            self.signed = None;
            self.term_lasts = None;
            self.before_term = super::fresh::BeforeTerm::default();
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
        self.foca.num_members()
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
        for seed in msg.seeds {
            let result = self
                .foca
                .announce(SwimIdentity::seed(seed), &mut self.runtime);
            self.report("announce", result);
        }
        self.drain(ctx);
    }
}

impl Handler<Datagram> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: Datagram, ctx: &mut Context<Self>) {
        // A datagram that opened under the keyring makes its source heard
        // (see `reflect`). One foca cannot use (garbage, oversized, our
        // own) is dropped: the network is not trusted to be well-formed.
        self.bound.heard(msg.from, std::time::Instant::now());
        // Only a datagram that may answer the probe under way is read
        // for it (the rest go to foca alone, as before).
        if self.probes.awaits_ack() {
            if let Some(header) = drive::header(&msg.data) {
                self.probes.received(&header);
            }
        }
        let signed = self.signed_now();
        let (foca, runtime) = (&mut self.foca, &mut self.runtime);
        let result = with_signed(signed.as_ref(), || foca.handle_data(&msg.data, runtime));
        self.report("datagram", result);
        self.drain(ctx);
    }
}

impl Handler<FocaTimer> for SwimMember {
    type Result = ();

    fn handle(&mut self, msg: FocaTimer, ctx: &mut Context<Self>) {
        let now = std::time::Instant::now();
        if !msg.deferred && now.saturating_duration_since(msg.due) > LATE {
            metrics::counter!("poolgate_swim_timers_deferred_total").increment(1);
            ctx.notify_later(
                FocaTimer {
                    timer: msg.timer,
                    due: now + CATCH_UP,
                    deferred: true,
                },
                CATCH_UP,
            );
            return;
        }
        let signed = self.signed_now();
        // A probe unanswered over UDP when foca turns to indirect probes:
        // the member's own agent connection may vouch for it.
        if let Some((probed, number)) = self.probes.unanswered(&msg.timer) {
            match &self.vouching {
                Vouching::Nobody => {}
                Vouching::Everyone | Vouching::Here(_) => {
                    let lives = match &self.vouching {
                        Vouching::Here(lives) => lives(&probed),
                        _ => true,
                    };
                    if lives && matches!(self.vouching, Vouching::Here(_)) {
                        metrics::counter!("poolgate_swim_vouched_total").increment(1);
                    }
                    if lives {
                        self.hand_ack(&probed, number);
                    }
                }
                Vouching::Orchestrator(ask) => {
                    if ask.try_send((probed.clone(), number)).is_ok() {
                        self.asked = Some((probed.clone(), number));
                        ctx.run_later(self.answer_within, move |member, ctx| {
                            member.unanswered(probed, number, ctx);
                        });
                    } else {
                        // Not asked: no word from the orchestrator, so no
                        // accusation.
                        metrics::counter!("poolgate_swim_vouch_unasked_total").increment(1);
                        self.hand_ack(&probed, number);
                    }
                }
            }
        }
        let (foca, runtime) = (&mut self.foca, &mut self.runtime);
        let result = with_signed(signed.as_ref(), || foca.handle_timer(msg.timer, runtime));
        self.report("timer", result);
        self.drain(ctx);
    }
}

impl SwimMember {
    /// Hands foca `probed`'s ack to probe `number` (its life vouched for,
    /// or nobody to accuse it: see [`Vouching`]).
    fn hand_ack(&mut self, probed: &SwimIdentity, number: foca::ProbeNumber) {
        let signed = self.signed_now();
        let (foca, runtime) = (&mut self.foca, &mut self.runtime);
        let result = with_signed(signed.as_ref(), || {
            drive::vouched(foca, probed, number, runtime)
        });
        self.report("vouch", result);
    }

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
            || !self.probes.is_current(&probed, number)
        {
            return;
        }
        self.asked = None;
        metrics::counter!("poolgate_swim_vouch_unanswered_total").increment(1);
        self.hand_ack(&probed, number);
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
        if !self.probes.is_current(&probed, number) {
            metrics::counter!("poolgate_swim_vouched_late_total").increment(1);
            return;
        }
        metrics::counter!("poolgate_swim_vouched_total").increment(1);
        self.hand_ack(&probed, number);
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
        let result = self.foca.leave_cluster(&mut self.runtime);
        self.report("leave", result);
        self.drain(ctx);
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn identity(node: &str, port: u16) -> SwimIdentity {
        SwimIdentity::local(node, port)
    }

    #[test]
    fn only_probe_datagrams_are_copied() {
        use foca::{Codec, Header, Message};
        let me = identity("node-1", 1);
        let encoded = |message| {
            let mut buf = Vec::new();
            let header = Header {
                src: me.clone(),
                src_incarnation: 0,
                dst: identity("node-2", 2),
                message,
            };
            foca::PostcardCodec
                .encode_header(&header, &mut buf)
                .unwrap();
            buf
        };
        // What `send` decides by: the datagram's header.
        let is_probe = |data: &[u8]| drive::header(data).is_some_and(|h| is_probe(&h.message));
        assert!(is_probe(&encoded(Message::Ping(1))));
        assert!(is_probe(&encoded(Message::Ack(1))));
        let forwarded = Message::ForwardedAck {
            origin: me.clone(),
            probe_number: 1,
        };
        assert!(is_probe(&encoded(forwarded)));
        assert!(!is_probe(&encoded(Message::Gossip)));
        assert!(!is_probe(&encoded(Message::Announce)));
        assert!(!is_probe(b"\xff garbage"));
    }

    #[test]
    fn a_datagram_seen_lately_is_recognised_and_forgotten_after_two_spans() {
        let start = std::time::Instant::now();
        let mut recent = Recent::new(start);
        let (a, b) = (recent.key(b"first"), recent.key(b"second"));
        assert_ne!(a, b);
        assert!(!recent.seen(a));
        recent.remember(a, start);
        assert!(recent.seen(a));
        assert!(!recent.seen(b));
        // Into the previous set at the next span, gone at the one after.
        recent.remember(b, start + Recent::SPAN);
        assert!(recent.seen(a) && recent.seen(b));
        recent.remember(b, start + Recent::SPAN * 2);
        assert!(!recent.seen(a));
        assert!(recent.seen(b));
    }

    #[test]
    fn remembering_is_bounded() {
        let start = std::time::Instant::now();
        let mut recent = Recent::new(start);
        for i in 0..(Recent::CAPACITY * 3) {
            recent.remember(recent.key(&i.to_le_bytes()), start);
        }
        assert!(recent.current.len() <= Recent::CAPACITY);
        assert!(recent.previous.len() <= Recent::CAPACITY);
    }

    /// A ping sent twice (as a copy) is answered once, and the answer goes
    /// out twice, byte for byte.
    #[test]
    fn a_ping_and_its_copy_get_one_ack_sent_twice() {
        use foca::{Codec, Header, Message};
        actix_rt::System::new().block_on(async {
            let generation = 5;
            let (_member, addr) = SwimMember::start(
                "node-1",
                "127.0.0.1:0".parse().unwrap(),
                None,
                generation,
                SwimTimings::default().foca_config(4),
                StdRng::seed_from_u64(1),
                None,
                Keyring::new(&[], "test"),
            )
            .unwrap();
            let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let header = Header {
                src: SwimIdentity {
                    node: "node-2".into(),
                    addr: peer.local_addr().unwrap(),
                    generation: 1,
                },
                src_incarnation: 0,
                dst: SwimIdentity {
                    node: "node-1".into(),
                    addr,
                    generation,
                },
                message: Message::Ping(7),
            };
            let mut ping = Vec::new();
            foca::PostcardCodec
                .encode_header(&header, &mut ping)
                .unwrap();
            peer.send_to(&ping, addr).await.unwrap();
            peer.send_to(&ping, addr).await.unwrap();
            let mut acks = Vec::new();
            let mut buffer = vec![0u8; 65_536];
            let until = tokio::time::Instant::now() + Duration::from_millis(600);
            while let Ok(Ok((len, _))) =
                tokio::time::timeout_at(until, peer.recv_from(&mut buffer)).await
            {
                let datagram = buffer[..len].to_vec();
                let decoded =
                    Codec::<SwimIdentity>::decode_header(&mut foca::PostcardCodec, &datagram[..]);
                if matches!(decoded.map(|h| h.message), Ok(Message::Ack(7))) {
                    acks.push(datagram);
                }
            }
            assert_eq!(acks.len(), 2, "one ack and its copy");
            assert_eq!(acks[0], acks[1], "the copy is the same datagram");
        });
    }
}
