//! `poolgate node`: the agent daemon on every candidate node (SPEC §7).
//!
//! It joins SWIM through the seeds (and joins again whenever it knows no
//! other member, like `serf agent -retry-join`), then keeps the
//! orchestrator's agent listener told of its whole state: `NodeAvailable`,
//! its identity material, its SWIM address, its fault. It sends the state
//! on connecting and on every change, each frame signed, with a sequence
//! that starts from its boot time so it exceeds everything an earlier life
//! sent; it reconnects with backoff (100 ms doubling to 5 s) and sends its
//! whole state again.
//!
//! - `health_check` (argv) runs every `health_interval`: exit 0 keeps the
//!   node available (and clears a fault); otherwise the node is faulted
//!   with the check's last stderr line as reason.
//! - SIGHUP re-reads the identity file (a new fingerprint is an identity
//!   change at the orchestrator) and the cluster keys named in `node.toml`
//!   (key rotation).
//! - SIGTERM (or SIGINT) announces that the node is unavailable and
//!   leaving, leaves SWIM and returns, so the orchestrator reports `left`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use super::keys::NodeKey;
use super::orchestrator::keyring;
use super::swim::member::{boot_generation, Join, Leave, MemberCount, SetKeyring};
use super::swim::SwimMember;
use super::wire::{self, Announcement};
use super::LiveError;
use crate::config::NodeConfig;
use poolgate_actors::core::MAX_IDENTITY_BYTES;

/// How long a leaving node waits for its last frame and its SWIM leave to
/// go out before it exits.
const LEAVE_GRACE: Duration = Duration::from_millis(500);

/// Runs the agent until SIGTERM or SIGINT; `path` is its `node.toml`,
/// read again on SIGHUP. Must be called inside a running actix `System`.
pub async fn run(config: NodeConfig, path: &Path) -> Result<(), LiveError> {
    let key = NodeKey::load(&config.signing_key)?;
    let identity = read_identity(&config.identity)?;
    let ring = keyring(&config.swim)?;
    let generation = boot_generation();
    let (swim, swim_addr) = SwimMember::start(
        config.name.as_str(),
        config.swim.bind,
        generation,
        config.swim.timings.foca_config(16),
        StdRng::seed_from_u64(rand::random()),
        None,
        ring,
    )
    .map_err(LiveError::Bind)?;
    tracing::info!(node = %config.name, %swim_addr, "node agent started");
    actix::spawn(keep_joined(swim.clone(), config.swim.seeds.clone()));

    let (state, updates) = watch::channel(Announcement {
        available: config.health_check.is_none(),
        identity: Some(wire::identity_text(&identity)),
        swim: Some(swim_addr),
        fault: None,
        leaving: false,
    });
    let state = Arc::new(state);
    let sent = Arc::new(AtomicU64::new(0));
    actix::spawn(announce(
        AnnounceTo {
            orchestrator: config.orchestrator,
            key,
            label: config.swim.label.clone(),
            node: config.name.to_string(),
            generation,
        },
        updates,
        Arc::clone(&sent),
    ));
    if let Some(argv) = config.health_check.clone() {
        actix::spawn(health(argv, config.health_interval, Arc::clone(&state)));
    }

    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                match read_identity(&config.identity) {
                    Ok(bytes) => {
                        let text = wire::identity_text(&bytes);
                        state.send_if_modified(|s| replace(&mut s.identity, Some(text)));
                        tracing::info!(node = %config.name, "identity file read again");
                    }
                    Err(e) => tracing::warn!(node = %config.name, error = %e, "identity file not read again; keeping the old one"),
                }
                // The gossip keyring too, from node.toml (key rotation).
                match NodeConfig::load(path).map_err(LiveError::from).and_then(|c| keyring(&c.swim)) {
                    Ok(ring) => swim.do_send(SetKeyring { keyring: ring }),
                    Err(e) => tracing::warn!(node = %config.name, error = %e, "cluster keys not read again; keeping the old ones"),
                }
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    tracing::info!(node = %config.name, "leaving");
    let before = sent.load(Ordering::Relaxed);
    state.send_modify(|s| {
        s.available = false;
        s.leaving = true;
    });
    let deadline = tokio::time::Instant::now() + LEAVE_GRACE;
    while sent.load(Ordering::Relaxed) == before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The Leave handler gossips the leave, then stops the member.
    let _ = swim.send(Leave).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

fn replace<T: PartialEq>(slot: &mut T, value: T) -> bool {
    if *slot == value {
        return false;
    }
    *slot = value;
    true
}

/// Reads the identity material file: 1 byte to 16 KiB.
pub fn read_identity(path: &Path) -> Result<Vec<u8>, LiveError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| LiveError::Identity {
        file: file.clone(),
        message: e.to_string(),
    })?;
    if bytes.is_empty() || bytes.len() > MAX_IDENTITY_BYTES {
        return Err(LiveError::Identity {
            file,
            message: format!(
                "identity material is {} bytes; it must be 1 to {MAX_IDENTITY_BYTES}",
                bytes.len()
            ),
        });
    }
    Ok(bytes)
}

/// Announces to the seeds whenever this member knows no other.
async fn keep_joined(swim: Addr<SwimMember>, seeds: Vec<SocketAddr>) {
    if seeds.is_empty() {
        return;
    }
    loop {
        match swim.send(MemberCount).await {
            Ok(0) => swim.do_send(Join {
                seeds: seeds.clone(),
            }),
            Ok(_) => {}
            Err(_) => return,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

struct AnnounceTo {
    orchestrator: SocketAddr,
    key: NodeKey,
    label: String,
    node: String,
    generation: u64,
}

/// Keeps the orchestrator told: the whole state on connecting and on every
/// change; reconnects with backoff when the connection drops.
async fn announce(
    to: AnnounceTo,
    mut updates: watch::Receiver<Announcement>,
    sent: Arc<AtomicU64>,
) {
    let mut counter: u64 = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        match TcpStream::connect(to.orchestrator).await {
            Ok(mut stream) => {
                tracing::info!(node = %to.node, orchestrator = %to.orchestrator, "connected to the orchestrator");
                backoff = Duration::from_millis(100);
                let mut scratch = [0u8; 64];
                loop {
                    let state = updates.borrow_and_update().clone();
                    counter += 1;
                    // Boot time in the high bits: a restarted node's
                    // sequences exceed everything its earlier life sent.
                    let seq = (to.generation << 20) | (counter & 0xF_FFFF);
                    let frame = wire::encode(&to.key, &to.label, &to.node, seq, &state);
                    if stream.write_all(&frame).await.is_err() {
                        break;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        changed = updates.changed() => if changed.is_err() { return },
                        // The orchestrator sends nothing: a read returns
                        // only when the connection closed.
                        _ = stream.read(&mut scratch) => break,
                    }
                }
                tracing::info!(node = %to.node, "connection to the orchestrator lost; reconnecting");
            }
            Err(e) => {
                tracing::debug!(node = %to.node, error = %e, "orchestrator not reachable")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Runs the health check every `interval`.
async fn health(argv: Vec<String>, interval: Duration, state: Arc<watch::Sender<Announcement>>) {
    loop {
        let verdict = check(&argv, interval).await;
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

/// One run of the health check: `Err` with the reason on failure.
async fn check(argv: &[String], limit: Duration) -> Result<(), String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty health check".into());
    };
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, run).await {
        Err(_) => Err(format!("health check did not finish within {limit:?}")),
        Ok(Err(e)) => Err(format!("health check cannot run: {e}")),
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
            Err(match last {
                Some(line) => line.trim().to_string(),
                None => format!("health check failed ({})", output.status),
            })
        }
    }
}
