//! `run` alone: its own orchestrator keeps the run.

use poolgate_actors::core::{Event, NodeId, RunId};
use poolgate_actors::GateError;

use crate::cli::commands::{drain, in_the_way, plan_and_commit, RunRequest, EXIT_OTHER_RUN};
use crate::live::LiveError;

use super::{AloneKeeper, Ended};

impl AloneKeeper {
    pub(super) async fn commit(
        &mut self,
        request: &RunRequest,
        required: &[NodeId],
        stop: std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
    ) -> Result<Result<RunId, i32>, LiveError> {
        let gate = self.live.gate.clone();
        let run = match &request.resume {
            Some(run) => {
                let active = gate.report().await?.run;
                if active.as_ref() != Some(run) {
                    let active = active.map_or("none".to_string(), |r| r.to_string());
                    crate::say!(
                        warn,
                        "poolgate run: --resume {run}: no such active run (the active run: {active})"
                    );
                    return Ok(Err(EXIT_OTHER_RUN));
                }
                run.clone()
            }
            None => {
                // A restored run in the way is said at once, ready pool or not.
                if let Some(other) = gate.report().await?.run {
                    in_the_way(&other);
                    return Ok(Err(EXIT_OTHER_RUN));
                }
                let mut run =
                    RunId::new(&format!("run-{}", std::process::id())).map_err(GateError::from)?;
                let committed = {
                    let AloneKeeper {
                        live,
                        events,
                        printer,
                        hangup,
                        path,
                    } = &mut *self;
                    let planned = plan_and_commit(
                        &gate,
                        events,
                        printer,
                        &mut run,
                        required,
                        request.timeout,
                    );
                    tokio::pin!(planned, stop);
                    // A SIGHUP while waiting (a key rotation, a node taken
                    // out of the pool) applies at once, as on a `watch`.
                    loop {
                        tokio::select! {
                            committed = &mut planned => break committed?,
                            _ = hangup.recv() => crate::cli::commands::reload(live, path).await,
                            signal = &mut stop => return Ok(Err(super::stopped_while_waiting(None, signal))),
                        }
                    }
                };
                if let Err(code) = committed {
                    return Ok(Err(code));
                }
                run
            }
        };
        drain(&gate, &mut self.events, &mut self.printer).await;
        Ok(Ok(run))
    }

    pub(super) async fn guard(&mut self, run: &RunId) -> Result<Option<Ended>, LiveError> {
        tokio::select! {
            event = self.events.recv() => {
                let Some(event) = event else { return Err(GateError::Stopped.into()) };
                let faulted = matches!(&event, Event::RunFaulted { run: r, .. } if r == run);
                self.printer.print(&self.live.gate, event).await;
                if faulted {
                    return Ok(Some(Ended::Told(3)));
                }
            }
            _ = self.hangup.recv() => {
                let live = &self.live;
                crate::cli::commands::reload(live, &self.path).await;
            }
        }
        Ok(None)
    }

    pub(super) async fn end(&mut self, run: &RunId) -> Result<(), LiveError> {
        let gate = self.live.gate.clone();
        drain(&gate, &mut self.events, &mut self.printer).await;
        let ended = gate.finish_run(run.clone()).await;
        drain(&gate, &mut self.events, &mut self.printer).await;
        Ok(ended?)
    }
}
