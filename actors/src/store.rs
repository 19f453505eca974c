//! The seam where what must survive a restart is kept (design §9): the last
//! epoch issued and the active run. The gate writes through a
//! [`StateStore`] before it publishes what it stored; an embedded,
//! crash-safe implementation lives in the `poolgate` crate (redb), and a
//! store shared by several orchestrator replicas (etcd, say) would be
//! another implementation of the same trait.

use std::sync::Arc;
use std::time::Duration;

use poolgate_core::Durable;

/// Why the store could not keep something. Nothing was written.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

/// Keeps the gate's durable state.
///
/// A store of one's own, here in memory (a database or etcd would keep
/// the same [`Durable`], which is serde):
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use poolgate_actors::core::Durable;
/// use poolgate_actors::{DurableSettings, StateStore, StoreError};
///
/// #[derive(Debug, Default)]
/// struct InMemory(Mutex<Durable>);
///
/// impl StateStore for InMemory {
///     fn save(&self, state: &Durable) -> Result<(), StoreError> {
///         *self.0.lock().map_err(|e| StoreError(e.to_string()))? = state.clone();
///         Ok(())
///     }
/// }
///
/// let store = Arc::new(InMemory::default());
/// let durable = DurableSettings {
///     store: store.clone(),
///     restored: Durable::default(), // what the store held at start
///     restore_grace: std::time::Duration::from_secs(30),
/// };
/// # use poolgate_actors::core::{NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId};
/// # let pool = PoolDefinition::new(PoolId::new("pool-a").unwrap(), vec![NodeId::new("n").unwrap()]).unwrap();
/// # let policy = PlanningPolicy { on_readiness_lost: OnReadinessLost::Wait, wait_timeout: None };
/// let settings = poolgate_actors::GateSettings::new(pool, std::time::Duration::from_secs(5), policy)
///     .and_then(|settings| settings.with_durable(durable))
///     .unwrap();
/// # drop(settings);
/// ```
///
/// The pool actor calls `save` off the actors' thread (a blocking-pool
/// thread, one write at a time, in order) and handles nothing else until
/// it returns, so a slow disk delays the gate's next decision but never
/// SWIM or the agent connections. The first write, at start, runs before
/// the actors do.
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Writes `state`, durably, before returning `Ok`.
    fn save(&self, state: &Durable) -> Result<(), StoreError>;
}

/// A store and what it held when the gate started.
#[derive(Clone, Debug)]
pub struct DurableSettings {
    /// Where to write.
    pub store: Arc<dyn StateStore>,
    /// What the store held at start (restored by the gate).
    pub restored: Durable,
    /// How long a restored committed run's required nodes have to be seen
    /// ready again (`[state] restore_grace`).
    pub restore_grace: Duration,
}
