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

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolId, Refusal, RunId};
use poolgate_actors::{Fleet, GateError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::LiveError;

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

/// How long a refused commit waits before it is asked again (if no
/// `PoolReady` comes first).
const RETRY: Duration = Duration::from_millis(200);

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

/// The socket bound at its path, removed when dropped.
pub struct Bound {
    listener: UnixListener,
    path: PathBuf,
}

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether an orchestrator serves the control socket at `path` now (it
/// accepts a connection): a file left by one that is gone is not served.
pub fn is_served(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Binds the control socket at `path`, mode 0600 from the start (bound
/// under a temporary name, then renamed). A socket file nobody answers
/// on (a `watch` that crashed) is replaced; one that answers is another
/// orchestrator's: an error.
pub async fn bind(path: &Path) -> Result<Bound, LiveError> {
    use std::os::unix::fs::PermissionsExt;
    let taken = |detail: String| LiveError::Setting {
        key: "control.socket",
        message: detail,
    };
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !metadata.file_type().is_socket() {
            return Err(taken(format!(
                "{} exists and is not a socket: not replaced",
                path.display()
            )));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(taken(format!(
                "{} is served by another orchestrator",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|e| {
            taken(format!(
                "{}: a stale socket not removed: {e}",
                path.display()
            ))
        })?;
    }
    let temporary = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)
        .map_err(|e| taken(format!("cannot bind {}: {e}", path.display())))?;
    let mut bound = Bound {
        listener,
        path: temporary.clone(),
    };
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| taken(format!("{}: {e}", temporary.display())))?;
    std::fs::rename(&temporary, path)
        .map_err(|e| taken(format!("cannot place {}: {e}", path.display())))?;
    bound.path = path.to_path_buf();
    Ok(bound)
}

/// Serves `bound` for `fleet` until the task is aborted; `leader` is what
/// the status answer says of who leads.
pub async fn serve(bound: Bound, fleet: Fleet, leader: std::sync::Arc<str>) {
    let room = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let orphans = Orphans::default();
    // The connections that have not asked yet, oldest first: when the room
    // is full, the oldest of them makes way (one that asked is a run's
    // requester, or gets its answer at once).
    let unasked: Unasked = std::sync::Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let mut next = 0u64;
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((stream, _)) = bound.listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let turn = match std::sync::Arc::clone(&room).try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => {
                let oldest = lock_unasked(&unasked).pop_front();
                let Some((_, evicted)) = oldest else {
                    metrics::counter!("poolgate_control_refused_total").increment(1);
                    continue;
                };
                evicted.abort();
                metrics::counter!("poolgate_control_evicted_total").increment(1);
                // The aborted task gives its place back as it is dropped.
                let Ok(turn) = std::sync::Arc::clone(&room).acquire_owned().await else {
                    continue;
                };
                turn
            }
        };
        next += 1;
        let id = next;
        let (fleet, leader) = (fleet.clone(), std::sync::Arc::clone(&leader));
        let (orphans, asked) = (orphans.clone(), std::sync::Arc::clone(&unasked));
        let handle = connections.spawn_local(async move {
            let _turn = turn;
            connection(stream, fleet, &leader, &orphans, || {
                lock_unasked(&asked).retain(|(each, _)| *each != id)
            })
            .await;
            lock_unasked(&asked).retain(|(each, _)| *each != id);
        });
        lock_unasked(&unasked).push_back((id, handle));
    }
}

/// The connections that have not sent their request yet, oldest first.
type Unasked =
    std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>>;

fn lock_unasked(
    unasked: &Unasked,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, tokio::task::AbortHandle)>> {
    unasked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at the end or
/// past the bound.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<String> {
    let mut line = Vec::new();
    let mut limited = tokio::io::AsyncReadExt::take(reader, MAX_LINE as u64 + 1);
    match limited.read_until(b'\n', &mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) if line.len() > MAX_LINE => None,
        Ok(_) => String::from_utf8(line).ok(),
    }
}

async fn send<W: tokio::io::AsyncWrite + Unpin>(writer: &mut W, reply: &Reply) -> bool {
    let mut line = serde_json::to_vec(reply).unwrap_or_default();
    line.push(b'\n');
    writer.write_all(&line).await.is_ok()
}

/// Runs left planning by a requester that went away (or was refused
/// after its planning began), by pool: a run plans until it is committed
/// or aborted, so the next request on that pool takes it over rather than
/// find the pool held by a run nobody asks for.
#[derive(Clone, Default)]
struct Orphans(std::sync::Arc<std::sync::Mutex<Requested>>);

/// What the socket's requesters hold: runs left planning, by pool, and the
/// runs a connection guards now (nobody else may end or resume those).
#[derive(Default)]
struct Requested {
    left: std::collections::HashMap<PoolId, RunId>,
    guarded: std::collections::HashSet<(PoolId, RunId)>,
}

/// A run a connection guards, for as long as this lives.
struct Guarding {
    orphans: Orphans,
    key: (PoolId, RunId),
}

impl Drop for Guarding {
    fn drop(&mut self) {
        self.orphans.lock().guarded.remove(&self.key);
    }
}

impl Orphans {
    /// `run` of `pool` is guarded by a connection from now on; `None` if
    /// one guards it already.
    fn guarding(&self, pool: &PoolId, run: &RunId) -> Option<Guarding> {
        let key = (pool.clone(), run.clone());
        self.lock().guarded.insert(key.clone()).then(|| Guarding {
            orphans: self.clone(),
            key,
        })
    }

    /// Whether a connection guards `run` of `pool`.
    fn is_guarded(&self, pool: &PoolId, run: &RunId) -> bool {
        self.lock().guarded.contains(&(pool.clone(), run.clone()))
    }

    fn leave(&self, pool: &PoolId, run: &RunId) {
        tracing::info!(%pool, %run, "a run left planning by its requester: the next run asked of the pool takes it over");
        self.lock().left.insert(pool.clone(), run.clone());
    }

    /// Takes `run` over if it was left on `pool`.
    fn adopt(&self, pool: &PoolId, run: &RunId) -> bool {
        let mut held = self.lock();
        match held.left.get(pool) {
            Some(orphan) if orphan == run => held.left.remove(pool).is_some(),
            _ => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Requested> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn connection(
    stream: UnixStream,
    fleet: Fleet,
    leader: &str,
    orphans: &Orphans,
    asked: impl FnOnce(),
) {
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    // A connection that asks nothing in time is closed: idle ones cannot
    // hold the room every `run` needs.
    let line = match tokio::time::timeout(FIRST_LINE, read_line(&mut reader)).await {
        Ok(Some(line)) => {
            asked();
            line
        }
        Ok(None) => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: format!("not a request: a line of UTF-8 up to {MAX_LINE} bytes"),
            };
            send(&mut writer, &refused).await;
            return;
        }
        Err(_) => {
            metrics::counter!("poolgate_control_idle_closed_total").increment(1);
            return;
        }
    };
    let request = match serde_json::from_str::<Request>(&line) {
        Ok(request) => request,
        Err(e) => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: format!("not a control request: {e}"),
            };
            send(&mut writer, &refused).await;
            return;
        }
    };
    match request {
        Request::Status { pool, .. } => {
            let Ok(reports) = fleet.reports().await else {
                return;
            };
            let status = super::status::answer_all(
                &reports,
                pool.as_deref(),
                fleet.clock().now(),
                leader,
                !fleet.writes_failing(),
            );
            send(&mut writer, &Reply::Status { status }).await;
        }
        Request::Run {
            pool,
            run,
            required,
            ..
        } => {
            let asked = Asked {
                pool,
                run,
                required,
            };
            let served = serve_run(&fleet, asked, orphans, &mut reader, &mut writer).await;
            if let Err(refused) = served {
                send(&mut writer, &refused).await;
            }
        }
        Request::End { pool, run, .. } => {
            let ended = async {
                let gate = pool_gate(&fleet, pool)?;
                let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
                let pool = gate.report().await.map_err(|e| refused(&e))?.pool;
                if orphans.is_guarded(&pool, &run) {
                    return Err(guarded_by_another(&run));
                }
                gate.finish_run(run).await.map_err(|e| refused(&e))
            };
            let reply = match ended.await {
                Ok(()) => Reply::Ended {
                    status: "finished".into(),
                    node: None,
                    reason: None,
                },
                Err(refusal) => refusal,
            };
            send(&mut writer, &reply).await;
        }
        Request::Resume { pool, run, .. } => {
            let resumed = async {
                let gate = pool_gate(&fleet, pool)?;
                let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
                let report = gate.report().await.map_err(|e| refused(&e))?;
                if report.run.as_ref() != Some(&run)
                    || fleet.committed_run(&report.pool).as_ref() != Some(&run)
                {
                    let active = report.run.map_or("none".to_string(), |r| r.to_string());
                    return Err(Reply::Refused {
                        code: "unknown_run".into(),
                        detail: format!(
                            "run {run} is not the pool's committed run (the active run: {active})"
                        ),
                    });
                }
                let epoch = match report.phase {
                    poolgate_actors::core::PoolPhase::Ready { epoch } => epoch.0,
                    _ => 0,
                };
                // Its own requester, if it has one, guards it: not taken.
                let guarding = orphans
                    .guarding(&report.pool, &run)
                    .ok_or_else(|| guarded_by_another(&run))?;
                Ok((gate, run, epoch, guarding))
            };
            match resumed.await {
                Ok((gate, run, epoch, _guarding)) => {
                    let events = gate.subscribe_from_now();
                    guard(&gate, run, epoch, events, &mut reader, &mut writer).await;
                }
                Err(refusal) => {
                    send(&mut writer, &refusal).await;
                }
            }
        }
        Request::Finish => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: "finish names no run: send it on the run's own connection".into(),
            };
            send(&mut writer, &refused).await;
        }
    }
}

/// A run a connection guards now is neither ended nor resumed by another.
fn guarded_by_another(run: &RunId) -> Reply {
    Reply::Refused {
        code: "run_guarded".into(),
        detail: format!(
            "run {run} is guarded by its own requester (a running `poolgate run`): end that instead"
        ),
    }
}

fn refused(e: &GateError) -> Reply {
    Reply::Refused {
        code: e.code().to_string(),
        detail: e.to_string(),
    }
}

fn event_reply(event: &Event) -> Reply {
    Reply::Event {
        event: serde_json::to_value(event).unwrap_or(Value::Null),
    }
}

/// Whether a refused commit may pass by waiting (the pool not ready yet,
/// a `PoolReady` since the proof, nodes another pool's run holds, the
/// run suspended).
fn passes(e: &GateError) -> bool {
    matches!(
        e,
        GateError::Refused(
            Refusal::PoolNotReady
                | Refusal::StaleEpoch { .. }
                | Refusal::Reserved { .. }
                | Refusal::NotPlanning { .. }
        ) | GateError::NotDurable(_)
            | GateError::Internal
    )
}

/// The gate of `pool`, or of the only pool.
fn pool_gate(fleet: &Fleet, pool: Option<String>) -> Result<poolgate_actors::Gate, Reply> {
    match pool {
        Some(pool) => {
            let id = PoolId::new(&pool).map_err(|e| refused(&e.into()))?;
            fleet
                .pool(&id)
                .ok_or_else(|| refused(&GateError::UnknownPool(id)))
        }
        None => match fleet.pools().as_slice() {
            [only] => fleet
                .pool(only)
                .ok_or_else(|| refused(&GateError::UnknownPool(only.clone()))),
            _ => Err(refused(&GateError::PoolRequired)),
        },
    }
}

/// What a `run` request asks.
struct Asked {
    pool: Option<String>,
    run: String,
    required: Option<Vec<String>>,
}

async fn serve_run<R, W>(
    fleet: &Fleet,
    asked: Asked,
    orphans: &Orphans,
    reader: &mut R,
    writer: &mut W,
) -> Result<(), Reply>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let Asked {
        pool,
        run,
        required,
    } = asked;
    let gate = pool_gate(fleet, pool)?;
    let mut run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
    let report = gate.report().await.map_err(|e| refused(&e))?;
    let (pool_id, members) = (report.pool, report.candidates);
    let required: Vec<NodeId> = match required {
        Some(names) => names
            .iter()
            .map(|n| NodeId::new(n))
            .collect::<Result<_, _>>()
            .map_err(|e| refused(&e.into()))?,
        None => members.into_iter().map(|c| c.node).collect(),
    };
    let events = gate.subscribe_from_now();
    let mut planning = false;
    let mut said = String::new();
    // Plans and commits at each `PoolReady` (or every RETRY) until
    // committed, refused for good, or the requester is gone; a run left
    // planning is left to the next request on the pool.
    let outcome = loop {
        let ready = tokio::select! {
            ready = gate.wait_ready() => ready,
            _ = read_line(reader) => break Err(None),
        };
        let ready = match ready {
            Ok(ready) => ready,
            Err(e) => break Err(Some(refused(&e))),
        };
        if !planning {
            match gate.begin_planning(run.clone(), Some(ready.epoch)).await {
                Ok(_) => planning = true,
                Err(GateError::Refused(Refusal::RunInProgress(other)))
                    if orphans.adopt(&pool_id, &other) =>
                {
                    tracing::info!(pool = %pool_id, run = %other, "a run left planning is taken over");
                    run = other;
                    planning = true;
                }
                // A committed run nobody guards (restored after a restart,
                // its requester gone): said with what ends it.
                Err(GateError::Refused(Refusal::RunInProgress(other)))
                    if fleet.committed_run(&pool_id).as_ref() == Some(&other)
                        && !orphans.is_guarded(&pool_id, &other) =>
                {
                    break Err(Some(Reply::Refused {
                        code: "run_in_progress".into(),
                        detail: format!(
                            "run {other} is committed and nobody guards it (restored after a restart): end it with poolgate run --end {other}, or guard it with --resume {other}"
                        ),
                    }));
                }
                Err(e) if passes(&e) => waiting(writer, &mut said, &e).await,
                Err(e) => break Err(Some(refused(&e))),
            }
        }
        if planning {
            match gate
                .commit_plan(run.clone(), required.clone(), Some(ready.epoch))
                .await
            {
                Ok(()) => break Ok(ready.epoch),
                // Aborted by the policy: planned again at the next PoolReady.
                Err(GateError::Refused(Refusal::UnknownRun(_))) => planning = false,
                Err(e) if passes(&e) => waiting(writer, &mut said, &e).await,
                Err(e) => break Err(Some(refused(&e))),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = read_line(reader) => break Err(None),
        }
    };
    let epoch = match outcome {
        Ok(epoch) => epoch,
        Err(why) => {
            if planning {
                orphans.leave(&pool_id, &run);
            }
            return why.map_or(Ok(()), Err);
        }
    };
    let _guarding = orphans.guarding(&pool_id, &run);
    guard(&gate, run, epoch.0, events, reader, writer).await;
    Ok(())
}

/// Guards `run`, committed on `gate` at `epoch`, for the requester on
/// `reader`/`writer`: its events so far, the word to start, then its
/// events as they come and a beat every [`BEAT`], until it faults, the
/// requester ends it, or the requester is gone (its run is ended).
async fn guard<R, W>(
    gate: &poolgate_actors::Gate,
    run: RunId,
    epoch: u64,
    mut events: poolgate_actors::EventStream,
    reader: &mut R,
    writer: &mut W,
) where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    const GONE: &str = "its requester is gone (the control connection closed)";
    while let Ok(event) = events.try_recv() {
        if of_run(&event, &run) && !send(writer, &event_reply(&event)).await {
            break;
        }
    }
    let committed = Reply::Committed {
        run: run.to_string(),
        epoch,
    };
    if !send(writer, &committed).await {
        return end(gate, &run, GONE).await;
    }
    let mut beat = tokio::time::interval(BEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = beat.tick() => {
                send(writer, &Reply::Alive).await;
            }
            event = events.recv() => {
                let Some(event) = event else { return };
                if !of_run(&event, &run) {
                    continue;
                }
                send(writer, &event_reply(&event)).await;
                let ended = match &event {
                    Event::RunFaulted { node, reason, .. } => Some(Reply::Ended {
                        status: "faulted".into(),
                        node: Some(node.to_string()),
                        reason: Some(reason.to_string()),
                    }),
                    // Ended, not by this requester (a restart of the
                    // orchestrator's own, say): its command goes too.
                    Event::RunFinished { .. } | Event::PlanningAborted { .. } => Some(Reply::Ended {
                        status: "ended".into(),
                        node: None,
                        reason: Some("ended by the orchestrator, not by this run's requester".into()),
                    }),
                    _ => None,
                };
                if let Some(ended) = ended {
                    send(writer, &ended).await;
                    return;
                }
            }
            line = read_line(reader) => {
                let finish = line
                    .as_deref()
                    .and_then(|l| serde_json::from_str::<Request>(l).ok())
                    == Some(Request::Finish);
                if !finish {
                    return end(gate, &run, GONE).await;
                }
                match gate.finish_run(run.clone()).await {
                    Ok(()) => {
                        while let Ok(event) = events.try_recv() {
                            if of_run(&event, &run) {
                                send(writer, &event_reply(&event)).await;
                            }
                        }
                        let ended = Reply::Ended { status: "finished".into(), node: None, reason: None };
                        send(writer, &ended).await;
                    }
                    Err(e) => {
                        send(writer, &refused(&e)).await;
                    }
                }
                return;
            }
        }
    }
}

/// Tells the requester why its run waits, when that changed.
async fn waiting<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    said: &mut String,
    why: &GateError,
) {
    let detail = why.to_string();
    if *said != detail {
        send(
            writer,
            &Reply::Waiting {
                detail: detail.clone(),
            },
        )
        .await;
        *said = detail;
    }
}

fn of_run(event: &Event, run: &RunId) -> bool {
    match event {
        Event::PlanningStarted { run: r, .. }
        | Event::PlanningSuspended { run: r, .. }
        | Event::PlanningResumed { run: r, .. }
        | Event::PlanningAborted { run: r, .. }
        | Event::RunCommitted { run: r, .. }
        | Event::RunFaulted { run: r, .. }
        | Event::RunFinished { run: r, .. } => r == run,
        _ => false,
    }
}

/// Ends `run`, whose requester is gone: it stopped its command.
async fn end(gate: &poolgate_actors::Gate, run: &RunId, why: &str) {
    tracing::warn!(%run, "{why}: its run is ended");
    if let Err(e) = gate.finish_run(run.clone()).await {
        tracing::warn!(%run, error = %e, "the run of a requester that is gone not ended");
    }
}

/// A requester's connection to the control socket.
pub struct Client {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl Client {
    /// Connects to `path`; `None` when nobody serves it.
    pub async fn connect(path: &Path) -> Option<Client> {
        let stream = UnixStream::connect(path).await.ok()?;
        let (reader, writer) = stream.into_split();
        Some(Client {
            reader: BufReader::new(reader),
            writer,
        })
    }

    /// Sends `request`.
    pub async fn ask(&mut self, request: &Request) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.writer.write_all(&line).await
    }

    /// The next reply; `None` once the orchestrator closed the connection.
    pub async fn next(&mut self) -> Option<Reply> {
        let line = read_line(&mut self.reader).await?;
        serde_json::from_str(&line).ok()
    }
}

/// Asks the orchestrator serving `path` to end `run` of `pool` (`run
/// --end`): `Ok(None)` when it did, `Ok(Some(why))` when it refused.
pub async fn end_run(
    path: &Path,
    pool: Option<&str>,
    run: &RunId,
) -> Result<Option<String>, String> {
    let mut client = Client::connect(path)
        .await
        .ok_or_else(|| format!("no orchestrator serves {}", path.display()))?;
    let request = Request::End {
        v: 1,
        pool: pool.map(str::to_string),
        run: run.to_string(),
    };
    client
        .ask(&request)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match tokio::time::timeout(super::status::STATUS_WAIT, client.next()).await {
        Ok(Some(Reply::Ended { .. })) => Ok(None),
        Ok(Some(Reply::Refused { detail, .. })) => Ok(Some(detail)),
        Ok(_) => Err(format!("{} closed without an answer", path.display())),
        Err(_) => Err(format!("no answer from {} in time", path.display())),
    }
}

/// Asks the orchestrator serving `path` where its pools stand.
pub async fn status(path: &Path, pool: Option<&str>) -> Result<Value, String> {
    let mut client = Client::connect(path)
        .await
        .ok_or_else(|| format!("no orchestrator serves {}", path.display()))?;
    let request = Request::Status {
        v: 1,
        pool: pool.map(str::to_string),
    };
    client
        .ask(&request)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match tokio::time::timeout(super::status::STATUS_WAIT, client.next()).await {
        Ok(Some(Reply::Status { status })) => match status["error"].as_str() {
            Some(error) => Err(format!("{}: {error}", path.display())),
            None => Ok(status),
        },
        Ok(_) => Err(format!("{} closed without an answer", path.display())),
        Err(_) => Err(format!("no answer from {} in time", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_actors::core::{OnReadinessLost, PlanningPolicy, PoolDefinition};
    use poolgate_actors::GateSettings;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    async fn ready_fleet() -> Fleet {
        ready_pools(&[("a", &["n1", "n2"])]).await
    }

    /// A fleet of `pools` over n1 and n2, every node ready.
    async fn ready_pools(pools: &[(&str, &[&str])]) -> Fleet {
        let policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        let settings = pools
            .iter()
            .map(|(id, members)| {
                let members = members.iter().map(|m| n(m)).collect();
                let definition = PoolDefinition::new(PoolId::new(id).unwrap(), members).unwrap();
                GateSettings::new(definition, Duration::from_millis(10), policy).unwrap()
            })
            .collect();
        let fleet = Fleet::try_start(settings).unwrap();
        for name in ["n1", "n2"] {
            poolgate_actors::testing::make_ready_in(&fleet, &n(name), name.as_bytes())
                .await
                .unwrap();
        }
        fleet
    }

    fn socket(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "poolgate-control-{}-{name}.sock",
            std::process::id()
        ))
    }

    async fn ask_run(path: &Path, run: &str, required: &[&str]) -> (Client, Reply) {
        let mut client = Client::connect(path).await.unwrap();
        let request = Request::Run {
            v: 1,
            pool: None,
            run: run.into(),
            required: Some(required.iter().map(|r| r.to_string()).collect()),
        };
        client.ask(&request).await.unwrap();
        loop {
            match client.next().await.unwrap() {
                Reply::Event { .. } => continue,
                reply => return (client, reply),
            }
        }
    }

    #[test]
    fn a_run_left_planning_is_taken_over_by_the_next_and_a_requester_gone_ends_its_run() {
        actix::System::new().block_on(async {
            let fleet = ready_fleet().await;
            let path = socket("orphans");
            let bound = bind(&path).await.unwrap();
            let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
            // Refused after its planning began (a node no pool has): the
            // run is left planning, not holding the pool for good.
            let (_first, refused) = ask_run(&path, "r1", &["n1", "zz"]).await;
            assert!(
                matches!(&refused, Reply::Refused { code, .. } if code == "not_candidate"),
                "{refused:?}"
            );
            let (second, committed) = ask_run(&path, "r2", &["n1"]).await;
            assert_eq!(
                committed,
                Reply::Committed {
                    run: "r1".into(),
                    epoch: 1
                },
                "the run left planning is taken over"
            );
            // Its requester gone: the run is ended.
            let mut events = fleet.subscribe();
            drop(second);
            let ended = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    if let Some(Event::RunFinished { run, .. }) = events.recv().await {
                        return run;
                    }
                }
            })
            .await
            .unwrap();
            assert_eq!(ended.as_str(), "r1");
            served.abort();
            let _ = served.await;
            assert!(!path.exists(), "the socket goes with its server");
        });
    }

    #[test]
    fn a_committed_run_nobody_guards_is_resumed_or_ended_through_the_socket() {
        actix::System::new().block_on(async {
            let fleet = ready_fleet().await;
            let gate = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
            // A committed run with no requester (as one restored is).
            let commit = |run: &'static str| {
                let gate = gate.clone();
                async move {
                    let ready = gate.wait_ready().await.unwrap();
                    let run = RunId::new(run).unwrap();
                    gate.begin_planning(run.clone(), Some(ready.epoch))
                        .await
                        .unwrap();
                    gate.commit_plan(run, vec![n("n1")], Some(ready.epoch))
                        .await
                        .unwrap();
                }
            };
            commit("r1").await;
            let path = socket("resume");
            let bound = bind(&path).await.unwrap();
            let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
            // A new run is told what ends the one nobody guards.
            let mut newcomer = Client::connect(&path).await.unwrap();
            let asked = Request::Run {
                v: 1,
                pool: None,
                run: "r5".into(),
                required: None,
            };
            newcomer.ask(&asked).await.unwrap();
            let told = newcomer.next().await.unwrap();
            assert!(
                matches!(&told, Reply::Refused { detail, .. } if detail.contains("--end r1")),
                "{told:?}"
            );
            // Another run is refused, naming nothing it could take over.
            let stranger = RunId::new("r9").unwrap();
            assert_eq!(
                end_run(&path, None, &stranger)
                    .await
                    .unwrap()
                    .map(|w| w.contains("r9")),
                Some(true)
            );
            let mut client = Client::connect(&path).await.unwrap();
            let resume = Request::Resume {
                v: 1,
                pool: None,
                run: "r1".into(),
            };
            client.ask(&resume).await.unwrap();
            let committed = loop {
                match client.next().await.unwrap() {
                    Reply::Event { .. } | Reply::Alive => continue,
                    reply => break reply,
                }
            };
            assert!(
                matches!(&committed, Reply::Committed { run, .. } if run == "r1"),
                "{committed:?}"
            );
            // Guarded now: nobody else ends it or takes it.
            let r1 = RunId::new("r1").unwrap();
            let refused = end_run(&path, None, &r1).await.unwrap().unwrap();
            assert!(
                refused.contains("guarded by its own requester"),
                "{refused}"
            );
            let mut other = Client::connect(&path).await.unwrap();
            other.ask(&resume).await.unwrap();
            let taken = other.next().await.unwrap();
            assert!(
                matches!(&taken, Reply::Refused { code, .. } if code == "run_guarded"),
                "{taken:?}"
            );
            client.ask(&Request::Finish).await.unwrap();
            let ended = loop {
                match client.next().await.unwrap() {
                    Reply::Event { .. } | Reply::Alive => continue,
                    reply => break reply,
                }
            };
            assert!(
                matches!(&ended, Reply::Ended { status, .. } if status == "finished"),
                "{ended:?}"
            );
            // And `run --end` of a run nobody guards ends it.
            commit("r2").await;
            let r2 = RunId::new("r2").unwrap();
            assert_eq!(end_run(&path, Some("a"), &r2).await.unwrap(), None);
            assert_eq!(gate.report().await.unwrap().run, None);
            served.abort();
        });
    }

    #[test]
    fn a_run_waiting_on_a_node_another_pools_run_holds_is_told_why_then_committed() {
        actix::System::new().block_on(async {
            let fleet = ready_pools(&[("a", &["n1", "n2"][..]), ("b", &["n2"][..])]).await;
            let a = fleet.pool(&PoolId::new("a").unwrap()).unwrap();
            let ready = a.wait_ready().await.unwrap();
            let r1 = RunId::new("r1").unwrap();
            a.begin_planning(r1.clone(), Some(ready.epoch))
                .await
                .unwrap();
            a.commit_plan(r1.clone(), vec![n("n2")], Some(ready.epoch))
                .await
                .unwrap();
            let path = socket("waiting");
            let bound = bind(&path).await.unwrap();
            let served = actix::spawn(serve(bound, fleet.clone(), "test".into()));
            let mut client = Client::connect(&path).await.unwrap();
            let asked = Request::Run {
                v: 1,
                pool: Some("b".into()),
                run: "r2".into(),
                required: None,
            };
            client.ask(&asked).await.unwrap();
            let told = client.next().await.unwrap();
            assert_eq!(
                told,
                Reply::Waiting {
                    detail: "node n2 is reserved by run r1 of pool a".into()
                }
            );
            a.finish_run(r1).await.unwrap();
            let committed = loop {
                match client.next().await.unwrap() {
                    Reply::Event { .. } | Reply::Alive | Reply::Waiting { .. } => continue,
                    reply => break reply,
                }
            };
            assert!(
                matches!(&committed, Reply::Committed { run, .. } if run == "r2"),
                "{committed:?}"
            );
            served.abort();
        });
    }

    #[test]
    fn a_connection_that_asks_nothing_is_closed_so_idle_ones_cannot_hold_the_room() {
        actix::System::new().block_on(async {
            let fleet = ready_fleet().await;
            let path = socket("idle");
            let bound = bind(&path).await.unwrap();
            let served = actix::spawn(serve(bound, fleet, "test".into()));
            let began = std::time::Instant::now();
            let mut idle = Client::connect(&path).await.unwrap();
            let closed = tokio::time::timeout(FIRST_LINE * 2, idle.next()).await;
            assert!(
                matches!(closed, Ok(None)),
                "closed, not answered: {closed:?}"
            );
            assert!(began.elapsed() >= FIRST_LINE);
            served.abort();
        });
    }

    #[test]
    fn a_full_room_of_connections_that_ask_nothing_makes_way_for_one_that_asks() {
        actix::System::new().block_on(async {
            let fleet = ready_fleet().await;
            let path = socket("full");
            let bound = bind(&path).await.unwrap();
            let served = actix::spawn(serve(bound, fleet, "test".into()));
            let mut idle = Vec::new();
            for _ in 0..MAX_CONNECTIONS + 10 {
                idle.push(Client::connect(&path).await.unwrap());
            }
            let began = std::time::Instant::now();
            let answer = status(&path, None).await;
            assert!(answer.is_ok(), "{answer:?}");
            assert!(
                began.elapsed() < FIRST_LINE,
                "answered at once, {:?}",
                began.elapsed()
            );
            served.abort();
        });
    }

    #[test]
    fn a_socket_served_is_not_taken_a_stale_one_is_replaced_and_no_other_file_is() {
        actix::System::new().block_on(async {
            let path = socket("taken");
            let _ = std::fs::remove_file(&path);
            // Another kind of file is not taken for a socket.
            std::fs::write(&path, b"notes").unwrap();
            let refused = bind(&path).await.err().unwrap().to_string();
            assert!(refused.contains("not a socket"), "{refused}");
            assert_eq!(std::fs::read(&path).unwrap(), b"notes");
            std::fs::remove_file(&path).unwrap();
            // A stale socket (nobody serving it) is replaced.
            drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
            assert!(path.exists() && !is_served(&path));
            let first = bind(&path).await.unwrap();
            assert!(is_served(&path));
            let second = bind(&path).await.err().unwrap().to_string();
            assert!(
                second.contains("served by another orchestrator"),
                "{second}"
            );
            drop(first);
            assert!(!path.exists());
        });
    }
}
