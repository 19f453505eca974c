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

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use actix::Addr;
use poolgate_actors::core::PoolPhase;
use poolgate_actors::{Fleet, Gate};

use super::listener::{listen, lock, Listener, Registry};
use super::nodes::{Kept, Nodes};
use super::swim::keyring;
use super::swim::member::Join;
use super::swim::tracker::SwimFact;
use super::swim::SwimMember;
use super::LiveError;
use crate::config::endpoint::lookup_all;
use crate::config::{Config, SwimConfig};

mod registry;
mod sequences;
mod warm;

use registry::registry_names;
pub use sequences::SEQUENCES_EVERY;
use sequences::{keep_sequences, restore_sequences};
use warm::start_member;
pub use warm::SwimKeys;
pub(crate) use warm::{until_free, WarmSwim};

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
    /// With a store: the task that writes the agents' sequences to it,
    /// and the word that has it write them a last time and end
    /// ([`Orchestrator::stop`]).
    sequences: Option<(
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Sender<()>,
    )>,
    /// This orchestrator's attachment to its SWIM member (a warm one is
    /// detached only by the term that attached it).
    attachment: u64,
    /// The durable store, if any: a pool defined by a reload keeps its
    /// state there too; among replicas, the registry they share.
    store: Option<Arc<dyn crate::state::OrchestratorStore>>,
    /// Registry changes go one at a time (among replicas each is written
    /// before it applies).
    registry_changes: tokio::sync::Mutex<()>,
    /// Among replicas: what a pool a reload adds needs of the term.
    term_pools: std::sync::OnceLock<TermPools>,
    /// The request servers of pools added by a reload (stopped with the
    /// orchestrator).
    pool_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What a pool a reload adds among replicas needs of the term that leads:
/// its record under `pools/<id>/` of the prefix, bound to the term, the
/// term's fence, and a server of the runs asked of it through etcd (as
/// the pools the term started with have).
pub(crate) struct TermPools {
    /// The prefix's store, bound to the term.
    pub(crate) base: Arc<crate::state::etcd::EtcdStore>,
    /// The prefix the term serves (a file that names another cannot add
    /// pools to it: its next term would not find them).
    pub(crate) prefix: String,
    /// The term (the leader key's create revision).
    pub(crate) term: i64,
    /// Whether the term still leads.
    pub(crate) fence: Arc<dyn Fn() -> bool + Send + Sync>,
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
                message: "replicas start through ha::replica::Replica (one Orchestrator per leadership term), as poolgate watch does".into(),
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
        // One pool records as one gate (the recording replays on its own);
        // several as a fleet, in one file that names each pool.
        let mut fleet_record = None;
        match (record, pools.len()) {
            (Some(record), 1) => pools[0].record = Some(record),
            (record, _) => fleet_record = record,
        }
        check_live(config)?;
        let fleet = match fleet_record {
            Some(record) => Fleet::try_start_recording(pools, record)?,
            None => Fleet::try_start(pools)?,
        };
        let gate = fleet
            .pool(config.pool.id())
            .ok_or(poolgate_actors::GateError::UnknownPool(
                config.pool.id().clone(),
            ))?;
        // After the gate's start (its state record written: the shared
        // registry is written beside it).
        let registered = registry::starting_registry(config, store.as_ref()).await?;
        for pool in config.pool_definitions() {
            for node in pool.members() {
                if !registered.contains_key(node) {
                    tracing::warn!(pool = %pool.id(), %node, "pool member is not in [registry] (among replicas: the registry they share): its frames will be refused and the pool can never be ready");
                }
            }
        }
        for node in registered.keys() {
            fleet
                .registry(poolgate_actors::core::RegistryFact::Known { node: node.clone() })
                .await?;
        }
        // The node table, whole before anything shares it.
        let mut table = Nodes::starting_now();
        if let Some(store) = &store {
            // Replay protection across restarts: the last sequence accepted
            // per node, kept in the state file.
            let stored = store
                .sequences()
                .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
            table.restore_sequences(restore_sequences(stored, &registered));
        }
        let signed = table.signed_view();
        let nodes = Arc::new(Mutex::new(table));
        let registry: Registry = Arc::new(std::sync::RwLock::new(registered));
        let mut tasks = Vec::new();
        let kept = store.clone();
        let sequences = store.map(|store| {
            let (last, told) = tokio::sync::oneshot::channel();
            let writer = actix::spawn(keep_sequences(
                store,
                Arc::clone(&nodes),
                Arc::clone(&registry),
                told,
            ));
            (writer, last)
        });
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
            signed,
            // The gate's fence (a replica's term) says when the term is
            // over, by its own clock.
            term_lasts: {
                let gate = gate.clone();
                Arc::new(move || !gate.is_stopped())
            },
            only: registry_names(&registry),
            // The nodes' agent connections vouch for their SWIM members
            // whose probes go unanswered (design §15).
            vouching: {
                let nodes = Arc::clone(&nodes);
                super::swim::member::Vouching::Here(Arc::new(move |probed| {
                    lock(&nodes).vouches(probed, std::time::Instant::now())
                }))
            },
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
            (swim.clone(), swim_addr),
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
            sequences,
            attachment,
            store: kept,
            registry_changes: tokio::sync::Mutex::new(()),
            term_pools: std::sync::OnceLock::new(),
            pool_tasks: Mutex::new(Vec::new()),
        })
    }

    /// Among replicas, whether this orchestrator's term is in doubt (its
    /// lease not renewed lately): a silent connection is then held back
    /// while every connection is silent (see
    /// [`crate::live::nodes::Nodes::holds_back_silence`]).
    pub(crate) fn doubt_term_when(&self, in_doubt: Arc<dyn Fn() -> bool + Send + Sync>) {
        lock(&self.nodes).set_term_in_doubt(crate::live::nodes::TermInDoubt(Some(in_doubt)));
    }

    /// Among replicas, the term this orchestrator serves: a pool a reload
    /// adds is served at once under it (set once, by the replica).
    pub(crate) fn serve_added_pools(&self, term: TermPools) {
        let _ = self.term_pools.set(term);
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
        for task in self.tasks.iter().chain(lock(&self.pool_tasks).iter()) {
            task.abort();
        }
        if let Some((writer, _)) = &self.sequences {
            writer.abort();
        }
        // The gauge's own task, aborted, cannot say so.
        metrics::gauge!("poolgate_leading").set(0.0);
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

    /// Keeps `task` running for as long as the orchestrator does.
    pub(crate) fn attach(&mut self, task: tokio::task::JoinHandle<()>) {
        self.tasks.push(task);
    }

    /// As [`Orchestrator::shutdown`], returning once its sockets are
    /// closed (the listener's task ended, the SWIM member stopped), so the
    /// same addresses can be bound again at once (a replica's next term),
    /// and once the state file is let go (the pool actors and any write
    /// in flight done with it), so it can be opened again at once; each
    /// wait at most 2 s. With a state file, the agents' last sequences are
    /// written first (a frame accepted just before the stop cannot be
    /// replayed after it; [`Orchestrator::shutdown`] and a crash keep
    /// those written up to [`SEQUENCES_EVERY`] before).
    pub async fn stop(self) {
        self.fleet.stop();
        for task in self.tasks.iter().chain(lock(&self.pool_tasks).iter()) {
            task.abort();
        }
        // The gauge's own task, aborted, cannot say so.
        metrics::gauge!("poolgate_leading").set(0.0);
        self.release_swim();
        let Orchestrator {
            fleet,
            gate,
            tasks,
            pool_tasks,
            swim,
            owns_swim,
            store,
            sequences,
            ..
        } = self;
        drop((fleet, gate));
        let pool_tasks = pool_tasks
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for task in tasks.into_iter().chain(pool_tasks) {
            let _ = task.await;
        }
        // No frame is taken any more: the writer writes the last sequences
        // to a state file, after any write under way, and ends (bounded, as
        // the waits below). Among replicas the next leader reads what the
        // term wrote, and a term that ended cannot write: stopped there.
        if let Some((mut writer, last)) = sequences {
            let exclusive = store.as_ref().is_some_and(|s| s.exclusive());
            let mut ended = false;
            if exclusive && last.send(()).is_ok() {
                let wait = std::time::Duration::from_secs(2);
                ended = tokio::time::timeout(wait, &mut writer).await.is_ok();
                if !ended {
                    tracing::warn!("agent sequences not written at the stop within 2s");
                }
            }
            if !ended {
                writer.abort();
                let _ = writer.await;
            }
        }
        // A state file is let go once the last of its handles is.
        let store = store.filter(|s| s.exclusive()).map(|s| Arc::downgrade(&s));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        let held = || {
            let store_held = store.as_ref().is_some_and(|s| s.strong_count() > 0);
            store_held || (owns_swim && swim.connected())
        };
        while held() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// Names each orchestrator's attachment to its SWIM member.
static ATTACHMENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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

/// The live settings a `Config` built in code may hold that `config.toml`
/// would refuse (the gate's own are checked by [`Gate::try_start`]).
fn check_live(config: &Config) -> Result<(), LiveError> {
    let wrong = |key, message: &str| {
        Err(LiveError::Setting {
            key,
            message: message.to_string(),
        })
    };
    let agents = &config.agents;
    let limit = crate::config::cluster::MAX_CONNECTIONS;
    if !u64::try_from(agents.max_connections).is_ok_and(|n| limit.contains(&n)) {
        return wrong(
            "agents.max_connections",
            &crate::config::cluster::range_problem(&limit),
        );
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
    if let Some((key, problem)) = crate::config::cluster::timings_problem(timings) {
        return wrong(key, problem);
    }
    Ok(())
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
