//! `poolgate watch` and `poolgate run`: the orchestrator's side on the
//! command line (design §7).
//!
//! Both start an [`Orchestrator`] and print the gate's events: one JSON
//! object per line (`--json`, the replay format), the explain view
//! (`--explain`, watch only), or readable lines.

use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::{EventStream, Gate, GateError};
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::live::{LiveError, Orchestrator};
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

pub(super) struct Printer {
    output: Output,
    explainer: Explainer,
    out: Stdout,
}

impl Printer {
    pub(super) fn new(output: Output) -> Self {
        Printer {
            output,
            explainer: Explainer::default(),
            out: Stdout::start(),
        }
    }

    pub(super) async fn print(&mut self, gate: &Gate, event: Event) {
        let at = event.at();
        self.explainer.saw(&event);
        let event = ReplayEvent::Gate(event);
        match self.output {
            Output::Json => self.out.line(render::json_line(&event)),
            Output::Human => self.out.line(render::human_line(&event)),
            Output::Explain => {
                self.out.line(render::human_line(&event));
                self.state(gate, at).await;
            }
        }
    }

    /// An event another process published (the leader, through etcd);
    /// `--explain` prints it as `human` does.
    pub(super) fn print_told(&mut self, event: Option<Event>) {
        let Some(event) = event else { return };
        let event = ReplayEvent::Gate(event);
        match self.output {
            Output::Json => self.out.line(render::json_line(&event)),
            Output::Human | Output::Explain => self.out.line(render::human_line(&event)),
        }
    }

    async fn state(&mut self, gate: &Gate, at: poolgate_actors::core::Time) {
        if let Ok(report) = gate.report().await {
            if let Some(line) = self.explainer.after_input(at, &report) {
                self.out.line(render::timed(at, &format!("· {line}")));
            }
        }
    }
}

/// How many lines may wait for a slow stdout.
pub const STDOUT_QUEUE: usize = 65_536;

/// How long a process about to exit waits for stdout to take its last
/// lines.
const STDOUT_LAST: Duration = Duration::from_secs(1);

/// stdout on a thread of its own: a reader that stops reading (a stuck
/// log pipe, `| less`, a terminal paused with Ctrl-S) blocks that thread,
/// never the guard's (faults are still acted on at once), and a closed
/// stdout (`| head -1`) is no reason to panic nor to stop the command.
/// Lines beyond [`STDOUT_QUEUE`] waiting are dropped and counted.
struct Stdout {
    lines: Option<std::sync::mpsc::SyncSender<String>>,
    done: std::sync::mpsc::Receiver<()>,
    dropped: u64,
}

impl Stdout {
    fn start() -> Self {
        let (lines, queued) = std::sync::mpsc::sync_channel::<String>(STDOUT_QUEUE);
        let (finished, done) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("stdout".into())
            .spawn(move || {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                let mut open = true;
                for line in queued {
                    // Closed: the rest is read by nobody; keep draining.
                    open = open
                        && writeln!(stdout, "{line}")
                            .and_then(|()| stdout.flush())
                            .is_ok();
                }
                let _ = finished.send(());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no stdout thread: events are not printed");
        }
        Stdout {
            lines: Some(lines),
            done,
            dropped: 0,
        }
    }

    fn line(&mut self, line: String) {
        let Some(lines) = &self.lines else { return };
        if lines.try_send(line).is_err() {
            if self.dropped == 0 {
                tracing::warn!(
                    queue = STDOUT_QUEUE,
                    "stdout is not read: event lines are dropped until it is"
                );
            }
            self.dropped += 1;
        }
    }
}

impl Drop for Stdout {
    fn drop(&mut self) {
        // The last lines out before the process exits, unless stdout is
        // stuck.
        self.lines = None;
        let _ = self.done.recv_timeout(STDOUT_LAST);
    }
}

/// `poolgate watch`: prints events until SIGINT/SIGTERM, until the pool is
/// ready (`until_ready`), or until `timeout`. One path for one orchestrator
/// and for replicas: a lone orchestrator is a replica that always leads
/// (see `Leadership`).
pub async fn watch(
    config: &Config,
    path: &Path,
    output: Output,
    until_ready: bool,
    timeout: Option<Duration>,
    record: Option<&Path>,
) -> Result<WatchEnd, LiveError> {
    let stop = stop_signal()?;
    tokio::pin!(stop);
    let limit = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(limit);
    let watching = Watching {
        path,
        output,
        until_ready,
        timeout,
    };
    // `[control] socket`: bound before anything starts (another
    // orchestrator serving it is an error to say at once).
    let mut control = match &config.control {
        Some(path) => Some(crate::live::control::bind(path).await?),
        None => None,
    };
    let mut leadership = Leadership::of(config).await?;
    // SIGHUP reloads a follower's warm member's keys too: a rotation
    // missed there would leave the next term's SWIM deaf.
    let _reloading = match &leadership {
        Leadership::Replica(replica) => Some(reload_on_hangup(
            replica.swim_keys(),
            path,
            signal(SignalKind::hangup())?,
        )),
        Leadership::Alone { .. } => None,
    };
    loop {
        // Alone, the orchestrator starts at once, whatever the limit: a
        // socket held is an error to say (its bind is retried for 2 s).
        let live = if !leadership.can_lose() {
            leadership.lead(record).await?
        } else {
            tokio::select! {
                live = leadership.lead(record) => live?,
                _ = &mut stop => {
                    leadership.resign();
                    return Ok(WatchEnd::Stopped);
                }
                _ = &mut limit => {
                    if watching.until_ready {
                        eprintln!("poolgate: not ready within {}: this replica follows, and only the leader sees readiness (leader: {}; ask it with poolgate status)", crate::config::in_words(watching.timeout.unwrap_or_default()), leadership.leader());
                    }
                    leadership.resign();
                    return Ok(WatchEnd::TimedOut);
                }
            }
        };
        let mut live = live;
        if let Some(bound) = control.take() {
            let leader: std::sync::Arc<str> =
                std::sync::Arc::from(crate::live::orchestrator::LEADER);
            live.attach(actix::spawn(crate::live::control::serve(
                bound,
                live.fleet.clone(),
                leader,
            )));
        }
        let lost = {
            let fence_check = &leadership;
            async move { fence_check.lost().await }
        };
        let watched = watching
            .events(&live, limit.as_mut(), stop.as_mut(), lost)
            .await;
        live.stop().await;
        match watched {
            Ok(Watched::Lost) if leadership.can_lose() => {
                // Said once the orchestrator has stopped: acting ended
                // before this line's timestamp.
                tracing::warn!(
                    replica = %leadership.name(),
                    "this replica stopped leading; following the new leader"
                );
            }
            Ok(Watched::Lost) => {
                leadership.resign();
                return Err(GateError::Stopped.into());
            }
            Ok(Watched::End(end)) => {
                leadership.resign();
                return Ok(end);
            }
            Err(e) => {
                leadership.resign();
                return Err(e);
            }
        }
    }
}

/// Who acts for the pool: this process alone (it always leads, from the
/// start, for one term), or one of several replicas on etcd (it leads
/// when it wins the lease, and follows again when it loses it).
pub(super) enum Leadership<'a> {
    Alone { config: &'a Config, led: bool },
    Replica(Box<crate::live::replica::Replica>),
}

impl<'a> Leadership<'a> {
    /// Among replicas when `[state] etcd` is set (the replica warmed up:
    /// a SWIM member that follows), alone otherwise.
    async fn of(config: &'a Config) -> Result<Leadership<'a>, LiveError> {
        if config.state.etcd.is_empty() {
            warn_without_state(config);
            return Ok(Leadership::Alone { config, led: false });
        }
        let mut replica = crate::live::replica::Replica::start(config)?;
        replica.warm_up().await?;
        // Following until it leads (the gate's gauges set it to 1 then).
        metrics::gauge!("poolgate_leading").set(0.0);
        Ok(Leadership::Replica(Box::new(replica)))
    }

    /// Waits until this process leads, and starts its orchestrator. Alone,
    /// at once, and only once: its one term ends with the process.
    /// Each term records into `record` (the first), `record.n` after.
    pub(super) async fn lead(&mut self, record: Option<&Path>) -> Result<Orchestrator, LiveError> {
        let term = self.terms() + 1;
        let file = record.map(|path| term_record_path(path, term));
        let recording = recording(file.as_deref())?;
        match self {
            Leadership::Alone { led: true, .. } => std::future::pending().await,
            Leadership::Alone { config, led } => {
                *led = true;
                Orchestrator::start_recording(config, recording).await
            }
            Leadership::Replica(replica) => {
                let live = replica.lead(recording).await?;
                tracing::warn!(replica = %replica.me().replica, term = replica.terms(), "this replica leads");
                Ok(live)
            }
        }
    }

    /// Completes when this process stops leading: never, alone.
    pub(super) async fn lost(&self) {
        match self {
            Leadership::Alone { .. } => std::future::pending().await,
            Leadership::Replica(replica) => replica.lost().await,
        }
    }

    /// Whether leadership can be lost (and led again): among replicas.
    fn can_lose(&self) -> bool {
        matches!(self, Leadership::Replica(_))
    }

    /// The terms led so far.
    fn terms(&self) -> u64 {
        match self {
            Leadership::Alone { led, .. } => u64::from(*led),
            Leadership::Replica(replica) => replica.terms(),
        }
    }

    /// Gives leadership up (the lease revoked: another replica leads at
    /// once); nothing to give up alone.
    fn resign(self) {
        if let Leadership::Replica(replica) = self {
            (*replica).resign();
        }
    }

    /// This replica's name, for the log.
    pub(super) fn name(&self) -> String {
        match self {
            Leadership::Alone { .. } => "this orchestrator".to_string(),
            Leadership::Replica(replica) => replica.me().replica.to_string(),
        }
    }

    /// Who leads now, as far as this process knows.
    fn leader(&self) -> String {
        match self {
            Leadership::Alone { .. } => "this orchestrator".to_string(),
            Leadership::Replica(replica) => match &*replica.role().borrow() {
                crate::live::replica::Role::Following(Some(l)) => l.to_string(),
                _ => "none right now".to_string(),
            },
        }
    }
}

/// What `watch` was asked for.
struct Watching<'a> {
    path: &'a Path,
    output: Output,
    until_ready: bool,
    timeout: Option<Duration>,
}

/// How following one orchestrator's events ended.
enum Watched {
    End(WatchEnd),
    /// The replica stopped leading.
    Lost,
}

impl Watching<'_> {
    /// Prints `live`'s events until the pool is ready (`--until-ready`),
    /// the time is up, a signal, or `lost` (a replica's term ended).
    async fn events(
        &self,
        live: &Orchestrator,
        mut limit: std::pin::Pin<&mut tokio::time::Sleep>,
        mut stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
        lost: impl std::future::Future<Output = ()>,
    ) -> Result<Watched, LiveError> {
        tokio::pin!(lost);
        let mut events = live.fleet.subscribe();
        // `--until-ready`: every pool ready (once each).
        let mut unready: std::collections::BTreeSet<_> = live.fleet.pools().into_iter().collect();
        let mut printer = Printer::new(self.output);
        if self.output == Output::Explain {
            printer.state(&live.gate, live.gate.clock().now()).await;
        }
        let mut hangup = signal(SignalKind::hangup())?;
        let mut refresh = tokio::time::interval(EXPLAIN_EVERY);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = hangup.recv() => reload(live, self.path).await,
                event = events.recv() => {
                    let Some(event) = event else {
                        if live.gate.is_stopped() {
                            return Ok(Watched::Lost);
                        }
                        return Err(GateError::Stopped.into());
                    };
                    if matches!(event, Event::PoolReady { .. }) {
                        unready.remove(event.pool());
                    }
                    let gate = live.fleet.pool(event.pool()).unwrap_or_else(|| live.gate.clone());
                    printer.print(&gate, event).await;
                    if unready.is_empty() && self.until_ready {
                        return Ok(Watched::End(WatchEnd::Ready));
                    }
                }
                _ = refresh.tick(), if self.output == Output::Explain => {
                    // Blockers and the window's countdown change without an
                    // event (a node announces, SWIM hears it): shown as they do.
                    printer.state(&live.gate, live.gate.clock().now()).await;
                }
                _ = &mut limit => {
                    if self.until_ready {
                        for pool in &unready {
                            if let Some(gate) = live.fleet.pool(pool) {
                                not_ready_within(&gate, self.timeout).await;
                            }
                        }
                    }
                    return Ok(Watched::End(WatchEnd::TimedOut));
                }
                _ = &mut stop => return Ok(Watched::End(WatchEnd::Stopped)),
                _ = &mut lost => return Ok(Watched::Lost),
            }
        }
    }
}

/// Where a replica records its `term`-th term (design §12): `FILE` for the
/// first, `FILE.n` after.
pub(super) fn term_record_path(path: &Path, term: u64) -> std::path::PathBuf {
    match term {
        1 => path.to_path_buf(),
        n => std::path::PathBuf::from(format!("{}.{n}", path.display())),
    }
}

/// Says at start that without `[state] path` nothing survives a restart:
/// the next process issues epoch 1 again and guards no run.
pub(super) fn warn_without_state(config: &Config) {
    if config.state.path.is_none() {
        tracing::warn!("no [state] path: epochs and the active run are kept in memory only; after a restart epochs start again at 1 and a committed run is no longer guarded");
    }
}

/// How often `watch --explain` looks at the pool between events.
pub const EXPLAIN_EVERY: Duration = Duration::from_millis(250);

/// Says on stderr that the pool was not ready in time, and what blocks it.
async fn not_ready_within(gate: &Gate, timeout: Option<Duration>) {
    let within = timeout
        .map(|t| crate::config::in_words(t).to_string())
        .unwrap_or_default();
    match gate.report().await {
        Ok(report) => eprintln!(
            "poolgate: not ready within {within}: {}",
            crate::replay::explain::state_line(&report)
        ),
        Err(_) => eprintln!("poolgate: not ready within {within}"),
    }
}

/// `poolgate run`'s exit code when another run, restored from the state
/// file, is active: it must be resumed (`--resume`) or ended (`--end`).
pub const EXIT_OTHER_RUN: i32 = 4;

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
pub(super) fn sockets_free(config: &Config) -> bool {
    let agents = config.agents.listen;
    let swim = config.swim.bind;
    let taken = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
    let tcp = agents.port() == 0 || !std::net::TcpListener::bind(agents).is_err_and(|e| taken(&e));
    let udp = swim.port() == 0 || !std::net::UdpSocket::bind(swim).is_err_and(|e| taken(&e));
    tcp && udp
}

/// Stops the guarded command's whole group; says so when some of it could
/// not be stopped (never that it was).
pub(super) async fn stop_command(child: &mut super::guard::Guarded) {
    if let Err(left) = child.stop().await {
        tracing::error!(error = %left, "the command was not stopped");
        eprintln!("poolgate run: {left}: the command was NOT stopped");
    }
}

/// `poolgate run`'s exit code when it stopped its command because it could
/// not confirm that the run was still guarded (docs/failover.md §3).
pub const EXIT_UNGUARDED: i32 = 5;

/// What became of `run`, read for up to a second (the leader writes it
/// right after the state that ended it).
pub(super) async fn told_end(
    requests: &crate::live::requests::Requests,
    run: &RunId,
) -> Option<crate::live::requests::Outcome> {
    for _ in 0..10 {
        if let Ok(Some(outcome)) = requests.outcome(run).await {
            if outcome.status != "committed" {
                return Some(outcome);
            }
        }
        tokio::time::sleep(crate::live::requests::LOOK_EVERY).await;
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
    let requests = crate::live::replica::requests_of(config)?;
    // A run whose requester is gone has no outcome to read: what is
    // stored says whether it ended.
    let active = |requests: crate::live::requests::Requests| async move {
        requests.active_run().await.map_err(failed)
    };
    let was_active = active(requests.clone()).await?.as_ref() == Some(run);
    requests.finish(run).await.map_err(failed)?;
    let deadline = tokio::time::Instant::now() + END_WAIT;
    let mut taken = false;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(crate::live::requests::LOOK_EVERY).await;
        let outcome = requests.outcome(run).await.map_err(failed)?;
        // Finished on this request, or ended already by the leader (its
        // requester gone for good).
        let finished = outcome
            .as_ref()
            .is_some_and(|o| o.status == "finished" || o.status == "ended");
        if finished || (was_active && active(requests.clone()).await?.as_ref() != Some(run)) {
            eprintln!("poolgate run: run {run} ended");
            return Ok(0);
        }
        taken = !requests.finish_pending(run).await.map_err(failed)?;
        if taken && !was_active {
            break;
        }
    }
    if taken {
        eprintln!("poolgate run: --end {run}: not the active run of the leader");
        return Ok(EXIT_OTHER_RUN);
    }
    eprintln!("poolgate run: --end {run}: no leader took it up within {END_WAIT:?} (asked; the next leader will)");
    Ok(1)
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

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
pub(super) async fn plan_and_commit(
    gate: &Gate,
    events: &mut EventStream,
    printer: &mut Printer,
    run: &mut RunId,
    required: &[NodeId],
    timeout: Option<Duration>,
) -> Result<Result<(), i32>, LiveError> {
    use poolgate_actors::core::Refusal;
    let limit = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(limit);
    let mut planning = false;
    let (first, mut attempt) = (run.clone(), 1);
    loop {
        let proof = tokio::select! {
            proof = wait_ready(gate, events, printer) => proof?,
            _ = &mut limit => {
                not_ready_within(gate, timeout).await;
                return Ok(Err(1));
            }
        };
        let refused = if planning {
            None
        } else {
            match gate.begin_planning(run.clone(), Some(proof)).await {
                Ok(_) => {
                    planning = true;
                    None
                }
                Err(GateError::Refused(
                    Refusal::RunInProgress(other) | Refusal::RunCommitted(other),
                )) if other != *run => {
                    in_the_way(&other);
                    return Ok(Err(EXIT_OTHER_RUN));
                }
                Err(e) if retried(&e) => Some(e),
                Err(e) => return Err(e.into()),
            }
        };
        let refused = match refused {
            Some(refused) => Some(refused),
            None => match gate
                .commit_plan(run.clone(), required.to_vec(), Some(proof))
                .await
            {
                Ok(()) => return Ok(Ok(())),
                Err(GateError::Refused(Refusal::UnknownRun(_))) => {
                    // Aborted by the policy: that run is over (a run
                    // ends once), and the plan is planned again at once
                    // as a new run.
                    attempt += 1;
                    *run = RunId::new(&format!("{first}-{attempt}")).map_err(GateError::from)?;
                    planning = false;
                    continue;
                }
                Err(e) if retried(&e) => Some(e),
                Err(e) => return Err(e.into()),
            },
        };
        if let Some(refused) = refused {
            tracing::warn!(%refused, "refused; asking again in {RETRY_AFTER_REFUSAL:?} or at the next PoolReady");
            tokio::select! {
                _ = tokio::time::sleep(RETRY_AFTER_REFUSAL) => {}
                _ = &mut limit => {
                    not_ready_within(gate, timeout).await;
                    return Ok(Err(1));
                }
            }
        }
    }
}

/// Whether `run` asks again after this answer: a refusal by the pool's
/// rules (not ready, a stale epoch: readiness comes back), or a store
/// that could not write (the write is tried again).
fn retried(error: &GateError) -> bool {
    matches!(error, GateError::Refused(_) | GateError::NotDurable(_))
}

/// Says that `other`, restored from the state file, stands in the way.
pub(super) fn in_the_way(other: &RunId) {
    eprintln!(
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
                eprintln!("poolgate run: run {run} ended");
                Ok(0)
            }
            Ok(Some(why)) => {
                eprintln!("poolgate run: --end {run}: {why}");
                Ok(EXIT_OTHER_RUN)
            }
            Err(e) => Err(LiveError::Io(std::io::Error::other(e))),
        };
    }
    if !config.state.etcd.is_empty() {
        return end_replicated_run(config, run).await;
    }
    let live = Orchestrator::start_recording(config, None).await?;
    match live.gate.finish_run(run.clone()).await {
        Ok(()) => {
            eprintln!("poolgate run: run {run} ended");
            Ok(0)
        }
        Err(GateError::Refused(refused)) => {
            eprintln!("poolgate run: --end {run}: {refused}");
            Ok(EXIT_OTHER_RUN)
        }
        Err(e) => Err(e.into()),
    }
}

/// Reloads the keys of `keys`' SWIM member from `path` at each SIGHUP
/// (`hangup`), for as long as the returned guard lives; without a member
/// (a replica whose term starts its own) the signal is only taken.
pub(super) fn reload_on_hangup(
    keys: Option<crate::live::orchestrator::SwimKeys>,
    path: &Path,
    mut hangup: tokio::signal::unix::Signal,
) -> AbortOnDrop {
    let path = path.to_path_buf();
    AbortOnDrop(actix::spawn(async move {
        while hangup.recv().await.is_some() {
            match &keys {
                Some(keys) => reload_keys(|swim| keys.reload(swim), &path),
                None => tracing::warn!("SIGHUP: this replica runs no SWIM member between terms; its next term reads the keys it started with"),
            }
        }
    }))
}

/// SIGHUP: the cluster keys of `[swim]`, read again from the config file
/// (key rotation).
/// SIGHUP on an orchestrator: `path` read again, and what changed in its
/// registry, pool and cluster keys applied ([`Orchestrator::reload`]),
/// each change said; a file that does not load changes nothing.
pub(super) async fn reload(live: &Orchestrator, path: &Path) {
    let reloaded = match Config::load(path) {
        Ok(config) => live.reload(&config).await,
        Err(e) => Err(LiveError::from(e)),
    };
    match reloaded {
        Ok(changes) if changes.is_empty() => {
            tracing::info!(config = %path.display(), "configuration read again: nothing changed but the cluster keys, read again")
        }
        Ok(changes) => {
            for change in changes {
                tracing::warn!(config = %path.display(), change, "configuration read again");
            }
        }
        Err(e) => {
            tracing::warn!(config = %path.display(), error = %e, "configuration not read again; keeping the running one")
        }
    }
}

pub(super) fn reload_keys(
    reload: impl Fn(&crate::config::SwimConfig) -> Result<(), LiveError>,
    path: &Path,
) {
    let reloaded = Config::load(path)
        .map_err(LiveError::from)
        .and_then(|config| reload(&config.swim));
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

pub(super) async fn drain(gate: &Gate, events: &mut EventStream, printer: &mut Printer) {
    while let Ok(event) = events.try_recv() {
        printer.print(gate, event).await;
    }
}

/// Resolves at the first SIGINT or SIGTERM, with its number.
pub(super) fn stop_signal() -> Result<impl std::future::Future<Output = i32>, LiveError> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => nix::sys::signal::Signal::SIGTERM as i32,
            _ = interrupt.recv() => nix::sys::signal::Signal::SIGINT as i32,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use poolgate_actors::core::{
        AgentReport, Durable, MembershipUpdate, NodeId, OnReadinessLost, PlanningPolicy,
        PoolDefinition, PoolId, RegistryFact, RunId, SwimState,
    };
    use poolgate_actors::{DurableSettings, Gate, GateSettings, StateStore, StoreError};

    use super::*;

    /// A store whose next `failing` writes fail (a disk full, then freed).
    #[derive(Debug, Default)]
    struct Flaky {
        failing: AtomicU32,
        failed: AtomicU32,
    }

    impl StateStore for Flaky {
        fn save(&self, _: &Durable) -> Result<(), StoreError> {
            let fail = self
                .failing
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                self.failed.fetch_add(1, Ordering::SeqCst);
                return Err(StoreError("disk full".into()));
            }
            Ok(())
        }
    }

    #[test]
    fn run_asks_again_when_the_store_could_not_write() {
        // Adversary finding: a store's failure is `GateError::NotDurable`,
        // no longer a `Refusal`; `run` gave up at the first one, before
        // COMMAND started, instead of asking again as the operator guide says.
        actix::System::new().block_on(async {
            let a = NodeId::new("a").unwrap();
            let store = Arc::new(Flaky::default());
            let definition =
                PoolDefinition::new(PoolId::new("p").unwrap(), vec![a.clone()]).unwrap();
            let policy = PlanningPolicy {
                on_readiness_lost: OnReadinessLost::Wait,
                wait_timeout: None,
            };
            let settings = GateSettings::new(definition, Duration::from_millis(20), policy)
                .and_then(|settings| {
                    settings.with_durable(DurableSettings {
                        store: store.clone(),
                        restored: Durable::default(),
                        restore_grace: Duration::from_secs(5),
                    })
                })
                .unwrap();
            let gate = Gate::start(settings);
            let mut events = gate.subscribe();
            gate.registry(RegistryFact::Known { node: a.clone() })
                .await
                .unwrap();
            let alive = MembershipUpdate {
                node: a.clone(),
                state: SwimState::Alive,
                incarnation: 0,
            };
            gate.membership(alive).await.unwrap();
            gate.identity(a.clone(), b"id".to_vec()).await.unwrap();
            gate.agent(AgentReport::Available { node: a.clone() })
                .await
                .unwrap();
            gate.wait_ready().await.unwrap();
            store.failing.store(2, Ordering::SeqCst);
            let mut printer = Printer::new(Output::Json);
            let mut run = RunId::new("r1").unwrap();
            let limit = Some(Duration::from_secs(20));
            let result =
                plan_and_commit(&gate, &mut events, &mut printer, &mut run, &[a], limit).await;
            assert!(matches!(result, Ok(Ok(()))), "{result:?}");
            assert_eq!(store.failed.load(Ordering::SeqCst), 2, "both failures seen");
            assert_eq!(gate.report().await.unwrap().run, Some(run));
        });
    }
}
