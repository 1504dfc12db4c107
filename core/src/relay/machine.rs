//! The state machine itself: [`Relay`] and its private bookkeeping.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use crate::command::{CommandStatus, InvalidProgress, WAITING_FOR_APPROVAL};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::executor::ProgressReport;
use crate::ids::{CommandId, ExecutionId, ProjectId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::queue::ControlAnswer;
use crate::time::{Timestamp, splitmix64};

use super::reachability::Reachability;
use super::*;

/// What the pass is waiting for.
#[derive(Debug, Clone, PartialEq)]
enum Awaiting {
    Nothing,
    OutboxLoad,
    OutboxPost(CommandId),
    Sync {
        project: ProjectId,
        held: bool,
        announced: bool,
        /// The sync carries no session: it ends the project's shares.
        empty: bool,
    },
    Claim(CommandId),
    Execution(CommandId),
    Store(CommandId),
    Post(CommandId),
}

/// The command being handled, from claim to acknowledged report.
#[derive(Debug, Clone, PartialEq)]
struct Current {
    job: Job,
    cancel_sent: bool,
    /// The owner cancelled the run on the desktop: its report says so.
    cancelled_locally: bool,
    /// [`Action::Execute`] was emitted and the execution has not finished.
    executing: bool,
    control_in_flight: bool,
    next_control_at: Option<Timestamp>,
    report: Option<OutboxItem>,
    /// A control answer said the server closed the run (with this status).
    closed_by_server: Option<CommandStatus>,
    /// Waiting for the owner's approval until then.
    approval_until: Option<Timestamp>,
    /// How long the wait for approval was.
    approval_wait: Duration,
    /// The owner approved the run: it starts once the server confirms the
    /// claim again.
    approved: bool,
    progress: ProgressState,
}

/// The progress of the current run on its way to the server.
#[derive(Debug, Clone, PartialEq, Default)]
struct ProgressState {
    /// The latest report not posted yet.
    pending: Option<ProgressReport>,
    /// When the last post was sent.
    last_post: Option<Timestamp>,
    in_flight: bool,
    /// The server refused a report for good: send no more.
    refused: bool,
}

impl Current {
    /// A command about to be claimed under `execution`.
    fn new(command: RelayCommand, execution: ExecutionId) -> Self {
        let job = Job {
            channel: command.id.channel(),
            command,
            execution,
        };
        Self {
            job,
            cancel_sent: false,
            cancelled_locally: false,
            executing: false,
            control_in_flight: false,
            next_control_at: None,
            report: None,
            closed_by_server: None,
            approval_until: None,
            approval_wait: Duration::ZERO,
            approved: false,
            progress: ProgressState::default(),
        }
    }

    /// True from the claim's grant (approval included) until the execution ended.
    fn claimed_and_open(&self) -> bool {
        self.executing || self.approval_until.is_some()
    }

    /// True while the run waits for approval or executes, and its progress
    /// may be posted.
    fn takes_progress(&self) -> bool {
        self.claimed_and_open()
            && self.report.is_none()
            && self.closed_by_server.is_none()
            && !self.progress.refused
    }
}

/// The relay state machine. See the module docs for the call order.
#[derive(Debug)]
pub struct Relay {
    config: RelayConfig,
    shared: SharedSet,
    in_pass: bool,
    next_tick: Timestamp,
    wake_at: Option<Timestamp>,
    pass_requested: bool,
    awaiting: Awaiting,
    retry_queue: VecDeque<OutboxItem>,
    projects: VecDeque<ProjectId>,
    commands: VecDeque<RelayCommand>,
    current: Option<Current>,
    work_in_pass: usize,
    held_done: bool,
    failures: u32,
    /// A claim without an answer: the command, its execution, and whether
    /// the owner had approved it already.
    unconfirmed: Option<(RelayCommand, ExecutionId, bool)>,
    /// Until one sync announcing it succeeded: this process has just started.
    restarted: bool,
    /// The outbox re-send of this pass left nothing behind (the restart
    /// announcement waits for it).
    outbox_clear: bool,
    /// Projects the server may hold shares of this relay in (remembered
    /// before their first sync; forgotten after an empty sync succeeded).
    synced: BTreeSet<ProjectId>,
    rng: u64,
    /// Whether the server answers, and when that is worth saying.
    reach: Reachability,
    /// Set by [`Relay::handle_shutdown`].
    stop: Option<Stop>,
    actions: VecDeque<Action>,
    events: VecDeque<RelayEvent>,
}

/// How far shutdown got.
#[derive(Debug, Clone, PartialEq)]
struct Stop {
    /// The running command is given up then.
    deadline: Timestamp,
    /// The last delivery attempt of the outbox began.
    flushing: bool,
    delivered: usize,
    kept: usize,
    done: bool,
}

impl Relay {
    /// A relay whose first pass is due at `first_pass` (interval mode keeps
    /// that phase for every later tick; long-poll mode starts then).
    pub fn new(config: RelayConfig, shared: SharedSet, first_pass: Timestamp) -> Self {
        let rng = config.seed;
        Self {
            config,
            shared,
            in_pass: false,
            next_tick: first_pass,
            wake_at: Some(first_pass),
            pass_requested: false,
            awaiting: Awaiting::Nothing,
            retry_queue: VecDeque::new(),
            projects: VecDeque::new(),
            commands: VecDeque::new(),
            current: None,
            work_in_pass: 0,
            held_done: false,
            failures: 0,
            unconfirmed: None,
            restarted: true,
            outbox_clear: false,
            synced: BTreeSet::new(),
            rng,
            reach: Reachability::default(),
            stop: None,
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Projects an earlier run of this relay synced and did not forget (as
    /// recorded on [`Action::RememberProject`]). Call it before the first
    /// pass: a project among them that is no longer enabled is synced with an
    /// empty list until that succeeds once.
    pub fn remember_synced(&mut self, projects: impl IntoIterator<Item = ProjectId>) {
        self.synced.extend(projects);
    }

    /// The projects the relay remembers having synced.
    pub fn synced_projects(&self) -> impl Iterator<Item = &ProjectId> {
        self.synced.iter()
    }

    /// True until one sync announcing the restart succeeded (the
    /// announcement itself waits for an empty outbox).
    pub fn announces_restart(&self) -> bool {
        self.restarted
    }

    /// The shared set the re-check uses.
    pub fn shared(&self) -> &SharedSet {
        &self.shared
    }

    /// The command the relay is handling, if any: from its claim until its
    /// report was acknowledged (it may be waiting for approval, executing,
    /// or reported and not yet acknowledged, so not necessarily running).
    pub fn current_command(&self) -> Option<CommandId> {
        self.current.as_ref().map(|c| c.job.command.id)
    }

    /// True while a pass is in progress.
    pub fn is_busy(&self) -> bool {
        self.in_pass
    }

    /// True once shutdown finished: the running command ended and was
    /// reported (or was given up after [`RelayConfig::shutdown_timeout`]),
    /// and the outbox had its last delivery attempt. The driver may return.
    pub fn is_stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| s.done)
    }

    fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next status line, if any.
    pub fn poll_event(&mut self) -> Option<RelayEvent> {
        self.events.pop_front()
    }

    /// When [`Relay::handle_timeout`] must be called next, if a timer is armed.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let mut deadline: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        if let Some(stop) = &self.stop {
            if !stop.flushing {
                consider(stop.deadline);
            }
            return deadline;
        }
        if !self.in_pass {
            match self.config.mode {
                RelayMode::Interval => consider(self.next_tick),
                RelayMode::LongPoll => {
                    if let Some(t) = self.wake_at {
                        consider(t);
                    }
                }
            }
        }
        if let Some(c) = &self.current
            && let (Some(t), false, Awaiting::Execution(_)) =
                (c.next_control_at, c.control_in_flight, &self.awaiting)
        {
            consider(t);
        }
        if let Some(c) = &self.current
            && let (Some(t), Awaiting::Execution(_)) = (c.approval_until, &self.awaiting)
        {
            consider(t);
        }
        if let Some(c) = &self.current
            && c.takes_progress()
            && c.progress.pending.is_some()
            && !c.progress.in_flight
            && let Some(last) = c.progress.last_post
        {
            consider(last.plus(self.config.progress_interval));
        }
        deadline
    }

    // ----- inputs -----------------------------------------------------------

    /// Timers: a pass tick, a back-off, a control poll, a progress post, the
    /// end of a wait for approval.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if let Some(stop) = &self.stop {
            if !stop.flushing && now >= stop.deadline {
                // Give up on what is still in flight; the outbox keeps any
                // stored report for the last delivery attempt.
                if let Some(current) = self.current.take() {
                    self.events.push_back(RelayEvent::GaveUpWaiting {
                        command: current.job.command.id,
                    });
                }
                self.awaiting = Awaiting::Nothing;
                self.drive(now);
            }
            return;
        }
        if let (Some(c), Awaiting::Execution(command)) = (&self.current, &self.awaiting)
            && c.approval_until.is_some_and(|t| t <= now)
        {
            let command = *command;
            let waited = c.approval_wait.as_secs();
            self.actions.push_back(Action::WithdrawApproval { command });
            self.events
                .push_back(RelayEvent::ApprovalTimedOut { command });
            let error = format!(
                "{NOT_APPROVED_IN_TIME}: nobody approved the run on the owner's desktop within {waited} s, so the Graph did not run."
            );
            self.finish_unstarted(command, FinishStatus::Failed, error, now);
        }
        self.maybe_send_control(now);
        self.maybe_send_progress(now);
        self.drive(now);
    }

    /// The owner changed what is shared (e.g. the graphs file was edited).
    /// The re-check uses the new set at once; a pass runs right away if idle.
    pub fn handle_shared_set(&mut self, shared: SharedSet, now: Timestamp) {
        if shared == self.shared {
            return;
        }
        self.shared = shared;
        if self.stopping() {
            return;
        }
        match self.config.mode {
            RelayMode::Interval => {
                if !self.in_pass {
                    self.pass_requested = true;
                }
            }
            RelayMode::LongPoll => {
                if matches!(self.awaiting, Awaiting::Sync { held: true, .. }) {
                    self.actions.push_back(Action::AbortHeldSync);
                } else if !self.in_pass {
                    self.wake_at = Some(now);
                }
            }
        }
        self.drive(now);
    }

    /// The outbox's pending items, as asked by [`Action::LoadOutbox`].
    pub fn handle_outbox_loaded(&mut self, items: Vec<OutboxItem>, now: Timestamp) {
        if self.awaiting == Awaiting::OutboxLoad {
            self.awaiting = Awaiting::Nothing;
            self.retry_queue = items.into();
            self.outbox_clear = true;
        }
        self.drive(now);
    }

    /// The answer to [`Action::Sync`].
    pub fn handle_sync_response(
        &mut self,
        result: Result<Vec<RelayCommand>, SyncFailure>,
        now: Timestamp,
    ) {
        let Awaiting::Sync {
            project,
            held,
            announced,
            empty,
        } = std::mem::replace(&mut self.awaiting, Awaiting::Nothing)
        else {
            return;
        };
        if held {
            self.held_done = true;
        }
        match &result {
            Ok(_) | Err(SyncFailure::Refused(_)) => self.server_answered(now),
            Err(SyncFailure::Network(reason)) => self.server_silent(reason, now),
            Err(SyncFailure::Aborted) => {}
        }
        match result {
            Ok(commands) => {
                self.failures = 0;
                if announced {
                    self.restarted = false;
                }
                self.events.push_back(RelayEvent::Synced {
                    project: project.clone(),
                    commands: commands.len(),
                });
                // An empty sync of a project no longer enabled succeeded: the
                // server holds no shares of ours there now. (If the project was
                // enabled again meanwhile, it stays remembered; if it was
                // withdrawn while a sync with sessions was in flight, the
                // server holds those, and the next pass empties them.)
                if empty && !self.is_enabled(&project) && self.synced.remove(&project) {
                    self.actions
                        .push_back(Action::ForgetProject(project.clone()));
                    self.events.push_back(RelayEvent::Unshared {
                        project: project.clone(),
                    });
                }
                self.work_in_pass += commands.len();
                // Only this project's commands; anything else is ignored.
                self.commands
                    .extend(commands.into_iter().filter(|c| c.project == project));
            }
            Err(SyncFailure::Aborted) => {
                self.held_done = true;
            }
            Err(SyncFailure::Network(reason)) => self.sync_failed(project, reason, true),
            Err(SyncFailure::Refused(reason)) => self.sync_failed(project, reason, false),
        }
        self.drive(now);
    }

    /// A sync, claim or control request got an answer.
    fn server_answered(&mut self, now: Timestamp) {
        self.events.extend(self.reach.answered(now));
    }

    /// A sync, claim or control request got no usable answer.
    fn server_silent(&mut self, reason: &str, now: Timestamp) {
        self.events.extend(self.reach.no_answer(reason, now));
    }

    /// A sync brought nothing: the pass ends here, and the next one retries.
    fn sync_failed(&mut self, project: ProjectId, reason: String, unreachable: bool) {
        self.events.push_back(RelayEvent::SyncFailed {
            project,
            reason,
            unreachable,
        });
        self.failures = self.failures.saturating_add(1);
        self.projects.clear();
        self.held_done = true;
    }

    /// The answer to [`Action::Claim`].
    pub fn handle_claim_response(
        &mut self,
        command: CommandId,
        outcome: ClaimOutcome,
        now: Timestamp,
    ) {
        if self.awaiting != Awaiting::Claim(command) {
            return;
        }
        self.awaiting = Awaiting::Nothing;
        match &outcome {
            ClaimOutcome::Granted | ClaimOutcome::Refused(_) => self.server_answered(now),
            ClaimOutcome::Network(reason) => self.server_silent(reason, now),
        }
        match outcome {
            ClaimOutcome::Granted if self.stopping() => {
                // The server gave us the command as we stop: it never starts.
                if let Some(current) = self.current.as_mut() {
                    current.executing = false;
                }
                self.finish_unstarted(
                    command,
                    FinishStatus::Failed,
                    WORKER_STOPPED_BEFORE_START.to_owned(),
                    now,
                );
                return;
            }
            ClaimOutcome::Granted => {
                // The re-check again, now that the command is ours: the owner may
                // have withdrawn consent while the claim was in flight.
                if let Some(current) = self.current.take_if(|c| {
                    !self.shared.still_shared(
                        &c.job.command.project,
                        &c.job.command.graph_session_id,
                        &c.job.command.slug,
                    )
                }) {
                    self.close_withdrawn(current, now);
                    self.drive(now);
                    return;
                }
                let approval = self
                    .current
                    .as_ref()
                    .filter(|c| !c.approved)
                    .and_then(|c| self.shared.approval(&c.job.command.graph_session_id));
                match approval {
                    Some(wait) => self.ask_approval(command, wait, now),
                    None => self.start_execution(command, now),
                }
                self.maybe_send_control(now);
                self.maybe_send_progress(now);
            }
            ClaimOutcome::Refused(reason) => {
                self.events
                    .push_back(RelayEvent::ClaimRefused { command, reason });
                self.current = None;
            }
            ClaimOutcome::Network(reason) => {
                // The claim may have reached the server: the command could be
                // `running` there under our execution id, and no sync hands a
                // running command out again. Keep it, end the pass, and claim it
                // again (same execution id, which the server accepts as a
                // retry) before anything else on the next pass.
                self.events
                    .push_back(RelayEvent::ClaimUnconfirmed { command, reason });
                if let Some(current) = self.current.take() {
                    self.unconfirmed =
                        Some((current.job.command, current.job.execution, current.approved));
                }
                self.failures = self.failures.saturating_add(1);
                self.projects.clear();
                self.commands.clear();
                self.end_pass(now);
            }
        }
        self.drive(now);
    }

    /// The answer to [`Action::Control`]: the server's [`ControlAnswer`], or
    /// why there is none. A terminal status means the server closed the run:
    /// the execution is stopped and nothing is reported.
    pub fn handle_control_response(
        &mut self,
        command: CommandId,
        result: Result<ControlAnswer, String>,
        now: Timestamp,
    ) {
        // Only the execution running now listens to control answers: a late
        // answer from an earlier attempt at the same command (say, before a
        // claim that got no answer) must not cancel a run that has not started.
        if self.awaiting != Awaiting::Execution(command) {
            return;
        }
        if self
            .current
            .as_ref()
            .is_none_or(|c| c.job.command.id != command)
        {
            return;
        }
        match &result {
            Ok(_) => self.server_answered(now),
            Err(reason) => self.server_silent(reason, now),
        }
        let Some(current) = self
            .current
            .as_mut()
            .filter(|c| c.job.command.id == command)
        else {
            return;
        };
        current.control_in_flight = false;
        if current.report.is_some() {
            return;
        }
        let waiting = current.approval_until.is_some();
        match result {
            Ok(answer) if waiting && answer.status.is_terminal() => {
                // Closed while it waited for approval: nothing ran, nothing to report.
                self.actions.push_back(Action::WithdrawApproval { command });
                self.events.push_back(RelayEvent::ClosedByServer {
                    command,
                    status: answer.status,
                });
                self.current = None;
                self.awaiting = Awaiting::Nothing;
            }
            Ok(answer) if waiting && answer.cancel_requested => {
                self.actions.push_back(Action::WithdrawApproval { command });
                self.events.push_back(RelayEvent::CancelSent { command });
                current.cancel_sent = true;
                self.finish_unstarted(
                    command,
                    FinishStatus::Cancelled,
                    "Cancelled by the agent while the run waited for the owner's approval; the Graph did not run.".to_owned(),
                    now,
                );
                return;
            }
            Ok(answer) if answer.status.is_terminal() => {
                current.next_control_at = None;
                if current.closed_by_server.is_none() {
                    current.closed_by_server = Some(answer.status);
                    current.progress.pending = None;
                    self.events.push_back(RelayEvent::ClosedByServer {
                        command,
                        status: answer.status,
                    });
                    if !current.cancel_sent {
                        current.cancel_sent = true;
                        self.actions.push_back(Action::CancelExecution { command });
                    }
                }
            }
            Ok(answer) if answer.cancel_requested => {
                if !current.cancel_sent {
                    current.cancel_sent = true;
                    self.actions.push_back(Action::CancelExecution { command });
                    self.events.push_back(RelayEvent::CancelSent { command });
                }
                current.next_control_at = None;
            }
            Ok(_) => {
                current.next_control_at = Some(match self.config.mode {
                    RelayMode::Interval => now.plus(self.config.control_interval),
                    RelayMode::LongPoll => now,
                });
            }
            Err(reason) => {
                current.next_control_at = Some(now.plus(self.config.control_interval));
                self.events
                    .push_back(RelayEvent::ControlFailed { command, reason });
            }
        }
        self.maybe_send_control(now);
        self.drive(now);
    }

    /// The executor finished the job (whatever the reason).
    pub fn handle_execution_finished(
        &mut self,
        command: CommandId,
        outcome: ExecutionOutcome,
        now: Timestamp,
    ) {
        if self.awaiting != Awaiting::Execution(command) {
            return;
        }
        let Some(current) = self.current.as_mut() else {
            return;
        };
        current.progress.pending = None;
        if current.closed_by_server.is_some() {
            // The server closed the run: it would refuse this report for good.
            self.events.push_back(RelayEvent::Abandoned { command });
            self.current = None;
            self.awaiting = Awaiting::Nothing;
            self.drive(now);
            return;
        }
        // Once the relay has asked the engine to stop, the run is recorded as
        // cancelled even if the Graph finished between the flag and the stop.
        let status = if current.cancel_sent {
            FinishStatus::Cancelled
        } else {
            outcome.status.unwrap_or(FinishStatus::Completed)
        };
        let error = if current.cancelled_locally {
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
        self.record_completion(command, status, body, now);
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
    pub fn handle_local_cancel(&mut self, command: CommandId, now: Timestamp) -> bool {
        if self.awaiting != Awaiting::Execution(command) {
            return false;
        }
        let Some(current) = self.current.as_mut().filter(|c| {
            c.job.command.id == command
                && c.report.is_none()
                && c.closed_by_server.is_none()
                && !c.cancel_sent
        }) else {
            return false;
        };
        if current.approval_until.is_some() {
            current.cancel_sent = true;
            current.cancelled_locally = true;
            self.actions.push_back(Action::WithdrawApproval { command });
            self.events
                .push_back(RelayEvent::CancelledOnTheDesktop { command });
            self.finish_unstarted(
                command,
                FinishStatus::Cancelled,
                format!(
                    "{CANCELLED_ON_THE_DESKTOP} while the run waited for approval; the Graph did not run."
                ),
                now,
            );
            return true;
        }
        if !current.executing {
            return false;
        }
        current.cancel_sent = true;
        current.cancelled_locally = true;
        current.progress.pending = None;
        self.actions.push_back(Action::CancelExecution { command });
        self.events
            .push_back(RelayEvent::CancelledOnTheDesktop { command });
        self.drive(now);
        true
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
        if self.awaiting != Awaiting::Execution(command) {
            return;
        }
        let Some(current) = self.current.as_mut().filter(|c| {
            c.job.command.id == command
                && c.approval_until.is_some()
                && c.report.is_none()
                && c.closed_by_server.is_none()
        }) else {
            return;
        };
        current.approval_until = None;
        match decision {
            ApprovalDecision::Approved => {
                self.events.push_back(RelayEvent::Approved { command });
                // The consent re-check, right before the start.
                if let Some(current) = self.current.take_if(|c| {
                    !self.shared.still_shared(
                        &c.job.command.project,
                        &c.job.command.graph_session_id,
                        &c.job.command.slug,
                    )
                }) {
                    self.close_withdrawn(current, now);
                    self.drive(now);
                    return;
                }
                if let Some(current) = self.current.as_mut() {
                    // Replaces "waiting for approval" once the Graph starts.
                    current.progress.pending = Some(ProgressReport {
                        message: Some(APPROVED_ON_THE_DESKTOP.to_owned()),
                        percent: None,
                    });
                    // The wait may have been long: the server may have closed
                    // the run meanwhile (its lease lapsed while the desktop was
                    // unreachable). Claiming it again under the same execution
                    // confirms it is still ours (and renews its lease) before
                    // anything runs.
                    current.approved = true;
                    current.next_control_at = None;
                    // A control answer in flight is ignored while the claim
                    // is; polling starts afresh with the execution.
                    current.control_in_flight = false;
                    self.awaiting = Awaiting::Claim(command);
                    self.actions.push_back(Action::Claim {
                        command,
                        execution: current.job.execution.clone(),
                    });
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
                self.finish_unstarted(command, FinishStatus::Failed, error, now);
            }
        }
    }

    /// The relay is to stop (the driver's shutdown signal). From now on
    /// nothing is synced, claimed, polled for control or posted as progress:
    /// - a held sync is aborted ([`Action::AbortHeldSync`]);
    /// - a run waiting for approval is given up: the prompt is withdrawn
    ///   and the run ends `failed` with [`WORKER_STOPPED_BEFORE_APPROVAL`];
    /// - a run that executes is stopped ([`Action::CancelExecution`]; the
    ///   executor applies its grace) and reported as it ends;
    /// - a claim the server grants now never starts: the run ends `failed`
    ///   with [`WORKER_STOPPED_BEFORE_START`];
    /// - then every report in the outbox gets one last delivery attempt,
    ///   after which [`Relay::is_stopped`] is true.
    ///
    /// What is still in flight after [`RelayConfig::shutdown_timeout`] is
    /// given up (the outbox keeps what was stored). Calling it again does
    /// nothing.
    pub fn handle_shutdown(&mut self, now: Timestamp) {
        if self.stopping() {
            return;
        }
        self.stop = Some(Stop {
            deadline: now.plus(self.config.shutdown_timeout),
            flushing: false,
            delivered: 0,
            kept: 0,
            done: false,
        });
        self.events.push_back(RelayEvent::Stopping {
            running: self.current_command(),
        });
        self.commands.clear();
        self.projects.clear();
        self.unconfirmed = None;
        if matches!(self.awaiting, Awaiting::Sync { .. }) {
            self.actions.push_back(Action::AbortHeldSync);
        }
        if let (Some(c), Awaiting::Execution(command)) = (&self.current, &self.awaiting) {
            let command = *command;
            if c.approval_until.is_some() {
                self.actions.push_back(Action::WithdrawApproval { command });
                let error = format!("{WORKER_STOPPED_BEFORE_APPROVAL}; the Graph did not run.");
                self.finish_unstarted(command, FinishStatus::Failed, error, now);
            } else if c.executing && !c.cancel_sent {
                self.actions.push_back(Action::CancelExecution { command });
            }
        }
        if let Some(current) = self.current.as_mut() {
            current.progress.pending = None;
        }
        self.drive(now);
    }

    /// Shutdown's last steps, once nothing else is awaited: load the outbox,
    /// post each report once, then stop.
    fn drive_stop(&mut self) {
        let Some(stop) = self.stop.as_mut() else {
            return;
        };
        if stop.done || self.awaiting != Awaiting::Nothing {
            return;
        }
        if self.current.is_some() {
            // The run still executes (or waits for its cancel to land).
            return;
        }
        if !stop.flushing {
            stop.flushing = true;
            self.retry_queue.clear();
            self.awaiting = Awaiting::OutboxLoad;
            self.actions.push_back(Action::LoadOutbox);
            return;
        }
        if let Some(item) = self.retry_queue.pop_front() {
            self.awaiting = Awaiting::OutboxPost(item.command);
            self.actions.push_back(Action::PostReport(item));
            return;
        }
        stop.done = true;
        let (delivered, kept) = (stop.delivered, stop.kept);
        self.in_pass = false;
        self.events
            .push_back(RelayEvent::Stopped { delivered, kept });
    }

    /// The outbox write asked by [`Action::StoreReport`] finished. The report
    /// is posted either way: a failed write must not also lose the result.
    pub fn handle_report_stored(&mut self, command: CommandId, now: Timestamp) {
        if self.awaiting != Awaiting::Store(command) {
            return;
        }
        let item = self
            .current
            .as_ref()
            .and_then(|c| c.report.clone())
            .or_else(|| self.declined_item(command, now));
        if let Some(item) = item {
            self.awaiting = Awaiting::Post(command);
            self.actions.push_back(Action::PostReport(item));
        } else {
            self.awaiting = Awaiting::Nothing;
        }
        self.drive(now);
    }

    /// The answer to [`Action::PostReport`].
    pub fn handle_report_posted(
        &mut self,
        command: CommandId,
        outcome: PostOutcome,
        now: Timestamp,
    ) {
        match &self.awaiting {
            Awaiting::Post(c) | Awaiting::OutboxPost(c) if *c == command => {}
            _ => return,
        }
        let from_pass_start = matches!(self.awaiting, Awaiting::OutboxPost(_));
        self.awaiting = Awaiting::Nothing;
        if let Some(stop) = self.stop.as_mut().filter(|s| s.flushing) {
            match outcome {
                PostOutcome::Retry(_) => stop.kept += 1,
                PostOutcome::Acknowledged | PostOutcome::Rejected(_) => stop.delivered += 1,
            }
        }
        match outcome {
            PostOutcome::Acknowledged => {
                self.events.push_back(RelayEvent::Delivered { command });
                self.actions.push_back(Action::RemoveReport(command));
            }
            PostOutcome::Rejected(reason) => {
                self.events
                    .push_back(RelayEvent::Dropped { command, reason });
                self.actions.push_back(Action::RemoveReport(command));
            }
            PostOutcome::Retry(reason) => {
                self.events
                    .push_back(RelayEvent::DeliveryFailed { command, reason });
                self.actions.push_back(Action::RecordAttempt(command));
                if from_pass_start {
                    self.outbox_clear = false;
                }
            }
        }
        if !from_pass_start {
            self.current = None;
        }
        self.drive(now);
    }

    /// The executor reports the progress of `command`'s execution
    /// `execution`. Kept as the run's latest report and posted at once, or
    /// when [`RelayConfig::progress_interval`] has passed since the last post
    /// and that post was answered. A report of an execution that is not
    /// running (it ended, or the server closed it) is dropped. An invalid
    /// report is refused and changes nothing.
    pub fn handle_progress(
        &mut self,
        command: CommandId,
        execution: &ExecutionId,
        report: ProgressReport,
        now: Timestamp,
    ) -> Result<(), InvalidProgress> {
        report.check()?;
        if let Some(current) = self.current.as_mut().filter(|c| {
            c.job.command.id == command && c.job.execution == *execution && c.takes_progress()
        }) {
            current.progress.pending = Some(report);
            self.maybe_send_progress(now);
        }
        Ok(())
    }

    /// The answer to [`Action::PostProgress`]. A final refusal (the run is
    /// no longer running under this execution) stops progress for the run;
    /// any other failure only loses that report.
    pub fn handle_progress_posted(
        &mut self,
        command: CommandId,
        outcome: PostOutcome,
        now: Timestamp,
    ) {
        let Some(current) = self
            .current
            .as_mut()
            .filter(|c| c.job.command.id == command && c.progress.in_flight)
        else {
            return;
        };
        current.progress.in_flight = false;
        match outcome {
            PostOutcome::Acknowledged => {
                self.events
                    .push_back(RelayEvent::ProgressPosted { command });
            }
            PostOutcome::Rejected(reason) => {
                current.progress.refused = true;
                current.progress.pending = None;
                self.events
                    .push_back(RelayEvent::ProgressRefused { command, reason });
            }
            PostOutcome::Retry(_) => {}
        }
        self.maybe_send_progress(now);
    }

    // ----- the pass ---------------------------------------------------------

    /// Starts the claimed command's execution (its approval, if it needed
    /// one, was given, and the re-check holds).
    fn start_execution(&mut self, command: CommandId, now: Timestamp) {
        let interval = self.config.control_interval;
        let mode = self.config.mode;
        let Some(current) = self.current.as_mut() else {
            return;
        };
        let job = current.job.clone();
        self.events.push_back(RelayEvent::Started {
            command,
            execution: job.execution.clone(),
        });
        self.actions.push_back(Action::Execute(job));
        current.executing = true;
        self.awaiting = Awaiting::Execution(command);
        current.next_control_at = Some(match mode {
            RelayMode::Interval => now.plus(interval),
            RelayMode::LongPoll => now,
        });
    }

    /// Asks the owner to approve the claimed command, for at most `wait`;
    /// meanwhile its progress says so and control is polled as for a run.
    fn ask_approval(&mut self, command: CommandId, wait: Duration, now: Timestamp) {
        let interval = self.config.control_interval;
        let mode = self.config.mode;
        let Some(current) = self.current.as_mut() else {
            return;
        };
        let until = now.plus(wait);
        current.approval_until = Some(until);
        current.approval_wait = wait;
        current.progress.pending = Some(ProgressReport {
            message: Some(WAITING_FOR_APPROVAL.to_owned()),
            percent: None,
        });
        self.awaiting = Awaiting::Execution(command);
        current.next_control_at = Some(match mode {
            RelayMode::Interval => now.plus(interval),
            RelayMode::LongPoll => now,
        });
        self.events
            .push_back(RelayEvent::ApprovalRequested { command, until });
        self.actions.push_back(Action::AskApproval {
            job: current.job.clone(),
            until,
        });
    }

    /// Ends a claimed run that never executed (declined, not approved in
    /// time, cancelled while waiting): its completion goes through the outbox.
    fn finish_unstarted(
        &mut self,
        command: CommandId,
        status: FinishStatus,
        error: String,
        now: Timestamp,
    ) {
        if let Some(current) = self.current.as_mut() {
            current.approval_until = None;
        }
        let body = EnvelopeBody {
            error: Some(error),
            ..EnvelopeBody::default()
        };
        self.record_completion(command, status, body, now);
    }

    /// Stores the current run's completion, then posts it.
    fn record_completion(
        &mut self,
        command: CommandId,
        status: FinishStatus,
        body: EnvelopeBody,
        now: Timestamp,
    ) {
        let Some(current) = self.current.as_mut() else {
            return;
        };
        current.progress.pending = None;
        let envelope = ResultEnvelope::build(current.job.execution.clone(), status, body);
        self.events.push_back(RelayEvent::Finished {
            command,
            status,
            truncated: envelope.is_truncated(),
        });
        let item = OutboxItem {
            command,
            report: RelayReport::Completion { envelope },
            stored_at: now,
            attempts: 0,
        };
        current.report = Some(item.clone());
        current.next_control_at = None;
        current.executing = false;
        self.awaiting = Awaiting::Store(command);
        self.actions.push_back(Action::StoreReport(item));
        self.drive(now);
    }

    /// Posts the current run's pending progress if its interval has passed
    /// and no post is in flight.
    fn maybe_send_progress(&mut self, now: Timestamp) {
        if self.stopping() {
            return;
        }
        let interval = self.config.progress_interval;
        let Some(current) = self.current.as_mut() else {
            return;
        };
        if !current.takes_progress()
            || current.progress.in_flight
            || current
                .progress
                .last_post
                .is_some_and(|t| now < t.plus(interval))
        {
            return;
        }
        let Some(report) = current.progress.pending.take() else {
            return;
        };
        current.progress.in_flight = true;
        current.progress.last_post = Some(now);
        self.actions.push_back(Action::PostProgress {
            command: current.job.command.id,
            execution: current.job.execution.clone(),
            report,
        });
    }

    fn declined_item(&self, command: CommandId, now: Timestamp) -> Option<OutboxItem> {
        Some(OutboxItem {
            command,
            report: RelayReport::Declined,
            stored_at: now,
            attempts: 0,
        })
    }

    fn next_random(&mut self) -> u64 {
        self.rng = splitmix64(self.rng);
        self.rng
    }

    fn backoff(&mut self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(16);
        let base = self
            .config
            .backoff_min
            .saturating_mul(1u32 << exp)
            .min(self.config.backoff_max);
        // Equal jitter: between half and the whole back-off, so that
        // desktops that lost the same server come back spread over half of
        // it, and none of them retries sooner than half of it.
        let half = base / 2;
        let span = u64::try_from(half.as_millis()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_millis(self.next_random() % span)
    }

    fn maybe_send_control(&mut self, now: Timestamp) {
        if self.stopping() {
            return;
        }
        let long_poll = self.config.mode == RelayMode::LongPoll;
        let Awaiting::Execution(_) = self.awaiting else {
            return;
        };
        let Some(current) = self.current.as_mut() else {
            return;
        };
        if current.cancel_sent || current.control_in_flight || current.report.is_some() {
            return;
        }
        if current.next_control_at.is_some_and(|t| t <= now) {
            current.control_in_flight = true;
            current.next_control_at = None;
            self.actions.push_back(Action::Control {
                command: current.job.command.id,
                long_poll,
            });
        }
    }

    fn should_start_pass(&self, now: Timestamp) -> bool {
        match self.config.mode {
            RelayMode::Interval => self.pass_requested || now >= self.next_tick,
            RelayMode::LongPoll => self.wake_at.is_some_and(|t| now >= t),
        }
    }

    fn start_pass(&mut self, now: Timestamp) {
        self.in_pass = true;
        self.pass_requested = false;
        self.wake_at = None;
        if self.config.mode == RelayMode::Interval {
            // Ticks keep their phase; ticks missed while busy are skipped.
            let interval = self.config.pass_interval.as_millis().max(1) as u64;
            while self.next_tick <= now {
                self.next_tick = Timestamp(self.next_tick.as_millis() + interval);
            }
        }
        self.work_in_pass = 0;
        self.held_done = false;
        // The enabled projects, then the remembered ones no longer enabled
        // (synced with an empty list, which ends their shares on the server).
        self.projects = self.shared.projects().cloned().collect();
        let retired: Vec<ProjectId> = self
            .synced
            .iter()
            .filter(|p| !self.is_enabled(p))
            .cloned()
            .collect();
        self.projects.extend(retired);
        self.events.push_back(RelayEvent::PassStarted);
        self.awaiting = Awaiting::OutboxLoad;
        self.actions.push_back(Action::LoadOutbox);
    }

    fn end_pass(&mut self, now: Timestamp) {
        self.in_pass = false;
        if self.config.mode == RelayMode::Interval {
            // Ticks that fell while the pass was busy were skipped.
            let interval = self.config.pass_interval.as_millis().max(1) as u64;
            while self.next_tick < now {
                self.next_tick = Timestamp(self.next_tick.as_millis() + interval);
            }
        }
        let next = match self.config.mode {
            RelayMode::Interval => Some(self.next_tick),
            RelayMode::LongPoll => {
                if self.failures > 0 {
                    Some(now.plus(self.backoff()))
                } else if self.shared.projects().next().is_none() && !self.has_retired() {
                    // Nothing enabled: wait for a change, but look again now and then.
                    Some(now.plus(self.config.pass_interval))
                } else {
                    Some(now)
                }
            }
        };
        if self.config.mode == RelayMode::LongPoll {
            self.wake_at = next;
        }
        self.events.push_back(RelayEvent::PassFinished { next });
    }

    /// Moves the pass forward until it must wait for an answer.
    fn drive(&mut self, now: Timestamp) {
        if self.stopping() {
            self.drive_stop();
            return;
        }
        loop {
            if self.awaiting != Awaiting::Nothing {
                return;
            }
            if !self.in_pass {
                if self.should_start_pass(now) {
                    self.start_pass(now);
                    continue;
                }
                return;
            }
            // 1. Re-send what the outbox still holds.
            if let Some(item) = self.retry_queue.pop_front() {
                self.awaiting = Awaiting::OutboxPost(item.command);
                self.actions.push_back(Action::PostReport(item));
                return;
            }
            // 2. A claim whose answer was lost, first and under the same execution id.
            if let Some((command, execution, approved)) = self.unconfirmed.take() {
                let id = command.id;
                let mut current = Current::new(command, execution.clone());
                current.approved = approved;
                if self.shared.still_shared(
                    &current.job.command.project,
                    &current.job.command.graph_session_id,
                    &current.job.command.slug,
                ) {
                    self.current = Some(current);
                    self.awaiting = Awaiting::Claim(id);
                    self.actions.push_back(Action::Claim {
                        command: id,
                        execution,
                    });
                } else {
                    // Consent was withdrawn meanwhile. If the lost claim did reach
                    // the server, that execution is closed as cancelled; if it did
                    // not, the server refuses this report and the command comes back
                    // queued on a sync, where the re-check declines it.
                    self.close_withdrawn(current, now);
                }
                return;
            }
            // 3. The commands of the last sync, one at a time, re-checked first.
            if let Some(command) = self.commands.pop_front() {
                let id = command.id;
                if !self.shared.still_shared(
                    &command.project,
                    &command.graph_session_id,
                    &command.slug,
                ) {
                    self.events.push_back(RelayEvent::Declined { command: id });
                    self.current = None;
                    let item = OutboxItem {
                        command: id,
                        report: RelayReport::Declined,
                        stored_at: now,
                        attempts: 0,
                    };
                    self.awaiting = Awaiting::Store(id);
                    self.actions.push_back(Action::StoreReport(item));
                    return;
                }
                let execution = self.new_execution_id(&id);
                self.current = Some(Current::new(command, execution.clone()));
                self.awaiting = Awaiting::Claim(id);
                self.actions.push_back(Action::Claim {
                    command: id,
                    execution,
                });
                return;
            }
            // 4. The next project's sync.
            if let Some(project) = self.projects.pop_front() {
                self.send_sync(project, false);
                return;
            }
            // 5. Long-poll: a pass that found nothing waits in one held sync.
            let wait_here = self.config.mode == RelayMode::LongPoll
                && self.work_in_pass == 0
                && !self.held_done
                && self.failures == 0;
            let first_project = self.shared.projects().next().cloned();
            if let (true, Some(project)) = (wait_here, first_project) {
                self.held_done = true;
                self.send_sync(project, true);
                return;
            }
            self.end_pass(now);
        }
    }

    /// Closes a command claimed (or possibly claimed) under `current`'s
    /// execution whose consent re-check now fails: it never runs, and a
    /// cancelled completion with the re-check's message goes through the outbox.
    fn close_withdrawn(&mut self, mut current: Current, now: Timestamp) {
        let id = current.job.command.id;
        self.events.push_back(RelayEvent::Declined { command: id });
        let envelope = ResultEnvelope::build(
            current.job.execution.clone(),
            FinishStatus::Cancelled,
            EnvelopeBody {
                error: Some(crate::command::NO_LONGER_SHARED.to_owned()),
                ..EnvelopeBody::default()
            },
        );
        let item = OutboxItem {
            command: id,
            report: RelayReport::Completion { envelope },
            stored_at: now,
            attempts: 0,
        };
        current.report = Some(item.clone());
        self.current = Some(current);
        self.awaiting = Awaiting::Store(id);
        self.actions.push_back(Action::StoreReport(item));
    }

    /// Syncs `project` with its shared sessions (none if it is no longer
    /// enabled); `held` asks the server to hold the request until work
    /// arrives. An enabled project is remembered before its first sync.
    fn send_sync(&mut self, project: ProjectId, held: bool) {
        if self.is_enabled(&project) && self.synced.insert(project.clone()) {
            self.actions
                .push_back(Action::RememberProject(project.clone()));
        }
        let sessions = self.shared.sessions(&project);
        let running = self.executing();
        // A restart is announced only once the outbox is empty, so that a
        // result recorded before the crash reaches the server first.
        let announced = self.restarted && self.outbox_clear;
        self.awaiting = Awaiting::Sync {
            project: project.clone(),
            held,
            announced,
            empty: sessions.is_empty(),
        };
        self.actions.push_back(Action::Sync {
            project,
            sessions,
            long_poll: held,
            restarted: announced,
            running,
        });
    }

    /// The command claimed and not finished: waiting for approval, or executing.
    fn executing(&self) -> Option<CommandId> {
        self.current
            .as_ref()
            .filter(|c| c.claimed_and_open())
            .map(|c| c.job.command.id)
    }

    fn is_enabled(&self, project: &ProjectId) -> bool {
        self.shared.is_enabled(project)
    }

    /// True when a remembered project is no longer enabled (its shares on
    /// the server still need to be emptied).
    fn has_retired(&self) -> bool {
        self.synced.iter().any(|p| !self.is_enabled(p))
    }

    fn new_execution_id(&mut self, command: &CommandId) -> ExecutionId {
        let salt = self.next_random();
        let text = format!("exec-{}-{:08x}", command.as_uuid().simple(), salt as u32);
        ExecutionId::parse(&text)
            .unwrap_or_else(|_| unreachable!("hex and dashes form a valid execution id"))
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
