//! `poolgate run` (design §7): one path, alone or among replicas. What
//! differs is who keeps the run committed and guarded (a `Keeper`):
//! this process's own gate, or the leader among replicas, asked through
//! etcd (design §12).

use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::{EventStream, GateError};
use tokio::signal::unix::{signal, SignalKind};

use super::commands::{
    drain, in_the_way, plan_and_commit, recording, reload_on_hangup, sockets_free, stop_command,
    stop_signal, told_end, warn_without_state, AbortOnDrop, Leadership, Output, Printer,
    RunRequest, END_WAIT, EXIT_OTHER_RUN, EXIT_UNGUARDED, STOP_GRACE,
};
use crate::config::Config;
use crate::live::{LiveError, Orchestrator};

/// `poolgate run`: waits for `PoolReady`, plans and commits over the
/// required nodes (or takes over a restored run, `--resume`), runs
/// `command` and guards it. Returns the exit code: the command's own; 3
/// when the run faulted (the command's process group is sent SIGTERM,
/// then SIGKILL after 5 s); 1 when the pool was not ready within the
/// timeout; [`EXIT_OTHER_RUN`] when a restored run is in the way;
/// [`EXIT_UNGUARDED`] when its run could not be confirmed guarded; 128 +
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
    // (that long, renewed every third of it) can expire and the leader
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
                let gave_up = super::guard::gave_up(status);
                let killed = super::guard::killed_by(status);
                if gave_up {
                    eprintln!("poolgate run: run {run}: this process gave its keeper no sign for {} (it was stopped or hung): the keeper stopped its command", crate::config::in_words(watchdog));
                }
                if let Some(signal) = killed {
                    eprintln!("poolgate run: run {run}: the command's keeper was killed (signal {signal}): its command is stopped");
                }
                keeper.end(&run).await?;
                return Ok(if gave_up || killed.is_some() {
                    EXIT_UNGUARDED
                } else {
                    super::guard::code(status)
                });
            }
            ended = keeper.guard(&run) => {
                let Some(ended) = ended? else { continue };
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
}

struct AloneKeeper {
    live: Orchestrator,
    events: EventStream,
    printer: Printer,
    hangup: tokio::signal::unix::Signal,
    path: std::path::PathBuf,
}

struct ReplicatedKeeper {
    requests: crate::live::requests::Requests,
    /// The request's etcd session (see [`crate::live::requests::Session`]).
    session: Option<crate::live::requests::Session>,
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
                return Ok(Keeper::Control(Box::new(ControlKeeper {
                    client,
                    pool: request.pool.clone(),
                    printer: Printer::new(output),
                    silence: config.run.unguarded_after / 2,
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
        let (requests, reloading, leading) = if sockets_free(config) {
            let mut replica = crate::live::replica::Replica::start(config)?;
            replica.warm_up().await?;
            let reloading = reload_on_hangup(replica.swim_keys(), path, hangup);
            let requests = replica.requests();
            let leading = actix::spawn(campaign(replica, record.map(Path::to_path_buf)));
            (requests, Some(reloading), Some(AbortOnDrop(leading)))
        } else {
            tracing::info!(agents = %config.agents.listen, swim = %config.swim.bind, "this run's sockets are held by another process on this host (a watch?): it does not campaign, it only asks the leader");
            (crate::live::replica::requests_of(config)?, None, None)
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

    /// Ends `run` (its command is gone), and tells what became of it.
    async fn end(&mut self, run: &RunId) -> Result<(), LiveError> {
        match self {
            Keeper::Alone(alone) => alone.end(run).await,
            Keeper::Replicated(replicated) => {
                replicated.end(run).await;
                Ok(())
            }
            Keeper::Control(control) => {
                control.end(run).await;
                Ok(())
            }
        }
    }
}

impl ControlKeeper {
    async fn commit(
        &mut self,
        request: &RunRequest,
        required: &[NodeId],
        stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        use crate::live::control::{Reply, Request};
        let (run, asked) = match &request.resume {
            // A committed run (restored, its requester gone) guarded anew.
            Some(run) => (
                run.clone(),
                Request::Resume {
                    v: 1,
                    pool: self.pool.clone(),
                    run: run.to_string(),
                },
            ),
            None => {
                let run =
                    RunId::new(&format!("run-{}", std::process::id())).map_err(GateError::from)?;
                let asked = Request::Run {
                    v: 1,
                    pool: self.pool.clone(),
                    run: run.to_string(),
                    required: request
                        .require
                        .as_ref()
                        .map(|_| required.iter().map(|n| n.to_string()).collect()),
                };
                (run, asked)
            }
        };
        self.client.ask(&asked).await?;
        let limit = tokio::time::sleep(request.timeout.unwrap_or(Duration::MAX / 4));
        tokio::pin!(limit, stop);
        loop {
            let reply = tokio::select! {
                reply = self.client.next() => reply,
                _ = &mut limit => {
                    // Closing the connection withdraws the request.
                    let within = crate::config::in_words(request.timeout.unwrap_or_default());
                    eprintln!("poolgate: run {run} was not committed within {within} (ask poolgate status what blocks the pool)");
                    return Ok(Err(1));
                }
                signal = &mut stop => return Ok(Err(128 + signal)),
            };
            match reply {
                Some(Reply::Event { event }) => self.print(event),
                Some(Reply::Waiting { detail }) => {
                    eprintln!("poolgate run: run {run} waits: {detail}");
                }
                // The run committed is the one named (a run its last
                // requester left planning may have been taken over).
                Some(Reply::Committed { run: committed, .. }) => {
                    return Ok(Ok(RunId::new(&committed).unwrap_or(run)))
                }
                Some(Reply::Refused { code, detail }) => {
                    eprintln!(
                        "poolgate run: run {run} refused by the orchestrator: {detail} ({code})"
                    );
                    return Ok(Err(if code == "run_in_progress" {
                        EXIT_OTHER_RUN
                    } else {
                        1
                    }));
                }
                Some(_) => {}
                None => {
                    eprintln!("poolgate run: the orchestrator serving the control socket closed the connection before the run was committed");
                    return Ok(Err(1));
                }
            }
        }
    }

    fn print(&mut self, event: serde_json::Value) {
        self.printer
            .print_told(serde_json::from_value::<Event>(event).ok());
    }

    /// One step: `Some` once the run ended (faulted, or the orchestrator
    /// is gone: the run is no longer guarded).
    async fn guard(&mut self) -> Option<Ended> {
        use crate::live::control::Reply;
        // The orchestrator beats every half second; a frozen or hung one
        // guards nothing.
        let Ok(reply) = tokio::time::timeout(self.silence, self.client.next()).await else {
            eprintln!(
                "poolgate run: the orchestrator serving the control socket said nothing for {}: the run is no longer confirmed guarded; its command is stopped",
                crate::config::in_words(self.silence)
            );
            return Some(Ended::Told(EXIT_UNGUARDED));
        };
        match reply {
            Some(Reply::Event { event }) => {
                self.print(event);
                None
            }
            Some(Reply::Ended {
                status,
                node,
                reason,
            }) if status == "faulted" => {
                eprintln!(
                    "poolgate run: run faulted: {} {}",
                    node.unwrap_or_default(),
                    reason.unwrap_or_default()
                );
                Some(Ended::Told(3))
            }
            Some(Reply::Ended { reason, .. }) => {
                eprintln!(
                    "poolgate run: the run ended ({}): its command is stopped",
                    reason.unwrap_or_default()
                );
                Some(Ended::Told(EXIT_UNGUARDED))
            }
            Some(_) => None,
            None => {
                eprintln!("poolgate run: the orchestrator serving the control socket is gone: the run is no longer guarded; its command is stopped");
                Some(Ended::Told(EXIT_UNGUARDED))
            }
        }
    }

    async fn end(&mut self, run: &RunId) {
        use crate::live::control::{Reply, Request};
        if self.client.ask(&Request::Finish).await.is_err() {
            return;
        }
        // Bounded: an orchestrator frozen meanwhile does not hold `run`.
        let deadline = tokio::time::Instant::now() + self.silence;
        while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, self.client.next()).await {
            match reply {
                Reply::Event { event } => self.print(event),
                Reply::Ended { .. } => return,
                Reply::Refused { detail, .. } => {
                    return tracing::warn!(%run, %detail, "the end of the run refused")
                }
                _ => {}
            }
        }
    }
}

/// A replica's campaign for `run`: leads when it can (recording each term
/// into `record`, `record.n` after the first), follows when it cannot.
async fn campaign(replica: crate::live::replica::Replica, record: Option<std::path::PathBuf>) {
    let mut leadership = Leadership::Replica(Box::new(replica));
    loop {
        match leadership.lead(record.as_deref()).await {
            Ok(live) => {
                leadership.lost().await;
                live.stop().await;
                tracing::warn!(replica = %leadership.name(), "this replica stopped leading; following the new leader");
            }
            Err(e) => {
                return tracing::warn!(error = %e, "this run cannot lead: it only asks the leader")
            }
        }
    }
}

impl AloneKeeper {
    async fn commit(
        &mut self,
        request: &RunRequest,
        required: &[NodeId],
        stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        let gate = self.live.gate.clone();
        let run = match &request.resume {
            Some(run) => {
                let active = gate.report().await?.run;
                if active.as_ref() != Some(run) {
                    let active = active.map_or("none".to_string(), |r| r.to_string());
                    eprintln!(
                        "poolgate run: --resume {run}: no such active run (the active run: {active})"
                    );
                    return Ok(Err(EXIT_OTHER_RUN));
                }
                run.clone()
            }
            None => {
                // A restored run in the way is said at once, ready pool or not.
                if let Some(other) = gate.report().await?.run {
                    in_the_way(&other);
                    return Ok(Err(EXIT_OTHER_RUN));
                }
                let mut run =
                    RunId::new(&format!("run-{}", std::process::id())).map_err(GateError::from)?;
                let committed = tokio::select! {
                    committed = plan_and_commit(&gate, &mut self.events, &mut self.printer, &mut run, required, request.timeout) => committed?,
                    signal = stop => return Ok(Err(128 + signal)),
                };
                if let Err(code) = committed {
                    return Ok(Err(code));
                }
                run
            }
        };
        drain(&gate, &mut self.events, &mut self.printer).await;
        Ok(Ok(run))
    }

    async fn guard(&mut self, run: &RunId) -> Result<Option<Ended>, LiveError> {
        tokio::select! {
            event = self.events.recv() => {
                let Some(event) = event else { return Err(GateError::Stopped.into()) };
                let faulted = matches!(&event, Event::RunFaulted { run: r, .. } if r == run);
                self.printer.print(&self.live.gate, event).await;
                if faulted {
                    return Ok(Some(Ended::Told(3)));
                }
            }
            _ = self.hangup.recv() => {
                let live = &self.live;
                super::commands::reload(live, &self.path).await;
            }
        }
        Ok(None)
    }

    async fn end(&mut self, run: &RunId) -> Result<(), LiveError> {
        let gate = self.live.gate.clone();
        drain(&gate, &mut self.events, &mut self.printer).await;
        let ended = gate.finish_run(run.clone()).await;
        drain(&gate, &mut self.events, &mut self.printer).await;
        Ok(ended?)
    }
}

impl ReplicatedKeeper {
    async fn commit(
        &mut self,
        config: &Config,
        request: &RunRequest,
        required: &[NodeId],
        mut stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        let requests = self.requests.clone();
        let failed =
            |e: poolgate_actors::StoreError| LiveError::Io(std::io::Error::other(e.to_string()));
        // Unique across hosts and containers, where pids repeat.
        let new_run = || {
            RunId::new(&format!(
                "run-{}-{:06x}",
                std::process::id(),
                rand::random::<u32>() & 0xff_ffff
            ))
            .map_err(GateError::from)
        };
        let mut run = new_run()?;
        // The request lives on this process's etcd session: if it goes
        // before a commit (crash, cut off for a lease), the request goes
        // with it; a run committed stays guarded by whichever replica
        // leads (design §12) until it faults or is ended.
        let mut session = requests
            .ask_of(
                Some(config.pool.id()),
                &run,
                required,
                config.run.unguarded_after,
            )
            .await
            .map_err(failed)?;
        let mut said = crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY);
        let limit = tokio::time::sleep(request.timeout.unwrap_or(Duration::MAX / 4));
        tokio::pin!(limit);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(crate::live::requests::LOOK_EVERY) => {
                    match requests.outcome(&run).await {
                        Ok(Some(outcome)) if outcome.status == "committed" => {
                            self.printer.print_told(outcome.event);
                            break;
                        }
                        Ok(Some(outcome)) if outcome.status == "aborted" => {
                            // Its planning was abandoned (a new leader found
                            // it planning, or readiness was lost under
                            // `abort`): that run is over, and the same plan
                            // is asked again as a new run, within the same
                            // timeout.
                            self.printer.print_told(outcome.event);
                            let _ = requests.forget(&run).await;
                            run = new_run()?;
                            session = requests
                                .ask_of(Some(config.pool.id()), &run, required, config.run.unguarded_after)
                                .await
                                .map_err(failed)?;
                        }
                        Ok(Some(outcome)) if outcome.status == "refused" => {
                            eprintln!("poolgate run: run {run} refused by the leader: {}", outcome.reason.unwrap_or_default());
                            return Ok(Err(2));
                        }
                        Ok(Some(outcome)) => {
                            // Committed and over while this process was away
                            // (paused, cut off): faulted is 3; ended by the
                            // leader (its requester counted as gone) is not a
                            // fault: the command never ran guarded.
                            let faulted = outcome.status == "faulted";
                            if !faulted {
                                eprintln!("poolgate run: run {run} was {} by the leader before this process saw it committed ({}): its command was not started", outcome.status, outcome.reason.clone().unwrap_or_default());
                            }
                            self.printer.print_told(outcome.event);
                            let _ = requests.forget(&run).await;
                            return Ok(Err(if faulted { 3 } else { EXIT_UNGUARDED }));
                        }
                        Ok(None) if session.is_lost() => {
                            // The request went with the session: nobody will
                            // commit it.
                            eprintln!("poolgate run: run {run}: this process's etcd session expired before the run was committed (the request went with it): its command was not started");
                            let _ = requests.withdraw(&run).await;
                            return Ok(Err(EXIT_UNGUARDED));
                        }
                        Ok(None) => {}
                        // etcd away for a moment: asked again.
                        Err(e) => {
                            if let Some(held) = said.allow(std::time::Instant::now()) {
                                tracing::warn!(%run, error = %e, held, "what became of the run: not read (tried again)");
                            }
                        }
                    }
                }
                _ = &mut limit => {
                    let _ = requests.withdraw(&run).await;
                    drop(session);
                    let within = crate::config::in_words(request.timeout.unwrap_or_default());
                    match requests.active_run().await {
                        Ok(Some(other)) if other != run => eprintln!(
                            "poolgate: run {run} was not committed within {within}: run {other} is active (end it with poolgate run --end {other})"
                        ),
                        _ => match requests.leader_said().await {
                            // What blocks the pool, as the leader said it.
                            Some(said) if said["state"].is_string() => eprintln!(
                                "poolgate: run {run} was not committed within {within}: {} (the leader said so {} s ago)",
                                said["state"].as_str().unwrap_or_default(),
                                said["age_ms"].as_u64().unwrap_or(0) / 1000
                            ),
                            _ => eprintln!("poolgate: run {run} was not committed within {within} (no replica led, or none said what blocks the pool)"),
                        },
                    }
                    return Ok(Err(1));
                }
                signal = &mut stop => {
                    let _ = requests.withdraw(&run).await;
                    return Ok(Err(128 + signal));
                }
            }
        }
        self.session = Some(session);
        // Read `committed`, but the run may have ended since (this process
        // was paused): the command starts only on a run the state still
        // holds.
        if let Ok(
            crate::live::requests::RunStanding::NotHeld
            | crate::live::requests::RunStanding::Ended(_),
        ) = requests.standing(&run).await
        {
            let code = match told_end(&requests, &run).await {
                Some(outcome) if outcome.status == "faulted" => {
                    self.printer.print_told(outcome.event);
                    3
                }
                outcome => {
                    eprintln!("poolgate run: run {run} ended before its command started ({}): the command was not started", outcome.and_then(|o| o.reason).unwrap_or_else(|| "no longer held by the stored state".into()));
                    EXIT_UNGUARDED
                }
            };
            let _ = requests.forget(&run).await;
            return Ok(Err(code));
        }
        // Fail closed (docs/failover.md §3): the command runs only while
        // this process can confirm that its run is guarded.
        self.confirmed = tokio::time::Instant::now();
        Ok(Ok(run))
    }

    async fn guard(&mut self, run: &RunId) -> Result<Option<Ended>, LiveError> {
        use crate::live::requests::RunStanding;
        tokio::time::sleep(crate::live::requests::LOOK_EVERY).await;
        let requests = &self.requests;
        match requests.standing(run).await {
            Ok(RunStanding::Guarded) => self.confirmed = tokio::time::Instant::now(),
            Ok(RunStanding::Ended(outcome)) => {
                let code = if outcome.status == "faulted" {
                    3
                } else {
                    EXIT_UNGUARDED
                };
                if code == EXIT_UNGUARDED {
                    eprintln!(
                        "poolgate run: run {run} was {} by the leader ({}): its command is stopped",
                        outcome.status,
                        outcome.reason.clone().unwrap_or_default()
                    );
                }
                self.printer.print_told(outcome.event);
                let _ = requests.forget(run).await;
                return Ok(Some(Ended::Told(code)));
            }
            Ok(RunStanding::NotHeld) => {
                // Ended, its outcome not written yet: the command stops
                // now, and the outcome is read if it comes.
                return Ok(Some(Ended::Untold));
            }
            Ok(RunStanding::Unled) | Err(_) => {}
        }
        let unconfirmed = self.confirmed.elapsed();
        let lost = self.session.as_ref().is_some_and(|s| s.is_lost());
        // The session at risk: it may expire a third of its TTL from now,
        // and the leader then end the run (and commit another on its
        // nodes): the command goes first.
        let at_risk = self.session.as_ref().and_then(|s| s.at_risk());
        if lost || at_risk.is_some() || unconfirmed > self.unguarded_after {
            let why = if lost {
                "its etcd session expired".to_string()
            } else if let Some(unrenewed) = at_risk {
                format!(
                    "its etcd session not renewed for {} (etcd out of its reach): it may expire, and the leader end the run",
                    crate::config::in_words(unrenewed)
                )
            } else {
                format!(
                    "not confirmed guarded for {} (no replica leads, or etcd is out of reach)",
                    crate::config::in_words(unconfirmed)
                )
            };
            eprintln!("poolgate run: run {run}: {why}; its command is stopped ([run] unguarded_after = {})", crate::config::in_words(self.unguarded_after));
            return Ok(Some(Ended::Told(EXIT_UNGUARDED)));
        }
        Ok(None)
    }

    async fn told(&mut self, run: &RunId) -> i32 {
        let code = match told_end(&self.requests, run).await {
            Some(outcome) if outcome.status == "faulted" => {
                self.printer.print_told(outcome.event);
                3
            }
            _ => {
                eprintln!("poolgate run: run {run} is no longer held by the stored state (it ended, its outcome unwritten): its command is stopped");
                EXIT_UNGUARDED
            }
        };
        let _ = self.requests.forget(run).await;
        code
    }

    /// Asks the leader to end `run` until the ask is written (an etcd
    /// blip), for up to [`END_WAIT`] (a run whose end is never asked stays
    /// guarded), then tells its end once the leader wrote it (bounded: a
    /// leaderless moment leaves the end to the next leader, which reads
    /// the same key).
    async fn end(&mut self, run: &RunId) {
        let requests = &self.requests;
        let deadline = tokio::time::Instant::now() + END_WAIT;
        loop {
            match requests.finish(run).await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(%run, error = %e, "the end of the run not asked of the leader: it stays guarded; end it with poolgate run --end {run}");
                    return;
                }
                Err(_) => tokio::time::sleep(crate::live::requests::LOOK_EVERY).await,
            }
        }
        let deadline = tokio::time::Instant::now() + END_WAIT;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(outcome)) = requests.outcome(run).await {
                if outcome.status != "committed" {
                    self.printer.print_told(outcome.event);
                    break;
                }
            }
            tokio::time::sleep(crate::live::requests::LOOK_EVERY).await;
        }
        let _ = requests.forget(run).await;
    }
}
