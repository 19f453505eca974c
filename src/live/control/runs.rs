//! The runs the control socket serves: a run asked, planned and guarded
//! from its commit to its end (`serve_run`, `guard`), and what the
//! socket's requesters hold (runs left planning, runs a connection
//! guards), so that the next request on a pool takes a run left over and
//! nobody ends a run another connection guards.

use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolId, RunId};
use poolgate_actors::{Fleet, GateError};
use serde_json::Value;

use crate::live::planning::{self, Plan, Refused, CHECK_EVERY};

use super::{read_line, send, Reply, Request, BEAT};

/// How long a refused commit waits before it is asked again (if no
/// `PoolReady` comes first).
const RETRY: Duration = Duration::from_millis(200);

/// Runs left planning by a requester that went away (or was refused
/// after its planning began), by pool: a run plans until it is committed
/// or aborted, so the next request on that pool takes it over rather than
/// find the pool held by a run nobody asks for.
#[derive(Clone, Default)]
pub(super) struct Orphans(std::sync::Arc<std::sync::Mutex<Requested>>);

/// What the socket's requesters hold: runs left planning, by pool, and the
/// runs a connection guards now (nobody else may end or resume those).
#[derive(Default)]
struct Requested {
    left: std::collections::HashMap<PoolId, RunId>,
    guarded: std::collections::HashSet<(PoolId, RunId)>,
}

/// A run a connection guards, for as long as this lives.
pub(super) struct Guarding {
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
    pub(super) fn guarding(&self, pool: &PoolId, run: &RunId) -> Option<Guarding> {
        let key = (pool.clone(), run.clone());
        self.lock().guarded.insert(key.clone()).then(|| Guarding {
            orphans: self.clone(),
            key,
        })
    }

    /// Whether a connection guards `run` of `pool`.
    pub(super) fn is_guarded(&self, pool: &PoolId, run: &RunId) -> bool {
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

/// What `run --end RUN` with no pool named says when no pool's active
/// run is RUN, alone or through the socket.
pub(crate) fn not_active_in_any(pools: &[PoolId]) -> String {
    let pools: Vec<&str> = pools.iter().map(PoolId::as_str).collect();
    format!("not the active run of any pool ({})", pools.join(", "))
}

pub(super) fn guarded_by_another(run: &RunId) -> Reply {
    Reply::Refused {
        code: "run_guarded".into(),
        detail: format!(
            "run {run} is guarded by its own requester (a running `poolgate run`): end that instead"
        ),
    }
}

pub(super) fn refused(e: &GateError) -> Reply {
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

/// What a run whose pool's gate stopped while it was asked is told: a
/// refusal naming the pool when a reload removed it; nothing when the
/// orchestrator is stopping (its connection closes: the requester says
/// the orchestrator went, and may ask again of the next one).
fn gone(fleet: &Fleet, pool: &PoolId) -> Option<Reply> {
    (!fleet.is_stopped()).then(|| Reply::Refused {
        code: GateError::Stopped.code().to_string(),
        detail: planning::gone(Some(pool)),
    })
}

/// The gate of `pool`, or of the only pool.
pub(super) fn pool_gate(
    fleet: &Fleet,
    pool: Option<String>,
) -> Result<poolgate_actors::Gate, Reply> {
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
pub(super) struct Asked {
    pub pool: Option<String>,
    pub run: String,
    pub required: Option<Vec<String>>,
}

pub(super) async fn serve_run<R, W>(
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
    let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
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
    let mut plan = Plan::new(run, required);
    let mut said = String::new();
    // Plans and commits at each `PoolReady` (or every RETRY) until
    // committed, refused for good, or the requester is gone; a run left
    // planning is left to the next request on the pool.
    // A plan that can never be committed is refused before it plans;
    // then looked at again while it waits.
    if let Err((e, _)) = plan.check(&gate).await {
        return Err(refused(&e));
    }
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + CHECK_EVERY, CHECK_EVERY);
    let outcome = loop {
        let ready = tokio::select! {
            ready = gate.wait_ready() => ready,
            _ = read_line(reader) => break Err(None),
            // A required node a reload took out of the pool: refused at
            // once, ready or not.
            _ = check.tick() => match plan.check(&gate).await {
                Ok(()) => continue,
                Err((e, _)) => break Err(Some(refused(&e))),
            },
        };
        let ready = match ready {
            Ok(ready) => ready,
            Err(GateError::Stopped) => break Err(gone(fleet, &pool_id)),
            Err(e) => break Err(Some(refused(&e))),
        };
        match plan.commit(&gate, ready.epoch).await {
            Ok(_) => break Ok(ready.epoch),
            Err((_, Refused::InTheWay(other))) if orphans.adopt(&pool_id, &other) => {
                tracing::info!(pool = %pool_id, run = %other, "a run left planning is taken over");
                plan.adopt(other);
                continue;
            }
            // A committed run nobody guards (restored after a restart,
            // its requester gone): said with what ends it.
            Err((_, Refused::InTheWay(other)))
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
            Err((e, Refused::Waits)) => waiting(writer, &mut said, &e).await,
            // Another request's run, still planning: it may yet be
            // refused or aborted, and this one waits its turn (refused
            // once that run is committed).
            Err((e, Refused::InTheWay(other)))
                if fleet.committed_run(&pool_id).as_ref() != Some(&other) =>
            {
                waiting(writer, &mut said, &e).await
            }
            // Aborted by the policy: planned again at the next PoolReady.
            Err((_, Refused::Aborted)) => {}
            Err((_, Refused::Stopped)) => break Err(gone(fleet, &pool_id)),
            // Refused for good (its planning aborted: the pool is not
            // left holding it), another run in the way.
            Err((e, _)) => break Err(Some(refused(&e))),
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = read_line(reader) => break Err(None),
        }
    };
    let epoch = match outcome {
        Ok(epoch) => epoch,
        Err(why) => {
            if plan.is_planning() {
                orphans.leave(&pool_id, plan.run());
            }
            return why.map_or(Ok(()), Err);
        }
    };
    let run = plan.run().clone();
    let _guarding = orphans.guarding(&pool_id, &run);
    guard(&gate, run, epoch.0, events, reader, writer).await;
    Ok(())
}

/// Guards `run`, committed on `gate` at `epoch`, for the requester on
/// `reader`/`writer`: its events so far, the word to start, then its
/// events as they come and a beat every [`BEAT`], until it faults, the
/// requester ends it, or the requester is gone (its run is ended).
pub(super) async fn guard<R, W>(
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
