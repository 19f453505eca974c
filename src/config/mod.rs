//! `config.toml`: the pool, the convergence window and the planning policy
//! (design §4). Every error names the key and the line it is on.
//!
//! - this file: the [`Config`] schema, the gate's sections and `[state]`;
//! - `doc`: the spanned-TOML checker every section is read through;
//! - `cluster` (feature `live`): `[swim]`, `[agents]`, `[registry]`,
//!   `[demo]`;
//! - `node` (feature `live`): a node agent's `node.toml`;
//! - [`endpoint`]: `host:port` as an operator writes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::{OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId};
use poolgate_actors::GateSettings;
use toml::de::DeTable;

#[cfg(feature = "live")]
mod cluster;
mod doc;
pub mod endpoint;
#[cfg(feature = "live")]
mod node;

#[cfg(feature = "live")]
pub use cluster::{
    label_problem, AgentsConfig, DemoConfig, Registry, SwimConfig, SwimTimings,
    DEFAULT_INDIRECT_PROBES,
};
use doc::Doc;
#[cfg(feature = "live")]
pub use node::{NodeConfig, DEFAULT_HEARTBEAT, HEARTBEATS_MISSED};

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
///
/// Built in code, it starts from [`Config::new`] (the pool and its
/// window, every other section at its default); its fields can then be
/// changed, and what starts from it checks them as `config.toml`'s are
/// checked ([`Config::gate_settings`], the live orchestrator's start).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `[pool]`: the candidate pool (with `[pools.<id>]`: the first pool,
    /// by id).
    pub pool: PoolDefinition,
    /// `[pools.<id>]`: every pool of a fleet, by id, each with its window
    /// and policy (design §14); empty with `[pool]`.
    pub pools: Vec<PoolConfig>,
    /// `[readiness] convergence_window`.
    pub convergence_window: Duration,
    /// `[planning]`: what to do when readiness is lost before commit.
    pub planning: PlanningPolicy,
    #[cfg(feature = "live")]
    /// `[swim]`: the live SWIM member (optional section).
    pub swim: SwimConfig,
    #[cfg(feature = "live")]
    /// `[demo]`: the live demonstration (optional section).
    pub demo: DemoConfig,
    #[cfg(feature = "live")]
    /// `[agents]`: where node agents announce themselves.
    pub agents: AgentsConfig,
    #[cfg(feature = "live")]
    /// `[registry]`: the nodes the orchestrator knows, each with its pinned
    /// public key (a registry entry is the `known` fact).
    pub registry: Registry,
    /// `[state]`: where epochs and the active run survive a restart.
    pub state: StateConfig,
    /// `[run]`: what `poolgate run` does while it guards a command.
    pub run: RunConfig,
    /// `[control] socket`: the Unix socket `watch` serves, through which
    /// `run` and `status` given the same config reach it (design §14).
    pub control: Option<PathBuf>,
}

/// One pool of `[pools.<id>]`: its members, and its window and policy
/// (each defaults to `[readiness]`'s and `[planning]`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pool's id and members.
    pub definition: PoolDefinition,
    /// `convergence_window`.
    pub convergence_window: Duration,
    /// `on_readiness_lost` and `wait_timeout`.
    pub planning: PlanningPolicy,
}

impl PoolConfig {
    /// What the pool's gate needs.
    pub fn gate_settings(&self) -> Result<GateSettings, poolgate_actors::GateError> {
        GateSettings::new(
            self.definition.clone(),
            self.convergence_window,
            self.planning,
        )
    }
}

/// `[run]`: `poolgate run` among replicas (docs/failover.md §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// `unguarded_after`: how long `run` goes on without confirming that
    /// its run is still guarded (a replica leads and the stored state
    /// holds the run) before it stops its command and exits 5. Also the
    /// TTL of the requester's etcd session: a requester gone for longer
    /// has stopped its command, and the leader ends its run.
    pub unguarded_after: Duration,
}

/// `[run] unguarded_after`'s default.
pub const DEFAULT_UNGUARDED_AFTER: Duration = Duration::from_secs(10);

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            unguarded_after: DEFAULT_UNGUARDED_AFTER,
        }
    }
}

/// `[state]`: the durable state (design §9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// `path`: the state file; absent = memory only.
    pub path: Option<PathBuf>,
    /// `restore_grace`: how long a restored committed run's required nodes
    /// have to be seen ready again with their committed fingerprints.
    pub restore_grace: Duration,
    /// `etcd`: the etcd v3 endpoints (`http://host:port`) of replicated
    /// state (design §12), instead of `path`; empty = not replicated.
    pub etcd: Vec<String>,
    /// `lease`: the leadership lease's TTL (whole seconds; etcd raises it
    /// to its minimum). A leader stops acting two thirds of it after its
    /// last renewal.
    pub lease: Duration,
    /// `prefix`: where the state lives in etcd (default
    /// `/poolgate/<label>/<pool>/`).
    pub prefix: Option<String>,
    /// `key`: the file of the 32-byte key (`poolgate keygen --cluster`)
    /// under which every record and request in etcd carries a MAC, shared
    /// by the replicas and the requesters.
    pub key: Option<PathBuf>,
    /// `username` (with `password_file`): etcd's own auth, as this user.
    pub username: Option<String>,
    /// `password_file`: the file holding `username`'s password (one line).
    pub password_file: Option<PathBuf>,
    /// `insecure`: plain `http://` endpoints, and no `key`, are accepted
    /// (said on every start). Without it, `[state] etcd` needs a `key`
    /// and refuses plain http.
    pub insecure: bool,
    /// `ca_file`, `cert_file`, `key_file`: TLS to `https://` endpoints
    /// (the authorities that sign etcd's certificates; the client's
    /// certificate and key, for etcd's `--client-cert-auth`).
    pub tls: crate::etcd::TlsFiles,
}

/// `[state] lease`'s default.
///
/// Long enough to ride through an election of etcd's own (etcd elects in
/// one to two seconds at its defaults, and renews no lease meanwhile; the
/// leader renews every sixth of the TTL and acts until two thirds of it
/// after its last renewal began: at least 3 s here), short enough that a
/// leader that dies is replaced within 7 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(6);

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            path: None,
            restore_grace: Duration::from_secs(30),
            etcd: Vec::new(),
            lease: DEFAULT_LEASE,
            prefix: None,
            key: None,
            username: None,
            password_file: None,
            insecure: false,
            tls: crate::etcd::TlsFiles::default(),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// Why [`Config::gate_settings_with_state`] gave no settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The configuration holds what `config.toml` would refuse (changed
    /// in code).
    #[error(transparent)]
    Gate(#[from] poolgate_actors::GateError),
    /// The state file cannot be used.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
}

impl Config {
    /// A configuration of `pool` with its convergence `window`, every other
    /// section as an empty `config.toml` would leave it (planning waits,
    /// without a timeout; state in memory); refused
    /// ([`GateError::InvalidSettings`](poolgate_actors::GateError)) if the
    /// window is one `config.toml` would refuse.
    ///
    /// ```
    /// use std::time::Duration;
    /// use poolgate::core::{NodeId, PoolDefinition, PoolId};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = PoolDefinition::new(PoolId::new("pool-a")?, vec![NodeId::new("node-1")?])?;
    /// let config = poolgate::Config::new(pool.clone(), Duration::from_secs(5))?;
    /// assert_eq!(config.convergence_window, Duration::from_secs(5));
    /// // No window at all is refused, as `convergence_window = "0s"` is.
    /// assert!(poolgate::Config::new(pool, Duration::ZERO).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(
        pool: PoolDefinition,
        window: Duration,
    ) -> Result<Config, poolgate_actors::GateError> {
        let config = Config {
            pool,
            pools: Vec::new(),
            control: None,
            convergence_window: window,
            planning: PlanningPolicy {
                on_readiness_lost: OnReadinessLost::Wait,
                wait_timeout: None,
            },
            #[cfg(feature = "live")]
            swim: SwimConfig::default(),
            #[cfg(feature = "live")]
            demo: DemoConfig::default(),
            #[cfg(feature = "live")]
            agents: AgentsConfig::default(),
            #[cfg(feature = "live")]
            registry: Registry::new(),
            state: StateConfig::default(),
            run: RunConfig::default(),
        };
        config.gate_settings()?;
        Ok(config)
    }

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
                "pools",
                "readiness",
                "planning",
                "swim",
                "demo",
                "agents",
                "registry",
                "state",
                "run",
                "control",
            ],
        )?;

        let pool_section = doc.section(root, "pool")?;
        let pools_section = doc.section(root, "pools")?;
        let readiness = doc.section(root, "readiness")?;
        let planning = doc.section(root, "planning")?;

        let convergence_window = match readiness {
            Some((table, span)) => {
                doc.only_keys(table, "readiness", &["convergence_window"])?;
                let window = doc.required(table, "readiness", "convergence_window", span)?;
                Some(doc.duration(window, "readiness.convergence_window")?.0)
            }
            None if pools_section.is_some() => None,
            None => return Err(doc.error(0..0, "readiness", "missing section")),
        };
        let mut planning_policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        if let Some((table, _)) = planning {
            doc.only_keys(table, "planning", &["on_readiness_lost", "wait_timeout"])?;
            doc.planning(table, "planning", convergence_window, &mut planning_policy)?;
        }

        let (pool, pools) = match (pool_section, pools_section) {
            (Some((_, span)), Some(_)) => {
                return Err(doc.error(
                    span,
                    "pool",
                    "give either [pool] (one pool) or [pools.<id>] (a fleet's pools), not both",
                ))
            }
            (None, None) => {
                return Err(doc.error(0..0, "pool", "missing section (or [pools.<id>])"))
            }
            (Some((pool_table, pool_span)), None) => {
                doc.only_keys(pool_table, "pool", &["id", "members"])?;
                let id = doc.required(pool_table, "pool", "id", pool_span.clone())?;
                let id = doc.string(id, "pool.id")?;
                let id = PoolId::new(&id.0).map_err(|e| doc.error(id.1, "pool.id", e))?;
                let members = doc.required(pool_table, "pool", "members", pool_span)?;
                (doc.members(members, id, "pool.members")?, Vec::new())
            }
            (None, Some((table, span))) => {
                let pools = doc.pools(table, convergence_window, planning_policy)?;
                let Some(first) = pools.first() else {
                    return Err(doc.error(span, "pools", "defines no pool"));
                };
                (first.definition.clone(), pools)
            }
        };
        // With [pools], the defaults are the first pool's where [readiness]
        // gives none.
        let convergence_window = convergence_window
            .or_else(|| pools.first().map(|p| p.convergence_window))
            .unwrap_or_default();

        #[cfg(not(feature = "live"))]
        for section in ["swim", "demo", "agents", "registry"] {
            if let Some((_, span)) = doc.section(root, section)? {
                return Err(doc.error(
                    span,
                    section,
                    "the live cluster's section needs poolgate built with the `live` feature",
                ));
            }
        }
        #[cfg(feature = "live")]
        let swim = match doc.section(root, "swim")? {
            Some((table, _)) => doc.swim(table)?,
            None => SwimConfig::default(),
        };
        #[cfg(feature = "live")]
        let demo = match doc.section(root, "demo")? {
            Some((table, _)) => doc.demo(table)?,
            None => DemoConfig::default(),
        };
        #[cfg(feature = "live")]
        let agents = match doc.section(root, "agents")? {
            Some((table, _)) => doc.agents(table)?,
            None => AgentsConfig::default(),
        };
        #[cfg(feature = "live")]
        let registry = match doc.section(root, "registry")? {
            Some((table, _)) => doc.registry(table)?,
            None => Registry::new(),
        };
        let mut state = StateConfig::default();
        if let Some((table, _)) = doc.section(root, "state")? {
            doc.only_keys(
                table,
                "state",
                &[
                    "path",
                    "restore_grace",
                    "etcd",
                    "lease",
                    "prefix",
                    "key",
                    "insecure",
                    "username",
                    "password_file",
                    "ca_file",
                    "cert_file",
                    "key_file",
                ],
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
                if lease.subsec_nanos() != 0 {
                    return Err(doc.error(
                        span,
                        "state.lease",
                        "must be whole seconds (etcd's leases are)",
                    ));
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
            if let Some(value) = table.get("key") {
                state.key = Some(PathBuf::from(doc.string(value, "state.key")?.0));
            }
            if let Some(value) = table.get("insecure") {
                state.insecure = doc.boolean(value, "state.insecure")?;
            }
            if let Some(value) = table.get("username") {
                let (user, span) = doc.string(value, "state.username")?;
                if user.is_empty() {
                    return Err(doc.error(span, "state.username", "must not be empty"));
                }
                state.username = Some(user);
            }
            if let Some(value) = table.get("password_file") {
                state.password_file =
                    Some(PathBuf::from(doc.string(value, "state.password_file")?.0));
            }
            for (key, file) in [
                ("ca_file", &mut state.tls.ca_file),
                ("cert_file", &mut state.tls.cert_file),
                ("key_file", &mut state.tls.key_file),
            ] {
                if let Some(value) = table.get(key) {
                    let (path, span) = doc.string(value, &format!("state.{key}"))?;
                    if path.is_empty() {
                        return Err(doc.error(span, &format!("state.{key}"), "must not be empty"));
                    }
                    *file = Some(PathBuf::from(path));
                }
            }
            if state.tls.cert_file.is_some() != state.tls.key_file.is_some() {
                let (key, other) = match state.tls.cert_file {
                    Some(_) => ("state.cert_file", "key_file"),
                    None => ("state.key_file", "cert_file"),
                };
                let span = table
                    .get(key.trim_start_matches("state."))
                    .map_or(0..0, |v| v.span());
                return Err(doc.error(span, key, format!("needs {other} too")));
            }
            if state.tls.any() && !state.etcd.iter().all(|e| e.starts_with("https://")) {
                let key = ["ca_file", "cert_file", "key_file"]
                    .into_iter()
                    .find(|k| table.contains_key(*k))
                    .unwrap_or("ca_file");
                let span = table.get(key).map_or(0..0, |v| v.span());
                return Err(doc.error(
                    span,
                    &format!("state.{key}"),
                    "TLS files need [state] etcd endpoints, every one https://",
                ));
            }
            if state.username.is_some() != state.password_file.is_some() {
                let (key, other) = match state.username {
                    Some(_) => ("state.username", "password_file"),
                    None => ("state.password_file", "username"),
                };
                let span = table
                    .get(key.trim_start_matches("state."))
                    .map_or(0..0, |v| v.span());
                return Err(doc.error(span, key, format!("needs {other} too")));
            }
            if let Some(value) = table.get("etcd") {
                if !state.insecure {
                    if let Some(plain) = state.etcd.iter().find(|e| e.starts_with("http://")) {
                        return Err(doc.error(
                            value.span(),
                            "state.etcd",
                            format!("{plain}: plain http is refused (anyone on the path reads and rewrites the gate's state); set [state] insecure = true to accept it"),
                        ));
                    }
                }
                if state.key.is_none() && !state.insecure {
                    return Err(doc.error(
                        value.span(),
                        "state.key",
                        "[state] etcd needs a key (poolgate keygen --cluster --out state.key), shared by the replicas and the requesters; or insecure = true",
                    ));
                }
            }
        }

        let mut run = RunConfig::default();
        if let Some((table, _)) = doc.section(root, "run")? {
            doc.only_keys(table, "run", &["unguarded_after"])?;
            if let Some(value) = table.get("unguarded_after") {
                let (after, span) = doc.duration(value, "run.unguarded_after")?;
                if after < Duration::from_secs(1) || after > Duration::from_secs(30) {
                    return Err(doc.error(span, "run.unguarded_after", "must be from 1s to 30s"));
                }
                if after.subsec_nanos() != 0 {
                    return Err(doc.error(
                        span,
                        "run.unguarded_after",
                        "must be whole seconds (it is also the requester's etcd lease)",
                    ));
                }
                run.unguarded_after = after;
            }
        }

        let mut control = None;
        if let Some((table, span)) = doc.section(root, "control")? {
            doc.only_keys(table, "control", &["socket"])?;
            let value = doc.required(table, "control", "socket", span)?;
            let (text, span) = doc.string(value, "control.socket")?;
            if text.is_empty() {
                return Err(doc.error(span, "control.socket", "must be a path"));
            }
            if !state.etcd.is_empty() {
                return Err(doc.error(
                    span,
                    "control.socket",
                    "among replicas ([state] etcd), run and status go through etcd: [control] socket is for one orchestrator",
                ));
            }
            control = Some(PathBuf::from(text));
        }

        Ok(Config {
            pool,
            pools,
            control,
            convergence_window,
            planning: planning_policy,
            #[cfg(feature = "live")]
            swim,
            #[cfg(feature = "live")]
            demo,
            #[cfg(feature = "live")]
            agents,
            #[cfg(feature = "live")]
            registry,
            state,
            run,
        })
    }

    /// Relative key paths, resolved from `dir` (the config file's folder).
    pub fn resolve_paths(&mut self, dir: &Path) {
        for path in [
            &mut self.state.path,
            &mut self.state.key,
            &mut self.state.password_file,
            &mut self.state.tls.ca_file,
            &mut self.state.tls.cert_file,
            &mut self.state.tls.key_file,
            &mut self.control,
        ] {
            if let Some(path) = path.as_mut().filter(|p| p.is_relative()) {
                *path = dir.join(&*path);
            }
        }
        #[cfg(feature = "live")]
        for path in &mut self.swim.cluster_keys {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }

    /// What the gate needs, in memory only; refused
    /// ([`GateError::InvalidSettings`](poolgate_actors::GateError)) only for
    /// a configuration changed in code to what `config.toml` would refuse.
    pub fn gate_settings(&self) -> Result<GateSettings, poolgate_actors::GateError> {
        match self.pools.first() {
            // With [pools.<id>]: the first pool, with its own window and policy.
            Some(first) => first.gate_settings(),
            None => GateSettings::new(self.pool.clone(), self.convergence_window, self.planning),
        }
    }

    /// This configuration narrowed to one pool (`run --pool`): `id`, or
    /// the only pool when `None`; an error naming the pools defined when
    /// there is no such pool, or several and none named.
    pub fn with_only_pool(&self, id: Option<&str>) -> Result<Config, String> {
        let defined: Vec<String> = self
            .pool_definitions()
            .iter()
            .map(|p| p.id().to_string())
            .collect();
        let chosen = match (id, self.pools.len()) {
            (None, 0 | 1) => return Ok(self.clone()),
            (None, _) => {
                return Err(format!(
                    "several pools are defined ({}): name one with --pool",
                    defined.join(", ")
                ))
            }
            (Some(id), 0) if id == self.pool.id().as_str() => return Ok(self.clone()),
            (Some(id), _) => self
                .pools
                .iter()
                .find(|p| p.definition.id().as_str() == id)
                .ok_or_else(|| format!("no pool {id} (defined: {})", defined.join(", ")))?,
        };
        let mut narrowed = self.clone();
        narrowed.pool = chosen.definition.clone();
        narrowed.convergence_window = chosen.convergence_window;
        narrowed.planning = chosen.planning;
        narrowed.pools = vec![chosen.clone()];
        Ok(narrowed)
    }

    /// Every pool's definition: `[pool]`'s one, or each of `[pools.<id>]`,
    /// by id.
    pub fn pool_definitions(&self) -> Vec<PoolDefinition> {
        if self.pools.is_empty() {
            return vec![self.pool.clone()];
        }
        self.pools.iter().map(|p| p.definition.clone()).collect()
    }

    /// Every pool's gate settings: `[pool]`'s one, or each of
    /// `[pools.<id>]`, by id.
    pub fn pool_settings(&self) -> Result<Vec<GateSettings>, poolgate_actors::GateError> {
        if self.pools.is_empty() {
            return Ok(vec![self.gate_settings()?]);
        }
        self.pools.iter().map(PoolConfig::gate_settings).collect()
    }

    /// What the gate needs, with the state file of `[state] path` (or
    /// `path`, which wins) opened and read.
    pub fn gate_settings_with_state(
        &self,
        path: Option<&Path>,
    ) -> Result<GateSettings, SettingsError> {
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
        SettingsError,
    > {
        let (mut all, store) = self.pool_settings_with_store(path)?;
        let first = all.remove(0);
        Ok((first, store))
    }

    /// Every pool's gate settings with its durable state: `[pool]`'s under
    /// the state file's `state` record, each of `[pools.<id>]` under its
    /// own (`pools/<id>/state`); with the opened store.
    pub fn pool_settings_with_store(
        &self,
        path: Option<&Path>,
    ) -> Result<PoolsWithStore, SettingsError> {
        let settings = self.pool_settings()?;
        let Some(path) = path.or(self.state.path.as_deref()) else {
            return Ok((settings, None));
        };
        let (store, restored) = open_file_store(path)?;
        let durable = |store: std::sync::Arc<dyn poolgate_actors::StateStore>, restored| {
            poolgate_actors::DurableSettings {
                store,
                restored,
                restore_grace: self.state.restore_grace,
            }
        };
        if self.pools.is_empty() {
            let settings = settings
                .into_iter()
                .map(|s| s.with_durable(durable(store.clone(), restored.clone())))
                .collect::<Result<_, _>>()?;
            return Ok((settings, Some(store)));
        }
        let mut kept = Vec::with_capacity(settings.len());
        for s in settings {
            let (record, held) = std::sync::Arc::clone(&store)
                .pool_record(s.definition.id())
                .map_err(|e| crate::state::StateError {
                    file: path.display().to_string(),
                    what: e.to_string(),
                })?;
            kept.push(s.with_durable(durable(record, held))?);
        }
        Ok((kept, Some(store)))
    }
}

/// Every pool's gate settings with its durable state, and the store
/// opened (the orchestrator keeps agent sequences in it too).
pub type PoolsWithStore = (
    Vec<GateSettings>,
    Option<std::sync::Arc<dyn crate::state::OrchestratorStore>>,
);

/// The state file at `path`, opened (redb).
#[cfg(feature = "redb")]
fn open_file_store(path: &Path) -> Result<crate::state::OpenedStore, crate::state::StateError> {
    let (store, restored) = crate::state::RedbStore::open(path)?;
    Ok((store, restored))
}

/// Without the `redb` feature there is no file store: an error naming
/// the file, never a gate that forgets.
#[cfg(not(feature = "redb"))]
fn open_file_store(path: &Path) -> Result<crate::state::OpenedStore, crate::state::StateError> {
    Err(crate::state::StateError {
        file: path.display().to_string(),
        what: "[state] path needs poolgate built with the `redb` feature".into(),
    })
}

/// A duration as an operator reads it: humantime's words, to the whole
/// millisecond ("1s 333ms", not "1s 333ms 333us 333ns").
pub fn in_words(d: std::time::Duration) -> humantime::FormattedDuration {
    humantime::format_duration(std::time::Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_said_to_the_whole_millisecond() {
        let third = Duration::from_secs(4) / 3;
        assert_eq!(in_words(third).to_string(), "1s 333ms");
        assert_eq!(in_words(Duration::from_micros(999)).to_string(), "0s");
        assert_eq!(in_words(Duration::from_secs(90)).to_string(), "1m 30s");
    }

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
    fn etcd_needs_a_state_key_and_refuses_plain_http_unless_insecure() {
        let etcd =
            |extra: &str| format!("{GOOD}\n[state]\netcd = [\"http://127.0.0.1:2379\"]\n{extra}");
        let (_, key, message) = error_of(&etcd("key = \"state.key\"\n"));
        assert_eq!(key, "state.etcd");
        assert!(message.contains("plain http"), "{message}");
        let (_, key, _) = error_of(&etcd(""));
        assert_eq!(key, "state.etcd", "plain http is said first");
        let open = Config::parse(&etcd("insecure = true\n"), "c").unwrap();
        assert!(open.state.insecure && open.state.key.is_none());
        let keyed = Config::parse(&etcd("insecure = true\nkey = \"state.key\"\n"), "c").unwrap();
        assert_eq!(keyed.state.key, Some(PathBuf::from("state.key")));
        let (_, key, _) = error_of(&etcd("insecure = \"yes\"\n"));
        assert_eq!(key, "state.insecure");
        let user = Config::parse(
            &etcd("insecure = true\nusername = \"gate\"\npassword_file = \"pw\"\n"),
            "c",
        )
        .unwrap();
        assert_eq!(user.state.username.as_deref(), Some("gate"));
        let (_, key, message) = error_of(&etcd("insecure = true\nusername = \"gate\"\n"));
        assert_eq!(key, "state.username");
        assert!(message.contains("password_file"), "{message}");
        let (_, key, _) = error_of(&etcd("insecure = true\npassword_file = \"pw\"\n"));
        assert_eq!(key, "state.password_file");
    }

    #[test]
    fn tls_files_go_with_https_endpoints_in_pairs_and_resolve_beside_the_config() {
        let etcd = |endpoint: &str, extra: &str| {
            format!("{GOOD}\n[state]\netcd = [\"{endpoint}\"]\nkey = \"state.key\"\n{extra}")
        };
        let https = "https://etcd-1:2379";
        let mut both = Config::parse(
            &etcd(
                https,
                "ca_file = \"ca.pem\"\ncert_file = \"client.pem\"\nkey_file = \"client.key\"\n",
            ),
            "c",
        )
        .unwrap();
        assert!(!both.state.insecure, "https with a key needs no insecure");
        both.resolve_paths(Path::new("/etc/poolgate"));
        assert_eq!(
            both.state.tls.ca_file,
            Some(PathBuf::from("/etc/poolgate/ca.pem"))
        );
        assert_eq!(
            both.state.tls.key_file,
            Some(PathBuf::from("/etc/poolgate/client.key"))
        );
        let (_, key, message) = error_of(&etcd(https, "cert_file = \"client.pem\"\n"));
        assert_eq!(key, "state.cert_file");
        assert!(message.contains("key_file"), "{message}");
        let (_, key, _) = error_of(&etcd(https, "key_file = \"client.key\"\n"));
        assert_eq!(key, "state.key_file");
        let (_, key, message) = error_of(&etcd(
            "http://etcd-1:2379",
            "insecure = true\nca_file = \"ca.pem\"\n",
        ));
        assert_eq!(key, "state.ca_file");
        assert!(message.contains("https"), "{message}");
        let (_, key, _) = error_of(&etcd(https, "ca_file = \"\"\n"));
        assert_eq!(key, "state.ca_file");
        let (_, key, _) = error_of(&etcd(https, "ca = \"ca.pem\"\n"));
        assert_eq!(key, "state.ca");
    }

    #[test]
    fn run_unguarded_after_is_whole_seconds_up_to_30s_and_defaults_to_10s() {
        assert_eq!(
            Config::parse(GOOD, "c").unwrap().run.unguarded_after,
            DEFAULT_UNGUARDED_AFTER
        );
        let set = |value: &str| format!("{GOOD}\n[run]\nunguarded_after = \"{value}\"\n");
        assert_eq!(
            Config::parse(&set("30s"), "c").unwrap().run.unguarded_after,
            Duration::from_secs(30)
        );
        for bad in ["31s", "500ms", "1500ms", "0s"] {
            let (_, key, _) = error_of(&set(bad));
            assert_eq!(key, "run.unguarded_after", "{bad}");
        }
        let (_, key, _) = error_of(&format!("{GOOD}\n[run]\nunguarded = \"5s\"\n"));
        assert!(key.contains("unguarded"), "{key}");
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

    #[cfg(not(feature = "live"))]
    #[test]
    fn without_the_live_feature_its_sections_are_refused_by_name() {
        let text = include_str!("../../config.toml");
        let (_, key, message) = error_of(text);
        assert_eq!(key, "swim");
        assert!(message.contains("`live` feature"), "{message}");
        let (_, key, _) = error_of(&format!("{GOOD}\n[registry]\nnode-1 = \"k\"\n"));
        assert_eq!(key, "registry");
    }

    #[cfg(feature = "live")]
    #[test]
    fn the_shipped_config_parses() {
        let text = include_str!("../../config.toml");
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

    const FLEET: &str = r#"[readiness]
convergence_window = "5s"
[planning]
on_readiness_lost = "wait"
wait_timeout = "30s"
[pools.b]
members = ["n2", "n3"]
convergence_window = "2s"
on_readiness_lost = "abort"
wait_timeout = "10s"
[pools.a]
members = ["n1", "n2"]
"#;

    #[test]
    fn pools_take_their_own_settings_or_the_defaults_and_come_by_id() {
        let config = Config::parse(FLEET, "config.toml").unwrap();
        let ids: Vec<&str> = config
            .pools
            .iter()
            .map(|p| p.definition.id().as_str())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(config.pool.id().as_str(), "a", "the first pool, by id");
        let (a, b) = (&config.pools[0], &config.pools[1]);
        assert_eq!(a.convergence_window, Duration::from_secs(5));
        assert_eq!(a.planning.on_readiness_lost, OnReadinessLost::Wait);
        assert_eq!(a.planning.wait_timeout, Some(Duration::from_secs(30)));
        assert_eq!(b.convergence_window, Duration::from_secs(2));
        assert_eq!(b.planning.on_readiness_lost, OnReadinessLost::Abort);
        assert_eq!(b.planning.wait_timeout, Some(Duration::from_secs(10)));
        assert!(b.gate_settings().is_ok());
        // [readiness] is optional when every pool gives its window.
        let own = "[pools.a]\nmembers = [\"n1\"]\nconvergence_window = \"1s\"\n";
        let config = Config::parse(own, "config.toml").unwrap();
        assert_eq!(config.convergence_window, Duration::from_secs(1));
    }

    #[test]
    fn a_wrong_pool_of_a_fleet_is_named_by_key_and_line() {
        let cases = [
            (
                FLEET.replace(
                    "[pools.a]",
                    "[pool]\nid = \"x\"\nmembers = [\"n\"]\n[pools.a]",
                ),
                11,
                "pool",
            ),
            (
                FLEET.replace("[\"n1\", \"n2\"]", "[\"n1\", \"n1\"]"),
                12,
                "pools.a.members",
            ),
            (
                FLEET.replace("[\"n1\", \"n2\"]", "[]"),
                12,
                "pools.a.members",
            ),
            (
                FLEET.replace("members = [\"n1\", \"n2\"]", "size = 2"),
                12,
                "pools.a.size",
            ),
            (
                FLEET.replace("wait_timeout = \"10s\"", "wait_timeout = \"2s\""),
                10,
                "pools.b.wait_timeout",
            ),
            (
                FLEET.replace("[pools.a]", "[pools.\"a\\u0007\"]"),
                11,
                "pools.a\u{7}",
            ),
            (
                FLEET.replace(
                    "convergence_window = \"5s\"",
                    "convergence_window = \"31s\"",
                ),
                5,
                "planning.wait_timeout",
            ),
            (
                "[pools.a]\nmembers = [\"n1\"]\n".to_string(),
                1,
                "pools.a.convergence_window",
            ),
            (
                "[pools]\n[readiness]\nconvergence_window = \"1s\"\n".to_string(),
                1,
                "pools",
            ),
            (
                "[readiness]\nconvergence_window = \"1s\"\n".to_string(),
                1,
                "pool",
            ),
        ];
        for (text, line, key) in cases {
            let (l, k, message) = error_of(&text);
            assert_eq!((l, k.as_str()), (line, key), "{message}\n{text}");
        }
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

    #[cfg(feature = "live")]
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

    #[cfg(feature = "live")]
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

    #[cfg(feature = "live")]
    const NODE: &str = "[node]\nname = \"node-1\"\nsigning_key = \"k\"\nidentity = \"i\"\n[orchestrator]\nagents = \"orch-1:7947\"\n";

    #[cfg(feature = "live")]
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

    #[test]
    fn state_etcd_keys_are_checked_by_name() {
        let base = "[pool]\nid = \"p\"\nmembers = [\"a\"]\n[readiness]\nconvergence_window = \"1s\"\n[state]\n";
        let (_, key, message) = error_of(&format!(
            "{base}etcd = [\"http://127.0.0.1:2379\"]\nlease = \"2500ms\"\n"
        ));
        assert_eq!(key, "state.lease");
        assert!(message.contains("whole seconds"), "{message}");
        // https is taken; without a state key it is refused for that.
        let (_, key, _) = error_of(&format!("{base}etcd = [\"https://e:2379\"]\n"));
        assert_eq!(key, "state.key");
        let (_, key, message) = error_of(&format!("{base}etcd = [\"ftp://e:2379\"]\n"));
        assert_eq!(key, "state.etcd");
        assert!(message.contains("https://host:port"), "{message}");
        let (_, key, _) = error_of(&format!(
            "{base}path = \"s.db\"\netcd = [\"http://127.0.0.1:2379\"]\n"
        ));
        assert_eq!(key, "state.etcd");
        let config = Config::parse(
            &format!("{base}etcd = [\"http://127.0.0.1:2379\"]\nlease = \"3s\"\ninsecure = true\n"),
            "config.toml",
        )
        .unwrap();
        assert_eq!(config.state.lease, Duration::from_secs(3));
    }
}
