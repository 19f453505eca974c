//! The real SWIM feed: a [`SwimMember`] actor runs a `foca` instance over a
//! UDP socket and turns what foca knows into the gate's membership input.
//!
//! Only SWIM facts cross this boundary (state and incarnation per node);
//! SWIM assigns nothing. foca has no "suspect" notification, so after every
//! foca call the [`MembershipTracker`] compares the membership with the
//! previous one and emits one [`MembershipUpdate`](poolgate_actors::core::MembershipUpdate)
//! per change.
//!
//! - [`identity`]: who a member is (node id, socket address, generation).
//! - [`tracker`]: foca's membership → gate observations (pure).
//! - [`member`]: the actor that owns foca, the socket and foca's timers.

pub mod identity;
pub mod member;
pub mod tracker;

pub use identity::SwimIdentity;
pub use member::{SwimMember, SwimSettings};
pub use tracker::MembershipTracker;
