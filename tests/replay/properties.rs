//! Property test: random observation sequences and clock steps through the
//! real actors (via replay on virtual time), checked event for event against
//! the independent model in `tests/model`.
//!
//! The seed is fixed and printed; set `POOLGATE_SEED` to explore others.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::model::Model;
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

/// A runner of `cases` cases from `seed`, nothing persisted.
fn runner(seed: u64, cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

fn agree_on_random_scenarios(default_seed: u64) {
    let seed = std::env::var("POOLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seed);
    let cases = cases();
    println!("property seed: {seed}, {cases} cases (set POOLGATE_SEED, POOLGATE_CASES to change)");
    let mut runner = runner(seed, cases);
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

/// Many pools over one fleet (design §14), checked against a fleet of
/// models: one lone-gate model per pool, fed its members' observations and
/// its own commands, and a table of which committed run holds each node
/// ("A node serves one committed run at a time": a commit the pool's model
/// would take on a node another pool's committed run holds is rejected
/// `reserved`; "a run's end releases them").
mod fleet {
    use super::*;

    const FLEET_NODES: [&str; 5] = ["n1", "n2", "n3", "n4", "n5"];
    const RUNS: [&str; 2] = ["r1", "r2"];

    /// Pools: (id, members, abort) with distinct ids.
    type Pools = Vec<(String, Vec<&'static str>, bool)>;

    fn pools() -> impl Strategy<Value = Pools> {
        let pool = (
            prop::sample::subsequence(FLEET_NODES.to_vec(), 1..=4),
            any::<bool>(),
        );
        prop::collection::vec(pool, 2..=3).prop_map(|pools| {
            pools
                .into_iter()
                .enumerate()
                .map(|(i, (members, abort))| (format!("p{i}"), members, abort))
                .collect()
        })
    }

    fn fleet_config(pools: &Pools) -> Config {
        let mut text = format!("[readiness]\nconvergence_window = \"{WINDOW}ms\"\n[planning]\nwait_timeout = \"{WAIT}ms\"\n");
        for (id, members, abort) in pools {
            let policy = if *abort { "abort" } else { "wait" };
            writeln!(
                text,
                "[pools.{id}]\nmembers = {}\non_readiness_lost = \"{policy}\"",
                serde_json::to_string(members).unwrap()
            )
            .unwrap();
        }
        Config::parse(&text, "fleet property").unwrap()
    }

    /// One record's body (without `at_ms`), `pool` a stand-in index for
    /// commands: resolved against the pools drawn.
    fn fleet_record() -> impl Strategy<Value = String> {
        let fleet_node = prop::sample::select(FLEET_NODES.to_vec());
        let run = prop::sample::select(RUNS.to_vec());
        let pool = 0usize..3;
        let subset = prop::sample::subsequence(FLEET_NODES.to_vec(), 1..=3);
        prop_oneof![
            6 => (fleet_node.clone(), 0u64..3).prop_map(|(n, i)| ready_burst(n, i)),
            2 => (0u64..3).prop_map(|i| FLEET_NODES.map(|n| ready_burst(n, i)).join("\n")),
            4 => (fleet_node.clone(), prop::sample::select(vec!["alive", "suspect", "dead"]), 0u64..3)
                .prop_map(|(n, s, i)| format!(r#""type":"swim","node":"{n}","state":"{s}","incarnation":{i}"#)),
                1 => fleet_node.clone().prop_map(|n| format!(r#""type":"unavailable","node":"{n}""#)),
            1 => (fleet_node.clone(), prop::sample::select(vec!["YQ==", "Yg=="]))
                .prop_map(|(n, m)| format!(r#""type":"identity","node":"{n}","material":"{m}""#)),
            1 => fleet_node.prop_map(|n| format!(r#""type":"faulted","node":"{n}","reason":"x""#)),
            6 => (pool.clone(), run.clone(), subset).prop_map(|(p, r, req)| format!(
                "POOL{p} \"type\":\"begin_planning\",\"run\":\"{r}\"\nPOOL{p} \"type\":\"commit_plan\",\"run\":\"{r}\",\"required\":{}",
                serde_json::to_string(&req).unwrap()
            )),
            6 => (pool.clone(), run.clone(), 1u8..16).prop_map(|(p, r, mask)| format!(
                "POOL{p} \"type\":\"begin_planning\",\"run\":\"{r}\"\nPOOL{p} \"type\":\"commit_plan\",\"run\":\"{r}\",\"required\":MEMBERS{mask}"
            )),
            3 => (pool, run).prop_map(|(p, r)| format!(r#"POOL{p} "type":"finish_run","run":"{r}""#)),
        ]
    }

    /// The scenario's text: every command names one of `pools`.
    fn fleet_scenario(pools: &Pools, steps: &[(u64, Vec<String>)]) -> String {
        let mut text = String::new();
        let mut at = 0;
        for (delta, records) in steps {
            at += delta;
            for body in records.iter().flat_map(|r| r.split('\n')) {
                let lines = match body.strip_prefix("READY ") {
                    Some(rest) => {
                        let mut parts = rest.split(' ');
                        let (n, i) = (parts.next().unwrap(), parts.next().unwrap());
                        vec![
                            format!(r#""type":"known","node":"{n}""#),
                            format!(
                                r#""type":"swim","node":"{n}","state":"alive","incarnation":{i}"#
                            ),
                            format!(r#""type":"available","node":"{n}""#),
                            format!(r#""type":"recovered","node":"{n}""#),
                            format!(r#""type":"identity","node":"{n}","material":"YQ==""#),
                        ]
                    }
                    None => match body.strip_prefix("POOL") {
                        Some(rest) => {
                            let (index, command) = rest.split_once(' ').unwrap();
                            let (id, members, _) =
                                &pools[index.parse::<usize>().unwrap() % pools.len()];
                            // A subset of the pool's own members, by mask.
                            let command = match command.split_once("MEMBERS") {
                                Some((head, mask)) => {
                                    let mask: usize = mask.parse().unwrap();
                                    let mut chosen: Vec<&str> = members
                                        .iter()
                                        .enumerate()
                                        .filter(|(i, _)| mask & (1 << i) != 0)
                                        .map(|(_, m)| *m)
                                        .collect();
                                    if chosen.is_empty() {
                                        chosen = members.clone();
                                    }
                                    format!("{head}{}", serde_json::to_string(&chosen).unwrap())
                                }
                                None => command.to_string(),
                            };
                            vec![format!(r#""pool":"{id}",{command}"#)]
                        }
                        None => vec![body.to_string()],
                    },
                };
                for record in lines {
                    writeln!(text, r#"{{"at_ms":{at},{record}}}"#).unwrap();
                }
            }
        }
        text
    }

    /// The fleet of models.
    struct FleetModel {
        pools: BTreeMap<String, (Vec<String>, Model)>,
        /// Which committed run (pool, run) holds each node.
        held: BTreeMap<String, (String, String)>,
        /// How many of each model's events were looked at for run ends.
        read: BTreeMap<String, usize>,
        /// The fleet's own events: `reserved` rejections.
        out: Vec<Value>,
    }

    impl FleetModel {
        fn new(pools: &Pools) -> Self {
            let pools = pools
                .iter()
                .map(|(id, members, abort)| {
                    let model = Model::new(id, members, WINDOW, *abort, Some(WAIT));
                    let members = members.iter().map(|m| m.to_string()).collect();
                    (id.clone(), (members, model))
                })
                .collect();
            FleetModel {
                pools,
                held: BTreeMap::new(),
                read: BTreeMap::new(),
                out: Vec::new(),
            }
        }

        fn input(&mut self, line: usize, record: &Value) {
            let at = record["at_ms"].as_u64().unwrap();
            let kind = record["type"].as_str().unwrap();
            if let Some(pool) = record["pool"].as_str() {
                let (_, model) = self.pools.get_mut(pool).unwrap();
                if kind != "commit_plan" {
                    model.input(line, record);
                } else {
                    model.advance(at);
                    let mut trial = model.clone();
                    trial.input(line, record);
                    let committed = trial.out[model.out.len()..]
                        .iter()
                        .any(|e| e["event"] == "run_committed");
                    let run = record["run"].as_str().unwrap();
                    let required: Vec<String> = record["required"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_str().unwrap().to_string())
                        .collect();
                    let taken = required.iter().find(|n| {
                        self.held
                            .get(*n)
                            .is_some_and(|(p, r)| p != pool || r != run)
                    });
                    match (committed, taken) {
                        (true, Some(_)) => self.out.push(serde_json::json!(
                            {"at_ms": at, "event": "rejected", "line": line, "error": "reserved"}
                        )),
                        (true, None) => {
                            for node in required {
                                self.held.insert(node, (pool.to_string(), run.to_string()));
                            }
                            *model = trial;
                        }
                        (false, _) => *model = trial,
                    }
                }
            } else {
                let node = record["node"].as_str().unwrap();
                for (members, model) in self.pools.values_mut() {
                    if members.iter().any(|m| m == node) {
                        model.input(line, record);
                    }
                }
            }
            self.release_ended();
        }

        /// "A run's end releases them."
        fn release_ended(&mut self) {
            for (pool, (_, model)) in &self.pools {
                let read = self.read.entry(pool.clone()).or_default();
                for event in &model.out[*read..] {
                    if event["event"] == "run_finished" || event["event"] == "run_faulted" {
                        let run = event["run"].as_str().unwrap();
                        self.held.retain(|_, (p, r)| p != pool || r != run);
                    }
                }
                *read = model.out.len();
            }
        }

        fn finish(mut self) -> Vec<Value> {
            let mut all = std::mem::take(&mut self.out);
            for (_, model) in self.pools.values_mut() {
                model.finish();
                all.append(&mut model.out);
            }
            all
        }
    }

    /// No node is in two committed runs at once, by the events told, in
    /// the order told (the replay keeps the fleet's order within an
    /// instant).
    fn one_run_per_node(events: &[Value]) -> Result<(), TestCaseError> {
        let mut held: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut required: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for event in events {
            let pool = event["pool"].as_str().unwrap_or_default().to_string();
            let run = event["run"].as_str().unwrap_or_default().to_string();
            match event["event"].as_str().unwrap() {
                "run_committed" => {
                    let nodes: Vec<String> = event["required"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_str().unwrap().to_string())
                        .collect();
                    for node in &nodes {
                        if let Some(holder) = held.insert(node.clone(), (pool.clone(), run.clone()))
                        {
                            return Err(TestCaseError::fail(format!(
                                "{node} committed to {pool}/{run} while {holder:?} held it"
                            )));
                        }
                    }
                    required.insert((pool, run), nodes);
                }
                "run_finished" | "run_faulted" => {
                    for node in required.remove(&(pool, run)).unwrap_or_default() {
                        held.remove(&node);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check(pools: &Pools, text: &str, seen: &RefCell<Seen>) -> Result<(), TestCaseError> {
        let mut actual = Vec::new();
        replay::run(&fleet_config(pools), text.as_bytes(), |event| {
            actual.push(serde_json::from_str::<Value>(&json_line(event)).unwrap());
            Ok(())
        })
        .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let mut model = FleetModel::new(pools);
        for (index, line) in text.lines().enumerate() {
            model.input(index + 1, &serde_json::from_str(line).unwrap());
        }
        for event in &actual {
            let mut key = event["event"].as_str().unwrap().to_string();
            if let Some(error) = event["error"].as_str() {
                key = format!("{key}/{error}");
            }
            *seen.borrow_mut().entry(key).or_default() += 1;
        }
        one_run_per_node(&actual)?;
        let (want, got) = (canonical(model.finish()), canonical(actual));
        prop_assert_eq!(&want, &got, "scenario:\n{}", text);
        Ok(())
    }

    #[test]
    fn many_pools_agree_with_a_fleet_of_models_and_no_node_serves_two_runs() {
        let seed = std::env::var("POOLGATE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0xf1ee7);
        let cases = cases();
        println!("fleet property seed: {seed}, {cases} cases");
        let mut runner = runner(seed, cases);
        let delta = prop::sample::select(vec![0u64, 0, 1, 50, 101, 300]);
        let steps =
            prop::collection::vec((delta, prop::collection::vec(fleet_record(), 1..4)), 1..40);
        let seen = RefCell::new(BTreeMap::new());
        runner
            .run(&(pools(), steps), |(pools, steps)| {
                check(&pools, &fleet_scenario(&pools, &steps), &seen)
            })
            .unwrap();
        let seen = seen.into_inner();
        println!("fleet events seen: {seen:?}");
        if cases < 500 {
            return;
        }
        for needed in [
            "pool_ready",
            "run_committed",
            "run_faulted",
            "run_finished",
            "rejected/reserved",
        ] {
            assert!(seen.contains_key(needed), "no case produced {needed}");
        }
    }
}
