//! The current run: one command from its claim to its acknowledged report,
//! as a phase that holds only what that phase has, and the inputs that move
//! it from one phase to the next.

use std::time::Duration;

use crate::command::{CommandStatus, NO_LONGER_SHARED, WAITING_FOR_APPROVAL};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::ids::{CommandId, ExecutionId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::relay::executor::ProgressReport;
use crate::time::Timestamp;

use super::control::{ControlPoll, first_control};
use super::machine::Awaiting;
use super::pass::UnconfirmedClaim;
use super::progress::ProgressState;
use super::*;

/// The command being handled, from claim to acknowledged report.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Run {
    pub(super) job: Job,
    /// Progress outlives the phases: a post sent while the run waited for
    /// approval may be answered while it is claimed again or reported.
    pub(super) progress: ProgressState,
    pub(super) phase: Phase,
}

/// Where the current run is.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
    /// [`Action::Claim`] is in flight.
    Claiming {
        /// The owner approved the run already: this claim confirms it is
        /// still ours after the wait, and the Graph starts once granted.
        approved: bool,
    },
    /// Claimed; the owner is asked to approve it ([`Action::AskApproval`]).
    AwaitingApproval {
        /// The wait ends then.
        until: Timestamp,
        /// How long the wait is (its end's message says it).
        wait: Duration,
        control: ControlPoll,
    },
    /// [`Action::Execute`] was emitted and the execution has not finished.
    Executing {
        control: ControlPoll,
        /// Why the engine was asked to stop, once it was.
        cancel: Option<Cancel>,
    },
    /// The run's report is being written to the outbox.
    Storing(OutboxItem),
    /// The run's report is being posted.
    Posting,
}

/// Why an executing run's engine was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Cancel {
    /// The agent cancelled the run.
    ByAgent,
    /// The owner cancelled the run on the desktop: its report says so.
    ByOwner,
    /// A control answer said the server closed the run (with this status):
    /// nothing is reported when it ends.
    ClosedByServer(CommandStatus),
}

impl Run {
    /// A command about to be claimed under `execution`.
    pub(super) fn claiming(command: RelayCommand, execution: ExecutionId, approved: bool) -> Self {
        let job = Job {
            channel: command.id.channel(),
            command,
            execution,
        };
        Self {
            job,
            progress: ProgressState::default(),
            phase: Phase::Claiming { approved },
        }
    }

    pub(super) fn id(&self) -> CommandId {
        self.job.command.id
    }

    /// True from the claim's grant (approval included) until the execution ended.
    pub(super) fn claimed_and_open(&self) -> bool {
        matches!(
            self.phase,
            Phase::AwaitingApproval { .. } | Phase::Executing { .. }
        )
    }

    /// True while the run waits for approval or executes, and its progress
    /// may be posted.
    pub(super) fn takes_progress(&self) -> bool {
        let open = match &self.phase {
            Phase::AwaitingApproval { .. } => true,
            Phase::Executing { cancel, .. } => !matches!(cancel, Some(Cancel::ClosedByServer(_))),
            _ => false,
        };
        open && !self.progress.refused
    }

    /// The control polling of a claimed, open run.
    pub(super) fn control(&self) -> Option<&ControlPoll> {
        match &self.phase {
            Phase::AwaitingApproval { control, .. } | Phase::Executing { control, .. } => {
                Some(control)
            }
            _ => None,
        }
    }

    pub(super) fn control_mut(&mut self) -> Option<&mut ControlPoll> {
        match &mut self.phase {
            Phase::AwaitingApproval { control, .. } | Phase::Executing { control, .. } => {
                Some(control)
            }
            _ => None,
        }
    }

    /// The still-shared re-check of the run's command.
    fn still_shared(&self, shared: &SharedSet) -> bool {
        let c = &self.job.command;
        shared.still_shared(&c.project, &c.graph_session_id, &c.slug)
    }
}

impl Awaiting {
    /// The current run, if any.
    pub(super) fn run(&self) -> Option<&Run> {
        match self {
            Awaiting::Run(run) => Some(run),
            _ => None,
        }
    }

    pub(super) fn run_mut(&mut self) -> Option<&mut Run> {
        match self {
            Awaiting::Run(run) => Some(run),
            _ => None,
        }
    }

    /// The current run if it is `command`'s and waits for approval or executes.
    pub(super) fn open_run(&mut self, command: CommandId) -> Option<&mut Run> {
        self.run_mut()
            .filter(|r| r.id() == command && r.claimed_and_open())
    }

    /// Takes the current run out (the pass then waits for nothing).
    fn take_run(&mut self) -> Option<Run> {
        match std::mem::replace(self, Awaiting::Nothing) {
            Awaiting::Run(run) => Some(*run),
            other => {
                *self = other;
                None
            }
        }
    }
}

impl Relay {
    /// The answer to [`Action::Claim`].
    pub fn handle_claim_response(
        &mut self,
        command: CommandId,
        outcome: ClaimOutcome,
        now: Timestamp,
    ) {
        let Some(approved) = self.awaiting.run().and_then(|r| match r.phase {
            Phase::Claiming { approved } if r.id() == command => Some(approved),
            _ => None,
        }) else {
            return;
        };
        match &outcome {
            ClaimOutcome::Granted | ClaimOutcome::Refused(_) => self.server_answered(now),
            ClaimOutcome::Network(reason) => self.server_silent(reason, now),
        }
        match outcome {
            ClaimOutcome::Granted if self.stopping() => {
                // The server gave us the command as we stop: it never starts.
                self.finish_unstarted(
                    FinishStatus::Failed,
                    WORKER_STOPPED_BEFORE_START.to_owned(),
                    now,
                );
                return;
            }
            ClaimOutcome::Granted => {
                if self.claim_granted(command, approved, now) {
                    return;
                }
            }
            ClaimOutcome::Refused(reason) => {
                self.events
                    .push_back(RelayEvent::ClaimRefused { command, reason });
                self.awaiting = Awaiting::Nothing;
            }
            ClaimOutcome::Network(reason) => {
                // The claim may have reached the server: the command could be
                // `running` there under our execution id, and no sync hands a
                // running command out again. Keep it, end the pass, and claim it
                // again (same execution id, which the server accepts as a
                // retry) before anything else on the next pass.
                self.events
                    .push_back(RelayEvent::ClaimUnconfirmed { command, reason });
                if let Some(run) = self.awaiting.take_run() {
                    self.unconfirmed = Some(UnconfirmedClaim {
                        command: run.job.command,
                        execution: run.job.execution,
                        approved,
                    });
                }
                self.link.failures = self.link.failures.saturating_add(1);
                self.pass.projects.clear();
                self.pass.commands.clear();
                self.end_pass(now);
            }
        }
        self.drive(now);
    }

    /// The claim was granted while the relay runs: the consent re-check
    /// again, then the owner's approval if the run needs it, else the start.
    /// True when the run was closed (and the pass driven) already.
    fn claim_granted(&mut self, command: CommandId, approved: bool, now: Timestamp) -> bool {
        // The re-check again, now that the command is ours: the owner may
        // have withdrawn consent while the claim was in flight.
        if self
            .awaiting
            .run()
            .is_some_and(|r| !r.still_shared(&self.shared))
        {
            if let Some(run) = self.awaiting.take_run() {
                self.close_withdrawn(run, now);
            }
            self.drive(now);
            return true;
        }
        let approval = self
            .awaiting
            .run()
            .filter(|_| !approved)
            .and_then(|r| self.shared.approval(&r.job.command.graph_session_id));
        match approval {
            Some(wait) => self.ask_approval(command, wait, now),
            None => self.start_execution(command, now),
        }
        self.maybe_send_control(now);
        self.maybe_send_progress(now);
        false
    }

    /// The executor finished the job (whatever the reason).
    pub fn handle_execution_finished(
        &mut self,
        command: CommandId,
        outcome: ExecutionOutcome,
        now: Timestamp,
    ) {
        let Some(run) = self.awaiting.open_run(command) else {
            return;
        };
        run.progress.pending = None;
        let cancel = match run.phase {
            Phase::Executing { cancel, .. } => cancel,
            _ => None,
        };
        if let Some(Cancel::ClosedByServer(_)) = cancel {
            // The server closed the run: it would refuse this report for good.
            self.events.push_back(RelayEvent::Abandoned { command });
            self.awaiting = Awaiting::Nothing;
            self.drive(now);
            return;
        }
        // Once the relay has asked the engine to stop, the run is recorded as
        // cancelled even if the Graph finished between the flag and the stop.
        let status = if cancel.is_some() {
            FinishStatus::Cancelled
        } else {
            outcome.status.unwrap_or(FinishStatus::Completed)
        };
        let error = if cancel == Some(Cancel::ByOwner) {
            Some(CANCELLED_ON_THE_DESKTOP.to_owned())
        } else {
            outcome.error
        };
        let body = EnvelopeBody {
            result: outcome.result,
            total_tokens: outcome.total_tokens,
            reported_cost: outcome.reported_cost,
            error,
        };
        self.record_completion(status, body, now);
    }

    /// The owner cancelled the run on the desktop (say, the console's
    /// cancel button). The run ends `cancelled` with
    /// [`CANCELLED_ON_THE_DESKTOP`], the way an agent's cancel ends it:
    /// - executing: the engine is asked to stop once
    ///   ([`Action::CancelExecution`]), and the report says `cancelled`
    ///   even if the Graph finished between the click and the stop;
    /// - waiting for approval: the prompt is withdrawn and nothing runs.
    ///
    /// The report is fenced by the run's execution id like any other.
    /// Returns `false`, changing nothing, when `command` is not the current
    /// run, or is already being stopped (the agent cancelled, the server
    /// closed it) or reported.
    #[must_use = "false means the run was not cancelled"]
    pub fn handle_local_cancel(&mut self, command: CommandId, now: Timestamp) -> bool {
        let Some(run) = self.awaiting.open_run(command) else {
            return false;
        };
        match &mut run.phase {
            Phase::AwaitingApproval { .. } => {
                self.actions.push_back(Action::WithdrawApproval { command });
                self.events
                    .push_back(RelayEvent::CancelledOnTheDesktop { command });
                self.finish_unstarted(
                    FinishStatus::Cancelled,
                    format!(
                        "{CANCELLED_ON_THE_DESKTOP} while the run waited for approval; the Graph did not run."
                    ),
                    now,
                );
                true
            }
            Phase::Executing { cancel, .. } if cancel.is_none() => {
                *cancel = Some(Cancel::ByOwner);
                run.progress.pending = None;
                self.actions.push_back(Action::CancelExecution { command });
                self.events
                    .push_back(RelayEvent::CancelledOnTheDesktop { command });
                self.drive(now);
                true
            }
            _ => false,
        }
    }

    /// The owner's answer to [`Action::AskApproval`]. Approved: the consent
    /// re-check runs (failing, the run ends `cancelled` with the re-check's
    /// message), then the claim is confirmed ([`Action::Claim`] again, same
    /// execution) and the Graph starts when it is granted. Denied: the run ends `failed` with
    /// [`DECLINED_ON_THE_DESKTOP`] and the reason. An answer to a question
    /// that is no longer asked (timed out, cancelled) changes nothing.
    pub fn handle_approval(
        &mut self,
        command: CommandId,
        decision: ApprovalDecision,
        now: Timestamp,
    ) {
        if !self
            .awaiting
            .open_run(command)
            .is_some_and(|r| matches!(r.phase, Phase::AwaitingApproval { .. }))
        {
            return;
        }
        match decision {
            ApprovalDecision::Approved => {
                self.events.push_back(RelayEvent::Approved { command });
                // The consent re-check, right before the start.
                if self
                    .awaiting
                    .run()
                    .is_some_and(|r| !r.still_shared(&self.shared))
                {
                    if let Some(run) = self.awaiting.take_run() {
                        self.close_withdrawn(run, now);
                    }
                    self.drive(now);
                    return;
                }
                if let Some(run) = self.awaiting.run_mut() {
                    // Replaces "waiting for approval" once the Graph starts.
                    run.progress.pending = Some(ProgressReport {
                        message: Some(APPROVED_ON_THE_DESKTOP.to_owned()),
                        percent: None,
                    });
                    // The wait may have been long: the server may have closed
                    // the run meanwhile (its lease lapsed while the desktop was
                    // unreachable). Claiming it again under the same execution
                    // confirms it is still ours (and renews its lease) before
                    // anything runs. A control answer in flight is ignored
                    // while the claim is; polling starts afresh with the
                    // execution.
                    run.phase = Phase::Claiming { approved: true };
                    let execution = run.job.execution.clone();
                    self.actions.push_back(Action::Claim { command, execution });
                }
            }
            ApprovalDecision::Denied(reason) => {
                let reason = reason
                    .map(|r| r.trim().to_owned())
                    .filter(|r| !r.is_empty());
                let error = match &reason {
                    Some(r) => format!("{DECLINED_ON_THE_DESKTOP}: {r}"),
                    None => DECLINED_ON_THE_DESKTOP.to_owned(),
                };
                self.events
                    .push_back(RelayEvent::ApprovalDenied { command, reason });
                self.finish_unstarted(FinishStatus::Failed, error, now);
            }
        }
    }

    /// Starts the claimed command's execution (its approval, if it needed
    /// one, was given, and the re-check holds).
    pub(super) fn start_execution(&mut self, command: CommandId, now: Timestamp) {
        let control = first_control(&self.config, now);
        let Some(run) = self.awaiting.run_mut() else {
            return;
        };
        run.phase = Phase::Executing {
            control,
            cancel: None,
        };
        let job = run.job.clone();
        self.events.push_back(RelayEvent::Started {
            command,
            execution: job.execution.clone(),
        });
        self.actions.push_back(Action::Execute(job));
    }

    /// Asks the owner to approve the claimed command, for at most `wait`;
    /// meanwhile its progress says so and control is polled as for a run.
    pub(super) fn ask_approval(&mut self, command: CommandId, wait: Duration, now: Timestamp) {
        let control = first_control(&self.config, now);
        let Some(run) = self.awaiting.run_mut() else {
            return;
        };
        let until = now.plus(wait);
        run.progress.pending = Some(ProgressReport {
            message: Some(WAITING_FOR_APPROVAL.to_owned()),
            percent: None,
        });
        run.phase = Phase::AwaitingApproval {
            until,
            wait,
            control,
        };
        let job = run.job.clone();
        self.events
            .push_back(RelayEvent::ApprovalRequested { command, until });
        self.actions.push_back(Action::AskApproval { job, until });
    }

    /// Ends a claimed run that never executed (declined, not approved in
    /// time, cancelled while waiting): its completion goes through the outbox.
    pub(super) fn finish_unstarted(&mut self, status: FinishStatus, error: String, now: Timestamp) {
        let body = EnvelopeBody {
            error: Some(error),
            ..EnvelopeBody::default()
        };
        self.record_completion(status, body, now);
    }

    /// Stores the current run's completion, then posts it.
    fn record_completion(&mut self, status: FinishStatus, body: EnvelopeBody, now: Timestamp) {
        let Some(run) = self.awaiting.run_mut() else {
            return;
        };
        let command = run.id();
        run.progress.pending = None;
        let envelope = ResultEnvelope::build(run.job.execution.clone(), status, body);
        let truncated = envelope.is_truncated();
        let item = OutboxItem {
            command,
            report: RelayReport::Completion { envelope },
            stored_at: now,
            attempts: 0,
        };
        run.phase = Phase::Storing(item.clone());
        self.events.push_back(RelayEvent::Finished {
            command,
            status,
            truncated,
        });
        self.actions.push_back(Action::StoreReport(item));
        self.drive(now);
    }

    /// Closes a command claimed (or possibly claimed) under `run`'s
    /// execution whose consent re-check now fails: it never runs, and a
    /// cancelled completion with the re-check's message goes through the outbox.
    pub(super) fn close_withdrawn(&mut self, mut run: Run, now: Timestamp) {
        let id = run.id();
        self.events.push_back(RelayEvent::Declined { command: id });
        let envelope = ResultEnvelope::build(
            run.job.execution.clone(),
            FinishStatus::Cancelled,
            EnvelopeBody {
                error: Some(NO_LONGER_SHARED.to_owned()),
                ..EnvelopeBody::default()
            },
        );
        let item = OutboxItem {
            command: id,
            report: RelayReport::Completion { envelope },
            stored_at: now,
            attempts: 0,
        };
        run.phase = Phase::Storing(item.clone());
        self.awaiting = Awaiting::Run(Box::new(run));
        self.actions.push_back(Action::StoreReport(item));
    }
}
