//! Actor-level tests of the contract: the real `NodeActor` / `PoolActor` /
//! `RunActor` subsystem behind the embedding API, on tokio's paused clock.
//! One test (at least) per promise of the contract (docs/design.md §1–§3).

mod fleet;

use crate::common::*;
use poolgate::core::{AgentReport, RegistryFact};
use poolgate::ObservationOutcome;
use poolgate::{Gate, GateError};
use poolgate_actors::core::{
    AbortReason, Blocker, Epoch, Event, Fingerprint, Membership, OnReadinessLost, PoolDefinition,
    PoolId, PoolPhase, Reason, Refusal, RunId, SwimState, Time,
};

const MEMBERS: &[&str] = &["n1", "n2", "n3"];

fn gate_wait(timeout_ms: Option<u64>) -> Gate {
    Gate::start(
        config(MEMBERS, 5000, OnReadinessLost::Wait, timeout_ms)
            .gate_settings()
            .unwrap(),
    )
}

fn run(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

async fn all_ready(gate: &Gate) {
    for member in MEMBERS {
        make_ready(gate, member).await;
    }
}

/// Brings the pool to PoolReady at 5 s (epoch 1) and returns at 5.001 s.
async fn ready_pool(gate: &Gate) {
    all_ready(gate).await;
    advance_to(gate, 5001).await;
    assert_eq!(
        gate.report().await.unwrap().phase,
        PoolPhase::Ready { epoch: Epoch(1) }
    );
}

/// Plans run r1 on the ready pool and commits it over `required`.
async fn commit_r1(gate: &Gate, required: &[&str]) {
    gate.begin_planning(run("r1"), None).await.unwrap();
    let required = required.iter().map(|n| node(n)).collect();
    gate.commit_plan(run("r1"), required, None).await.unwrap();
}

fn refused(result: Result<impl std::fmt::Debug, GateError>) -> Refusal {
    match result {
        Err(GateError::Refused(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn pool_ready_appears_only_after_every_fact_and_the_full_window() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        make_ready(&gate, "n1").await;
        make_ready(&gate, "n2").await;
        advance_to(&gate, 1000).await;
        make_ready(&gate, "n3").await;
        advance_to(&gate, 5999).await;
        assert!(
            drain(&mut events).is_empty(),
            "no PoolReady inside the window"
        );
        advance_to(&gate, 6001).await;
        let got = drain(&mut events);
        match &got[..] {
            [Event::PoolReady {
                at,
                epoch,
                members,
                fingerprints,
                pool,
            }] => {
                assert_eq!(*at, Time::from_millis(6000));
                assert_eq!(*epoch, Epoch(1));
                assert_eq!(pool.as_str(), "pool-t");
                assert_eq!(members, &[node("n1"), node("n2"), node("n3")]);
                assert_eq!(fingerprints[&node("n2")], Fingerprint::of(b"key-of-n2"));
            }
            other => panic!("{other:?}"),
        }
    });
}

/// Each contract fact, withheld from one candidate, keeps the pool from
/// becoming ready, and the report names it.
#[test]
fn each_missing_fact_keeps_the_pool_from_ready() {
    type Spoil = fn(&Gate) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>;
    let cases: [(&str, Spoil, Blocker); 6] = [
        (
            "unknown",
            |g| {
                Box::pin(async move {
                    // Forgotten (which also drops identity), then identity again.
                    g.registry(RegistryFact::Forgotten { node: node("n3") })
                        .await
                        .unwrap();
                    let again = AgentReport::identity(node("n3"), b"key".to_vec()).unwrap();
                    g.agent(again).await.unwrap();
                })
            },
            Blocker::Unknown,
        ),
        (
            "not live",
            |g| Box::pin(swim(g, "n3", SwimState::Dead, 1)),
            Blocker::NotLive,
        ),
        (
            "no NodeAvailable",
            |g| {
                Box::pin(async move {
                    g.agent(AgentReport::Unavailable { node: node("n3") })
                        .await
                        .unwrap();
                })
            },
            Blocker::NotAvailable,
        ),
        (
            "no identity",
            |g| {
                Box::pin(async move {
                    // Forget and re-register: known again, identity gone.
                    g.registry(RegistryFact::Forgotten { node: node("n3") })
                        .await
                        .unwrap();
                    g.registry(RegistryFact::Known { node: node("n3") })
                        .await
                        .unwrap();
                })
            },
            Blocker::NoIdentity,
        ),
        (
            "suspect",
            |g| Box::pin(swim(g, "n3", SwimState::Suspect, 1)),
            Blocker::Suspect,
        ),
        (
            "faulted",
            |g| {
                Box::pin(async move {
                    g.agent(AgentReport::Faulted {
                        node: node("n3"),
                        reason: "ecc".into(),
                    })
                    .await
                    .unwrap();
                    g.agent(AgentReport::Available { node: node("n3") })
                        .await
                        .unwrap();
                })
            },
            Blocker::Faulted,
        ),
    ];
    for (name, spoil, blocker) in cases {
        on_virtual_time(async move {
            let gate = gate_wait(None);
            let mut events = gate.subscribe();
            all_ready(&gate).await;
            spoil(&gate).await;
            advance_to(&gate, 60_000).await;
            assert!(drain(&mut events).is_empty(), "{name}: no PoolReady");
            let report = gate.report().await.unwrap();
            assert_eq!(report.phase, PoolPhase::Forming, "{name}");
            let n3 = &report.candidates[2];
            assert_eq!(n3.node, node("n3"));
            assert_eq!(
                n3.verdict.blockers().collect::<Vec<_>>(),
                vec![blocker],
                "{name}: the report names the one blocker"
            );
        });
    }
}

#[test]
fn a_change_inside_the_window_restarts_it() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        all_ready(&gate).await;
        advance_to(&gate, 4000).await;
        // A refuted suspicion: the node is ready again, but the view moved.
        swim(&gate, "n2", SwimState::Suspect, 1).await;
        swim(&gate, "n2", SwimState::Alive, 2).await;
        advance_to(&gate, 8999).await;
        assert!(drain(&mut events).is_empty());
        advance_to(&gate, 9001).await;
        assert_eq!(drain(&mut events)[0].at(), Time::from_millis(9000));
        let report = gate.report().await.unwrap();
        assert_eq!(report.last_change.node, Some(node("n2")));
    });
}

#[test]
fn duplicates_and_stale_observations_do_not_restart_the_window() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        all_ready(&gate).await;
        advance_to(&gate, 3000).await;
        let outcome = gate
            .agent(AgentReport::Available { node: node("n1") })
            .await
            .unwrap();
        assert_eq!(outcome, ObservationOutcome::Duplicate);
        swim(&gate, "n1", SwimState::Alive, 2).await;
        advance_to(&gate, 4000).await;
        let stale = gate
            .membership(poolgate::core::MembershipUpdate {
                node: node("n1"),
                state: SwimState::Suspect,
                incarnation: 1,
            })
            .await
            .unwrap();
        assert_eq!(stale, ObservationOutcome::Stale);
        advance_to(&gate, 8001).await;
        assert_eq!(names(&drain(&mut events)), ["pool_ready"]);
        assert_eq!(gate.report().await.unwrap().ignored_stale, 1);
    });
}

#[test]
fn observations_about_non_candidates_are_ignored() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        all_ready(&gate).await;
        advance_to(&gate, 2000).await;
        let outcome = gate
            .membership(poolgate::core::MembershipUpdate {
                node: node("outsider"),
                state: SwimState::Dead,
                incarnation: 9,
            })
            .await
            .unwrap();
        assert_eq!(outcome, ObservationOutcome::NotCandidate);
        advance_to(&gate, 5001).await;
        assert_eq!(names(&drain(&mut events)), ["pool_ready"]);
        let report = gate.report().await.unwrap();
        assert_eq!(report.ignored_non_candidate, 1);
        assert_eq!(report.candidates.len(), 3);
    });
}

#[test]
fn planning_is_refused_before_pool_ready() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        all_ready(&gate).await;
        advance_to(&gate, 4999).await;
        assert_eq!(
            refused(gate.begin_planning(run("r1"), None).await),
            Refusal::PoolNotReady
        );
        advance_to(&gate, 5001).await;
        assert_eq!(
            gate.begin_planning(run("r1"), None).await.unwrap(),
            Epoch(1)
        );
    });
}

#[test]
fn wait_ready_returns_the_epoch_to_plan_with() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        all_ready(&gate).await;
        let proof = gate.wait_ready().await.unwrap();
        assert_eq!(proof.epoch, Epoch(1));
        assert_eq!(now_ms(&gate), 5000);
        gate.begin_planning(run("r1"), Some(proof.epoch))
            .await
            .unwrap();
        gate.commit_plan(run("r1"), vec![node("n1")], Some(proof.epoch))
            .await
            .unwrap();
    });
}

#[test]
fn readiness_lost_while_planning_under_wait_suspends_then_resumes_on_a_new_epoch() {
    on_virtual_time(async {
        let gate = gate_wait(Some(30_000));
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), Some(Epoch(1)))
            .await
            .unwrap();
        swim(&gate, "n2", SwimState::Suspect, 1).await;
        advance_to(&gate, 6000).await;
        assert_eq!(
            refused(gate.commit_plan(run("r1"), vec![node("n1")], None).await),
            Refusal::PoolNotReady
        );
        swim(&gate, "n2", SwimState::Alive, 2).await;
        advance_to(&gate, 11_001).await;
        assert_eq!(
            names(&drain(&mut events)),
            [
                "pool_ready",
                "planning_started",
                "readiness_lost",
                "planning_suspended",
                "pool_ready",
                "planning_resumed"
            ]
        );
        // The proof of epoch 1 is stale now.
        assert!(matches!(
            refused(
                gate.commit_plan(run("r1"), vec![node("n1")], Some(Epoch(1)))
                    .await
            ),
            Refusal::StaleEpoch {
                given: Epoch(1),
                current: Some(Epoch(2))
            }
        ));
        gate.commit_plan(run("r1"), vec![node("n1")], Some(Epoch(2)))
            .await
            .unwrap();
    });
}

#[test]
fn the_wait_timeout_aborts_planning() {
    on_virtual_time(async {
        let gate = gate_wait(Some(10_000));
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        advance_to(&gate, 6000).await;
        swim(&gate, "n3", SwimState::Dead, 1).await;
        advance_to(&gate, 16_001).await;
        let got = drain(&mut events);
        assert!(
            matches!(
                got.last(),
                Some(Event::PlanningAborted { reason: AbortReason::WaitTimeout, at, .. })
                    if *at == Time::from_millis(16_000)
            ),
            "{got:?}"
        );
        assert!(matches!(
            refused(gate.commit_plan(run("r1"), vec![node("n1")], None).await),
            Refusal::UnknownRun(_)
        ));
        assert_eq!(gate.pending_deadline().await.unwrap(), None);
    });
}

#[test]
fn readiness_lost_while_planning_under_abort_aborts() {
    on_virtual_time(async {
        let gate = Gate::start(
            config(MEMBERS, 5000, OnReadinessLost::Abort, None)
                .gate_settings()
                .unwrap(),
        );
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        gate.agent(AgentReport::Unavailable { node: node("n1") })
            .await
            .unwrap();
        advance_to(&gate, 5002).await;
        let got = drain(&mut events);
        assert!(
            matches!(
                got.last(),
                Some(Event::PlanningAborted {
                    reason: AbortReason::ReadinessLost,
                    ..
                })
            ),
            "{got:?}"
        );
        // The pool is free for another run once ready again.
        gate.agent(AgentReport::Available { node: node("n1") })
            .await
            .unwrap();
        // Ready again at 10.002 s; a command stamped at that very instant
        // would come before it, so plan a millisecond later.
        advance_to(&gate, 10_003).await;
        gate.begin_planning(run("r2"), None).await.unwrap();
    });
}

#[test]
fn one_run_at_a_time() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        assert_eq!(
            refused(gate.begin_planning(run("r2"), None).await),
            Refusal::RunInProgress(run("r1"))
        );
    });
}

#[test]
fn a_required_node_suspected_after_commit_faults_the_run() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        gate.commit_plan(run("r1"), vec![node("n1"), node("n2")], Some(Epoch(1)))
            .await
            .unwrap();
        advance_to(&gate, 7000).await;
        swim(&gate, "n2", SwimState::Suspect, 1).await;
        advance_to(&gate, 7001).await;
        let got = drain(&mut events);
        assert!(
            got.iter().any(|e| matches!(
                e,
                Event::RunFaulted { node: n, reason: Reason::Suspect, at, .. }
                    if n == &node("n2") && *at == Time::from_millis(7000)
            )),
            "{got:?}"
        );
        // A faulted run is final: it cannot be finished or committed.
        assert!(matches!(
            refused(gate.finish_run(run("r1")).await),
            Refusal::UnknownRun(_)
        ));
    });
}

#[test]
fn each_loss_of_a_required_node_after_commit_faults_the_run() {
    let losses: [(&str, Reason); 6] = [
        ("dead", Reason::Dead),
        ("left", Reason::Left),
        ("faulted", Reason::Faulted),
        ("unavailable", Reason::Unavailable),
        ("forgotten", Reason::Unknown),
        ("identity", Reason::IdentityChanged),
    ];
    for (how, reason) in losses {
        on_virtual_time(async move {
            let gate = gate_wait(None);
            let mut events = gate.subscribe();
            ready_pool(&gate).await;
            commit_r1(&gate, &["n1"]).await;
            let n1 = node("n1");
            match how {
                "dead" => swim(&gate, "n1", SwimState::Dead, 1).await,
                "left" => swim(&gate, "n1", SwimState::Left, 1).await,
                "faulted" => drop(
                    gate.agent(AgentReport::Faulted {
                        node: n1,
                        reason: "disk".into(),
                    })
                    .await,
                ),
                "unavailable" => drop(gate.agent(AgentReport::Unavailable { node: n1 }).await),
                "forgotten" => drop(gate.registry(RegistryFact::Forgotten { node: n1 }).await),
                _ => drop(
                    gate.agent(AgentReport::identity(n1, b"rotated".to_vec()).unwrap())
                        .await,
                ),
            }
            advance_to(&gate, 5002).await;
            let got = drain(&mut events);
            assert!(
                got.iter().any(|e| matches!(
                    e, Event::RunFaulted { reason: r, .. } if *r == reason
                )),
                "{how}: {got:?}"
            );
        });
    }
}

#[test]
fn losing_a_non_required_node_after_commit_does_not_fault_the_run() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        commit_r1(&gate, &["n1"]).await;
        swim(&gate, "n3", SwimState::Dead, 1).await;
        // An incarnation bump of a required node is not a loss either.
        swim(&gate, "n1", SwimState::Alive, 5).await;
        advance_to(&gate, 60_000).await;
        let got = names(&drain(&mut events));
        assert_eq!(
            got,
            [
                "pool_ready",
                "planning_started",
                "run_committed",
                "readiness_lost"
            ]
        );
        gate.finish_run(run("r1")).await.unwrap();
    });
}

#[test]
fn commit_is_refused_for_a_stale_epoch_or_a_non_candidate() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        assert!(matches!(
            refused(
                gate.commit_plan(run("r1"), vec![node("n1")], Some(Epoch(7)))
                    .await
            ),
            Refusal::StaleEpoch { .. }
        ));
        assert_eq!(
            refused(
                gate.commit_plan(run("r1"), vec![node("stranger")], None)
                    .await
            ),
            Refusal::NotCandidate(node("stranger"))
        );
        assert_eq!(
            refused(gate.commit_plan(run("other"), vec![node("n1")], None).await),
            Refusal::UnknownRun(run("other"))
        );
        assert!(matches!(
            refused(gate.begin_planning(run("r2"), Some(Epoch(0))).await),
            Refusal::StaleEpoch { .. }
        ));
    });
}

#[test]
fn redefining_the_pool_restarts_readiness_and_is_refused_under_a_committed_run() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        let smaller =
            PoolDefinition::new(PoolId::new("pool-u").unwrap(), vec![node("n1"), node("n2")])
                .unwrap();
        gate.define_pool(smaller.clone()).await.unwrap();
        let got = drain(&mut events);
        assert!(
            matches!(
                got.last(),
                Some(Event::ReadinessLost {
                    node: None,
                    reason: Reason::PoolRedefined,
                    ..
                })
            ),
            "{got:?}"
        );
        // The staying nodes kept their facts: ready again after a window.
        advance_to(&gate, 10_002).await;
        let report = gate.report().await.unwrap();
        assert_eq!(report.pool.as_str(), "pool-u");
        assert_eq!(report.phase, PoolPhase::Ready { epoch: Epoch(2) });
        commit_r1(&gate, &["n1"]).await;
        assert!(matches!(
            refused(gate.define_pool(smaller).await),
            Refusal::RunCommitted(_)
        ));
        // n3 is no longer a candidate: its observations are ignored.
        let outcome = gate
            .agent(AgentReport::Unavailable { node: node("n3") })
            .await
            .unwrap();
        assert_eq!(outcome, ObservationOutcome::NotCandidate);
    });
}

#[test]
fn a_new_candidate_starts_with_no_facts() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        ready_pool(&gate).await;
        let bigger = PoolDefinition::new(
            PoolId::new("pool-t").unwrap(),
            vec![node("n1"), node("n2"), node("n3"), node("n4")],
        )
        .unwrap();
        gate.define_pool(bigger).await.unwrap();
        let report = gate.report().await.unwrap();
        assert_eq!(report.phase, PoolPhase::Forming);
        let n4 = report
            .candidates
            .iter()
            .find(|c| c.node == node("n4"))
            .unwrap();
        assert_eq!(
            n4.verdict.blockers().collect::<Vec<_>>(),
            [
                Blocker::Unknown,
                Blocker::NotLive,
                Blocker::NotAvailable,
                Blocker::NoIdentity
            ]
        );
    });
}

#[test]
fn invalid_identity_material_is_refused_and_the_node_keeps_its_identity() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        ready_pool(&gate).await;
        let mut events = gate.subscribe();
        for bytes in [vec![], vec![7; 16 * 1024 + 1]] {
            let refused = gate.identity(node("n1"), bytes).await;
            assert!(
                matches!(refused, Err(GateError::InvalidIdentity(_))),
                "{refused:?}"
            );
        }
        // Valid material of the same node goes through the same door.
        let kept = gate.identity(node("n1"), b"key-of-n1".to_vec()).await;
        assert_eq!(kept.unwrap(), ObservationOutcome::Duplicate);
        advance_to(&gate, 60_000).await;
        assert!(drain(&mut events).is_empty(), "the view did not change");
        let report = gate.report().await.unwrap();
        assert_eq!(
            report.candidates[0].fingerprint,
            Some(Fingerprint::of(b"key-of-n1"))
        );
        assert_eq!(report.phase, PoolPhase::Ready { epoch: Epoch(1) });
    });
}

#[test]
fn the_report_says_since_when_each_candidate_is_blocked() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        all_ready(&gate).await;
        advance_to(&gate, 2000).await;
        swim(&gate, "n2", SwimState::Suspect, 1).await;
        advance_to(&gate, 3000).await;
        let report = gate.report().await.unwrap();
        let n2 = &report.candidates[1];
        assert_eq!(
            n2.verdict.blockers().collect::<Vec<_>>(),
            [Blocker::Suspect]
        );
        assert_eq!(n2.since, Time::from_millis(2000));
        assert_eq!(report.candidates[0].since, Time::ZERO);
        assert_eq!(report.last_change.node, Some(node("n2")));
        assert_eq!(report.last_change.reason, Reason::Suspect);
        assert_eq!(
            n2.detail.membership,
            Membership::Seen {
                state: SwimState::Suspect,
                incarnation: 1
            }
        );
        gate.agent(AgentReport::Faulted {
            node: node("n3"),
            reason: "ecc error".into(),
        })
        .await
        .unwrap();
        let report = gate.report().await.unwrap();
        assert_eq!(
            report.candidates[2].detail.fault.as_deref(),
            Some("ecc error")
        );
        assert_eq!(report.candidates[2].since, Time::from_millis(3000));
    });
}

#[test]
fn a_fault_is_never_lost_to_its_wording() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        commit_r1(&gate, &["n1"]).await;
        let wording = format!("bad\u{7}dimm\n{}", "é".repeat(3000));
        let outcome = gate
            .agent(AgentReport::Faulted {
                node: node("n1"),
                reason: wording,
            })
            .await;
        assert_eq!(outcome.unwrap(), ObservationOutcome::Changed);
        let faulted: Vec<_> = drain(&mut events)
            .into_iter()
            .filter(|e| matches!(e, Event::RunFaulted { .. }))
            .collect();
        assert!(
            matches!(&faulted[..], [Event::RunFaulted { node: n, reason: Reason::Faulted, .. }] if n == &node("n1")),
            "{faulted:?}"
        );
        let report = gate.report().await.unwrap();
        let kept = report.candidates[0].detail.fault.as_deref().unwrap();
        assert!(kept.len() <= 1024 && kept.len() > 1000, "{}", kept.len());
        assert!(kept.starts_with("bad\u{fffd}dimm\u{fffd}é"));
        assert!(!kept.chars().any(char::is_control));
    });
}

#[test]
fn an_empty_plan_is_refused_and_planning_goes_on() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        ready_pool(&gate).await;
        gate.begin_planning(run("r1"), None).await.unwrap();
        assert_eq!(
            refused(gate.commit_plan(run("r1"), vec![], None).await),
            Refusal::InvalidPlan(run("r1"))
        );
        gate.commit_plan(run("r1"), vec![node("n2")], None)
            .await
            .unwrap();
    });
}

/// Live inputs meet timers at the pool: one that arrives after the timer
/// due at `T` fired is applied at `T + 1 ms`, so that inputs applied at `T`
/// always come before timers due at `T` (design §2), as in replay.
#[test]
fn a_live_input_after_the_timer_at_its_instant_is_applied_a_millisecond_later() {
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        all_ready(&gate).await;
        advance_to(&gate, 5000).await;
        for _ in 0..100 {
            if matches!(gate.report().await.unwrap().phase, PoolPhase::Ready { .. }) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(now_ms(&gate), 5000, "the clock has not moved");
        swim(&gate, "n2", SwimState::Alive, 2).await;
        let got = drain(&mut events);
        let stamps: Vec<_> = got.iter().map(|e| (e.name(), e.at().as_millis())).collect();
        assert_eq!(
            stamps,
            [("pool_ready", 5000), ("readiness_lost", 5001)],
            "{got:?}"
        );
    });
}

#[test]
fn starting_the_gate_outside_an_actix_system_is_a_typed_error() {
    // Issue 21: it panicked with tokio's `spawn_local` message.
    let settings = config(&["a"], 1000, OnReadinessLost::Wait, None)
        .gate_settings()
        .unwrap();
    let started = Gate::try_start(settings);
    assert!(
        matches!(started, Err(GateError::NoSystem)),
        "{:?}",
        started.err()
    );
}

#[test]
fn starting_the_gate_after_its_thread_s_system_has_ended_is_a_typed_error() {
    // Adversary finding: once a System had run on the thread, `try_start`
    // took it for a running one and panicked in `spawn_local`.
    actix::System::new().block_on(async {});
    let settings = config(&["a"], 1000, OnReadinessLost::Wait, None)
        .gate_settings()
        .unwrap();
    let started = Gate::try_start(settings);
    assert!(
        matches!(started, Err(GateError::NoSystem)),
        "{:?}",
        started.err()
    );
}

#[test]
#[should_panic(expected = "inside a running actix System")]
fn gate_start_outside_a_system_panics_saying_so() {
    let settings = config(&["a"], 1000, OnReadinessLost::Wait, None)
        .gate_settings()
        .unwrap();
    let _ = Gate::start(settings);
}

#[test]
fn absurd_durations_built_in_code_are_refused_and_the_longest_allowed_works() {
    // Embedder: a window of Duration::MAX overflowed an Instant inside the
    // pool actor, which stayed dead (every call `Stopped`).
    on_virtual_time(async {
        let mut settings = config(&["a"], 1000, OnReadinessLost::Wait, None)
            .gate_settings()
            .unwrap();
        settings.window = std::time::Duration::MAX;
        assert!(matches!(
            Gate::try_start(settings.clone()),
            Err(GateError::InvalidSettings(_))
        ));
        // The longest window allowed: a timer that far out, no panic.
        settings.window = poolgate_actors::MAX_SETTING;
        let gate = Gate::try_start(settings).unwrap();
        make_ready(&gate, "a").await;
        advance_to(&gate, 10_000).await;
        let report = gate.report().await.unwrap();
        assert!(
            !matches!(report.phase, PoolPhase::Ready { .. }),
            "{:?}",
            report.phase
        );
    });
}

/// A store that keeps nothing and never fails.
#[derive(Debug)]
struct Nowhere;

impl poolgate::StateStore for Nowhere {
    fn save(&self, _: &poolgate::core::Durable) -> Result<(), poolgate::StoreError> {
        Ok(())
    }
}

/// A store that refuses every write once `refusing` says so (a deposed
/// leader's etcd store: its term is over).
#[derive(Debug)]
struct Refusing(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl poolgate::StateStore for Refusing {
    fn save(&self, _: &poolgate::core::Durable) -> Result<(), poolgate::StoreError> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(poolgate::StoreError(
                "leadership lost: nothing written".into(),
            ));
        }
        Ok(())
    }
}

/// An operator's finding: a deposed leader, following, logged ERROR
/// "durable state not written" for writes refused once its term was over
/// and its fence said no: nothing was wrong. A gate whose fence says no
/// says it at debug; one that still acts, at ERROR, as before.
#[test]
fn a_fenced_gate_whose_writes_are_refused_raises_no_error() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for fenced in [true, false] {
        on_virtual_time(async move {
            let (_layer, _, seen) = panicking_layer(|_, _, _| false);
            let refusing = Arc::new(AtomicBool::new(false));
            let mut settings = config(&["a"], 10, OnReadinessLost::Wait, None)
                .gate_settings()
                .unwrap();
            settings.durable = Some(poolgate::DurableSettings {
                store: Arc::new(Refusing(refusing.clone())),
                restored: poolgate::core::Durable {
                    last_epoch: 0,
                    run: None,
                },
                restore_grace: std::time::Duration::from_secs(1),
            });
            let gate = Gate::start(settings);
            let open = Arc::new(AtomicBool::new(true));
            let fence = open.clone();
            gate.fence_with(move || fence.load(Ordering::SeqCst));
            make_ready(&gate, "a").await;
            assert!(!gate.writes_failing());
            // The term ends before the window does: the new epoch's write
            // is refused, and (deposed) the fence says no.
            refusing.store(true, Ordering::SeqCst);
            open.store(!fenced, Ordering::SeqCst);
            advance_to(&gate, 1_000).await;
            assert!(gate.writes_failing(), "a refused write is noted");
            let seen = seen.lock().unwrap().clone();
            let errors: Vec<&String> = seen.iter().filter(|l| l.starts_with("ERROR")).collect();
            let said_unwritten = seen.iter().any(|l| l.contains("durable state not written"));
            assert!(said_unwritten, "fenced {fenced}: {seen:#?}");
            if fenced {
                assert!(errors.is_empty(), "{errors:#?}");
            } else {
                assert!(
                    !errors.is_empty(),
                    "an acting gate's failed write is an error"
                );
            }
        });
    }
}

#[test]
fn a_restored_last_epoch_of_u64_max_never_tells_an_epoch_again() {
    // Embedder: it panicked on the overflow (and would have wrapped to
    // epoch 0 in a release build).
    on_virtual_time(async {
        let mut settings = config(&["a"], 10, OnReadinessLost::Wait, None)
            .gate_settings()
            .unwrap();
        settings.durable = Some(poolgate::DurableSettings {
            store: std::sync::Arc::new(Nowhere),
            restored: poolgate::core::Durable {
                last_epoch: u64::MAX,
                run: None,
            },
            restore_grace: std::time::Duration::from_secs(1),
        });
        let gate = Gate::start(settings);
        let mut events = gate.subscribe();
        make_ready(&gate, "a").await;
        advance_to(&gate, 1_000).await;
        let report = gate.report().await.unwrap();
        assert!(
            !matches!(report.phase, PoolPhase::Ready { .. }),
            "{:?}",
            report.phase
        );
        assert!(!names(&drain(&mut events)).contains(&"pool_ready"));
    });
}

#[test]
fn settings_built_in_code_are_checked_as_parsed_ones_are() {
    // Issue 21: a wait_timeout of 1 ms, shorter than the window, was taken.
    on_virtual_time(async {
        let base = config(&["a"], 1000, OnReadinessLost::Wait, None)
            .gate_settings()
            .unwrap();
        let mut short_wait = base.clone();
        short_wait.policy.wait_timeout = Some(std::time::Duration::from_millis(1));
        let mut no_window = base.clone();
        no_window.window = std::time::Duration::ZERO;
        for bad in [short_wait, no_window] {
            let refused = Gate::try_start(bad);
            assert!(
                matches!(&refused, Err(GateError::InvalidSettings(_))),
                "{:?}",
                refused.err()
            );
        }
        assert!(Gate::try_start(base).is_ok());
    });
}

#[test]
fn the_settings_constructors_refuse_what_config_toml_refuses_and_agree_with_it_otherwise() {
    // Issue 21: settings and configurations built in code go through
    // validated constructors (the types are non-exhaustive, so no literal
    // skips them), checked by the rules `config.toml` is parsed by.
    use poolgate::core::{PlanningPolicy, PoolDefinition, PoolId};
    use poolgate::{Config, GateSettings};
    use std::time::Duration;
    let pool = PoolDefinition::new(PoolId::new("pool-t").unwrap(), vec![node("a")]).unwrap();
    let wait = |timeout_ms: Option<u64>| PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: timeout_ms.map(Duration::from_millis),
    };
    let refused = |settings: Result<GateSettings, GateError>| {
        matches!(settings, Err(GateError::InvalidSettings(_)))
    };
    let ms = Duration::from_millis;
    // A zero window, a window beyond 365 days, one of a fraction of a
    // millisecond, a wait timeout not longer than the window.
    assert!(refused(GateSettings::new(
        pool.clone(),
        Duration::ZERO,
        wait(None)
    )));
    assert!(refused(GateSettings::new(
        pool.clone(),
        poolgate_actors::MAX_SETTING + ms(1),
        wait(None)
    )));
    assert!(refused(GateSettings::new(
        pool.clone(),
        Duration::from_micros(1500),
        wait(None)
    )));
    assert!(refused(GateSettings::new(
        pool.clone(),
        ms(1000),
        wait(Some(1000))
    )));
    for text in ["0s", "1500us", "366days"] {
        let parsed = Config::parse(
            &format!("[pool]\nid = \"p\"\nmembers = [\"a\"]\n[readiness]\nconvergence_window = \"{text}\"\n"),
            "config.toml",
        );
        assert!(parsed.is_err(), "{text} parsed");
    }
    // A restore grace of zero, given with a store.
    let good = GateSettings::new(pool.clone(), ms(1000), wait(Some(1001))).unwrap();
    let graceless = poolgate::DurableSettings {
        store: std::sync::Arc::new(Nowhere),
        restored: poolgate::core::Durable::default(),
        restore_grace: Duration::ZERO,
    };
    assert!(refused(good.clone().with_durable(graceless)));
    // What is accepted is what parsing gives.
    let parsed = config(&["a"], 1000, OnReadinessLost::Wait, Some(1001))
        .gate_settings()
        .unwrap();
    assert_eq!(
        (good.definition, good.window, good.policy),
        (parsed.definition, parsed.window, parsed.policy)
    );
    // A configuration built in code: the same rules for its window.
    assert!(matches!(
        Config::new(pool.clone(), Duration::ZERO),
        Err(GateError::InvalidSettings(_))
    ));
    let built = Config::new(pool, ms(1000)).unwrap();
    let mut parsed = config(&["a"], 1000, OnReadinessLost::Wait, None);
    parsed.pool = built.pool.clone();
    assert_eq!(built, parsed);
}

/// Waits (virtual time, up to a virtual minute) until `probe` counts
/// `want` live actors; whether it got there.
async fn actors_down_to(probe: &impl Fn() -> usize, want: usize) -> bool {
    for _ in 0..600 {
        if probe() == want {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

#[test]
fn a_stopped_gate_stops_its_actors_ends_its_streams_and_refuses_every_call() {
    // Issue 29, reproduction 3: after Gate::stop, report() still answered
    // with the run committed, and the actors ran on.
    on_virtual_time(async {
        let gate = gate_wait(None);
        let probe = gate.actor_probe();
        let mut events = gate.subscribe();
        ready_pool(&gate).await;
        commit_r1(&gate, &["n1", "n2"]).await;
        assert_eq!(
            probe(),
            1 + MEMBERS.len() + 1,
            "the pool, three nodes, one run"
        );
        gate.stop();
        assert!(gate.is_stopped());
        assert!(matches!(gate.report().await, Err(GateError::Stopped)));
        assert!(matches!(
            gate.finish_run(run("r1")).await,
            Err(GateError::Stopped)
        ));
        let suspect = poolgate::core::MembershipUpdate {
            node: node("n1"),
            state: SwimState::Suspect,
            incarnation: 2,
        };
        assert!(matches!(
            gate.membership(suspect).await,
            Err(GateError::Stopped)
        ));
        assert!(matches!(
            gate.pending_deadline().await,
            Err(GateError::Stopped)
        ));
        // What was published before the stop is read, then the end.
        let stream_end = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while events.recv().await.is_some() {}
        })
        .await;
        assert!(stream_end.is_ok(), "the stream never ended");
        // The node and run actors go at once; the pool actor, idle, when
        // the last handle does.
        assert!(
            actors_down_to(&probe, 1).await,
            "{} actors still run",
            probe()
        );
        assert_eq!(gate.subscribe().recv().await, None);
        drop(gate);
        assert!(actors_down_to(&probe, 0).await, "{} actors left", probe());
    });
}

#[test]
fn dropping_the_last_handle_stops_the_gate_and_gives_back_every_actor() {
    // Issue 29, reproduction 3: after every Gate was dropped the stream
    // never ended (an hour of virtual time), and 500 gates of 200 nodes,
    // stopped and dropped, left 124 MB behind.
    on_virtual_time(async {
        let other = gate_wait(None);
        let mut probes = Vec::new();
        let mut streams = Vec::new();
        for _ in 0..20 {
            let gate = gate_wait(None);
            probes.push(gate.actor_probe());
            streams.push(gate.subscribe());
            ready_pool(&gate).await;
            commit_r1(&gate, &["n1"]).await;
            let copy = gate.clone();
            drop(gate);
            // A handle is left: nothing stops.
            assert!(!copy.is_stopped());
            assert!(copy.report().await.is_ok());
        }
        // Each loop's last handle went at its end.
        for (probe, stream) in probes.iter().zip(&mut streams) {
            let ended = tokio::time::timeout(std::time::Duration::from_secs(60), async {
                while stream.recv().await.is_some() {}
            })
            .await;
            assert!(
                ended.is_ok(),
                "a stream never ended after its gate's last handle went"
            );
            assert!(actors_down_to(probe, 0).await, "{} actors left", probe());
        }
        // Another gate is not touched.
        assert!(!other.is_stopped());
        assert!(other.report().await.is_ok());
    });
}

#[test]
fn an_input_stamped_far_ahead_of_the_clock_is_refused_and_the_gate_goes_on() {
    // Issue 29, reproduction 5: Gate::submit stamped 10^12 ms was taken
    // (Ok(Changed)), and wait_ready did not complete within a virtual day.
    use poolgate::core::{Input, Observation};
    on_virtual_time(async {
        let gate = gate_wait(None);
        let far = Time::from_millis(1_000_000_000_000);
        let input = Input::Observation {
            node: node("n1"),
            observation: Observation::Known,
        };
        match gate.submit(far, input).await {
            Err(e @ GateError::StampAhead { .. }) => assert_eq!(e.code(), "stamp_ahead"),
            other => panic!("a stamp 10^12 ms ahead was taken: {other:?}"),
        }
        // Within the bound, a stamp ahead is taken (a replay's way).
        let near = gate.clock().now() + std::time::Duration::from_millis(1);
        let input = Input::Observation {
            node: node("n1"),
            observation: Observation::Known,
        };
        assert!(gate.submit(near, input).await.is_ok());
        // And the gate goes on: ready within its window.
        all_ready(&gate).await;
        let ready =
            tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_ready()).await;
        assert!(ready.is_ok(), "the gate froze");
    });
}

#[test]
fn a_fence_that_panics_stops_the_gate_acting_and_nothing_hangs() {
    // Issue 29, reproduction 2: a fence that panicked in the pool's
    // publish took the pool actor down unrestarted: report and finish_run
    // answered Stopped, membership still Ok, is_stopped false, and the
    // subscriber waited for ever.
    on_virtual_time(async {
        let gate = gate_wait(None);
        let mut events = gate.subscribe();
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trigger = std::sync::Arc::clone(&armed);
        gate.fence_with(move || {
            if trigger.load(std::sync::atomic::Ordering::Relaxed) {
                panic!("the embedder's fence failed");
            }
            true
        });
        ready_pool(&gate).await;
        commit_r1(&gate, &["n1"]).await;
        armed.store(true, std::sync::atomic::Ordering::Relaxed);
        let suspect = poolgate::core::MembershipUpdate {
            node: node("n1"),
            state: SwimState::Suspect,
            incarnation: 2,
        };
        // No panic reaches the caller; the gate has stopped acting.
        assert!(matches!(
            gate.membership(suspect).await,
            Err(GateError::Stopped)
        ));
        assert!(gate.is_stopped());
        assert!(matches!(gate.report().await, Err(GateError::Stopped)));
        assert!(matches!(
            gate.finish_run(run("r1")).await,
            Err(GateError::Stopped)
        ));
        let ended = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while events.recv().await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the subscriber waited for ever");
    });
}

#[test]
fn an_input_sent_as_its_node_actor_fails_is_applied_by_the_restarted_actor() {
    // Found measuring restarts (issue 29): the input that reached the
    // failed actor's closed mailbox was answered `NotCandidate` and lost,
    // for a node that is a candidate.
    on_virtual_time(async {
        let gate = gate_wait(None);
        all_ready(&gate).await;
        poolgate_actors::testing::fail_next(
            &gate,
            poolgate_actors::testing::Actor::Node(node("n1")),
        );
        let outcome = gate
            .membership(poolgate::core::MembershipUpdate {
                node: node("n1"),
                state: SwimState::Alive,
                incarnation: 2,
            })
            .await
            .unwrap();
        assert_eq!(outcome, ObservationOutcome::Changed);
        let report = gate.report().await.unwrap();
        assert_eq!(report.ignored_non_candidate, 0);
        let n1 = report
            .candidates
            .iter()
            .find(|c| c.node == node("n1"))
            .unwrap();
        assert_eq!(
            n1.detail.membership,
            Membership::Seen {
                state: SwimState::Alive,
                incarnation: 2
            },
            "{n1:?}"
        );
    });
}

/// Supervision under random inputs and random failures (issue 29): the
/// gate's actors are made to fail at random points, through the testing
/// module (`fail_next`) and through the embedder's own hooks (a tracing
/// layer and a metrics recorder that panic), between random SWIM facts,
/// plans, finishes and time. The checker is written from the contract's
/// promises, not from the actors' code:
/// - no epoch is told twice (each `pool_ready` tells a later epoch);
/// - a committed run ends at most once, and is never lost: at the end it
///   has ended, or the gate still names it and the loss of a node it
///   requires faults it;
/// - every call answers and every stream ends or keeps delivering: each
///   call is bounded in virtual time, and a gate that gave up ends its
///   stream.
mod supervision {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use poolgate::core::{AgentReport, MembershipUpdate, RegistryFact};
    use poolgate::{EventStream, Gate, GateError};
    use poolgate_actors::core::{Epoch, Event, NodeId, OnReadinessLost, RunId, SwimState};
    use poolgate_actors::testing::{fail_next, Actor};
    use proptest::prelude::*;
    use proptest::test_runner::{Config as RunnerConfig, RngSeed, TestRunner};

    use crate::common::{config, node, on_virtual_time};

    const NODES: usize = 4;
    /// Longer than anything the gate waits for by itself: a call or a
    /// stream still waiting after this much virtual time hangs.
    const HANG: Duration = Duration::from_secs(3600);

    #[derive(Debug, Clone)]
    enum Step {
        Ready(usize),
        Swim(usize, SwimState),
        Unavailable(usize),
        Advance(u64),
        Plan(Vec<usize>),
        Finish,
        Fail(Target),
        /// The tracing layer or the metrics recorder panics on its next
        /// `n` calls from the actors.
        HookPanics(Hook, u32),
    }

    #[derive(Debug, Clone, Copy)]
    enum Target {
        Pool,
        Node(usize),
        Run,
    }

    #[derive(Debug, Clone, Copy)]
    enum Hook {
        Tracing,
        Metrics,
    }

    fn step() -> impl Strategy<Value = Step> {
        let i = 0..NODES;
        prop_oneof![
            4 => i.clone().prop_map(Step::Ready),
            3 => (i.clone(), prop_oneof![Just(SwimState::Alive), Just(SwimState::Suspect), Just(SwimState::Dead)])
                .prop_map(|(i, s)| Step::Swim(i, s)),
            1 => i.clone().prop_map(Step::Unavailable),
            4 => (0u64..2500).prop_map(Step::Advance),
            3 => prop::collection::btree_set(i.clone(), 1..=NODES)
                .prop_map(|s| Step::Plan(s.into_iter().collect())),
            1 => Just(Step::Finish),
            2 => prop_oneof![Just(Target::Pool), Just(Target::Run), i.prop_map(Target::Node)]
                .prop_map(Step::Fail),
            2 => (prop_oneof![Just(Hook::Tracing), Just(Hook::Metrics)], 1u32..4)
                .prop_map(|(h, n)| Step::HookPanics(h, n)),
        ]
    }

    fn take(armed: &AtomicU32) -> bool {
        crate::common::take_one(armed)
    }

    /// What the checker knows from the events alone.
    #[derive(Default, Debug)]
    struct Seen {
        last_epoch: Option<Epoch>,
        /// Committed runs not ended, with the nodes they require.
        open: BTreeMap<RunId, Vec<NodeId>>,
        ended: BTreeSet<RunId>,
        /// Nodes whose runs were asked for, by run (from the commits).
        asked: BTreeMap<RunId, Vec<NodeId>>,
    }

    impl Seen {
        fn take(&mut self, events: &mut EventStream) -> Result<(), TestCaseError> {
            while let Ok(event) = events.try_recv() {
                self.one(&event)?;
            }
            Ok(())
        }

        fn one(&mut self, event: &Event) -> Result<(), TestCaseError> {
            match event {
                Event::PoolReady { epoch, .. } => {
                    prop_assert!(
                        self.last_epoch.is_none_or(|last| *epoch > last),
                        "epoch {epoch:?} told after {:?}",
                        self.last_epoch
                    );
                    self.last_epoch = Some(*epoch);
                }
                Event::RunCommitted { run, .. } => {
                    prop_assert!(!self.ended.contains(run), "{run} committed after it ended");
                    let required = self.asked.get(run).cloned().unwrap_or_default();
                    self.open.insert(run.clone(), required);
                }
                Event::RunFaulted { run, .. } | Event::RunFinished { run, .. } => {
                    prop_assert!(
                        self.open.remove(run).is_some(),
                        "{run} ended but was not open: {event:?}"
                    );
                    self.ended.insert(run.clone());
                }
                _ => {}
            }
            Ok(())
        }
    }

    /// Bounds a call in virtual time: a call still waiting after [`HANG`]
    /// hangs.
    async fn bounded<T>(call: impl std::future::Future<Output = T>) -> Result<T, TestCaseError> {
        tokio::time::timeout(HANG, call)
            .await
            .map_err(|_| TestCaseError::fail("a call hung"))
    }

    /// What the cases exercised, to print (a property that is never put
    /// to the test proves nothing).
    #[derive(Default, Debug)]
    struct Tally {
        committed: u64,
        ended: u64,
        checked_at_end: u64,
        failures_asked: u64,
        hook_panics: u64,
        gates_ended: u64,
    }

    impl Tally {
        fn add(&mut self, other: &Tally) {
            self.committed += other.committed;
            self.ended += other.ended;
            self.checked_at_end += other.checked_at_end;
            self.failures_asked += other.failures_asked;
            self.hook_panics += other.hook_panics;
            self.gates_ended += other.gates_ended;
        }
    }

    async fn scenario(
        steps: Vec<Step>,
        stop_at_end: bool,
        tally: &mut Tally,
    ) -> Result<(), TestCaseError> {
        let recorder_armed = Arc::new(AtomicU32::new(0));
        let (_layer, layer_armed, _) = crate::common::panicking_layer(|_, target, _| {
            ["pool_actor", "node_actor", "run_actor", "publisher"]
                .iter()
                .any(|a| target.ends_with(a))
        });
        let armed = Arc::clone(&recorder_armed);
        let recorder = crate::common::PanickingRecorder(move |_: &metrics::Key| take(&armed));
        let _recorder = metrics::set_default_local_recorder(&recorder);
        let names: Vec<String> = (1..=NODES).map(|i| format!("n{i}")).collect();
        let members: Vec<&str> = names.iter().map(String::as_str).collect();
        let gate = Gate::start(
            config(&members, 1000, OnReadinessLost::Wait, None)
                .gate_settings()
                .unwrap(),
        );
        let mut events = gate.subscribe();
        let mut seen = Seen::default();
        let mut incarnation = [0u64; NODES];
        let mut runs = 0;
        let (mut armed_at, mut armed_metrics) = (0u32, 0u32);
        // Every case starts from a ready pool: the steps plan on it, fail
        // its actors and harm its nodes.
        let mut steps = steps;
        steps.splice(
            0..0,
            (0..NODES).map(Step::Ready).chain([Step::Advance(1001)]),
        );
        for step in steps {
            match step {
                Step::Ready(i) => {
                    let n = node(&names[i]);
                    incarnation[i] += 1;
                    let _ = bounded(gate.registry(RegistryFact::Known { node: n.clone() })).await?;
                    let _ = bounded(gate.membership(MembershipUpdate {
                        node: n.clone(),
                        state: SwimState::Alive,
                        incarnation: incarnation[i],
                    }))
                    .await?;
                    let _ = bounded(gate.agent(AgentReport::Available { node: n.clone() })).await?;
                    let _ = bounded(gate.identity(n, names[i].as_bytes().to_vec())).await?;
                }
                Step::Swim(i, state) => {
                    incarnation[i] += 1;
                    let update = MembershipUpdate {
                        node: node(&names[i]),
                        state,
                        incarnation: incarnation[i],
                    };
                    let _ = bounded(gate.membership(update)).await?;
                }
                Step::Unavailable(i) => {
                    let report = AgentReport::Unavailable {
                        node: node(&names[i]),
                    };
                    let _ = bounded(gate.agent(report)).await?;
                }
                Step::Advance(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::Plan(required) => {
                    runs += 1;
                    let run = RunId::new(&format!("r{runs}")).unwrap();
                    let required: Vec<NodeId> = required.iter().map(|i| node(&names[*i])).collect();
                    seen.asked.insert(run.clone(), required.clone());
                    if bounded(gate.begin_planning(run.clone(), None))
                        .await?
                        .is_ok()
                    {
                        let _ = bounded(gate.commit_plan(run, required, None)).await?;
                    }
                }
                Step::Finish => {
                    if let Some(run) = seen.open.keys().next().cloned() {
                        let _ = bounded(gate.finish_run(run)).await?;
                    }
                }
                Step::Fail(target) => {
                    tally.failures_asked += 1;
                    match target {
                        Target::Pool => fail_next(&gate, Actor::Pool),
                        Target::Run => fail_next(&gate, Actor::Run),
                        Target::Node(i) => fail_next(&gate, Actor::Node(node(&names[i]))),
                    }
                }
                Step::HookPanics(hook, n) => {
                    // What the last arming did not use was not a panic.
                    tally.hook_panics += u64::from(armed_at - layer_armed.load(Ordering::SeqCst))
                        + u64::from(armed_metrics - recorder_armed.load(Ordering::SeqCst));
                    let (armed, at) = match hook {
                        Hook::Tracing => (&layer_armed, &mut armed_at),
                        Hook::Metrics => (&recorder_armed, &mut armed_metrics),
                    };
                    armed.store(n, Ordering::SeqCst);
                    *at = n;
                    let other = match hook {
                        Hook::Tracing => (&recorder_armed, &mut armed_metrics),
                        Hook::Metrics => (&layer_armed, &mut armed_at),
                    };
                    *other.1 = other.0.load(Ordering::SeqCst);
                }
            }
            // The failures asked for come at the actors' next messages.
            let _ = bounded(gate.report()).await?;
            seen.take(&mut events)?;
        }
        tally.hook_panics += u64::from(armed_at - layer_armed.swap(0, Ordering::SeqCst))
            + u64::from(armed_metrics - recorder_armed.swap(0, Ordering::SeqCst));
        tally.committed += seen.open.len() as u64 + seen.ended.len() as u64;
        tally.ended += seen.ended.len() as u64;
        if stop_at_end {
            gate.stop();
        }
        if gate.is_stopped() {
            tally.gates_ended += 1;
            // The gate cannot go on: its stream ends, its calls say so.
            while let Some(event) = bounded(events.recv()).await? {
                seen.one(&event)?;
            }
            let report = bounded(gate.report()).await?;
            prop_assert!(matches!(report, Err(GateError::Stopped)), "{report:?}");
            return Ok(());
        }
        // Every committed run not ended is still the gate's, and the loss
        // of a node it requires faults it.
        let report = bounded(gate.report())
            .await?
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (run, required) in seen.open.clone() {
            tally.checked_at_end += 1;
            prop_assert_eq!(
                report.run.as_ref(),
                Some(&run),
                "committed run {} lost",
                run
            );
            let lost = required.first().cloned().unwrap();
            let i = names
                .iter()
                .position(|n| n.as_str() == lost.as_str())
                .unwrap();
            incarnation[i] += 1;
            let dead = MembershipUpdate {
                node: lost,
                state: SwimState::Dead,
                incarnation: incarnation[i],
            };
            let _ = bounded(gate.membership(dead)).await?;
            let ended = bounded(async {
                while let Some(event) = events.recv().await {
                    seen.one(&event)?;
                    if !seen.open.contains_key(&run) {
                        return Ok(());
                    }
                }
                Err(TestCaseError::fail(format!("{run}: the stream ended")))
            })
            .await;
            ended.map_err(|_| TestCaseError::fail(format!("{run} never faulted")))??;
        }
        Ok(())
    }

    #[test]
    fn random_failures_of_actors_and_hooks_lose_no_run_tell_no_epoch_twice_and_hang_nothing() {
        let seed = std::env::var("POOLGATE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(29);
        let cases = std::env::var("POOLGATE_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        println!("supervision seed: {seed}, {cases} cases (POOLGATE_SEED, POOLGATE_CASES)");
        let mut runner = TestRunner::new(RunnerConfig {
            cases,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            ..RunnerConfig::default()
        });
        // The panics asked for are expected by the thousand: not printed.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("");
            if !(message.starts_with("injected") || message.starts_with("the embedder's")) {
                previous(info);
            }
        }));
        let tally = std::cell::RefCell::new(Tally::default());
        runner
            .run(
                &(
                    prop::collection::vec(step(), 1..60),
                    prop::bool::weighted(0.2),
                ),
                |(steps, stop_at_end)| {
                    let mut result = Ok(());
                    let mut this = Tally::default();
                    on_virtual_time(async {
                        result = scenario(steps, stop_at_end, &mut this).await
                    });
                    tally.borrow_mut().add(&this);
                    result
                },
            )
            .unwrap();
        let tally = tally.into_inner();
        println!("supervision: {tally:?}");
        assert!(tally.committed > 0 && tally.checked_at_end > 0 && tally.hook_panics > 0);
    }
}

/// An embedder's tracing layer that panics, where it meets the gate
/// (found by an adversary adopting the library, issue 29): every line the
/// gate logs goes through a guard, so a panicking layer costs that line,
/// never the caller, a node's facts, a run's outcome or the gate.
mod a_panicking_tracing_layer {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use poolgate::core::MembershipUpdate;
    use poolgate::{Gate, GateError, ObservationOutcome};
    use poolgate_actors::core::{Event, OnReadinessLost, Reason, Refusal, RunId, SwimState};
    use poolgate_actors::testing::{advance_by, fail_next, Actor};

    use crate::common::{config, drain, make_ready, node, on_virtual_time, panicking_layer};

    fn gate(members: &[&str]) -> Gate {
        Gate::start(
            config(members, 1000, OnReadinessLost::Wait, None)
                .gate_settings()
                .unwrap(),
        )
    }

    /// `members` ready, r1 committed over `required`.
    async fn committed(gate: &Gate, members: &[&str], required: &[&str]) -> RunId {
        for member in members {
            make_ready(gate, member).await;
        }
        let ready = gate.wait_ready().await.unwrap();
        let run = RunId::new("r1").unwrap();
        gate.begin_planning(run.clone(), Some(ready.epoch))
            .await
            .unwrap();
        let required = required.iter().map(|n| node(n)).collect();
        gate.commit_plan(run.clone(), required, Some(ready.epoch))
            .await
            .unwrap();
        run
    }

    fn swim(name: &str, state: SwimState, incarnation: u64) -> MembershipUpdate {
        MembershipUpdate {
            node: node(name),
            state,
            incarnation,
        }
    }

    #[test]
    fn on_the_line_about_a_non_candidate_does_not_reach_the_caller() {
        let (_layer, armed, _) = panicking_layer(|_, _, m| m.contains("non-candidate"));
        on_virtual_time(async move {
            let gate = gate(&["n1"]);
            armed.store(1, Ordering::SeqCst);
            let outcome = gate.membership(swim("stranger", SwimState::Alive, 1)).await;
            assert!(
                matches!(outcome, Ok(ObservationOutcome::NotCandidate)),
                "{outcome:?}"
            );
            assert_eq!(armed.load(Ordering::SeqCst), 0, "the layer panicked");
        });
    }

    #[test]
    fn on_the_line_about_a_stale_fact_costs_no_facts_and_no_run() {
        // Before: the node actor died, the run faulted `internal`.
        let (_layer, armed, _) = panicking_layer(|_, _, m| m.contains("stale SWIM"));
        on_virtual_time(async move {
            let gate = gate(&["n1", "n2"]);
            let mut events = gate.subscribe();
            let run = committed(&gate, &["n1", "n2"], &["n1"]).await;
            drain(&mut events);
            armed.store(u32::MAX, Ordering::SeqCst);
            let stale = gate.membership(swim("n1", SwimState::Suspect, 0)).await;
            assert!(matches!(stale, Ok(ObservationOutcome::Stale)), "{stale:?}");
            advance_by(Duration::from_millis(10)).await;
            assert!(drain(&mut events).is_empty());
            assert_eq!(gate.report().await.unwrap().run, Some(run));
        });
    }

    #[test]
    fn on_errors_while_the_run_actor_fails_still_tells_the_run_faulted() {
        // Before: the run actor's loss was logged unguarded from a callback
        // of the pool's, the pool actor died, the gate stopped and the
        // run's end was never told.
        let (_layer, armed, _) = panicking_layer(|level, _, _| *level == tracing::Level::ERROR);
        on_virtual_time(async move {
            let gate = gate(&["n1"]);
            let mut events = gate.subscribe();
            let run = committed(&gate, &["n1"], &["n1"]).await;
            drain(&mut events);
            armed.store(u32::MAX, Ordering::SeqCst);
            fail_next(&gate, Actor::Run);
            advance_by(Duration::from_millis(1)).await;
            let finished = gate.finish_run(run.clone()).await;
            assert!(
                matches!(finished, Err(GateError::Refused(Refusal::UnknownRun(_)))),
                "{finished:?}"
            );
            let told = drain(&mut events);
            assert!(
                told.iter().any(|e| matches!(e, Event::RunFaulted { run: r, reason: Reason::Internal, .. } if *r == run)),
                "{told:?}"
            );
            assert!(!gate.is_stopped());
        });
    }

    #[test]
    fn on_errors_with_a_fence_that_panics_stops_the_gate_and_nothing_hangs() {
        // Before: the fence's panic was logged unguarded; every call
        // panicked in the caller and the stream never ended.
        let (_layer, armed, _) = panicking_layer(|level, _, _| *level == tracing::Level::ERROR);
        on_virtual_time(async move {
            let gate = gate(&["n1"]);
            let mut events = gate.subscribe();
            armed.store(u32::MAX, Ordering::SeqCst);
            gate.fence_with(|| panic!("the embedder's fence panicked"));
            let fed = gate.membership(swim("n1", SwimState::Alive, 1)).await;
            assert!(matches!(fed, Err(GateError::Stopped)), "{fed:?}");
            assert!(matches!(gate.report().await, Err(GateError::Stopped)));
            let ended = tokio::time::timeout(Duration::from_secs(60), async {
                while events.recv().await.is_some() {}
            })
            .await;
            assert!(ended.is_ok(), "the stream never ended");
        });
    }

    #[test]
    fn on_the_lag_warning_loses_no_outcome_for_any_subscriber() {
        // Before: with the slow subscriber's queue full to the last place,
        // the run's fault was the first event it lost a place for: the
        // warning said so, panicked in the middle of the publish, and the
        // run's `run_faulted` was lost for every subscriber.
        let (_layer, armed, _) = panicking_layer(|_, _, m| m.contains("fell behind"));
        on_virtual_time(async move {
            let gate = gate(&["n1", "n2"]);
            let mut slow = gate.subscribe_from_now();
            let mut fast = gate.subscribe_from_now();
            let run = committed(&gate, &["n1", "n2"], &["n1"]).await;
            let mut queued = drain(&mut fast).len();
            // n2 (not required) flaps, one event a step, until the slow
            // subscriber's queue is full.
            for step in 2..4 * poolgate::EVENT_QUEUE as u64 {
                if queued >= poolgate::EVENT_QUEUE {
                    break;
                }
                let state = match step % 2 {
                    0 => SwimState::Suspect,
                    _ => SwimState::Alive,
                };
                gate.membership(swim("n2", state, step)).await.unwrap();
                advance_by(Duration::from_millis(1001)).await;
                queued += drain(&mut fast).len();
            }
            assert_eq!((queued, slow.lagged()), (poolgate::EVENT_QUEUE, 0));
            armed.store(u32::MAX, Ordering::SeqCst);
            gate.membership(swim("n1", SwimState::Suspect, 1))
                .await
                .unwrap();
            advance_by(Duration::from_millis(5)).await;
            for (who, got) in [("fast", drain(&mut fast)), ("slow", drain(&mut slow))] {
                let faulted = got
                    .iter()
                    .filter(|e| matches!(e, Event::RunFaulted { run: r, .. } if *r == run))
                    .count();
                assert_eq!(faulted, 1, "{who}: {} events", got.len());
            }
        });
    }

    #[test]
    fn stopping_a_gate_with_a_run_committed_says_which_run() {
        let (_layer, _, seen) = panicking_layer(|_, _, _| false);
        on_virtual_time(async move {
            let gate = gate(&["n1"]);
            committed(&gate, &["n1"], &["n1"]).await;
            gate.stop();
            advance_by(Duration::from_millis(10)).await;
            let said = seen.lock().unwrap().clone();
            assert!(
                said.iter().any(|l| l.starts_with("WARN")
                    && l.contains("r1")
                    && l.contains("no longer guarded")),
                "{said:#?}"
            );
        });
    }
}
