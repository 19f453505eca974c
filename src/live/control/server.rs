//! The control socket's server side: `watch` binds it and serves each
//! connection (a status, a run guarded from its commit to its end, an end
//! or a resume of a run nobody guards).

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolId, Refusal, RunId};
use poolgate_actors::{Fleet, GateError};
use serde_json::Value;
use tokio::io::BufReader;
use tokio::net::{UnixListener, UnixStream};

use super::{read_line, send, Reply, Request, BEAT, FIRST_LINE, MAX_CONNECTIONS, MAX_LINE};
use crate::live::LiveError;

/// How long a refused commit waits before it is asked again (if no
/// `PoolReady` comes first).
const RETRY: Duration = Duration::from_millis(200);

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
            let status = crate::live::status::answer_all(
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
                let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
                // Several pools and none named: the pool whose run it is.
                let gate = match pool {
                    None if fleet.pools().len() > 1 => fleet
                        .pool_running(&run)
                        .await
                        .map_err(|e| refused(&e))?
                        .ok_or_else(|| Reply::Refused {
                            code: "unknown_run".into(),
                            detail: not_active_in_any(&fleet.pools()),
                        })?,
                    pool => pool_gate(&fleet, pool)?,
                };
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
/// What `run --end RUN` with no pool named says when no pool's active
/// run is RUN, alone or through the socket.
pub(crate) fn not_active_in_any(pools: &[PoolId]) -> String {
    let pools: Vec<&str> = pools.iter().map(PoolId::as_str).collect();
    format!("not the active run of any pool ({})", pools.join(", "))
}

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
