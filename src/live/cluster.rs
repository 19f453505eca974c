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

use super::keys::{ClusterKey, NodeKey, PublicKey};
use super::{LiveError, Orchestrator};
use crate::config::Config;

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
    /// The orchestrator, in this process.
    pub orchestrator: Orchestrator,
    /// The nodes, in order.
    pub nodes: Vec<NodeProcess>,
    binary: PathBuf,
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
        config.swim.cluster_keys = vec![cluster_key.clone()];
        config.swim.insecure = false;
        config.agents.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let orchestrator = Orchestrator::start(&config).await?;

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
                    &orchestrator,
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
            orchestrator,
            nodes,
            binary: plan.binary.clone(),
        })
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
        let child = std::process::Command::new(&self.binary)
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
    orchestrator: &Orchestrator,
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
         probe_rtt = \"{rtt}ms\"\nsuspicion_timeout = \"{st}ms\"\ncluster_keys = [{ck}]\nlabel = {label}\n\n\
         [orchestrator]\nagents = \"{agents}\"\n",
        key = toml_string(&key.display().to_string()),
        identity = toml_string(&identity.display().to_string()),
        seed = orchestrator.swim_addr,
        pp = timings.probe_period.as_millis(),
        rtt = timings.probe_rtt.as_millis(),
        st = timings.suspicion_timeout.as_millis(),
        ck = toml_string(&cluster_key.display().to_string()),
        label = toml_string(&config.swim.label),
        agents = orchestrator.agents_addr,
    )
}

fn toml_string(text: &str) -> String {
    // A TOML basic string is a JSON string for these purposes.
    serde_json::to_string(text).unwrap_or_default()
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_string(s)).collect();
    format!("[{}]", quoted.join(", "))
}
