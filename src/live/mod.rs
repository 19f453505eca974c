//! The live cluster (design §7–§8, §12): the orchestrator's side that
//! hears the node agents on other machines, embeddable. The command line
//! (the node agent, `watch`, `run`, the demo) is [`crate::cli`].
//!
//! - [`orchestrator`]: gate + SWIM member + agent listener, embeddable.
//! - `conversation`: one agent connection's frames, judged (no I/O).
//! - `nodes`: what the orchestrator remembers per node (sequences, signed
//!   SWIM address, leaving).
//! - [`status`]: the answer to `poolgate status`.
//! - Replicas on etcd and the runs asked of whichever leads (design §12)
//!   are a room of their own: [`crate::ha`].
//! - `swim`: foca over UDP, turned into the gate's membership input
//!   (foca's and actix's types: public for the command line and the
//!   simulator, hidden from the docs; an embedder reaches SWIM through
//!   [`Orchestrator`]).
//! - [`wire`]: agent frames (signed) and gossip datagrams (sealed);
//!   `generation`: a node's generations and sequences across restarts.
//! - [`keys`]: signing keys, cluster keys, pinned public keys (the crate's
//!   [`crate::keys`], here too).

pub use crate::config::endpoint;
#[doc(hidden)]
pub mod control;
pub(crate) mod conversation;
pub(crate) mod generation;
pub(crate) mod listener;
pub(crate) mod planning;
pub use crate::keys;
#[doc(hidden)]
pub mod nodes;
pub mod orchestrator;
#[doc(hidden)]
pub mod status;
#[doc(hidden)]
pub mod swim;
pub(crate) mod throttle;
#[doc(hidden)]
pub mod wire;

pub use orchestrator::Orchestrator;

use poolgate_actors::GateError;

use crate::config::ConfigError;
use keys::KeyError;

/// Why the live side could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// A socket could not be bound.
    #[error("cannot bind the {socket} socket on {addr}: {source}")]
    Bind {
        /// Which socket: `SWIM (UDP)`, `agent listener (TCP)`, `metrics (HTTP)`.
        socket: &'static str,
        /// The address it was to bind.
        addr: std::net::SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A SWIM member bound to an unspecified address with nothing to
    /// advertise (design §10).
    #[error(
        "swim.advertise: the SWIM address {0} is unspecified, so other members cannot reach it; set [swim] advertise = \"host:port\" to the address they reach this member at"
    )]
    Unadvertised(std::net::SocketAddr),
    /// A setting built in code that `config.toml` would refuse.
    #[error("{key}: {message}")]
    Setting {
        /// The configuration key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A hostname in the configuration did not resolve.
    #[error("{key}: {message}")]
    Resolve {
        /// The configuration key.
        key: &'static str,
        /// What failed.
        message: String,
    },
    /// Neither cluster keys nor `insecure = true` (design §8).
    #[error(
        "[swim] has no cluster_keys: give the gossip keyring (poolgate keygen --cluster), or set insecure = true"
    )]
    NoClusterKeys,
    /// A key file could not be used.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The gate refused something, or stopped.
    #[error(transparent)]
    Gate(#[from] GateError),
    /// A configuration file is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state file cannot be used.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The identity material file cannot be used.
    #[error("{file}: {message}")]
    Identity {
        /// The identity file.
        file: String,
        /// What is wrong (never the bytes).
        message: String,
    },
    /// The generation file cannot be used.
    #[error(transparent)]
    Generation(#[from] generation::GenerationError),
    /// Anything else the operating system refused.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<crate::config::SettingsError> for LiveError {
    fn from(e: crate::config::SettingsError) -> Self {
        match e {
            crate::config::SettingsError::Gate(e) => e.into(),
            crate::config::SettingsError::State(e) => e.into(),
        }
    }
}
