//! The scenario directory: `tests/scenarios/NAME.jsonl` replayed through the
//! real actors on virtual time, compared with `NAME.expected.jsonl` (the
//! events, one JSON object per line) or `NAME.error` (the error of a bad
//! line). `NAME.toml` is the config if present, `config.toml` otherwise.
//!
//! Events of one instant may come in any order (design §5), so both sides are
//! compared with each instant's events sorted. To write the expected files
//! after a deliberate change, run with `POOLGATE_BLESS=1` and review the
//! diff line by line.

use std::path::{Path, PathBuf};

use poolgate::replay::render::json_line;
use poolgate::replay::{self, ReplayError};
use poolgate::Config;

fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

/// Replays one scenario: its event lines, and the bad-line error if any.
fn replay_file(path: &Path) -> (Vec<String>, Option<String>) {
    let dir = path.parent().unwrap();
    let name = path.file_stem().unwrap().to_str().unwrap();
    let own = dir.join(format!("{name}.toml"));
    let config_path = if own.exists() {
        own
    } else {
        dir.join("config.toml")
    };
    let config = Config::load(&config_path).unwrap();
    let input = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut lines = Vec::new();
    let result = replay::run(&config, input, |event| {
        lines.push(json_line(event));
        Ok(())
    });
    let error = match result {
        Ok(()) => None,
        Err(ReplayError::BadLine(bad)) => Some(bad.to_string()),
        Err(other) => panic!("{name}: {other}"),
    };
    (canonical(lines), error)
}

/// Sorts the events of each instant, keeping instants in order.
fn canonical(lines: Vec<String>) -> Vec<String> {
    let mut keyed: Vec<(u64, String)> = lines
        .into_iter()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(&line).unwrap();
            (value["at_ms"].as_u64().unwrap(), line)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, line)| line).collect()
}

#[test]
fn every_scenario_gives_its_expected_events() {
    let bless = std::env::var_os("POOLGATE_BLESS").is_some();
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(scenario_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .filter(|path| !path.to_string_lossy().ends_with(".expected.jsonl"))
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 10, "the scenario directory is there");
    let mut failures = Vec::new();
    for path in &scenarios {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let (events, error) = replay_file(path);
        let expected_events = path.with_file_name(format!("{name}.expected.jsonl"));
        let expected_error = path.with_file_name(format!("{name}.error"));
        if bless {
            std::fs::write(
                &expected_events,
                events.iter().map(|l| format!("{l}\n")).collect::<String>(),
            )
            .unwrap();
            match &error {
                Some(error) => std::fs::write(&expected_error, format!("{error}\n")).unwrap(),
                None => drop(std::fs::remove_file(&expected_error)),
            }
            continue;
        }
        let want_events: Vec<String> = std::fs::read_to_string(&expected_events)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .lines()
            .map(str::to_string)
            .collect();
        let want_error = std::fs::read_to_string(&expected_error)
            .ok()
            .map(|s| s.trim_end().to_string());
        if canonical(want_events.clone()) != events {
            failures.push(format!(
                "{name}: events differ\n--- expected\n{}\n--- got\n{}",
                want_events.join("\n"),
                events.join("\n")
            ));
        }
        if want_error != error {
            failures.push(format!("{name}: error {error:?}, expected {want_error:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Adversary findings: a recording that restored a committed run and
/// then stops being valid is a bad line, not a panic (the pool actor's
/// start once ran after the runtime was gone); and a restore grace no
/// timer can wait is a bad line too.
#[test]
fn a_restored_recording_that_goes_wrong_is_a_bad_line_not_a_panic() {
    let dir = tempdir();
    let settings = r#"{"at_ms":0,"type":"settings","window_ms":1000,"on_readiness_lost":"wait","wait_timeout_ms":null}"#;
    let fp = "ab".repeat(32);
    let restored = |grace: &str| {
        format!(
            r#"{{"at_ms":0,"type":"restored","durable":{{"last_epoch":3,"run":{{"run":"r1","epoch":3,"committed":true,"required":[["a","{fp}"]]}}}},"restore_grace_ms":{grace}}}"#
        )
    };
    let cases = [
        (
            format!("{settings}\n{}\n", restored("5000")),
            "error: line 1: the scenario has no records",
        ),
        (
            format!("{settings}\n{}\n{}\n", restored("5000"), restored("5000")),
            "error: line 3: a `restored` record comes right after `settings`, once",
        ),
        (
            format!("{settings}\n{}\n", restored("18446744073709551615")),
            "error: line 2: field `restore_grace_ms` must be at most 365 days",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let scenario = dir.join(format!("restored-{i}.jsonl"));
        std::fs::write(&scenario, text).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(["replay", "--config"])
            .arg(scenario_dir().join("config.toml"))
            .arg(&scenario)
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!stderr.contains("panicked"), "case {i}: {stderr}");
        assert_eq!(output.status.code(), Some(2), "case {i}: {stderr}");
        assert!(stderr.starts_with(want), "case {i}: {stderr}");
    }
}

/// The binary's contract for bad lines: exit 2, `error: line N: …` on
/// stderr, and the events due before the bad line on stdout.
#[test]
fn a_bad_line_exits_2_after_printing_the_events_before_it() {
    let dir = tempdir();
    let scenario = dir.join("truncated.jsonl");
    let mut text =
        std::fs::read_to_string(scenario_dir().join("change_at_deadline.jsonl")).unwrap();
    text.push_str("{\"at_ms\":3000,\"type\":\"swim\",\"node\":\"a\",\"sta\n");
    std::fs::write(&scenario, text).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(scenario_dir().join("config.toml"))
        .arg(&scenario)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: line 16: not valid JSON"),
        "{stderr}"
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let events: Vec<&str> = stdout.lines().collect();
    assert_eq!(events.len(), 3, "{stdout}");
    assert!(events[1].contains("\"pool_ready\""), "{stdout}");
    assert!(events[2].contains("\"planning_started\""), "{stdout}");
}

#[test]
fn replay_reads_stdin_with_a_dash() {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(scenario_dir().join("config.toml"))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let scenario = std::fs::read(scenario_dir().join("formation.jsonl")).unwrap();
    child.stdin.take().unwrap().write_all(&scenario).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1);
    assert!(stdout.contains("\"at_ms\":1500"), "{stdout}");
}

#[test]
fn a_bad_config_exits_2_naming_the_key_and_line() {
    let dir = tempdir();
    let config = dir.join("bad.toml");
    std::fs::write(
        &config,
        "[pool]\nid = \"p\"\nmembers = [\"a\", \"a\"]\n[readiness]\nconvergence_window = \"1s\"\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(&config)
        .arg(scenario_dir().join("formation.jsonl"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("line 3: pool.members: node a is listed twice"),
        "{stderr}"
    );
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "poolgate-test-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The shipped demo scenario shows forming, PoolReady, planning, commit and
/// a required node's suspicion faulting the run.
#[test]
fn the_demo_scenario_tells_the_whole_story() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["replay", "--config"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios/demo.jsonl"))
        .output()
        .unwrap();
    assert!(output.status.success());
    let events: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "rejected",
            "pool_ready",
            "planning_started",
            "run_committed",
            "readiness_lost",
            "run_faulted"
        ]
    );
    assert_eq!(events[5]["reason"], "suspect");
}

/// `cargo run -- demo --json` (the live demo, on the shipped config)
/// prints parseable events including the whole story.
#[test]
fn the_live_demo_prints_the_story_as_json() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["demo", "--json", "--seed", "1", "--config"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let value: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(value["at_ms"].is_u64(), "{l}");
            value["event"].as_str().unwrap().to_string()
        })
        .collect();
    for needed in ["pool_ready", "run_committed", "node_crashed", "run_faulted"] {
        assert!(
            names.iter().any(|n| n == needed),
            "{needed} missing: {names:?}"
        );
    }
}

/// `--log-format json` with `RUST_LOG=info`: one JSON object per log line
/// on stderr, each decision with structured fields.
#[test]
fn logs_can_be_json_with_structured_fields() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["--log-format", "json", "replay", "--config"])
        .arg(scenario_dir().join("config.toml"))
        .arg(scenario_dir().join("wait_then_fault.jsonl"))
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(output.status.success());
    let logs: Vec<serde_json::Value> = String::from_utf8(output.stderr)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let fault = logs
        .iter()
        .find(|l| l["fields"]["message"] == "gate event: run_faulted")
        .expect("the fault is logged");
    assert_eq!(fault["fields"]["node"], "b");
    assert_eq!(fault["fields"]["reason"], "identity_changed");
    assert_eq!(fault["fields"]["run"], "r1");
}

#[test]
fn every_event_line_of_the_golden_outputs_reads_back_as_an_event_and_writes_the_same() {
    // Issue 21: `Event` was `Serialize` only; an orchestrator reading the
    // event stream (or a recording's output) could not get types back.
    let mut read = 0;
    for entry in std::fs::read_dir(scenario_dir()).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".expected.jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            if value.get("event").and_then(|e| e.as_str()) == Some("rejected") {
                continue;
            }
            let event: poolgate::core::Event = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {line}: {e}", path.display()));
            let again: serde_json::Value = serde_json::to_value(&event).unwrap();
            assert_eq!(again, value, "{}", path.display());
            read += 1;
        }
    }
    assert!(read > 50, "only {read} event lines found");
}
