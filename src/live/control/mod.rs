//! The control socket (design §14): `[control] socket = "PATH"` is a Unix
//! socket, mode 0600, that `poolgate watch` serves, so that `poolgate run`
//! and `poolgate status` given the same config use the running
//! orchestrator (its one SWIM member, listener and pools) instead of
//! starting their own; several `run`s then share it without etcd.
//!
//! One JSON object per line, each way; a connection asks one thing.
//!
//! - `{"v":1,"op":"status","pool":null}`: the status answer (as the agent
//!   listener gives it), `{"reply":"status","status":{…}}`; closed.
//! - `{"v":1,"op":"run","pool":"a","run":"run-42","required":["n1"]}`
//!   (`pool` and `required` may be `null`: the only pool, every member):
//!   the orchestrator waits for its pool's `PoolReady`, plans and commits
//!   (again at the next `PoolReady` while refused for a reason that
//!   passes: not ready, a node `reserved` by another pool's run), and
//!   answers, in order: `{"reply":"event","event":{…}}` for each event of
//!   the run, then `{"reply":"committed","run":…,"epoch":…}`, or
//!   `{"reply":"refused","code":…,"detail":…}` and closes. Once committed:
//!   the run's events as they come; `{"reply":"ended","status":"faulted",
//!   "node":…,"reason":…}` when it faults; the requester's
//!   `{"op":"finish"}` ends it (`{"reply":"ended","status":"finished"}`).
//!   A requester gone (its connection closed) has stopped its command:
//!   its run is ended. While it waits, `{"reply":"waiting","detail":…}`
//!   says why when the reason changes; once committed,
//!   `{"reply":"alive"}` every [`BEAT`]: a requester that hears nothing
//!   for half of its `[run] unguarded_after` stops its command (exit 5).
//! - `{"v":1,"op":"end","pool":…,"run":…}` (`run --end`): ends a committed
//!   run nobody guards (restored, its requester gone).
//! - `{"v":1,"op":"resume","pool":…,"run":…}` (`run --resume`): guards
//!   such a run again, as a run just committed.
//!
//! Requests are bounded (a line of at most 64 KiB, at most
//! [`MAX_CONNECTIONS`] connections at once).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

mod client;
mod runs;
mod server;
#[cfg(test)]
mod tests;

pub use client::{end_run, status, Client};
#[cfg(feature = "cli")]
pub(crate) use runs::not_active_in_any;
pub use server::{bind, is_served, serve, Bound};

/// The longest request line, in bytes.
pub const MAX_LINE: usize = 64 * 1024;

/// How long a connection has to send its request.
pub const FIRST_LINE: Duration = Duration::from_secs(5);

/// How often a guarded run's requester hears that the orchestrator is
/// there (`{"reply":"alive"}`): a requester that hears nothing for longer
/// than its `[run] unguarded_after` / 2 stops its command (exit 5).
pub const BEAT: Duration = Duration::from_millis(500);

/// How many control connections are served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// A request.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Where every pool (or `pool`) stands.
    Status {
        /// The format's version (1).
        v: u32,
        /// One pool only.
        #[serde(default)]
        pool: Option<String>,
    },
    /// Plan, commit and guard a run.
    Run {
        /// The format's version (1).
        v: u32,
        /// The pool (`null`: the only one).
        #[serde(default)]
        pool: Option<String>,
        /// The run's id.
        run: String,
        /// The nodes it requires (`null`: every member).
        #[serde(default)]
        required: Option<Vec<String>>,
    },
    /// The requester's command ended: end its run.
    Finish,
    /// End a committed run nobody guards any more (`run --end RUN`: its
    /// requester is gone, its run restored from the state file).
    End {
        /// The format's version (1).
        v: u32,
        /// The pool (`null`: the only one).
        #[serde(default)]
        pool: Option<String>,
        /// The run.
        run: String,
    },
    /// Guard a committed run again with a new requester (`run --resume
    /// RUN`): as a run just committed from here on.
    Resume {
        /// The format's version (1).
        v: u32,
        /// The pool (`null`: the only one).
        #[serde(default)]
        pool: Option<String>,
        /// The run.
        run: String,
    },
}

/// An answer line.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The status answer.
    Status {
        /// As `poolgate status --json` prints it.
        status: Value,
    },
    /// An event of the run (the replay format).
    Event {
        /// The event.
        event: Value,
    },
    /// The run is committed: its command may start.
    Committed {
        /// The run.
        run: String,
        /// The epoch it was committed on.
        epoch: u64,
    },
    /// The run was not committed, and will not be.
    Refused {
        /// A short code (`unknown_pool`, `run_in_progress`, …).
        code: String,
        /// The same in words.
        detail: String,
    },
    /// The orchestrator is there, and guards the run (every [`BEAT`]).
    Alive,
    /// The run waits to be committed, and why (said when the reason
    /// changes: a node `reserved` by another pool's run, the pool not
    /// ready).
    Waiting {
        /// Why, in words.
        detail: String,
    },
    /// The run ended.
    Ended {
        /// `faulted` or `finished`.
        status: String,
        /// The lost node (a fault).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// Why (a fault).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at the end or
/// past the bound.
pub(super) async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Option<String> {
    let mut line = Vec::new();
    let mut limited = tokio::io::AsyncReadExt::take(reader, MAX_LINE as u64 + 1);
    match limited.read_until(b'\n', &mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) if line.len() > MAX_LINE => None,
        Ok(_) => String::from_utf8(line).ok(),
    }
}

pub(super) async fn send<W: tokio::io::AsyncWrite + Unpin>(writer: &mut W, reply: &Reply) -> bool {
    let mut line = serde_json::to_vec(reply).unwrap_or_default();
    line.push(b'\n');
    writer.write_all(&line).await.is_ok()
}
