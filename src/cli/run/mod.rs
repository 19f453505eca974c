//! `poolgate run` (design §7): one path, alone or among replicas. What
//! differs is who keeps the run committed and guarded (a `Keeper`):
//! this process's own gate, or the leader among replicas, asked through
//! etcd (design §12).

use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::{NodeId, RunId};
use poolgate_actors::{EventStream, GateError};
use tokio::signal::unix::{signal, SignalKind};

use super::commands::{
    recording, reload_on_hangup, sockets_free, stop_command, stop_signal, warn_without_state,
    AbortOnDrop, Output, Printer, RunRequest, EXIT_UNGUARDED, STOP_GRACE,
};
use crate::config::Config;
use crate::live::{LiveError, Orchestrator};

mod alone;
mod control;
mod replicated;

use replicated::campaign;

/// `poolgate run`: waits for `PoolReady`, plans and commits over the
/// required nodes (or takes over a restored run, `--resume`), runs
/// `command` and guards it. Returns the exit code: the command's own; 3
/// when the run faulted (the command's process group is sent SIGTERM,
/// then SIGKILL after 5 s); 1 when the pool was not ready within the
/// timeout; [`EXIT_OTHER_RUN`](crate::cli::commands::EXIT_OTHER_RUN) when a restored run is in the way;
/// [`EXIT_UNGUARDED`](crate::cli::commands::EXIT_UNGUARDED) when its run could not be confirmed guarded; 128 +
/// signal when `run` was signalled (the command stopped and the run ended
/// first).
///
/// One path, alone or among replicas: what differs is who keeps the run
/// committed and guarded (a `Keeper`): this process's own gate, or the
/// leader among replicas, asked through etcd.
pub async fn run(
    config: &Config,
    path: &Path,
    request: RunRequest,
    output: Output,
    command: &[String],
    record: Option<&Path>,
) -> Result<i32, LiveError> {
    if command.is_empty() {
        return Err(LiveError::Io(std::io::Error::other(
            "no COMMAND given after --",
        )));
    }
    let required = request
        .require
        .clone()
        .unwrap_or_else(|| config.pool.members().to_vec());
    // Beside a watch serving `[control] socket`, that orchestrator checks
    // the plan against the pool named.
    let served = config
        .control
        .as_ref()
        .is_some_and(|p| crate::live::control::is_served(p));
    if let Some(stranger) = required
        .iter()
        .find(|n| !served && !config.pool.members().contains(n))
    {
        return Err(
            GateError::Refused(poolgate_actors::core::Refusal::NotCandidate(
                stranger.clone(),
            ))
            .into(),
        );
    }
    let stop = stop_signal()?;
    tokio::pin!(stop);
    // From the start: a SIGHUP (a key rotation's `pkill -HUP poolgate`)
    // while waiting must not end `run` by the signal's default action.
    let hangup = signal(SignalKind::hangup())?;
    let mut keeper = Keeper::of(config, path, &request, output, record, hangup).await?;
    let run = match keeper
        .commit(config, &request, &required, stop.as_mut())
        .await?
    {
        Ok(run) => run,
        Err(code) => return Ok(code),
    };
    // This process frozen (SIGSTOP, a hung runtime) cannot stop the
    // command when the run ends: its keeper does, after half of
    // `unguarded_after` without a sign, before the requester's session
    // (that long, renewed every sixth of it) can expire and the leader
    // end the run (docs/failover.md §3).
    let watchdog = config.run.unguarded_after / 2;
    let spawned = super::guard::Guarded::spawn(
        command,
        super::guard::Streams::Inherit,
        STOP_GRACE,
        Some(watchdog),
    );
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            // Committed, and nothing to guard: the run ends here.
            if let Err(ended) = keeper.end(&run).await {
                tracing::warn!(%run, error = %ended, "run not ended");
            }
            return Err(LiveError::Io(std::io::Error::other(format!(
                "{}: {e}",
                command[0]
            ))));
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                let (gave_up, killed) = said_keeper_end(status, &run, watchdog);
                // A run that faulted meanwhile (this process frozen while
                // its node went) exits 3, its fault printed by the end.
                let faulted = keeper.end(&run).await?;
                return Ok(if faulted {
                    3
                } else if gave_up || killed.is_some() {
                    EXIT_UNGUARDED
                } else {
                    super::guard::code(status)
                });
            }
            ended = keeper.guard(&run) => {
                let Some(ended) = ended? else { continue };
                // Back from a freeze, the run's end and the keeper's are
                // seen at once: what the keeper did is said either way.
                if let Some(status) = child.exited() {
                    said_keeper_end(status, &run, watchdog);
                }
                stop_command(&mut child).await;
                let code = match ended {
                    Ended::Told(code) => code,
                    Ended::Untold => keeper.told(&run).await,
                };
                return Ok(code);
            }
            signal = &mut stop => {
                // The command goes first, then its run: nothing is left
                // guarded by no one, and the stored state holds no run.
                stop_command(&mut child).await;
                if let Err(e) = keeper.end(&run).await {
                    tracing::warn!(%run, error = %e, "run not ended");
                }
                return Ok(128 + signal);
            }
        }
    }
}

/// Says how the command's keeper ended (`status`) when it was not by the
/// command's own exit: it gave up on this process (no sign for
/// `watchdog`: stopped or hung), or it was killed. Returns both facts.
fn said_keeper_end(
    status: std::process::ExitStatus,
    run: &RunId,
    watchdog: Duration,
) -> (bool, Option<i32>) {
    let gave_up = super::guard::gave_up(status);
    let killed = super::guard::killed_by(status);
    if gave_up {
        crate::say!(warn, "poolgate run: run {run}: this process gave its keeper no sign for {} (it was stopped or hung): the keeper stopped its command", crate::config::in_words(watchdog));
    }
    if let Some(signal) = killed {
        crate::say!(warn, "poolgate run: run {run}: the command's keeper was killed (signal {signal}): its command is stopped");
    }
    (gave_up, killed)
}

/// How a guarded run ended, as its keeper found it: its command is to
/// stop.
enum Ended {
    /// Told (and said): `run` exits with this code.
    Told(i32),
    /// The stored state no longer holds the run, its outcome not written
    /// yet: read once the command is stopped ([`Keeper::told`]).
    Untold,
}

/// Who keeps `poolgate run`'s run committed and guarded.
enum Keeper {
    /// This process alone: its own orchestrator plans, commits and guards
    /// the run, and its events are this process's.
    Alone(Box<AloneKeeper>),
    /// Among replicas (`[state] etcd`, design §12): the run is asked of
    /// whichever replica leads, through etcd, and this process is a
    /// replica too (it leads when it can, and then serves every request,
    /// its own included). A takeover changes nothing here: the next leader
    /// guards the run from etcd and answers through the same keys.
    Replicated(Box<ReplicatedKeeper>),
    /// Beside a running `watch` (`[control] socket`, design §14): the run
    /// is asked of that orchestrator, which plans, commits and guards it
    /// and tells this process its events.
    Control(Box<ControlKeeper>),
}

struct ControlKeeper {
    client: crate::live::control::Client,
    pool: Option<String>,
    printer: Printer,
    /// Silence from the orchestrator longer than this (half of `[run]
    /// unguarded_after`) means the run is no longer confirmed guarded.
    silence: Duration,
    _hangups: AbortOnDrop,
}

struct AloneKeeper {
    live: Orchestrator,
    events: EventStream,
    printer: Printer,
    hangup: tokio::signal::unix::Signal,
    path: std::path::PathBuf,
}

struct ReplicatedKeeper {
    requests: crate::ha::requests::Requests,
    /// The request's etcd session (see [`crate::ha::requests::Session`]).
    session: Option<crate::ha::requests::Session>,
    printer: Printer,
    unguarded_after: Duration,
    /// When the run was last confirmed guarded.
    confirmed: tokio::time::Instant,
    _reloading: Option<AbortOnDrop>,
    _leading: Option<AbortOnDrop>,
}

impl Keeper {
    async fn of(
        config: &Config,
        path: &Path,
        request: &RunRequest,
        output: Output,
        record: Option<&Path>,
        hangup: tokio::signal::unix::Signal,
    ) -> Result<Keeper, LiveError> {
        if let Some(path) = &config.control {
            if let Some(client) = crate::live::control::Client::connect(path).await {
                if record.is_some() {
                    return Err(LiveError::Setting {
                        key: "control.socket",
                        message: "--record: the orchestrator serving the control socket applies the inputs; record there (watch --record)".into(),
                    });
                }
                tracing::info!(socket = %path.display(), "asking the orchestrator that serves the control socket");
                // Its configuration is the watch's: a SIGHUP here changes
                // nothing, and says so.
                let mut hangup = hangup;
                let hangups = actix::spawn(async move {
                    while hangup.recv().await.is_some() {
                        tracing::warn!("SIGHUP: this run asks the watch serving the control socket, whose configuration it uses; nothing is read again here (send SIGHUP to that watch)");
                    }
                });
                return Ok(Keeper::Control(Box::new(ControlKeeper {
                    client,
                    pool: request.pool.clone(),
                    printer: Printer::new(output),
                    silence: config.run.unguarded_after / 2,
                    _hangups: AbortOnDrop(hangups),
                })));
            }
        }
        if config.state.etcd.is_empty() {
            warn_without_state(config);
            let live = Orchestrator::start_recording(config, recording(record)?).await?;
            return Ok(Keeper::Alone(Box::new(AloneKeeper {
                events: live.gate.subscribe(),
                live,
                printer: Printer::new(output),
                hangup,
                path: path.to_path_buf(),
            })));
        }
        if request.resume.is_some() {
            return Err(LiveError::Setting {
                key: "state.etcd",
                message: "--resume: among replicas a committed run stays guarded by the leader; end it with --end".into(),
            });
        }
        // A `run` whose sockets another process on this host holds (a
        // `run` beside a `watch`) could not act if it won the leadership,
        // and would hold it for a lease with nobody leading: it does not
        // campaign, it only asks.
        // With [pools.<id>], `run --pool` holds one pool's configuration:
        // leading with it would leave the other pools' runs unguarded, so
        // it only asks (a `watch` replica leads every pool).
        let (requests, reloading, leading) = if sockets_free(config) && config.pools.is_empty() {
            let mut replica = crate::ha::replica::Replica::start(config)?;
            replica.warm_up().await?;
            let reloading = reload_on_hangup(replica.swim_keys(), replica.reloads(), path, hangup);
            let requests = replica.requests();
            let leading = actix::spawn(campaign(replica, record.map(Path::to_path_buf)));
            (requests, Some(reloading), Some(AbortOnDrop(leading)))
        } else {
            if config.pools.is_empty() {
                tracing::info!(agents = %config.agents.listen, swim = %config.swim.bind, "this run's sockets are held by another process on this host (a watch?): it does not campaign, it only asks the leader");
            } else {
                tracing::info!("several pools among replicas: run does not campaign (a watch replica leads every pool), it only asks the leader");
            }
            (crate::ha::replica::requests_of(config)?, None, None)
        };
        Ok(Keeper::Replicated(Box::new(ReplicatedKeeper {
            requests,
            session: None,
            printer: Printer::new(output),
            unguarded_after: config.run.unguarded_after,
            confirmed: tokio::time::Instant::now(),
            _reloading: reloading,
            _leading: leading,
        })))
    }

    /// Gets a run committed: `Ok(run)`, or the exit code when none was
    /// (not ready in time, refused, another run in the way, signalled).
    async fn commit(
        &mut self,
        config: &Config,
        request: &RunRequest,
        required: &[NodeId],
        stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        match self {
            Keeper::Alone(alone) => alone.commit(request, required, stop).await,
            Keeper::Replicated(replicated) => {
                replicated.commit(config, request, required, stop).await
            }
            Keeper::Control(control) => control.commit(request, required, stop).await,
        }
    }

    /// One step of guarding `run` while its command runs: `Some` once the
    /// run ended (faulted, or no longer confirmed guarded): the command is
    /// to stop.
    async fn guard(&mut self, run: &RunId) -> Result<Option<Ended>, LiveError> {
        match self {
            Keeper::Alone(alone) => alone.guard(run).await,
            Keeper::Replicated(replicated) => replicated.guard(run).await,
            Keeper::Control(control) => Ok(control.guard().await),
        }
    }

    /// The exit code of a run that ended [`Ended::Untold`], its command
    /// stopped: what became of it, if the leader writes it within a
    /// second.
    async fn told(&mut self, run: &RunId) -> i32 {
        match self {
            Keeper::Alone(_) | Keeper::Control(_) => EXIT_UNGUARDED,
            Keeper::Replicated(replicated) => replicated.told(run).await,
        }
    }

    /// Ends `run` (its command is gone), and tells what became of it:
    /// whether it had faulted (its fault told).
    async fn end(&mut self, run: &RunId) -> Result<bool, LiveError> {
        match self {
            Keeper::Alone(alone) => alone.end(run).await.map(|()| false),
            Keeper::Replicated(replicated) => Ok(replicated.end(run).await),
            Keeper::Control(control) => Ok(control.end(run).await),
        }
    }
}

/// Says that a signal stopped `run` while it waited to be committed (its
/// command not started), and gives the exit code: 128 + `signal`.
pub(super) fn stopped_while_waiting(run: Option<&RunId>, signal: i32) -> i32 {
    let run = run.map_or_else(|| "its run".to_string(), |run| format!("run {run}"));
    crate::say!(warn, "poolgate run: {run} was not committed: stopped by signal {signal} while it waited (its command was not started)");
    128 + signal
}
