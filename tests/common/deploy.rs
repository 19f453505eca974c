//! docs/operator.md's "Deploy on real machines", done on the rig: keys made with
//! `poolgate keygen`, a `node.toml` on every node's host, the
//! orchestrator's `config.toml` on its host, every address a hostname,
//! every socket bound to `0.0.0.0`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::rig::{Process, Rig};

/// The `poolgate` binary under test: cargo's for an integration test;
/// for the rig example (`examples/rig.rs`), the one built beside it
/// (`cargo build --release` first).
pub fn binary() -> String {
    if let Some(built) = option_env!("CARGO_BIN_EXE_poolgate") {
        return built.to_string();
    }
    let exe = std::env::current_exe().expect("the running example");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/examples");
    dir.join("poolgate").display().to_string()
}

/// The UDP port SWIM uses on every host (nodes sharing a host take the
/// ports after it).
pub const SWIM_PORT: u16 = 7946;
/// The orchestrator's agent listener port.
pub const AGENTS_PORT: u16 = 7947;

/// One node of the deployment.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `node-1` …
    pub name: String,
    /// The host it runs on.
    pub host: usize,
    /// Its `node.toml`.
    pub config: PathBuf,
    /// Its public key, as `[registry]` pins it.
    pub public: String,
}

/// What a deployment is made of.
pub struct Deployment {
    /// The nodes.
    pub nodes: Vec<NodeSpec>,
    /// The hosts that may run an orchestrator (the first is the usual one).
    pub orchestrators: Vec<usize>,
    window: Duration,
    extra_orchestrator: String,
    extra_node: String,
    extra_swim: String,
}

/// Options beside the operator guide's defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `[readiness] convergence_window` (default 2 s).
    pub window: Option<Duration>,
    /// Lines added to the orchestrator's config (sections at its end).
    pub orchestrator_extra: String,
    /// Lines added to every node's `[node]` section.
    pub node_extra: String,
    /// Lines added to every `[swim]` section (nodes and orchestrators).
    pub swim_extra: String,
}

impl Deployment {
    /// Writes keys and configurations: orchestrator candidates on hosts
    /// `orchestrators`, nodes on `node_hosts` (one entry per node).
    pub fn write(
        rig: &Rig,
        orchestrators: &[usize],
        node_hosts: &[usize],
        options: Options,
    ) -> Deployment {
        let binary = binary();
        let keygen = |host: usize, out: &PathBuf, cluster: bool| -> String {
            let out = out.display().to_string();
            let mut argv = vec![binary.as_str(), "keygen", "--out", out.as_str()];
            if cluster {
                argv.push("--cluster");
            }
            rig.exec(host, &argv)
                .expect("poolgate keygen")
                .trim()
                .to_string()
        };
        // The cluster key is made once and copied to every host.
        let first = rig.host_dir(orchestrators[0]).join("cluster.key");
        keygen(orchestrators[0], &first, true);
        for host in 0..rig.hosts.len() {
            let dir = rig.host_dir(host);
            if dir.join("cluster.key") != first {
                std::fs::copy(&first, dir.join("cluster.key")).expect("copy the cluster key");
                set_private(&dir.join("cluster.key"));
            }
        }
        let seeds: Vec<String> = orchestrators
            .iter()
            .map(|h| format!("\"{}:{SWIM_PORT}\"", rig.hosts[*h].name))
            .collect();
        let agents: Vec<String> = orchestrators
            .iter()
            .map(|h| format!("\"{}:{AGENTS_PORT}\"", rig.hosts[*h].name))
            .collect();
        let agents = if agents.len() == 1 {
            agents[0].clone()
        } else {
            format!("[{}]", agents.join(", "))
        };
        let mut per_host = vec![0u16; rig.hosts.len()];
        let mut nodes = Vec::new();
        for (i, host) in node_hosts.iter().copied().enumerate() {
            let name = format!("node-{}", i + 1);
            let dir = rig.host_dir(host);
            let key = dir.join(format!("{name}.key"));
            let public = keygen(host, &key, false);
            std::fs::write(
                dir.join(format!("{name}.pub")),
                format!("data-plane key of {name}"),
            )
            .expect("identity material");
            let port = SWIM_PORT + 2 + per_host[host];
            per_host[host] += 1;
            let config = dir.join(format!("{name}.toml"));
            std::fs::write(
                &config,
                format!(
                    "[node]\nname = \"{name}\"\nsigning_key = \"{name}.key\"\nidentity = \"{name}.pub\"\n{extra}\n\
                     [swim]\nbind = \"0.0.0.0:{port}\"\nadvertise = \"{hostname}:{port}\"\nseeds = [{seeds}]\n\
                     cluster_keys = [\"cluster.key\"]\n{swim_extra}\n[orchestrator]\nagents = {agents}\n",
                    swim_extra = options.swim_extra,
                    extra = options.node_extra,
                    hostname = rig.hosts[host].name,
                    seeds = seeds.join(", "),
                ),
            )
            .expect("node.toml");
            nodes.push(NodeSpec {
                name,
                host,
                config,
                public,
            });
        }
        let deployment = Deployment {
            nodes,
            orchestrators: orchestrators.to_vec(),
            window: options.window.unwrap_or(Duration::from_secs(2)),
            extra_orchestrator: options.orchestrator_extra.clone(),
            extra_node: options.node_extra.clone(),
            extra_swim: options.swim_extra.clone(),
        };
        for host in orchestrators {
            let path = rig.host_dir(*host).join("config.toml");
            std::fs::write(&path, deployment.orchestrator_toml(rig, *host)).expect("config.toml");
        }
        deployment
    }

    /// The orchestrator's `config.toml` for host `host`.
    fn orchestrator_toml(&self, rig: &Rig, host: usize) -> String {
        let members: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", n.name))
            .collect();
        let registry: String = self
            .nodes
            .iter()
            .map(|n| format!("{} = \"{}\"\n", n.name, n.public))
            .collect();
        format!(
            "[pool]\nid = \"pool-a\"\nmembers = [{members}]\n\n[readiness]\nconvergence_window = \"{window}ms\"\n\n\
             [swim]\nbind = \"0.0.0.0:{SWIM_PORT}\"\nadvertise = \"{hostname}:{SWIM_PORT}\"\n\
             cluster_keys = [\"cluster.key\"]\n{swim}\n[agents]\nlisten = \"0.0.0.0:{AGENTS_PORT}\"\n\n\
             {extra}\n[registry]\n{registry}",
            members = members.join(", "),
            window = self.window.as_millis(),
            hostname = rig.hosts[host].name,
            extra = self.extra_orchestrator,
            swim = self.extra_swim,
        )
    }

    /// The orchestrator's config path on `host`.
    pub fn orchestrator_config(&self, rig: &Rig, host: usize) -> PathBuf {
        rig.host_dir(host).join("config.toml")
    }

    /// Starts node `i` (`poolgate node --config …`), with `env`
    /// (`POOLGATE_RIG_NODE_LOG` sets the nodes' `RUST_LOG`).
    pub fn start_node(&self, rig: &Rig, i: usize, env: &[(&str, &str)]) -> Process {
        let level = std::env::var("POOLGATE_RIG_NODE_LOG").ok();
        let mut env = env.to_vec();
        if let Some(level) = level.as_deref() {
            env.push(("RUST_LOG", level));
        }
        let env = &env[..];
        let node = &self.nodes[i];
        let config = node.config.display().to_string();
        let binary = binary();
        rig.spawn(
            node.host,
            &format!("{}-{}", node.name, unique()),
            &[binary.as_str(), "node", "--config", config.as_str()],
            env,
        )
    }

    /// Starts every node.
    pub fn start_nodes(&self, rig: &Rig) -> Vec<Process> {
        (0..self.nodes.len())
            .map(|i| self.start_node(rig, i, &[]))
            .collect()
    }

    /// Starts `poolgate <args…> --config <host's config.toml>` on `host`.
    pub fn orchestrator(&self, rig: &Rig, host: usize, args: &[&str]) -> Process {
        let config = self.orchestrator_config(rig, host).display().to_string();
        let binary = binary();
        let mut argv = vec![binary.as_str(), args[0], "--config", config.as_str()];
        argv.extend_from_slice(&args[1..]);
        // `POOLGATE_RIG_ORCHESTRATOR_LOG` sets the orchestrators' `RUST_LOG`.
        let level = std::env::var("POOLGATE_RIG_ORCHESTRATOR_LOG").ok();
        let env: Vec<(&str, &str)> = level
            .as_deref()
            .map(|l| ("RUST_LOG", l))
            .into_iter()
            .collect();
        rig.spawn(
            host,
            &format!("orchestrator-{}-{}", host + 1, unique()),
            &argv,
            &env,
        )
    }
}

impl Deployment {
    /// Starts `poolgate <args…> --config <host's config>` on `host`,
    /// logging JSON at info level (timestamps to compare across replicas).
    pub fn replica(&self, rig: &Rig, host: usize, args: &[&str]) -> Process {
        let config = self.orchestrator_config(rig, host).display().to_string();
        let binary = binary();
        let mut argv = vec![
            binary.as_str(),
            "--log-format",
            "json",
            args[0],
            "--config",
            config.as_str(),
        ];
        argv.extend_from_slice(&args[1..]);
        rig.spawn(
            host,
            &format!("replica-{host}-{}", unique()),
            &argv,
            &[("RUST_LOG", "poolgate=info")],
        )
    }
}

/// Starts a one-member etcd on rig host `host`, listening on its address;
/// its endpoint.
pub fn etcd_on(rig: &Rig, host: usize) -> (Process, String) {
    let addr = rig.hosts[host].addr;
    let endpoint = format!("http://{addr}:2379");
    let peer = format!("http://{addr}:2380");
    let data = rig.host_dir(host).join("etcd");
    let data = data.display().to_string();
    let server = rig.spawn(
        host,
        "etcd",
        &[
            "etcd",
            "--name",
            "e0",
            "--data-dir",
            &data,
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("e0={peer}"),
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.stderr().contains("ready to serve client requests") {
        assert!(
            Instant::now() < deadline,
            "etcd did not start: {}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, endpoint)
}

/// Waits until `process`'s stderr holds `text`; when it was seen.
pub fn stderr_line(process: &Process, text: &str, limit: Duration) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if process.stderr().contains(text) {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// When (wall clock) each JSON log line of `process` with `message` was
/// written.
pub fn logged_at(process: &Process, message: &str) -> Vec<std::time::SystemTime> {
    process
        .stderr()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["fields"]["message"].as_str() == Some(message))
        .filter_map(|v| humantime::parse_rfc3339(v["timestamp"].as_str()?).ok())
        .collect()
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn set_private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}
