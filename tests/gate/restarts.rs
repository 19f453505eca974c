//! Restarts at random points (issue 20, design §9): random inputs and
//! commands to a gate with a store that sometimes fails, the gate stopped
//! at random points (a stop right after a write is a stop between the
//! durable write and the publish: the next life starts from what was
//! written) and started again from what the store holds. Invariants, over
//! every life: an epoch is never told twice (each `pool_ready` is above
//! every one before); every told epoch is stored; a committed run that did
//! not end is in the store and guarded in every later life.

use std::sync::{Arc, Mutex};

use crate::common::*;
use poolgate::core::{Durable, Event, MembershipUpdate, OnReadinessLost, RunId, SwimState};
use poolgate::{DurableSettings, Gate, GateSettings, StateStore, StoreError};
use proptest::prelude::*;

#[derive(Debug, Default)]
struct Store {
    saved: Mutex<Option<Durable>>,
    failing: Mutex<bool>,
}

impl StateStore for Store {
    fn save(&self, state: &Durable) -> Result<(), StoreError> {
        if *self.failing.lock().unwrap() {
            return Err(StoreError("disk full".into()));
        }
        *self.saved.lock().unwrap() = Some(state.clone());
        Ok(())
    }
}

fn settings(store: Arc<Store>, restored: Durable) -> GateSettings {
    let mut settings = config(&["a", "b"], 1000, OnReadinessLost::Wait, None)
        .gate_settings()
        .unwrap();
    settings.durable = Some(DurableSettings {
        store,
        restored,
        restore_grace: std::time::Duration::from_secs(3),
    });
    settings
}

#[derive(Debug, Clone)]
enum Step {
    /// Node 0 or 1 alive (a higher incarnation), available, with identity.
    Ready(usize),
    /// Node 0 or 1 suspect.
    Suspect(usize),
    /// Time passes (ms).
    Advance(u64),
    Begin,
    Commit,
    Finish,
    /// Writes fail from now on (or succeed again).
    Failing(bool),
    /// The process stops here; a new one starts from the store.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2usize).prop_map(Step::Ready),
        1 => (0..2usize).prop_map(Step::Suspect),
        3 => (1..2500u64).prop_map(Step::Advance),
        2 => Just(Step::Begin),
        2 => Just(Step::Commit),
        1 => Just(Step::Finish),
        1 => any::<bool>().prop_map(Step::Failing),
        2 => Just(Step::Restart),
    ]
}

/// What every life so far has shown.
#[derive(Debug, Default)]
struct History {
    told: Vec<u64>,
    /// Committed in some life and not ended since.
    active: Option<RunId>,
}

impl History {
    fn saw(&mut self, events: &[Event]) -> Result<(), String> {
        for event in events {
            match event {
                Event::PoolReady { epoch, .. } => {
                    if self.told.iter().any(|t| *t >= epoch.0) {
                        return Err(format!("epoch {} told after {:?}", epoch.0, self.told));
                    }
                    self.told.push(epoch.0);
                }
                Event::RunCommitted { run, .. } => self.active = Some(run.clone()),
                Event::RunFaulted { run, .. } | Event::RunFinished { run, .. }
                    if self.active.as_ref() == Some(run) =>
                {
                    self.active = None;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

async fn life(
    gate: &Gate,
    steps: &[Step],
    store: &Store,
    history: &mut History,
    life: usize,
) -> Result<(), String> {
    let mut events = gate.subscribe();
    let mut incarnations = [0u64; 2];
    let mut planning: Option<RunId> = None;
    // A run committed before and not ended is guarded again.
    if let Some(run) = &history.active {
        let report = gate.report().await.map_err(|e| e.to_string())?;
        if report.run.as_ref() != Some(run) {
            return Err(format!("run {run} not restored (active: {:?})", report.run));
        }
    }
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Ready(n) => {
                let name = ["a", "b"][*n];
                incarnations[*n] += 1;
                make_ready(gate, name).await;
                let _ = gate
                    .membership(MembershipUpdate {
                        node: node(name),
                        state: SwimState::Alive,
                        incarnation: incarnations[*n] + 1,
                    })
                    .await;
            }
            Step::Suspect(n) => {
                let name = ["a", "b"][*n];
                swim(gate, name, SwimState::Suspect, incarnations[*n] + 1).await;
            }
            Step::Advance(ms) => advance_to(gate, now_ms(gate) + ms).await,
            Step::Begin => {
                let run = RunId::new(&format!("r{life}-{i}")).unwrap();
                if gate.begin_planning(run.clone(), None).await.is_ok() {
                    planning = Some(run);
                }
            }
            Step::Commit => {
                if let Some(run) = planning.clone() {
                    let _ = gate.commit_plan(run, vec![node("a")], None).await;
                }
            }
            Step::Finish => {
                if let Some(run) = history.active.clone() {
                    let _ = gate.finish_run(run).await;
                }
            }
            Step::Failing(failing) => *store.failing.lock().unwrap() = *failing,
            Step::Restart => {}
        }
        history.saw(&drain(&mut events))?;
    }
    // What the life's last step set off is told before it ends: a round
    // trip through the gate, then what was published meanwhile.
    let _ = gate.report().await;
    history.saw(&drain(&mut events))?;
    Ok(())
}

fn check(steps: Vec<Step>) -> Result<(), String> {
    let store = Arc::new(Store::default());
    let mut history = History::default();
    let lives: Vec<&[Step]> = steps.split(|s| matches!(s, Step::Restart)).collect();
    for (n, steps) in lives.into_iter().enumerate() {
        let restored = store.saved.lock().unwrap().clone().unwrap_or_default();
        if let Some(top) = history.told.iter().max() {
            if restored.last_epoch < *top {
                return Err(format!("told epoch {top}, stored {}", restored.last_epoch));
            }
        }
        if let Some(run) = &history.active {
            let kept = restored
                .run
                .as_ref()
                .is_some_and(|r| r.committed && r.run == *run);
            if !kept {
                return Err(format!("run {run} not in the store: {restored:?}"));
            }
        }
        let outcome = Arc::new(Mutex::new(Ok(())));
        let mut lived = std::mem::take(&mut history);
        on_virtual_time({
            let (store, outcome) = (Arc::clone(&store), Arc::clone(&outcome));
            let lived = &mut lived;
            async move {
                let gate = Gate::start(settings(Arc::clone(&store), restored));
                *outcome.lock().unwrap() = life(&gate, steps, &store, lived, n).await;
            }
        });
        history = lived;
        let result = outcome.lock().unwrap().clone();
        result?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_epoch_is_told_twice_and_a_committed_run_outlives_every_restart(
        steps in proptest::collection::vec(step(), 1..48)
    ) {
        prop_assert_eq!(check(steps), Ok(()));
    }
}

#[test]
fn a_commit_then_two_restarts_in_a_row_keep_the_run_guarded() {
    // Issue 20: the run was dropped from the file at the first write after
    // one restart; a second crash forgot it.
    let steps = vec![
        Step::Ready(0),
        Step::Ready(1),
        Step::Advance(1500),
        Step::Begin,
        Step::Commit,
        Step::Restart,
        Step::Ready(0),
        Step::Ready(1),
        Step::Advance(1500),
        Step::Restart,
    ];
    assert_eq!(check(steps), Ok(()));
}
