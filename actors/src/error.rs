//! Why the gate refused something: the one error of the handle, its
//! actors and the replay's `rejected` event.

use poolgate_core::{DefinitionError, InvalidId, InvalidIdentity, Refusal};

/// Why the gate refused something. Nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// A command was refused by the pool's rules.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// An id is not valid.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// Identity material is not valid; the node keeps the identity it had.
    #[error(transparent)]
    InvalidIdentity(#[from] InvalidIdentity),
    /// A pool definition is not valid.
    #[error(transparent)]
    InvalidPool(#[from] DefinitionError),
    /// What the command needs could not be made durable (design §9): the
    /// commit's write failed, or the pool's epoch is not stored yet;
    /// nothing changed. The store's failure, not a rule of the pool's:
    /// the core never says it.
    #[error("not durable: {0}")]
    NotDurable(String),
    /// The pool's actor failed while it handled this (a panic: in its
    /// code, or in a hook of the embedder's it called, such as a tracing
    /// layer) and was restarted from the core: readiness starts over, a
    /// committed run is still guarded or faulted `internal`, and the
    /// events tell what, if anything, the command did. Said in a log line
    /// and counted (`poolgate_actor_restarts_total{actor="pool"}`).
    #[error("the gate's pool actor failed while handling this and was restarted")]
    Internal,
    /// The gate's actors have stopped (the `System` is shutting down).
    #[error("the gate has stopped")]
    Stopped,
    /// The settings are not valid (see [`crate::GateSettings::check`]).
    #[error("invalid gate settings: {0}")]
    InvalidSettings(String),
    /// An input stamped further ahead of the gate's clock than
    /// [`crate::gate::SUBMIT_AHEAD`] ([`crate::Gate::submit`]): applied,
    /// it would move the gate's time on by as much, and every window and
    /// timer would wait for the clock to get there.
    #[error("an input stamped {at} ms, more than {ahead} ms ahead of the gate's clock ({now} ms)", at = .at.as_millis(), now = .now.as_millis(), ahead = crate::clock::SUBMIT_AHEAD.as_millis())]
    StampAhead {
        /// The input's stamp.
        at: poolgate_core::Time,
        /// The gate's clock when it came.
        now: poolgate_core::Time,
    },
    /// No pool of the fleet has this id ([`crate::Fleet`]).
    #[error("no pool {0}")]
    UnknownPool(poolgate_core::PoolId),
    /// A command that names no pool, given to a fleet of several.
    #[error("several pools are defined: the command must name its pool")]
    PoolRequired,
    /// [`crate::Gate::try_start`] was called outside a running actix `System`.
    #[error("the gate must be started inside a running actix System (actix::System::new().block_on(…), #[actix::main] or #[actix_rt::test])")]
    NoSystem,
}

impl GateError {
    /// A short stable code, as the replay's `rejected` event prints it.
    pub fn code(&self) -> &'static str {
        match self {
            GateError::Refused(e) => e.code(),
            GateError::InvalidId(_) => "invalid_id",
            GateError::InvalidIdentity(_) => "invalid_identity",
            GateError::InvalidPool(_) => "invalid_pool",
            GateError::NotDurable(_) => "not_durable",
            GateError::Internal => "internal",
            GateError::Stopped => "stopped",
            GateError::NoSystem => "no_system",
            GateError::InvalidSettings(_) => "invalid_settings",
            GateError::StampAhead { .. } => "stamp_ahead",
            GateError::UnknownPool(_) => "unknown_pool",
            GateError::PoolRequired => "pool_required",
        }
    }
}
