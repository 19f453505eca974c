//! The run's commands, as the pool actor takes them: planning begun, a
//! plan committed (made durable first, with a store), a run's end.

use super::*;

impl Handler<BeginPlanning> for PoolActor {
    type Result = Result<Epoch, GateError>;

    fn handle(&mut self, msg: BeginPlanning, ctx: &mut Context<Self>) -> Result<Epoch, GateError> {
        self.contained(ctx, |act, ctx| act.begin(msg, ctx))
            .unwrap_or(Err(GateError::Internal))
    }
}

impl PoolActor {
    fn begin(&mut self, msg: BeginPlanning, ctx: &mut Context<Self>) -> Result<Epoch, GateError> {
        let at = self.applied_at(msg.at);
        let current = self.core.readiness().ready_epoch();
        if let (Some(stored), Some(epoch)) = (self.stored_epoch, current) {
            if epoch.0 > stored {
                return Err(GateError::NotDurable(format!(
                    "epoch {} is not stored yet",
                    epoch.0
                )));
            }
        }
        let result = self
            .core
            .begin(msg.run.clone(), msg.epoch, at, &mut self.out);
        if let (Ok(_), Some(recording)) = (&result, &self.recording) {
            let command = Command::BeginPlanning {
                run: msg.run,
                epoch: msg.epoch,
            };
            recording.command(at, &command);
        }
        self.flush(ctx);
        Ok(result?)
    }
}

impl Handler<AbortPlanning> for PoolActor {
    type Result = Result<(), GateError>;

    fn handle(&mut self, msg: AbortPlanning, ctx: &mut Context<Self>) -> Result<(), GateError> {
        self.contained(ctx, |act, ctx| act.withdraw(msg, ctx))
            .unwrap_or(Err(GateError::Internal))
    }
}

impl PoolActor {
    /// Withdraws a planning run; its abort is stored before it is told,
    /// as the policy's aborts are.
    fn withdraw(&mut self, msg: AbortPlanning, ctx: &mut Context<Self>) -> Result<(), GateError> {
        let at = self.applied_at(msg.at);
        let result = self.core.abort_planning(&msg.run, at, &mut self.out);
        if let (Ok(()), Some(recording)) = (&result, &self.recording) {
            recording.command(at, &Command::AbortPlanning { run: msg.run });
        }
        self.flush(ctx);
        Ok(result?)
    }
}

/// An answer that is ready now.
fn answered<T: 'static>(
    result: Result<T, GateError>,
) -> AtomicResponse<PoolActor, Result<T, GateError>> {
    AtomicResponse::new(Box::pin(fut::ready(result)))
}

impl Handler<CommitPlan> for PoolActor {
    type Result = AtomicResponse<Self, Result<(), GateError>>;

    fn handle(&mut self, msg: CommitPlan, ctx: &mut Context<Self>) -> Self::Result {
        self.contained(ctx, |act, ctx| act.commit(msg, ctx))
            .unwrap_or_else(|| answered(Err(GateError::Internal)))
    }
}

impl PoolActor {
    fn commit(
        &mut self,
        msg: CommitPlan,
        ctx: &mut Context<Self>,
    ) -> AtomicResponse<Self, Result<(), GateError>> {
        let at = self.applied_at(msg.at);
        let admitted = self
            .core
            .admit_commit(&msg.run, msg.required, msg.epoch, at, &mut self.out);
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(refused) => {
                self.flush(ctx);
                return answered(Err(refused.into()));
            }
        };
        // Every node or none, for this run, before anything is stored.
        if let Some(reservations) = &self.reservations {
            let pool = self.core.readiness().id();
            let required = admitted.required().as_slice();
            if let Err(refused) = reservations.take(pool, admitted.run(), required) {
                self.flush(ctx);
                return answered(Err(refused.into()));
            }
        }
        let Some(store) = self.store.clone() else {
            let committed = self.commit_admitted(admitted, at, None, ctx);
            return answered(committed.map_err(Into::into));
        };
        // A fleet's recording keeps the commit's place meanwhile.
        let held = self.recording.as_ref().map(|r| r.hold(at));
        // Durable before `run_committed` is told (design §9); a failed write
        // refuses the commit, and nothing changes. Written off the actors'
        // thread; the pool handles nothing else until it is done. The write
        // starts when its turn comes, not here: a write the pool queued
        // meanwhile runs first, never beside it (a store among replicas
        // took one of two such writes and refused the other as a change
        // under the term), and the state written is the one then.
        let write = actix::fut::ready(()).then(move |(), act: &mut Self, _| {
            let state = act.core.durable_with(&admitted);
            let written = state.clone();
            tokio::task::spawn_blocking(move || store.save(&written))
                .into_actor(act)
                .map(move |joined, _, _| (joined, state, admitted))
        });
        AtomicResponse::new(Box::pin(write.map(
            move |(joined, state, admitted), act: &mut Self, ctx| {
                act.contained(ctx, |act, ctx| {
                    let result = joined.unwrap_or_else(|e| Err(StoreError(e.to_string())));
                    act.saved(&state, &result);
                    if let Err(e) = result {
                        telemetry::said!(error, error = %e, run = %admitted.run(), "commit not made durable; refused");
                        act.release(admitted.run());
                        act.flush(ctx);
                        return Err(GateError::NotDurable(e.to_string()));
                    }
                    Ok(act.commit_admitted(admitted, at, held, ctx)?)
                })
                .unwrap_or(Err(GateError::Internal))
            },
        )))
    }

    /// Commits a plan the core admitted (and, with a store, whose commit
    /// is stored: `held`, its place in a recording), and starts the run's
    /// actor.
    fn commit_admitted(
        &mut self,
        admitted: AdmittedCommit,
        at: Time,
        held: Option<Held>,
        ctx: &mut Context<Self>,
    ) -> Result<(), Refusal> {
        let recorded = self.recording.as_ref().map(|_| admitted.command());
        let run = admitted.run().clone();
        let result = self.core.commit_admitted(admitted, at, &mut self.out);
        if let Ok(guard) = result {
            self.run = Some(RunActor::new(guard, Arc::clone(&self.router.live)).start());
            match (held, &self.recording, &recorded) {
                (Some(held), _, Some(command)) => held.command(command),
                (None, Some(recording), Some(command)) => recording.command(at, command),
                _ => {}
            }
            self.flush(ctx);
            return Ok(());
        }
        self.release(&run);
        self.flush(ctx);
        result.map(drop)
    }

    /// The nodes `run` held in the fleet's reservations go back (its end,
    /// or a commit that did not happen).
    pub(super) fn release(&self, run: &RunId) {
        if let Some(reservations) = &self.reservations {
            reservations.release(self.core.readiness().id(), run);
        }
    }
}

impl Handler<FinishRun> for PoolActor {
    type Result = AtomicResponse<Self, Result<(), GateError>>;

    fn handle(&mut self, msg: FinishRun, ctx: &mut Context<Self>) -> Self::Result {
        self.contained(ctx, |act, ctx| act.finish(msg, ctx))
            .unwrap_or_else(|| answered(Err(GateError::Internal)))
    }
}

impl PoolActor {
    fn finish(
        &mut self,
        msg: FinishRun,
        ctx: &mut Context<Self>,
    ) -> AtomicResponse<Self, Result<(), GateError>> {
        let at = self.applied_at(msg.at);
        let admitted = self.core.may_finish(&msg.run, at, &mut self.out);
        self.flush(ctx);
        let (Ok(()), Some(addr)) = (admitted.clone(), self.run.clone()) else {
            if admitted.is_ok() {
                // Committed, but no actor guards it: faulted `internal`.
                let events = self.run_actor_lost(&msg.run);
                self.run_answered(&msg.run, true, events);
                self.flush(ctx);
            }
            let refused = admitted.and(Err(Refusal::UnknownRun(msg.run)));
            return answered(refused.map_err(Into::into));
        };
        let run = msg.run;
        // A fleet's recording keeps the end's place until it is stored.
        let held = self.recording.as_ref().map(|r| r.hold(at));
        let answer = addr.send(FinishCommitted { at });
        // The caller is answered once the run's end is stored and told (or
        // held back, its write having failed).
        AtomicResponse::new(Box::pin(
            answer
                .into_actor(self)
                .then(move |answer, act: &mut Self, _| {
                    // A closed mailbox means the run's actor failed: the
                    // run faults `internal`, and the finish finds no run.
                    let RunAnswer { status, events } = answer.unwrap_or_else(|_| RunAnswer {
                        status: Err(Refusal::UnknownRun(run.clone())),
                        events: act.run_actor_lost(&run),
                    });
                    let ended = !matches!(status, Err(Refusal::NotCommitted { .. }));
                    act.run_answered(&run, ended, events);
                    if let (Ok(()), Some(held)) = (&status, held) {
                        held.command(&Command::FinishRun { run: run.clone() });
                    }
                    let change = act
                        .store
                        .is_some()
                        .then(|| act.core.take_durable_change())
                        .flatten();
                    let held = match change {
                        Some(_) => std::mem::take(&mut act.out),
                        None => Vec::new(),
                    };
                    act.write(change).map(move |_, act: &mut Self, _| {
                        act.out.splice(0..0, held);
                        status
                    })
                })
                .map(|status, act, ctx| {
                    act.contained(ctx, |act, ctx| act.flush(ctx))
                        .map_or(Err(GateError::Internal), |()| Ok(status?))
                }),
        ))
    }
}
