//! A whole cluster on 127.0.0.1: the orchestrator in this process and one
//! `poolgate node` process per node, with keys and configuration files
//! written to a fresh temporary folder. The demo, the live tests and the
//! detection example use it. Every node process is killed and reaped when
//! the cluster is dropped, whatever the path out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use poolgate_actors::core::{NodeId, PoolDefinition};
use poolgate_actors::GateError;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::config::Config;
use crate::live::keys::{ClusterKey, NodeKey, PublicKey};
use crate::live::{LiveError, Orchestrator};

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    /// The `poolgate` binary to run as `poolgate node`.
    pub binary: PathBuf,
    /// How many nodes (`node-1` …), all of them candidates.
    pub nodes: u32,
    /// The orchestrator's settings: window, policy, SWIM timings, label.
    pub base: Config,
    /// Seeds keys and identity material.
    pub seed: u64,
    /// A health check for every node (argv), if any.
    pub health_check: Option<Vec<String>>,
    /// How often it runs.
    pub health_interval: Duration,
    /// Gossip in the clear (`insecure = true` everywhere), to measure what
    /// sealing costs.
    pub insecure: bool,
    /// Record every input the in-process gate applies (`--record`).
    pub record: Option<poolgate_actors::Recording>,
    /// `RUST_LOG` for the node processes (their stderr goes to
    /// `<dir>/<node>.log`); inherited when `None`.
    pub node_log: Option<String>,
    /// Leave the orchestrator to another process: `prepare` writes
    /// `orchestrator.toml` (for `poolgate watch` or `run`) on free ports
    /// instead of starting one here.
    pub external_orchestrator: bool,
}

/// One node process and its files.
#[derive(Debug)]
pub struct NodeProcess {
    /// The node's id.
    pub name: NodeId,
    /// Its `node.toml`.
    pub config: PathBuf,
    /// Its identity material file.
    pub identity: PathBuf,
    child: Option<Child>,
}

/// A running cluster on 127.0.0.1.
pub struct LocalCluster {
    /// The folder holding keys, configs and node logs (removed on drop).
    pub dir: PathBuf,
    /// The orchestrator's configuration, registry included.
    pub config: Config,
    /// `orchestrator.toml` in `dir`: the same configuration as a file.
    pub config_file: PathBuf,
    /// The nodes, in order.
    pub nodes: Vec<NodeProcess>,
    orchestrator: Option<Orchestrator>,
    binary: PathBuf,
    node_log: Option<String>,
}

impl LocalCluster {
    /// Writes keys and configs, starts the orchestrator (sealed gossip,
    /// signed announcements, pinned keys), and starts no node yet. Must be
    /// called inside a running actix `System`.
    pub async fn prepare(plan: &ClusterPlan) -> Result<LocalCluster, LiveError> {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let dir = std::env::temp_dir().join(format!(
            "poolgate-cluster-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let cluster_key = dir.join("cluster.key");
        ClusterKey::generate().save(&cluster_key)?;

        let names: Vec<NodeId> = (1..=plan.nodes)
            .map(|i| NodeId::new(&format!("node-{i}")))
            .collect::<Result<_, _>>()
            .map_err(GateError::from)?;
        let mut registry: BTreeMap<NodeId, PublicKey> = BTreeMap::new();
        let mut keys = Vec::new();
        for name in &names {
            let key = NodeKey::generate();
            let path = dir.join(format!("{name}.key"));
            key.save(&path)?;
            registry.insert(name.clone(), key.public());
            keys.push(path);
        }
        let mut config = plan.base.clone();
        config.pool = PoolDefinition::new(config.pool.id().clone(), names.clone())
            .map_err(GateError::from)?;
        config.registry = registry;
        config.swim.bind = SocketAddr::from(([127, 0, 0, 1], 0));
        config.swim.seeds = Vec::new();
        if plan.insecure {
            config.swim.cluster_keys = Vec::new();
            config.swim.insecure = true;
        } else {
            config.swim.cluster_keys = vec![cluster_key.clone()];
            config.swim.insecure = false;
        }
        config.agents.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let (orchestrator, swim_addr, agents_addr) = if plan.external_orchestrator {
            config.swim.bind = free_udp_port()?;
            config.agents.listen = free_tcp_port()?;
            (None, config.swim.bind, config.agents.listen)
        } else {
            let started = Orchestrator::start_recording(&config, plan.record.clone()).await?;
            config.swim.bind = started.swim_addr;
            config.agents.listen = started.agents_addr;
            let addrs = (started.swim_addr, started.agents_addr);
            (Some(started), addrs.0, addrs.1)
        };
        let config_file = dir.join("orchestrator.toml");
        std::fs::write(&config_file, orchestrator_toml(&config))?;

        let mut nodes = Vec::new();
        for (name, key) in names.iter().zip(keys) {
            let identity = dir.join(format!("{name}.identity"));
            let material: [u8; 32] = rng.random();
            std::fs::write(&identity, material)?;
            let node_config = dir.join(format!("{name}.toml"));
            std::fs::write(
                &node_config,
                node_toml(
                    plan,
                    &config,
                    name,
                    &key,
                    &identity,
                    &cluster_key,
                    (swim_addr, agents_addr),
                ),
            )?;
            nodes.push(NodeProcess {
                name: name.clone(),
                config: node_config,
                identity,
                child: None,
            });
        }
        Ok(LocalCluster {
            dir,
            config,
            config_file,
            nodes,
            orchestrator,
            binary: plan.binary.clone(),
            node_log: plan.node_log.clone(),
        })
    }

    /// The orchestrator running in this process (none when external).
    pub fn orchestrator(&self) -> Option<&Orchestrator> {
        self.orchestrator.as_ref()
    }

    /// Stops the orchestrator and starts a new one on the same addresses,
    /// as a restarted orchestrator process would: the nodes keep running.
    pub async fn restart_orchestrator(&mut self) -> Result<&Orchestrator, LiveError> {
        if let Some(old) = self.orchestrator.take() {
            old.shutdown();
        }
        // Let the old sockets close before the new ones bind.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Orchestrator::start(&self.config).await?;
        Ok(self.orchestrator.insert(started))
    }

    /// The index of `node`.
    pub fn index(&self, node: &NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| &n.name == node)
    }

    /// Starts node `i`'s process (a restart if it ran before).
    pub fn spawn(&mut self, i: usize) -> Result<(), LiveError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.nodes[i].name)))?;
        let node = &mut self.nodes[i];
        let mut command = std::process::Command::new(&self.binary);
        if let Some(level) = &self.node_log {
            command.env("RUST_LOG", level);
        }
        let child = command
            .arg("node")
            .arg("--config")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| {
                LiveError::Io(std::io::Error::other(format!(
                    "{}: {e}",
                    self.binary.display()
                )))
            })?;
        if let Some(mut old) = node.child.replace(child) {
            let _ = old.kill();
            let _ = old.wait();
        }
        Ok(())
    }

    /// Sends node `i`'s process `signal`.
    pub fn signal(&self, i: usize, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.nodes[i]
            .child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
        {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILLs node `i` and reaps it: a real crash.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (up to `limit`) for node `i` to exit; its exit code.
    pub async fn wait_exit(&mut self, i: usize, limit: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some(child) = self.nodes[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.nodes[i].child = None;
                    return status.code();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// The process id of node `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn node_toml(
    plan: &ClusterPlan,
    config: &Config,
    name: &NodeId,
    key: &Path,
    identity: &Path,
    cluster_key: &Path,
    (swim_addr, agents_addr): (SocketAddr, SocketAddr),
) -> String {
    let timings = &config.swim.timings;
    let health = match &plan.health_check {
        Some(argv) => format!(
            "health_check = {}\nhealth_interval = \"{}ms\"\n",
            toml_list(argv),
            plan.health_interval.as_millis()
        ),
        None => String::new(),
    };
    format!(
        "[node]\nname = \"{name}\"\nsigning_key = {key}\nidentity = {identity}\n{health}\n\
         [swim]\nbind = \"127.0.0.1:0\"\nseeds = [\"{seed}\"]\nprobe_period = \"{pp}ms\"\n\
         probe_rtt = \"{rtt}ms\"\nsuspicion_timeout = \"{st}ms\"\n{keys}label = {label}\n\n\
         [orchestrator]\nagents = \"{agents}\"\n",
        key = toml_string(&key.display().to_string()),
        identity = toml_string(&identity.display().to_string()),
        seed = swim_addr,
        pp = timings.probe_period.as_millis(),
        rtt = timings.probe_rtt.as_millis(),
        st = timings.suspicion_timeout.as_millis(),
        keys = if config.swim.insecure {
            "insecure = true\n".to_string()
        } else {
            format!(
                "cluster_keys = [{}]\n",
                toml_string(&cluster_key.display().to_string())
            )
        },
        label = toml_string(&config.swim.label),
        agents = agents_addr,
    )
}

/// The orchestrator's configuration as `config.toml` text.
/// `config` as a `config.toml` text (`[pool]`, or `[pools.<id>]` when it
/// has several pools).
pub fn orchestrator_toml(config: &Config) -> String {
    let members: Vec<String> = config
        .pool
        .members()
        .iter()
        .map(|m| toml_string(m.as_str()))
        .collect();
    let policy = config.planning.on_readiness_lost.name();
    let wait = config
        .planning
        .wait_timeout
        .map(|t| format!("wait_timeout = \"{}ms\"\n", t.as_millis()))
        .unwrap_or_default();
    let keys: Vec<String> = config
        .swim
        .cluster_keys
        .iter()
        .map(|k| toml_string(&k.display().to_string()))
        .collect();
    let timings = &config.swim.timings;
    let registry: String = config
        .registry
        .iter()
        .map(|(node, key)| format!("{} = \"{key}\"\n", toml_string(node.as_str())))
        .collect();
    let pools = match config.pools.is_empty() {
        true => format!(
            "[pool]\nid = {}\nmembers = [{}]\n\n",
            toml_string(config.pool.id().as_str()),
            members.join(", ")
        ),
        false => config
            .pools
            .iter()
            .map(|pool| {
                let members: Vec<String> = pool
                    .definition
                    .members()
                    .iter()
                    .map(|m| toml_string(m.as_str()))
                    .collect();
                let wait = pool
                    .planning
                    .wait_timeout
                    .map(|t| format!("wait_timeout = \"{}ms\"\n", t.as_millis()))
                    .unwrap_or_default();
                format!(
                    "[pools.{}]\nmembers = [{}]\nconvergence_window = \"{}ms\"\non_readiness_lost = \"{}\"\n{wait}\n",
                    toml_string(pool.definition.id().as_str()),
                    members.join(", "),
                    pool.convergence_window.as_millis(),
                    pool.planning.on_readiness_lost.name()
                )
            })
            .collect(),
    };
    format!(
        "{pools}[readiness]\nconvergence_window = \"{window}ms\"\n\n\
         [planning]\non_readiness_lost = \"{policy}\"\n{wait}\n\
         [swim]\nbind = \"{bind}\"\nprobe_period = \"{pp}ms\"\nprobe_rtt = \"{rtt}ms\"\n\
         suspicion_timeout = \"{st}ms\"\ncluster_keys = [{keys}]\ninsecure = {insecure}\nlabel = {label}\n\n\
         [agents]\nlisten = \"{listen}\"\nmax_connections = {max}\nidle_timeout = \"{idle}ms\"\n\n\
         {state}{control}[registry]\n{registry}",
        control = config
            .control
            .as_ref()
            .map(|p| format!("[control]\nsocket = {}\n\n", toml_string(&p.display().to_string())))
            .unwrap_or_default(),
        window = config.convergence_window.as_millis(),
        bind = config.swim.bind,
        pp = timings.probe_period.as_millis(),
        rtt = timings.probe_rtt.as_millis(),
        st = timings.suspicion_timeout.as_millis(),
        keys = keys.join(", "),
        insecure = config.swim.insecure,
        label = toml_string(&config.swim.label),
        listen = config.agents.listen,
        max = config.agents.max_connections,
        idle = config.agents.idle_timeout.as_millis(),
        state = state_toml(config),
    )
}

/// The `[state]` (a file, or etcd's endpoints and lease) and `[run]`
/// sections of `config`.
fn state_toml(config: &Config) -> String {
    let state = &config.state;
    let grace = state.restore_grace.as_millis();
    let run = format!(
        "[run]\nunguarded_after = \"{}s\"\n\n",
        config.run.unguarded_after.as_secs()
    );
    match &state.path {
        Some(path) => format!(
            "[state]\npath = {}\nrestore_grace = \"{grace}ms\"\n\n{run}",
            toml_string(&path.display().to_string()),
        ),
        None if !state.etcd.is_empty() => {
            let endpoints: Vec<String> = state.etcd.iter().map(|e| toml_string(e)).collect();
            let key = state
                .key
                .as_ref()
                .map(|k| format!("key = {}\n", toml_string(&k.display().to_string())))
                .unwrap_or_default();
            format!(
                "[state]\netcd = [{}]\nlease = \"{}s\"\nrestore_grace = \"{grace}ms\"\n{key}insecure = {}\n\n{run}",
                endpoints.join(", "),
                state.lease.as_secs(),
                state.insecure,
            )
        }
        None => run,
    }
}

/// A UDP port on 127.0.0.1 that was free a moment ago.
fn free_udp_port() -> std::io::Result<SocketAddr> {
    std::net::UdpSocket::bind(("127.0.0.1", 0))?.local_addr()
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_tcp_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

fn toml_string(text: &str) -> String {
    // A TOML basic string is a JSON string for these purposes.
    serde_json::to_string(text).unwrap_or_default()
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_string(s)).collect();
    format!("[{}]", quoted.join(", "))
}
