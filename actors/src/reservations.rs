//! The fleet's reservations as its pools' actors share them (design §14):
//! a commit takes its nodes in the same step as its pool admits it, and a
//! run's end gives them back. The rule itself is the core's
//! ([`poolgate_core::Reservations`]); this is the handle to one table of
//! them, apart from the fleet and the pools so that neither imports the
//! other for it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use poolgate_core::{NodeId, PoolId, Refusal, RunId};

/// The fleet's reservations, shared by its pools' actors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reservations(Arc<Mutex<poolgate_core::Reservations>>);

impl Reservations {
    /// The table itself, for a look across several nodes at once.
    pub(crate) fn lock(&self) -> MutexGuard<'_, poolgate_core::Reservations> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every node of `required` for `run` of `pool`, or none (`reserved`).
    pub(crate) fn take(
        &self,
        pool: &PoolId,
        run: &RunId,
        required: &[NodeId],
    ) -> Result<(), Refusal> {
        self.lock().reserve(pool, run, required)
    }

    /// The nodes `run` of `pool` holds go back.
    pub(crate) fn release(&self, pool: &PoolId, run: &RunId) {
        self.lock().release(pool, run);
    }

    /// The nodes any run of `pool` holds go back.
    pub(crate) fn release_pool(&self, pool: &PoolId) {
        self.lock().release_pool(pool);
    }
}
