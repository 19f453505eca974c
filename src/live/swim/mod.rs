//! The real SWIM feed: a [`SwimMember`] actor runs a `foca` instance over a
//! UDP socket and turns what foca knows into the gate's membership input.
//!
//! Only SWIM facts cross this boundary (state and incarnation per node);
//! SWIM assigns nothing. foca has no "suspect" notification, so its codec
//! notes every member state foca applies ([`watch`]), and after every foca
//! call the [`MembershipTracker`] gives one fact
//! ([`MembershipUpdate`](poolgate_actors::core::MembershipUpdate) and
//! address) per member it touched, at a cost in proportion to the change.
//! The tracker holds no member state: foca holds the view, and the
//! orchestrator's one table of facts ([`crate::live::nodes`]) keeps what
//! changed and passes it to the gate.
//!
//! - [`drive`]: one way to drive foca, over UDP or in memory.
//! - [`identity`]: who a member is (node id, socket address, generation).
//! - [`watch`]: the codec that notes what foca changed.
//! - [`tracker`]: what foca applied → SWIM facts (pure, stateless).
//! - [`fresh`]: what a term is not told of the view before it began.
//! - [`reflect`]: what goes to an address never heard from (bounded).
//! - [`member`]: the actor that owns foca, the socket and foca's timers.

pub mod drive;
pub mod fresh;
pub mod identity;
pub mod member;
pub mod reflect;
pub mod tracker;
pub mod watch;

pub use identity::SwimIdentity;
pub use member::{SwimMember, SwimTimings};
pub use tracker::MembershipTracker;

use crate::config::SwimConfig;
use crate::keys::ClusterKey;
use crate::live::wire::Keyring;
use crate::live::LiveError;

/// Loads the gossip keyring of `[swim]`: its keys, or none when
/// `insecure = true`; with neither, refuses to start (design §8).
pub fn keyring(swim: &SwimConfig) -> Result<Keyring, LiveError> {
    if swim.cluster_keys.is_empty() && swim.cluster_key_material.is_empty() {
        if !swim.insecure {
            return Err(LiveError::NoClusterKeys);
        }
        tracing::warn!("insecure = true: SWIM gossip is neither sealed nor authenticated");
        return Ok(Keyring::new(&[], &swim.label));
    }
    let mut keys = swim.cluster_key_material.clone();
    for path in &swim.cluster_keys {
        keys.push(ClusterKey::load(path)?);
    }
    Ok(Keyring::new(&keys, &swim.label))
}
