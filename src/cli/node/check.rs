//! The node's health check: its argv run every interval, its verdict
//! (and the last line of its stderr) the node's fault.

use super::*;

/// Runs the health check every `interval`; a new verdict is logged (a
/// failing check at warn, so a missing program is seen).
pub(super) async fn health(
    node: String,
    argv: Vec<String>,
    interval: Duration,
    state: Arc<watch::Sender<Announcement>>,
) {
    let mut last: Option<Result<(), String>> = None;
    loop {
        let verdict = check(&argv, interval).await;
        metrics::gauge!("poolgate_health_check_passing").set(if verdict.is_ok() {
            1.0
        } else {
            0.0
        });
        if last.as_ref() != Some(&verdict) {
            match &verdict {
                Ok(()) => tracing::info!(%node, "health check passes"),
                Err(reason) => {
                    tracing::warn!(%node, %reason, "health check fails: the node is faulted")
                }
            }
            last = Some(verdict.clone());
        }
        state.send_if_modified(|s| {
            let (available, fault) = match &verdict {
                Ok(()) => (!s.leaving, None),
                Err(reason) => (false, Some(reason.clone())),
            };
            let changed = s.available != available || s.fault != fault;
            s.available = available;
            s.fault = fault;
            changed
        });
        tokio::time::sleep(interval).await;
    }
}

/// How much of a health check's stderr is kept: its end, where the last
/// line is (the reason is cut to 1 KiB anyway, design §5).
pub const STDERR_TAIL: usize = 4 * 1024;

/// How long a hung health check has between SIGTERM and SIGKILL.
const CHECK_GRACE: Duration = Duration::from_millis(500);

/// One run of the health check: `Err` with the reason on failure. The
/// check runs in a process group of its own, stopped whole if it does not
/// finish within `limit`; its stderr is read through a bounded tail.
async fn check(argv: &[String], limit: Duration) -> Result<(), String> {
    let Some(program) = argv.first() else {
        return Err("empty health check".into());
    };
    let mut child = match guard::Guarded::spawn(argv, guard::Streams::StderrOnly, CHECK_GRACE, None)
    {
        Ok(child) => child,
        Err(e) => return Err(format!("health check `{program}` cannot run: {e}")),
    };
    let stderr = child.stderr();
    let run = async {
        let (tail, status) = tokio::join!(tail(stderr, STDERR_TAIL), child.wait());
        (tail, status)
    };
    let outcome = tokio::time::timeout(limit, run).await;
    let (tail, status) = match outcome {
        Err(_) => {
            if let Err(left) = child.stop().await {
                tracing::warn!(error = %left, "a health check was not stopped");
            }
            return Err(format!("health check did not finish within {limit:?}"));
        }
        Ok(done) => done,
    };
    match status {
        Err(e) => Err(format!("health check `{program}` cannot run: {e}")),
        Ok(status) if status.success() => Ok(()),
        // The keeper's own words when it could not start the program.
        Ok(status) => {
            let text = String::from_utf8_lossy(&tail);
            let last = text.lines().rev().find(|l| !l.trim().is_empty());
            Err(match last {
                Some(line) => poolgate_actors::core::FaultReason::new(line.trim()).into_string(),
                None => format!("health check failed ({status})"),
            })
        }
    }
}

/// Reads `from` to its end, keeping only the last `keep` bytes.
async fn tail(from: Option<tokio::process::ChildStderr>, keep: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let Some(mut from) = from else {
        return Vec::new();
    };
    let mut kept: std::collections::VecDeque<u8> = std::collections::VecDeque::with_capacity(keep);
    let mut buffer = [0u8; 4096];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        kept.extend(&buffer[..n]);
        let over = kept.len().saturating_sub(keep);
        kept.drain(..over);
    }
    kept.into()
}
