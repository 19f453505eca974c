//! Processes as /proc shows them (every host of the rig included), for
//! tests that a command left nothing behind.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// How many `sleep` processes with `marker` in their arguments run.
pub fn sleeping(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .filter(|cmdline| {
                    let text = String::from_utf8_lossy(cmdline);
                    text.starts_with("sleep\0") && text.contains(marker)
                })
                .count()
        })
        .unwrap_or(0)
}

/// [`sleeping`], once it reads `count` or `within` has passed.
pub fn until_sleeping(marker: &str, count: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    while sleeping(marker) != count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    sleeping(marker)
}
