//! The signals `watch` and `run` act on: SIGHUP reloads (the registry,
//! the pools, the cluster keys), SIGINT and SIGTERM stop.

use std::path::Path;

use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::live::{LiveError, Orchestrator};

use super::commit::AbortOnDrop;

/// A replica's SIGHUP (`hangup`), for as long as the returned guard
/// lives: `path` read again, the keys of `keys`' SWIM member reloaded
/// (without a member, a replica whose term starts its own, they are
/// read at its next term), and what was read left in `reloads` for the
/// replica's next term. A file that does not load changes nothing.
pub(crate) fn reload_on_hangup(
    keys: Option<crate::live::orchestrator::SwimKeys>,
    reloads: crate::ha::replica::Reloads,
    path: &Path,
    mut hangup: tokio::signal::unix::Signal,
) -> AbortOnDrop {
    let path = path.to_path_buf();
    AbortOnDrop(actix::spawn(async move {
        while hangup.recv().await.is_some() {
            let config = match Config::load(&path) {
                Ok(config) => config,
                Err(e) => {
                    tracing::warn!(config = %path.display(), error = %e, "configuration not read again; keeping the running one");
                    continue;
                }
            };
            match &keys {
                Some(keys) => match keys.reload(&config.swim) {
                    Ok(()) => tracing::info!("cluster keys read again"),
                    Err(e) => tracing::warn!(error = %e, "cluster keys not read again; keeping the old ones"),
                },
                None => tracing::info!("SIGHUP: this replica runs no SWIM member between terms; its next term reads the keys again"),
            }
            tracing::info!("SIGHUP among replicas: the leader applies [registry] and writes it for every replica, and each replica's next term starts from its file as read now (its registry only where the replicas share none)");
            reloads.put(config);
        }
    }))
}

/// SIGHUP on an orchestrator: `path` read again, and what changed in its
/// registry, pool and cluster keys applied ([`Orchestrator::reload`]),
/// each change said; a file that does not load changes nothing.
pub(crate) async fn reload(live: &Orchestrator, path: &Path) {
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

/// Resolves at the first SIGINT or SIGTERM, with its number.
pub(crate) fn stop_signal() -> Result<impl std::future::Future<Output = i32>, LiveError> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        let taken = tokio::select! {
            _ = terminate.recv() => nix::sys::signal::Signal::SIGTERM as i32,
            _ = interrupt.recv() => nix::sys::signal::Signal::SIGINT as i32,
        };
        crate::cli::notify::notify(crate::cli::notify::STOPPING);
        taken
    })
}
