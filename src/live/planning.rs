//! What the gate's refusal of a run's planning or commit comes to, the
//! same however the run was asked (design §7): by `run` alone, through
//! the control socket, or through etcd of the leading replica. One rule,
//! so that the same plan meets the same answer on every path.

use poolgate_actors::core::{Refusal, RunId};
use poolgate_actors::GateError;

/// What a refusal of run `run`'s planning or commit means for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It may pass by waiting (asked again at the next `PoolReady`, or
    /// in a moment): the pool not ready, a `PoolReady` since the proof, a
    /// node another pool's run holds, the run suspended; a store that
    /// could not write; the pool's actor restarted.
    Waits,
    /// The run was aborted by the pool's policy while it planned: it is
    /// planned again.
    Aborted,
    /// Another run is active on the pool.
    InTheWay(RunId),
    /// It is committed already (a commit that landed, asked again).
    Committed,
    /// No wait changes it (a required node not in the pool, a plan with
    /// no node, no such pool): the request is refused, and a run left
    /// planning is aborted, not left to hold the pool.
    ForGood,
    /// The gate stopped (its term over, or the process ending): nothing
    /// is said of the request itself; among replicas the next leader
    /// answers it.
    Stopped,
}

/// What `error`, the gate's answer to planning or committing `run`,
/// comes to.
pub(crate) fn refused(error: &GateError, run: &RunId) -> Refused {
    match error {
        GateError::Refused(Refusal::UnknownRun(other)) if other == run => Refused::Aborted,
        GateError::Refused(Refusal::RunCommitted(other)) if other == run => Refused::Committed,
        GateError::Refused(Refusal::RunInProgress(other) | Refusal::RunCommitted(other))
            if other != run =>
        {
            Refused::InTheWay(other.clone())
        }
        GateError::Refused(
            Refusal::PoolNotReady
            | Refusal::StaleEpoch { .. }
            | Refusal::Reserved { .. }
            | Refusal::NotPlanning { .. },
        )
        | GateError::NotDurable(_)
        | GateError::Internal => Refused::Waits,
        GateError::Stopped => Refused::Stopped,
        _ => Refused::ForGood,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_actors::core::{Epoch, NodeId, PoolId};

    fn run(name: &str) -> RunId {
        RunId::new(name).unwrap()
    }

    #[test]
    fn each_refusal_comes_to_one_answer() {
        let me = run("run-1");
        let other = run("run-2");
        let node = NodeId::new("node-2").unwrap();
        let cases: Vec<(GateError, Refused)> = vec![
            (Refusal::PoolNotReady.into(), Refused::Waits),
            (
                Refusal::StaleEpoch {
                    given: Epoch(1),
                    current: Some(Epoch(2)),
                }
                .into(),
                Refused::Waits,
            ),
            (
                Refusal::Reserved {
                    node: node.clone(),
                    run: other.clone(),
                    pool: PoolId::new("b").unwrap(),
                }
                .into(),
                Refused::Waits,
            ),
            (
                Refusal::NotPlanning {
                    run: me.clone(),
                    state: "suspended",
                }
                .into(),
                Refused::Waits,
            ),
            (GateError::NotDurable("etcd".into()), Refused::Waits),
            (GateError::Internal, Refused::Waits),
            (Refusal::UnknownRun(me.clone()).into(), Refused::Aborted),
            (Refusal::UnknownRun(other.clone()).into(), Refused::ForGood),
            (Refusal::RunCommitted(me.clone()).into(), Refused::Committed),
            (
                Refusal::RunCommitted(other.clone()).into(),
                Refused::InTheWay(other.clone()),
            ),
            (
                Refusal::RunInProgress(other.clone()).into(),
                Refused::InTheWay(other.clone()),
            ),
            (Refusal::NotCandidate(node).into(), Refused::ForGood),
            (Refusal::InvalidPlan(me.clone()).into(), Refused::ForGood),
            (
                GateError::UnknownPool(PoolId::new("c").unwrap()),
                Refused::ForGood,
            ),
            (GateError::Stopped, Refused::Stopped),
        ];
        for (error, answer) in cases {
            assert_eq!(refused(&error, &me), answer, "{error}");
        }
    }
}
