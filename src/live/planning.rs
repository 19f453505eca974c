//! A run's planning and commit on a ready pool, and what the gate's
//! refusal of either comes to, the same however the run was asked
//! (design §7): by `run` alone, through the control socket, or through
//! etcd of the leading replica. One path and one rule, so that the same
//! plan meets the same answer on every path; what each path does with
//! the answer (print it, reply, write an outcome) is its own.

use poolgate_actors::core::{Epoch, NodeId, PoolId, Refusal, RunId};
use poolgate_actors::{Gate, GateError};

/// Why a run's gate stopped while it was asked: its pool no longer
/// gated (a reload removed it).
pub(crate) fn gone(pool: Option<&PoolId>) -> String {
    match pool {
        Some(pool) => format!("pool {pool} is no longer gated here (a reload removed it)"),
        None => "its pool is no longer gated here (a reload removed it)".to_string(),
    }
}

/// How often a run waiting for its pool looks whether its plan can still
/// be committed ([`Plan::check`]).
pub(crate) const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One run's plan on one pool: begun on a ready epoch, then committed;
/// planned again after the policy aborted it; its planning aborted when
/// it is refused for good.
#[derive(Debug)]
pub(crate) struct Plan {
    run: RunId,
    required: Vec<NodeId>,
    planning: bool,
    /// The pool, once a look at it answered ([`Plan::check`]).
    pool: Option<PoolId>,
}

impl Plan {
    /// `run` over `required`, not planning yet.
    pub(crate) fn new(run: RunId, required: Vec<NodeId>) -> Self {
        Self {
            run,
            required,
            planning: false,
            pool: None,
        }
    }

    /// `run` over `required`, already the pool's active run (planned by
    /// a requester gone, or committed by a leader before): committed
    /// without beginning.
    pub(crate) fn active(run: RunId, required: Vec<NodeId>) -> Self {
        Self {
            run,
            required,
            planning: true,
            pool: None,
        }
    }

    /// The run planned.
    pub(crate) fn run(&self) -> &RunId {
        &self.run
    }

    /// Whether the run is planning on the pool (begun, not committed).
    pub(crate) fn is_planning(&self) -> bool {
        self.planning
    }

    /// Why the plan ends with its gate stopped ([`gone`]), its pool named
    /// once a look at it answered.
    #[cfg(feature = "cli")]
    pub(crate) fn gone(&self) -> String {
        gone(self.pool.as_ref())
    }

    /// Plans under another name from here on (a run aborted by the
    /// policy is over, and its plan planned again as a new run).
    #[cfg(feature = "cli")]
    pub(crate) fn rename(&mut self, run: RunId) {
        self.run = run;
        self.planning = false;
    }

    /// Takes over `run`, which another requester left planning.
    pub(crate) fn adopt(&mut self, run: RunId) {
        self.run = run;
        self.planning = true;
    }

    /// Whether the plan can still be committed on the pool as it is now:
    /// a required node the pool no longer has as a candidate (a reload
    /// took it out) can never be, and is refused at once, whether the
    /// pool is ready or not, its planning aborted. How often to look
    /// while waiting: [`CHECK_EVERY`].
    pub(crate) async fn check(&mut self, gate: &Gate) -> Result<(), (GateError, Refused)> {
        // A gate that does not answer says so at the next commit.
        let Ok(report) = gate.report().await else {
            return Ok(());
        };
        self.pool = Some(report.pool.clone());
        let refusal = match stranger(&self.required, &report) {
            Some(node) => Refusal::NotCandidate(node.clone()),
            None if self.required.is_empty() => Refusal::InvalidPlan(self.run.clone()),
            None => return Ok(()),
        };
        if self.planning {
            if let Err(e) = gate.abort_planning(self.run.clone()).await {
                tracing::debug!(run = %self.run, error = %e, "planning not aborted (none under way)");
            }
            self.planning = false;
        }
        Err((refusal.into(), Refused::ForGood))
    }

    /// Begins planning (unless under way) and commits on `epoch`: `Ok`
    /// once committed; otherwise the refusal and what it comes to (never
    /// [`Refused::Committed`]). A run aborted by the policy is planning
    /// no more (asked again, it begins anew); one refused for good has
    /// its planning aborted, so the pool is not left holding it.
    pub(crate) async fn commit(
        &mut self,
        gate: &Gate,
        epoch: Epoch,
    ) -> Result<Committed, (GateError, Refused)> {
        let run = self.run.clone();
        let answer = |e: GateError| {
            let refused = refused(&e, &run);
            (e, refused)
        };
        if !self.planning {
            match gate.begin_planning(run.clone(), Some(epoch)).await {
                Ok(_) => self.planning = true,
                Err(e) => match answer(e) {
                    (_, Refused::Committed) => return Ok(Committed::Already),
                    refusal => return Err(refusal),
                },
            }
        }
        let committed = gate
            .commit_plan(run.clone(), self.required.clone(), Some(epoch))
            .await;
        let (e, refused) = match committed.map_err(answer) {
            Ok(()) => return Ok(Committed::Now),
            Err((_, Refused::Committed)) => return Ok(Committed::Already),
            Err(refusal) => refusal,
        };
        match refused {
            Refused::Aborted => self.planning = false,
            Refused::ForGood | Refused::InTheWay(_) => {
                if let Err(e) = gate.abort_planning(run.clone()).await {
                    tracing::debug!(%run, error = %e, "planning not aborted (none under way)");
                }
                self.planning = false;
            }
            Refused::Waits | Refused::Stopped | Refused::Committed => {}
        }
        Err((e, refused))
    }
}

/// A node of `required` that the pool of `report` does not have as a
/// candidate (a reload may have taken it out since the run was asked): a
/// plan over it can never be committed.
pub(crate) fn stranger<'a>(
    required: &'a [NodeId],
    report: &poolgate_actors::core::PoolReport,
) -> Option<&'a NodeId> {
    required
        .iter()
        .find(|node| !report.candidates.iter().any(|c| c.node == **node))
}

/// How a plan came to be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Committed {
    /// By this call.
    Now,
    /// Before it (by a leader before this one, its outcome unwritten):
    /// no `run_committed` event is told for it now.
    Already,
}

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
