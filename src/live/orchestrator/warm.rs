//! The orchestrator's SWIM member: started from `[swim]` for one
//! orchestrator, or kept warm by a replica across its terms.

use std::net::SocketAddr;

use actix::Addr;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::config::endpoint::lookup_all;
use crate::config::{Config, SwimConfig};
use crate::live::generation::{unix_ms, GenerationFile};
use crate::live::swim::keyring;
use crate::live::swim::member::{boot_generation, Join, SetKeyring};
use crate::live::swim::SwimMember;
use crate::live::LiveError;

/// A SWIM member started from `[swim]` ahead of any gate: a replica's,
/// kept warm while it follows and handed to each term's orchestrator.
/// It stops when dropped.
pub(crate) struct WarmSwim {
    pub(super) member: Addr<SwimMember>,
    pub(super) addr: SocketAddr,
}

impl WarmSwim {
    /// Starts `[swim]`'s member, reporting to nobody until a term's
    /// orchestrator takes it.
    pub(crate) async fn start(config: &Config) -> Result<WarmSwim, LiveError> {
        let (member, addr) = start_member(config, None).await?;
        Ok(WarmSwim { member, addr })
    }

    /// The UDP address it answers on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many other members it knows (none if it stopped).
    pub(crate) async fn members(&self) -> Option<usize> {
        self.member
            .send(crate::live::swim::member::MemberCount)
            .await
            .ok()
    }

    /// What reloads its gossip keyring.
    pub(crate) fn keys(&self) -> SwimKeys {
        SwimKeys(self.member.clone())
    }
}

/// Reloads a running SWIM member's gossip keyring (SIGHUP).
#[derive(Clone)]
pub struct SwimKeys(pub(super) Addr<SwimMember>);

impl SwimKeys {
    /// Replaces the keyring with `[swim]`'s keys as they are now.
    pub fn reload(&self, swim: &SwimConfig) -> Result<(), LiveError> {
        self.0.do_send(SetKeyring {
            keyring: keyring(swim)?,
        });
        Ok(())
    }
}

impl std::fmt::Debug for SwimKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwimKeys")
    }
}

impl std::fmt::Debug for WarmSwim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmSwim")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for WarmSwim {
    fn drop(&mut self) {
        self.member.do_send(crate::live::swim::member::Crash);
    }
}

/// Starts `[swim]`'s member (its keys, timings, generation; only the
/// registry's names kept; joined to the seeds), feeding `attach`'s gate.
pub(super) async fn start_member(
    config: &Config,
    attach: Option<crate::live::swim::member::Attach>,
) -> Result<(Addr<SwimMember>, SocketAddr), LiveError> {
    let keyring = keyring(&config.swim)?;
    let cluster_size = u32::try_from(config.registry.len() + 1).unwrap_or(u32::MAX);
    // With a state file, the orchestrator's SWIM generation rises
    // across restarts whatever the clock does, as a node's does.
    let generation = match &config.state.path {
        Some(path) => GenerationFile::beside(path).next(unix_ms())?,
        None => boot_generation(),
    };
    let foca_config = config.swim.timings.foca_config(cluster_size);
    let (member, addr) = until_free(|| {
        SwimMember::start(
            crate::live::swim::member::ORCHESTRATOR,
            config.swim.bind,
            config.swim.advertise.as_ref(),
            generation,
            foca_config.clone(),
            StdRng::seed_from_u64(rand::random()),
            None,
            keyring.clone(),
        )
    })
    .await?;
    // Facts about names outside the registry could never count: not kept.
    member.do_send(crate::live::swim::member::OnlyMembers(
        config.registry.keys().map(|n| n.to_string()).collect(),
    ));
    match attach {
        Some(attach) => member.do_send(attach),
        // A replica's member while it follows accuses nobody (see
        // `Vouching::Everyone`).
        None => member.do_send(crate::live::swim::member::SetVouching(
            crate::live::swim::member::Vouching::Everyone,
        )),
    }
    if !config.swim.seeds.is_empty() {
        let (seeds, failed) = lookup_all(&config.swim.seeds).await;
        if !failed.is_empty() {
            tracing::warn!(?failed, "swim.seeds: not resolved");
        }
        member.do_send(Join { seeds });
    }
    Ok((member, addr))
}

/// `bind` again while its address is still held (for up to 2 s): the
/// sockets of a replica's previous term close as their tasks end.
pub(crate) async fn until_free<T>(
    mut bind: impl FnMut() -> Result<T, LiveError>,
) -> Result<T, LiveError> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match bind() {
            Err(LiveError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}
