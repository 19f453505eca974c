//! Any text as `config.toml`: a config or an error naming key and line,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = poolgate::Config::parse(text, "fuzz.toml");
    }
});
