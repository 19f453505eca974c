//! Any bytes as operations on the three state machines: no panic, and the
//! contract's invariants hold (see `poolgate_core::testkit`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(broken) = poolgate_core::testkit::drive(data) {
        panic!("invariant broken: {broken}");
    }
});
