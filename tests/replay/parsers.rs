//! Short, deterministic versions of the fuzz targets: the scenario reader
//! and parser, and the config parser, on arbitrary and on near-valid input,
//! answer with a value or an error, never a panic; errors name a line.

use poolgate::replay::scenario::{parse_record, ScenarioReader};
use poolgate::{Config, ConfigError};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngSeed, TestRunner};

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x5ca1ab1e),
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

const RECORD: &str =
    r#"{"at_ms":5,"type":"commit_plan","run":"r1","required":["a","b"],"epoch":1}"#;
const CONFIG: &str = include_str!("../../config.toml");

/// Valid text with one byte replaced, inserted or removed.
fn mutated(base: &'static str) -> impl Strategy<Value = Vec<u8>> {
    (0..base.len(), any::<u8>(), 0..3u8).prop_map(move |(at, byte, how)| {
        let mut bytes = base.as_bytes().to_vec();
        match how {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ => {
                bytes.remove(at);
            }
        }
        bytes
    })
}

#[test]
fn the_scenario_reader_and_parser_never_panic() {
    let input = prop_oneof![prop::collection::vec(any::<u8>(), 0..300), mutated(RECORD),];
    runner(3000)
        .run(&input, |bytes| {
            let mut reader = ScenarioReader::new(&bytes[..]);
            while let Some(line) = reader.next_line() {
                match line {
                    Ok((_, text)) => {
                        if let Err(message) = parse_record(&text) {
                            prop_assert!(!message.is_empty());
                        }
                    }
                    Err(bad) => {
                        prop_assert!(bad.line >= 1);
                        break;
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_config_parser_never_panics_and_names_a_line() {
    let lines = CONFIG.lines().count() + 1;
    runner(1500)
        .run(&mutated(CONFIG), |bytes| {
            let Ok(text) = String::from_utf8(bytes) else {
                return Ok(());
            };
            match Config::parse(&text, "c.toml") {
                Ok(_) => {}
                Err(ConfigError::Invalid { line, key, .. }) => {
                    prop_assert!((1..=lines).contains(&line), "line {line}");
                    prop_assert!(!key.is_empty());
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
            Ok(())
        })
        .unwrap();
}

/// A valid frame's bytes (after the length prefix), from a fixed key.
fn valid_frame() -> (Vec<u8>, poolgate::live::keys::PublicKey) {
    let key = poolgate::live::keys::NodeKey::generate();
    let state = poolgate::live::wire::Announcement {
        available: true,
        identity: Some("AQID".into()),
        swim: Some("127.0.0.1:7946".parse().unwrap()),
        generation: None,
        fault: None,
        leaving: false,
        heartbeat_ms: Some(1000),
        ask: None,
    };
    let framed = poolgate::live::wire::encode(&key, "poolgate", "n1", 7, None, &state);
    (framed[4..].to_vec(), key.public())
}

#[test]
fn the_agent_frame_decoder_refuses_or_decodes_and_never_accepts_a_changed_frame() {
    use poolgate::live::wire;
    let (frame, key) = valid_frame();
    let frame: &'static [u8] = Box::leak(frame.into_boxed_slice());
    let text: &'static str = std::str::from_utf8(frame).unwrap();
    let input = prop_oneof![prop::collection::vec(any::<u8>(), 0..400), mutated(text)];
    runner(3000)
        .run(&input, |bytes| {
            if let Ok(decoded) = wire::decode_frame(&bytes) {
                // Only the untouched frame may open: any change to what is
                // signed breaks the signature (or the JSON around it).
                if decoded.open(&key, "poolgate", None).is_ok() {
                    prop_assert_eq!((decoded.node.as_str(), decoded.seq), ("n1", 7));
                }
            }
            Ok(())
        })
        .unwrap();
    assert!(wire::decode_frame(frame)
        .unwrap()
        .open(&key, "poolgate", None)
        .is_ok());
}

#[test]
fn the_datagram_opener_drops_what_no_key_sealed_and_opens_what_one_did() {
    use poolgate::live::keys::ClusterKey;
    use poolgate::live::wire::Keyring;
    let ring = Keyring::new(&[ClusterKey::from_bytes([7; 32])], "poolgate");
    runner(2000)
        .run(&prop::collection::vec(any::<u8>(), 0..1500), |bytes| {
            prop_assert_eq!(ring.open(&bytes), None);
            let sealed = ring.seal(&bytes);
            let opened = ring.open(&sealed);
            prop_assert_eq!(opened.as_deref(), Some(&bytes[..]));
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_shipped_unit_files_parse_clean_and_are_the_ones_the_guide_shows() {
    // systemd has no inline comments: `KillSignal=SIGTERM  # …` failed to
    // parse ("Failed to parse signal name"), and `ExecReload` handed
    // `# re-read …` to /bin/kill, so `systemctl reload` failed.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/operator.md")).unwrap();
    let dir = std::env::temp_dir().join(format!("poolgate-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["poolgate-node.service", "poolgate-orchestrator.service"] {
        let unit = std::fs::read_to_string(root.join("deploy").join(name)).unwrap();
        for line in unit.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                continue;
            }
            let (key, value) = line.split_once('=').expect("Key=Value");
            assert!(!key.is_empty() && !key.contains(' '), "{name}: {line}");
            assert!(!value.contains('#'), "{name}: an inline comment: {line}");
        }
        // The guide shows the file as it is, indented in its list.
        let body: String = unit.lines().skip(1).map(|l| format!("\n   {l}")).collect();
        let body = body.replace("\n   \n", "\n\n");
        assert!(
            guide.contains(&body),
            "docs/operator.md shows another {name}"
        );
        match std::process::Command::new("systemd-analyze")
            .arg("--version")
            .output()
        {
            Ok(_) => {
                // Offline: the binary it starts must exist, so this one.
                let test = dir.join(name);
                let local = unit.replace("/usr/local/bin/poolgate", env!("CARGO_BIN_EXE_poolgate"));
                std::fs::write(&test, local).unwrap();
                let verified = std::process::Command::new("systemd-analyze")
                    .arg("verify")
                    .arg(&test)
                    .output()
                    .unwrap();
                let said = String::from_utf8_lossy(&verified.stderr);
                assert!(
                    said.trim().is_empty() && verified.status.success(),
                    "{name}: {said}"
                );
            }
            Err(_) => println!(
                "{name}: systemd-analyze not installed: the files are checked by their syntax only"
            ),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Design §15: `poolgate completions SHELL` prints a completion script
/// for each shell clap knows, naming the commands and their flags and
/// not the keeper's hidden one; bash's is valid bash. An unknown shell is
/// a usage error (exit 2).
#[test]
fn completions_name_every_command_but_the_hidden_one_and_bashs_parse() {
    let poolgate = env!("CARGO_BIN_EXE_poolgate");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = std::process::Command::new(poolgate)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in [
            "watch", "run", "node", "status", "replay", "metrics", "require",
        ] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
        assert!(!script.contains("guard-exec"), "{shell} offers the keeper");
        if shell == "bash" {
            let dir =
                std::env::temp_dir().join(format!("poolgate-completions-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("poolgate.bash");
            std::fs::write(&file, &script).unwrap();
            let checked = std::process::Command::new("bash")
                .arg("-n")
                .arg(&file)
                .output();
            std::fs::remove_dir_all(&dir).unwrap();
            if let Ok(checked) = checked {
                assert!(checked.status.success(), "bash -n: {checked:?}");
            }
        }
    }
    let unknown = std::process::Command::new(poolgate)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
}
