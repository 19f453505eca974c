//! `poolgate watch` and `poolgate run`: the orchestrator's side on the
//! command line (SPEC §7).
//!
//! Both start an [`Orchestrator`] and print the gate's events: one JSON
//! object per line (`--json`, the replay format), the explain view
//! (`--explain`, watch only), or readable lines.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::{EventStream, Gate, GateError};
use tokio::signal::unix::{signal, SignalKind};

use super::{LiveError, Orchestrator};
use crate::config::Config;
use crate::replay::explain::Explainer;
use crate::replay::{render, ReplayEvent};

/// How events are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// One JSON object per line (the replay format).
    Json,
    /// Readable lines, and the pool's state and blockers when they change.
    Explain,
    /// Readable lines.
    Human,
}

/// How `watch` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The pool became ready (with `--until-ready`).
    Ready,
    /// `--timeout` passed first.
    TimedOut,
    /// SIGINT or SIGTERM.
    Stopped,
}

/// A recording into a new file at `path` (`--record`).
pub fn recording(path: Option<&Path>) -> Result<Option<poolgate_actors::Recording>, LiveError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let file = std::fs::File::create(path)
        .map_err(|e| LiveError::Io(std::io::Error::other(format!("{}: {e}", path.display()))))?;
    Ok(Some(poolgate_actors::Recording::new(Box::new(
        std::io::BufWriter::new(file),
    ))))
}

/// Serves the Prometheus text format of every metric on `addr`.
pub fn serve_metrics(addr: SocketAddr) -> Result<(), LiveError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| LiveError::Bind {
            socket: "metrics (HTTP)",
            addr,
            source: std::io::Error::other(e.to_string()),
        })
}

struct Printer {
    output: Output,
    explainer: Explainer,
}

impl Printer {
    fn new(output: Output) -> Self {
        Printer {
            output,
            explainer: Explainer::default(),
        }
    }

    async fn print(&mut self, gate: &Gate, event: Event) {
        let at = event.at();
        self.explainer.saw(&event);
        let event = ReplayEvent::Gate(event);
        match self.output {
            Output::Json => println!("{}", render::json_line(&event)),
            Output::Human => println!("{}", render::human_line(&event)),
            Output::Explain => {
                println!("{}", render::human_line(&event));
                self.state(gate, at).await;
            }
        }
    }

    async fn state(&mut self, gate: &Gate, at: poolgate_actors::core::Time) {
        if let Ok(report) = gate.report().await {
            if let Some(line) = self.explainer.after_input(at, &report) {
                println!("{}", render::timed(at, &format!("· {line}")));
            }
        }
    }
}

/// `poolgate watch`: prints events until SIGINT/SIGTERM, until the pool is
/// ready (`until_ready`), or until `timeout`.
pub async fn watch(
    config: &Config,
    path: &Path,
    output: Output,
    until_ready: bool,
    timeout: Option<Duration>,
    record: Option<&Path>,
) -> Result<WatchEnd, LiveError> {
    warn_without_state(config);
    let live = Orchestrator::start_recording(config, recording(record)?).await?;
    let mut events = live.gate.subscribe();
    let mut printer = Printer::new(output);
    if output == Output::Explain {
        printer.state(&live.gate, live.gate.clock().now()).await;
    }
    let stop = stop_signal()?;
    tokio::pin!(stop);
    let limit = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(limit);
    let mut hangup = signal(SignalKind::hangup())?;
    let mut refresh = tokio::time::interval(EXPLAIN_EVERY);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = hangup.recv() => reload_keys(&live, path),
            event = events.recv() => {
                let Some(event) = event else { return Err(GateError::Stopped.into()) };
                let ready = matches!(event, Event::PoolReady { .. });
                printer.print(&live.gate, event).await;
                if ready && until_ready {
                    return Ok(WatchEnd::Ready);
                }
            }
            _ = refresh.tick(), if output == Output::Explain => {
                // Blockers and the window's countdown change without an
                // event (a node announces, SWIM hears it): shown as they do.
                printer.state(&live.gate, live.gate.clock().now()).await;
            }
            _ = &mut limit => {
                if until_ready {
                    not_ready_within(&live.gate, timeout).await;
                }
                return Ok(WatchEnd::TimedOut);
            }
            _ = &mut stop => return Ok(WatchEnd::Stopped),
        }
    }
}

/// Says at start that without `[state] path` nothing survives a restart:
/// the next process issues epoch 1 again and guards no run.
fn warn_without_state(config: &Config) {
    if config.state.path.is_none() {
        tracing::warn!("no [state] path: epochs and the active run are kept in memory only; after a restart epochs start again at 1 and a committed run is no longer guarded");
    }
}

/// How often `watch --explain` looks at the pool between events.
pub const EXPLAIN_EVERY: Duration = Duration::from_millis(250);

/// Says on stderr that the pool was not ready in time, and what blocks it.
async fn not_ready_within(gate: &Gate, timeout: Option<Duration>) {
    let within = timeout
        .map(|t| humantime::format_duration(t).to_string())
        .unwrap_or_default();
    match gate.report().await {
        Ok(report) => eprintln!(
            "poolgate: not ready within {within}: {}",
            crate::replay::explain::state_line(&report)
        ),
        Err(_) => eprintln!("poolgate: not ready within {within}"),
    }
}

/// `poolgate run`: waits for `PoolReady`, plans and commits over `require`
/// (every member when `None`), runs `command` and guards it. Returns the
/// exit code: the command's own, or 3 when the run faulted (the command is
/// sent SIGTERM, then SIGKILL after 5 s).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    config: &Config,
    path: &Path,
    require: Option<Vec<NodeId>>,
    output: Output,
    command: &[String],
    record: Option<&Path>,
    timeout: Option<Duration>,
) -> Result<i32, LiveError> {
    let Some((program, args)) = command.split_first() else {
        return Err(LiveError::Io(std::io::Error::other(
            "no COMMAND given after --",
        )));
    };
    warn_without_state(config);
    let live = Orchestrator::start_recording(config, recording(record)?).await?;
    let gate = live.gate.clone();
    let mut events = gate.subscribe();
    let mut printer = Printer::new(output);
    let required = require.unwrap_or_else(|| config.pool.members().to_vec());
    let run = RunId::new(&format!("run-{}", std::process::id())).map_err(GateError::from)?;
    let stop = stop_signal()?;
    tokio::pin!(stop);

    if let Some(stranger) = required.iter().find(|n| !config.pool.members().contains(n)) {
        return Err(
            GateError::Refused(poolgate_actors::core::Refusal::NotCandidate(
                stranger.clone(),
            ))
            .into(),
        );
    }
    // Plan and commit on a ready pool; readiness lost on the way means
    // waiting for the next PoolReady (the planning run is suspended, or
    // aborted and begun again, by the configured policy).
    let mut planning = false;
    let limit = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(limit);
    loop {
        let proof = tokio::select! {
            proof = wait_ready(&gate, &mut events, &mut printer) => proof?,
            _ = &mut stop => return Ok(130),
            _ = &mut limit => {
                not_ready_within(&gate, timeout).await;
                return Ok(1);
            }
        };
        if !planning {
            match gate.begin_planning(run.clone(), Some(proof)).await {
                Ok(_) => planning = true,
                Err(GateError::Refused(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        match gate
            .commit_plan(run.clone(), required.clone(), Some(proof))
            .await
        {
            Ok(()) => break,
            Err(GateError::Refused(poolgate_actors::core::Refusal::UnknownRun(_))) => {
                planning = false;
            }
            Err(GateError::Refused(refused)) => {
                tracing::info!(%refused, "commit refused; waiting for readiness again");
            }
            Err(e) => return Err(e.into()),
        }
    }
    drain(&gate, &mut events, &mut printer).await;

    let mut hangup = signal(SignalKind::hangup())?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LiveError::Io(std::io::Error::other(format!("{program}: {e}"))))?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                drain(&gate, &mut events, &mut printer).await;
                gate.finish_run(run.clone()).await?;
                drain(&gate, &mut events, &mut printer).await;
                return Ok(exit_code(status));
            }
            event = events.recv() => {
                let Some(event) = event else { return Err(GateError::Stopped.into()) };
                let faulted = matches!(&event, Event::RunFaulted { run: r, .. } if *r == run);
                printer.print(&gate, event).await;
                if faulted {
                    stop_child(&mut child).await;
                    return Ok(3);
                }
            }
            _ = &mut stop => {
                stop_child(&mut child).await;
                return Ok(130);
            }
            _ = hangup.recv() => reload_keys(&live, path),
        }
    }
}

/// SIGHUP: the cluster keys of `[swim]`, read again from the config file
/// (key rotation).
fn reload_keys(live: &Orchestrator, path: &Path) {
    let reloaded = Config::load(path)
        .map_err(LiveError::from)
        .and_then(|config| live.reload_cluster_keys(&config.swim));
    match reloaded {
        Ok(()) => tracing::info!("cluster keys read again"),
        Err(e) => tracing::warn!(error = %e, "cluster keys not read again; keeping the old ones"),
    }
}

async fn wait_ready(
    gate: &Gate,
    events: &mut EventStream,
    printer: &mut Printer,
) -> Result<poolgate_actors::core::Epoch, LiveError> {
    if let poolgate_actors::core::PoolPhase::Ready { epoch } = gate.report().await?.phase {
        return Ok(epoch);
    }
    while let Some(event) = events.recv().await {
        let epoch = match &event {
            Event::PoolReady { epoch, .. } => Some(*epoch),
            _ => None,
        };
        printer.print(gate, event).await;
        if let Some(epoch) = epoch {
            return Ok(epoch);
        }
    }
    Err(GateError::Stopped.into())
}

async fn drain(gate: &Gate, events: &mut EventStream, printer: &mut Printer) {
    while let Ok(event) = events.try_recv() {
        printer.print(gate, event).await;
    }
}

/// SIGTERM, then SIGKILL after 5 s.
async fn stop_child(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Resolves at the first SIGINT or SIGTERM.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, LiveError> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
