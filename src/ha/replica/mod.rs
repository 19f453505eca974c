//! Leadership among orchestrator replicas on etcd (design §12).
//!
//! Each replica campaigns for the `leader` key under the state prefix,
//! created on a lease of `[state] lease` in one transaction that succeeds
//! only if the key does not exist. The leader renews its lease every
//! tenth of the TTL and may act only until two thirds of the TTL after
//! the start of its last successful renewal, by its own monotonic clock
//! (the lease cannot expire on etcd before the full TTL from then): a
//! leader that cannot reach etcd stops acting before any other replica
//! can lead. Followers read the key every `POLL` and campaign when it is
//! gone. All of it runs on a thread of its own; what it decides reaches
//! the orchestrator through a [`Role`] watch and the store's [`Fence`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::live::{LiveError, Orchestrator};

mod campaign;
mod follower;
mod store;

use campaign::{Campaign, CampaignSettings};
pub use campaign::{Leader, Role, SteppedDown};
use follower::{follow, Following};
use store::{advertised_agents, etcd_client, open_store, replica_name};
pub use store::{etcd_answers, published_of, requests_of};

use crate::ha::etcd::Etcd;
use crate::state::etcd::{EtcdStore, Fence};

/// An orchestrator replica (design §12): campaigns on etcd, follows (its
/// agent listener refusing nodes with a pointer to the leader) and, for
/// each term it leads, runs an [`Orchestrator`] over the state in etcd.
///
/// ```no_run
/// # async fn example(config: poolgate::Config) -> Result<(), poolgate::live::LiveError> {
/// use poolgate::ha::replica::Replica;
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
    /// Each pool's record in etcd and what this replica saw of it: with
    /// `[pool]`, the prefix's own; with `[pools.<id>]`, one under
    /// `pools/<id>/` each (design §14).
    records: Vec<PoolRecord>,
    terms: u64,
    /// The term the running orchestrator belongs to (the leader key's
    /// create revision).
    term: Option<i64>,
    /// The SWIM member, kept warm while following (a member of the
    /// cluster with its view) and handed to each term's orchestrator;
    /// none if its socket was taken (another replica on this host): then
    /// each term starts its own.
    warm: Option<crate::live::orchestrator::WarmSwim>,
    /// Whether starting the warm member was tried.
    warmed: bool,
    /// The configuration read again by a reload (SIGHUP), for the next
    /// term to start from ([`Replica::reloads`]).
    reloaded: Reloads,
    /// Pools a reload removed from the file: the next term serves one
    /// still if its record in etcd holds a committed run (its run stays
    /// guarded until it ends), and forgets the others.
    removed: Vec<crate::config::PoolConfig>,
}

/// Where a reload (SIGHUP) leaves the configuration it read, for a
/// replica's next term: a term starts from its replica's file as last
/// read, not as it was at start. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Reloads(Arc<std::sync::Mutex<Option<crate::Config>>>);

impl Reloads {
    /// `config`, read again: the next term starts from it.
    pub fn put(&self, config: crate::Config) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(config);
    }

    /// `f` of the configuration a reload left, if any (left in place).
    fn peek<R>(&self, f: impl FnOnce(&crate::Config) -> R) -> Option<R> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(f)
    }

    fn take(&self) -> Option<crate::Config> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Whether a reload from `running` to `new` may change which pools the
/// replicas serve without a restart: both keep pools apart
/// (`[pools.<id>]`) under the same prefix.
fn pools_may_change(running: &crate::Config, new: &crate::Config) -> bool {
    !running.pools.is_empty() && !new.pools.is_empty() && new.etcd_prefix() == running.etcd_prefix()
}

/// One pool's durable state in etcd, and what this replica saw of it.
#[derive(Debug)]
struct PoolRecord {
    pool: poolgate_actors::core::PoolDefinition,
    store: Arc<EtcdStore>,
    /// The highest epoch this replica has seen stored: a store holding
    /// less was wiped or rolled back, and is refused.
    seen_epoch: u64,
    /// Whether this replica has seen the record written (a format
    /// record): finding it empty later means etcd's data was wiped.
    seen_written: bool,
}

impl PoolRecord {
    fn new(
        pool: poolgate_actors::core::PoolDefinition,
        store: Arc<EtcdStore>,
        held: Option<&crate::state::etcd::StoredRecords>,
    ) -> PoolRecord {
        PoolRecord {
            pool,
            store,
            seen_epoch: held.map_or(0, |(d, _)| d.last_epoch),
            seen_written: held.is_some(),
        }
    }

    /// Notes what a look at the store found.
    fn saw(&mut self, held: &crate::core::Durable) {
        self.seen_written = true;
        self.seen_epoch = self.seen_epoch.max(held.last_epoch);
    }
}

/// One pool's store for a term, and what it restores.
struct BoundPool {
    pool: poolgate_actors::core::PoolDefinition,
    store: Arc<EtcdStore>,
    restored: crate::core::Durable,
    /// A run the term found planning: the gate aborts it as it starts.
    aborted_at_start: Option<poolgate_actors::core::RunId>,
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
        if campaign::spare_through_etcd_election(ttl).is_zero() {
            tracing::warn!(lease = %crate::config::in_words(ttl), "[state] lease is too short to ride through an election of etcd's own (up to about 4 s): poolgate's leadership may move when etcd's leader changes (the default, 10s, rides through)");
        }
        // Renewals must be answered well within the renew deadline.
        let campaign_etcd = Arc::new(etcd_client(config, campaign::renewal_call_timeout(ttl))?);
        let campaign = Campaign::start(
            campaign_etcd,
            CampaignSettings {
                key: store.key("leader"),
                me: me.clone(),
                ttl,
            },
            Arc::clone(&fence),
        );
        let records = if config.pools.is_empty() {
            vec![PoolRecord::new(
                config.pool.clone(),
                Arc::clone(&store),
                held.as_ref(),
            )]
        } else {
            // Each pool's record, checked as the prefix's was.
            let mut records = Vec::new();
            for pool in config.pool_definitions() {
                let pool_store = Arc::new(store.for_pool(pool.id().as_str()));
                let held = pool_store.read_records()?;
                records.push(PoolRecord::new(pool, pool_store, held.as_ref()));
            }
            records
        };
        tracing::info!(replica = %me.replica, etcd = %etcd.endpoints(), %prefix, "replica started: campaigning");
        Ok(Replica {
            config: config.clone(),
            etcd,
            store,
            fence,
            campaign,
            me,
            records,
            terms: 0,
            term: None,
            warm: None,
            warmed: false,
            reloaded: Reloads::default(),
            removed: Vec::new(),
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

    /// Runs asked of whichever replica leads, through this replica's etcd
    /// (of its first pool: `run --pool` narrows the configuration to the
    /// pool it asks of).
    #[doc(hidden)]
    pub fn requests(&self) -> super::requests::Requests {
        let store = self.records.first().map_or(&self.store, |r| &r.store);
        super::requests::Requests::new(Arc::clone(store))
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
            // A follower's status tells what the leader published of each
            // pool.
            let published: follower::Published = Arc::new(std::sync::RwLock::new(
                self.records
                    .iter()
                    .map(|r| (r.pool.id().to_string(), Arc::clone(&r.store)))
                    .collect(),
            ));
            let mut following = Following(
                follow(&self.config, self.campaign.role(), Arc::clone(&published)).await?,
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
                        for record in &mut self.records {
                            let store = Arc::clone(&record.store);
                            if let Ok(Ok(Some((held, _)))) =
                                tokio::task::spawn_blocking(move || store.read_records()).await
                            {
                                record.saw(&held);
                            }
                        }
                        self.publish_reloaded_pools(&published);
                    }
                }
            }
            following.0.abort();
            let _ = (&mut following.0).await;
            if let Some(config) = self.reloaded.take() {
                self.adopt(config);
            }
            self.term = self.fence.current().map(|t| t.created);
            let Some(term) = self.term else { continue };
            self.keep_removed_pools_with_runs().await?;
            // The term's stores start from what etcd holds now; their
            // writes land only in this term, on records unchanged since.
            let (base, terms) = self.bind_all(term).await?;
            let store: Arc<dyn crate::state::OrchestratorStore> = base.clone();
            let settings = self
                .config
                .pool_settings()
                .map_err(LiveError::Gate)?
                .into_iter()
                .zip(&terms)
                .map(|(settings, bound)| {
                    settings.with_durable(poolgate_actors::DurableSettings {
                        store: bound.store.clone(),
                        restored: bound.restored.clone(),
                        restore_grace: self.config.state.restore_grace,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(LiveError::Gate)?;
            let leader: Arc<str> = Arc::from(format!("{} (this replica)", self.me));
            match Orchestrator::start_with(
                &self.config,
                settings,
                Some(store),
                record.clone(),
                leader,
                self.warm.as_ref(),
            )
            .await
            {
                Ok(mut live) => {
                    // The term is in doubt once a renewal and a half went
                    // by without one (etcd out of this replica's reach):
                    // connections all silent then are this replica's own
                    // cut, not the nodes' (design §15).
                    let (fence, doubt_after) = (
                        Arc::clone(&self.fence),
                        self.config.state.lease / crate::ha::etcd::RENEWALS_PER_TTL * 3 / 2,
                    );
                    live.doubt_term_when(Arc::new(move || {
                        fence.since_renewed().is_none_or(|d| d > doubt_after)
                    }));
                    // With `[pools.<id>]`, a pool a reload adds is served
                    // under this term too.
                    if !self.config.pools.is_empty() {
                        let (fence, term) = (Arc::clone(&self.fence), self.term);
                        live.serve_added_pools(crate::live::orchestrator::TermPools {
                            base,
                            prefix: self.config.etcd_prefix(),
                            term: term.unwrap_or_default(),
                            fence: Arc::new(move || fence.current().map(|t| t.created) == term),
                        });
                    }
                    for bound in terms {
                        let Some(gate) = live.fleet.pool(bound.pool.id()) else {
                            continue;
                        };
                        let (fence, term) = (Arc::clone(&self.fence), self.term);
                        gate.fence_with(move || fence.current().map(|t| t.created) == term);
                        live.attach(actix::spawn(super::requests::serve_in(
                            Some(live.fleet.clone()),
                            gate,
                            bound.store,
                            bound.pool,
                            bound.aborted_at_start,
                        )));
                    }
                    self.terms += 1;
                    tracing::info!(replica = %self.me.replica, terms_led = self.terms, term, "leading: the orchestrator started");
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

    /// Binds every record to the term created at `term`: the prefix's
    /// store (agent sequences; with `[pool]`, the pool's state too) and,
    /// with `[pools.<id>]`, each pool's; refuses a record holding less
    /// than this replica saw stored (etcd wiped or rolled back). Returns
    /// the prefix's term store and, per pool, its term store and what it
    /// restores.
    async fn bind_all(&mut self, term: i64) -> Result<(Arc<EtcdStore>, Vec<BoundPool>), LiveError> {
        let bind = |store: Arc<EtcdStore>| async move {
            tokio::task::spawn_blocking(move || store.bind(term))
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))?
                .map_err(LiveError::from)
        };
        let (base, base_held) = bind(Arc::clone(&self.store)).await?;
        let fleet = !self.config.pools.is_empty();
        let mut bound = Vec::with_capacity(self.records.len());
        for i in 0..self.records.len() {
            let (store, held) = if fleet {
                bind(Arc::clone(&self.records[i].store)).await?
            } else {
                (Arc::clone(&base), base_held.clone())
            };
            let record = &mut self.records[i];
            record.seen_epoch = record.seen_epoch.max(record.store.written_epoch());
            let where_ = String::from_utf8_lossy(&record.store.key("")).to_string();
            let restored = match held {
                Some((restored, _)) => restored,
                None if record.seen_written || record.store.written_epoch() > 0 => {
                    return Err(self.wiped(format!(
                        "{where_}: empty, though this replica saw it written"
                    )));
                }
                // A pool with no record yet: its epochs start above what
                // the prefix held before it kept pools apart, so no epoch
                // is told twice.
                None if fleet => {
                    let floor = base_held.as_ref().map(|(d, _)| d);
                    if let Some(run) = floor.and_then(|d| d.run.as_ref()) {
                        return Err(LiveError::State(crate::state::StateError {
                            file: format!("etcd {}", self.etcd.endpoints()),
                            what: format!(
                                "{}state holds run {} of the one-pool configuration ([pool]): end it with that configuration before defining [pools.<id>]: with a replica of it leading (poolgate watch), poolgate run --end {} --config <that configuration>",
                                String::from_utf8_lossy(&self.store.key("")),
                                run.run,
                                run.run
                            ),
                        }));
                    }
                    crate::state::etcd::new_pool_state(floor)
                }
                None => crate::core::Durable::default(),
            };
            let record = &mut self.records[i];
            if restored.last_epoch < record.seen_epoch {
                let seen = record.seen_epoch;
                return Err(self.wiped(format!(
                    "{where_}state: holds epoch {} but this replica saw epoch {seen} stored",
                    restored.last_epoch
                )));
            }
            record.seen_epoch = restored.last_epoch;
            // A run found planning is aborted as the gate starts (design
            // §9): its end is the requests' server's first write.
            let aborted_at_start = restored
                .run
                .as_ref()
                .filter(|run| !run.committed)
                .map(|run| run.run.clone());
            bound.push(BoundPool {
                pool: record.pool.clone(),
                store,
                restored,
                aborted_at_start,
            });
        }
        if fleet && base_held.is_none() {
            // The prefix's own state record (no pool's) exists, so that the
            // agent sequences written beside it read back whole.
            let writer = Arc::clone(&base);
            tokio::task::spawn_blocking(move || {
                poolgate_actors::StateStore::save(&*writer, &crate::core::Durable::default())
            })
            .await
            .map_err(|e| LiveError::Io(std::io::Error::other(e)))?
            .map_err(|e| LiveError::Gate(poolgate_actors::GateError::NotDurable(e.to_string())))?;
        }
        Ok((base, bound))
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
        let started = crate::live::orchestrator::WarmSwim::start(&self.config).await;
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
        self.warm
            .as_ref()
            .map(crate::live::orchestrator::WarmSwim::addr)
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
    pub fn swim_keys(&self) -> Option<crate::live::orchestrator::SwimKeys> {
        self.warm
            .as_ref()
            .map(crate::live::orchestrator::WarmSwim::keys)
    }

    /// The highest epoch stored that this replica knows of (of its first
    /// pool).
    pub fn note_epoch(&mut self, epoch: u64) {
        if let Some(record) = self.records.first_mut() {
            record.seen_epoch = record.seen_epoch.max(epoch);
        }
    }

    /// Where a reload (SIGHUP) leaves the configuration it read: the next
    /// term starts from it.
    pub fn reloads(&self) -> Reloads {
        self.reloaded.clone()
    }

    /// A follower's status answers for the pools a reload added as soon
    /// as it has read them (what the leader publishes of each), not only
    /// once this replica leads with them.
    fn publish_reloaded_pools(&self, published: &follower::Published) {
        let Some(added) = self.reloaded.peek(|new| {
            // Only what the next term would take.
            if !pools_may_change(&self.config, new) {
                return Vec::new();
            }
            new.pool_definitions()
                .iter()
                .map(|p| p.id().to_string())
                .collect::<Vec<_>>()
        }) else {
            return;
        };
        let mut published = published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for pool in added {
            if !published.iter().any(|(id, _)| *id == pool) {
                let store = Arc::new(self.store.for_pool(&pool));
                published.push((pool, store));
            }
        }
        published.sort_by(|a, b| a.0.cmp(&b.0));
    }

    /// Takes what a reload read for the terms to come: `[registry]` (what
    /// a term compares with the registry the replicas share, and writes
    /// if none is), the cluster keys, the pools' members and settings,
    /// `[readiness]` and `[planning]`, and pools added to
    /// `[pools.<id>]` (each with its own record, its epochs above any the
    /// prefix told). A pool removed from the file is served by the next
    /// term only while etcd holds a committed run of it (a run is never
    /// left unguarded: [`Replica::keep_removed_pools_with_runs`]), and
    /// a change between `[pool]` and `[pools.<id>]`, or one that would
    /// move the state's prefix (the first pool's id names it unless
    /// `[state] prefix` does), needs the replicas restarted: said, and
    /// the running pools kept.
    fn adopt(&mut self, new: crate::Config) {
        let ids = |config: &crate::Config| {
            config
                .pool_definitions()
                .iter()
                .map(|p| p.id().clone())
                .collect::<Vec<_>>()
        };
        self.config.registry = new.registry.clone();
        // A term that starts its own SWIM member (no warm one) starts it
        // with the keys as rotated.
        self.config.swim.cluster_keys = new.swim.cluster_keys.clone();
        self.config.swim.cluster_key_material = new.swim.cluster_key_material.clone();
        let (running, read) = (ids(&self.config), ids(&new));
        if running != read {
            if !pools_may_change(&self.config, &new) {
                tracing::warn!(running = ?running, read = ?read, prefix = %self.config.etcd_prefix(), "reload: this change of the pools needs every replica restarted (between [pool] and [pools.<id>], or one that moves the state's prefix: set [state] prefix to keep it); the next term keeps the running pools (and takes the registry read)");
                return;
            }
            let removed: Vec<_> = self
                .config
                .pools
                .iter()
                .filter(|p| !read.contains(p.definition.id()))
                .cloned()
                .collect();
            if !removed.is_empty() {
                let ids: Vec<String> = removed
                    .iter()
                    .map(|p| p.definition.id().to_string())
                    .collect();
                tracing::info!(pools = ?ids, "reload: pools removed: the next term serves one only while its run is committed");
            }
            self.removed.retain(|p| !read.contains(p.definition.id()));
            for pool in removed {
                if !self
                    .removed
                    .iter()
                    .any(|p| p.definition.id() == pool.definition.id())
                {
                    self.removed.push(pool);
                }
            }
            let added: Vec<String> = read
                .iter()
                .filter(|id| !running.contains(id))
                .map(ToString::to_string)
                .collect();
            if !added.is_empty() {
                tracing::info!(pools = ?added, "reload: pools added: served from the next term");
            }
        }
        self.config.pool = new.pool;
        self.config.pools = new.pools;
        self.config.convergence_window = new.convergence_window;
        self.config.planning = new.planning;
        // Each pool's record, in the pools' order: the ones held kept
        // (what this replica saw of them), a new one's from etcd at the
        // term's start.
        let mut held = std::mem::take(&mut self.records);
        self.records = self
            .config
            .pool_definitions()
            .into_iter()
            .map(
                |definition| match held.iter().position(|r| r.pool.id() == definition.id()) {
                    Some(at) => {
                        let mut record = held.swap_remove(at);
                        record.pool = definition;
                        record
                    }
                    None => {
                        let store = Arc::new(self.store.for_pool(definition.id().as_str()));
                        PoolRecord::new(definition, store, None)
                    }
                },
            )
            .collect();
        tracing::info!(
            "the configuration read again by the last reload: the next term starts from it"
        );
    }

    /// At a term's start: a pool a reload removed whose record in etcd
    /// holds a committed run (made by a leader whose file still had it)
    /// is served this term still, said so, so that its run stays guarded;
    /// the others are forgotten. Their records stay in etcd (a pool
    /// defined again goes on from its own).
    async fn keep_removed_pools_with_runs(&mut self) -> Result<(), LiveError> {
        self.note_pools_only_etcd_holds().await?;
        // Every record read first: a read that fails changes nothing (the
        // term does not start, and the next try looks again).
        let mut committed = Vec::with_capacity(self.removed.len());
        for pool in &self.removed {
            let store = Arc::new(self.store.for_pool(pool.definition.id().as_str()));
            let reading = Arc::clone(&store);
            let held = tokio::task::spawn_blocking(move || reading.read_records())
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))??;
            let run = held
                .as_ref()
                .and_then(|(durable, _)| durable.run.as_ref())
                .filter(|run| run.committed)
                .map(|run| run.run.clone());
            committed.push((store, run));
        }
        // Served last term for its run, maybe: decided again.
        let removed = std::mem::take(&mut self.removed);
        let gone =
            |id: &poolgate_actors::core::PoolId| removed.iter().any(|p| p.definition.id() == id);
        self.config.pools.retain(|p| !gone(p.definition.id()));
        self.records.retain(|r| !gone(r.pool.id()));
        for (pool, (store, run)) in removed.iter().zip(committed) {
            let id = pool.definition.id();
            let Some(run) = run else {
                tracing::info!(pool = %id, "a pool a reload removed is no longer served");
                continue;
            };
            tracing::warn!(pool = %id, %run, "a pool a reload removed is served this term still: its run is committed (reload again once it ends)");
            self.records
                .push(PoolRecord::new(pool.definition.clone(), store, None));
            self.config.pools.push(pool.clone());
            self.removed.push(pool.clone());
        }
        self.config
            .pools
            .sort_by(|a, b| a.definition.id().cmp(b.definition.id()));
        self.records.sort_by(|a, b| a.pool.id().cmp(b.pool.id()));
        Ok(())
    }

    /// With `[pools.<id>]`: a pool whose state etcd holds under this
    /// prefix but that this replica's file does not name (it was removed
    /// and this replica restarted, not reloaded) is looked at as a
    /// removed one: served while its record holds a committed run, over
    /// that run's required nodes, with `[readiness]` and `[planning]`.
    async fn note_pools_only_etcd_holds(&mut self) -> Result<(), LiveError> {
        if self.config.pools.is_empty() {
            return Ok(());
        }
        let (etcd, under) = (Arc::clone(&self.etcd), self.store.key("pools/"));
        let keys = tokio::task::spawn_blocking(move || etcd.keys_under(&under))
            .await
            .map_err(|e| LiveError::Io(std::io::Error::other(e)))?
            .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
        let under = String::from_utf8_lossy(&self.store.key("pools/")).into_owned();
        let mut ids: Vec<String> = keys
            .iter()
            .filter_map(|key| {
                let key = String::from_utf8_lossy(key);
                Some(key.strip_prefix(&under)?.split('/').next()?.to_string())
            })
            .collect();
        ids.sort();
        ids.dedup();
        for id in ids {
            let Ok(pool) = poolgate_actors::core::PoolId::new(&id) else {
                continue;
            };
            let known = self.config.pools.iter().chain(&self.removed);
            if known.into_iter().any(|p| *p.definition.id() == pool) {
                continue;
            }
            let store = Arc::new(self.store.for_pool(&id));
            let held = tokio::task::spawn_blocking(move || store.read_records())
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))??;
            let Some(run) = held
                .and_then(|(durable, _)| durable.run)
                .filter(|run| run.committed)
            else {
                continue;
            };
            let members = run.required.iter().map(|(node, _)| node.clone()).collect();
            let Ok(definition) = poolgate_actors::core::PoolDefinition::new(pool, members) else {
                continue;
            };
            self.removed.push(crate::config::PoolConfig {
                definition,
                convergence_window: self.config.convergence_window,
                planning: self.config.planning,
            });
        }
        Ok(())
    }

    /// Why this replica last stepped down (its lease not renewed in time,
    /// gone, its key taken, a write refused), if it has.
    pub fn stepped_down(&self) -> Option<SteppedDown> {
        self.campaign.stepped_down()
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
