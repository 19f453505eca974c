//! Metric values after a scripted scenario, read with a test recorder
//! (`metrics-util`'s debugging recorder, installed for this thread only).

use crate::common::{self, *};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use poolgate::core::{AgentReport, MembershipUpdate};
use poolgate::{Gate, GateError};
use poolgate_actors::core::{Epoch, OnReadinessLost, Refusal, RunId, SwimState};

/// A metric as read back: name, labels, value.
type Reading = (String, Vec<(String, String)>, DebugValue);

fn value(snapshot: &[Reading], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    snapshot.iter().find_map(|(n, labels, v)| {
        let labelled = match label {
            Some((k, val)) => labels.iter().any(|(a, b)| a == k && b == val),
            None => true,
        };
        (n == name && labelled).then(|| match v {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.first().map(|x| x.into_inner()).unwrap_or(f64::NAN),
        })
    })
}

#[test]
fn metrics_follow_a_scripted_scenario() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        on_virtual_time(async {
            let gate = Gate::start(
                config(&["n1", "n2", "n3"], 5000, OnReadinessLost::Wait, None)
                    .gate_settings()
                    .unwrap(),
            );
            for n in ["n1", "n2", "n3"] {
                make_ready(&gate, n).await; // 12 applied
            }
            advance_to(&gate, 1000).await;
            swim(&gate, "n1", SwimState::Alive, 2).await; // a restart, view_changed
            gate.agent(AgentReport::Available { node: node("n1") })
                .await
                .unwrap(); // duplicate
            swim(&gate, "n1", SwimState::Suspect, 1).await; // stale
            swim(&gate, "outsider", SwimState::Alive, 1).await; // non-candidate
            let refused = gate
                .commit_plan(RunId::new("empty").unwrap(), Vec::new(), None)
                .await;
            assert!(matches!(
                refused,
                Err(GateError::Refused(Refusal::InvalidPlan(_)))
            ));
            advance_to(&gate, 6001).await; // PoolReady at 6 s
            let run = RunId::new("r").unwrap();
            gate.begin_planning(run.clone(), Some(Epoch(1)))
                .await
                .unwrap();
            gate.commit_plan(run, vec![node("n2")], None).await.unwrap();
            gate.membership(MembershipUpdate {
                node: node("n2"),
                state: SwimState::Suspect,
                incarnation: 1,
            })
            .await
            .unwrap(); // readiness lost (restart, suspect) and run faulted
            advance_to(&gate, 6002).await;
        });
    });
    let snapshot: Vec<Reading> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, v)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (key.name().to_string(), labels, v)
        })
        .collect();
    let get = |name, label| value(&snapshot, name, label);
    assert_eq!(
        get("poolgate_observations_total", Some(("outcome", "applied"))),
        Some(14.0)
    );
    assert_eq!(
        get(
            "poolgate_observations_total",
            Some(("outcome", "duplicate"))
        ),
        Some(1.0)
    );
    assert_eq!(
        get("poolgate_observations_total", Some(("outcome", "stale"))),
        Some(1.0)
    );
    assert_eq!(
        get(
            "poolgate_observations_total",
            Some(("outcome", "non_candidate"))
        ),
        Some(1.0)
    );
    assert_eq!(
        get("poolgate_rejected_total", Some(("error", "invalid_plan"))),
        Some(1.0)
    );
    assert_eq!(
        get(
            "poolgate_window_restarts_total",
            Some(("cause", "view_changed"))
        ),
        Some(1.0)
    );
    assert_eq!(
        get("poolgate_window_restarts_total", Some(("cause", "suspect"))),
        Some(1.0)
    );
    assert_eq!(get("poolgate_time_to_ready_seconds", None), Some(6.0));
    assert_eq!(
        get("poolgate_runs_faulted_total", Some(("reason", "suspect"))),
        Some(1.0)
    );
    assert_eq!(
        get(
            "poolgate_candidates_blocked",
            Some(("condition", "suspect"))
        ),
        Some(1.0)
    );
    assert_eq!(
        get(
            "poolgate_candidates_blocked",
            Some(("condition", "unknown"))
        ),
        Some(0.0)
    );
}

#[test]
fn a_metrics_recorder_that_panics_costs_its_figure_never_a_runs_fault() {
    // Issue 29, reproduction 1: a recorder that panicked on
    // poolgate_runs_faulted_total left events readiness_lost only: the
    // run's fault was never told, and the run was dropped.
    let recorder =
        common::PanickingRecorder(|key: &metrics::Key| key.name() == "poolgate_runs_faulted_total");
    metrics::with_local_recorder(&recorder, || {
        on_virtual_time(async {
            let gate = Gate::start(
                config(&["n1"], 1000, OnReadinessLost::Wait, None)
                    .gate_settings()
                    .unwrap(),
            );
            let mut events = gate.subscribe();
            make_ready(&gate, "n1").await;
            let ready = gate.wait_ready().await.unwrap();
            let run = RunId::new("r1").unwrap();
            gate.begin_planning(run.clone(), Some(ready.epoch))
                .await
                .unwrap();
            gate.commit_plan(run.clone(), vec![node("n1")], Some(ready.epoch))
                .await
                .unwrap();
            swim(&gate, "n1", SwimState::Suspect, 1).await;
            let faulted = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                loop {
                    match events.recv().await {
                        Some(poolgate::core::Event::RunFaulted { run: r, .. }) => return Some(r),
                        Some(_) => continue,
                        None => return None,
                    }
                }
            })
            .await;
            assert_eq!(faulted, Ok(Some(run.clone())), "the fault was told");
            assert_eq!(gate.report().await.unwrap().run, None);
            // The gate goes on: another run can be planned once ready.
            assert!(!gate.is_stopped());
        })
    });
}
