//! Failures inside the subsystem: a node actor or the pool actor that
//! fails is contained and restarted, and never yields a false `PoolReady`.
//! Driven on tokio's paused clock with injected faults.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;

use crate::clock::Clock;
use crate::error::GateError;
use crate::messages::{
    ApplyObservation, BeginPlanning, CommitPlan, GetReport, InjectFault, InjectPoolFault,
    ObservationOutcome, TimerDue,
};
use crate::pool_actor::PoolActor;
use crate::publisher::Publisher;
use crate::router::Router;
use crate::settings::GateSettings;
use poolgate_core::{
    Epoch, Event, IdentityMaterial, NodeId, Observation, OnReadinessLost, PlanningPolicy,
    PoolDefinition, PoolId, PoolPhase, Reason, Refusal, RunId, SwimState, Time,
};

struct Subsystem {
    pool: Addr<PoolActor>,
    router: Arc<Router>,
    clock: Clock,
    events: crate::EventStream,
}

fn on_virtual_time<F: std::future::Future<Output = ()>>(test: F) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    actix::System::with_tokio_rt(move || runtime).block_on(test);
}

fn node(name: &str) -> NodeId {
    NodeId::new(name).unwrap()
}

fn start(members: &[&str]) -> Subsystem {
    let publisher = Publisher::default();
    let events = publisher.subscribe();
    let router = Arc::new(Router::default());
    let clock = Clock::start();
    let settings = GateSettings {
        definition: PoolDefinition::new(
            PoolId::new("p").unwrap(),
            members.iter().map(|m| node(m)).collect(),
        )
        .unwrap(),
        window: Duration::from_millis(1000),
        policy: PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        },
        durable: None,
        record: None,
    };
    let pool = PoolActor::launch(settings, clock, publisher, Arc::clone(&router), None, None);
    Subsystem {
        pool,
        router,
        clock,
        events,
    }
}

/// A gate over `members`, each made ready, past its window (1 s): ready
/// at epoch 1.
async fn ready(members: &[&str]) -> Subsystem {
    let gate = start(members);
    for member in members {
        gate.make_ready(member).await;
    }
    gate.advance_to(1001).await;
    gate
}

impl Subsystem {
    async fn observe(&self, name: &str, observation: Observation) -> ObservationOutcome {
        let addr = self.router.route(&node(name)).expect("a candidate");
        addr.send(ApplyObservation {
            at: self.clock.now(),
            observation,
            fanout: crate::messages::Fanout::Own,
        })
        .await
        .unwrap()
    }

    async fn make_ready(&self, name: &str) {
        self.observe(name, Observation::Known).await;
        self.observe(
            name,
            Observation::Swim {
                state: SwimState::Alive,
                incarnation: 1,
            },
        )
        .await;
        self.observe(name, Observation::Available).await;
        let material = IdentityMaterial::new(name.as_bytes().to_vec()).unwrap();
        self.observe(name, Observation::Identity(material.fingerprint()))
            .await;
    }

    async fn advance_to(&self, ms: u64) {
        tokio::time::sleep_until(self.clock.instant(Time::from_millis(ms))).await;
    }

    async fn phase(&self) -> PoolPhase {
        self.pool
            .send(GetReport {
                at: self.clock.now(),
            })
            .await
            .unwrap()
            .unwrap()
            .phase
    }

    fn drain(&mut self) -> Vec<Event> {
        let mut all = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            all.push(event);
        }
        all
    }
}

#[test]
fn a_failed_node_actor_counts_as_not_ready_and_is_restarted_empty() {
    for fault in [InjectFault::Panic, InjectFault::Stop] {
        on_virtual_time(async move {
            let mut gate = start(&["a", "b"]);
            gate.make_ready("a").await;
            gate.make_ready("b").await;
            gate.advance_to(500).await;
            gate.router.route(&node("b")).unwrap().do_send(fault);
            gate.advance_to(5000).await;
            assert!(
                gate.drain()
                    .iter()
                    .all(|e| !matches!(e, Event::PoolReady { .. })),
                "{fault:?}: no PoolReady with b's facts lost"
            );
            assert_eq!(gate.phase().await, PoolPhase::Forming, "{fault:?}");
            // The restarted actor starts empty and works: b reports again.
            assert_eq!(
                gate.observe("b", Observation::Known).await,
                ObservationOutcome::Changed
            );
            gate.make_ready("b").await;
            gate.advance_to(6001).await;
            assert_eq!(
                gate.phase().await,
                PoolPhase::Ready { epoch: Epoch(1) },
                "{fault:?}"
            );
        });
    }
}

#[test]
fn a_failed_node_actor_faults_a_committed_run_that_requires_it() {
    on_virtual_time(async {
        let mut gate = ready(&["a", "b"]).await;
        let run = RunId::new("r").unwrap();
        let at = gate.clock.now();
        gate.pool
            .send(BeginPlanning {
                at,
                run: run.clone(),
                epoch: None,
            })
            .await
            .unwrap()
            .unwrap();
        gate.pool
            .send(CommitPlan {
                at,
                run: run.clone(),
                required: vec![node("a")],
                epoch: None,
            })
            .await
            .unwrap()
            .unwrap();
        gate.router
            .route(&node("a"))
            .unwrap()
            .do_send(InjectFault::Panic);
        gate.advance_to(1100).await;
        let events = gate.drain();
        assert!(
            events.iter().any(|e| matches!(
                e,
                Event::RunFaulted { node: n, reason: Reason::Internal, .. } if n == &node("a")
            )),
            "{events:?}"
        );
    });
}

#[test]
fn a_restarted_pool_actor_needs_a_fresh_window_and_a_new_epoch() {
    on_virtual_time(async {
        let mut gate = ready(&["a", "b"]).await;
        assert_eq!(gate.phase().await, PoolPhase::Ready { epoch: Epoch(1) });
        gate.pool.do_send(InjectPoolFault::Panic);
        gate.advance_to(1500).await;
        let events = gate.drain();
        assert!(
            events.iter().any(|e| matches!(
                e,
                Event::ReadinessLost {
                    epoch: Epoch(1),
                    ..
                }
            )),
            "{events:?}"
        );
        assert!(matches!(gate.phase().await, PoolPhase::Converging { .. }));
        // A proof from before the restart cannot plan.
        let refused = gate
            .pool
            .send(BeginPlanning {
                at: gate.clock.now(),
                run: RunId::new("r").unwrap(),
                epoch: Some(Epoch(1)),
            })
            .await
            .unwrap();
        assert!(
            matches!(refused, Err(GateError::Refused(Refusal::PoolNotReady))),
            "{refused:?}"
        );
        // Restarted at 1.001 s: the fresh window ends at 2.001 s.
        gate.advance_to(2002).await;
        assert_eq!(gate.phase().await, PoolPhase::Ready { epoch: Epoch(2) });
    });
}

#[test]
fn a_convergence_timer_that_fires_after_the_view_changed_is_ignored() {
    on_virtual_time(async {
        let mut gate = start(&["a"]);
        gate.make_ready("a").await; // timer generation 1, due at 1 s
        gate.advance_to(500).await;
        let bump = Observation::Swim {
            state: SwimState::Alive,
            incarnation: 2,
        };
        // The armed timer (due at 1 s) is kept: re-arming is lazy.
        assert_eq!(gate.observe("a", bump).await, ObservationOutcome::Changed);
        // Messages of other generations arrive late: none fires anything.
        for generation in [0, 2, 7] {
            gate.pool.do_send(TimerDue { generation });
        }
        gate.advance_to(1200).await;
        assert!(gate.drain().is_empty(), "the stale timer was ignored");
        assert!(
            matches!(gate.phase().await, PoolPhase::Converging { deadline } if deadline == Time::from_millis(1500))
        );
        gate.advance_to(1501).await;
        assert_eq!(gate.phase().await, PoolPhase::Ready { epoch: Epoch(1) });
    });
}

/// Plans and commits run `r` over `required` on the ready pool.
async fn commit(gate: &Subsystem, required: &[&str]) -> RunId {
    let run = RunId::new("r").unwrap();
    let at = gate.clock.now();
    gate.pool
        .send(BeginPlanning {
            at,
            run: run.clone(),
            epoch: None,
        })
        .await
        .unwrap()
        .unwrap();
    gate.pool
        .send(CommitPlan {
            at,
            run: run.clone(),
            required: required.iter().map(|n| node(n)).collect(),
            epoch: None,
        })
        .await
        .unwrap()
        .unwrap();
    run
}

#[test]
fn a_run_actor_that_fails_faults_its_run_internal_and_never_drops_it() {
    // Issue 29, reproduction 1: a panic in what the run actor runs (the
    // fence, a metrics recorder) left events `readiness_lost` only, no
    // `run_faulted`; the report said no run; finish_run said UnknownRun;
    // and a new run was admitted.
    on_virtual_time(async {
        let mut gate = ready(&["a", "b"]).await;
        let run = commit(&gate, &["a", "b"]).await;
        gate.pool.do_send(InjectPoolFault::PanicRunActor);
        gate.advance_to(1100).await;
        // The next change of a required node finds the run's actor gone.
        assert_eq!(
            gate.observe(
                "b",
                Observation::Swim {
                    state: SwimState::Suspect,
                    incarnation: 1
                }
            )
            .await,
            ObservationOutcome::Changed
        );
        gate.advance_to(1200).await;
        let events = gate.drain();
        let faults: Vec<&Event> = events
            .iter()
            .filter(|e| matches!(e, Event::RunFaulted { .. }))
            .collect();
        assert!(
            matches!(
                faults.as_slice(),
                [Event::RunFaulted { run: r, reason: Reason::Internal, .. }] if *r == run
            ),
            "{events:?}"
        );
    });
}

#[test]
fn finishing_a_run_whose_actor_failed_faults_it_internal_first() {
    on_virtual_time(async {
        let mut gate = ready(&["a"]).await;
        let run = commit(&gate, &["a"]).await;
        gate.pool.do_send(InjectPoolFault::PanicRunActor);
        gate.advance_to(1100).await;
        let finished = gate
            .pool
            .send(crate::messages::FinishRun {
                at: gate.clock.now(),
                run: run.clone(),
            })
            .await
            .unwrap();
        assert!(
            matches!(finished, Err(GateError::Refused(Refusal::UnknownRun(_)))),
            "{finished:?}"
        );
        gate.advance_to(1200).await;
        let events = gate.drain();
        assert!(
            events.iter().any(|e| matches!(
                e,
                Event::RunFaulted { run: r, reason: Reason::Internal, node: n, .. } if *r == run && *n == node("a")
            )),
            "{events:?}"
        );
    });
}

#[test]
fn a_pool_actor_whose_restart_fails_ends_every_stream_and_stops_its_nodes() {
    // Issue 29, reproduction 2: the subscriber waited for ever (60 s of
    // virtual time: no event, no end) once the pool actor was gone.
    on_virtual_time(async {
        let mut gate = ready(&["a", "b"]).await;
        let _ = gate.drain();
        gate.pool.do_send(InjectPoolFault::PanicAndFailRestart);
        let ended = tokio::time::timeout(Duration::from_secs(60), async {
            while gate.events.recv().await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the stream never ended");
        assert!(
            gate.router.route(&node("a")).is_none(),
            "node actors let go"
        );
        assert!(
            gate.pool
                .send(GetReport {
                    at: gate.clock.now()
                })
                .await
                .is_err(),
            "the pool actor is gone"
        );
    });
}

/// Run r1 committed over a (of a and b); the pool then fails on the next
/// change it hears, before its core does: `name` suspected.
async fn committed_then_failing_on(name: &str) -> (Subsystem, RunId) {
    let mut gate = ready(&["a", "b"]).await;
    let run = commit(&gate, &["a"]).await;
    let _ = gate.drain();
    gate.pool.do_send(InjectPoolFault::PanicOnNextChange);
    gate.observe(name, suspect()).await;
    (gate, run)
}

fn suspect() -> Observation {
    Observation::Swim {
        state: SwimState::Suspect,
        incarnation: 1,
    }
}

/// Asserts that the events since the last drain hold one `run_faulted`:
/// `run`, for node a's suspicion.
fn faulted_once_by_a(gate: &mut Subsystem, run: &RunId) {
    let faults: Vec<Event> = gate
        .drain()
        .into_iter()
        .filter(|e| matches!(e, Event::RunFaulted { .. }))
        .collect();
    assert!(
        matches!(
            faults.as_slice(),
            [Event::RunFaulted { run: r, node: n, reason: Reason::Suspect, .. }] if r == run && *n == node("a")
        ),
        "{faults:?}"
    );
}

#[test]
fn a_pool_actor_that_fails_on_a_change_restarts_and_the_run_stays_guarded() {
    // Issue 29, reproduction 2: a panic in the pool actor outside the
    // core ended the gate; the committed run went unguarded. Now the actor
    // restarts from the core; the run's actor, not the pool's, still
    // guards the run.
    on_virtual_time(async {
        let (mut gate, run) = committed_then_failing_on("b").await;
        tokio::task::yield_now().await;
        // Restarted: readiness starts over, the run is still committed.
        assert!(!matches!(gate.phase().await, PoolPhase::Ready { .. }));
        let report = gate
            .pool
            .send(GetReport {
                at: gate.clock.now(),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(report.run.as_ref(), Some(&run), "{report:?}");
        // Still guarded: its required node's loss faults it.
        gate.observe("a", suspect()).await;
        gate.advance_to(1100).await;
        faulted_once_by_a(&mut gate, &run);
    });
}

#[test]
fn a_pool_actor_that_fails_at_every_restart_is_given_up_and_nothing_hangs() {
    // A fault that comes back at every restart must not restart the actor
    // for ever: after ten failures within ten seconds the gate ends, its
    // stream with it.
    on_virtual_time(async {
        let mut gate = ready(&["a", "b"]).await;
        let _ = gate.drain();
        gate.pool.do_send(InjectPoolFault::PanicAlways);
        gate.observe(
            "b",
            Observation::Swim {
                state: SwimState::Suspect,
                incarnation: 1,
            },
        )
        .await;
        let ended = tokio::time::timeout(Duration::from_secs(60), async {
            while gate.events.recv().await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the stream never ended");
        assert!(
            gate.router.route(&node("a")).is_none(),
            "node actors let go"
        );
    });
}

#[test]
fn a_required_nodes_loss_the_pool_failed_on_still_faults_the_run() {
    // Found by the property test: the pool failed on a required node's
    // change; its restart reported the node afresh (not ready before and
    // after), and the run's guard saw no loss: the run stayed committed
    // over a suspect node.
    on_virtual_time(async {
        let (mut gate, run) = committed_then_failing_on("a").await;
        gate.advance_to(1100).await;
        faulted_once_by_a(&mut gate, &run);
    });
}
