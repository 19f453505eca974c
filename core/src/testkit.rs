//! A test kit, not part of the core's interface (feature `testkit`): a
//! driver that runs the state machines together, wired as the actors wire
//! them ([`PoolMachine`] for the pool, a committed run's [`RunGuard`] on its
//! own), on an arbitrary byte string read as operations, and checks the
//! contract's invariants on everything they emit. The fuzz target and a
//! property test both use it.
//!
//! Invariants checked:
//! - `PoolReady` only when every candidate is ready, and only after the
//!   view held still for the whole window;
//! - epochs only grow; the pool is `Ready` only while every candidate is;
//! - a run is faulted only for a node its committed plan requires, and
//!   exactly when such a node stops being ready or changes identity.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::{
    Applied, Epoch, Event, FaultReason, IdentityMaterial, NodeFacts, NodeId, Observation,
    OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId, PoolMachine, PoolPhase, RunGuard,
    RunId, SlotKey, SwimState, Time,
};

const WINDOW: Duration = Duration::from_millis(100);
const NAMES: [&str; 4] = ["a", "b", "c", "d"];

struct Drill {
    now: Time,
    pool: PoolMachine,
    facts: BTreeMap<NodeId, (SlotKey, NodeFacts)>,
    /// The committed run's guard, as its actor would hold it.
    committed: Option<RunGuard>,
    required: BTreeSet<NodeId>,
    last_change: Time,
    last_epoch: Epoch,
    out: Vec<Event>,
}

fn node(i: u8) -> NodeId {
    let name = NAMES[usize::from(i) % NAMES.len()];
    NodeId::new(name).unwrap_or_else(|_| unreachable!("fixed valid names"))
}

/// Runs `ops` (two bytes per operation) and returns the first broken
/// invariant, if any.
pub fn drive(ops: &[u8]) -> Result<(), String> {
    let members: Vec<NodeId> = (0..3).map(node).collect();
    let definition = PoolDefinition::new(PoolId::new("p").map_err(|e| e.to_string())?, members)
        .map_err(|e| e.to_string())?;
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: Some(Duration::from_millis(250)),
    };
    let (pool, added) = PoolMachine::new(&definition, WINDOW, policy, Time::ZERO);
    let mut drill = Drill {
        now: Time::ZERO,
        pool,
        facts: added
            .into_iter()
            .map(|(id, key)| (id, (key, NodeFacts::default())))
            .collect(),
        committed: None,
        required: BTreeSet::new(),
        last_change: Time::ZERO,
        last_epoch: Epoch(0),
        out: Vec::new(),
    };
    for op in ops.chunks_exact(2) {
        drill.step(op[0], op[1])?;
    }
    drill.tick()
}

impl Drill {
    fn step(&mut self, op: u8, arg: u8) -> Result<(), String> {
        let target = node(arg);
        let observation = match op % 16 {
            0 => {
                self.now = self.now + Duration::from_millis(u64::from(arg));
                return Ok(());
            }
            1 => return self.tick(),
            2 => Observation::Known,
            3 => Observation::Forgotten,
            4 => Observation::Swim {
                state: [
                    SwimState::Alive,
                    SwimState::Suspect,
                    SwimState::Dead,
                    SwimState::Left,
                ][usize::from(arg / 4) % 4],
                incarnation: u64::from(arg / 16 % 4),
            },
            5 => Observation::Available,
            6 => Observation::Unavailable,
            7 => match IdentityMaterial::new(vec![arg / 4 % 2 + 1; 8]) {
                Ok(material) => Observation::Identity(material.fingerprint()),
                Err(e) => return Err(e.to_string()),
            },
            8 => Observation::Faulted {
                reason: FaultReason::new(&format!("r{}", arg % 2)),
            },
            9 => Observation::Recovered,
            10 => return self.begin(arg),
            11 => return self.commit(arg),
            12 => return self.finish(),
            13 => return self.redefine(arg),
            14 => {
                // Every fact that makes a node ready, at once.
                for observation in [
                    Observation::Known,
                    Observation::Swim {
                        state: SwimState::Alive,
                        incarnation: u64::from(arg / 16 % 4),
                    },
                    Observation::Available,
                    Observation::Recovered,
                ] {
                    self.observe(target.clone(), observation)?;
                }
                return self.step(7, arg);
            }
            _ => {
                self.now = self.now + WINDOW + Duration::from_millis(1);
                return self.tick();
            }
        };
        self.observe(target, observation)
    }

    /// Fires what fell due before the current instant, as every input does
    /// first, so the checks see the facts those deadlines were due on.
    fn catch_up(&mut self) -> Result<(), String> {
        self.pool.settle_before(self.now, &mut self.out);
        self.settle().map(drop)
    }

    fn observe(&mut self, target: NodeId, observation: Observation) -> Result<(), String> {
        self.catch_up()?;
        let Some((key, facts)) = self.facts.get_mut(&target) else {
            return Ok(()); // not a candidate
        };
        let (was_ready, old_identity) = (facts.verdict().is_ready(), facts.fingerprint());
        let Applied::Changed(change) = facts.apply(observation) else {
            return Ok(());
        };
        // Worked out from the facts, not from the change's own judgement.
        let rotated = old_identity.is_some()
            && facts.fingerprint() != old_identity
            && facts.fingerprint().is_some();
        let lost = was_ready && !facts.verdict().is_ready();
        let key = *key;
        let committed = self.committed.is_some();
        let faults = self.required.contains(&target) && (lost || rotated);
        self.pool
            .node_changed(key, self.now, &change, &mut self.out);
        if let Some(run) = self.pool.committed_run_requiring(&target).cloned() {
            if let Some(guard) = self.committed.as_mut() {
                guard.node_changed(self.now, &target, &change, &mut self.out);
                if guard.is_ended() {
                    self.pool.run_ended(&run);
                }
            }
        }
        let faulted = self.settle()?;
        self.last_change = self.now;
        if committed && faulted != faults {
            return Err(format!(
                "at {}: {target} {change:?}: run faulted = {faulted}, expected {faults}",
                self.now
            ));
        }
        Ok(())
    }

    fn begin(&mut self, _arg: u8) -> Result<(), String> {
        self.catch_up()?;
        let run = RunId::new("r").map_err(|e| e.to_string())?;
        let ready = self.pool.readiness().ready_epoch();
        let free = self.pool.active_run().is_none();
        let begun = self.pool.begin(run, None, self.now, &mut self.out);
        if begun.is_ok() != (ready.is_some() && free) {
            return Err(format!(
                "begin_planning: {begun:?}, ready {ready:?}, free {free}"
            ));
        }
        self.settle().map(drop)
    }

    fn commit(&mut self, arg: u8) -> Result<(), String> {
        self.catch_up()?;
        let run = RunId::new("r").map_err(|e| e.to_string())?;
        let required: Vec<NodeId> = (0..3u8)
            .filter(|i| arg & (1 << i) != 0)
            .map(node)
            .filter(|n| self.facts.contains_key(n))
            .collect();
        if let Ok(guard) = self
            .pool
            .commit(&run, required.clone(), None, self.now, &mut self.out)
        {
            if self.pool.readiness().ready_epoch().is_none() {
                return Err("committed on a pool that is not ready".into());
            }
            self.required = required.into_iter().collect();
            self.committed = Some(guard);
        }
        self.settle().map(drop)
    }

    fn finish(&mut self) -> Result<(), String> {
        self.catch_up()?;
        let run = RunId::new("r").map_err(|e| e.to_string())?;
        if self.pool.may_finish(&run, self.now, &mut self.out).is_ok() {
            if let Some(guard) = self.committed.as_mut() {
                guard
                    .finish(self.now, &mut self.out)
                    .map_err(|e| e.to_string())?;
                self.pool.run_ended(&run);
            }
        }
        self.settle().map(drop)
    }

    fn redefine(&mut self, arg: u8) -> Result<(), String> {
        self.catch_up()?;
        let members: Vec<NodeId> = (0..4u8).filter(|i| arg & (1 << i) != 0).map(node).collect();
        let pool = self.pool.readiness().id().clone();
        let Ok(definition) = PoolDefinition::new(pool, members) else {
            return Ok(());
        };
        let Ok(change) = self.pool.define(&definition, self.now, &mut self.out) else {
            if self.committed.is_none() {
                return Err("redefinition refused with no committed run".into());
            }
            return Ok(());
        };
        if self.committed.is_some() {
            return Err("redefined under a committed run".into());
        }
        for (id, _) in change.removed {
            self.facts.remove(&id);
        }
        for (id, key) in change.added {
            self.facts.insert(id, (key, NodeFacts::default()));
        }
        self.settle()?;
        self.last_change = self.now;
        Ok(())
    }

    fn tick(&mut self) -> Result<(), String> {
        self.pool.on_deadline(self.now, &mut self.out);
        self.settle().map(drop)
    }

    /// Checks every event, and reports whether the run faulted.
    fn settle(&mut self) -> Result<bool, String> {
        let mut faulted = false;
        let mut index = 0;
        while index < self.out.len() {
            let event = self.out[index].clone();
            index += 1;
            match &event {
                Event::PoolReady {
                    at, epoch, members, ..
                } => {
                    if *epoch <= self.last_epoch {
                        return Err(format!("epoch {epoch} after {}", self.last_epoch));
                    }
                    self.last_epoch = *epoch;
                    if *at < self.last_change + WINDOW {
                        return Err(format!(
                            "PoolReady at {at}, last change {}",
                            self.last_change
                        ));
                    }
                    if let Some((id, _)) = self
                        .facts
                        .iter()
                        .find(|(_, (_, f))| !f.verdict().is_ready())
                    {
                        return Err(format!("PoolReady at {at} with {id} not ready"));
                    }
                    if members.len() != self.facts.len() {
                        return Err("PoolReady members differ from the candidates".into());
                    }
                }
                Event::RunFaulted { node, .. } => {
                    if !self.required.contains(node) {
                        return Err(format!("run faulted for {node}, which it does not require"));
                    }
                    faulted = true;
                }
                _ => {}
            }
        }
        self.out.clear();
        if let PoolPhase::Ready { .. } = self.pool.readiness().phase() {
            if self.facts.values().any(|(_, f)| !f.verdict().is_ready()) {
                return Err("pool Ready with a candidate not ready".into());
            }
        }
        if self.committed.as_ref().is_some_and(RunGuard::is_ended) {
            self.committed = None;
            self.required.clear();
        }
        Ok(faulted)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed, TestRunner};

    #[test]
    fn the_state_machines_keep_the_contract_on_arbitrary_operations() {
        let mut runner = TestRunner::new(Config {
            cases: 600,
            rng_seed: RngSeed::Fixed(0xc0de),
            failure_persistence: None,
            ..Config::default()
        });
        // Operations weighted towards readiness, planning and commits, so
        // the run rules are reached; raw bytes are the fuzz target's job.
        let op = prop_oneof![
            4 => 2u8..10,
            3 => Just(14u8),
            2 => Just(15u8),
            1 => Just(0u8),
            1 => Just(1u8),
            2 => Just(10u8),
            2 => Just(11u8),
            1 => Just(12u8),
            1 => Just(13u8),
        ];
        let reached = std::cell::Cell::new(0usize);
        runner
            .run(&prop::collection::vec((op, any::<u8>()), 0..200), |ops| {
                let bytes: Vec<u8> = ops.iter().flat_map(|(o, a)| [*o, *a]).collect();
                if bytes.windows(2).any(|w| w[0] == 11) {
                    reached.set(reached.get() + 1);
                }
                super::drive(&bytes).map_err(TestCaseError::fail)
            })
            .unwrap();
        assert!(reached.get() > 100);
    }

    #[test]
    fn a_plain_formation_passes_the_checks() {
        // known, alive@0, available, identity for a, b, c; wait; tick.
        let mut ops = Vec::new();
        for n in 0..3u8 {
            ops.extend([2, n, 4, n, 5, n, 7, n]);
        }
        ops.extend([0, 200, 1, 0, 10, 0, 11, 7, 4, 4]);
        super::drive(&ops).unwrap();
    }
}
