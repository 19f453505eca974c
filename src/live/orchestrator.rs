//! The orchestrator's side of the live cluster, as one embeddable piece:
//! the gate, a SWIM member whose membership feeds it, and the agent
//! listener where node agents announce themselves (design §7).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = poolgate::Config::load("config.toml".as_ref())?;
//! let live = poolgate::live::Orchestrator::start(&config).await?;
//! let ready = live.gate.wait_ready().await?;
//! # Ok(()) }
//! ```
//!
//! The registry (`[registry]`) is the `known` fact: each entry is fed at
//! start. An agent frame counts only if its node is in the registry, its
//! signature is the pinned key's, and its sequence exceeds the last one
//! accepted from that node; anything else is refused, counted
//! (`poolgate_agent_frames_refused_total`, by reason), logged without its
//! content, and its connection closed. A node that announces it is leaving
//! is reported `left` (SWIM alone cannot tell a leave from a crash).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use actix::Addr;
use poolgate_actors::core::{NodeId, PoolPhase};
use poolgate_actors::{Fleet, Gate};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::generation::{unix_ms, GenerationFile};
use super::keys::PublicKey;
use super::listener::{listen, lock, pinned, Listener, Registry};
use super::nodes::{Kept, Nodes};
use super::swim::keyring;
use super::swim::member::{boot_generation, Join, SetKeyring};
use super::swim::tracker::SwimFact;
use super::swim::SwimMember;
use super::throttle::LOG_EVERY;
use super::LiveError;
use crate::config::endpoint::lookup_all;
use crate::config::{Config, SwimConfig};

/// The orchestrator's live side: gate, SWIM member, agent listener.
///
/// ```no_run
/// use poolgate::live::Orchestrator;
/// use poolgate::Config;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::load("config.toml".as_ref())?;
/// actix::System::new().block_on(async move {
///     let live = Orchestrator::start(&config).await?;
///     let mut events = live.gate.subscribe();
///     while let Some(event) = events.recv().await {
///         println!("{}", serde_json::to_string(&event)?);
///     }
///     live.shutdown();
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })
/// # }
/// ```
///
/// Started on loopback with no keys (a test):
///
/// ```
/// use poolgate::live::Orchestrator;
/// use poolgate::Config;
///
/// let config = Config::parse(
///     "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
///      [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
///     "inline",
/// )
/// .unwrap();
/// actix::System::new().block_on(async move {
///     let live = Orchestrator::start(&config).await.unwrap();
///     assert!(live.agents_addr.port() != 0);
///     let report = live.gate.report().await.unwrap();
///     assert_eq!(report.candidates.len(), 1);
///     live.shutdown();
/// });
/// ```
pub struct Orchestrator {
    /// The first pool's gate (the only one with `[pool]`).
    pub gate: Gate,
    /// Every pool (design §14), fed by SWIM and the agents: each fact
    /// reaches the pools that have its node.
    pub fleet: Fleet,
    /// The orchestrator's SWIM member (an actix address: not part of the
    /// API).
    swim: Addr<SwimMember>,
    /// Whether the SWIM member goes with the orchestrator (a replica's
    /// warm member outlives its terms: it is only detached).
    owns_swim: bool,
    /// The UDP address the SWIM member answers on (the nodes' seed).
    pub swim_addr: SocketAddr,
    /// The TCP address the agent listener accepts on.
    pub agents_addr: SocketAddr,
    /// The listener (its connections end with it), the sequence writer
    /// and the readiness gauge: stopped by [`Orchestrator::shutdown`].
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The nodes known and their pinned keys (`[registry]`, then
    /// [`Orchestrator::register`] and [`Orchestrator::unregister`]).
    registry: Registry,
    /// What the listener keeps per node (sequences, signed identities).
    nodes: Arc<Mutex<Nodes>>,
    /// This orchestrator's attachment to its SWIM member (a warm one is
    /// detached only by the term that attached it).
    attachment: u64,
    /// The durable store, if any: a pool defined by a reload keeps its
    /// state there too.
    store: Option<Arc<dyn crate::state::OrchestratorStore>>,
}

impl Orchestrator {
    /// Starts the gate, the SWIM member and the agent listener from
    /// `config`. Must be called inside a running actix `System`.
    pub async fn start(config: &Config) -> Result<Orchestrator, LiveError> {
        Orchestrator::start_recording(config, None).await
    }

    /// As [`Orchestrator::start`], recording every input the gate applies
    /// into `record` (`--record`).
    pub async fn start_recording(
        config: &Config,
        record: Option<poolgate_actors::Recording>,
    ) -> Result<Orchestrator, LiveError> {
        if !config.state.etcd.is_empty() {
            return Err(LiveError::Setting {
                key: "state.etcd",
                message: "replicas start through live::replica::Replica (one Orchestrator per leadership term), as poolgate watch does".into(),
            });
        }
        let (pools, store) = config.pool_settings_with_store(None)?;
        Orchestrator::start_with(config, pools, store, record, Arc::from(LEADER), None).await
    }

    /// Starts from gate settings already holding the store (`store`, which
    /// also keeps agent sequences), answering status with `leader`.
    pub(crate) async fn start_with(
        config: &Config,
        mut pools: Vec<poolgate_actors::GateSettings>,
        store: Option<Arc<dyn crate::state::OrchestratorStore>>,
        record: Option<poolgate_actors::Recording>,
        leader: Arc<str>,
        warm: Option<&WarmSwim>,
    ) -> Result<Orchestrator, LiveError> {
        // Checked before anything starts (the member may be warm already).
        keyring(&config.swim)?;
        // A recording is one gate's: with several pools, said and refused
        // rather than a file that replays one pool's half of the story.
        if record.is_some() && pools.len() > 1 {
            return Err(LiveError::Setting {
                key: "pools",
                message: "--record records one pool in this version: record a [pool] configuration, or one pool with run --pool".into(),
            });
        }
        if let Some(first) = pools.first_mut() {
            first.record = record;
        }
        check_live(config)?;
        let fleet = Fleet::try_start(pools)?;
        let gate = fleet
            .pool(config.pool.id())
            .ok_or(poolgate_actors::GateError::UnknownPool(
                config.pool.id().clone(),
            ))?;
        for pool in config.pool_definitions() {
            for node in pool.members() {
                if !config.registry.contains_key(node) {
                    tracing::warn!(pool = %pool.id(), %node, "pool member is not in [registry]: its frames will be refused and the pool can never be ready");
                }
            }
        }
        for node in config.registry.keys() {
            fleet
                .registry(poolgate_actors::core::RegistryFact::Known { node: node.clone() })
                .await?;
        }
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let registry: Registry = Arc::new(std::sync::RwLock::new(config.registry.clone()));
        let mut tasks = Vec::new();
        let kept = store.clone();
        if let Some(store) = store {
            // Replay protection across restarts: the last sequence accepted
            // per node, kept in the state file.
            let stored = store
                .sequences()
                .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
            lock(&nodes).last_seq = restore_sequences(stored, &config.registry);
            tasks.push(actix::spawn(keep_sequences(
                store,
                Arc::clone(&nodes),
                Arc::clone(&registry),
            )));
        }
        let sink: super::swim::member::MembershipSink = {
            let (fleet, nodes) = (fleet.clone(), Arc::clone(&nodes));
            Box::new(move |fact: SwimFact| {
                let kept = lock(&nodes).observe(fact);
                let new = kept.is_new();
                if let Kept::ForGate(update) = kept {
                    tracing::debug!(node = %update.node, state = %update.state, incarnation = update.incarnation, "SWIM change");
                    fleet.membership_nowait(update);
                }
                new
            })
        };
        // This term's gate fed by the member, with what it wants of it:
        // its registry's names, its nodes' signed identities.
        let attachment = ATTACHMENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let attach = super::swim::member::Attach {
            token: attachment,
            sink,
            signed: Arc::clone(&lock(&nodes).signed_view),
            // The gate's fence (a replica's term) says when the term is
            // over, by its own clock.
            term_lasts: {
                let gate = gate.clone();
                Arc::new(move || !gate.is_stopped())
            },
            only: registry_names(&registry),
        };
        let (swim, swim_addr, owns_swim) = match warm {
            // A replica's member, warm since it followed: fed to this
            // term's gate from the whole view it already holds.
            Some(warm) => {
                let member = warm.member.clone();
                member
                    .send(attach)
                    .await
                    .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
                if !config.swim.seeds.is_empty() {
                    let (seeds, _) = lookup_all(&config.swim.seeds).await;
                    member.do_send(Join { seeds });
                }
                (member, warm.addr, false)
            }
            None => {
                let (member, addr) = start_member(config, Some(attach)).await?;
                (member, addr, true)
            }
        };
        // A start that fails from here on lets the member go (its own) or
        // detaches this gate from it (a warm one).
        let mut unwind = Unwind {
            member: Some(swim.clone()),
            owned: owns_swim,
            attachment,
        };
        let bound = |source| LiveError::Bind {
            socket: "agent listener (TCP)",
            addr: config.agents.listen,
            source,
        };
        let listener = until_free(|| listen(config.agents.listen).map_err(bound)).await?;
        let agents_addr = listener.local_addr().map_err(bound)?;
        let accept = Listener::new(
            fleet.clone(),
            swim.clone(),
            Arc::clone(&registry),
            config,
            Arc::clone(&nodes),
            leader,
        );
        tasks.push(actix::spawn(accept.serve(listener)));
        tasks.push(actix::spawn(keep_readiness_gauge(fleet.clone())));
        tracing::info!(%swim_addr, %agents_addr, pools = fleet.pools().len(), "orchestrator started");
        unwind.member = None;
        Ok(Orchestrator {
            gate,
            fleet,
            swim,
            owns_swim,
            swim_addr,
            agents_addr,
            tasks,
            registry,
            nodes,
            attachment,
            store: kept,
        })
    }

    /// Replaces the gossip keyring with `[swim]`'s keys as they are now
    /// (rotation: add the new key to every ring, make it first, remove the
    /// old one).
    pub fn reload_cluster_keys(&self, swim: &SwimConfig) -> Result<(), LiveError> {
        SwimKeys(self.swim.clone()).reload(swim)
    }

    /// Stops everything the orchestrator started: the listener (closing
    /// every agent connection), the sequence writer, the readiness gauge
    /// and the SWIM member, as a stopped orchestrator process would. The
    /// gate's actors go when the `System` stops.
    pub fn shutdown(self) {
        self.fleet.stop();
        for task in &self.tasks {
            task.abort();
        }
        self.release_swim();
    }

    /// Stops the SWIM member, or detaches a warm one from this gate.
    fn release_swim(&self) {
        if self.owns_swim {
            self.swim.do_send(super::swim::member::Crash);
        } else {
            self.swim
                .do_send(super::swim::member::Detach(self.attachment));
        }
    }

    /// Pins `key` for `node` from now on, as a `[registry]` entry would:
    /// a node added (the gate is told it is `known`, its frames are
    /// checked against `key`, SWIM facts about it are kept), or a node's
    /// key replaced (its frame sequences start over with the new key).
    pub async fn register(&self, node: NodeId, key: PublicKey) -> Result<(), LiveError> {
        let fact = poolgate_actors::core::RegistryFact::Known { node: node.clone() };
        self.change_registry(fact, |registry| {
            registry.insert(node.clone(), key) != Some(key)
        })
        .await
    }

    /// Forgets `node`, as removing its `[registry]` entry and restarting
    /// would, without the restart: the gate is told it is `forgotten` (a
    /// committed run requiring it faults), its frames are refused from
    /// its next one on (closing its connection), SWIM facts about it are
    /// no longer taken in. Forgetting a node not registered changes nothing.
    pub async fn unregister(&self, node: &NodeId) -> Result<(), LiveError> {
        let fact = poolgate_actors::core::RegistryFact::Forgotten { node: node.clone() };
        self.change_registry(fact, |registry| registry.remove(node).is_some())
            .await
    }

    /// Applies `change` to the registry; if it changed the node's key
    /// (`true`), drops the node's sequences, keeps SWIM facts of the
    /// registry's names only and tells the gate `fact`. Under the nodes'
    /// lock, as the listener accepts a frame: a frame of the old key is
    /// accepted before the change or refused after it, and the old key's
    /// sequences go with it (a thief's 2^64 − 1 does not lock a new key
    /// out).
    async fn change_registry(
        &self,
        fact: poolgate_actors::core::RegistryFact,
        change: impl FnOnce(&mut std::collections::BTreeMap<NodeId, PublicKey>) -> bool,
    ) -> Result<(), LiveError> {
        if self.gate.is_stopped() {
            return Err(poolgate_actors::GateError::Stopped.into());
        }
        let node = match &fact {
            poolgate_actors::core::RegistryFact::Known { node }
            | poolgate_actors::core::RegistryFact::Forgotten { node } => node.clone(),
        };
        let names = {
            let mut nodes = lock(&self.nodes);
            let mut registry = self
                .registry
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !change(&mut registry) {
                None
            } else {
                nodes.last_seq.remove(&node);
                Some(registry.keys().map(|n| n.to_string()).collect())
            }
        };
        let Some(names) = names else {
            return Ok(());
        };
        self.swim.do_send(super::swim::member::OnlyMembers(names));
        self.fleet.registry(fact).await?;
        Ok(())
    }

    /// Applies what changed in `config` (SIGHUP, `systemctl reload`):
    /// nodes added to `[registry]` or whose key was replaced are
    /// registered, nodes removed are forgotten ([`Orchestrator::register`],
    /// [`Orchestrator::unregister`]), the pool is redefined if its members
    /// changed, and the cluster keys are read again. The pool's
    /// definition does not change under a committed run (the run's nodes
    /// were checked against it): then the registry changes and the pool's
    /// does not, said in the answer, and a SIGHUP once the run has ended
    /// applies it. A pool of another id is refused (that is a new pool,
    /// not a reload). Returns what changed, one line each.
    pub async fn reload(&self, config: &Config) -> Result<Vec<String>, LiveError> {
        let mut said = Vec::new();
        let running = self.fleet.pools();
        if config.pools.is_empty() && !running.contains(config.pool.id()) {
            return Err(LiveError::Setting {
                key: "pool.id",
                message: format!(
                    "{} is not the running pool {}: a new pool needs a restart",
                    config.pool.id(),
                    running
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let before = self.registered();
        for (node, key) in &config.registry {
            match before.get(node) {
                Some(old) if old == key => {}
                Some(_) => {
                    self.register(node.clone(), *key).await?;
                    said.push(format!("{node}: key replaced"));
                }
                None => {
                    self.register(node.clone(), *key).await?;
                    said.push(format!("{node}: registered"));
                }
            }
        }
        for node in before.keys().filter(|n| !config.registry.contains_key(*n)) {
            self.unregister(node).await?;
            said.push(format!("{node}: forgotten (removed from [registry])"));
        }
        let settings = match config.pools.is_empty() {
            true => vec![config.gate_settings()?],
            false => config.pool_settings()?,
        };
        for pool in &settings {
            said.extend(self.reload_pool(pool, config.state.restore_grace).await?);
        }
        // With [pools.<id>], a pool no longer listed is removed.
        if !config.pools.is_empty() {
            for id in running
                .iter()
                .filter(|id| !settings.iter().any(|s| s.definition.id() == *id))
            {
                match self.fleet.remove_pool(id).await {
                    Ok(()) => said.push(format!("pool {id}: removed")),
                    Err(poolgate_actors::GateError::Refused(
                        poolgate_actors::core::Refusal::RunCommitted(run),
                    )) => said.push(format!(
                        "pool {id}: NOT removed while run {run} is committed (reload again once it ends)"
                    )),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.reload_cluster_keys(&config.swim)?;
        Ok(said)
    }

    /// Defines `settings`' pool if it is new, or redefines its members if
    /// they changed (not under a committed run); what changed, in words.
    async fn reload_pool(
        &self,
        settings: &poolgate_actors::GateSettings,
        restore_grace: std::time::Duration,
    ) -> Result<Option<String>, LiveError> {
        let definition = &settings.definition;
        let Some(gate) = self.fleet.pool(definition.id()) else {
            // A new pool keeps its state where the others keep theirs
            // (its own record: a pool defined again goes on from it).
            let mut settings = settings.clone();
            if let Some(store) = &self.store {
                let (record, restored) =
                    Arc::clone(store)
                        .pool_record(definition.id())
                        .map_err(|e| {
                            LiveError::Io(std::io::Error::other(format!("the state file: {e}")))
                        })?;
                settings = settings.with_durable(poolgate_actors::DurableSettings {
                    store: record,
                    restored,
                    restore_grace,
                })?;
            }
            self.fleet.define_pool(settings).await?;
            return Ok(Some(format!(
                "pool {}: defined over [{}]",
                definition.id(),
                definition
                    .members()
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let report = gate.report().await?;
        let now: std::collections::BTreeSet<&NodeId> =
            report.candidates.iter().map(|c| &c.node).collect();
        let wanted: std::collections::BTreeSet<&NodeId> = definition.members().iter().collect();
        if now == wanted {
            return Ok(None);
        }
        let added: Vec<String> = wanted.difference(&now).map(|n| n.to_string()).collect();
        let removed: Vec<String> = now.difference(&wanted).map(|n| n.to_string()).collect();
        let change = format!(
            "pool {} members: added [{}], removed [{}]",
            report.pool,
            added.join(", "),
            removed.join(", ")
        );
        match self.fleet.define_pool(settings.clone()).await {
            Ok(_) => Ok(Some(change)),
            Err(poolgate_actors::GateError::Refused(
                poolgate_actors::core::Refusal::RunCommitted(run),
            )) => Ok(Some(format!(
                "{change}: NOT applied while run {run} is committed (reload again once it ends)"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// The nodes registered now and their pinned keys.
    pub fn registered(&self) -> std::collections::BTreeMap<NodeId, PublicKey> {
        self.registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Keeps `task` running for as long as the orchestrator does.
    pub(crate) fn attach(&mut self, task: tokio::task::JoinHandle<()>) {
        self.tasks.push(task);
    }

    /// As [`Orchestrator::shutdown`], returning once its sockets are
    /// closed (the listener's task ended, the SWIM member stopped), so the
    /// same addresses can be bound again at once (a replica's next term).
    pub async fn stop(self) {
        self.fleet.stop();
        for task in &self.tasks {
            task.abort();
        }
        self.release_swim();
        for task in self.tasks {
            let _ = task.await;
        }
        if !self.owns_swim {
            return;
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.swim.connected() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// Names each orchestrator's attachment to its SWIM member.
static ATTACHMENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The names of `registry`'s nodes (what a SWIM member keeps).
fn registry_names(registry: &Registry) -> std::collections::HashSet<String> {
    registry
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .keys()
        .map(|n| n.to_string())
        .collect()
}

/// Undoes a start that failed after the SWIM member was attached.
struct Unwind {
    member: Option<Addr<SwimMember>>,
    owned: bool,
    attachment: u64,
}

impl Drop for Unwind {
    fn drop(&mut self) {
        match (self.member.take(), self.owned) {
            (Some(member), true) => member.do_send(super::swim::member::Crash),
            (Some(member), false) => member.do_send(super::swim::member::Detach(self.attachment)),
            (None, _) => {}
        }
    }
}

/// A SWIM member started from `[swim]` ahead of any gate: a replica's,
/// kept warm while it follows and handed to each term's orchestrator.
/// It stops when dropped.
pub(crate) struct WarmSwim {
    member: Addr<SwimMember>,
    addr: SocketAddr,
}

impl WarmSwim {
    /// Starts `[swim]`'s member, reporting to nobody until a term's
    /// orchestrator takes it.
    pub(crate) async fn start(config: &Config) -> Result<WarmSwim, LiveError> {
        let (member, addr) = start_member(config, None).await?;
        Ok(WarmSwim { member, addr })
    }

    /// The UDP address it answers on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many other members it knows (none if it stopped).
    pub(crate) async fn members(&self) -> Option<usize> {
        self.member
            .send(super::swim::member::MemberCount)
            .await
            .ok()
    }

    /// What reloads its gossip keyring.
    pub(crate) fn keys(&self) -> SwimKeys {
        SwimKeys(self.member.clone())
    }
}

/// Reloads a running SWIM member's gossip keyring (SIGHUP).
#[derive(Clone)]
pub struct SwimKeys(Addr<SwimMember>);

impl SwimKeys {
    /// Replaces the keyring with `[swim]`'s keys as they are now.
    pub fn reload(&self, swim: &SwimConfig) -> Result<(), LiveError> {
        self.0.do_send(SetKeyring {
            keyring: keyring(swim)?,
        });
        Ok(())
    }
}

impl std::fmt::Debug for SwimKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwimKeys")
    }
}

impl std::fmt::Debug for WarmSwim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmSwim")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for WarmSwim {
    fn drop(&mut self) {
        self.member.do_send(super::swim::member::Crash);
    }
}

/// Starts `[swim]`'s member (its keys, timings, generation; only the
/// registry's names kept; joined to the seeds), feeding `attach`'s gate.
async fn start_member(
    config: &Config,
    attach: Option<super::swim::member::Attach>,
) -> Result<(Addr<SwimMember>, SocketAddr), LiveError> {
    let keyring = keyring(&config.swim)?;
    let cluster_size = u32::try_from(config.registry.len() + 1).unwrap_or(u32::MAX);
    // With a state file, the orchestrator's SWIM generation rises
    // across restarts whatever the clock does, as a node's does.
    let generation = match &config.state.path {
        Some(path) => GenerationFile::beside(path).next(unix_ms())?,
        None => boot_generation(),
    };
    let foca_config = config.swim.timings.foca_config(cluster_size);
    let (member, addr) = until_free(|| {
        SwimMember::start(
            "orchestrator",
            config.swim.bind,
            config.swim.advertise.as_ref(),
            generation,
            foca_config.clone(),
            StdRng::seed_from_u64(rand::random()),
            None,
            keyring.clone(),
        )
    })
    .await?;
    // Facts about names outside the registry could never count: not kept.
    member.do_send(super::swim::member::OnlyMembers(
        config.registry.keys().map(|n| n.to_string()).collect(),
    ));
    if let Some(attach) = attach {
        member.do_send(attach);
    }
    if !config.swim.seeds.is_empty() {
        let (seeds, failed) = lookup_all(&config.swim.seeds).await;
        if !failed.is_empty() {
            tracing::warn!(?failed, "swim.seeds: not resolved");
        }
        member.do_send(Join { seeds });
    }
    Ok((member, addr))
}

/// `bind` again while its address is still held (for up to 2 s): the
/// sockets of a replica's previous term close as their tasks end.
pub(crate) async fn until_free<T>(
    mut bind: impl FnMut() -> Result<T, LiveError>,
) -> Result<T, LiveError> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match bind() {
            Err(LiveError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// How often accepted sequences are written to the state file: a frame
/// captured in the last interval before a crash could be replayed once
/// after a restart, never an older one.
#[doc(hidden)]
pub const SEQUENCES_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

async fn keep_sequences(
    store: Arc<dyn crate::state::OrchestratorStore>,
    nodes: Arc<Mutex<Nodes>>,
    registry: Registry,
) {
    let mut written = HashMap::new();
    let mut said = super::throttle::Throttle::new(LOG_EVERY);
    loop {
        tokio::time::sleep(SEQUENCES_EVERY).await;
        // Labelled with their keys under the nodes' lock, where a key is
        // replaced: a sequence is never stored under a key that did not
        // sign it.
        let (current, sequences) = {
            let held = lock(&nodes);
            if held.last_seq == written {
                continue;
            }
            let sequences: std::collections::BTreeMap<String, u64> = held
                .last_seq
                .iter()
                .map(|(node, seq)| (sequence_key(node, pinned(&registry, node).as_ref()), *seq))
                .collect();
            (held.last_seq.clone(), sequences)
        };
        // Off the actors' thread (a write ends with an fsync, every 100 ms
        // while nodes send frames), one at a time, in order.
        let writer = Arc::clone(&store);
        let saved = tokio::task::spawn_blocking(move || writer.save_sequences(&sequences)).await;
        let saved = saved.unwrap_or_else(|e| Err(crate::StoreError(e.to_string())));
        match saved {
            Ok(()) => written = current,
            Err(e) => {
                metrics::counter!("poolgate_state_write_errors_total").increment(1);
                if let Some(held) = said.allow(std::time::Instant::now()) {
                    tracing::error!(error = %e, held, "agent sequences not written (tried again every 100 ms)");
                }
            }
        }
    }
}

/// The live settings a `Config` built in code may hold that `config.toml`
/// would refuse (the gate's own are checked by [`Gate::try_start`]).
fn check_live(config: &Config) -> Result<(), LiveError> {
    let wrong = |key, message: &str| {
        Err(LiveError::Setting {
            key,
            message: message.to_string(),
        })
    };
    if config.pools.len() > 1 && !config.state.etcd.is_empty() {
        return wrong(
            "pools",
            "several [pools.<id>] keep their state in a state file ([state] path) in this version; among replicas ([state] etcd) one pool",
        );
    }
    let agents = &config.agents;
    if !(1..=1_000_000).contains(&agents.max_connections) {
        return wrong("agents.max_connections", "must be 1 to 1,000,000");
    }
    if let Some(problem) = crate::config::label_problem(&config.swim.label) {
        return wrong("swim.label", problem);
    }
    let timings = &config.swim.timings;
    let durations = [
        ("swim.probe_period", timings.probe_period),
        ("swim.probe_rtt", timings.probe_rtt),
        ("swim.suspicion_timeout", timings.suspicion_timeout),
        ("agents.idle_timeout", agents.idle_timeout),
    ];
    for (key, d) in durations {
        if let Some(problem) = poolgate_actors::duration_problem(d) {
            return wrong(key, problem);
        }
    }
    if timings.probe_rtt >= timings.probe_period {
        return wrong("swim.probe_rtt", "must be shorter than swim.probe_period");
    }
    Ok(())
}

/// How a node's last sequence is stored: `node@<key id>`, so that it
/// holds only for the key it was signed with.
fn sequence_key(node: &NodeId, key: Option<&PublicKey>) -> String {
    match key {
        Some(key) => format!("{node}@{}", key.id()),
        None => node.to_string(),
    }
}

/// The stored sequences that still hold: each for the node's key in
/// `registry` (a node whose key was replaced, after a theft say, starts
/// over: a thief's sequence of 2^64 − 1 cannot lock the node out for good).
/// Entries stored before keys were noted hold for the node.
fn restore_sequences(
    stored: std::collections::BTreeMap<String, u64>,
    registry: &std::collections::BTreeMap<NodeId, PublicKey>,
) -> HashMap<NodeId, u64> {
    let mut restored = HashMap::new();
    for (name, seq) in stored {
        let (node, key) = match name.rsplit_once('@') {
            Some((node, key)) if key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()) => {
                (node, Some(key))
            }
            _ => (name.as_str(), None),
        };
        let Ok(node) = NodeId::new(node) else {
            continue;
        };
        let pinned = registry.get(&node).map(PublicKey::id);
        match key {
            Some(key) if pinned.as_deref() != Some(key) => {
                tracing::info!(%node, "the node's key changed: its frame sequences start over");
            }
            _ => {
                restored.insert(node, seq);
            }
        }
    }
    restored
}

/// Which replica leads, as `poolgate status` says it (one orchestrator: no
/// replicas yet, design §12).
pub(crate) const LEADER: &str = "this orchestrator (no replicas configured)";

/// How often the per-node readiness gauge is brought up to date.
pub(crate) const GAUGE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Keeps `poolgate_node_ready{node}` (1 ready, 0 not) for every pool member:
/// its cardinality is the pool's size, never what the network sends.
async fn keep_readiness_gauge(fleet: Fleet) {
    loop {
        let Ok(reports) = fleet.reports().await else {
            // Its term (or the process) is over: it leads no more.
            metrics::gauge!("poolgate_leading").set(0.0);
            return;
        };
        if fleet.is_stopped() {
            metrics::gauge!("poolgate_leading").set(0.0);
            return;
        }
        metrics::gauge!("poolgate_leading").set(1.0);
        for report in &reports {
            let pool = report.pool.to_string();
            let (phase, epoch) = match report.phase {
                PoolPhase::Forming => ("forming", None),
                PoolPhase::Converging { .. } => ("converging", None),
                PoolPhase::Ready { epoch } => ("ready", Some(epoch.0)),
            };
            for each in ["forming", "converging", "ready"] {
                let now = if each == phase { 1.0 } else { 0.0 };
                metrics::gauge!("poolgate_pool_phase", "pool" => pool.clone(), "phase" => each)
                    .set(now);
            }
            if let Some(epoch) = epoch {
                metrics::gauge!("poolgate_pool_epoch", "pool" => pool.clone()).set(epoch as f64);
            }
            for candidate in &report.candidates {
                let ready = if candidate.verdict.is_ready() {
                    1.0
                } else {
                    0.0
                };
                metrics::gauge!("poolgate_node_ready", "node" => candidate.node.to_string(), "pool" => pool.clone())
                    .set(ready);
            }
        }
        tokio::time::sleep(GAUGE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::keys::NodeKey;

    #[test]
    fn a_stored_sequence_holds_only_for_the_key_it_was_signed_with() {
        // A thief with node-1's key sent sequence 2^64 − 1; node-1's key
        // was then replaced: its sequences start over, node-2's hold.
        let node1 = NodeId::new("node-1").unwrap();
        let node2 = NodeId::new("node-2").unwrap();
        let (stolen, fresh, other) = (
            NodeKey::generate().public(),
            NodeKey::generate().public(),
            NodeKey::generate().public(),
        );
        let stored = [
            (sequence_key(&node1, Some(&stolen)), u64::MAX),
            (sequence_key(&node2, Some(&other)), 7),
        ]
        .into_iter()
        .collect();
        let registry = [(node1.clone(), fresh), (node2.clone(), other)]
            .into_iter()
            .collect();
        let restored = restore_sequences(stored, &registry);
        assert_eq!(restored.get(&node1), None);
        assert_eq!(restored.get(&node2), Some(&7));
        // Stored before keys were noted: holds for the node.
        let old = [("node-1".to_string(), 9)].into_iter().collect();
        assert_eq!(restore_sequences(old, &registry).get(&node1), Some(&9));
    }
}
