//! The desktop side: the relay's actions performed on the simulated
//! network, the synthetic executor, and the answers it hears.

use graph_relay_core::outbox::OutboxError;

use super::*;

impl World {
    pub(super) fn perform_actions(&mut self) {
        if !self.desktop_up {
            return;
        }
        while let Some(action) = self.relay.poll_action() {
            let now = self.now();
            match action {
                Action::LoadOutbox => {
                    let items = match &self.outbox {
                        Some(o) => block_on(o.pending()).unwrap_or_default(),
                        None => Vec::new(),
                    };
                    self.relay.handle_outbox_loaded(items, now);
                }
                Action::Sync(request) => self.send(Request::Sync(request)),
                Action::RememberProject(project) => {
                    self.write_outbox(|o| o.remember_project(&project));
                }
                Action::ForgetProject(project) => {
                    self.write_outbox(|o| o.forget_project(&project));
                }
                Action::AbortHeldSync => {
                    self.held.retain(|h| !matches!(h.kind, HeldKind::Sync(_)));
                    self.relay
                        .handle_sync_response(Err(SyncFailure::Aborted), now);
                }
                Action::Claim { command, execution } => {
                    self.send(Request::Claim { command, execution });
                }
                Action::Execute(job) => self.execute(job),
                Action::Control { command, long_poll } => {
                    self.send(Request::Control { command, long_poll });
                }
                Action::CancelExecution { command } => self.cancel_execution(command, now),
                // The simulated desktop shares no Graph that needs approval.
                Action::AskApproval { .. } | Action::WithdrawApproval { .. } => {}
                Action::PostProgress {
                    command,
                    execution,
                    report,
                } => self.send(Request::Progress {
                    command,
                    execution,
                    report,
                }),
                Action::StoreReport(item) => {
                    self.write_outbox(|o| o.put(&item));
                    self.relay.handle_report_stored(item.command, now);
                }
                Action::PostReport(item) => self.post_report(item, now),
                Action::RemoveReport(command) => {
                    self.write_outbox(|o| o.remove(&command));
                }
                Action::RecordAttempt(command) => {
                    self.write_outbox(|o| o.record_attempt(&command));
                }
            }
        }
    }

    /// Writes to the desktop's outbox, when it has one (the in-memory
    /// outbox does not fail).
    fn write_outbox<'a, F>(&'a self, write: impl FnOnce(&'a MemoryOutbox) -> F)
    where
        F: Future<Output = Result<(), OutboxError>>,
    {
        if let Some(o) = &self.outbox {
            let _ = block_on(write(o));
        }
    }

    /// A request from the desktop reaches the server one latency later.
    fn send(&mut self, request: Request) {
        let at = self.after_latency();
        self.schedule(at, Event::Arrive(self.epoch, request));
    }

    /// Posts a report, unless the experiment loses this completion on the
    /// way: then the desktop hears, after a round trip, that it should retry.
    fn post_report(&mut self, item: OutboxItem, now: Timestamp) {
        if self.lose_posts > 0 && matches!(item.report, RelayReport::Completion { .. }) {
            self.lose_posts -= 1;
            let at = now.plus(self.config.latency * 2);
            self.schedule(
                at,
                Event::Answer(
                    self.epoch,
                    Answer::Posted(item.command, PostOutcome::Retry("lost".into())),
                ),
            );
        } else {
            self.send(Request::Post(item));
        }
    }

    /// The engine stops the execution of `command` at once, if it runs.
    fn cancel_execution(&mut self, command: CommandId, now: Timestamp) {
        if let Some((running, generation)) = self.running
            && running == command
        {
            self.schedule(
                now,
                Event::ExecutionDone {
                    command,
                    generation,
                    status: FinishStatus::Cancelled,
                },
            );
        }
    }

    fn execute(&mut self, job: Job) {
        let now = self.now();
        self.exec_generation += 1;
        let generation = self.exec_generation;
        let rt = self.config.run_time;
        let secs = self.rng.lognormal(rt.median_secs, rt.sigma, rt.min_secs);
        let command = job.command.id;
        self.running = Some((command, generation));
        self.executions.push(ExecutionRecord {
            command,
            started: now,
            ended: None,
            status: None,
        });
        let at = now.plus(Duration::from_secs_f64(secs));
        self.schedule(
            at,
            Event::ExecutionDone {
                command,
                generation,
                status: FinishStatus::Completed,
            },
        );
        if let Some(every) = self.config.progress_every {
            self.schedule(
                now.plus(every),
                Event::Progress {
                    command,
                    execution: job.execution,
                    generation,
                    n: 1,
                    ends_at: at,
                },
            );
        }
    }

    /// The server's answer reaches the running desktop's relay.
    pub(super) fn hear(&mut self, answer: Answer, now: Timestamp) {
        match answer {
            Answer::Sync(result) => self.relay.handle_sync_response(result, now),
            Answer::Claim(command, outcome) => {
                self.relay.handle_claim_response(command, outcome, now)
            }
            Answer::Control(command, result) => {
                self.relay.handle_control_response(command, result, now)
            }
            Answer::Posted(command, outcome) => {
                self.relay.handle_report_posted(command, outcome, now)
            }
            Answer::ProgressPosted(command, outcome) => {
                self.relay.handle_progress_posted(command, outcome, now)
            }
        }
    }

    /// The execution `generation` of `command` ended with `status`: it is
    /// recorded and the relay told, unless a later execution replaced it.
    pub(super) fn execution_done(
        &mut self,
        command: CommandId,
        generation: u64,
        status: FinishStatus,
        now: Timestamp,
    ) {
        if self.running != Some((command, generation)) {
            return;
        }
        self.running = None;
        if let Some(record) = self
            .executions
            .iter_mut()
            .rev()
            .find(|e| e.command == command)
        {
            record.ended = Some(now);
            record.status = Some(status);
        }
        let outcome = ExecutionOutcome {
            status: Some(status),
            result: json!({"text": "synthetic result"}),
            total_tokens: Some(1000),
            reported_cost: None,
            error: None,
        };
        self.relay.handle_execution_finished(command, outcome, now);
    }

    /// The running execution reports its `n`th step (how far it is, by the
    /// time it will take) and schedules the next one.
    pub(super) fn report_progress(
        &mut self,
        command: CommandId,
        execution: ExecutionId,
        generation: u64,
        n: u64,
        ends_at: Timestamp,
        now: Timestamp,
    ) {
        if self.running != Some((command, generation)) || !self.desktop_up {
            return;
        }
        let (Some(every), Some(started)) = (
            self.config.progress_every,
            self.executions.last().map(|e| e.started),
        ) else {
            return;
        };
        let total = ends_at.since(started).as_secs_f64().max(0.001);
        let done = now.since(started).as_secs_f64();
        let report = ProgressReport {
            message: Some(format!("step {n}")),
            percent: Some((done / total * 100.0).clamp(0.0, 100.0).floor()),
        };
        let _ = self.relay.handle_progress(command, &execution, report, now);
        self.schedule(
            now.plus(every),
            Event::Progress {
                command,
                execution,
                generation,
                n: n + 1,
                ends_at,
            },
        );
    }
}
