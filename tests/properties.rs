//! Property test: random observation sequences and clock steps through the
//! real actors (via replay on virtual time), checked event for event against
//! the independent model in `tests/model`.
//!
//! The seed is fixed and printed; set `POOLGATE_SEED` to explore others.

mod model;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use model::Model;
use poolgate::replay;
use poolgate::replay::render::json_line;
use poolgate::Config;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngSeed, TestRunner};
use serde_json::Value;

const WINDOW: u64 = 100;
const WAIT: u64 = 250;
const NODES: [&str; 4] = ["a", "b", "c", "d"];
const MEMBERS: [&str; 3] = ["a", "b", "c"];

fn config(abort: bool) -> Config {
    let policy = if abort { "abort" } else { "wait" };
    let text = format!(
        "[pool]\nid = \"p\"\nmembers = [\"a\", \"b\", \"c\"]\n[readiness]\nconvergence_window = \"{WINDOW}ms\"\n[planning]\non_readiness_lost = \"{policy}\"\nwait_timeout = \"{WAIT}ms\"\n"
    );
    Config::parse(&text, "property").unwrap()
}

/// When a step's records happen.
#[derive(Clone, Copy, Debug)]
enum When {
    /// This long after the previous step (0: the same instant).
    After(u64),
    /// At the next pending timer (PoolReady or a wait timeout) plus this
    /// offset, as the model sees it while the scenario is built; the
    /// previous instant plus 1 ms when nothing is pending. Offsets of −1, 0
    /// and +1 put records on each side of a deadline, and −window makes a
    /// last change whose PoolReady coincides with a wait timeout.
    Timer(i64),
}

/// One scripted step: when, then records at that instant.
fn step() -> impl Strategy<Value = (When, Vec<String>)> {
    let delta = prop::sample::select(vec![0u64, 0, 1, 30, 99, 100, 101, 150, 249, 250, 251]);
    let offset = prop::sample::select(vec![-(WINDOW as i64), -1, 0, 0, 1]);
    let when = prop_oneof![
        1 => delta.prop_map(When::After),
        1 => offset.prop_map(When::Timer),
    ];
    (when, prop::collection::vec(record(), 1..4))
}

fn node() -> impl Strategy<Value = &'static str> {
    prop::sample::select(NODES.to_vec())
}

fn record() -> impl Strategy<Value = String> {
    let run = prop::sample::select(vec!["r1", "r2"]);
    let epoch = prop::option::of(0u64..4);
    let subset = prop::sample::subsequence(NODES.to_vec(), 0..=4);
    prop_oneof![
        6 => (node(), 0u64..4).prop_map(|(n, i)| ready_burst(n, i)),
        4 => (0u64..4).prop_map(|i| MEMBERS.map(|n| ready_burst(n, i)).join("\n")),
        5 => (node(), prop::sample::select(vec!["alive", "suspect", "dead", "left"]), 0u64..4)
            .prop_map(|(n, s, i)| format!(r#""type":"swim","node":"{n}","state":"{s}","incarnation":{i}"#)),
        2 => node().prop_map(|n| format!(r#""type":"known","node":"{n}""#)),
        1 => node().prop_map(|n| format!(r#""type":"forgotten","node":"{n}""#)),
        2 => node().prop_map(|n| format!(r#""type":"available","node":"{n}""#)),
        2 => node().prop_map(|n| format!(r#""type":"unavailable","node":"{n}""#)),
        3 => (node(), prop::sample::select(vec!["YQ==", "Yg==", "Yg==", "", "YR=="]))
            .prop_map(|(n, m)| format!(r#""type":"identity","node":"{n}","material":"{m}""#)),
        1 => (node(), prop::sample::select(vec!["x", "y", "x\\u0007", "x\\n"]))
            .prop_map(|(n, r)| format!(r#""type":"faulted","node":"{n}","reason":"{r}""#)),
        1 => node().prop_map(|n| format!(r#""type":"recovered","node":"{n}""#)),
        3 => (run.clone(), epoch.clone()).prop_map(|(r, e)| format!(r#""type":"begin_planning","run":"{r}"{}"#, epoch_field(e))),
        3 => (run.clone(), subset.clone(), epoch).prop_map(|(r, req, e)| format!(r#""type":"commit_plan","run":"{r}","required":{}{}"#, serde_json::to_string(&req).unwrap(), epoch_field(e))),
        1 => run.prop_map(|r| format!(r#""type":"finish_run","run":"{r}""#)),
        4 => prop::sample::subsequence(MEMBERS.to_vec(), 1..=3).prop_map(|req| format!(
            "{}\n{}",
            r#""type":"begin_planning","run":"r1""#,
            format_args!(r#""type":"commit_plan","run":"r1","required":{}"#, serde_json::to_string(&req).unwrap())
        )),
        1 => subset.prop_map(|m| format!(r#""type":"define_pool","pool":"q","members":{}"#, serde_json::to_string(&m).unwrap())),
    ]
}

/// The facts that make a node ready, as one marker expanded later.
fn ready_burst(node: &str, incarnation: u64) -> String {
    format!("READY {node} {incarnation}")
}

fn epoch_field(epoch: Option<u64>) -> String {
    epoch
        .map(|e| format!(r#","epoch":{e}"#))
        .unwrap_or_default()
}

fn model(abort: bool) -> Model {
    Model::new("p", &MEMBERS, WINDOW, abort, Some(WAIT))
}

/// Writes the scenario, resolving each step's instant against a model fed
/// as it goes; counts the commands that land on a pending deadline.
fn scenario(steps: &[(When, Vec<String>)], abort: bool, seen: &RefCell<Seen>) -> String {
    let mut guide = model(abort);
    let mut at = 0;
    let mut text = String::new();
    let mut line = 0;
    for (when, records) in steps {
        at = match *when {
            When::After(delta) => at + delta,
            When::Timer(offset) => guide
                .next_timer()
                .map_or(at + 1, |due| due.saturating_add_signed(offset).max(at)),
        };
        for body in records.iter().flat_map(|r| r.split('\n')) {
            let lines = match body.strip_prefix("READY ") {
                Some(rest) => {
                    let mut parts = rest.split(' ');
                    let (n, i) = (parts.next().unwrap(), parts.next().unwrap());
                    vec![
                        format!(r#""type":"known","node":"{n}""#),
                        format!(r#""type":"swim","node":"{n}","state":"alive","incarnation":{i}"#),
                        format!(r#""type":"available","node":"{n}""#),
                        format!(r#""type":"identity","node":"{n}","material":"YQ==""#),
                    ]
                }
                None => vec![body.to_string()],
            };
            for record in lines {
                let record = format!(r#"{{"at_ms":{at},{record}}}"#);
                if guide.next_timer() == Some(at) {
                    *seen
                        .borrow_mut()
                        .entry("(record at a deadline)".into())
                        .or_default() += 1;
                }
                line += 1;
                guide.input(line, &serde_json::from_str(&record).unwrap());
                writeln!(text, "{record}").unwrap();
            }
        }
    }
    text
}

fn canonical(mut events: Vec<Value>) -> Vec<String> {
    for event in &mut events {
        if let Some(object) = event.as_object_mut() {
            object.remove("detail");
        }
    }
    let mut keyed: Vec<(u64, String)> = events
        .into_iter()
        .map(|e| (e["at_ms"].as_u64().unwrap(), e.to_string()))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, s)| s).collect()
}

type Seen = BTreeMap<String, usize>;

fn check(text: &str, abort: bool, seen: &RefCell<Seen>) -> Result<(), TestCaseError> {
    let mut actual = Vec::new();
    replay::run(&config(abort), text.as_bytes(), |event| {
        actual.push(serde_json::from_str::<Value>(&json_line(event)).unwrap());
        Ok(())
    })
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut model = model(abort);
    for (index, line) in text.lines().enumerate() {
        model.input(index + 1, &serde_json::from_str(line).unwrap());
    }
    model.finish();
    for event in &actual {
        let mut key = event["event"].as_str().unwrap().to_string();
        for field in ["reason", "error"] {
            if let Some(detail) = event[field].as_str() {
                key = format!("{key}/{detail}");
            }
        }
        *seen.borrow_mut().entry(key).or_default() += 1;
    }
    let (want, got) = (canonical(model.out), canonical(actual));
    prop_assert_eq!(&want, &got, "scenario:\n{}", text);
    Ok(())
}

/// How many scenarios each of the two property tests runs: half of
/// `POOLGATE_CASES` (default 3,000 in all).
fn cases() -> u32 {
    let total: u32 = std::env::var("POOLGATE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    total.div_ceil(2)
}

fn agree_on_random_scenarios(default_seed: u64) {
    let seed = std::env::var("POOLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seed);
    let cases = cases();
    println!("property seed: {seed}, {cases} cases (set POOLGATE_SEED, POOLGATE_CASES to change)");
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let strategy = (prop::collection::vec(step(), 1..40), any::<bool>());
    let seen = RefCell::new(BTreeMap::new());
    runner
        .run(&strategy, |(steps, abort)| {
            check(&scenario(&steps, abort, &seen), abort, &seen)
        })
        .unwrap();
    // The generator must reach every rule, or agreement proves little.
    let seen = seen.into_inner();
    println!("events seen: {seen:?}");
    if cases < 500 {
        return;
    }
    for needed in [
        "(record at a deadline)",
        "pool_ready",
        "readiness_lost/pool_redefined",
        "readiness_lost/identity_changed",
        "planning_suspended",
        "planning_resumed",
        "planning_aborted/readiness_lost",
        "planning_aborted/wait_timeout",
        "run_committed",
        "run_faulted/suspect",
        "run_faulted/faulted",
        "run_faulted/identity_changed",
        "run_finished",
        "rejected/stale_epoch",
        "rejected/run_in_progress",
        "rejected/invalid_identity",
        "rejected/invalid_plan",
        "rejected/not_candidate",
        "rejected/pool_not_ready",
        "rejected/run_committed",
    ] {
        assert!(seen.contains_key(needed), "no case produced {needed}");
    }
}

#[test]
fn the_actors_agree_with_the_model_on_random_scenarios() {
    agree_on_random_scenarios(0x5eed_9a7e);
}

#[test]
fn the_actors_agree_with_the_model_on_more_random_scenarios() {
    agree_on_random_scenarios(0x5eed_9a7f);
}
