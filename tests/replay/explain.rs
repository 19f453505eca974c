//! `poolgate replay --explain`: the readable account of a scenario with
//! each kind of blocker, compared with a golden file (reviewed by hand).
//! After a deliberate change: `POOLGATE_BLESS=1 cargo test --test replay explain`.

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

/// `--timeline FILE.svg`: a standalone SVG with one lane per candidate,
/// the convergence windows and the PoolReady / commit / fault marks.
#[test]
fn the_timeline_is_svg_with_one_lane_per_candidate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("poolgate-timeline-{}.svg", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(dir.join("config.toml"))
        .arg("--timeline")
        .arg(&out)
        .arg(dir.join("examples/scenarios/demo.jsonl"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<g class=\"lane\"").count(), 4);
    for node in ["node-1", "node-2", "node-3", "node-4"] {
        assert!(svg.contains(&format!("data-node=\"{node}\"")), "{node}");
    }
    // Two windows: one cut short by node-3's suspicion, one that ended in
    // PoolReady; then the marks.
    assert_eq!(svg.matches("class=\"window\"").count(), 2);
    for mark in ["ready e1", "commit run-1", "fault run-1"] {
        assert!(svg.contains(mark), "{mark}");
    }
    // Every element opened is closed (a cheap well-formedness check).
    assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
    assert_eq!(
        svg.matches("<title>").count(),
        svg.matches("</title>").count()
    );
    let _ = std::fs::remove_file(out);
}

/// At a hundred candidates the forming line stays a line a person reads:
/// blocked nodes grouped by what blocks them, three names a group (it
/// listed every blocker of every node: thousands of characters).
#[test]
fn a_forming_line_of_a_hundred_nodes_groups_them_by_blocker() {
    let members: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
    let mut scenario = format!(
        "{{\"at_ms\":0,\"type\":\"define_pool\",\"pool\":\"big\",\"members\":{}}}\n",
        serde_json::to_string(&members).unwrap()
    );
    // Forty known, alive and available: they lack only identity.
    for node in &members[..40] {
        for record in [
            format!(r#"{{"at_ms":0,"type":"known","node":"{node}"}}"#),
            format!(
                r#"{{"at_ms":0,"type":"swim","node":"{node}","state":"alive","incarnation":1}}"#
            ),
            format!(r#"{{"at_ms":0,"type":"available","node":"{node}"}}"#),
        ] {
            scenario.push_str(&record);
            scenario.push('\n');
        }
    }
    let dir = std::env::temp_dir().join(format!("poolgate-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.jsonl");
    std::fs::write(&file, scenario).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--explain", "--config"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/config.toml"))
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let last = text
        .lines()
        .rfind(|l| l.contains("big forming:"))
        .unwrap_or_else(|| panic!("no forming line: {text}"));
    assert!(last.len() < 300, "{} characters: {last}", last.len());
    assert!(
        last.contains("big forming: 100 of 100 not ready: 60 unknown + not_live + not_available + no_identity (n040, n041, n042 and 57 more); 40 no_identity (n000, n001, n002 and 37 more)"),
        "{last}"
    );
}
