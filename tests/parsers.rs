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
const CONFIG: &str = include_str!("../config.toml");

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
