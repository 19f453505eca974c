use super::*;

use crate::node::{Applied, NodeFacts, Observation, SwimState};
use crate::run::OnReadinessLost;
use crate::test_support::{node, run, t};
use crate::{IdentityMaterial, PoolId};

const WINDOW: Duration = Duration::from_millis(100);

/// A gate over `a` and `b`, waiting up to `wait` ms on lost readiness.
struct Harness {
    gate: PoolMachine,
    facts: Vec<(NodeId, SlotKey, NodeFacts)>,
    out: Vec<Event>,
}

impl Harness {
    fn new(wait: Option<u64>) -> Self {
        let definition =
            PoolDefinition::new(PoolId::new("p").unwrap(), vec![node("a"), node("b")]).unwrap();
        let policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: wait.map(Duration::from_millis),
        };
        let (gate, added) = PoolMachine::new(&definition, WINDOW, policy, t(0));
        let facts = added
            .into_iter()
            .map(|(id, key)| (id, key, NodeFacts::default()))
            .collect();
        Harness {
            gate,
            facts,
            out: Vec::new(),
        }
    }

    fn observe(&mut self, at: u64, name: &str, observation: Observation) {
        let (_, key, facts) = self
            .facts
            .iter_mut()
            .find(|(id, ..)| id.as_str() == name)
            .unwrap();
        if let Applied::Changed(change) = facts.apply(observation) {
            self.gate.node_changed(*key, t(at), &change, &mut self.out);
        }
    }

    fn make_ready(&mut self, at: u64, name: &str, incarnation: u64) {
        self.observe(at, name, Observation::Known);
        let alive = Observation::Swim {
            state: SwimState::Alive,
            incarnation,
        };
        self.observe(at, name, alive);
        self.observe(at, name, Observation::Available);
        let material = IdentityMaterial::new(name.as_bytes().to_vec()).unwrap();
        self.observe(at, name, Observation::Identity(material.fingerprint()));
    }

    fn ready_at_100(wait: Option<u64>) -> Self {
        let mut h = Harness::new(wait);
        h.make_ready(0, "a", 1);
        h.make_ready(0, "b", 1);
        h.gate.on_deadline(t(100), &mut h.out);
        assert_eq!(h.gate.readiness().ready_epoch(), Some(Epoch(1)));
        h.out.clear();
        h
    }

    fn names(&self) -> Vec<(&'static str, u64)> {
        self.out
            .iter()
            .map(|e| (e.name(), e.at().as_millis()))
            .collect()
    }
}

#[test]
fn planning_begins_only_on_a_ready_pool_on_its_current_epoch_one_run_at_a_time() {
    let mut h = Harness::new(None);
    assert_eq!(
        h.gate.begin(run("r"), None, t(0), &mut h.out),
        Err(Refusal::PoolNotReady)
    );
    let mut h = Harness::ready_at_100(None);
    assert!(matches!(
        h.gate.begin(run("r"), Some(Epoch(7)), t(101), &mut h.out),
        Err(Refusal::StaleEpoch { .. })
    ));
    assert_eq!(
        h.gate.begin(run("r"), Some(Epoch(1)), t(101), &mut h.out),
        Ok(Epoch(1))
    );
    assert_eq!(
        h.gate.begin(run("s"), None, t(102), &mut h.out),
        Err(Refusal::RunInProgress(run("r")))
    );
}

#[test]
fn a_planning_or_suspended_run_is_withdrawn_and_frees_the_pool_and_a_committed_one_is_not() {
    // Design §3: nobody will commit a run whose requester is gone; it
    // is withdrawn (`planning_aborted`, `withdrawn`), stored, and the
    // next run may plan.
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    let _ = h.gate.take_durable_change();
    assert_eq!(
        h.gate.abort_planning(&run("other"), t(102), &mut h.out),
        Err(Refusal::UnknownRun(run("other")))
    );
    assert_eq!(h.gate.abort_planning(&run("r"), t(102), &mut h.out), Ok(()));
    assert!(matches!(
        h.out.last(),
        Some(Event::PlanningAborted { run: r, reason: crate::event::AbortReason::Withdrawn, .. })
            if r == &run("r")
    ));
    let stored = h.gate.take_durable_change().expect("the withdrawal stored");
    assert_eq!(stored.run, None);
    assert_eq!(h.gate.active_run(), None);
    // Suspended (readiness lost under `wait`): withdrawn alike.
    h.gate.begin(run("s"), None, t(103), &mut h.out).unwrap();
    h.observe(104, "b", Observation::Unavailable);
    assert_eq!(h.gate.abort_planning(&run("s"), t(105), &mut h.out), Ok(()));
    assert_eq!(h.gate.active_run(), None);
    // Committed: finished, not withdrawn.
    h.observe(106, "b", Observation::Available);
    h.gate.on_deadline(t(206), &mut h.out);
    h.gate.begin(run("c"), None, t(207), &mut h.out).unwrap();
    h.gate
        .commit(&run("c"), vec![node("a")], None, t(208), &mut h.out)
        .unwrap();
    assert!(matches!(
        h.gate.abort_planning(&run("c"), t(209), &mut h.out),
        Err(Refusal::NotPlanning {
            state: "committed",
            ..
        })
    ));
}

#[test]
fn the_core_hands_out_each_durable_change_once_and_nothing_else() {
    // What must be stored before events are told comes from the core:
    // a new epoch, a planning run's start, a commit made durable first,
    // a run's end; readiness lost or a repeat changes nothing stored.
    let mut h = Harness::new(None);
    assert_eq!(h.gate.take_durable_change(), None, "nothing yet");
    h.make_ready(0, "a", 1);
    h.make_ready(0, "b", 1);
    assert_eq!(h.gate.take_durable_change(), None, "no epoch yet");
    h.gate.on_deadline(t(100), &mut h.out);
    let first = h.gate.take_durable_change().expect("epoch 1 to store");
    assert_eq!(first.last_epoch, 1);
    assert_eq!(h.gate.take_durable_change(), None, "handed out once");
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    let planning = h.gate.take_durable_change().expect("the planning run");
    assert!(planning.run.as_ref().is_some_and(|r| !r.committed));
    let admitted = h
        .gate
        .admit_commit(&run("r"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    let stored = h.gate.durable_with(&admitted);
    h.gate
        .commit_admitted(admitted, t(102), &mut h.out)
        .unwrap();
    assert_eq!(h.gate.durable(), stored);
    assert_eq!(
        h.gate.take_durable_change(),
        None,
        "stored before the commit: not again after it"
    );
    // Node b goes: readiness lost, nothing to store.
    h.observe(103, "b", Observation::Unavailable);
    assert_eq!(h.gate.take_durable_change(), None);
    h.gate.run_ended(&run("r"));
    let ended = h.gate.take_durable_change().expect("the run's end");
    assert_eq!(ended.run, None);
    // A restored state is stored already.
    let mut again = Harness::new(None);
    again
        .gate
        .restore(&stored, Duration::from_secs(30), t(0), &mut again.out);
    assert_eq!(again.gate.take_durable_change(), None);
}

#[test]
fn a_restored_committed_run_is_still_stored_after_the_next_epoch_write() {
    // Issue 20: `durable()` answered from a field `restore` never set,
    // so the first write after a restart dropped the guarded run.
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    h.gate
        .commit(&run("r"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    let stored = h.gate.durable();
    assert!(stored.run.as_ref().is_some_and(|r| r.committed));
    let mut again = Harness::new(None);
    let guard = again
        .gate
        .restore(&stored, Duration::from_millis(50), t(0), &mut again.out);
    assert!(guard.is_some());
    assert_eq!(again.gate.durable(), stored, "restored as stored");
    // A second life restored from the first one's write keeps it too.
    let mut third = Harness::new(None);
    third.gate.restore(
        &again.gate.durable(),
        Duration::from_millis(50),
        t(0),
        &mut third.out,
    );
    assert_eq!(third.gate.durable().run, stored.run);
}

#[test]
fn what_a_gate_keeps_goes_through_json_and_back() {
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    h.gate
        .commit(&run("r"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    let stored = h.gate.durable();
    let text = serde_json::to_string(&stored).unwrap();
    let back: Durable = serde_json::from_str(&text).unwrap();
    assert_eq!(back, stored);
    // A damaged id is refused, as when made.
    let bad = text.replace("\"r\"", "\"\"");
    assert!(serde_json::from_str::<Durable>(&bad).is_err(), "{bad}");
}

#[test]
fn an_empty_plan_is_refused_before_anything_else() {
    let mut h = Harness::new(None);
    let refused = h
        .gate
        .commit(&run("nobody"), vec![], None, t(0), &mut h.out);
    assert_eq!(refused.err(), Some(Refusal::InvalidPlan(run("nobody"))));
}

#[test]
fn commit_hands_the_guard_over_and_the_pool_refuses_what_a_committed_run_forbids() {
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    assert_eq!(
        h.gate
            .commit(&run("r"), vec![node("z")], None, t(101), &mut h.out)
            .err(),
        Some(Refusal::NotCandidate(node("z")))
    );
    let guard = h
        .gate
        .commit(&run("r"), vec![node("a")], None, t(101), &mut h.out)
        .unwrap();
    assert!(guard.requires(&node("a")));
    assert_eq!(h.gate.committed_run_requiring(&node("a")), Some(&run("r")));
    assert_eq!(h.gate.committed_run_requiring(&node("b")), None);
    let definition = PoolDefinition::new(PoolId::new("q").unwrap(), vec![node("a")]).unwrap();
    assert_eq!(
        h.gate.define(&definition, t(102), &mut h.out).err(),
        Some(Refusal::RunCommitted(run("r")))
    );
    assert!(h.gate.may_finish(&run("r"), t(102), &mut h.out).is_ok());
    h.gate.run_ended(&run("r"));
    assert_eq!(h.gate.active_run(), None);
    assert!(h.gate.define(&definition, t(103), &mut h.out).is_ok());
}

#[test]
fn pool_ready_wins_a_tie_with_the_wait_timeout() {
    let mut h = Harness::ready_at_100(Some(250));
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    // Lost at 150: the wait runs out at 400.
    h.observe(150, "a", Observation::Unavailable);
    // Ready again at 300: PoolReady due at 400 too.
    h.observe(300, "a", Observation::Available);
    h.out.clear();
    h.gate.on_deadline(t(400), &mut h.out);
    assert_eq!(h.names(), [("pool_ready", 400), ("planning_resumed", 400)]);
    assert_eq!(h.gate.active_run(), Some(&run("r")));
}

#[test]
fn deadlines_due_before_an_input_fire_in_time_order() {
    let mut h = Harness::ready_at_100(Some(250));
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    h.observe(150, "a", Observation::Unavailable); // the wait runs out at 400
    h.observe(350, "a", Observation::Available); // PoolReady due at 450
    h.out.clear();
    // An input at 500 fires both first: the timeout at 400, then
    // PoolReady at 450 with no run left to resume.
    h.observe(500, "b", Observation::Unavailable);
    assert_eq!(
        h.names(),
        [
            ("planning_aborted", 400),
            ("pool_ready", 450),
            ("readiness_lost", 500)
        ]
    );
    assert_eq!(h.gate.active_run(), None);
}

#[test]
fn an_admission_kept_past_its_run_does_not_commit_the_next_run() {
    // Adversary finding: an admission of r1 kept while r1 was committed
    // (by another admission) and finished, then used once r2 planned on
    // the same epoch, committed r2 under r1's stored record.
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r1"), None, t(101), &mut h.out).unwrap();
    let kept = h
        .gate
        .admit_commit(&run("r1"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    let admitted = h
        .gate
        .admit_commit(&run("r1"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    h.gate
        .commit_admitted(admitted, t(102), &mut h.out)
        .unwrap();
    h.gate.run_ended(&run("r1"));
    h.gate.begin(run("r2"), None, t(103), &mut h.out).unwrap();
    h.out.clear();
    let result = h.gate.commit_admitted(kept, t(104), &mut h.out);
    assert_eq!(result.err(), Some(Refusal::UnknownRun(run("r1"))));
    assert!(h.out.is_empty(), "nothing told: {:?}", h.out);
    assert_eq!(h.gate.active_run(), Some(&run("r2")));
}

#[test]
fn an_admission_from_another_gate_does_not_commit_this_gates_run() {
    let mut g1 = Harness::ready_at_100(None);
    g1.gate.begin(run("r1"), None, t(101), &mut g1.out).unwrap();
    let foreign = g1
        .gate
        .admit_commit(&run("r1"), vec![node("a")], None, t(102), &mut g1.out)
        .unwrap();
    let mut g2 = Harness::ready_at_100(None);
    g2.gate
        .begin(run("other"), None, t(101), &mut g2.out)
        .unwrap();
    g2.out.clear();
    let result = g2.gate.commit_admitted(foreign, t(102), &mut g2.out);
    assert!(
        result.is_err(),
        "g1's admission of r1 must not commit g2's run 'other'"
    );
}

#[test]
fn an_admission_from_before_readiness_came_back_at_a_new_epoch_is_refused() {
    let mut h = Harness::ready_at_100(None);
    h.gate.begin(run("r1"), None, t(101), &mut h.out).unwrap();
    let admitted = h
        .gate
        .admit_commit(&run("r1"), vec![node("a")], None, t(102), &mut h.out)
        .unwrap();
    // a's identity rotates: readiness lost, suspended, ready again at 2.
    let material = IdentityMaterial::new(b"rotated".to_vec()).unwrap();
    h.observe(103, "a", Observation::Identity(material.fingerprint()));
    h.gate.on_deadline(t(203), &mut h.out);
    assert_eq!(h.gate.readiness().ready_epoch(), Some(Epoch(2)));
    let result = h.gate.commit_admitted(admitted, t(204), &mut h.out);
    assert!(result.is_err(), "{:?}", result.map(|g| g.run().clone()));
}

#[test]
fn the_stored_commit_matches_the_guard_and_the_epochs_fingerprints() {
    let mut h = Harness::new(None);
    h.make_ready(0, "a", 1);
    h.make_ready(0, "b", 1);
    h.gate.on_deadline(t(100), &mut h.out);
    let fps = h
        .out
        .iter()
        .find_map(|e| match e {
            Event::PoolReady { fingerprints, .. } => Some(fingerprints.clone()),
            _ => None,
        })
        .unwrap();
    h.gate.begin(run("r"), None, t(101), &mut h.out).unwrap();
    let admitted = h
        .gate
        .admit_commit(
            &run("r"),
            vec![node("b"), node("a"), node("b")],
            None,
            t(102),
            &mut h.out,
        )
        .unwrap();
    let stored = h.gate.durable_with(&admitted).run.unwrap();
    h.out.clear();
    let guard = h
        .gate
        .commit_admitted(admitted, t(102), &mut h.out)
        .unwrap();
    let told = h
        .out
        .iter()
        .find_map(|e| match e {
            Event::RunCommitted { required, .. } => Some(required.clone()),
            _ => None,
        })
        .unwrap();
    let stored_nodes: Vec<NodeId> = stored.required.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(stored_nodes, guard.required().cloned().collect::<Vec<_>>());
    assert_eq!(stored_nodes, told);
    for (n, fp) in &stored.required {
        assert_eq!(fps.get(n).copied(), *fp, "{n}");
    }
}
