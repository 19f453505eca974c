//! The gate's tests beside the actor-level ones: durability and restarts, recordings, the embedding API as an embedder uses it, and the house's rules (its import graph).
//!
//! One test binary for these (each is linked once). `tests/flood.rs`
//! stays a binary of its own: it reads its process's peak memory.

#[path = "../common/mod.rs"]
mod common;

mod durability;
mod embedding;
mod house;
mod recording;
mod restarts;
