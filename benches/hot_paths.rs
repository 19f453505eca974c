//! The hot paths, for profiling: one observation through a node's facts,
//! one change through the pool's counts, one scenario line through the
//! parser.
//!
//! ```text
//! cargo bench --bench hot_paths
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use poolgate::replay::scenario::parse_record;
use poolgate_actors::core::{
    Applied, NodeFacts, NodeId, Observation, PoolDefinition, PoolId, PoolReadiness, SwimState, Time,
};

fn facts(c: &mut Criterion) {
    let mut facts = NodeFacts::default();
    facts.apply(Observation::Known);
    c.bench_function("node_facts_apply_duplicate", |b| {
        b.iter(|| {
            facts.apply(std::hint::black_box(Observation::Swim {
                state: SwimState::Alive,
                incarnation: 0,
            }))
        })
    });
    let mut incarnation = 0;
    c.bench_function("node_facts_apply_flap", |b| {
        b.iter(|| {
            incarnation += 1;
            facts.apply(Observation::Swim {
                state: SwimState::Suspect,
                incarnation,
            });
            facts.apply(Observation::Swim {
                state: SwimState::Alive,
                incarnation: incarnation + 1,
            })
        })
    });
}

fn pool(c: &mut Criterion) {
    let members: Vec<NodeId> = (0..10_000)
        .map(|i| NodeId::new(&format!("node-{i}")).unwrap())
        .collect();
    let definition = PoolDefinition::new(PoolId::new("p").unwrap(), members).unwrap();
    let (mut pool, added) = PoolReadiness::new(&definition, Duration::from_secs(5), Time::ZERO);
    let (_, key) = added[42].clone();
    let mut node = NodeFacts::default();
    let mut out = Vec::new();
    let mut at = 0;
    c.bench_function("pool_node_changed_10k", |b| {
        b.iter(|| {
            at += 1;
            let observation = if at % 2 == 0 {
                Observation::Available
            } else {
                Observation::Unavailable
            };
            if let Applied::Changed(change) = node.apply(observation) {
                pool.node_changed(key, Time::from_millis(at), &change, &mut out);
            }
            out.clear();
        })
    });
}

fn parser(c: &mut Criterion) {
    let line =
        r#"{"at_ms":12345,"type":"swim","node":"node-4711","state":"suspect","incarnation":7}"#;
    c.bench_function("parse_record_swim", |b| {
        b.iter(|| parse_record(std::hint::black_box(line)))
    });
}

criterion_group!(benches, facts, pool, parser);
criterion_main!(benches);
