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

/// The SWIM adapter's path between foca and the gate, the tracker and the
/// one table of facts it feeds (`live::nodes::Nodes`), fed one member
/// state per call (a heartbeat of one member changing its incarnation),
/// with N members already held: the cost must not grow with N.
fn tracker(c: &mut Criterion) {
    use foca::{Member, State};
    use poolgate::live::nodes::Nodes;
    use poolgate::live::swim::{MembershipTracker, SwimIdentity};
    use std::net::SocketAddr;

    let member = |i: usize, incarnation: u16| {
        let id = SwimIdentity::new(
            format!("n{i}"),
            SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 7946)),
            1,
        );
        Member::new(id, incarnation, State::Alive)
    };
    let none = Vec::<(SwimIdentity, SwimIdentity)>::new;
    let filled = |n: usize| {
        let mut tracker = MembershipTracker::default();
        let mut table = Nodes::default();
        for fact in tracker.changed((0..n).map(|i| member(i, 0)), none()) {
            table.observe(fact);
        }
        (tracker, table)
    };
    let through = |tracker: &mut MembershipTracker, table: &mut Nodes, states| {
        let mut new = 0;
        for fact in tracker.changed(states, none()) {
            new += usize::from(table.observe(fact).is_new());
        }
        new
    };
    for n in [100usize, 1_000, 4_096] {
        let (mut tracker, mut table) = filled(n);
        let mut i = 0usize;
        let mut incarnation = 0u16;
        c.bench_function(&format!("tracker_one_change_of_{n}"), |b| {
            b.iter_batched(
                || {
                    i = (i + 7919) % n;
                    incarnation = incarnation.wrapping_add(1);
                    vec![member(i, incarnation)]
                },
                |states| through(&mut tracker, &mut table, states),
                criterion::BatchSize::SmallInput,
            )
        });
        let (mut tracker, mut table) = filled(n);
        let mut j = 0usize;
        c.bench_function(&format!("tracker_one_unchanged_of_{n}"), |b| {
            b.iter_batched(
                || {
                    j = (j + 7919) % n;
                    vec![member(j, 0)]
                },
                |states| through(&mut tracker, &mut table, states),
                criterion::BatchSize::SmallInput,
            )
        });
        c.bench_function(&format!("tracker_nothing_of_{n}"), |b| {
            b.iter(|| through(&mut tracker, &mut table, Vec::new()))
        });
    }
}

criterion_group!(benches, facts, pool, parser, tracker);
criterion_main!(benches);
