//! Runs asked of whichever replica leads (SPEC §12): `poolgate run` among
//! replicas writes its request into etcd, the leader plans and commits it
//! on a ready pool and writes what became of it; a takeover changes
//! nothing for the requester, since the next leader reads the same keys.
//!
//! Keys under the state prefix: `requests/<run>` (the required nodes,
//! written by the requester), `runs/<run>` (what became of it, each the
//! event the leader published, written by the leader under its fence),
//! `finish/<run>` (the requester's command ended: the leader ends the run).

use std::sync::Arc;
use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, PoolPhase, RunId};
use poolgate_actors::{Gate, StoreError};
use serde::{Deserialize, Serialize};

use crate::state::etcd::EtcdStore;

/// How often the leader looks at the requests, and a requester at what
/// became of its run.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// A run asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The nodes it requires.
    pub required: Vec<NodeId>,
}

/// What became of a requested run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// `committed`, `faulted` or `finished`.
    pub status: String,
    /// The event the leader published for it (none when a leader found
    /// the run committed by its predecessor, whose event went unwritten).
    pub event: Option<Event>,
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

impl Requests {
    /// Requests through `store`'s prefix.
    pub fn new(store: Arc<EtcdStore>) -> Self {
        Requests { store }
    }

    /// Asks for `run` over `required`.
    pub async fn ask(&self, run: &RunId, required: &[NodeId]) -> Result<(), StoreError> {
        let body = serde_json::to_vec(&Request {
            required: required.to_vec(),
        })
        .map_err(|e| StoreError(e.to_string()))?;
        let (store, name) = (Arc::clone(&self.store), format!("requests/{run}"));
        blocking(move || store.put_raw(&name, &body)).await
    }

    /// Withdraws a request not yet served.
    pub async fn withdraw(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("requests/{run}"));
        blocking(move || store.delete_raw(&name)).await
    }

    /// Asks the leader to end `run` (its command ended).
    pub async fn finish(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("finish/{run}"));
        blocking(move || store.put_raw(&name, b"{}")).await
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
}

/// The leader's side, for one term: serves the requests on `gate` until
/// the task is aborted (the term ends).
pub async fn serve(gate: Gate, store: Arc<EtcdStore>) {
    let mut events = gate.subscribe_from_now();
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut said = super::throttle::Throttle::new(super::throttle::LOG_EVERY);
    loop {
        let result = tokio::select! {
            event = events.recv() => match event {
                Some(event) => settle(&store, event).await,
                None => return,
            },
            _ = tick.tick() => look(&gate, &store).await,
        };
        if let Err(e) = result {
            if let Some(held) = said.allow(std::time::Instant::now()) {
                tracing::warn!(error = %e, held, "run requests: not served (tried again)");
            }
        }
    }
}

/// Writes what became of a requested run.
async fn settle(store: &Arc<EtcdStore>, event: Event) -> Result<(), StoreError> {
    let (run, status) = match &event {
        Event::RunCommitted { run, .. } => (run.clone(), "committed"),
        Event::RunFaulted { run, .. } => (run.clone(), "faulted"),
        Event::RunFinished { run, .. } => (run.clone(), "finished"),
        _ => return Ok(()),
    };
    write_outcome(store, &run, status, Some(event)).await
}

async fn write_outcome(
    store: &Arc<EtcdStore>,
    run: &RunId,
    status: &str,
    event: Option<Event>,
) -> Result<(), StoreError> {
    let outcome = Outcome {
        status: status.to_string(),
        event,
    };
    let body = serde_json::to_vec(&outcome).map_err(|e| StoreError(e.to_string()))?;
    let (store, run) = (Arc::clone(store), run.clone());
    blocking(move || {
        store.put_fenced(&format!("runs/{run}"), &body)?;
        store.delete_raw(&format!("requests/{run}"))?;
        store.delete_raw(&format!("finish/{run}"))
    })
    .await
}

/// One look at the requests: ends the runs asked to end, plans and
/// commits the first run asked for once the pool is ready and no run is
/// active.
async fn look(gate: &Gate, store: &Arc<EtcdStore>) -> Result<(), StoreError> {
    let listed = Arc::clone(store);
    let (finishes, requests) =
        blocking(move || Ok((listed.list_raw("finish/")?, listed.list_raw("requests/")?))).await?;
    let report = gate.report().await.map_err(|e| StoreError(e.to_string()))?;
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
        None => requests.into_iter().next(),
    };
    let Some((run, body)) = pick else {
        return Ok(());
    };
    let Ok(id) = RunId::new(&run) else {
        let (store, name) = (Arc::clone(store), format!("requests/{run}"));
        return blocking(move || store.delete_raw(&name)).await;
    };
    let request: Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            tracing::warn!(%run, error = %e, "a run request that does not parse: dropped");
            let (store, name) = (Arc::clone(store), format!("requests/{run}"));
            return blocking(move || store.delete_raw(&name)).await;
        }
    };
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
        ))) if other == id => write_outcome(store, &id, "committed", None).await,
        Err(e) => {
            tracing::info!(%run, error = %e, "requested run not committed yet (tried again)");
            Ok(())
        }
    }
}
