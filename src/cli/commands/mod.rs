//! `poolgate watch` and `poolgate run`: the orchestrator's side on the
//! command line (design §7).
//!
//! Both start an [`Orchestrator`] and print the gate's events: one JSON
//! object per line (`--json`, the replay format), the explain view
//! (`--explain`, watch only), or readable lines.
//!
//! - this file: `watch`, one path for one orchestrator and for replicas.
//! - `output.rs`: how events are printed.
//! - `commit.rs`: what `run` does with a pool (plan, commit, end) and its
//!   exit codes.
//! - `published.rs`: `--until-ready` in a process that does not lead,
//!   by what the leading replica publishes.
//! - `signals.rs`: SIGHUP reloads, SIGINT and SIGTERM stop.

use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::Event;
use poolgate_actors::{EventStream, Gate, GateError};
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::live::{LiveError, Orchestrator};

mod commit;
mod output;
mod published;
mod signals;

use commit::not_ready_within;
pub use commit::*;
pub use output::*;
pub(crate) use signals::*;

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
    // A readiness check among replicas waits out etcd's outages (an
    // election, no quorum) within its timeout, rather than fail at its
    // start (an operator's trial: exit 2 on `leader changed`).
    if until_ready && !config.state.etcd.is_empty() {
        let last = std::cell::RefCell::default();
        tokio::select! {
            answered = until_etcd_answers(config, &last) => answered?,
            _ = &mut stop => return Ok(WatchEnd::Stopped),
            _ = &mut limit => {
                let within = crate::config::in_words(timeout.unwrap_or_default());
                crate::say!(warn, "poolgate: not ready within {within}: etcd did not answer: {}", last.borrow());
                return Ok(WatchEnd::TimedOut);
            }
        }
    }
    // Among replicas, beside the replica that holds this host's sockets
    // (a `watch --until-ready` in an operator's script on a replica's
    // host): no campaign, readiness as the leader publishes it.
    if until_ready && !config.state.etcd.is_empty() && !sockets_free(config) {
        tracing::info!(agents = %config.agents.listen, swim = %config.swim.bind, "this watch's sockets are held by another process on this host (a replica?): it does not campaign, it reads what the leading replica publishes");
        let pools = crate::ha::replica::published_of(config)?;
        let last = std::cell::RefCell::default();
        return Ok(tokio::select! {
            ready = published::until_ready(Some(&pools), &last) => {
                published::say_ready(&ready);
                WatchEnd::Ready
            }
            _ = &mut stop => WatchEnd::Stopped,
            _ = &mut limit => {
                published::say_not_ready(&last, timeout.unwrap_or_default(), None);
                WatchEnd::TimedOut
            }
        });
    }
    // `[control] socket`: bound before anything starts (another
    // orchestrator serving it is an error to say at once).
    let mut control = match &config.control {
        Some(path) => Some(crate::live::control::bind(path).await?),
        None => None,
    };
    let mut leadership = Leadership::of(config).await?;
    // A replica that follows sees readiness as the leader publishes it.
    let published = match until_ready && leadership.can_lose() {
        true => Some(crate::ha::replica::published_of(config)?),
        false => None,
    };
    let last_read = std::cell::RefCell::default();
    // systemd (`Type=notify`): a replica is up once it campaigns (its
    // follower answers on its sockets); alone, once its orchestrator starts.
    let mut told_ready = leadership.can_lose();
    if told_ready {
        crate::cli::notify::notify(crate::cli::notify::READY);
    }
    // SIGHUP reloads a follower's warm member's keys too: a rotation
    // missed there would leave the next term's SWIM deaf.
    let _reloading = match &leadership {
        Leadership::Replica(replica) => Some(reload_on_hangup(
            replica.swim_keys(),
            replica.reloads(),
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
                ready = published::until_ready(published.as_deref(), &last_read) => {
                    published::say_ready(&ready);
                    leadership.resign();
                    return Ok(WatchEnd::Ready);
                }
                _ = &mut stop => {
                    leadership.resign();
                    return Ok(WatchEnd::Stopped);
                }
                _ = &mut limit => {
                    if published.is_some() {
                        let within = watching.timeout.unwrap_or_default();
                        published::say_not_ready(&last_read, within, Some(leadership.leader()));
                    }
                    leadership.resign();
                    return Ok(WatchEnd::TimedOut);
                }
            }
        };
        let mut live = live;
        if !told_ready {
            told_ready = true;
            crate::cli::notify::notify(crate::cli::notify::READY);
        }
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
                leadership.say_stopped_leading();
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

/// Completes once etcd answers a read of `config`'s prefix (a bad
/// `[state]` setting: its error at once); `last` keeps why it did not
/// yet, said once as a warning.
async fn until_etcd_answers(
    config: &Config,
    last: &std::cell::RefCell<String>,
) -> Result<(), LiveError> {
    let config = std::sync::Arc::new(config.clone());
    loop {
        let asked = std::sync::Arc::clone(&config);
        let answered =
            tokio::task::spawn_blocking(move || crate::ha::replica::etcd_answers(&asked))
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))??;
        let Err(why) = answered else {
            return Ok(());
        };
        if last.borrow().is_empty() {
            tracing::warn!(error = %why, "etcd does not answer: the readiness check waits for it, until its --timeout");
        }
        *last.borrow_mut() = why;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Who acts for the pool: this process alone (it always leads, from the
/// start, for one term), or one of several replicas on etcd (it leads
/// when it wins the lease, and follows again when it loses it).
pub(super) enum Leadership<'a> {
    Alone { config: &'a Config, led: bool },
    Replica(Box<crate::ha::replica::Replica>),
}

impl<'a> Leadership<'a> {
    /// Among replicas when `[state] etcd` is set (the replica warmed up:
    /// a SWIM member that follows), alone otherwise.
    async fn of(config: &'a Config) -> Result<Leadership<'a>, LiveError> {
        if config.state.etcd.is_empty() {
            warn_without_state(config);
            return Ok(Leadership::Alone { config, led: false });
        }
        let mut replica = crate::ha::replica::Replica::start(config)?;
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
                tracing::warn!(replica = %replica.me().replica, terms_led = replica.terms(), "this replica leads");
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

    /// Says, once its orchestrator has stopped (acting ended before the
    /// line's timestamp), that this replica stopped leading (the campaign
    /// says why). No replica may lead yet: it follows whichever leads next.
    pub(super) fn say_stopped_leading(&self) {
        tracing::warn!(
            replica = %self.name(),
            "this replica stopped leading; following whichever replica leads next"
        );
    }

    /// Who leads now, as far as this process knows.
    fn leader(&self) -> String {
        match self {
            Leadership::Alone { .. } => "this orchestrator".to_string(),
            Leadership::Replica(replica) => match &*replica.role().borrow() {
                crate::ha::replica::Role::Following(Some(l)) => l.to_string(),
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

pub(super) async fn drain(gate: &Gate, events: &mut EventStream, printer: &mut Printer) {
    while let Ok(event) = events.try_recv() {
        printer.print(gate, event).await;
    }
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
