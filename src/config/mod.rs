//! `config.toml`: the pool, the convergence window and the planning policy
//! (design §4). Every error names the key and the line it is on.
//!
//! - this file: the [`Config`] schema, the gate's sections and `[state]`;
//! - `parse`: reading the text, section by section;
//! - `settings`: what a checked configuration gives the gates;
//! - `doc`: the spanned-TOML checker every section is read through;
//! - `cluster` (feature `live`): `[swim]`, `[agents]`, `[registry]`,
//!   `[demo]`;
//! - `node` (feature `live`): a node agent's `node.toml`;
//! - [`endpoint`]: `host:port` as an operator writes it.

use std::path::PathBuf;
use std::time::Duration;

use poolgate_actors::core::{OnReadinessLost, PlanningPolicy, PoolDefinition};
use poolgate_actors::GateSettings;

#[cfg(feature = "live")]
pub(crate) mod cluster;
mod doc;
pub mod endpoint;
#[cfg(feature = "live")]
mod node;
mod parse;
mod settings;
#[cfg(test)]
mod tests;

/// The TLS files `[state] ca_file`, `cert_file` and `key_file` name.
pub use crate::ha::etcd::TlsFiles;
#[cfg(feature = "live")]
pub use cluster::{
    label_problem, AgentsConfig, DemoConfig, Registry, SwimConfig, SwimTimings,
    DEFAULT_INDIRECT_PROBES,
};
#[cfg(feature = "live")]
pub use node::{NodeConfig, DEFAULT_HEARTBEAT, HEARTBEATS_MISSED};
pub use settings::PoolsWithStore;

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
    /// `/poolgate/<label>/<pool>/`, of the first pool with
    /// `[pools.<id>]`, each pool's own state under `pools/<id>/` of it).
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
    pub tls: TlsFiles,
}

/// `[state] lease`'s default.
///
/// Long enough to ride through an election of etcd's own, a split vote
/// included (up to about 4 s at etcd's defaults, renewing no lease
/// meanwhile; the leader renews every tenth of the TTL and acts until two
/// thirds of it after its last renewal began: 6.7 s here), short enough
/// that a leader that dies is replaced within 11 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

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
            tls: TlsFiles::default(),
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
}

/// A duration as an operator reads it: humantime's words, to the whole
/// millisecond ("1s 333ms", not "1s 333ms 333us 333ns").
pub fn in_words(d: std::time::Duration) -> humantime::FormattedDuration {
    humantime::format_duration(std::time::Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}
