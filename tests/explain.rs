//! `poolgate replay --explain`: the readable account of a scenario with
//! each kind of blocker, compared with a golden file (reviewed by hand).
//! After a deliberate change: `POOLGATE_BLESS=1 cargo test --test explain`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn explain(stdin: bool) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let scenario = dir.join("explain/blockers.jsonl");
    let mut command = Command::new(env!("CARGO_BIN_EXE_poolgate"));
    command
        .args(["replay", "--explain", "--config"])
        .arg(dir.join("scenarios/config.toml"));
    let output = if stdin {
        let mut child = command
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let text = std::fs::read(&scenario).unwrap();
        child.stdin.take().unwrap().write_all(&text).unwrap();
        child.wait_with_output().unwrap()
    } else {
        command.arg(&scenario).output().unwrap()
    };
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn explain_names_each_blocker_and_sums_up() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/explain/blockers.txt");
    let got = explain(false);
    if std::env::var_os("POOLGATE_BLESS").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    assert_eq!(got, want);
    for blocker in [
        "unknown",
        "not_live (never seen)",
        "not_live (dead)",
        "not_available",
        "no_identity",
        "suspect (inc 1)",
        "faulted (ecc error)",
    ] {
        assert!(got.contains(blocker), "{blocker} missing");
    }
    assert!(got.contains("first PoolReady after 2.000s"));
    assert!(got.contains("window restarts: 2 (suspect ×1, faulted ×1)"));
}

#[test]
fn explain_reads_stdin() {
    assert_eq!(explain(true), explain(false));
}
