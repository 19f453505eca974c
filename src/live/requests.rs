//! Runs asked of whichever replica leads (design §12): `poolgate run` among
//! replicas writes its request into etcd, the leader plans and commits it
//! on a ready pool and writes what became of it; a takeover changes
//! nothing for the requester, since the next leader reads the same keys.
//!
//! Keys under the state prefix:
//! - `requests/<run>`: the required nodes and the requester's lease,
//!   written by the requester on that lease;
//! - `alive/<run>`: the requester is there (on its lease, whose TTL is
//!   `[run] unguarded_after`): a run whose requester is gone for good
//!   (its lease expired) is withdrawn if waiting, and ended by the leader
//!   if committed (outcome `ended`, with the reason): a requester that
//!   could not renew its session for that long has stopped its command;
//! - `requested/<run>`: the leader committed it for a requester (fenced);
//! - `runs/<run>`: what became of it, the event the leader published
//!   (fenced; on no lease: it outlives the requester's session);
//! - `finish/<run>`: the requester's command ended: the leader ends it.
//!
//! A requester confirms that its run is still guarded by reading, in one
//! transaction, the leader key, the stored state and the outcome
//! ([`Requests::standing`]); the stored state is written before any
//! outcome is told, so a run the state no longer holds has ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolId, PoolPhase, RunId};
use poolgate_actors::{Gate, StoreError};
use serde::{Deserialize, Serialize};

use crate::state::etcd::EtcdStore;

/// The key of the pool's state the leader publishes.
pub const STATUS: &str = "status";

/// What the leader last published of the pool, with `age_ms` (how long
/// ago, by this host's clock); `None` when nothing was, or it is not
/// readable.
pub async fn leader_said(store: Arc<EtcdStore>) -> Option<serde_json::Value> {
    let bytes = blocking(move || store.get_raw(STATUS)).await.ok()??;
    let mut said: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let written = said["written_unix_ms"].as_u64().unwrap_or(0);
    said["age_ms"] = serde_json::json!(super::generation::unix_ms().saturating_sub(written));
    Some(said)
}

/// How often a requester looks at what became of its run.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How often the leader looks at the requests when nothing told it to:
/// it watches their keys and looks at once on a change; this is the
/// floor should a change go unseen (a watch broken and made again).
pub const LEADER_LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long one watch of the requests lasts before it is made again (the
/// watching thread ends within this of its term).
pub const WATCH_SPAN: Duration = Duration::from_secs(5);

/// A run asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The pool it is asked of (design §14); the leader's one pool when
    /// absent. A pool the leader does not gate is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The nodes it requires.
    pub required: Vec<NodeId>,
    /// The requester's lease (what became of the run is kept on it).
    #[serde(default)]
    pub lease: i64,
}

/// What became of a requested run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// `committed`, `faulted`, `finished`, or `refused` (it can never be
    /// committed: `reason` says why).
    pub status: String,
    /// The event the leader published for it (none when a leader found
    /// the run committed by its predecessor, whose event went unwritten).
    pub event: Option<Event>,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a requester found of its committed run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStanding {
    /// A replica leads and the stored state holds the run committed.
    Guarded,
    /// The stored state holds the run committed, but no replica leads
    /// right now (a takeover under way).
    Unled,
    /// The leader wrote the run's end.
    Ended(Outcome),
    /// The stored state no longer holds the run: it ended (the state is
    /// written before any outcome is told), its outcome not written yet.
    NotHeld,
}

/// Runs an etcd call off the actors' thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(StoreError(e.to_string())))
}

/// The requester's side.
#[derive(Debug, Clone)]
pub struct Requests {
    store: Arc<EtcdStore>,
}

/// A requester's presence: a lease kept alive on a thread of its own for
/// as long as this lives; revoked when dropped (its request, presence and
/// outcome go with it).
#[derive(Debug)]
pub struct Session {
    lease: i64,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    /// The renewals, as the session's thread saw them.
    renewals: Arc<std::sync::Mutex<Renewals>>,
    ttl: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Session {
    /// The lease.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Whether etcd said the lease is gone (expired: the requester was
    /// away for its TTL); it never comes back.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// How long the lease has gone unrenewed, if it is at risk: not
    /// renewed for half its TTL (renewals go every third of it) while
    /// renewing fails or hangs. It can then expire, and the leader end
    /// the run, once the TTL has passed since the last renewal: a sixth of
    /// the TTL from now at the earliest. A process paused past half the
    /// TTL is not at risk for that alone: its first renewal on waking
    /// goes through.
    pub fn at_risk(&self) -> Option<Duration> {
        let renewals = self.renewals.lock().ok()?;
        let unrenewed = renewals.sent.elapsed();
        let troubled = renewals
            .trying_since
            .is_some_and(|since| since.elapsed() > TROUBLED_AFTER);
        (unrenewed > self.ttl / 2 && troubled).then_some(unrenewed)
    }
}

/// A session's renewals.
#[derive(Debug)]
struct Renewals {
    /// When the last renewal that etcd took was sent (the lease runs for
    /// at least its TTL from then).
    sent: std::time::Instant,
    /// Since when renewing has been tried and has not gone through (a
    /// call in flight, or failing), if it is.
    trying_since: Option<std::time::Instant>,
}

/// How long renewing may be tried without going through before the
/// lease counts as at risk (a renewal takes milliseconds).
const TROUBLED_AFTER: Duration = Duration::from_millis(300);

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Requests {
    /// Requests through `store`'s prefix.
    pub fn new(store: Arc<EtcdStore>) -> Self {
        Requests { store }
    }

    /// Asks for `run` over `required`, present for as long as the returned
    /// session lives (a lease of `ttl`).
    pub async fn ask(
        &self,
        run: &RunId,
        required: &[NodeId],
        ttl: Duration,
    ) -> Result<Session, StoreError> {
        self.ask_of(None, run, required, ttl).await
    }

    /// As [`Requests::ask`], of `pool` (refused by a leader that does not
    /// gate it).
    pub async fn ask_of(
        &self,
        pool: Option<&PoolId>,
        run: &RunId,
        required: &[NodeId],
        ttl: Duration,
    ) -> Result<Session, StoreError> {
        let etcd = Arc::clone(self.store.etcd());
        let (lease, granted) =
            blocking(move || etcd.grant(ttl).map_err(|e| StoreError(e.to_string()))).await?;
        let session = keep(Arc::clone(self.store.etcd()), lease, granted);
        let body = serde_json::to_vec(&Request {
            pool: pool.map(|p| p.to_string()),
            required: required.to_vec(),
            lease,
        })
        .map_err(|e| StoreError(e.to_string()))?;
        let (store, run) = (Arc::clone(&self.store), run.clone());
        // Both at once: a leader never sees one without the other.
        blocking(move || {
            store.put_raw_all(
                &[
                    (&format!("alive/{run}"), b"{}"),
                    (&format!("requests/{run}"), &body),
                ],
                lease,
            )
        })
        .await?;
        Ok(session)
    }

    /// Withdraws a request: not served yet, it is dropped; committed in
    /// the meantime (a race with the leader), the run is ended.
    pub async fn withdraw(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, run) = (Arc::clone(&self.store), run.clone());
        // The request goes first: a leader that sees the end sees no
        // request to commit.
        blocking(move || {
            store.delete_raw(&format!("requests/{run}"))?;
            store.put_raw(&format!("finish/{run}"), b"{}", 0)
        })
        .await
    }

    /// Asks the leader to end `run` (its command ended).
    pub async fn finish(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("finish/{run}"));
        blocking(move || store.put_raw(&name, b"{}", 0)).await
    }

    /// Whether the leader has yet to take up the end of `run`.
    pub async fn finish_pending(&self, run: &RunId) -> Result<bool, StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("finish/{run}"));
        Ok(blocking(move || store.get_raw(&name)).await?.is_some())
    }

    /// What became of `run`, if anything yet.
    pub async fn outcome(&self, run: &RunId) -> Result<Option<Outcome>, StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("runs/{run}"));
        let raw = blocking(move || store.get_raw(&name)).await?;
        raw.map(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|e| StoreError(format!("runs/{run}: damaged ({e})")))
        })
        .transpose()
    }

    /// Forgets what became of `run` (read to its end by its requester).
    pub async fn forget(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, run) = (Arc::clone(&self.store), run.clone());
        blocking(move || {
            store.delete_raw(&format!("runs/{run}"))?;
            store.delete_raw(&format!("alive/{run}"))
        })
        .await
    }

    /// Whether `run` is still guarded, read in one transaction (see
    /// [`EtcdStore::standing`]).
    pub async fn standing(&self, run: &RunId) -> Result<RunStanding, StoreError> {
        let (store, name) = (Arc::clone(&self.store), run.to_string());
        let standing =
            blocking(move || store.standing(&name).map_err(|e| StoreError(e.to_string()))).await?;
        let outcome = standing
            .outcome
            .map(|bytes| {
                serde_json::from_slice::<Outcome>(&bytes)
                    .map_err(|e| StoreError(format!("runs/{run}: damaged ({e})")))
            })
            .transpose()?;
        let held = standing
            .state
            .and_then(|state| state.run)
            .is_some_and(|active| active.run == *run && active.committed);
        Ok(match outcome {
            Some(outcome) if outcome.status != "committed" => RunStanding::Ended(outcome),
            _ if !held => RunStanding::NotHeld,
            _ if standing.led => RunStanding::Guarded,
            _ => RunStanding::Unled,
        })
    }

    /// The run the stored state holds active, if any (what is in the way).
    pub async fn active_run(&self) -> Result<Option<RunId>, StoreError> {
        let store = Arc::clone(&self.store);
        let (durable, _) =
            blocking(move || store.read().map_err(|e| StoreError(e.to_string()))).await?;
        Ok(durable.run.map(|run| run.run))
    }

    /// What the leader last published of the pool (see [`leader_said`]).
    pub async fn leader_said(&self) -> Option<serde_json::Value> {
        leader_said(Arc::clone(&self.store)).await
    }
}

/// Keeps `lease` alive (every third of its TTL, again 100 ms after a
/// failure, each call across every endpoint) until the session drops.
fn keep(etcd: Arc<crate::etcd::Etcd>, lease: i64, ttl: Duration) -> Session {
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicBool::new(false));
    let renewals = Arc::new(std::sync::Mutex::new(Renewals {
        sent: std::time::Instant::now(),
        trying_since: None,
    }));
    let stopping = Arc::clone(&stop);
    let losing = Arc::clone(&lost);
    let noting = Arc::clone(&renewals);
    let thread = std::thread::Builder::new()
        .name("poolgate-run-session".into())
        .spawn(move || {
            let every = ttl / 3;
            let mut next = std::time::Instant::now() + every;
            while !stopping.load(Ordering::Relaxed) {
                if std::time::Instant::now() >= next {
                    let sent = std::time::Instant::now();
                    if let Ok(mut renewals) = noting.lock() {
                        renewals.trying_since.get_or_insert(sent);
                    }
                    let renewed = etcd.keep_alive(lease);
                    next = std::time::Instant::now()
                        + match renewed {
                            Ok(Some(_)) => {
                                if let Ok(mut renewals) = noting.lock() {
                                    renewals.sent = sent;
                                    renewals.trying_since = None;
                                }
                                every
                            }
                            Ok(None) => {
                                tracing::warn!(
                                    "the run's etcd session expired: the leader ends its run"
                                );
                                losing.store(true, Ordering::Relaxed);
                                return;
                            }
                            Err(_) => Duration::from_millis(100),
                        };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = etcd.revoke(lease);
        })
        .ok();
    Session {
        lease,
        stop,
        lost,
        renewals,
        ttl,
        thread,
    }
}

/// The leader's side, for one term: serves the requests on `gate` until
/// the task is aborted (the term ends).
///
/// `aborted_at_start` is the run the term found planning in etcd: the
/// gate aborted it as it started (`planning_aborted`, `restarted`),
/// before this task could subscribe; its end is written first.
pub async fn serve(
    gate: Gate,
    store: Arc<EtcdStore>,
    pool: poolgate_actors::core::PoolDefinition,
    aborted_at_start: Option<RunId>,
) {
    let mut changed = watch_requests(Arc::clone(&store));
    let mut serving = RequestServer::new(gate, store, pool.members().to_vec());
    if let Some(run) = aborted_at_start {
        serving.unsettled.push_back(Event::PlanningAborted {
            at: poolgate_actors::core::Time::ZERO,
            pool: pool.id().clone(),
            run,
            reason: poolgate_actors::core::AbortReason::Restarted,
        });
    }
    let mut tick = tokio::time::interval(LEADER_LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut said = super::throttle::Throttle::new(super::throttle::LOG_EVERY);
    loop {
        let result = tokio::select! {
            event = serving.events.recv() => match event {
                Some(event) => {
                    serving.unsettled.push_back(event);
                    serving.settle_published().await
                }
                None => return,
            },
            Some(()) = changed.recv() => serving.look().await,
            _ = tick.tick() => {
                let looked = serving.look().await;
                if let Err(e) = serving.publish_status().await {
                    tracing::debug!(error = %e, "the pool's status not published (tried again)");
                }
                looked
            }
        };
        if let Err(e) = result {
            if let Some(held) = said.allow(std::time::Instant::now()) {
                tracing::warn!(error = %e, held, "run requests: not served (tried again)");
            }
        }
    }
}

/// Watches the requests' keys on a thread of its own (the etcd client
/// blocks): one message on the channel per batch of changes, at most one
/// waiting. The thread ends within [`WATCH_SPAN`] of the receiver's drop
/// (the term's end); a watch that breaks is made again a second later.
fn watch_requests(store: Arc<EtcdStore>) -> tokio::sync::mpsc::Receiver<()> {
    let (tell, changed) = tokio::sync::mpsc::channel(1);
    let spawned = std::thread::Builder::new()
        .name("poolgate-watch".into())
        .spawn(move || {
            let mut said = super::throttle::Throttle::new(super::throttle::LOG_EVERY);
            while !tell.is_closed() {
                let watched = store.watch_requests(WATCH_SPAN, || {
                    let _ = tell.try_send(());
                });
                if let Err(e) = watched {
                    metrics::counter!("poolgate_etcd_watch_broken_total").increment(1);
                    if let Some(held) = said.allow(std::time::Instant::now()) {
                        tracing::debug!(error = %e, held, "watch of the run requests broke: looked at every second meanwhile");
                    }
                    std::thread::sleep(LEADER_LOOK_EVERY);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to watch the run requests: looked at every second");
    }
    changed
}

/// What the leader's side keeps for one term (see [`serve`]).
#[derive(Debug)]
pub struct RequestServer {
    gate: Gate,
    store: Arc<EtcdStore>,
    members: Vec<NodeId>,
    events: poolgate_actors::EventStream,
    /// Outcomes not written yet (etcd slow, or unreachable for a moment):
    /// written at the next chance, in order, never dropped.
    unsettled: std::collections::VecDeque<Event>,
    said_waiting: super::throttle::Throttle,
    /// Committed runs whose requester is gone, said once each.
    orphans: std::collections::BTreeSet<RunId>,
    /// The pool's state last published (`status`), to write it only when
    /// it changes.
    published: Option<serde_json::Value>,
}

impl RequestServer {
    /// RequestServer the requests on `gate`, from the events published from now.
    pub fn new(gate: Gate, store: Arc<EtcdStore>, members: Vec<NodeId>) -> Self {
        RequestServer {
            events: gate.subscribe_from_now(),
            gate,
            store,
            members,
            unsettled: Default::default(),
            said_waiting: super::throttle::Throttle::new(super::throttle::LOG_EVERY),
            orphans: Default::default(),
            published: None,
        }
    }

    /// Publishes the pool's state under `status` when it changed (see
    /// [`super::status::published`]), fenced by the term: every replica's
    /// `status` and a requester that gives up tell it.
    pub async fn publish_status(&mut self) -> Result<(), StoreError> {
        let report = self
            .gate
            .report()
            .await
            .map_err(|e| StoreError(e.to_string()))?;
        let said = super::status::published(&report);
        if self.published.as_ref() == Some(&said) {
            return Ok(());
        }
        let mut record = said.clone();
        record["written_unix_ms"] = serde_json::json!(super::generation::unix_ms());
        let bytes = serde_json::to_vec(&record).map_err(|e| StoreError(e.to_string()))?;
        let store = Arc::clone(&self.store);
        blocking(move || store.put_fenced(STATUS, &bytes, 0)).await?;
        self.published = Some(said);
        Ok(())
    }

    /// Writes the outcomes of the events published so far, oldest first;
    /// stops at the first failure (the rest wait for the next chance).
    pub async fn settle_published(&mut self) -> Result<(), StoreError> {
        while let Ok(event) = self.events.try_recv() {
            self.unsettled.push_back(event);
        }
        settle_all(&self.store, &mut self.unsettled).await
    }

    /// One look at the requests, from the gate's report. Every event
    /// published before that report is settled first: a run that ended
    /// before it has its outcome written before the look forgets its
    /// request (which it would otherwise do, the run being no longer
    /// active, and the outcome would have nowhere to go).
    pub async fn look(&mut self) -> Result<(), StoreError> {
        let report = self
            .gate
            .report()
            .await
            .map_err(|e| StoreError(e.to_string()))?;
        self.settle_published().await?;
        look(
            &self.gate,
            &self.store,
            &self.members,
            report,
            &mut self.said_waiting,
            &mut self.orphans,
        )
        .await
    }
}

/// Writes the outcomes waiting, oldest first; stops at the first failure.
async fn settle_all(
    store: &Arc<EtcdStore>,
    unsettled: &mut std::collections::VecDeque<Event>,
) -> Result<(), StoreError> {
    while let Some(event) = unsettled.front() {
        settle(store, event.clone()).await?;
        unsettled.pop_front();
    }
    Ok(())
}

/// Writes what became of a requested run.
async fn settle(store: &Arc<EtcdStore>, event: Event) -> Result<(), StoreError> {
    let (run, status) = match &event {
        Event::RunCommitted { run, .. } => (run.clone(), "committed"),
        Event::RunFaulted { run, .. } => (run.clone(), "faulted"),
        Event::RunFinished { run, .. } => (run.clone(), "finished"),
        // A run's planning that was abandoned is its end: the same run is
        // never planned again (its requester asks anew, under a new id).
        Event::PlanningAborted { run, .. } => (run.clone(), "aborted"),
        _ => return Ok(()),
    };
    write_outcome(store, &run, status, Some(event), None).await
}

/// Writes `runs/<run>` on its requester's lease (read from its request, or
/// its presence), then takes the request (and an end asked for).
async fn write_outcome(
    store: &Arc<EtcdStore>,
    run: &RunId,
    status: &str,
    event: Option<Event>,
    reason: Option<String>,
) -> Result<(), StoreError> {
    let (store, run, status) = (Arc::clone(store), run.clone(), status.to_string());
    blocking(move || {
        let request = store.get_raw(&format!("requests/{run}"))?;
        let requested = store.get_raw(&format!("requested/{run}"))?;
        // Only runs asked for through etcd have an outcome to write.
        if request.is_none() && requested.is_none() {
            return Ok(());
        }
        // A run finished that its requester neither asked to end nor is
        // there for was ended by the leader: its requester is gone.
        let gone = status == "finished"
            && store.get_raw(&format!("finish/{run}"))?.is_none()
            && store.get_raw(&format!("alive/{run}"))?.is_none();
        let outcome = match gone {
            true => Outcome {
                status: "ended".to_string(),
                event,
                reason: Some(REQUESTER_GONE.to_string()),
            },
            false => Outcome {
                status: status.clone(),
                event,
                reason,
            },
        };
        let body = serde_json::to_vec(&outcome).map_err(|e| StoreError(e.to_string()))?;
        if status == "committed" {
            if let Some(bytes) = &request {
                store.put_fenced(&format!("requested/{run}"), bytes, 0)?;
            }
        }
        // On no lease: it outlives the requester's session (its requester
        // removes it once read; that of a requester gone for good stays,
        // as the record of why its run ended).
        store.put_fenced(&format!("runs/{run}"), &body, 0)?;
        store.delete_raw(&format!("requests/{run}"))?;
        if status == "committed" {
            // An end asked for by a requester that just read `committed`
            // may already be there: it is the next look's to take.
            return Ok(());
        }
        store.delete_raw(&format!("requested/{run}"))?;
        store.delete_raw(&format!("finish/{run}"))
    })
    .await
}

/// The reason written for a run ended because its requester is gone.
pub const REQUESTER_GONE: &str =
    "its requester is gone: its etcd session expired, so it had stopped its command";

/// Ends `run`, committed for a requester that is gone for good; its end is
/// written as `ended`, with [`REQUESTER_GONE`].
async fn end_orphan(
    gate: &Gate,
    run: &RunId,
    said: &mut std::collections::BTreeSet<RunId>,
) -> Result<(), StoreError> {
    if said.insert(run.clone()) {
        tracing::warn!(%run, "the run's requester is gone (its etcd session expired): the run is ended");
    }
    // Its `run_finished` is settled as `ended`, with the reason (see
    // `write_outcome`), and tried again until it is written.
    if let Err(e) = gate.finish_run(run.clone()).await {
        tracing::warn!(%run, error = %e, "the run of a requester that is gone not ended (tried again)");
    }
    Ok(())
}

/// One look at the requests, as `report` shows the gate: ends the runs
/// asked to end, then plans and commits the first run asked for once the
/// pool is ready and no run is active.
async fn look(
    gate: &Gate,
    store: &Arc<EtcdStore>,
    members: &[NodeId],
    report: poolgate_actors::core::PoolReport,
    said_waiting: &mut super::throttle::Throttle,
    orphans: &mut std::collections::BTreeSet<RunId>,
) -> Result<(), StoreError> {
    let listed = Arc::clone(store);
    // One transaction: one request to etcd, and one revision's view of
    // the four (an end, a request and its requester's presence seen as
    // they stood together).
    let (finishes, requests, alive, requested) = blocking(move || {
        let mut lists = listed
            .list_raw_all(&["finish/", "requests/", "alive/", "requested/"])?
            .into_iter();
        let mut next = || lists.next().unwrap_or_default();
        Ok((next(), next(), next(), next()))
    })
    .await?;
    let present = |run: &str| alive.iter().any(|(name, _)| name == run);
    for (run, _) in finishes {
        let Ok(id) = RunId::new(&run) else { continue };
        if report.run.as_ref() == Some(&id) {
            match gate.finish_run(id).await {
                // `settle` writes `run_finished` and takes the request.
                Ok(()) => continue,
                Err(e) => tracing::warn!(%run, error = %e, "requested end of run refused"),
            }
        }
        let (store, name) = (Arc::clone(store), format!("finish/{run}"));
        blocking(move || store.delete_raw(&name)).await?;
    }
    // A committed run whose requester is gone for good (its session
    // expired: it could not confirm its run guarded for that long, so it
    // stopped its command) is ended, and its end written with the reason
    // (docs/failover.md §3). Requested runs no longer active are
    // forgotten.
    for (run, _) in &requested {
        let Ok(id) = RunId::new(run) else { continue };
        if report.run.as_ref() == Some(&id) {
            if !present(run) {
                end_orphan(gate, &id, orphans).await?;
            }
        } else {
            let (store, name) = (Arc::clone(store), format!("requested/{run}"));
            blocking(move || store.delete_raw(&name)).await?;
        }
    }
    let PoolPhase::Ready { epoch } = report.phase else {
        return Ok(());
    };
    // The active run, if requested, is committed here (planned before a
    // readiness loss, or committed by the last leader, whose outcome went
    // unwritten); no other is planned meanwhile.
    let pick = match &report.run {
        Some(active) => requests
            .into_iter()
            .find(|(run, _)| run.as_str() == active.as_str()),
        None => requests.into_iter().find(|(run, _)| present(run)),
    };
    let Some((run, body)) = pick else {
        return Ok(());
    };
    let request = RunId::new(&run)
        .ok()
        .zip(serde_json::from_slice::<Request>(&body).ok());
    let Some((id, request)) = request else {
        tracing::warn!(%run, "a run request that does not parse: dropped");
        let (store, name) = (Arc::clone(store), format!("requests/{run}"));
        return blocking(move || store.delete_raw(&name)).await;
    };
    // A plan that can never be committed is refused at once, before it
    // holds the pool in planning.
    let stranger = request.required.iter().find(|n| !members.contains(n));
    let elsewhere = request
        .pool
        .as_ref()
        .filter(|pool| pool.as_str() != report.pool.as_str());
    if request.required.is_empty() || stranger.is_some() || elsewhere.is_some() {
        let reason = match (elsewhere, stranger) {
            (Some(pool), _) => {
                format!("no pool {pool} here: the leader gates pool {}", report.pool)
            }
            (None, Some(node)) => format!("{node} is not a member of the leader's pool"),
            (None, None) => "no required node".to_string(),
        };
        tracing::warn!(%run, %reason, "requested run refused");
        return write_outcome(store, &id, "refused", None, Some(reason)).await;
    }
    let planned = match &report.run {
        Some(_) => Ok(epoch),
        None => gate.begin_planning(id.clone(), Some(epoch)).await,
    };
    let committed = match planned {
        Ok(_) => {
            gate.commit_plan(id.clone(), request.required, Some(epoch))
                .await
        }
        Err(e) => Err(e),
    };
    match committed {
        Ok(()) => Ok(()),
        Err(poolgate_actors::GateError::Refused(poolgate_actors::core::Refusal::RunCommitted(
            other,
        ))) if other == id => write_outcome(store, &id, "committed", None, None).await,
        Err(e) => {
            if let Some(held) = said_waiting.allow(std::time::Instant::now()) {
                tracing::info!(%run, error = %e, held, "requested run not committed yet (tried again)");
            }
            Ok(())
        }
    }
}
