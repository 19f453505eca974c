//! `run` beside a `watch` that serves the control socket: the watch's
//! orchestrator keeps the run; this process guards its command.

use std::time::Duration;

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::GateError;

use crate::cli::commands::{RunRequest, EXIT_OTHER_RUN, EXIT_REFUSED, EXIT_UNGUARDED};
use crate::live::LiveError;

use super::{ControlKeeper, Ended};

impl ControlKeeper {
    pub(super) async fn commit(
        &mut self,
        request: &RunRequest,
        required: &[NodeId],
        stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        use crate::live::control::{Reply, Request};
        let (run, asked) = match &request.resume {
            // A committed run (restored, its requester gone) guarded anew.
            Some(run) => (
                run.clone(),
                Request::Resume {
                    v: 1,
                    pool: self.pool.clone(),
                    run: run.to_string(),
                },
            ),
            None => {
                let run =
                    RunId::new(&format!("run-{}", std::process::id())).map_err(GateError::from)?;
                let asked = Request::Run {
                    v: 1,
                    pool: self.pool.clone(),
                    run: run.to_string(),
                    required: request
                        .require
                        .as_ref()
                        .map(|_| required.iter().map(|n| n.to_string()).collect()),
                };
                (run, asked)
            }
        };
        self.client.ask(&asked).await?;
        let limit = tokio::time::sleep(request.timeout.unwrap_or(Duration::MAX / 4));
        tokio::pin!(limit, stop);
        // What the orchestrator last said the run waits for.
        let mut waits = None;
        loop {
            let reply = tokio::select! {
                reply = self.client.next() => reply,
                _ = &mut limit => {
                    // Closing the connection withdraws the request.
                    let within = crate::config::in_words(request.timeout.unwrap_or_default());
                    match waits {
                        Some(detail) => crate::say!(warn, "poolgate: run {run} was not committed within {within}: {detail}"),
                        None => crate::say!(warn, "poolgate: run {run} was not committed within {within} (ask poolgate status what blocks the pool)"),
                    }
                    return Ok(Err(1));
                }
                signal = &mut stop => return Ok(Err(super::stopped_while_waiting(Some(&run), signal))),
            };
            match reply {
                Some(Reply::Event { event }) => self.print(event),
                Some(Reply::Waiting { detail }) => {
                    crate::say!(info, "poolgate run: run {run} waits: {detail}");
                    waits = Some(detail);
                }
                // The run committed is the one named (a run its last
                // requester left planning may have been taken over).
                Some(Reply::Committed { run: committed, .. }) => {
                    return Ok(Ok(RunId::new(&committed).unwrap_or(run)))
                }
                Some(Reply::Refused { code, detail }) => {
                    crate::say!(
                        warn,
                        "poolgate run: run {run} refused by the orchestrator: {detail} ({code})"
                    );
                    return Ok(Err(if code == "run_in_progress" {
                        EXIT_OTHER_RUN
                    } else {
                        EXIT_REFUSED
                    }));
                }
                Some(_) => {}
                None => {
                    crate::say!(warn, "poolgate run: the orchestrator serving the control socket closed the connection before the run was committed");
                    return Ok(Err(1));
                }
            }
        }
    }

    pub(super) fn print(&mut self, event: serde_json::Value) {
        self.printer
            .print_told(serde_json::from_value::<Event>(event).ok());
    }

    /// One step: `Some` once the run ended (faulted, or the orchestrator
    /// is gone: the run is no longer guarded).
    pub(super) async fn guard(&mut self) -> Option<Ended> {
        use crate::live::control::Reply;
        // The orchestrator beats every half second; a frozen or hung one
        // guards nothing.
        let Ok(reply) = tokio::time::timeout(self.silence, self.client.next()).await else {
            crate::say!(
                warn,
                "poolgate run: the orchestrator serving the control socket said nothing for {}: the run is no longer confirmed guarded; its command is stopped",
                crate::config::in_words(self.silence)
            );
            return Some(Ended::Told(EXIT_UNGUARDED));
        };
        match reply {
            Some(Reply::Event { event }) => {
                self.print(event);
                None
            }
            Some(Reply::Ended {
                status,
                node,
                reason,
            }) if status == "faulted" => {
                crate::say!(
                    warn,
                    "poolgate run: run faulted: {} {}",
                    node.unwrap_or_default(),
                    reason.unwrap_or_default()
                );
                Some(Ended::Told(3))
            }
            Some(Reply::Ended { reason, .. }) => {
                crate::say!(
                    warn,
                    "poolgate run: the run ended ({}): its command is stopped",
                    reason.unwrap_or_default()
                );
                Some(Ended::Told(EXIT_UNGUARDED))
            }
            Some(_) => None,
            None => {
                crate::say!(warn, "poolgate run: the orchestrator serving the control socket is gone: the run is no longer guarded; its command is stopped");
                Some(Ended::Told(EXIT_UNGUARDED))
            }
        }
    }

    /// Asks the orchestrator to end `run` and tells what became of it:
    /// whether it had faulted.
    pub(super) async fn end(&mut self, run: &RunId) -> bool {
        use crate::live::control::{Reply, Request};
        if self.client.ask(&Request::Finish).await.is_err() {
            return false;
        }
        // Bounded: an orchestrator frozen meanwhile does not hold `run`.
        let deadline = tokio::time::Instant::now() + self.silence;
        let mut faulted = false;
        while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, self.client.next()).await {
            match reply {
                Reply::Event { event } => {
                    faulted |= event["event"] == "run_faulted";
                    self.print(event);
                }
                Reply::Ended { .. } => return faulted,
                Reply::Refused { detail, .. } => {
                    tracing::warn!(%run, %detail, "the end of the run refused");
                    return faulted;
                }
                _ => {}
            }
        }
        faulted
    }
}
