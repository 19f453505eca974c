//! The orchestrator's durable state (design §9): what the gate must not
//! forget (the last epoch issued, the active run with the fingerprints of
//! its required nodes) and the last agent frame sequence per node.
//!
//! Every store keeps the same records, each as one JSON value beside its
//! SHA-256 (`<key>.sha256`; format 1 had none): a store checks its pages,
//! not what a hand or a tool wrote into them, and a flipped digit of
//! `last_epoch` would issue epochs twice. A record that is damaged, or
//! from a newer format, is an error naming where it is: never a silent
//! reset to epoch 1.
//!
//! - `redb` (feature `redb`, on by default): `[state] path`, one
//!   crash-safe file on this machine.
//! - [`etcd`]: `[state] etcd`, shared by orchestrator replicas, every write
//!   conditioned on leadership (design §12).

use std::collections::BTreeMap;
use std::sync::Arc;

use poolgate_actors::core::Durable;
use poolgate_actors::{StateStore, StoreError};

#[doc(hidden)]
pub mod etcd;
pub(crate) mod mac;
mod records;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "redb")]
pub use self::redb::RedbStore;

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {what}")]
pub struct StateError {
    /// The state file.
    pub file: String,
    /// What is wrong.
    pub what: String,
}

/// What the orchestrator keeps beside the gate's state: the last agent
/// frame sequence accepted per node key (`node@keyid`, design §8: replay
/// protection across restarts).
pub trait OrchestratorStore: StateStore {
    /// The stored sequences (empty if none were ever written).
    fn sequences(&self) -> Result<BTreeMap<String, u64>, StoreError>;
    /// Writes the sequences, durably.
    fn save_sequences(&self, sequences: &BTreeMap<String, u64>) -> Result<(), StoreError>;
    /// Whether this store holds what one handle at a time may open (a
    /// state file): [`Orchestrator::stop`](crate::live::Orchestrator::stop)
    /// returns once it is let go, so it can be opened again at once.
    fn exclusive(&self) -> bool {
        false
    }
    /// Whether this store keeps the registry the replicas share (design
    /// §12): among replicas on etcd. Elsewhere `[registry]` is the
    /// registry.
    fn shares_registry(&self) -> bool {
        false
    }
    /// The registry the replicas share: each node's pinned key as
    /// `[registry]` writes it (`ed25519:…`); `None` where this store keeps
    /// none, or none was written yet.
    fn shared_registry(&self) -> Result<Option<BTreeMap<String, String>>, StoreError> {
        Ok(None)
    }
    /// Writes the registry the replicas share (under the term, among
    /// replicas); nothing where this store keeps none.
    fn save_registry(&self, _registry: &BTreeMap<String, String>) -> Result<(), StoreError> {
        Ok(())
    }
    /// The record of one of several pools (`[pools.<id>]`, design §14):
    /// a store of its own for that pool's state, and what it held. A
    /// pool with no record yet starts its epochs above `floor` (what the
    /// store held before it kept pools apart), so no epoch is told twice.
    fn pool_record(
        self: Arc<Self>,
        pool: &poolgate_actors::core::PoolId,
    ) -> Result<(Arc<dyn StateStore>, Durable), StoreError> {
        Err(StoreError(format!(
            "pool {pool}: this store keeps one pool's state ([pool]); several [pools.<id>] keep theirs in a state file"
        )))
    }
}

/// A store in memory: what was written last (a replay from a recording's
/// restored state; an embedder's tests).
#[derive(Debug, Default)]
pub struct MemoryStore(std::sync::Mutex<Durable>);

impl MemoryStore {
    /// What was written last.
    pub fn held(&self) -> Durable {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl StateStore for MemoryStore {
    fn save(&self, state: &Durable) -> Result<(), StoreError> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = state.clone();
        Ok(())
    }
}

/// The store `[state]` names, opened, with what it held.
pub type OpenedStore = (Arc<dyn OrchestratorStore>, Durable);
