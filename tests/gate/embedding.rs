//! The library as an embedder meets it (issue 21): what it does around
//! the edges of an actix `System`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use poolgate::live::Orchestrator;
use poolgate::Config;

#[test]
fn a_system_dropped_right_after_an_orchestrator_started_panics_nowhere() {
    // Embedder: the SWIM member's first run came during the System's drop
    // and panicked inside actix ("there is no reactor running").
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&panics);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The hook is the process's: a panic another test of this binary
        // injects on purpose (the testing module's) is not this test's.
        let injected = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("injected"));
        if !injected {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
        "inline",
    )
    .unwrap();
    for _ in 0..3 {
        let system = actix::System::new();
        system.block_on(async {
            let live = Orchestrator::start(&config).await.unwrap();
            live.shutdown();
            actix::System::current().stop();
        });
        drop(system);
    }
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[test]
fn settings_built_in_code_that_the_config_file_would_refuse_are_errors_not_panics() {
    // Embedder: max_connections = 0 closed every connection at once; a
    // wait timeout below the window was taken; a window of Duration::MAX
    // killed the pool actor.
    let base = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
        "inline",
    )
    .unwrap();
    let mut no_slots = base.clone();
    no_slots.agents.max_connections = 0;
    let mut no_label = base.clone();
    no_label.swim.label = String::new();
    let mut short_wait = base.clone();
    short_wait.planning.wait_timeout = Some(std::time::Duration::from_millis(1));
    let mut endless = base.clone();
    endless.convergence_window = std::time::Duration::MAX;
    for (config, says) in [
        (no_slots, "agents.max_connections"),
        (no_label, "swim.label"),
        (short_wait, "wait timeout"),
        (endless, "365 days"),
    ] {
        actix::System::new().block_on(async move {
            let started = Orchestrator::start(&config).await;
            let Err(error) = started else {
                panic!("started with a setting the config file refuses ({says})");
            };
            assert!(error.to_string().contains(says), "{error}");
        });
    }
}

#[test]
fn a_fenced_gate_stops_acting_the_moment_its_fence_says_no() {
    // A replica frozen past its lease (SIGSTOP) wakes with its gate's
    // timers due and frames in its sockets: nothing may be published or
    // taken before its own leadership check notices.
    use poolgate::core::{AgentReport, NodeId};
    use std::sync::atomic::AtomicBool;
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"20ms\"\n",
        "inline",
    )
    .unwrap();
    actix::System::new().block_on(async move {
        let gate = poolgate::Gate::try_start(config.gate_settings().unwrap()).unwrap();
        let leads = Arc::new(AtomicBool::new(true));
        let fence = Arc::clone(&leads);
        gate.fence_with(move || fence.load(Ordering::SeqCst));
        let mut events = gate.subscribe();
        let node = NodeId::new("node-1").unwrap();
        crate::common::make_ready(&gate, "node-1").await;
        // The window is running; the leadership ends before it is over.
        leads.store(false, Ordering::SeqCst);
        // The window's end would publish pool_ready: the stream ends instead.
        assert!(
            events.recv().await.is_none(),
            "published after the fence said no"
        );
        assert!(gate.is_stopped());
        let refused = gate.agent(AgentReport::Unavailable { node }).await;
        assert!(
            matches!(refused, Err(poolgate::GateError::Stopped)),
            "{refused:?}"
        );
    });
}

#[test]
fn a_membership_source_without_incarnations_refutes_a_suspicion_through_plain_membership() {
    // Issue 21: a non-SWIM source saying alive, suspect, alive. Fed as is
    // (the same incarnation each time) the gate keeps the node suspect
    // (SWIM's precedence); through PlainMembership the pool is ready again.
    use poolgate::core::{
        AgentReport, Event, MembershipUpdate, NodeId, PlainMembership, RegistryFact, SwimState,
    };
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"20ms\"\n",
        "inline",
    )
    .unwrap();
    actix::System::new().block_on(async move {
        let node = NodeId::new("node-1").unwrap();
        let blocked_by_suspicion = |naive: bool| {
            let settings = config.gate_settings().unwrap();
            let node = node.clone();
            async move {
                let gate = poolgate::Gate::try_start(settings).unwrap();
                let mut source = PlainMembership::default();
                let mut say = |state| match naive {
                    true => Some(MembershipUpdate {
                        node: node.clone(),
                        state,
                        incarnation: 1,
                    }),
                    false => source.update(node.clone(), state),
                };
                gate.registry(RegistryFact::Known { node: node.clone() })
                    .await
                    .unwrap();
                gate.agent(AgentReport::Available { node: node.clone() })
                    .await
                    .unwrap();
                gate.identity(node.clone(), b"key".to_vec()).await.unwrap();
                let mut events = gate.subscribe();
                for state in [SwimState::Alive, SwimState::Suspect, SwimState::Alive] {
                    if let Some(update) = say(state) {
                        gate.membership(update).await.unwrap();
                    }
                }
                let report = gate.report().await.unwrap();
                let suspect = report.candidates[0].blockers_in_words().contains("suspect");
                if !suspect {
                    // Ready again: a pool_ready follows the window.
                    while !matches!(events.recv().await, Some(Event::PoolReady { .. })) {}
                }
                gate.stop();
                suspect
            }
        };
        assert!(
            blocked_by_suspicion(true).await,
            "the naive feed was expected to stay suspect (SWIM's precedence)"
        );
        assert!(!blocked_by_suspicion(false).await);
    });
}

#[test]
fn one_agent_frame_is_one_input_applied_in_order() {
    // Issue 21: what one frame says goes to the node's actor in one trip,
    // applied in order at one instant: here the four facts of readiness,
    // then the same again (all duplicates), then to a non-candidate.
    use poolgate::core::{Fingerprint, NodeId, Observation, SwimState};
    use poolgate::ObservationOutcome;
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"20ms\"\n",
        "inline",
    )
    .unwrap();
    actix::System::new().block_on(async move {
        let gate = poolgate::Gate::try_start(config.gate_settings().unwrap()).unwrap();
        let node = NodeId::new("node-1").unwrap();
        let frame = vec![
            Observation::Known,
            Observation::Swim {
                state: SwimState::Alive,
                incarnation: 1,
            },
            Observation::Available,
            Observation::Identity(Fingerprint::of(b"key")),
        ];
        let outcomes = gate.observe_all(node.clone(), frame.clone()).await.unwrap();
        assert_eq!(outcomes, vec![ObservationOutcome::Changed; 4]);
        let report = gate.report().await.unwrap();
        assert!(report.candidates[0].verdict.is_ready());
        let again = gate.observe_all(node, frame.clone()).await.unwrap();
        assert_eq!(again, vec![ObservationOutcome::Duplicate; 4]);
        let stranger = NodeId::new("node-9").unwrap();
        let ignored = gate.observe_all(stranger, frame).await.unwrap();
        assert_eq!(ignored, vec![ObservationOutcome::NotCandidate; 4]);
        gate.wait_ready().await.unwrap();
        gate.stop();
    });
}

#[test]
fn a_batch_about_a_stranger_is_counted_as_its_observations_are() {
    use poolgate::core::{MembershipUpdate, NodeId, Observation, SwimState};
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"100ms\"\n",
        "test",
    )
    .unwrap();
    let system = actix::System::new();
    system.block_on(async move {
        let gate = poolgate::Gate::start(config.gate_settings().unwrap());
        let stranger = NodeId::new("node-9").unwrap();
        let frame = vec![
            Observation::Swim {
                state: SwimState::Alive,
                incarnation: 1,
            },
            Observation::Recovered,
            Observation::Available,
        ];
        gate.observe_all(stranger.clone(), frame).await.unwrap();
        let batched = gate.report().await.unwrap().ignored_non_candidate;
        // The same three, one at a time.
        gate.membership(MembershipUpdate {
            node: stranger.clone(),
            state: SwimState::Alive,
            incarnation: 1,
        })
        .await
        .unwrap();
        gate.agent(poolgate::core::AgentReport::Recovered {
            node: stranger.clone(),
        })
        .await
        .unwrap();
        gate.agent(poolgate::core::AgentReport::Available {
            node: stranger.clone(),
        })
        .await
        .unwrap();
        let sequential = gate.report().await.unwrap().ignored_non_candidate - batched;
        let empty = gate.observe_all(stranger, Vec::new()).await.unwrap();
        assert!(empty.is_empty());
        let after_empty = gate.report().await.unwrap().ignored_non_candidate - batched - sequential;
        gate.stop();
        assert_eq!(
            batched, sequential,
            "three ignored observations, counted as three"
        );
        assert_eq!(after_empty, 0, "an empty batch ignores nothing");
    });
}

#[test]
fn an_embedder_tests_its_code_with_the_gates_testing_module() {
    // Issue 29, reproduction 6: the paused-clock helper lived in the
    // private tests/common; nothing let an embedder make an actor fail.
    use poolgate_actors::testing::{advance_by, fail_next, make_ready, on_virtual_time, Actor};
    on_virtual_time(async {
        let settings = poolgate::Config::parse(
            "[pool]\nid = \"p\"\nmembers = [\"n1\", \"n2\"]\n[readiness]\nconvergence_window = \"30s\"\n",
            "embedder",
        )
        .unwrap()
        .gate_settings()
        .unwrap();
        let gate = poolgate::Gate::start(settings);
        let mut events = gate.subscribe();
        let (n1, n2) = (
            poolgate::core::NodeId::new("n1").unwrap(),
            poolgate::core::NodeId::new("n2").unwrap(),
        );
        make_ready(&gate, &n1, b"n1").await.unwrap();
        make_ready(&gate, &n2, b"n2").await.unwrap();
        let started = std::time::Instant::now();
        advance_by(std::time::Duration::from_secs(30)).await;
        let ready = gate.wait_ready().await.unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "virtual time"
        );
        let run = poolgate::core::RunId::new("r").unwrap();
        gate.begin_planning(run.clone(), Some(ready.epoch))
            .await
            .unwrap();
        gate.commit_plan(run.clone(), vec![n1.clone()], Some(ready.epoch))
            .await
            .unwrap();
        // The run's actor fails on its next message: the run faults
        // `internal` when the next change of n1 reaches it.
        fail_next(&gate, Actor::Run);
        advance_by(std::time::Duration::from_millis(10)).await;
        gate.membership(poolgate::core::MembershipUpdate {
            node: n1.clone(),
            state: poolgate::core::SwimState::Alive,
            incarnation: 2,
        })
        .await
        .unwrap();
        let reason = loop {
            match events.recv().await.expect("events") {
                poolgate::core::Event::RunFaulted { reason, .. } => break reason,
                _ => continue,
            }
        };
        assert_eq!(reason, poolgate::core::Reason::Internal);
        // A node actor made to fail is restarted empty: n2 is not ready
        // until it reports again.
        fail_next(&gate, Actor::Node(n2.clone()));
        gate.membership(poolgate::core::MembershipUpdate {
            node: n2.clone(),
            state: poolgate::core::SwimState::Alive,
            incarnation: 2,
        })
        .await
        .unwrap();
        advance_by(std::time::Duration::from_millis(10)).await;
        let report = gate.report().await.unwrap();
        let n2_ready = report
            .candidates
            .iter()
            .find(|c| c.node == n2)
            .is_some_and(|c| c.verdict.is_ready());
        assert!(!n2_ready, "n2's facts went with its actor");
    });
}
