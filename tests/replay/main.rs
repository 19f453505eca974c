//! The replay's tests: the scenario directory against its golden outputs, the property tests against the independent model, the explainer, the parsers on arbitrary input, and identity material kept out of its output.
//!
//! One test binary for these (each is linked once). `tests/huge_line.rs`
//! stays a binary of its own: it reads its children's peak memory.

#[path = "../model/mod.rs"]
mod model;

mod explain;
mod parsers;
mod properties;
mod scenarios;
mod secrets;
