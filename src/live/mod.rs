//! The live cluster: the SWIM adapter that feeds the gate real membership,
//! and the demo that runs a cluster on 127.0.0.1.
//!
//! - [`swim`]: foca over UDP, turned into the gate's membership input.
//! - [`demo`]: `cargo run`, the live story from forming to a fault.

pub mod demo;
pub mod swim;
