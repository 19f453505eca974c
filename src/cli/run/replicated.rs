//! `run` among replicas: the leader keeps the run, asked through etcd;
//! this process campaigns too, and leads when it can.

use std::time::Duration;

use poolgate_actors::core::{NodeId, RunId};
use poolgate_actors::GateError;

use crate::cli::commands::{
    told_end, Leadership, RunRequest, END_WAIT, EXIT_REFUSED, EXIT_UNGUARDED,
};
use crate::config::Config;
use crate::ha::requests::GaveUp;
use crate::live::LiveError;

use super::{Ended, ReplicatedKeeper};

/// A replica's campaign for `run`: leads when it can (recording each term
/// into `record`, `record.n` after the first), follows when it cannot.
pub(super) async fn campaign(
    replica: crate::ha::replica::Replica,
    record: Option<std::path::PathBuf>,
) {
    let mut leadership = Leadership::Replica(Box::new(replica));
    loop {
        match leadership.lead(record.as_deref()).await {
            Ok(live) => {
                leadership.lost().await;
                live.stop().await;
                leadership.say_stopped_leading();
            }
            Err(e) => {
                return tracing::warn!(error = %e, "this run cannot lead: it only asks the leader")
            }
        }
    }
}

impl ReplicatedKeeper {
    pub(super) async fn commit(
        &mut self,
        config: &Config,
        request: &RunRequest,
        required: &[NodeId],
        mut stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        let requests = self.requests.clone();
        let failed =
            |e: poolgate_actors::StoreError| LiveError::Io(std::io::Error::other(e.to_string()));
        // Unique across hosts and containers, where pids repeat.
        let new_run = || {
            RunId::new(&format!(
                "run-{}-{:06x}",
                std::process::id(),
                rand::random::<u32>() & 0xff_ffff
            ))
            .map_err(GateError::from)
        };
        let mut run = new_run()?;
        // The request lives on this process's etcd session: if it goes
        // before a commit (crash, cut off for a lease), the request goes
        // with it; a run committed stays guarded by whichever replica
        // leads (design §12) until it faults or is ended.
        let mut session = requests
            .ask_of(
                Some(config.pool.id()),
                &run,
                required,
                config.run.unguarded_after,
            )
            .await
            .map_err(failed)?;
        let mut said = crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY);
        let limit = tokio::time::sleep(request.timeout.unwrap_or(Duration::MAX / 4));
        tokio::pin!(limit);
        loop {
            // The look at what became of the run is raced against the
            // timeout and the signals: with etcd answering nothing, a look
            // waits out the etcd client's timeout, and holds neither.
            let look = async {
                tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await;
                requests.outcome(&run).await
            };
            tokio::select! {
                read = look => {
                    match read {
                        Ok(Some(outcome)) if outcome.status == "committed" => {
                            self.printer.print_told(outcome.event);
                            break;
                        }
                        Ok(Some(outcome)) if outcome.status == "aborted" && withdrawn(&outcome) => {
                            // Withdrawn while it planned (`run --end` named
                            // it): not asked again.
                            crate::say!(warn, "poolgate run: run {run} was withdrawn before it was committed (poolgate run --end): its command was not started");
                            self.printer.print_told(outcome.event);
                            let _ = requests.forget(&run).await;
                            return Ok(Err(EXIT_UNGUARDED));
                        }
                        Ok(Some(outcome)) if outcome.status == "aborted" => {
                            // Its planning was abandoned (a new leader found
                            // it planning, or readiness was lost under
                            // `abort`): that run is over, and the same plan
                            // is asked again as a new run, within the same
                            // timeout.
                            self.printer.print_told(outcome.event);
                            let _ = requests.forget(&run).await;
                            run = new_run()?;
                            session = requests
                                .ask_of(Some(config.pool.id()), &run, required, config.run.unguarded_after)
                                .await
                                .map_err(failed)?;
                        }
                        Ok(Some(outcome)) if outcome.status == "refused" => {
                            crate::say!(warn, "poolgate run: run {run} refused by the leader: {}", outcome.reason.unwrap_or_default());
                            return Ok(Err(EXIT_REFUSED));
                        }
                        Ok(Some(outcome)) => {
                            // Committed and over while this process was away
                            // (paused, cut off): faulted is 3; ended by the
                            // leader (its requester counted as gone) is not a
                            // fault: the command never ran guarded.
                            let faulted = outcome.status == "faulted";
                            if !faulted {
                                crate::say!(warn, "poolgate run: run {run} was {} by the leader before this process saw it committed{}: its command was not started", outcome.status, why(&outcome));
                            }
                            self.printer.print_told(outcome.event);
                            let _ = requests.forget(&run).await;
                            return Ok(Err(if faulted { 3 } else { EXIT_UNGUARDED }));
                        }
                        Ok(None) if session.is_lost() => {
                            // The request went with the session: nobody will
                            // commit it.
                            crate::say!(warn, "poolgate run: run {run}: this process's etcd session expired before the run was committed (the request went with it): its command was not started");
                            let _ = requests.withdraw(&run).await;
                            return Ok(Err(EXIT_UNGUARDED));
                        }
                        Ok(None) => {}
                        // etcd away for a moment: asked again.
                        Err(e) => {
                            if let Some(held) = said.allow(std::time::Instant::now()) {
                                tracing::warn!(%run, error = %e, held, "what became of the run: not read (tried again)");
                            }
                        }
                    }
                }
                _ = &mut limit => {
                    let within = crate::config::in_words(request.timeout.unwrap_or_default());
                    let bound = crate::ha::requests::LEADER_SAID_WITHIN;
                    let gave_up = requests.give_up(&run, session, bound).await;
                    let why = match gave_up {
                        GaveUp { active: Some(Some(other)), .. } if other != run => format!(
                            ": run {other} is active (its own poolgate run guards it; poolgate run --end {other} is for a run whose requester is gone)"
                        ),
                        // What the leader said the run waits for.
                        GaveUp { waits: Some(waits), .. } => format!(": {waits}"),
                        // What blocks the pool, as the leader said it.
                        GaveUp { said: Some(Some(said)), .. } if said["state"].is_string() => format!(
                            ": {} (the leader said so {} s ago)",
                            said["state"].as_str().unwrap_or_default(),
                            said["age_ms"].as_u64().unwrap_or(0) / 1000
                        ),
                        GaveUp { active: Some(_), said: Some(_), .. } => {
                            " (no replica led, or none said what blocks the pool)".to_string()
                        }
                        _ => format!(" (what blocks the pool cannot be read: etcd did not answer within {bound:?})"),
                    };
                    crate::say!(warn, "poolgate: run {run} was not committed within {within}{why}");
                    return Ok(Err(1));
                }
                signal = &mut stop => {
                    requests.leave(&run, session, crate::ha::requests::LEADER_SAID_WITHIN).await;
                    return Ok(Err(super::stopped_while_waiting(Some(&run), signal)));
                }
            }
        }
        self.session = Some(session);
        // Read `committed`, but the run may have ended since (this process
        // was paused): the command starts only on a run the state still
        // holds.
        if let Ok(
            crate::ha::requests::RunStanding::NotHeld | crate::ha::requests::RunStanding::Ended(_),
        ) = requests.standing(&run).await
        {
            let code = match told_end(&requests, &run).await {
                Some(outcome) if outcome.status == "faulted" => {
                    self.printer.print_told(outcome.event);
                    3
                }
                outcome => {
                    crate::say!(warn, "poolgate run: run {run} ended before its command started ({}): the command was not started", outcome.and_then(|o| o.reason).unwrap_or_else(|| "no longer held by the stored state".into()));
                    EXIT_UNGUARDED
                }
            };
            let _ = requests.forget(&run).await;
            return Ok(Err(code));
        }
        // Fail closed (docs/failover.md §3): the command runs only while
        // this process can confirm that its run is guarded.
        self.confirmed = tokio::time::Instant::now();
        Ok(Ok(run))
    }

    pub(super) async fn guard(&mut self, run: &RunId) -> Result<Option<Ended>, LiveError> {
        use crate::ha::requests::RunStanding;
        tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await;
        let requests = &self.requests;
        match requests.standing(run).await {
            Ok(RunStanding::Guarded) => self.confirmed = tokio::time::Instant::now(),
            Ok(RunStanding::Ended(outcome)) => {
                let code = if outcome.status == "faulted" {
                    3
                } else {
                    EXIT_UNGUARDED
                };
                if code == EXIT_UNGUARDED {
                    crate::say!(
                        warn,
                        "poolgate run: run {run} was {} by the leader{}: its command is stopped",
                        outcome.status,
                        why(&outcome)
                    );
                }
                self.printer.print_told(outcome.event);
                let _ = requests.forget(run).await;
                return Ok(Some(Ended::Told(code)));
            }
            Ok(RunStanding::NotHeld) => {
                // Ended, its outcome not written yet: the command stops
                // now, and the outcome is read if it comes.
                return Ok(Some(Ended::Untold));
            }
            Ok(RunStanding::Unled) | Err(_) => {}
        }
        let unconfirmed = self.confirmed.elapsed();
        let lost = self.session.as_ref().is_some_and(|s| s.is_lost());
        // The session at risk: it may expire a third of its TTL from now,
        // and the leader then end the run (and commit another on its
        // nodes): the command goes first.
        let at_risk = self.session.as_ref().and_then(|s| s.at_risk());
        if lost || at_risk.is_some() || unconfirmed > self.unguarded_after {
            let why = if lost {
                "its etcd session expired".to_string()
            } else if let Some(unrenewed) = at_risk {
                format!(
                    "its etcd session not renewed for {} (etcd out of its reach): it may expire, and the leader end the run",
                    crate::config::in_words(unrenewed)
                )
            } else {
                format!(
                    "not confirmed guarded for {} (no replica leads, or etcd is out of reach)",
                    crate::config::in_words(unconfirmed)
                )
            };
            crate::say!(warn, "poolgate run: run {run}: {why}; its command is stopped ([run] unguarded_after = {})", crate::config::in_words(self.unguarded_after));
            return Ok(Some(Ended::Told(EXIT_UNGUARDED)));
        }
        Ok(None)
    }

    pub(super) async fn told(&mut self, run: &RunId) -> i32 {
        let code = match told_end(&self.requests, run).await {
            Some(outcome) if outcome.status == "faulted" => {
                self.printer.print_told(outcome.event);
                3
            }
            _ => {
                crate::say!(warn, "poolgate run: run {run} is no longer held by the stored state (it ended, its outcome unwritten): its command is stopped");
                EXIT_UNGUARDED
            }
        };
        let _ = self.requests.forget(run).await;
        code
    }

    /// Asks the leader to end `run` until the ask is written (an etcd
    /// blip), for up to [`END_WAIT`] (a run whose end is never asked stays
    /// guarded), then tells its end once the leader wrote it (bounded: a
    /// leaderless moment leaves the end to the next leader, which reads
    /// the same key).
    /// Asks the leader to end `run` and tells what became of it: whether
    /// it had faulted.
    pub(super) async fn end(&mut self, run: &RunId) -> bool {
        let requests = &self.requests;
        let deadline = tokio::time::Instant::now() + END_WAIT;
        loop {
            match requests.finish(run).await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(%run, error = %e, "the end of the run not asked of the leader: it stays guarded; end it with poolgate run --end {run}");
                    return false;
                }
                Err(_) => tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await,
            }
        }
        let deadline = tokio::time::Instant::now() + END_WAIT;
        let mut faulted = false;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(outcome)) = requests.outcome(run).await {
                if outcome.status != "committed" {
                    faulted = matches!(
                        outcome.event,
                        Some(poolgate_actors::core::Event::RunFaulted { .. })
                    );
                    self.printer.print_told(outcome.event);
                    break;
                }
            }
            tokio::time::sleep(crate::ha::requests::LOOK_EVERY).await;
        }
        let _ = requests.forget(run).await;
        faulted
    }
}

/// Why the leader ended a run, as a requester says it: the outcome's
/// reason in parentheses; a run finished with no reason had its end asked
/// (`run --end`); nothing when there is nothing to say.
fn why(outcome: &crate::ha::requests::RunOutcome) -> String {
    match (&outcome.reason, outcome.status.as_str()) {
        (Some(reason), _) if !reason.is_empty() => format!(" ({reason})"),
        (_, "finished") => " (its end was asked: `run --end`)".to_string(),
        _ => String::new(),
    }
}

/// Whether an `aborted` outcome is a withdrawal (`planning_aborted`,
/// `withdrawn`: an end asked of the run while it planned), which the
/// requester must not answer by asking again.
fn withdrawn(outcome: &crate::ha::requests::RunOutcome) -> bool {
    matches!(
        outcome.event,
        Some(poolgate_actors::core::Event::PlanningAborted {
            reason: poolgate_actors::core::AbortReason::Withdrawn,
            ..
        })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_ended_by_the_leader_is_said_with_its_reason_and_never_with_empty_parentheses() {
        // An operator's trial: `run --end RUN` of a committed run; its
        // requester said "was finished by the leader (): …".
        let outcome = |status: &str, reason: Option<&str>| crate::ha::requests::RunOutcome {
            status: status.into(),
            event: None,
            reason: reason.map(str::to_string),
        };
        assert_eq!(
            why(&outcome("finished", None)),
            " (its end was asked: `run --end`)"
        );
        assert_eq!(
            why(&outcome("ended", Some("its requester is gone"))),
            " (its requester is gone)"
        );
        assert_eq!(why(&outcome("aborted", None)), "");
        assert_eq!(why(&outcome("aborted", Some(""))), "");
    }

    #[test]
    fn a_withdrawn_run_is_not_asked_again_and_an_abandoned_one_is() {
        // An operator's trial: `run --end RUN` of a run still planning
        // withdrew it, and its requester asked again under a new id and
        // ran its command once the pool was free.
        let outcome = |reason| crate::ha::requests::RunOutcome {
            status: "aborted".into(),
            event: Some(poolgate_actors::core::Event::PlanningAborted {
                at: poolgate_actors::core::Time::ZERO,
                pool: poolgate_actors::core::PoolId::new("a").unwrap(),
                run: RunId::new("r").unwrap(),
                reason,
            }),
            reason: None,
        };
        use poolgate_actors::core::AbortReason;
        assert!(withdrawn(&outcome(AbortReason::Withdrawn)));
        for asked_again in [
            AbortReason::Restarted,
            AbortReason::ReadinessLost,
            AbortReason::WaitTimeout,
        ] {
            assert!(!withdrawn(&outcome(asked_again)), "{asked_again:?}");
        }
        let unwritten = crate::ha::requests::RunOutcome {
            event: None,
            ..outcome(AbortReason::Withdrawn)
        };
        assert!(!withdrawn(&unwritten));
    }
}
