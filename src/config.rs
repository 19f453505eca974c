//! `config.toml`: the pool, the convergence window and the planning policy
//! (SPEC §4). Every error names the key and the line it is on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::{NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId};
use poolgate_actors::GateSettings;
use toml::de::{DeTable, DeValue};

use crate::live::endpoint::Endpoint;
use crate::live::keys::PublicKey;
use crate::live::swim::SwimSettings;
use toml::Spanned;

/// A checked configuration.
///
/// ```
/// use poolgate::Config;
///
/// let config = Config::parse(
///     "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\", \"node-2\"]\n\
///      [readiness]\nconvergence_window = \"5s\"\n",
///     "config.toml",
/// )
/// .unwrap();
/// assert_eq!(config.pool.members().len(), 2);
/// assert_eq!(config.convergence_window, std::time::Duration::from_secs(5));
///
/// // A mistake is an error that names the key and the line.
/// let wrong = Config::parse("[pool]\nid = \"p\"\nmembers = [\"n\"]\n[readiness]\nconvergence_window = \"soon\"\n", "config.toml");
/// let message = wrong.unwrap_err().to_string();
/// assert!(message.contains("readiness.convergence_window"), "{message}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `[pool]`: the candidate pool.
    pub pool: PoolDefinition,
    /// `[readiness] convergence_window`.
    pub convergence_window: Duration,
    /// `[planning]`: what to do when readiness is lost before commit.
    pub planning: PlanningPolicy,
    /// `[swim]`: the live SWIM member (optional section).
    pub swim: SwimConfig,
    /// `[demo]`: the live demonstration (optional section).
    pub demo: DemoConfig,
    /// `[agents]`: where node agents announce themselves.
    pub agents: AgentsConfig,
    /// `[registry]`: the nodes the orchestrator knows, each with its pinned
    /// public key (a registry entry is the `known` fact).
    pub registry: BTreeMap<NodeId, PublicKey>,
    /// `[state]`: where epochs and the active run survive a restart.
    pub state: StateConfig,
}

/// `[state]`: the durable state (SPEC §9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// `path`: the state file; absent = memory only.
    pub path: Option<PathBuf>,
    /// `restore_grace`: how long a restored committed run's required nodes
    /// have to be seen ready again with their committed fingerprints.
    pub restore_grace: Duration,
    /// `etcd`: the etcd v3 endpoints (`http://host:port`) of replicated
    /// state (SPEC §12), instead of `path`; empty = not replicated.
    pub etcd: Vec<String>,
    /// `lease`: the leadership lease's TTL (whole seconds; etcd raises it
    /// to its minimum). A leader stops acting two thirds of it after its
    /// last renewal.
    pub lease: Duration,
    /// `prefix`: where the state lives in etcd (default
    /// `/poolgate/<label>/<pool>/`).
    pub prefix: Option<String>,
}

/// `[state] lease`'s default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(2);

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            path: None,
            restore_grace: Duration::from_secs(30),
            etcd: Vec::new(),
            lease: DEFAULT_LEASE,
            prefix: None,
        }
    }
}

/// `[agents]`: the orchestrator's agent listener (TCP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentsConfig {
    /// `listen`: the address (port 0 picks a free one).
    pub listen: SocketAddr,
    /// `max_connections`: connections served at once; more are closed.
    pub max_connections: usize,
    /// `idle_timeout`: a connection that sends nothing this long is closed.
    pub idle_timeout: Duration,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7947)),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// `[swim]`: where the orchestrator's SWIM member listens, whom it asks to
/// join, and SWIM's timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwimConfig {
    /// `bind`: the UDP address (port 0 picks a free one).
    pub bind: SocketAddr,
    /// `advertise`: the address other members reach this one at, which a
    /// node's announcements sign; `None` = the bound address (refused when
    /// that is unspecified, `0.0.0.0` or `::`). Port 0 = the bound port.
    pub advertise: Option<Endpoint>,
    /// `seeds`: members to announce to at start (hostnames resolved then,
    /// and again at every later join).
    pub seeds: Vec<Endpoint>,
    /// `probe_period`, `probe_rtt`, `suspicion_timeout`, `indirect_probes`.
    pub timings: SwimSettings,
    /// `cluster_keys`: key files of the gossip keyring; the first seals,
    /// all open (relative paths are from the config file's folder).
    pub cluster_keys: Vec<PathBuf>,
    /// `insecure`: run with no cluster keys (gossip in the clear).
    pub insecure: bool,
    /// `label`: the cluster's label, sealed into every datagram and signed
    /// into every announcement.
    pub label: String,
}

impl Default for SwimConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            seeds: Vec::new(),
            timings: SwimSettings::default(),
            cluster_keys: Vec::new(),
            insecure: false,
            label: "poolgate".to_string(),
        }
    }
}

/// `[demo]`: the live demonstration's cluster and its crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoConfig {
    /// `nodes`: how many node members to start (1 to 64).
    pub nodes: u32,
    /// `announce_within`: each node agent announces itself after a random
    /// delay up to this.
    pub announce_within: Duration,
    /// `crash_after`: how long after commit a required node crashes.
    pub crash_after: Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            nodes: 5,
            announce_within: Duration::from_millis(800),
            crash_after: Duration::from_secs(1),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not a valid configuration.
    #[error("{file}: line {line}: {key}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// The line (1-based).
        line: usize,
        /// The key at fault, dotted (`pool.members`); `toml` for syntax.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = Config::parse(&text, &file)?;
        config.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        Ok(config)
    }

    /// Checks the text of a configuration; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let doc = Doc { text, file };
        let root = DeTable::parse(text)
            .map_err(|e| doc.error(e.span().unwrap_or(0..0), "toml", e.message().trim_end()))?;
        let root = root.get_ref();
        doc.only_keys(
            root,
            "",
            &[
                "pool",
                "readiness",
                "planning",
                "swim",
                "demo",
                "agents",
                "registry",
                "state",
            ],
        )?;

        let (pool_table, pool_span) = doc.required_section(root, "pool")?;
        let (readiness_table, readiness_span) = doc.required_section(root, "readiness")?;
        let planning = doc.section(root, "planning")?;

        doc.only_keys(pool_table, "pool", &["id", "members"])?;
        let id = doc.required(pool_table, "pool", "id", pool_span.clone())?;
        let id = doc.string(id, "pool.id")?;
        let id = PoolId::new(&id.0).map_err(|e| doc.error(id.1, "pool.id", e))?;
        let members = doc.required(pool_table, "pool", "members", pool_span)?;
        let pool = doc.members(members, id)?;

        doc.only_keys(readiness_table, "readiness", &["convergence_window"])?;
        let window = doc.required(
            readiness_table,
            "readiness",
            "convergence_window",
            readiness_span,
        )?;
        let (convergence_window, _) = doc.duration(window, "readiness.convergence_window")?;

        let mut planning_policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        if let Some((table, _)) = planning {
            doc.only_keys(table, "planning", &["on_readiness_lost", "wait_timeout"])?;
            if let Some(value) = table.get("on_readiness_lost") {
                let (text, span) = doc.string(value, "planning.on_readiness_lost")?;
                planning_policy.on_readiness_lost = match text.as_str() {
                    "wait" => OnReadinessLost::Wait,
                    "abort" => OnReadinessLost::Abort,
                    other => {
                        return Err(doc.error(
                            span,
                            "planning.on_readiness_lost",
                            format!("`{other}` is not a policy; use \"wait\" or \"abort\""),
                        ))
                    }
                };
            }
            if let Some(value) = table.get("wait_timeout") {
                let (timeout, span) = doc.duration(value, "planning.wait_timeout")?;
                if timeout <= convergence_window {
                    return Err(doc.error(
                        span,
                        "planning.wait_timeout",
                        format!(
                            "{} is not longer than the convergence window ({})",
                            humantime::format_duration(timeout),
                            humantime::format_duration(convergence_window)
                        ),
                    ));
                }
                planning_policy.wait_timeout = Some(timeout);
            }
        }

        let swim = match doc.section(root, "swim")? {
            Some((table, _)) => doc.swim(table)?,
            None => SwimConfig::default(),
        };
        let demo = match doc.section(root, "demo")? {
            Some((table, _)) => doc.demo(table)?,
            None => DemoConfig::default(),
        };
        let agents = match doc.section(root, "agents")? {
            Some((table, _)) => doc.agents(table)?,
            None => AgentsConfig::default(),
        };
        let registry = match doc.section(root, "registry")? {
            Some((table, _)) => doc.registry(table)?,
            None => BTreeMap::new(),
        };
        let mut state = StateConfig::default();
        if let Some((table, _)) = doc.section(root, "state")? {
            doc.only_keys(
                table,
                "state",
                &["path", "restore_grace", "etcd", "lease", "prefix"],
            )?;
            if let Some(value) = table.get("path") {
                state.path = Some(PathBuf::from(doc.string(value, "state.path")?.0));
            }
            if let Some(value) = table.get("restore_grace") {
                state.restore_grace = doc.duration(value, "state.restore_grace")?.0;
            }
            if let Some(value) = table.get("etcd") {
                state.etcd = doc.strings(value, "state.etcd")?;
                if let Err(e) = crate::etcd::Etcd::new(&state.etcd, Duration::from_secs(1)) {
                    return Err(doc.error(value.span(), "state.etcd", e));
                }
                if table.contains_key("path") {
                    return Err(doc.error(
                        value.span(),
                        "state.etcd",
                        "give either path (one machine) or etcd (replicas), not both",
                    ));
                }
            }
            if let Some(value) = table.get("lease") {
                let (lease, span) = doc.duration(value, "state.lease")?;
                if lease < Duration::from_secs(1) || lease > Duration::from_secs(3600) {
                    return Err(doc.error(span, "state.lease", "must be from 1s to 1h"));
                }
                state.lease = lease;
            }
            if let Some(value) = table.get("prefix") {
                let (prefix, span) = doc.string(value, "state.prefix")?;
                if prefix.is_empty() || prefix.len() > 256 {
                    return Err(doc.error(span, "state.prefix", "must be 1 to 256 bytes"));
                }
                state.prefix = Some(prefix);
            }
        }

        Ok(Config {
            pool,
            convergence_window,
            planning: planning_policy,
            swim,
            demo,
            agents,
            registry,
            state,
        })
    }

    /// Relative key paths, resolved from `dir` (the config file's folder).
    pub fn resolve_paths(&mut self, dir: &Path) {
        if let Some(path) = self.state.path.as_mut().filter(|p| p.is_relative()) {
            *path = dir.join(&*path);
        }
        for path in &mut self.swim.cluster_keys {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }

    /// What the gate needs, in memory only.
    pub fn gate_settings(&self) -> GateSettings {
        GateSettings {
            definition: self.pool.clone(),
            window: self.convergence_window,
            policy: self.planning,
            durable: None,
            record: None,
        }
    }

    /// What the gate needs, with the state file of `[state] path` (or
    /// `path`, which wins) opened and read.
    pub fn gate_settings_with_state(
        &self,
        path: Option<&Path>,
    ) -> Result<GateSettings, crate::state::StateError> {
        self.gate_settings_with_store(path)
            .map(|(settings, _)| settings)
    }

    /// As [`Config::gate_settings_with_state`], also handing back the
    /// opened store (the orchestrator keeps agent sequences in it too).
    pub fn gate_settings_with_store(
        &self,
        path: Option<&Path>,
    ) -> Result<
        (
            GateSettings,
            Option<std::sync::Arc<dyn crate::state::OrchestratorStore>>,
        ),
        crate::state::StateError,
    > {
        let mut settings = self.gate_settings();
        let Some(path) = path.or(self.state.path.as_deref()) else {
            return Ok((settings, None));
        };
        let (store, restored) = open_file_store(path)?;
        settings.durable = Some(poolgate_actors::DurableSettings {
            store: store.clone(),
            restored,
            restore_grace: self.state.restore_grace,
        });
        Ok((settings, Some(store)))
    }
}

/// The state file at `path`, opened (redb).
#[cfg(feature = "redb")]
fn open_file_store(path: &Path) -> Result<crate::state::Opened, crate::state::StateError> {
    let (store, restored) = crate::state::RedbStore::open(path)?;
    Ok((store, restored))
}

/// Without the `redb` feature there is no file store: an error naming
/// the file, never a gate that forgets.
#[cfg(not(feature = "redb"))]
fn open_file_store(path: &Path) -> Result<crate::state::Opened, crate::state::StateError> {
    Err(crate::state::StateError {
        file: path.display().to_string(),
        what: "[state] path needs poolgate built with the `redb` feature".into(),
    })
}

/// `node.toml`: one node agent (`poolgate node`, SPEC §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// `[node] name`: the node's id, as the pool and registry name it.
    pub name: NodeId,
    /// `[node] signing_key`: the node's Ed25519 key file.
    pub signing_key: PathBuf,
    /// `[node] identity`: the data-plane identity material file (1 B to
    /// 16 KiB), re-read on SIGHUP.
    pub identity: PathBuf,
    /// `[node] health_check`: argv run every `health_interval`; exit 0
    /// keeps the node available.
    pub health_check: Option<Vec<String>>,
    /// `[node] health_interval`.
    pub health_interval: Duration,
    /// `[swim]`: as in `config.toml`.
    pub swim: SwimConfig,
    /// `[node] generation_file`: where the node keeps its last life
    /// (default `<signing_key>.generation`); its folder must be writable.
    pub generation_file: Option<PathBuf>,
    /// `[node] heartbeat`: how often a signed frame goes to the
    /// orchestrator when nothing changed; a connection silent for
    /// [`HEARTBEATS_MISSED`] heartbeats is taken as gone, on both sides.
    pub heartbeat: Duration,
    /// `[orchestrator] agents`: the orchestrator's agent listener, or
    /// several (replicas, a standby): tried in turn.
    pub agents: Vec<Endpoint>,
}

/// How many heartbeats may be missed before a connection is taken as gone.
pub const HEARTBEATS_MISSED: u32 = 3;

/// `[node] heartbeat`'s default: a node whose host is cut off is not
/// live within 3 × 500 ms (plus the lost connection's grace) whatever
/// SWIM says, for about 700 bytes a second per node (BENCHMARKS.md).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(500);

/// What is wrong with `label` as `[swim] label`, if anything (the one rule
/// for parsed and built configurations).
pub fn label_problem(label: &str) -> Option<&'static str> {
    (label.is_empty() || label.len() > 128 || label.chars().any(char::is_control))
        .then_some("must be 1 to 128 bytes with no control characters")
}

impl NodeConfig {
    /// Reads and checks a node configuration; relative paths are from the
    /// file's folder.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = NodeConfig::parse(&text, &file)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let paths = [&mut config.signing_key, &mut config.identity]
            .into_iter()
            .chain(config.generation_file.iter_mut())
            .chain(config.swim.cluster_keys.iter_mut());
        for path in paths {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
        Ok(config)
    }

    /// Checks the text of a node configuration; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<NodeConfig, ConfigError> {
        let doc = Doc { text, file };
        let root = DeTable::parse(text)
            .map_err(|e| doc.error(e.span().unwrap_or(0..0), "toml", e.message().trim_end()))?;
        let root = root.get_ref();
        doc.only_keys(root, "", &["node", "swim", "orchestrator"])?;
        let (node, node_span) = doc.required_section(root, "node")?;
        doc.only_keys(
            node,
            "node",
            &[
                "name",
                "signing_key",
                "identity",
                "health_check",
                "health_interval",
                "heartbeat",
                "generation_file",
            ],
        )?;
        let name = doc.required(node, "node", "name", node_span.clone())?;
        let (name_text, name_span) = doc.string(name, "node.name")?;
        let name = NodeId::new(&name_text).map_err(|e| doc.error(name_span, "node.name", e))?;
        let key = doc.required(node, "node", "signing_key", node_span.clone())?;
        let signing_key = PathBuf::from(doc.string(key, "node.signing_key")?.0);
        let identity = doc.required(node, "node", "identity", node_span)?;
        let identity = PathBuf::from(doc.string(identity, "node.identity")?.0);
        let health_check = match node.get("health_check") {
            Some(value) => {
                let argv = doc.strings(value, "node.health_check")?;
                if argv.is_empty() {
                    return Err(doc.error(
                        value.span(),
                        "node.health_check",
                        "must name a program (a non-empty argv list)",
                    ));
                }
                Some(argv)
            }
            None => None,
        };
        let health_interval = match node.get("health_interval") {
            Some(value) => doc.duration(value, "node.health_interval")?.0,
            None => Duration::from_secs(5),
        };
        let heartbeat = match node.get("heartbeat") {
            Some(value) => {
                let (heartbeat, span) = doc.duration(value, "node.heartbeat")?;
                if heartbeat < Duration::from_millis(50) || heartbeat > Duration::from_secs(60) {
                    return Err(doc.error(span, "node.heartbeat", "must be from 50ms to 60s"));
                }
                heartbeat
            }
            None => DEFAULT_HEARTBEAT,
        };
        let generation_file = match node.get("generation_file") {
            Some(value) => Some(PathBuf::from(doc.string(value, "node.generation_file")?.0)),
            None => None,
        };
        let swim = match doc.section(root, "swim")? {
            Some((table, _)) => doc.swim(table)?,
            None => SwimConfig::default(),
        };
        let (orchestrator, span) = doc.required_section(root, "orchestrator")?;
        doc.only_keys(orchestrator, "orchestrator", &["agents"])?;
        let agents = doc.required(orchestrator, "orchestrator", "agents", span)?;
        let agents = match agents.get_ref() {
            DeValue::Array(items) if items.is_empty() => {
                return Err(doc.error(
                    agents.span(),
                    "orchestrator.agents",
                    "must name at least one \"host:port\"",
                ))
            }
            DeValue::Array(items) => items
                .iter()
                .map(|item| doc.endpoint(item, "orchestrator.agents"))
                .collect::<Result<_, _>>()?,
            _ => vec![doc.endpoint(agents, "orchestrator.agents")?],
        };
        Ok(NodeConfig {
            name,
            signing_key,
            identity,
            health_check,
            health_interval,
            generation_file,
            heartbeat,
            swim,
            agents,
        })
    }
}

type Table<'i> = DeTable<'i>;
type Value<'i> = Spanned<DeValue<'i>>;

/// The text being checked, for turning spans into lines.
struct Doc<'a> {
    text: &'a str,
    file: &'a str,
}

impl<'a> Doc<'a> {
    fn error(&self, span: Range<usize>, key: &str, message: impl ToString) -> ConfigError {
        let end = span.start.min(self.text.len());
        ConfigError::Invalid {
            file: self.file.to_string(),
            line: self.text.as_bytes()[..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1,
            key: key.to_string(),
            message: message.to_string(),
        }
    }

    fn only_keys(
        &self,
        table: &Table<'_>,
        section: &str,
        allowed: &[&str],
    ) -> Result<(), ConfigError> {
        for (key, _) in table.iter() {
            if !allowed.contains(&key.get_ref().as_ref()) {
                let dotted = dotted(section, key.get_ref());
                let expected = allowed.join("`, `");
                return Err(self.error(
                    key.span(),
                    &dotted,
                    format!("unknown key (expected `{expected}`)"),
                ));
            }
        }
        Ok(())
    }

    fn section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<Option<(&'t Table<'i>, Range<usize>)>, ConfigError> {
        match root.get(name) {
            Some(value) => match value.get_ref() {
                DeValue::Table(table) => Ok(Some((table, value.span()))),
                _ => Err(self.error(value.span(), name, "must be a table")),
            },
            None => Ok(None),
        }
    }

    fn required_section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<(&'t Table<'i>, Range<usize>), ConfigError> {
        self.section(root, name)?
            .ok_or_else(|| self.error(0..0, name, "missing section"))
    }

    fn required<'t, 'i>(
        &self,
        table: &'t Table<'i>,
        section: &str,
        key: &str,
        section_span: Range<usize>,
    ) -> Result<&'t Value<'i>, ConfigError> {
        table
            .get(key)
            .ok_or_else(|| self.error(section_span, &dotted(section, key), "missing key"))
    }

    fn string(&self, value: &Value<'_>, key: &str) -> Result<(String, Range<usize>), ConfigError> {
        match value.get_ref() {
            DeValue::String(s) => Ok((s.to_string(), value.span())),
            _ => Err(self.error(value.span(), key, "must be a string")),
        }
    }

    fn duration(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<(Duration, Range<usize>), ConfigError> {
        let (text, span) = self.string(value, key)?;
        let duration = humantime::parse_duration(&text).map_err(|e| {
            self.error(
                span.clone(),
                key,
                format!("`{text}` is not a duration ({e}); write e.g. \"5s\""),
            )
        })?;
        if let Some(problem) = poolgate_actors::duration_problem(duration) {
            return Err(self.error(span, key, format!("`{text}` {problem}")));
        }
        Ok((duration, span))
    }

    fn swim(&self, table: &Table<'_>) -> Result<SwimConfig, ConfigError> {
        self.only_keys(
            table,
            "swim",
            &[
                "bind",
                "advertise",
                "seeds",
                "probe_period",
                "probe_rtt",
                "suspicion_timeout",
                "indirect_probes",
                "cluster_keys",
                "insecure",
                "label",
            ],
        )?;
        let mut swim = SwimConfig::default();
        if let Some(value) = table.get("cluster_keys") {
            swim.cluster_keys = self
                .strings(value, "swim.cluster_keys")?
                .into_iter()
                .map(PathBuf::from)
                .collect();
        }
        if let Some(value) = table.get("insecure") {
            swim.insecure = self.boolean(value, "swim.insecure")?;
        }
        if let Some(value) = table.get("label") {
            let (label, span) = self.string(value, "swim.label")?;
            if let Some(problem) = label_problem(&label) {
                return Err(self.error(span, "swim.label", problem));
            }
            swim.label = label;
        }
        if let Some(value) = table.get("bind") {
            swim.bind = self.socket_addr(value, "swim.bind")?;
        }
        match table.get("advertise") {
            Some(value) => swim.advertise = Some(self.endpoint(value, "swim.advertise")?),
            None if swim.bind.ip().is_unspecified() => {
                let span = table.get("bind").map(|v| v.span()).unwrap_or(0..0);
                return Err(self.error(
                    span,
                    "swim.advertise",
                    format!(
                        "swim.bind {} is unspecified, so other members cannot reach the address \
                         it would advertise; set swim.advertise = \"host:port\" to the address \
                         they reach this member at",
                        swim.bind
                    ),
                ));
            }
            None => {}
        }
        if let Some(value) = table.get("seeds") {
            let DeValue::Array(items) = value.get_ref() else {
                return Err(self.error(
                    value.span(),
                    "swim.seeds",
                    "must be a list of \"host:port\"",
                ));
            };
            swim.seeds = items
                .iter()
                .map(|item| self.endpoint(item, "swim.seeds"))
                .collect::<Result<_, _>>()?;
        }
        let timings = &mut swim.timings;
        let mut rtt_span = None;
        if let Some(value) = table.get("probe_period") {
            timings.probe_period = self.duration(value, "swim.probe_period")?.0;
        }
        if let Some(value) = table.get("probe_rtt") {
            let (rtt, span) = self.duration(value, "swim.probe_rtt")?;
            timings.probe_rtt = rtt;
            rtt_span = Some(span);
        }
        if let Some(value) = table.get("suspicion_timeout") {
            timings.suspicion_timeout = self.duration(value, "swim.suspicion_timeout")?.0;
        }
        if let Some(value) = table.get("indirect_probes") {
            timings.indirect_probes = self.whole(value, "swim.indirect_probes", 1..=16)? as usize;
        }
        if timings.probe_rtt >= timings.probe_period {
            return Err(self.error(
                rtt_span.unwrap_or(0..0),
                "swim.probe_rtt",
                "must be shorter than swim.probe_period",
            ));
        }
        Ok(swim)
    }

    fn agents(&self, table: &Table<'_>) -> Result<AgentsConfig, ConfigError> {
        self.only_keys(
            table,
            "agents",
            &["listen", "max_connections", "idle_timeout"],
        )?;
        let mut agents = AgentsConfig::default();
        if let Some(value) = table.get("listen") {
            agents.listen = self.socket_addr(value, "agents.listen")?;
        }
        if let Some(value) = table.get("max_connections") {
            agents.max_connections =
                self.whole(value, "agents.max_connections", 1..=1_000_000)? as usize;
        }
        if let Some(value) = table.get("idle_timeout") {
            agents.idle_timeout = self.duration(value, "agents.idle_timeout")?.0;
        }
        Ok(agents)
    }

    fn registry(&self, table: &Table<'_>) -> Result<BTreeMap<NodeId, PublicKey>, ConfigError> {
        let mut registry = BTreeMap::new();
        for (key, value) in table.iter() {
            let dotted = dotted("registry", key.get_ref());
            let node =
                NodeId::new(key.get_ref()).map_err(|e| self.error(key.span(), &dotted, e))?;
            let (text, span) = self.string(value, &dotted)?;
            let public = PublicKey::parse(&text).map_err(|e| self.error(span, &dotted, e))?;
            registry.insert(node, public);
        }
        Ok(registry)
    }

    fn strings(&self, value: &Value<'_>, key: &str) -> Result<Vec<String>, ConfigError> {
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), key, "must be a list of strings"));
        };
        items
            .iter()
            .map(|item| self.string(item, key).map(|(text, _)| text))
            .collect()
    }

    fn boolean(&self, value: &Value<'_>, key: &str) -> Result<bool, ConfigError> {
        match value.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(self.error(value.span(), key, "must be true or false")),
        }
    }

    fn whole(
        &self,
        value: &Value<'_>,
        key: &str,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ConfigError> {
        value
            .get_ref()
            .as_integer()
            .and_then(|n| u64::from_str_radix(&n.as_str().replace('_', ""), n.radix()).ok())
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                self.error(
                    value.span(),
                    key,
                    format!(
                        "must be a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    fn demo(&self, table: &Table<'_>) -> Result<DemoConfig, ConfigError> {
        self.only_keys(table, "demo", &["nodes", "announce_within", "crash_after"])?;
        let mut demo = DemoConfig::default();
        if let Some(value) = table.get("nodes") {
            let nodes = value
                .get_ref()
                .as_integer()
                .and_then(|n| u32::from_str_radix(&n.as_str().replace('_', ""), n.radix()).ok())
                .filter(|n| (1..=64).contains(n));
            demo.nodes = nodes.ok_or_else(|| {
                self.error(
                    value.span(),
                    "demo.nodes",
                    "must be a whole number from 1 to 64",
                )
            })?;
        }
        if let Some(value) = table.get("announce_within") {
            demo.announce_within = self.duration(value, "demo.announce_within")?.0;
        }
        if let Some(value) = table.get("crash_after") {
            demo.crash_after = self.duration(value, "demo.crash_after")?.0;
        }
        Ok(demo)
    }

    fn socket_addr(&self, value: &Value<'_>, key: &str) -> Result<SocketAddr, ConfigError> {
        let (text, span) = self.string(value, key)?;
        text.parse().map_err(|_| {
            self.error(
                span,
                key,
                format!("`{text}` is not an address like \"127.0.0.1:7946\""),
            )
        })
    }

    fn endpoint(&self, value: &Value<'_>, key: &str) -> Result<Endpoint, ConfigError> {
        let (text, span) = self.string(value, key)?;
        Endpoint::parse(&text).map_err(|e| self.error(span, key, e))
    }

    fn members(&self, value: &Value<'_>, id: PoolId) -> Result<PoolDefinition, ConfigError> {
        const KEY: &str = "pool.members";
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), KEY, "must be a list of node ids"));
        };
        let mut members = Vec::with_capacity(items.len());
        let mut spans = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (text, span) = self.string(item, KEY)?;
            members.push(NodeId::new(&text).map_err(|e| self.error(span.clone(), KEY, e))?);
            spans.push(span);
        }
        PoolDefinition::new(id, members.clone()).map_err(|e| {
            use poolgate_actors::core::DefinitionError;
            let span = match &e {
                DefinitionError::NoMembers => value.span(),
                DefinitionError::DuplicateMember(node) => members
                    .iter()
                    .zip(&spans)
                    .filter(|(m, _)| *m == node)
                    .nth(1)
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(|| value.span()),
            };
            self.error(span, KEY, e)
        })
    }
}

fn dotted(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[pool]
id = "pool-a"
members = ["node-1", "node-2", "node-3"]

[readiness]
convergence_window = "5s"

[planning]
on_readiness_lost = "wait"   # "wait" | "abort"
wait_timeout = "30s"
"#;

    fn error_of(text: &str) -> (usize, String, String) {
        match Config::parse(text, "config.toml") {
            Err(ConfigError::Invalid {
                line, key, message, ..
            }) => (line, key, message),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn the_spec_example_parses() {
        let config = Config::parse(GOOD, "config.toml").unwrap();
        assert_eq!(config.pool.id().as_str(), "pool-a");
        assert_eq!(config.pool.members().len(), 3);
        assert_eq!(config.convergence_window, Duration::from_secs(5));
        assert_eq!(config.planning.on_readiness_lost, OnReadinessLost::Wait);
        assert_eq!(config.planning.wait_timeout, Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_shipped_config_parses() {
        let text = include_str!("../config.toml");
        Config::parse(text, "config.toml").unwrap();
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let text = GOOD.replace("wait_timeout", "wait_timout");
        let (line, key, message) = error_of(&text);
        assert_eq!((line, key.as_str()), (11, "planning.wait_timout"));
        assert!(message.contains("unknown key"), "{message}");
    }

    #[test]
    fn an_absurd_duration_is_refused_naming_its_key() {
        // Issue 20: a timer this far out cannot be set; refused, not a panic.
        let text = GOOD.replace("wait_timeout = \"30s\"", "wait_timeout = \"1000years\"");
        assert_ne!(text, GOOD);
        let (_, key, message) = error_of(&text);
        assert_eq!(key, "planning.wait_timeout");
        assert!(message.contains("365 days"), "{message}");
    }

    #[test]
    fn an_unknown_section_is_named() {
        let (line, key, _) = error_of(&format!("{GOOD}\n[extra]\nx = 1\n"));
        assert_eq!((line, key.as_str()), (13, "extra"));
    }

    #[test]
    fn an_empty_member_list_is_refused() {
        let text = GOOD.replace(r#"["node-1", "node-2", "node-3"]"#, "[]");
        let (line, key, message) = error_of(&text);
        assert_eq!((line, key.as_str()), (4, "pool.members"));
        assert!(message.contains("no members"), "{message}");
    }

    #[test]
    fn a_duplicated_member_is_refused() {
        let text = GOOD.replace(r#""node-3""#, r#""node-1""#);
        let (line, key, message) = error_of(&text);
        assert_eq!((line, key.as_str()), (4, "pool.members"));
        assert!(message.contains("node-1"), "{message}");
    }

    #[test]
    fn an_invalid_node_id_is_refused() {
        let text = GOOD.replace(r#""node-3""#, r#""""#);
        let (_, key, message) = error_of(&text);
        assert_eq!(key, "pool.members");
        assert!(message.contains("empty"), "{message}");
    }

    #[test]
    fn a_zero_window_is_refused() {
        let (line, key, _) = error_of(&GOOD.replace("\"5s\"", "\"0s\""));
        assert_eq!((line, key.as_str()), (7, "readiness.convergence_window"));
    }

    #[test]
    fn an_unparsable_window_is_refused() {
        let (_, key, message) = error_of(&GOOD.replace("\"5s\"", "\"soon\""));
        assert_eq!(key, "readiness.convergence_window");
        assert!(message.contains("not a duration"), "{message}");
    }

    #[test]
    fn a_wait_timeout_not_longer_than_the_window_is_refused() {
        let (line, key, _) = error_of(&GOOD.replace("\"30s\"", "\"5s\""));
        assert_eq!((line, key.as_str()), (11, "planning.wait_timeout"));
    }

    #[test]
    fn an_unknown_policy_is_refused() {
        let (line, key, message) = error_of(&GOOD.replace("\"wait\"   #", "\"retry\" #"));
        assert_eq!((line, key.as_str()), (10, "planning.on_readiness_lost"));
        assert!(message.contains("retry"), "{message}");
    }

    #[test]
    fn a_missing_key_names_its_section() {
        let text = GOOD.replace("id = \"pool-a\"\n", "");
        let (line, key, _) = error_of(&text);
        assert_eq!((line, key.as_str()), (2, "pool.id"));
    }

    #[test]
    fn a_syntax_error_gives_its_line() {
        let text = GOOD.replace("convergence_window = \"5s\"", "convergence_window = ");
        let (line, key, _) = error_of(&text);
        assert_eq!((line, key.as_str()), (7, "toml"));
    }

    #[test]
    fn swim_and_demo_sections_are_read_and_checked() {
        let text = format!("{GOOD}\n[swim]\nbind = \"127.0.0.1:7946\"\nseeds = [\"127.0.0.1:7947\"]\nprobe_period = \"400ms\"\nprobe_rtt = \"100ms\"\nsuspicion_timeout = \"1s\"\n[demo]\nnodes = 3\ncrash_after = \"2s\"\n");
        let config = Config::parse(&text, "c").unwrap();
        assert_eq!(config.swim.bind.port(), 7946);
        assert_eq!(config.swim.seeds.len(), 1);
        assert_eq!(config.swim.timings.probe_period, Duration::from_millis(400));
        assert_eq!(config.demo.nodes, 3);
        assert_eq!(config.demo.crash_after, Duration::from_secs(2));

        let (line, key, _) = error_of(&text.replace("\"100ms\"", "\"400ms\""));
        assert_eq!((line, key.as_str()), (17, "swim.probe_rtt"));
        let (line, key, _) = error_of(&text.replace("nodes = 3", "nodes = 0"));
        assert_eq!((line, key.as_str()), (20, "demo.nodes"));
        let (_, key, _) = error_of(&text.replace("127.0.0.1:7947", "nowhere"));
        assert_eq!(key, "swim.seeds");
        let (_, key, _) = error_of(&text.replace("probe_period", "probe_perod"));
        assert_eq!(key, "swim.probe_perod");

        assert_eq!(
            config.swim.timings.indirect_probes, 16,
            "the shipped default"
        );
        let fewer = text.replace("[demo]", "indirect_probes = 3\n[demo]");
        let config = Config::parse(&fewer, "c").unwrap();
        assert_eq!(config.swim.timings.indirect_probes, 3);
        let foca = config.swim.timings.foca_config(10);
        assert_eq!(foca.num_indirect_probes.get(), 3);
        let (_, key, _) = error_of(&text.replace("[demo]", "indirect_probes = 0\n[demo]"));
        assert_eq!(key, "swim.indirect_probes");
    }

    #[test]
    fn an_unspecified_bind_needs_advertise_and_hostnames_are_accepted() {
        let unspecified = format!("{GOOD}\n[swim]\nbind = \"0.0.0.0:7946\"\n");
        let (line, key, message) = error_of(&unspecified);
        assert_eq!((line, key.as_str()), (14, "swim.advertise"));
        assert!(message.contains("0.0.0.0:7946"), "{message}");
        let (_, key, _) = error_of(&unspecified.replace("0.0.0.0", "[::]"));
        assert_eq!(key, "swim.advertise");

        let advertised = format!(
            "{GOOD}\n[swim]\nbind = \"0.0.0.0:7946\"\nadvertise = \"orch-1.example:7946\"\nseeds = [\"node-1:7946\", \"10.0.0.2:7946\"]\n"
        );
        let config = Config::parse(&advertised, "c").unwrap();
        assert_eq!(
            config.swim.advertise.as_ref().map(|e| e.as_str()),
            Some("orch-1.example:7946")
        );
        assert_eq!(config.swim.seeds.len(), 2);
        let (_, key, _) = error_of(&advertised.replace("orch-1.example:7946", "orch 1:7946"));
        assert_eq!(key, "swim.advertise");
    }

    const NODE: &str = "[node]\nname = \"node-1\"\nsigning_key = \"k\"\nidentity = \"i\"\n[orchestrator]\nagents = \"orch-1:7947\"\n";

    #[test]
    fn a_node_names_one_orchestrator_or_several_and_a_heartbeat() {
        let one = NodeConfig::parse(NODE, "n").unwrap();
        assert_eq!(one.agents.len(), 1);
        assert_eq!(one.heartbeat, DEFAULT_HEARTBEAT);
        let several = NODE.replace(
            "agents = \"orch-1:7947\"",
            "agents = [\"orch-1:7947\", \"10.0.0.2:7947\"]",
        );
        assert_eq!(NodeConfig::parse(&several, "n").unwrap().agents.len(), 2);
        let none = NODE.replace("agents = \"orch-1:7947\"", "agents = []");
        let error = NodeConfig::parse(&none, "n").unwrap_err().to_string();
        assert!(error.contains("orchestrator.agents"), "{error}");
        let beat = NODE.replace(
            "identity = \"i\"",
            "identity = \"i\"\nheartbeat = \"250ms\"",
        );
        assert_eq!(
            NodeConfig::parse(&beat, "n").unwrap().heartbeat,
            Duration::from_millis(250)
        );
        let fast = beat.replace("250ms", "1ms");
        let error = NodeConfig::parse(&fast, "n").unwrap_err().to_string();
        assert!(error.contains("node.heartbeat"), "{error}");
    }

    #[test]
    fn the_planning_section_is_optional() {
        let text = GOOD.split("[planning]").next().unwrap();
        let config = Config::parse(text, "c").unwrap();
        assert_eq!(config.planning.wait_timeout, None);
    }
}
