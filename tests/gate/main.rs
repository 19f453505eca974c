//! The gate in one process, on virtual time or scripted input: the
//! contract at the actors (`actors`, many pools over a fleet in
//! `actors/fleet.rs`), durability and restarts, recordings, metrics, the
//! simulated SWIM cluster feeding the real gate, the embedding API as an
//! embedder uses it, and the house's rules (its import graph).
//!
//! One test binary for these (each is linked once). `tests/flood.rs`
//! stays a binary of its own: it reads its process's peak memory.

#[path = "../common/mod.rs"]
mod common;

mod actors;
mod durability;
mod embedding;
mod house;
mod metrics;
mod recording;
mod restarts;
mod simulation;
