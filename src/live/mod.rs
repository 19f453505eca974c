//! The live cluster: the SWIM adapter that feeds the gate real membership,
//! the node agents' wire format and keys, and the demo.
//!
//! - [`swim`]: foca over UDP, turned into the gate's membership input.
//! - [`keys`]: signing keys, cluster keys, pinned public keys.
//! - [`wire`]: agent frames (signed) and gossip datagrams (sealed).
//! - [`demo`]: `cargo run`, the live story from forming to a fault.

pub mod demo;
pub mod keys;
pub mod swim;
pub mod wire;
