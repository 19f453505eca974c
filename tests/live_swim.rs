//! The gate on a real SWIM cluster: foca over UDP on 127.0.0.1, the real
//! clock, bounded in time (the test gives up after 30 s).

use std::time::Duration;

use poolgate::live::demo::LiveCluster;
use poolgate::Config;
use poolgate_actors::core::{Event, NodeId, Reason, RunId};

const CONFIG: &str = r#"
[pool]
id = "live"
members = ["unused"]
[readiness]
convergence_window = "300ms"
[planning]
on_readiness_lost = "wait"
[swim]
probe_period = "200ms"
probe_rtt = "60ms"
suspicion_timeout = "1s"
[demo]
nodes = 3
"#;

fn node(name: &str) -> NodeId {
    NodeId::new(name).unwrap()
}

/// Waits for the first event that `pick` accepts; every event seen is kept.
async fn until<T>(
    events: &mut poolgate::EventStream,
    seen: &mut Vec<Event>,
    mut pick: impl FnMut(&Event) -> Option<T>,
) -> T {
    loop {
        let event = events.recv().await.expect("the gate is running");
        seen.push(event.clone());
        if let Some(found) = pick(&event) {
            return found;
        }
    }
}

#[test]
fn a_real_swim_cluster_forms_the_pool_and_faults_the_run_on_a_crash() {
    let config = Config::parse(CONFIG, "live-test").unwrap();
    let system = actix::System::new();
    let story = async {
        // 4 members: the orchestrator's and 3 nodes'.
        let mut cluster = LiveCluster::start(&config, 42).await.unwrap();
        let gate = cluster.gate.clone();
        let mut events = gate.subscribe();
        let mut seen = Vec::new();
        cluster
            .start_agents(Duration::from_millis(100))
            .await
            .unwrap();

        let epoch = until(&mut events, &mut seen, |e| match e {
            Event::PoolReady { epoch, members, .. } => {
                assert_eq!(members, &[node("node-1"), node("node-2"), node("node-3")]);
                Some(*epoch)
            }
            _ => None,
        })
        .await;
        let run = RunId::new("run-live").unwrap();
        gate.begin_planning(run.clone(), Some(epoch)).await.unwrap();
        gate.commit_plan(
            run.clone(),
            vec![node("node-1"), node("node-2")],
            Some(epoch),
        )
        .await
        .unwrap();

        // A graceful leave of a non-required member: readiness is lost,
        // the run is not faulted.
        cluster.leave(&node("node-3"));
        let reason = until(&mut events, &mut seen, |e| match e {
            Event::ReadinessLost {
                node: Some(n),
                reason,
                ..
            } if n == &node("node-3") => Some(*reason),
            _ => None,
        })
        .await;
        assert!(matches!(reason, Reason::Left | Reason::Dead), "{reason:?}");

        // A required member's socket stops answering: the run faults.
        cluster.crash(&node("node-1"));
        let (faulted, reason) = until(&mut events, &mut seen, |e| match e {
            Event::RunFaulted { node, reason, .. } => Some((node.clone(), *reason)),
            _ => None,
        })
        .await;
        assert_eq!(faulted, node("node-1"));
        assert!(
            matches!(reason, Reason::Suspect | Reason::Dead),
            "{reason:?}"
        );
        let faults = seen
            .iter()
            .filter(|e| matches!(e, Event::RunFaulted { .. }))
            .count();
        assert_eq!(faults, 1, "{seen:?}");
        cluster.shut_down();
    };
    system.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), story)
            .await
            .expect("the live cluster story finishes within 30 s");
    });
}
