//! The control socket's server side: `watch` binds it and serves each
//! connection (a status, a run guarded from its commit to its end, an end
//! or a resume of a run nobody guards).

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::RunId;
use poolgate_actors::Fleet;
use tokio::io::BufReader;
use tokio::net::{UnixListener, UnixStream};

use super::runs::{
    guard, guarded_by_another, not_active_in_any, pool_gate, refused, serve_run, Asked, Orphans,
};
use super::{read_line, send, Reply, Request, FIRST_LINE, MAX_CONNECTIONS, MAX_LINE};
use crate::live::LiveError;

/// The socket bound at its path, removed when dropped.
pub struct Bound {
    listener: UnixListener,
    path: PathBuf,
}

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether an orchestrator serves the control socket at `path` now (it
/// accepts a connection): a file left by one that is gone is not served.
pub fn is_served(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Binds the control socket at `path`, mode 0600 from the start (bound
/// under a temporary name, then renamed). A socket file nobody answers
/// on (a `watch` that crashed) is replaced; one that answers is another
/// orchestrator's: an error.
pub async fn bind(path: &Path) -> Result<Bound, LiveError> {
    use std::os::unix::fs::PermissionsExt;
    let taken = |detail: String| LiveError::Setting {
        key: "control.socket",
        message: detail,
    };
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !metadata.file_type().is_socket() {
            return Err(taken(format!(
                "{} exists and is not a socket: not replaced",
                path.display()
            )));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(taken(format!(
                "{} is served by another orchestrator",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|e| {
            taken(format!(
                "{}: a stale socket not removed: {e}",
                path.display()
            ))
        })?;
    }
    let temporary = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)
        .map_err(|e| taken(format!("cannot bind {}: {e}", path.display())))?;
    let mut bound = Bound {
        listener,
        path: temporary.clone(),
    };
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| taken(format!("{}: {e}", temporary.display())))?;
    std::fs::rename(&temporary, path)
        .map_err(|e| taken(format!("cannot place {}: {e}", path.display())))?;
    bound.path = path.to_path_buf();
    Ok(bound)
}

/// Serves `bound` for `fleet` until the task is aborted; `leader` is what
/// the status answer says of who leads.
pub async fn serve(bound: Bound, fleet: Fleet, leader: std::sync::Arc<str>) {
    let room = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let orphans = Orphans::default();
    // The connections that have not asked yet, oldest first: when the room
    // is full, the oldest of them makes way (one that asked is a run's
    // requester, or gets its answer at once).
    let unasked: Unasked = std::sync::Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let mut next = 0u64;
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((stream, _)) = bound.listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let turn = match std::sync::Arc::clone(&room).try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => {
                let oldest = lock_unasked(&unasked).pop_front();
                let Some((_, evicted)) = oldest else {
                    metrics::counter!("poolgate_control_refused_total").increment(1);
                    continue;
                };
                evicted.abort();
                metrics::counter!("poolgate_control_evicted_total").increment(1);
                // The aborted task gives its place back as it is dropped.
                let Ok(turn) = std::sync::Arc::clone(&room).acquire_owned().await else {
                    continue;
                };
                turn
            }
        };
        next += 1;
        let id = next;
        let (fleet, leader) = (fleet.clone(), std::sync::Arc::clone(&leader));
        let (orphans, asked) = (orphans.clone(), std::sync::Arc::clone(&unasked));
        let handle = connections.spawn_local(async move {
            let _turn = turn;
            connection(stream, fleet, &leader, &orphans, || {
                lock_unasked(&asked).retain(|(each, _)| *each != id)
            })
            .await;
            lock_unasked(&asked).retain(|(each, _)| *each != id);
        });
        lock_unasked(&unasked).push_back((id, handle));
    }
}

/// The connections that have not sent their request yet, oldest first.
type Unasked =
    std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>>;

fn lock_unasked(
    unasked: &Unasked,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, tokio::task::AbortHandle)>> {
    unasked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn connection(
    stream: UnixStream,
    fleet: Fleet,
    leader: &str,
    orphans: &Orphans,
    asked: impl FnOnce(),
) {
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    // A connection that asks nothing in time is closed: idle ones cannot
    // hold the room every `run` needs.
    let line = match tokio::time::timeout(FIRST_LINE, read_line(&mut reader)).await {
        Ok(Some(line)) => {
            asked();
            line
        }
        Ok(None) => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: format!("not a request: a line of UTF-8 up to {MAX_LINE} bytes"),
            };
            send(&mut writer, &refused).await;
            return;
        }
        Err(_) => {
            metrics::counter!("poolgate_control_idle_closed_total").increment(1);
            return;
        }
    };
    let request = match serde_json::from_str::<Request>(&line) {
        Ok(request) => request,
        Err(e) => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: format!("not a control request: {e}"),
            };
            send(&mut writer, &refused).await;
            return;
        }
    };
    match request {
        Request::Status { pool, .. } => {
            let Ok(reports) = fleet.reports().await else {
                return;
            };
            let status = crate::live::status::answer_all(
                &reports,
                pool.as_deref(),
                fleet.clock().now(),
                leader,
                !fleet.writes_failing(),
            );
            send(&mut writer, &Reply::Status { status }).await;
        }
        Request::Run {
            pool,
            run,
            required,
            ..
        } => {
            let asked = Asked {
                pool,
                run,
                required,
            };
            let served = serve_run(&fleet, asked, orphans, &mut reader, &mut writer).await;
            if let Err(refused) = served {
                send(&mut writer, &refused).await;
            }
        }
        Request::End { pool, run, .. } => {
            let ended = async {
                let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
                // Several pools and none named: the pool whose run it is.
                let gate = match pool {
                    None if fleet.pools().len() > 1 => fleet
                        .pool_running(&run)
                        .await
                        .map_err(|e| refused(&e))?
                        .ok_or_else(|| Reply::Refused {
                            code: "unknown_run".into(),
                            detail: not_active_in_any(&fleet.pools()),
                        })?,
                    pool => pool_gate(&fleet, pool)?,
                };
                let pool = gate.report().await.map_err(|e| refused(&e))?.pool;
                if orphans.is_guarded(&pool, &run) {
                    return Err(guarded_by_another(&run));
                }
                gate.finish_run(run).await.map_err(|e| refused(&e))
            };
            let reply = match ended.await {
                Ok(()) => Reply::Ended {
                    status: "finished".into(),
                    node: None,
                    reason: None,
                },
                Err(refusal) => refusal,
            };
            send(&mut writer, &reply).await;
        }
        Request::Resume { pool, run, .. } => {
            let resumed = async {
                let gate = pool_gate(&fleet, pool)?;
                let run = RunId::new(&run).map_err(|e| refused(&e.into()))?;
                let report = gate.report().await.map_err(|e| refused(&e))?;
                if report.run.as_ref() != Some(&run)
                    || fleet.committed_run(&report.pool).as_ref() != Some(&run)
                {
                    let active = report.run.map_or("none".to_string(), |r| r.to_string());
                    return Err(Reply::Refused {
                        code: "unknown_run".into(),
                        detail: format!(
                            "run {run} is not the pool's committed run (the active run: {active})"
                        ),
                    });
                }
                let epoch = match report.phase {
                    poolgate_actors::core::PoolPhase::Ready { epoch } => epoch.0,
                    _ => 0,
                };
                // Its own requester, if it has one, guards it: not taken.
                let guarding = orphans
                    .guarding(&report.pool, &run)
                    .ok_or_else(|| guarded_by_another(&run))?;
                Ok((gate, run, epoch, guarding))
            };
            match resumed.await {
                Ok((gate, run, epoch, _guarding)) => {
                    let events = gate.subscribe_from_now();
                    guard(&gate, run, epoch, events, &mut reader, &mut writer).await;
                }
                Err(refusal) => {
                    send(&mut writer, &refusal).await;
                }
            }
        }
        Request::Finish => {
            let refused = Reply::Refused {
                code: "bad_request".into(),
                detail: "finish names no run: send it on the run's own connection".into(),
            };
            send(&mut writer, &refused).await;
        }
    }
}
