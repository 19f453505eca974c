//! What `run` does with a pool, alone or beside others: plan and commit
//! on a ready pool, stop its command, end a run nobody guards, and the
//! exit codes it says so by.

use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::{EventStream, Gate, GateError};

use crate::config::Config;
use crate::live::planning::{Plan, Refused};
use crate::live::{LiveError, Orchestrator};

use super::output::Printer;

/// `poolgate run`'s exit code when another run, restored from the state
/// file, is active: it must be resumed (`--resume`) or ended (`--end`).
pub const EXIT_OTHER_RUN: i32 = 4;

/// `poolgate run`'s exit code when its run is refused for good (a
/// required node not in the pool, say: no wait changes it), as for any
/// other error.
pub const EXIT_REFUSED: i32 = 2;

/// How long `run` waits before asking again after a refusal.
pub const RETRY_AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// How long a stopped command has between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What `poolgate run` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// The pool (`--pool`; the only pool when `None`).
    pub pool: Option<String>,
    /// The nodes the run requires (every member when `None`).
    pub require: Option<Vec<NodeId>>,
    /// Guard this run, restored from the state file, instead of planning
    /// a new one (`--resume`).
    pub resume: Option<RunId>,
    /// Give up waiting for `PoolReady` after this long.
    pub timeout: Option<Duration>,
}

/// Whether this host's agent listener and SWIM socket of `config` can be
/// bound now (a `run` that cannot bind them cannot lead).
pub(crate) fn sockets_free(config: &Config) -> bool {
    let agents = config.agents.listen;
    let swim = config.swim.bind;
    let taken = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
    let tcp = agents.port() == 0 || !std::net::TcpListener::bind(agents).is_err_and(|e| taken(&e));
    let udp = swim.port() == 0 || !std::net::UdpSocket::bind(swim).is_err_and(|e| taken(&e));
    tcp && udp
}

/// Stops the guarded command's whole group; says so when some of it could
/// not be stopped (never that it was).
pub(crate) async fn stop_command(child: &mut crate::cli::guard::Guarded) {
    if let Err(left) = child.stop().await {
        tracing::error!(error = %left, "the command was not stopped");
        crate::say!(warn, "poolgate run: {left}: the command was NOT stopped");
    }
}

/// `poolgate run`'s exit code when it stopped its command because it could
/// not confirm that the run was still guarded (docs/failover.md §3).
pub const EXIT_UNGUARDED: i32 = 5;

/// What became of `run`, read for up to a second (the leader writes it
/// right after the state that ended it).
pub(crate) async fn told_end(
    requests: &crate::ha::requests::Requests,
    run: &RunId,
) -> Option<crate::ha::requests::RunOutcome> {
    for _ in 0..10 {
        if let Ok(Some(outcome)) = requests.outcome(run).await {
            if outcome.status != "committed" {
                return Some(outcome);
            }
        }
        tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await;
    }
    None
}

/// How long `run --end` waits for a leader among replicas.
pub const END_WAIT: Duration = Duration::from_secs(10);

/// `run --end RUN` among replicas: asks the leader to end the run, and
/// says whether it did (exit 0), had no such active run (exit 4), or no
/// leader answered within [`END_WAIT`] (exit 1).
async fn end_replicated_run(config: &Config, run: &RunId) -> Result<i32, LiveError> {
    let failed =
        |e: poolgate_actors::StoreError| LiveError::Io(std::io::Error::other(e.to_string()));
    let requests = crate::ha::replica::requests_of(config)?;
    // A run whose requester is gone has no outcome to read: what is
    // stored says whether it ended.
    let active = |requests: crate::ha::requests::Requests| async move {
        requests.active_run().await.map_err(failed)
    };
    let was_active = active(requests.clone()).await?.as_ref() == Some(run);
    requests.finish(run).await.map_err(failed)?;
    let deadline = tokio::time::Instant::now() + END_WAIT;
    let mut taken = false;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await;
        let outcome = requests.outcome(run).await.map_err(failed)?;
        // Finished on this request, or ended already by the leader (its
        // requester gone for good).
        let finished = outcome
            .as_ref()
            .is_some_and(|o| o.status == "finished" || o.status == "ended");
        if finished || (was_active && active(requests.clone()).await?.as_ref() != Some(run)) {
            crate::say!(info, "poolgate run: run {run} ended");
            return Ok(0);
        }
        taken = !requests.finish_pending(run).await.map_err(failed)?;
        if taken && !was_active {
            break;
        }
    }
    if taken {
        crate::say!(
            warn,
            "poolgate run: --end {run}: not the active run of the leader"
        );
        return Ok(EXIT_OTHER_RUN);
    }
    crate::say!(warn, "poolgate run: --end {run}: no leader took it up within {END_WAIT:?} (asked; the next leader will)");
    Ok(1)
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Plans and commits `run` over `required` on a ready pool; readiness
/// lost on the way means waiting for the next `PoolReady` (the planning
/// run is suspended, or aborted and begun again, by the configured
/// policy). `Ok(Err(code))`: `run` exits with `code` (not ready in time,
/// or a restored run in the way).
pub(crate) async fn plan_and_commit(
    gate: &Gate,
    events: &mut EventStream,
    printer: &mut Printer,
    run: &mut RunId,
    required: &[NodeId],
    timeout: Option<Duration>,
) -> Result<Result<(), i32>, LiveError> {
    let limit = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(limit);
    let mut plan = Plan::new(run.clone(), required.to_vec());
    let (first, mut attempt) = (run.clone(), 1);
    // A plan that can never be committed is refused before it waits;
    // then looked at again while it does.
    let mut checked = plan.check(gate).await.err();
    loop {
        let committed = match checked.take() {
            Some(refused) => Err(refused),
            None => {
                let proof = tokio::select! {
                    proof = wait_ready(gate, events, printer, &mut plan) => proof?,
                    _ = &mut limit => {
                        not_ready_within(gate, timeout).await;
                        return Ok(Err(1));
                    }
                };
                match proof {
                    Ok(proof) => plan.commit(gate, proof).await,
                    Err(refused) => Err(refused),
                }
            }
        };
        let refused = match committed {
            Ok(_) => return Ok(Ok(())),
            Err((refused, Refused::Waits)) => refused,
            Err((_, Refused::Stopped)) => {
                crate::say!(warn, "poolgate run: run {run} refused: {}", plan.gone());
                return Ok(Err(EXIT_REFUSED));
            }
            Err((_, Refused::Aborted)) => {
                // Aborted by the policy: that run is over (a run ends
                // once), and the plan is planned again at once as a new
                // run.
                attempt += 1;
                *run = RunId::new(&format!("{first}-{attempt}")).map_err(GateError::from)?;
                plan.rename(run.clone());
                continue;
            }
            Err((_, Refused::InTheWay(other))) => {
                in_the_way(&other);
                return Ok(Err(EXIT_OTHER_RUN));
            }
            Err((refused, Refused::ForGood | Refused::Committed)) => {
                // No wait changes it (a required node a reload took out of
                // the pool, say): said; its planning was aborted.
                super::drain(gate, events, printer).await;
                crate::say!(warn, "poolgate run: run {run} refused: {refused}");
                return Ok(Err(EXIT_REFUSED));
            }
        };
        tracing::warn!(%refused, "refused; asking again in {RETRY_AFTER_REFUSAL:?} or at the next PoolReady");
        tokio::select! {
            _ = tokio::time::sleep(RETRY_AFTER_REFUSAL) => {}
            _ = &mut limit => {
                // The pool may be ready: what blocks the run is the
                // refusal (a node another pool's run holds, say).
                let within = crate::config::in_words(timeout.unwrap_or_default());
                crate::say!(warn, "poolgate: run {run} was not committed within {within}: {refused}");
                return Ok(Err(1));
            }
        }
    }
}

/// Says that `other`, restored from the state file, stands in the way.
pub(crate) fn in_the_way(other: &RunId) {
    crate::say!(
        warn,
        "poolgate run: run {other}, restored from the state file, is still active; \
         `poolgate run --resume {other} -- COMMAND` guards it, `poolgate run --end {other}` ends it"
    );
}

/// `poolgate run --end RUN`: ends RUN, restored from the state file, whose
/// guard is gone. Exit 0 once it is ended (and stored so), 4 when RUN is
/// not the active run.
pub async fn end_run(config: &Config, pool: Option<&str>, run: &RunId) -> Result<i32, LiveError> {
    // Beside a watch serving `[control] socket`: that orchestrator ends it.
    if let Some(path) = config
        .control
        .as_ref()
        .filter(|p| crate::live::control::is_served(p))
    {
        return match crate::live::control::end_run(path, pool, run).await {
            Ok(None) => {
                crate::say!(info, "poolgate run: run {run} ended");
                Ok(0)
            }
            Ok(Some(why)) => {
                crate::say!(warn, "poolgate run: --end {run}: {why}");
                Ok(EXIT_OTHER_RUN)
            }
            Err(e) => Err(LiveError::Io(std::io::Error::other(e))),
        };
    }
    // Several pools and none named: the pool whose run it is.
    let several = pool.is_none() && config.pools.len() > 1;
    let not_any = || {
        let pools: Vec<_> = config
            .pool_definitions()
            .iter()
            .map(|p| p.id().clone())
            .collect();
        crate::say!(
            warn,
            "poolgate run: --end {run}: {}",
            crate::live::control::not_active_in_any(&pools)
        );
        Ok(EXIT_OTHER_RUN)
    };
    if !config.state.etcd.is_empty() {
        if !several {
            return end_replicated_run(config, run).await;
        }
        for definition in config.pool_definitions() {
            let narrowed = config
                .with_only_pool(Some(definition.id().as_str()))
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))?;
            let active = crate::ha::replica::requests_of(&narrowed)?
                .active_run()
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
            if active.as_ref() == Some(run) {
                return end_replicated_run(&narrowed, run).await;
            }
        }
        return not_any();
    }
    let live = Orchestrator::start_recording(config, None).await?;
    let gate = match several {
        false => live.gate.clone(),
        true => match live.fleet.pool_running(run).await? {
            Some(gate) => gate,
            None => return not_any(),
        },
    };
    match gate.finish_run(run.clone()).await {
        Ok(()) => {
            crate::say!(info, "poolgate run: run {run} ended");
            Ok(0)
        }
        Err(GateError::Refused(refused)) => {
            crate::say!(warn, "poolgate run: --end {run}: {refused}");
            Ok(EXIT_OTHER_RUN)
        }
        Err(e) => Err(e.into()),
    }
}

/// Waits for the pool to be ready, printing its events: its epoch; or,
/// looked at every [`CHECK_EVERY`](crate::live::planning::CHECK_EVERY)
/// meanwhile, why `plan` can no longer be committed.
pub(crate) async fn wait_ready(
    gate: &Gate,
    events: &mut EventStream,
    printer: &mut Printer,
    plan: &mut Plan,
) -> Result<Result<poolgate_actors::core::Epoch, (GateError, Refused)>, LiveError> {
    let stopped = || Ok(Err((GateError::Stopped, Refused::Stopped)));
    match gate.report().await {
        Ok(report) => {
            if let poolgate_actors::core::PoolPhase::Ready { epoch } = report.phase {
                return Ok(Ok(epoch));
            }
        }
        Err(GateError::Stopped) => return stopped(),
        Err(e) => return Err(e.into()),
    }
    let every = crate::live::planning::CHECK_EVERY;
    let mut check = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        // An event is printed whole once taken: only the wait for one
        // gives way to the look.
        let event = tokio::select! {
            event = events.recv() => event,
            _ = check.tick() => {
                if let Err(refused) = plan.check(gate).await {
                    return Ok(Err(refused));
                }
                continue;
            }
        };
        let Some(event) = event else {
            return stopped();
        };
        let epoch = match &event {
            Event::PoolReady { epoch, .. } => Some(*epoch),
            _ => None,
        };
        printer.print(gate, event).await;
        if let Some(epoch) = epoch {
            return Ok(Ok(epoch));
        }
    }
}

/// Says on stderr that the pool was not ready in time, and what blocks it.
pub(crate) async fn not_ready_within(gate: &Gate, timeout: Option<Duration>) {
    let within = timeout
        .map(|t| crate::config::in_words(t).to_string())
        .unwrap_or_default();
    match gate.report().await {
        Ok(report) => crate::say!(
            warn,
            "poolgate: not ready within {within}: {}",
            crate::report::state_line_live(&report, &gate.clock())
        ),
        Err(_) => crate::say!(warn, "poolgate: not ready within {within}"),
    }
}
