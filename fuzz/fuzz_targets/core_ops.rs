//! Any bytes as operations on the three state machines: no panic, and the
//! contract's invariants hold (see `poolgate_actors::core::invariants`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(broken) = poolgate_actors::core::invariants::drive(data) {
        panic!("invariant broken: {broken}");
    }
});
