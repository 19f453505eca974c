//! Any bytes as an agent frame: decoded or refused, never a panic; a
//! decoded frame's signature check never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::live::keys::PublicKey;
use poolgate::live::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = wire::decode_frame(data) {
        // A fixed valid key: the check must refuse, not panic.
        let key = PublicKey::parse("ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=")
            .unwrap_or_else(|_| unreachable!("a valid key"));
        let _ = frame.open(&key, "poolgate", None);
    }
});
