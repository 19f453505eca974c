//! Leadership among orchestrator replicas on etcd (design §12).
//!
//! Each replica campaigns for the `leader` key under the state prefix,
//! created on a lease of `[state] lease` in one transaction that succeeds
//! only if the key does not exist. The leader renews its lease every
//! sixth of the TTL and may act only until two thirds of the TTL after
//! the start of its last successful renewal, by its own monotonic clock
//! (the lease cannot expire on etcd before the full TTL from then): a
//! leader that cannot reach etcd stops acting before any other replica
//! can lead. Followers read the key every `POLL` and campaign when it is
//! gone. All of it runs on a thread of its own; what it decides reaches
//! the orchestrator through a [`Role`] watch and the store's [`Fence`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{LiveError, Orchestrator};
use crate::etcd::{self, Etcd};
use crate::state::etcd::{EtcdStore, Fence, LeaderTerm};

/// How often a follower looks at the leader key.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// What the leader key says about the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// The leading replica's name.
    pub replica: String,
    /// Where its agent listener is reached (what nodes are pointed to).
    pub agents: String,
}

impl std::fmt::Display for Leader {
    /// `<replica> at <agents>`, as refusals and status say it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.replica, self.agents)
    }
}

/// This replica's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Another replica leads (`Some`), or nobody is known to.
    Following(Option<Leader>),
    /// This replica leads, since the instant it won.
    Leading(Instant),
}

/// Why a replica stopped leading (said once, at the step down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SteppedDown {
    /// No renewal succeeded within the renew deadline.
    NoRenewal(Duration),
    /// The lease is gone on etcd (expired, revoked, or etcd's data lost).
    LeaseGone,
    /// The leader key is no longer this replica's.
    KeyTaken,
    /// etcd refused a write of this term (the leader key or a record
    /// changed under it).
    WriteRefused,
}

impl std::fmt::Display for SteppedDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SteppedDown::NoRenewal(d) => write!(
                f,
                "the lease could not be renewed within {}: stepped down before it can expire",
                crate::config::in_words(*d)
            ),
            SteppedDown::LeaseGone => f.write_str("the lease is gone on etcd"),
            SteppedDown::KeyTaken => f.write_str("the leader key is no longer this replica's"),
            SteppedDown::WriteRefused => f.write_str(
                "etcd refused a write of this term (the leader key or a record changed under it)",
            ),
        }
    }
}

/// A replica's part in the election: started with [`Campaign::start`],
/// ended (lease revoked, leadership handed on at once) by
/// [`Campaign::resign`] or on drop.
#[derive(Debug)]
pub(crate) struct Campaign {
    stop: Arc<AtomicBool>,
    abandoned: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    role: watch::Receiver<Role>,
}

/// What a campaign needs.
#[derive(Debug, Clone)]
pub(crate) struct CampaignSettings {
    /// The leader key.
    pub key: Vec<u8>,
    /// What this replica writes there.
    pub me: Leader,
    /// The lease's TTL.
    pub ttl: Duration,
}

impl Campaign {
    /// Starts campaigning; `fence` follows the terms won.
    pub fn start(etcd: Arc<Etcd>, settings: CampaignSettings, fence: Arc<Fence>) -> Campaign {
        let (tx, role) = watch::channel(Role::Following(None));
        let stop = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, abandoned) = (Arc::clone(&stop), Arc::clone(&abandoned));
            std::thread::Builder::new()
                .name("poolgate-leadership".into())
                .spawn(move || Elector::new(etcd, settings, fence, tx, stop).run(&abandoned))
                .ok()
        };
        Campaign {
            stop,
            abandoned,
            thread,
            role,
        }
    }

    /// The role, as it changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Stops campaigning; a leader revokes its lease so another replica
    /// leads at once.
    pub fn resign(mut self) {
        self.end();
    }

    /// Stops campaigning without revoking the lease, as a crashed process
    /// would: another replica leads once the lease expires.
    pub fn abandon(mut self) {
        self.abandoned.store(true, Ordering::Relaxed);
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.end();
    }
}

/// Renew deadline: acting stops this long after a renewal began.
pub(crate) fn renew_deadline(ttl: Duration) -> Duration {
    ttl * 2 / 3
}

struct Elector {
    etcd: Arc<Etcd>,
    settings: CampaignSettings,
    value: Vec<u8>,
    fence: Arc<Fence>,
    tx: watch::Sender<Role>,
    stop: Arc<AtomicBool>,
    said: super::throttle::Throttle,
    /// The last renewal failed: the next comes sooner.
    failed_renewal: bool,
}

/// How many renewals a lease gets per TTL: with the renew deadline at two
/// thirds of the TTL, a leader has at least half the TTL to ride out an
/// etcd election that begins right after a renewal.
pub(crate) const RENEWALS_PER_TTL: u32 = 6;

/// How soon a failed renewal is tried again.
pub(crate) const RENEW_RETRY: Duration = Duration::from_millis(100);

/// A term being held: the lease, the key's create revision, the TTL.
#[derive(Clone, Copy)]
struct HeldLease {
    lease: i64,
    created: i64,
    ttl: Duration,
    until: Instant,
}

impl Elector {
    fn new(
        etcd: Arc<Etcd>,
        settings: CampaignSettings,
        fence: Arc<Fence>,
        tx: watch::Sender<Role>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let value = serde_json::to_vec(&settings.me).unwrap_or_default();
        Elector {
            etcd,
            settings,
            value,
            fence,
            tx,
            stop,
            said: super::throttle::Throttle::new(super::throttle::LOG_EVERY),
            failed_renewal: false,
        }
    }

    fn run(mut self, abandoned: &AtomicBool) {
        let mut held: Option<HeldLease> = None;
        while !self.stop.load(Ordering::Relaxed) {
            held = match held {
                None => {
                    let won = self.follow();
                    if won.is_none() {
                        self.pause(POLL);
                    }
                    won
                }
                Some(term) => self.lead(term),
            };
        }
        self.fence.clear();
        if let (Some(term), false) = (held, abandoned.load(Ordering::Relaxed)) {
            // Hand over at once rather than at the lease's expiry.
            let _ = self.etcd.revoke(term.lease);
            tracing::info!("resigned the leadership (lease revoked)");
        }
    }

    fn pause(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// One look at the leader key; a campaign if it is free.
    fn follow(&mut self) -> Option<HeldLease> {
        match self.etcd.get(&self.settings.key) {
            Ok(Some(kv)) => {
                let leader = serde_json::from_slice::<Leader>(&kv.value).ok();
                self.tx.send_if_modified(|role| {
                    let now = Role::Following(leader);
                    (*role != now).then(|| *role = now).is_some()
                });
                None
            }
            Ok(None) => self.campaign(),
            Err(e) => {
                if let Some(held) = self.said.allow(Instant::now()) {
                    tracing::warn!(error = %e, held, "leadership: etcd not reachable; following nobody");
                }
                self.tx.send_if_modified(|role| {
                    let now = Role::Following(None);
                    (*role != now).then(|| *role = now).is_some()
                });
                None
            }
        }
    }

    fn campaign(&mut self) -> Option<HeldLease> {
        let began = Instant::now();
        let (lease, ttl) = match self.etcd.grant(self.settings.ttl) {
            Ok(granted) => granted,
            Err(e) => {
                tracing::warn!(error = %e, "leadership: no lease granted");
                return None;
            }
        };
        let key = &self.settings.key;
        let txn = self.etcd.txn(
            vec![etcd::created_at(key, 0)],
            vec![etcd::put(key, &self.value, lease)],
            vec![etcd::range(key)],
        );
        match txn {
            Ok((true, answer)) => {
                let term = HeldLease {
                    lease,
                    created: etcd::revision(&answer),
                    ttl,
                    until: began + renew_deadline(ttl),
                };
                if Instant::now() >= term.until {
                    // Won too slowly to act on it.
                    let _ = self.etcd.revoke(lease);
                    return None;
                }
                self.fence.set(LeaderTerm {
                    created: term.created,
                    until: term.until,
                });
                tracing::info!(replica = %self.settings.me.replica, ttl = ?ttl, "leading");
                self.tx.send_replace(Role::Leading(Instant::now()));
                Some(term)
            }
            Ok((false, _)) | Err(_) => {
                let _ = self.etcd.revoke(lease);
                None
            }
        }
    }

    /// Renews a held term once, stepping down if it cannot.
    fn lead(&mut self, term: HeldLease) -> Option<HeldLease> {
        // Renewed every sixth of the TTL; a renewal that failed is tried
        // again soon, so one slow answer does not cost the term.
        let every = if self.failed_renewal {
            RENEW_RETRY
        } else {
            term.ttl / RENEWALS_PER_TTL
        };
        let next = Instant::now() + every;
        while Instant::now() < next.min(term.until) {
            if self.stop.load(Ordering::Relaxed) {
                return Some(term);
            }
            if self.fence.is_ended(term.created) {
                return self.step_down(term, SteppedDown::WriteRefused);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if Instant::now() >= term.until {
            return self.step_down(term, SteppedDown::NoRenewal(renew_deadline(term.ttl)));
        }
        if self.fence.is_ended(term.created) {
            return self.step_down(term, SteppedDown::WriteRefused);
        }
        let began = Instant::now();
        match self.etcd.keep_alive(term.lease) {
            Ok(Some(ttl)) => match self.etcd.get(&self.settings.key) {
                Ok(Some(kv)) if kv.create_revision == term.created && kv.lease == term.lease => {
                    let renewed = HeldLease {
                        ttl,
                        until: began + renew_deadline(ttl),
                        ..term
                    };
                    self.fence.set(LeaderTerm {
                        created: renewed.created,
                        until: renewed.until,
                    });
                    self.failed_renewal = false;
                    Some(renewed)
                }
                Ok(_) => self.step_down(term, SteppedDown::KeyTaken),
                Err(_) => {
                    self.failed_renewal = true;
                    Some(term)
                }
            },
            Ok(None) => self.step_down(term, SteppedDown::LeaseGone),
            Err(e) => {
                if let Some(held) = self.said.allow(Instant::now()) {
                    tracing::warn!(error = %e, held, "leadership: the lease not renewed; acting until the renew deadline");
                }
                self.failed_renewal = true;
                Some(term)
            }
        }
    }

    fn step_down(&mut self, term: HeldLease, why: SteppedDown) -> Option<HeldLease> {
        self.fence.clear();
        self.failed_renewal = false;
        tracing::error!(why = %why, "stepped down: no longer the leader");
        self.tx.send_replace(Role::Following(None));
        let _ = self.etcd.revoke(term.lease);
        // Not at once a candidate again: the orchestrator of the term
        // that ended must see it end first.
        self.pause(POLL * 2);
        None
    }
}

/// An orchestrator replica (design §12): campaigns on etcd, follows (its
/// agent listener refusing nodes with a pointer to the leader) and, for
/// each term it leads, runs an [`Orchestrator`] over the state in etcd.
///
/// ```no_run
/// # async fn example(config: poolgate::Config) -> Result<(), poolgate::live::LiveError> {
/// use poolgate::live::replica::Replica;
///
/// let mut replica = Replica::start(&config)?;
/// loop {
///     let live = replica.lead(None).await?; // follows until it leads
///     let mut events = live.gate.subscribe();
///     loop {
///         tokio::select! {
///             event = events.recv() => match event {
///                 Some(event) => println!("{event:?}"),
///                 None => break,
///             },
///             _ = replica.lost() => break, // stepped down: stop acting
///         }
///     }
///     live.shutdown();
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Replica {
    config: crate::Config,
    etcd: Arc<Etcd>,
    store: Arc<EtcdStore>,
    fence: Arc<Fence>,
    campaign: Campaign,
    me: Leader,
    /// The highest epoch this replica has seen stored: a store holding
    /// less was wiped or rolled back, and is refused.
    seen_epoch: u64,
    /// Whether this replica has seen the prefix written (a format
    /// record): finding it empty later means etcd's data was wiped.
    seen_written: bool,
    terms: u64,
    /// The term the running orchestrator belongs to (the leader key's
    /// create revision).
    term: Option<i64>,
    /// The SWIM member, kept warm while following (a member of the
    /// cluster with its view) and handed to each term's orchestrator;
    /// none if its socket was taken (another replica on this host): then
    /// each term starts its own.
    warm: Option<super::orchestrator::WarmSwim>,
    /// Whether starting the warm member was tried.
    warmed: bool,
}

/// How often a follower looks at what is stored.
pub(crate) const FOLLOWER_LOOK: Duration = Duration::from_secs(1);

/// How long one etcd call of the store may take.
pub(crate) const STORE_CALL: Duration = Duration::from_secs(2);

impl Replica {
    /// Connects to `[state] etcd`, checks what the prefix holds (another
    /// cluster's state, a newer format, a damaged record: an error naming
    /// the key; no endpoint answering: an error naming them) and starts
    /// campaigning.
    pub fn start(config: &crate::Config) -> Result<Replica, LiveError> {
        let (etcd, prefix, fence, store, held) = open_store(config)?;
        let me = Leader {
            replica: replica_name(config),
            agents: advertised_agents(config),
        };
        let ttl = config.state.lease;
        // Renewals must be answered well within the renew deadline.
        let campaign_etcd = Arc::new(etcd_client(
            config,
            (ttl / RENEWALS_PER_TTL).min(Duration::from_secs(1)),
        )?);
        let campaign = Campaign::start(
            campaign_etcd,
            CampaignSettings {
                key: store.key("leader"),
                me: me.clone(),
                ttl,
            },
            Arc::clone(&fence),
        );
        tracing::info!(replica = %me.replica, etcd = %etcd.endpoints(), %prefix, "replica started: campaigning");
        Ok(Replica {
            config: config.clone(),
            etcd,
            store,
            fence,
            campaign,
            me,
            seen_epoch: held.as_ref().map_or(0, |(d, _)| d.last_epoch),
            seen_written: held.is_some(),
            terms: 0,
            term: None,
            warm: None,
            warmed: false,
        })
    }

    /// This replica's name and agent address, as the leader key says them.
    pub fn me(&self) -> &Leader {
        &self.me
    }

    /// The role, as it changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.campaign.role()
    }

    /// Whether this replica may act now.
    pub fn leads(&self) -> bool {
        self.fence.current().is_some()
    }

    /// Runs asked of whichever replica leads, through this replica's etcd.
    pub fn requests(&self) -> super::requests::Requests {
        super::requests::Requests::new(Arc::clone(&self.store))
    }

    /// How many terms this replica has led.
    pub fn terms(&self) -> u64 {
        self.terms
    }

    /// Follows until this replica leads, then starts an orchestrator over
    /// the state etcd holds: epochs above every epoch stored, the active
    /// run restored (its restore grace starting now).
    pub async fn lead(
        &mut self,
        record: Option<poolgate_actors::Recording>,
    ) -> Result<Orchestrator, LiveError> {
        self.warm_up().await?;
        loop {
            let mut following = Following(
                follow(&self.config, self.campaign.role(), Arc::clone(&self.store)).await?,
            );
            let mut role = self.campaign.role();
            // While following, what is stored is looked at every second:
            // the epochs issued meanwhile, and whether the prefix is
            // written, are known at takeover.
            let mut look = tokio::time::interval(FOLLOWER_LOOK);
            while !matches!(*role.borrow_and_update(), Role::Leading(_)) || !self.leads() {
                tokio::select! {
                    changed = role.changed() => if changed.is_err() {
                        return Err(LiveError::Io(std::io::Error::other("the campaign ended")));
                    },
                    _ = look.tick() => {
                        let store = Arc::clone(&self.store);
                        if let Ok(Ok(Some((held, _)))) =
                            tokio::task::spawn_blocking(move || store.read_records()).await
                        {
                            self.seen_written = true;
                            self.seen_epoch = self.seen_epoch.max(held.last_epoch);
                        }
                    }
                }
            }
            following.0.abort();
            let _ = (&mut following.0).await;
            self.term = self.fence.current().map(|t| t.created);
            let Some(term) = self.term else { continue };
            // The term's store starts from what etcd holds now; its
            // writes land only in this term, on records unchanged since.
            let base = Arc::clone(&self.store);
            let (store, held) = tokio::task::spawn_blocking(move || base.bind(term))
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))??;
            self.seen_epoch = self.seen_epoch.max(self.store.written_epoch());
            if held.is_none() && (self.seen_written || self.store.written_epoch() > 0) {
                return Err(self.wiped(format!(
                    "{}: empty, though this replica saw it written",
                    String::from_utf8_lossy(&self.store.key(""))
                )));
            }
            let restored = held.map(|(d, _)| d).unwrap_or_default();
            if restored.last_epoch < self.seen_epoch {
                return Err(self.wiped(format!(
                    "{}state: holds epoch {} but this replica saw epoch {} stored",
                    String::from_utf8_lossy(&self.store.key("")),
                    restored.last_epoch,
                    self.seen_epoch
                )));
            }
            self.seen_epoch = restored.last_epoch;
            // A run found planning is aborted as the gate starts (design
            // §9): its end is the requests' server's first write.
            let aborted_at_start = restored
                .run
                .as_ref()
                .filter(|run| !run.committed)
                .map(|run| run.run.clone());
            let term_store = store;
            let store: Arc<dyn crate::state::OrchestratorStore> = term_store.clone();
            let settings = self.config.gate_settings().and_then(|settings| {
                settings.with_durable(poolgate_actors::DurableSettings {
                    store: store.clone(),
                    restored,
                    restore_grace: self.config.state.restore_grace,
                })
            })?;
            let leader: Arc<str> = Arc::from(format!("{} (this replica)", self.me));
            match Orchestrator::start_with(
                &self.config,
                vec![settings],
                Some(store),
                record.clone(),
                leader,
                self.warm.as_ref(),
            )
            .await
            {
                Ok(mut live) => {
                    let (fence, term) = (Arc::clone(&self.fence), self.term);
                    live.gate
                        .fence_with(move || fence.current().map(|t| t.created) == term);
                    let live_gate = live.gate.clone();
                    let pool = self.config.pool.clone();
                    live.attach(actix::spawn(super::requests::serve(
                        live_gate,
                        term_store,
                        pool,
                        aborted_at_start,
                    )));
                    self.terms += 1;
                    tracing::info!(replica = %self.me.replica, term = self.terms, "leading: the orchestrator started");
                    return Ok(live);
                }
                // Lost the term while starting (the first write refused):
                // follow again.
                Err(LiveError::Gate(e)) if !self.leads() => {
                    tracing::warn!(error = %e, "the term ended while starting; following");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The error for a prefix holding less than this replica saw stored:
    /// `what` was found.
    fn wiped(&self, what: String) -> LiveError {
        LiveError::State(crate::state::StateError {
            file: format!("etcd {}", self.etcd.endpoints()),
            what: format!("{what}: etcd's data was wiped or rolled back; refusing to issue epochs again (restore etcd, or remove the prefix and restart every replica)"),
        })
    }

    /// Resolves when the term [`Replica::lead`] began is over: this
    /// replica may no longer act (checked every 20 ms against the renew
    /// deadline, whatever the campaign's thread is doing).
    pub async fn lost(&self) {
        // A term lost and a new one won between two looks is lost too.
        while self.term.is_some() && self.fence.current().map(|t| t.created) == self.term {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the SWIM member kept warm while following (once; also
    /// done by the first [`Replica::lead`]). A socket another process on
    /// this host holds is no error: each term then starts its own member.
    /// Must be called inside a running actix `System`.
    pub async fn warm_up(&mut self) -> Result<(), LiveError> {
        if self.warmed {
            return Ok(());
        }
        let started = super::orchestrator::WarmSwim::start(&self.config).await;
        self.warmed = true;
        match started {
            Ok(warm) => {
                tracing::info!(swim = %warm.addr(), "SWIM member started: kept warm while following");
                self.warm = Some(warm);
                Ok(())
            }
            Err(LiveError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse =>
            {
                tracing::info!("SWIM socket held by another process on this host: this replica starts its member when it leads");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Where the warm SWIM member answers (none before
    /// [`Replica::warm_up`], or when each term starts its own).
    pub fn swim_addr(&self) -> Option<std::net::SocketAddr> {
        self.warm.as_ref().map(super::orchestrator::WarmSwim::addr)
    }

    /// How many other members the warm SWIM member knows (none without
    /// one).
    pub async fn swim_members(&self) -> Option<usize> {
        match &self.warm {
            Some(warm) => warm.members().await,
            None => None,
        }
    }

    /// What reloads the warm SWIM member's gossip keyring (SIGHUP, while
    /// following or leading: each term's orchestrator uses that member).
    pub fn swim_keys(&self) -> Option<super::orchestrator::SwimKeys> {
        self.warm.as_ref().map(super::orchestrator::WarmSwim::keys)
    }

    /// The highest epoch stored that this replica knows of.
    pub fn note_epoch(&mut self, epoch: u64) {
        self.seen_epoch = self.seen_epoch.max(epoch);
    }

    /// Stops campaigning and hands the leadership on at once.
    pub fn resign(self) {
        self.fence.clear();
        self.campaign.resign();
    }

    /// Stops campaigning as a crashed process would (the lease left to
    /// expire); for tests of takeovers, and an embedder's own crash drills.
    pub fn abandon(self) {
        self.fence.clear();
        self.campaign.abandon();
    }
}

/// What [`open_store`] gives: the client, the prefix, the store's fence,
/// the store and what it held.
type OpenStore = (
    Arc<Etcd>,
    String,
    Arc<Fence>,
    Arc<EtcdStore>,
    Option<(
        crate::core::Durable,
        std::collections::BTreeMap<String, u64>,
    )>,
);

/// `[state] etcd`'s store, checked (another cluster's prefix, a newer
/// format, a damaged record, no endpoint: an error naming it), with a
/// fence of its own and what it holds.
fn open_store(config: &crate::Config) -> Result<OpenStore, LiveError> {
    let bad = |message: String| LiveError::Setting {
        key: "state.etcd",
        message,
    };
    if !config.state.insecure {
        if let Some(plain) = config.state.etcd.iter().find(|e| e.starts_with("http://")) {
            return Err(bad(format!(
                "{plain}: plain http is refused; set [state] insecure = true to accept it"
            )));
        }
        if config.state.key.is_none() {
            return Err(LiveError::Setting {
                key: "state.key",
                message: "[state] etcd needs a key (poolgate keygen --cluster), or insecure = true"
                    .into(),
            });
        }
    }
    let etcd = Arc::new(etcd_client(config, STORE_CALL)?);
    let key = match &config.state.key {
        Some(path) => {
            let key = crate::keys::ClusterKey::load(path).map_err(|e| LiveError::Setting {
                key: "state.key",
                message: e.to_string(),
            })?;
            Some(crate::state::mac::StateKey::from_bytes(key.0))
        }
        None => None,
    };
    if config.state.insecure {
        tracing::warn!(
            mac = key.is_some(),
            "[state] insecure = true: plain http to etcd is accepted{}",
            if key.is_some() {
                ""
            } else {
                ", and its records and requests carry no MAC: anyone who reaches etcd can rewrite the gate"
            }
        );
    }
    let prefix = config.state.prefix.clone().unwrap_or_else(|| {
        crate::state::etcd::default_prefix(&config.swim.label, config.pool.id().as_str())
    });
    let fence = Arc::new(Fence::default());
    let store = Arc::new(
        EtcdStore::new(
            Arc::clone(&etcd),
            &prefix,
            &config.swim.label,
            config.pool.id().as_str(),
            Arc::clone(&fence),
        )
        .with_key(key),
    );
    let held = store.read_records()?;
    Ok((etcd, prefix, fence, store, held))
}

/// A client of `[state] etcd`, each call bounded by `timeout`, over TLS
/// as `ca_file`, `cert_file` and `key_file` say, authenticated as `[state] username` with the password in
/// `password_file` when they are given.
fn etcd_client(config: &crate::Config, timeout: Duration) -> Result<Etcd, LiveError> {
    let etcd = Etcd::new(&config.state.etcd, timeout).map_err(|message| LiveError::Setting {
        key: "state.etcd",
        message,
    })?;
    let etcd = etcd
        .with_tls(&config.state.tls)
        .map_err(|message| LiveError::Setting {
            key: "state",
            message,
        })?;
    let Some((user, file)) = config
        .state
        .username
        .as_ref()
        .zip(config.state.password_file.as_ref())
    else {
        return Ok(etcd);
    };
    let password = std::fs::read_to_string(file).map_err(|e| LiveError::Setting {
        key: "state.password_file",
        message: format!("{}: {e}", file.display()),
    })?;
    let password = password.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(LiveError::Setting {
            key: "state.password_file",
            message: format!("{}: empty", file.display()),
        });
    }
    Ok(etcd.with_auth(user, password))
}

/// Runs asked of whichever replica leads, by a process that is not a
/// replica itself (`poolgate run --end`).
#[doc(hidden)]
pub fn requests_of(config: &crate::Config) -> Result<super::requests::Requests, LiveError> {
    let (_, _, _, store, _) = open_store(config)?;
    Ok(super::requests::Requests::new(store))
}

/// The replica's name: `[swim] advertise`, else the agent listener.
fn replica_name(config: &crate::Config) -> String {
    match &config.swim.advertise {
        Some(advertise) => advertise.as_str().to_string(),
        None => config.agents.listen.to_string(),
    }
}

/// Where nodes reach this replica's agent listener: its address, or on
/// an unspecified one, `[swim] advertise`'s host with the listener's port.
fn advertised_agents(config: &crate::Config) -> String {
    let listen = config.agents.listen;
    match (&config.swim.advertise, listen.ip().is_unspecified()) {
        (Some(advertise), true) => {
            let text = advertise.as_str();
            let host = text.rsplit_once(':').map_or(text, |(host, _)| host);
            format!("{host}:{}", listen.port())
        }
        _ => listen.to_string(),
    }
}

/// The follower listener, stopped when dropped (a `lead` given up).
struct Following(tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// At most this many follower connections are served at once.
pub(crate) const FOLLOWER_CONNECTIONS: usize = 256;

/// A follower's agent listener: every node is refused with `not_leader`
/// and a pointer to the leader; `poolgate status` is told who leads.
async fn follow(
    config: &crate::Config,
    role: watch::Receiver<Role>,
    store: Arc<EtcdStore>,
) -> Result<tokio::task::JoinHandle<()>, LiveError> {
    let addr = config.agents.listen;
    let bound = |source| LiveError::Bind {
        socket: "agent listener (TCP)",
        addr,
        source,
    };
    let listener =
        super::orchestrator::until_free(|| super::listener::listen(addr).map_err(bound)).await?;
    let pool = config.pool.id().to_string();
    let slots = Arc::new(tokio::sync::Semaphore::new(FOLLOWER_CONNECTIONS));
    Ok(actix::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            while connections.try_join_next().is_some() {}
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                continue; // dropped: closed at once
            };
            let leader = role.borrow().clone();
            let (pool, store) = (pool.clone(), Arc::clone(&store));
            connections.spawn(async move {
                let _slot = slot;
                refuse_as_follower(&mut stream, &pool, leader, store).await;
            });
        }
    }))
}

async fn refuse_as_follower(
    stream: &mut tokio::net::TcpStream,
    pool: &str,
    role: Role,
    store: Arc<EtcdStore>,
) {
    use tokio::io::AsyncWriteExt;
    let leader = match role {
        Role::Following(Some(leader)) => Some(leader),
        _ => None,
    };
    let first = tokio::time::timeout(
        super::listener::FIRST_FRAME,
        super::wire::read_prefixed(stream, super::wire::MAX_FRAME),
    )
    .await;
    let Ok(Ok(Some(bytes))) = first else { return };
    if super::status::is_status_query(&bytes) {
        let said = super::requests::leader_said(store).await;
        let answer = super::status::follower_answer(
            pool,
            leader.as_ref().map(|l| l as &dyn std::fmt::Display),
            said,
        );
        let _ = tokio::time::timeout(
            super::listener::FIRST_FRAME,
            super::status::write_answer(stream, &answer),
        )
        .await;
        return;
    }
    let detail = match &leader {
        Some(leader) => format!("not the leader; the leader is {leader}"),
        None => "not the leader; no replica leads right now".to_string(),
    };
    let reply = super::wire::encode_reply(&super::wire::Reply::Refused {
        code: super::wire::NOT_LEADER.to_string(),
        detail,
    });
    let _ = tokio::time::timeout(super::listener::FIRST_FRAME, stream.write_all(&reply)).await;
}
