//! The requester's side: a run asked through etcd, its session kept
//! alive, and what became of it read back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use poolgate_actors::core::{NodeId, PoolId, RunId};
use poolgate_actors::StoreError;

use crate::state::etcd::EtcdStore;

use super::{apart, leader_published, leader_said, Published, Request, RunOutcome, RunStanding};

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
    /// renewed for half its TTL (renewals go every tenth of it) while
    /// renewing fails or hangs. It can then expire, and the leader end
    /// the run, once the TTL has passed since the last renewal: half the
    /// TTL from now at the earliest. A process paused past half the
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
pub(super) struct Renewals {
    /// When the last renewal that etcd took was sent (the lease runs for
    /// at least its TTL from then).
    sent: std::time::Instant,
    /// Since when renewing has been tried and has not gone through (a
    /// call in flight, or failing), if it is.
    trying_since: Option<std::time::Instant>,
}

/// How long renewing may be tried without going through before the
/// lease counts as at risk (a renewal takes milliseconds).
pub(super) const TROUBLED_AFTER: Duration = Duration::from_millis(300);

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
            apart(move || etcd.grant(ttl).map_err(|e| StoreError(e.to_string()))).await?;
        let alive = self.store.key(&format!("alive/{run}"));
        let session = keep(Arc::clone(self.store.etcd()), lease, granted, alive);
        let body = serde_json::to_vec(&Request {
            pool: pool.map(|p| p.to_string()),
            required: required.to_vec(),
            lease,
        })
        .map_err(|e| StoreError(e.to_string()))?;
        let (store, run) = (Arc::clone(&self.store), run.clone());
        // Both at once: a leader never sees one without the other.
        apart(move || {
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
        apart(move || {
            store.delete_raw(&format!("requests/{run}"))?;
            store.delete_raw(&format!("waiting/{run}"))?;
            store.put_raw(&format!("finish/{run}"), b"{}", 0)
        })
        .await
    }

    /// What the leader last said `run`, asked for and not committed yet,
    /// waits for (`waiting/<run>`: a node another pool's run holds, say).
    pub async fn waits(&self, run: &RunId) -> Option<String> {
        let (store, run) = (Arc::clone(&self.store), run.clone());
        let said = apart(move || store.get_raw(&format!("waiting/{run}")))
            .await
            .ok()??;
        Some(String::from_utf8_lossy(&said).into_owned())
    }

    /// Asks the leader to end `run` (its command ended).
    pub async fn finish(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("finish/{run}"));
        apart(move || store.put_raw(&name, b"{}", 0)).await
    }

    /// Whether the leader has yet to take up the end of `run`.
    pub async fn finish_pending(&self, run: &RunId) -> Result<bool, StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("finish/{run}"));
        Ok(apart(move || store.get_raw(&name)).await?.is_some())
    }

    /// What became of `run`, if anything yet.
    pub async fn outcome(&self, run: &RunId) -> Result<Option<RunOutcome>, StoreError> {
        let (store, name) = (Arc::clone(&self.store), format!("runs/{run}"));
        let raw = apart(move || store.get_raw(&name)).await?;
        raw.map(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|e| StoreError(format!("runs/{run}: damaged ({e})")))
        })
        .transpose()
    }

    /// Forgets what became of `run` (read to its end by its requester).
    pub async fn forget(&self, run: &RunId) -> Result<(), StoreError> {
        let (store, run) = (Arc::clone(&self.store), run.clone());
        apart(move || {
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
            apart(move || store.standing(&name).map_err(|e| StoreError(e.to_string()))).await?;
        let outcome = standing
            .outcome
            .map(|bytes| {
                serde_json::from_slice::<RunOutcome>(&bytes)
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
            apart(move || store.read().map_err(|e| StoreError(e.to_string()))).await?;
        Ok(durable.run.map(|run| run.run))
    }

    /// What is left of `lease` and its TTL (see
    /// [`EtcdStore::lease_left`]).
    pub async fn lease_left(&self, lease: i64) -> Result<Option<(Duration, Duration)>, StoreError> {
        let store = Arc::clone(&self.store);
        apart(move || store.lease_left(lease)).await
    }

    /// What a leader last published of the pool, and by whom (see
    /// [`leader_published`]).
    pub async fn leader_published(&self) -> Result<Option<Published>, StoreError> {
        leader_published(Arc::clone(&self.store)).await
    }

    /// Since when what etcd says is left of a lease may be etcd's doing,
    /// not its holder's, as this process saw (see
    /// [`crate::ha::etcd::Etcd::leases_in_doubt_since`]).
    pub fn leases_in_doubt_since(&self) -> Option<std::time::Instant> {
        self.store.etcd().leases_in_doubt_since()
    }

    /// What the leader last published of the pool (see [`leader_said`]).
    pub async fn leader_said(&self) -> Result<Option<serde_json::Value>, StoreError> {
        leader_said(Arc::clone(&self.store)).await
    }

    /// Gives `run` up (not committed in the requester's time): reads what
    /// tells why, then leaves ([`Requests::leave`]), each step within
    /// `within` whatever etcd does (`None`: not read in time), so that a
    /// requester whose etcd answers nothing still says so and exits.
    pub async fn give_up(&self, run: &RunId, session: Session, within: Duration) -> GaveUp {
        let by = tokio::time::Instant::now() + within;
        // Read first: what the leader said the run waits for goes with
        // the request.
        let (waits, active, said) = tokio::join!(
            tokio::time::timeout_at(by, self.waits(run)),
            tokio::time::timeout_at(by, self.active_run()),
            tokio::time::timeout_at(by, self.leader_said()),
        );
        self.leave(run, session, within).await;
        GaveUp {
            waits: waits.ok().flatten(),
            active: active.ok().and_then(Result::ok),
            said: said.ok().and_then(Result::ok),
        }
    }

    /// Withdraws `run` and ends `session` (its lease revoked), within
    /// `within` whatever etcd does; whether the request was withdrawn
    /// (else it goes with the session's lease, once that expires: said).
    pub async fn leave(&self, run: &RunId, session: Session, within: Duration) -> bool {
        // The session ends on a thread of its own, begun at once: its end
        // revokes its lease (the leader sees the requester gone at once)
        // and waits on etcd, which must not hold this thread.
        let (ended, ending) = tokio::sync::oneshot::channel::<()>();
        let _ = std::thread::Builder::new()
            .name("poolgate-run-session-end".into())
            .spawn(move || {
                drop(session);
                let _ = ended.send(());
            });
        let by = tokio::time::Instant::now() + within;
        let (withdrawn, _) = tokio::join!(
            tokio::time::timeout_at(by, self.withdraw(run)),
            tokio::time::timeout_at(by, ending),
        );
        let withdrawn = matches!(withdrawn, Ok(Ok(())));
        if !withdrawn {
            tracing::warn!(%run, "the request could not be withdrawn (etcd did not answer): it goes once this process's etcd session expires ([run] unguarded_after)");
        }
        withdrawn
    }
}

/// What a requester giving up its run could read of why
/// ([`Requests::give_up`]).
#[derive(Debug)]
pub struct GaveUp {
    /// What the leader said the run waits for, if it said.
    pub waits: Option<String>,
    /// The pool's active run, `None` when unread; `Some(None)`: none.
    pub active: Option<Option<RunId>>,
    /// What the leader last published of the pool, `None` when unread;
    /// `Some(None)`: nothing.
    pub said: Option<Option<serde_json::Value>>,
}

/// Keeps `lease` alive (every tenth of its TTL, again 100 ms after a
/// failure, each call across every endpoint) until the session drops.
/// `on` is a key on the lease: a "gone" answer is believed once it is gone
/// too ([`crate::ha::etcd::Etcd::keep_alive_on`]).
pub(super) fn keep(
    etcd: Arc<crate::ha::etcd::Etcd>,
    lease: i64,
    ttl: Duration,
    on: Vec<u8>,
) -> Session {
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
            // Every tenth, as the leader's own lease: a renewal that
            // fails through an etcd election (up to about 4 s) leaves
            // most of the half-TTL before the session counts as at risk
            // (an operator's trial: renewing every third, 4 of 15 runs
            // stopped when etcd's leader was killed).
            let every = ttl / crate::ha::etcd::RENEWALS_PER_TTL;
            let mut next = std::time::Instant::now() + every;
            while !stopping.load(Ordering::Relaxed) {
                if std::time::Instant::now() >= next {
                    let sent = std::time::Instant::now();
                    if let Ok(mut renewals) = noting.lock() {
                        renewals.trying_since.get_or_insert(sent);
                    }
                    let renewed = etcd.keep_alive_on(lease, &on);
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
