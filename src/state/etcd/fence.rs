//! A replica's leadership as the store sees it: the term its writes are
//! conditioned on, until when it may act, and a term ended for good by a
//! refused write.

use std::sync::Mutex;
use std::time::Instant;

/// This replica's leadership as the store sees it: the revision that
/// created the `leader` key, while this replica may act.
#[derive(Debug, Default)]
pub struct Fence {
    term: Mutex<FenceState>,
}

#[derive(Debug, Default)]
struct FenceState {
    current: Option<LeaderTerm>,
    /// A term ended by a refused write: renewing its lease does not
    /// bring it back (the leader steps down, see [`Fence::is_ended`]).
    ended: Option<i64>,
    /// When the term began or was last renewed.
    renewed: Option<Instant>,
}

/// One leadership term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderTerm {
    /// The revision that created the `leader` key for this replica.
    pub created: i64,
    /// Acting stops here (before the lease can expire).
    pub until: Instant,
}

impl Fence {
    /// The term, while it lasts.
    pub fn current(&self) -> Option<LeaderTerm> {
        let term = self.lock().current;
        term.filter(|t| Instant::now() < t.until)
    }

    /// A term begins or is renewed (a term ended by [`Fence::end`] is not).
    pub fn set(&self, term: LeaderTerm) {
        let mut state = self.lock();
        if state.ended != Some(term.created) {
            state.current = Some(term);
            state.renewed = Some(Instant::now());
        }
    }

    /// How long ago the term began or was last renewed, while it lasts:
    /// renewals that fail or hang (etcd out of this replica's reach) make
    /// it grow until the term ends.
    pub fn since_renewed(&self) -> Option<std::time::Duration> {
        let state = self.lock();
        state
            .current
            .filter(|t| Instant::now() < t.until)
            .and(state.renewed)
            .map(|at| at.elapsed())
    }

    /// The term is over.
    pub fn clear(&self) {
        self.lock().current = None;
    }

    /// The term created at `created` is over for good: etcd refused one of
    /// its writes (the leader key or a record changed under it). Its
    /// leader stops acting at once and steps down at its next renewal.
    pub fn end(&self, created: i64) {
        let mut state = self.lock();
        state.ended = Some(created);
        if state.current.is_some_and(|t| t.created == created) {
            state.current = None;
        }
    }

    /// Whether the term created at `created` was ended by [`Fence::end`].
    pub fn is_ended(&self, created: i64) -> bool {
        self.lock().ended == Some(created)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.term
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
