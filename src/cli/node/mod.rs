//! `poolgate node`: the agent daemon on every candidate node (design §7).
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
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use super::guard;
use crate::config::endpoint::{lookup_all, Endpoint};
use crate::config::{NodeConfig, HEARTBEATS_MISSED};
use crate::live::generation::{unix_ms, GenerationFile, Sequences};
use crate::live::keys::NodeKey;
use crate::live::swim::keyring;
use crate::live::swim::member::{
    Join, JoinAgain, Leave, MemberCount, Renew, SetKeyring, SetVouching, Vouched, Vouching,
};
use crate::live::swim::SwimIdentity;
use crate::live::swim::SwimMember;
use crate::live::throttle::{Throttle, Throttles, LOG_EVERY};
use crate::live::wire::{self, Announcement, Reply};
use crate::live::LiveError;
use poolgate_actors::core::MAX_IDENTITY_BYTES;

/// How long a leaving node waits for its last frame and its SWIM leave to
/// go out before it exits.
const LEAVE_GRACE: Duration = Duration::from_millis(500);

/// Runs the agent until SIGTERM or SIGINT; `path` is its `node.toml`,
/// read again on SIGHUP; with `metrics`, serves its metrics, health and
/// status there (`--metrics`, [`super::health`]). Must be called inside
/// a running actix `System`.
pub async fn run(
    config: NodeConfig,
    path: &Path,
    metrics: Option<SocketAddr>,
) -> Result<(), LiveError> {
    // First: a SIGTERM from the moment the agent runs is a graceful stop,
    // never the signal's default action.
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let link = super::health::NodeLink::new(config.name.as_str());
    if let Some(addr) = metrics {
        super::health::serve(addr, super::health::Face::Node(Arc::clone(&link)))?;
        // Exported from the start, not first when held off.
        link.held_off(false);
    }
    let key = NodeKey::load(&config.signing_key)?;
    let identity = read_identity(&config.identity)?;
    let ring = keyring(&config.swim)?;
    // One life for this process, above every earlier one whatever the
    // clock says: the SWIM generation and the sequences' high bits.
    let generations = match &config.generation_file {
        Some(path) => GenerationFile::new(path.clone()),
        None => GenerationFile::beside(&config.signing_key),
    };
    let generation = generations.next(unix_ms())?;
    let (swim, swim_addr) = SwimMember::start(
        config.name.as_str(),
        config.swim.bind,
        config.swim.advertise.as_ref(),
        generation,
        config.swim.timings.foca_config(16),
        StdRng::seed_from_u64(rand::random()),
        None,
        ring,
    )?;
    tracing::info!(node = %config.name, %swim_addr, generation, "node agent started");
    super::notify::notify(super::notify::READY);
    actix::spawn(keep_joined(swim.clone(), config.swim.seeds.clone()));

    let (state, updates) = watch::channel(Announcement {
        available: config.health_check.is_none(),
        identity: Some(wire::identity_text(&identity)),
        swim: Some(swim_addr),
        generation: Some(generation),
        fault: None,
        leaving: false,
        heartbeat_ms: u64::try_from(config.heartbeat.as_millis()).ok(),
        ask: None,
    });
    let state = Arc::new(state);
    // The identity the node signs follows foca's renewals (a node declared
    // down rejoins under generation + 1).
    let (own, mut renewed) = watch::channel(generation);
    swim.do_send(crate::live::swim::member::WatchGeneration(own));
    {
        let state = Arc::clone(&state);
        actix::spawn(async move {
            while renewed.changed().await.is_ok() {
                let generation = *renewed.borrow_and_update();
                state.send_if_modified(|s| {
                    let changed = s.generation != Some(generation);
                    s.generation = Some(generation);
                    changed
                });
            }
        });
    }
    let sent = Arc::new(AtomicU64::new(0));
    let connected = Arc::clone(&link);
    // The member asks the orchestrator about members it probes in vain.
    let (asking, asks) = tokio::sync::mpsc::channel(ASKS_QUEUED);
    swim.do_send(SetVouching(Vouching::Orchestrator(asking)));
    actix::spawn(announce(
        AnnounceTo {
            agents: config.agents.clone(),
            key,
            label: config.swim.label.clone(),
            node: config.name.to_string(),
            sequences: Sequences::new(generations, generation),
            heartbeat: config.heartbeat,
            swim: swim.clone(),
            seeds: config.swim.seeds.clone(),
            link: Arc::clone(&link),
            asks,
        },
        updates,
        Arc::clone(&sent),
    ));
    if let Some(argv) = config.health_check.clone() {
        actix::spawn(health(
            config.name.to_string(),
            argv,
            config.health_interval,
            Arc::clone(&state),
        ));
    }

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
    super::notify::notify(super::notify::STOPPING);
    let before = sent.load(Ordering::Relaxed);
    state.send_modify(|s| {
        s.available = false;
        s.leaving = true;
    });
    if connected.orchestrator().is_some() {
        tracing::info!(node = %config.name, "leaving");
        let deadline = tokio::time::Instant::now() + LEAVE_GRACE;
        while sent.load(Ordering::Relaxed) == before && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    } else {
        // Not connected (no orchestrator reachable, or refused): no frame
        // goes out, and waiting for one only held the restart that
        // follows (an operator's trial: the next process could not bind
        // the metrics port yet).
        tracing::info!(node = %config.name, "leaving; no orchestrator connection is up, so no leaving frame is waited for");
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
async fn keep_joined(swim: Addr<SwimMember>, seeds: Vec<Endpoint>) {
    if seeds.is_empty() {
        return;
    }
    let mut said = Throttle::new(LOG_EVERY);
    loop {
        match swim.send(MemberCount).await {
            Ok(0) => join(&swim, &seeds, &mut said, false).await,
            Ok(_) => {}
            Err(_) => return,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Announces to the seeds, resolved now (a name that does not resolve is
/// said at most once per interval). `again`: the node is back from an
/// absence (its orchestrator lost: this process stalled, or its host cut
/// off), and refutes first whatever suspicion of it was raised meanwhile
/// ([`JoinAgain`]).
async fn join(swim: &Addr<SwimMember>, seeds: &[Endpoint], said: &mut Throttle, again: bool) {
    let (addrs, failed) = lookup_all(seeds).await;
    if !failed.is_empty() {
        if let Some(held) = said.allow(std::time::Instant::now()) {
            tracing::warn!(?failed, held, "swim.seeds: not resolved");
        }
    }
    if again {
        swim.do_send(JoinAgain { seeds: addrs });
    } else {
        swim.do_send(Join { seeds: addrs });
    }
}

mod check;
mod rotation;
mod session;

use check::health;
pub use check::STDERR_TAIL;
use session::{announce, AnnounceTo, ASKS_QUEUED};
