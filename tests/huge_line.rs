//! A single 50 MB scenario line is reported, not loaded: the replay reads
//! with a bounded buffer, prints what came before, exits 2 naming the line,
//! and stays far below 300 MB. (Alone in this file so the children's peak
//! memory measured is this replay's.)

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn a_fifty_megabyte_line_is_refused_with_bounded_memory() {
    let scenarios = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut child = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(scenarios.join("config.toml"))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let good = std::fs::read(scenarios.join("change_at_deadline.jsonl")).unwrap();
        stdin.write_all(&good).unwrap();
        stdin
            .write_all(br#"{"at_ms":5000,"type":"known","node":""#)
            .unwrap();
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..50 {
            // The replay stops reading once the line is too long; a closed
            // pipe is the expected end.
            if stdin.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = stdin.write_all(b"\"}\n");
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();

    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("error: line 16: line is longer than 1048576 bytes"),
        "{stderr}"
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("\"planning_started\""),
        "events before the line are printed: {stdout}"
    );

    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let peak_kib = usage.max_rss();
    println!("peak RSS of the replay: {peak_kib} KiB");
    assert!(peak_kib < 300 * 1024, "peak RSS {peak_kib} KiB");
}
