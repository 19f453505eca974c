//! The leader's side: the requests served on its gate, what became of
//! each run written back, and runs whose requester is gone ended.

use std::sync::Arc;

use poolgate_actors::core::{Event, PoolPhase, RunId};
use poolgate_actors::{Gate, StoreError};

use crate::live::planning::{Committed, Plan, Refused};
use crate::state::etcd::EtcdStore;

use super::renewals::Renewal;
use super::{blocking, Request, RunOutcome, LEADER_LOOK_EVERY, STATUS, WATCH_SPAN};

/// The leader's side, for one term: serves the requests on `gate` (a
/// pool of `fleet`, if given) until the task is aborted (the term ends).
///
/// `aborted_at_start` is the run the term found planning in etcd: the
/// gate aborted it as it started (`planning_aborted`, `restarted`),
/// before this task could subscribe; its end is written first. A run
/// asked of a pool of `fleet` whose nodes another pool's committed run
/// holds waits for them before its planning begins (a planning begun
/// then refused `reserved`, and left by a requester that gave up, would
/// hold the pool until a takeover).
pub async fn serve_in(
    fleet: Option<poolgate_actors::Fleet>,
    gate: Gate,
    store: Arc<EtcdStore>,
    pool: poolgate_actors::core::PoolDefinition,
    aborted_at_start: Option<RunId>,
) {
    let mut changed = watch_requests(Arc::clone(&store));
    let mut serving = RequestServer::new(gate, store);
    serving.fleet = fleet;
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
    let mut said = crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY);
    loop {
        let result = tokio::select! {
            event = serving.events.recv() => match event {
                Some(event) => {
                    serving.unsettled.push_back(event);
                    serving.settle_published().await
                }
                None => {
                    // The gate stopped. A pool a reload removed while
                    // the term lasts says so, or its last status would
                    // tell requesters it is ready still: tried every
                    // second while it stays removed and the term lasts.
                    while serving
                        .fleet
                        .as_ref()
                        .is_some_and(|f| !f.is_stopped() && f.pool(pool.id()).is_none())
                    {
                        match serving.publish_removed(&pool).await {
                            Ok(()) => {
                                // The runs asked of it can never be
                                // committed here: refused, naming why.
                                if let Err(e) = serving.refuse_all(&pool).await {
                                    tracing::warn!(pool = %pool.id(), error = %e, "the runs asked of a removed pool not refused (their requesters give up at their timeouts)");
                                }
                                break;
                            }
                            Err(e) => {
                                if let Some(held) = said.allow(std::time::Instant::now()) {
                                    tracing::warn!(pool = %pool.id(), error = %e, held, "that the pool is no longer served was not published (tried again every second)");
                                }
                                tokio::time::sleep(LEADER_LOOK_EVERY).await;
                            }
                        }
                    }
                    return;
                }
            },
            Some(()) = changed.recv() => serving.look().await,
            _ = tick.tick() => {
                let looked = serving.look().await;
                if let Err(e) = serving.publish_status().await {
                    tracing::debug!(pool = %pool.id(), error = %e, "the pool's status not published (tried again)");
                }
                looked
            }
        };
        if let Err(e) = result {
            if let Some(held) = said.allow(std::time::Instant::now()) {
                tracing::warn!(pool = %pool.id(), error = %e, held, "run requests: not served (tried again)");
            }
        }
    }
}

/// Watches the requests' keys on a thread of its own (the etcd client
/// blocks): one message on the channel per batch of changes, at most one
/// waiting. The thread ends within [`WATCH_SPAN`] of the receiver's drop
/// (the term's end); a watch that breaks is made again a second later.
pub(super) fn watch_requests(store: Arc<EtcdStore>) -> tokio::sync::mpsc::Receiver<()> {
    let (tell, changed) = tokio::sync::mpsc::channel(1);
    let spawned = std::thread::Builder::new()
        .name("poolgate-watch".into())
        .spawn(move || {
            let mut said = crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY);
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

/// What the leader's side keeps for one term (see [`serve_in`]).
#[derive(Debug)]
pub struct RequestServer {
    gate: Gate,
    store: Arc<EtcdStore>,
    events: poolgate_actors::EventStream,
    /// Outcomes not written yet (etcd slow, or unreachable for a moment):
    /// written at the next chance, in order, never dropped.
    unsettled: std::collections::VecDeque<Event>,
    /// What the looks remember between them.
    looked: Looked,
    /// The pool's state last published (`status`), to write it only when
    /// it changes.
    published: Option<serde_json::Value>,
    /// What the first run asked for waits for, as last written
    /// (`waiting/<run>`), to write it only when it changes.
    told_waiting: Option<Waits>,
    /// The fleet the pool is one of, whose reservations a run waits for
    /// before its planning begins ([`serve_in`]).
    fleet: Option<poolgate_actors::Fleet>,
}

/// What the looks at the requests remember between them.
#[derive(Debug)]
pub(super) struct Looked {
    said_waiting: crate::live::throttle::Throttle,
    /// Requesters that stopped renewing their session, said now and then.
    said_stale: crate::live::throttle::Throttle,
    /// Committed runs whose requester is gone, said once each.
    orphans: std::collections::BTreeSet<RunId>,
    /// What was read of the requesters' leases since they were last in
    /// doubt (etcd's raft term rose, or etcd answered again).
    renewals: super::renewals::Renewals,
    /// The active run, last seen asked for (its request or its requester
    /// there): withdrawn if both go before its commit.
    asked: Option<RunId>,
}

/// Why a run asked for is not committed yet: the gate's refusal (a node
/// another pool's run holds, a stale proof, a store that did not write),
/// written under `waiting/<run>` on its requester's lease, for the
/// requester to say when it gives up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Waits {
    run: RunId,
    lease: i64,
    detail: String,
}

impl RequestServer {
    /// Serves the requests on `gate` (a run over a node that is not one of
    /// its candidates at the time is refused), from the events published
    /// from now.
    pub fn new(gate: Gate, store: Arc<EtcdStore>) -> Self {
        RequestServer {
            events: gate.subscribe_from_now(),
            gate,
            store,
            unsettled: Default::default(),
            looked: Looked {
                said_waiting: crate::live::throttle::Throttle::new(
                    crate::live::throttle::LOG_EVERY,
                ),
                said_stale: crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY),
                orphans: Default::default(),
                renewals: Default::default(),
                asked: None,
            },
            published: None,
            told_waiting: None,
            fleet: None,
        }
    }

    /// Publishes the pool's state under `status` when it changed (see
    /// [`crate::live::status::published`]), fenced by the term: every replica's
    /// `status` and a requester that gives up tell it.
    pub async fn publish_status(&mut self) -> Result<(), StoreError> {
        let report = self
            .gate
            .report()
            .await
            .map_err(|e| StoreError(e.to_string()))?;
        let said = crate::live::status::published(&report, &self.gate.clock());
        if self.published.as_ref() == Some(&said) {
            return Ok(());
        }
        let mut record = said.clone();
        record["written_unix_ms"] = serde_json::json!(crate::live::generation::unix_ms());
        let bytes = serde_json::to_vec(&record).map_err(|e| StoreError(e.to_string()))?;
        let store = Arc::clone(&self.store);
        blocking(move || store.put_fenced(STATUS, &bytes, 0)).await?;
        self.published = Some(said);
        Ok(())
    }

    /// Publishes under `status`, fenced by the term, that `pool` is no
    /// longer served (a reload removed it): what `status` and a requester
    /// that gives up tell, instead of its last state.
    async fn publish_removed(
        &mut self,
        pool: &poolgate_actors::core::PoolDefinition,
    ) -> Result<(), StoreError> {
        let record = serde_json::json!({
            "pool": pool.id().as_str(),
            "phase": "removed",
            "epoch": null,
            "run": null,
            "state": not_served(pool.id()),
            "written_unix_ms": crate::live::generation::unix_ms(),
        });
        let bytes = serde_json::to_vec(&record).map_err(|e| StoreError(e.to_string()))?;
        let store = Arc::clone(&self.store);
        blocking(move || store.put_fenced(STATUS, &bytes, 0)).await
    }

    /// Refuses every run asked of `pool`, which a reload removed.
    async fn refuse_all(
        &self,
        pool: &poolgate_actors::core::PoolDefinition,
    ) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        let requests = blocking(move || {
            Ok(store
                .list_raw_all(&["requests/"])?
                .into_iter()
                .next()
                .unwrap_or_default())
        })
        .await?;
        let reason = not_served(pool.id());
        for (run, _) in requests {
            let Ok(id) = RunId::new(&run) else { continue };
            tracing::warn!(%run, %reason, "requested run refused");
            write_outcome(&self.store, &id, "refused", None, Some(reason.clone())).await?;
        }
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
        let waits = look(
            &self.gate,
            self.fleet.as_ref(),
            &self.store,
            report,
            &mut self.looked,
        )
        .await?;
        match waits {
            Some(waits) if self.told_waiting.as_ref() != Some(&waits) => {
                let (store, told) = (Arc::clone(&self.store), waits.clone());
                let written = blocking(move || {
                    store.put_fenced(
                        &format!("waiting/{}", told.run),
                        told.detail.as_bytes(),
                        told.lease,
                    )
                })
                .await;
                // Only what the requester says if it gives up: a write
                // that failed (its lease just expired, etcd away) is tried
                // at the next look, and holds up nothing.
                match written {
                    Ok(()) => self.told_waiting = Some(waits),
                    Err(e) => {
                        tracing::debug!(run = %waits.run, error = %e, "why the run waits: not written")
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Writes the outcomes waiting, oldest first; stops at the first failure.
pub(super) async fn settle_all(
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
pub(super) async fn settle(store: &Arc<EtcdStore>, event: Event) -> Result<(), StoreError> {
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

/// Whether the requester of `run` (its request `body`) renews its etcd
/// session: a requester renews every tenth of its TTL, so a lease not
/// renewed for three tenths of it (and etcd's rounding) has lost its
/// holder, killed (its request outlives it until the lease expires) or
/// paused. A run planned
/// for it would hold its nodes, committed and guarded by nobody, until
/// then. A lease etcd cannot say anything of counts as renewed: this look
/// holds nothing up.
async fn requester_renews(
    store: &Arc<EtcdStore>,
    run: &str,
    body: &[u8],
    looked: &mut Looked,
) -> bool {
    let Ok(request) = serde_json::from_slice::<Request>(body) else {
        return true;
    };
    let (etcd, lease) = (Arc::clone(store.etcd()), request.lease);
    let lived = blocking(move || {
        etcd.time_to_live(lease)
            .map_err(|e| StoreError(e.to_string()))
    })
    .await;
    match lived {
        Ok(Some((left, granted))) => {
            let reading = super::renewals::Reading {
                lease,
                left,
                granted,
            };
            // Read after the answer, which may be the first to tell of a
            // rise, or of etcd back.
            let doubt = store.etcd().leases_in_doubt_since();
            let now = std::time::Instant::now();
            let renewal = looked.renewals.renewal(reading, doubt, now);
            let said = |looked: &mut Looked| looked.said_stale.allow(now);
            match renewal {
                Renewal::Renews => true,
                Renewal::Stopped(unrenewed) => {
                    if let Some(held) = said(looked) {
                        tracing::info!(%run, unrenewed = %crate::config::in_words(unrenewed), held, "a run's requester stopped renewing its session (killed or paused): not planned until it renews, or its request goes with the session");
                    }
                    false
                }
                Renewal::Unproven => {
                    if let Some(held) = said(looked) {
                        tracing::info!(%run, held, "etcd elected a raft leader (which gives every lease a fresh TTL) or answered again after an outage (renewals it held land late): a run's requester is not planned until it is seen renewing its session itself");
                    }
                    false
                }
            }
        }
        Ok(None) => false,
        Err(e) => {
            tracing::debug!(%run, error = %e, "the requester's session could not be read: taken as renewed");
            true
        }
    }
}

/// What is said of a pool a reload removed from the leader.
fn not_served(pool: &poolgate_actors::core::PoolId) -> String {
    format!("pool {pool} is not served: a reload removed it from the leader's configuration")
}

/// Why `request` can never be committed on the pool of `report`, as it
/// stands now (a reload may have changed its candidates since the term
/// began): a pool the leader does not gate, a required node it does not
/// have, no required node. `None` when it may be.
fn never_committed(
    request: &Request,
    report: &poolgate_actors::core::PoolReport,
) -> Option<String> {
    if let Some(pool) = request
        .pool
        .as_ref()
        .filter(|pool| pool.as_str() != report.pool.as_str())
    {
        return Some(format!(
            "no pool {pool} here: the leader gates pool {}",
            report.pool
        ));
    }
    match crate::live::planning::stranger(&request.required, report) {
        Some(node) => Some(format!("{node} is not a member of the leader's pool")),
        None if request.required.is_empty() => Some("no required node".to_string()),
        None => None,
    }
}

/// Writes `runs/<run>` on its requester's lease (read from its request, or
/// its presence), then takes the request (and an end asked for).
pub(super) async fn write_outcome(
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
            true => RunOutcome {
                status: "ended".to_string(),
                event,
                reason: Some(REQUESTER_GONE.to_string()),
            },
            false => RunOutcome {
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
        store.delete_raw(&format!("waiting/{run}"))?;
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
pub(super) async fn end_orphan(
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
pub(super) async fn look(
    gate: &Gate,
    fleet: Option<&poolgate_actors::Fleet>,
    store: &Arc<EtcdStore>,
    report: poolgate_actors::core::PoolReport,
    looked: &mut Looked,
) -> Result<Option<Waits>, StoreError> {
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
            match gate.finish_run(id.clone()).await {
                // `settle` writes `run_finished` and takes the request.
                Ok(()) => continue,
                // Still planning (its requester gave up, or `run --end`):
                // nobody will commit it, and it would hold the pool.
                Err(poolgate_actors::GateError::Refused(
                    poolgate_actors::core::Refusal::NotCommitted { .. },
                )) => match gate.abort_planning(id).await {
                    // `settle` writes `planning_aborted`.
                    Ok(()) => {
                        tracing::info!(%run, "a run asked to end while it planned: withdrawn");
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(%run, error = %e, "requested end of a planning run refused")
                    }
                },
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
                end_orphan(gate, &id, &mut looked.orphans).await?;
            }
        } else {
            let (store, name) = (Arc::clone(store), format!("requested/{run}"));
            blocking(move || store.delete_raw(&name)).await?;
        }
    }
    // The active run, asked for while it planned, whose request and
    // requester are both gone before its commit (the requester killed,
    // its session expired): nobody will commit it, and it would hold the
    // pool. It is withdrawn.
    if let Some(active) = report.run.as_ref() {
        let asked = requests.iter().any(|(run, _)| run == active.as_str());
        let committed = requested.iter().any(|(run, _)| run == active.as_str());
        if asked || present(active.as_str()) {
            looked.asked = Some(active.clone());
        } else if looked.asked.as_ref() == Some(active) && !committed {
            looked.asked = None;
            match gate.abort_planning(active.clone()).await {
                Ok(()) => {
                    tracing::info!(run = %active, "a run planning whose requester is gone: withdrawn")
                }
                // Committed meanwhile: its requester's absence ends it.
                Err(e) => tracing::debug!(run = %active, error = %e, "not withdrawn"),
            }
            return Ok(None);
        }
    }
    // A plan that can never be committed is refused at once, ready pool
    // or not, and not left to hold the pool in planning.
    let mut refused = false;
    for (run, body) in &requests {
        let parsed = RunId::new(run)
            .ok()
            .zip(serde_json::from_slice::<Request>(body).ok());
        let Some((id, request)) = parsed else {
            continue;
        };
        let Some(reason) = never_committed(&request, &report) else {
            continue;
        };
        if report.run.as_ref() == Some(&id) {
            if let Err(e) = gate.abort_planning(id.clone()).await {
                tracing::debug!(%run, error = %e, "planning not aborted (none under way)");
            }
        }
        tracing::warn!(%run, %reason, "requested run refused");
        write_outcome(store, &id, "refused", None, Some(reason)).await?;
        refused = true;
    }
    if refused {
        // The rest, against the pool as it stands once those are gone:
        // the next look.
        return Ok(None);
    }
    let PoolPhase::Ready { epoch } = report.phase else {
        // A run asked for that waits for the pool (suspended): why, for
        // its requester to say if it gives up.
        let waits = report.run.as_ref().and_then(|active| {
            let (_, body) = requests.iter().find(|(run, _)| run == active.as_str())?;
            let request = serde_json::from_slice::<Request>(body).ok()?;
            Some(Waits {
                run: active.clone(),
                lease: request.lease,
                detail: format!(
                    "the pool is not ready: {}",
                    crate::report::state_line_live(&report, &gate.clock())
                ),
            })
        });
        return Ok(waits);
    };
    // The active run, if requested, is committed here (planned before a
    // readiness loss, or committed by the last leader, whose outcome went
    // unwritten); no other is planned meanwhile.
    let pick = match &report.run {
        Some(active) => requests
            .into_iter()
            .find(|(run, _)| run.as_str() == active.as_str()),
        // The first asked for whose requester is there and renews its
        // session: one that stopped (killed, or paused) is not planned
        // until it renews again, or its request goes with its session.
        None => {
            let mut fresh = None;
            for (run, body) in requests.into_iter().filter(|(run, _)| present(run)) {
                if requester_renews(store, &run, &body, looked).await {
                    fresh = Some((run, body));
                    break;
                }
            }
            fresh
        }
    };
    let Some((run, body)) = pick else {
        return Ok(None);
    };
    let request = RunId::new(&run)
        .ok()
        .zip(serde_json::from_slice::<Request>(&body).ok());
    let Some((id, request)) = request else {
        tracing::warn!(%run, "a run request that does not parse: dropped");
        let (store, name) = (Arc::clone(store), format!("requests/{run}"));
        return blocking(move || store.delete_raw(&name))
            .await
            .map(|()| None);
    };
    // A node another pool's committed run holds: no planning begun until
    // it is free (said as the gate would refuse the commit).
    let held = fleet.filter(|_| report.run.is_none()).and_then(|fleet| {
        request.required.iter().find_map(|node| {
            let (pool, run) = fleet
                .reserved_by(node)
                .filter(|(pool, _)| *pool != report.pool)?;
            Some(poolgate_actors::core::Refusal::Reserved {
                node: node.clone(),
                run,
                pool,
            })
        })
    });
    if let Some(refused) = held {
        return Ok(Some(Waits {
            run: id,
            lease: request.lease,
            detail: poolgate_actors::GateError::Refused(refused).to_string(),
        }));
    }
    let lease = request.lease;
    let mut plan = match &report.run {
        Some(_) => Plan::active(id.clone(), request.required),
        None => Plan::new(id.clone(), request.required),
    };
    match plan.commit(gate, epoch).await {
        Ok(Committed::Now) => Ok(None),
        // Committed by the leader before, its outcome unwritten.
        Ok(Committed::Already) => write_outcome(store, &id, "committed", None, None)
            .await
            .map(|()| None),
        // No wait changes it: refused (its planning aborted, the pool not
        // left holding it).
        Err((e, Refused::ForGood)) => {
            tracing::warn!(%run, reason = %e, "requested run refused");
            write_outcome(store, &id, "refused", None, Some(e.to_string()))
                .await
                .map(|()| None)
        }
        // Another run in the way, a run aborted by the policy, the gate
        // stopped (the next leader answers): looked at again.
        Err((e, _)) => {
            if let Some(held) = looked.said_waiting.allow(std::time::Instant::now()) {
                tracing::info!(%run, error = %e, held, "requested run not committed yet (tried again)");
            }
            Ok(Some(Waits {
                run: id,
                lease,
                detail: e.to_string(),
            }))
        }
    }
}
