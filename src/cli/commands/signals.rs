//! The signals `watch` and `run` act on: SIGHUP reloads (the registry,
//! the pools, the cluster keys), SIGINT and SIGTERM stop.

use std::path::Path;

use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::live::{LiveError, Orchestrator};

use super::commit::AbortOnDrop;

/// Reloads the keys of `keys`' SWIM member from `path` at each SIGHUP
/// (`hangup`), for as long as the returned guard lives; without a member
/// (a replica whose term starts its own) the signal is only taken.
pub(crate) fn reload_on_hangup(
    keys: Option<crate::live::orchestrator::SwimKeys>,
    path: &Path,
    mut hangup: tokio::signal::unix::Signal,
) -> AbortOnDrop {
    let path = path.to_path_buf();
    AbortOnDrop(actix::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::info!("SIGHUP among replicas: the leader applies [registry] and writes it for every replica; a follower's file counts only while nothing is written (each term starts from the registry the replicas share)");
            match &keys {
                Some(keys) => reload_keys(|swim| keys.reload(swim), &path),
                None => tracing::warn!("SIGHUP: this replica runs no SWIM member between terms; its next term reads the keys it started with"),
            }
        }
    }))
}

/// SIGHUP: the cluster keys of `[swim]`, read again from the config file
/// (key rotation).
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

pub(crate) fn reload_keys(
    reload: impl Fn(&crate::config::SwimConfig) -> Result<(), LiveError>,
    path: &Path,
) {
    let reloaded = Config::load(path)
        .map_err(LiveError::from)
        .and_then(|config| reload(&config.swim));
    match reloaded {
        Ok(()) => tracing::info!("cluster keys read again"),
        Err(e) => tracing::warn!(error = %e, "cluster keys not read again; keeping the old ones"),
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
