//! Runs asked of whichever replica leads (design §12): `poolgate run` among
//! replicas writes its request into etcd, the leader plans and commits it
//! on a ready pool and writes what became of it; a takeover changes
//! nothing for the requester, since the next leader reads the same keys.
//!
//! Keys under the state prefix:
//! - `requests/<run>`: the required nodes and the requester's lease,
//!   written by the requester on that lease;
//! - `alive/<run>`: the requester is there (on its lease, whose TTL is
//!   `[run] unguarded_after`): a run whose requester is gone for good
//!   (its lease expired) is withdrawn if waiting, and ended by the leader
//!   if committed (outcome `ended`, with the reason): a requester that
//!   could not renew its session for that long has stopped its command;
//! - `requested/<run>`: the leader committed it for a requester (fenced);
//! - `runs/<run>`: what became of it, the event the leader published
//!   (fenced; on no lease: it outlives the requester's session);
//! - `waiting/<run>`: why the leader has not committed it yet (the gate's
//!   refusal: a node another pool's run holds, say), written when it
//!   changes, on the requester's lease; the requester says it when it
//!   gives up;
//! - `finish/<run>`: the requester's command ended: the leader ends it.
//!
//! A requester confirms that its run is still guarded by reading, in one
//! transaction, the leader key, the stored state and the outcome
//! ([`Requests::standing`]); the stored state is written before any
//! outcome is told, so a run the state no longer holds has ended.

use std::sync::Arc;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId};
use poolgate_actors::StoreError;
use serde::{Deserialize, Serialize};

use crate::state::etcd::EtcdStore;

pub(crate) mod renewals;
mod requester;
mod server;

pub use requester::{GaveUp, Requests, Session};
pub use server::{serve_in, RequestServer, REQUESTER_GONE};

/// The key of the pool's state the leader publishes.
pub const STATUS: &str = "status";

/// What the leader last published of the pool, with `age_ms` (how long
/// ago, by this host's clock) and `by_leader_now` (false when a leader
/// before the one leading now wrote it: a takeover, the next leader yet
/// to publish); `Ok(None)` when nothing was (or what was is not JSON), an
/// error when etcd could not be read.
pub async fn leader_said(store: Arc<EtcdStore>) -> Result<Option<serde_json::Value>, StoreError> {
    Ok(leader_published(store).await?.map(|published| {
        let mut said = published.said;
        said["by_leader_now"] = serde_json::json!(published.by_leader_now);
        said
    }))
}

/// What a leader last published of the pool, and by whom.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// What it said, with `age_ms` (see [`leader_said`]).
    pub said: serde_json::Value,
    /// Whether the replica leading now published it (not one before it).
    pub by_leader_now: bool,
    /// The lease of the replica leading now; none when none leads.
    pub leader_lease: Option<i64>,
}

/// What a leader last published of the pool, read in one transaction
/// with the leader key; `Ok(None)` when nothing was (or what was is not
/// JSON), an error when etcd could not be read.
pub async fn leader_published(store: Arc<EtcdStore>) -> Result<Option<Published>, StoreError> {
    let read = apart(move || store.get_raw_of_leader(STATUS)).await?;
    let Some(Ok(mut said)) = read
        .value
        .map(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes))
    else {
        return Ok(None);
    };
    let written = said["written_unix_ms"].as_u64().unwrap_or(0);
    said["age_ms"] = serde_json::json!(crate::live::generation::unix_ms().saturating_sub(written));
    Ok(Some(Published {
        said,
        by_leader_now: read.by_leader_now,
        leader_lease: read.leader_lease,
    }))
}

/// How long an answer waits for what the leader published (read from
/// etcd): a follower's status, a requester giving up. Well within an
/// asker's own 3 s, so that with etcd out of reach (no quorum) they still
/// answer, saying so (an operator's trial: every follower's `status` and
/// `/readyz` timed out while etcd had no quorum).
pub const LEADER_SAID_WITHIN: Duration = Duration::from_secs(1);

/// How often a requester looks at what became of its run.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How often the leader looks at the requests when nothing told it to:
/// it watches their keys and looks at once on a change; this is the
/// floor should a change go unseen (a watch broken and made again).
pub const LEADER_LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long one watch of the requests lasts before it is made again (the
/// watching thread ends within this of its term).
pub const WATCH_SPAN: Duration = Duration::from_secs(5);

/// A run asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The pool it is asked of (design §14); the leader's one pool when
    /// absent. A pool the leader does not gate is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The nodes it requires.
    pub required: Vec<NodeId>,
    /// The requester's lease (what became of the run is kept on it).
    #[serde(default)]
    pub lease: i64,
}

/// What became of a requested run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// `committed`, `faulted`, `finished`, or `refused` (it can never be
    /// committed: `reason` says why).
    pub status: String,
    /// The event the leader published for it (none when a leader found
    /// the run committed by its predecessor, whose event went unwritten).
    pub event: Option<Event>,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a requester found of its committed run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStanding {
    /// A replica leads and the stored state holds the run committed.
    Guarded,
    /// The stored state holds the run committed, but no replica leads
    /// right now (a takeover under way).
    Unled,
    /// The leader wrote the run's end.
    Ended(RunOutcome),
    /// The stored state no longer holds the run: it ended (the state is
    /// written before any outcome is told), its outcome not written yet.
    NotHeld,
}

/// Runs an etcd call off the actors' thread, on a thread of its own that
/// nothing waits for once its caller stops waiting: a requester that
/// gives up on etcd (out of reach, no quorum) exits at once, where the
/// runtime's blocking pool would have held the process until each call
/// it left ran out its own timeout (an operator's trial: `run --timeout
/// 4s` exited after 15 s). The leader's writes go through [`blocking`].
pub(super) async fn apart<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("poolgate-etcd-call".into())
        .spawn(move || {
            let _ = answer.send(f());
        })
        .map_err(|e| StoreError(format!("no thread for an etcd call: {e}")))?;
    answered.await.unwrap_or_else(|_| {
        Err(StoreError(
            "an etcd call's thread ended without an answer".into(),
        ))
    })
}

/// Runs an etcd call off the actors' thread; a process stopping waits
/// for it to end (a leader's write is not cut short).
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(StoreError(e.to_string())))
}
