//! The state machine itself: [`Relay`], what its pass waits for, and the
//! inputs that are not about the current run (that is [`super::run`]; the
//! pass's order is [`super::pass`]).

use std::collections::{BTreeSet, VecDeque};

use crate::envelope::FinishStatus;
use crate::ids::{CommandId, ProjectId};
use crate::outbox::OutboxItem;
use crate::time::Timestamp;

use super::pass::{OutboxState, Pass, Schedule, UnconfirmedClaim, declined_item};
use super::reachability::Reachability;
use super::run::{Phase, Run};
use super::*;

/// What the pass is waiting for. At most one request of the pass is
/// outstanding; the current run, from its claim to its acknowledged report,
/// is one of them, so there is a current run exactly when the pass waits
/// for it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Awaiting {
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
    /// The current run (boxed: it is far larger than the other requests).
    Run(Box<Run>),
    /// The report of a command the re-check declined is being stored.
    StoreDeclined(CommandId),
    /// The report of a command the re-check declined is being posted.
    PostDeclined(CommandId),
}

/// Whether the server answers, and how long to back off when it does not.
#[derive(Debug, Default)]
pub(super) struct Link {
    /// Passes that failed in a row (the back-off grows with them).
    pub(super) failures: u32,
    /// Whether the server answers, and when that is worth saying.
    pub(super) reach: Reachability,
}

/// The relay state machine. See the module docs for the call order.
#[derive(Debug)]
pub struct Relay {
    pub(super) config: RelayConfig,
    pub(super) shared: SharedSet,
    pub(super) schedule: Schedule,
    pub(super) pass: Pass,
    pub(super) awaiting: Awaiting,
    pub(super) outbox: OutboxState,
    pub(super) unconfirmed: Option<UnconfirmedClaim>,
    /// Until one sync announcing it succeeded: this process has just started.
    pub(super) restarted: bool,
    /// Projects the server may hold shares of this relay in (remembered
    /// before their first sync; forgotten after an empty sync succeeded).
    pub(super) synced: BTreeSet<ProjectId>,
    pub(super) link: Link,
    pub(super) rng: u64,
    /// Set by [`Relay::handle_shutdown`].
    pub(super) stop: Option<Stop>,
    pub(super) actions: VecDeque<Action>,
    pub(super) events: VecDeque<RelayEvent>,
}

/// How far shutdown got.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stop {
    /// The running command is given up then.
    deadline: Timestamp,
    phase: StopPhase,
}

/// Shutdown's steps.
#[derive(Debug, Clone, PartialEq)]
enum StopPhase {
    /// The current run (or the request in flight) ends first.
    Draining,
    /// The last delivery attempt of the outbox began.
    Flushing { delivered: usize, kept: usize },
    /// Everything is done: the driver may return.
    Done,
}

impl Relay {
    /// A relay whose first pass is due at `first_pass` (interval mode keeps
    /// that phase for every later tick; long-poll mode starts then).
    pub fn new(config: RelayConfig, shared: SharedSet, first_pass: Timestamp) -> Self {
        let rng = config.seed;
        Self {
            config,
            shared,
            schedule: Schedule {
                next_tick: first_pass,
                wake_at: Some(first_pass),
                requested: false,
            },
            pass: Pass::default(),
            awaiting: Awaiting::Nothing,
            outbox: OutboxState::default(),
            unconfirmed: None,
            restarted: true,
            synced: BTreeSet::new(),
            link: Link::default(),
            rng,
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
        self.awaiting.run().map(Run::id)
    }

    /// True while a pass is in progress.
    pub fn is_busy(&self) -> bool {
        self.pass.active
    }

    /// True once shutdown finished: the running command ended and was
    /// reported (or was given up after [`RelayConfig::shutdown_timeout`]),
    /// and the outbox had its last delivery attempt. The driver may return.
    pub fn is_stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.phase == StopPhase::Done)
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// The next thing to do, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next status line, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<RelayEvent> {
        self.events.pop_front()
    }

    /// When [`Relay::handle_timeout`] must be called next, if a timer is armed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let mut deadline: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        if let Some(stop) = &self.stop {
            if stop.phase == StopPhase::Draining {
                consider(stop.deadline);
            }
            return deadline;
        }
        if !self.pass.active {
            match self.config.mode {
                RelayMode::Interval => consider(self.schedule.next_tick),
                RelayMode::LongPoll => {
                    if let Some(t) = self.schedule.wake_at {
                        consider(t);
                    }
                }
            }
        }
        let Some(run) = self.awaiting.run() else {
            return deadline;
        };
        if let Some(control) = run.control()
            && let (Some(t), false) = (control.next_at, control.in_flight)
        {
            consider(t);
        }
        if let Phase::AwaitingApproval { until, .. } = run.phase {
            consider(until);
        }
        if run.takes_progress()
            && run.progress.pending.is_some()
            && !run.progress.in_flight
            && let Some(last) = run.progress.last_post
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
            if stop.phase == StopPhase::Draining && now >= stop.deadline {
                // Give up on what is still in flight; the outbox keeps any
                // stored report for the last delivery attempt.
                if let Awaiting::Run(run) = &self.awaiting {
                    self.events
                        .push_back(RelayEvent::GaveUpWaiting { command: run.id() });
                }
                self.awaiting = Awaiting::Nothing;
                self.drive(now);
            }
            return;
        }
        if let Some(Run {
            job,
            phase: Phase::AwaitingApproval { until, wait, .. },
            ..
        }) = self.awaiting.run()
            && *until <= now
        {
            let command = job.command.id;
            let waited = wait.as_secs();
            self.actions.push_back(Action::WithdrawApproval { command });
            self.events
                .push_back(RelayEvent::ApprovalTimedOut { command });
            let error = format!(
                "{NOT_APPROVED_IN_TIME}: nobody approved the run on the owner's desktop within {waited} s, so the Graph did not run."
            );
            self.finish_unstarted(FinishStatus::Failed, error, now);
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
                if !self.pass.active {
                    self.schedule.requested = true;
                }
            }
            RelayMode::LongPoll => {
                if matches!(self.awaiting, Awaiting::Sync { held: true, .. }) {
                    self.actions.push_back(Action::AbortHeldSync);
                } else if !self.pass.active {
                    self.schedule.wake_at = Some(now);
                }
            }
        }
        self.drive(now);
    }

    /// The outbox's pending items, as asked by [`Action::LoadOutbox`].
    pub fn handle_outbox_loaded(&mut self, items: Vec<OutboxItem>, now: Timestamp) {
        if self.awaiting == Awaiting::OutboxLoad {
            self.awaiting = Awaiting::Nothing;
            self.outbox.retry = items.into();
            self.outbox.clear = true;
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
            self.pass.held_done = true;
        }
        match &result {
            Ok(_) | Err(SyncFailure::Refused(_)) => self.server_answered(now),
            Err(SyncFailure::Network(reason)) => self.server_silent(reason, now),
            Err(SyncFailure::Aborted) => {}
        }
        match result {
            Ok(commands) => {
                self.link.failures = 0;
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
                self.pass.work += commands.len();
                // Only this project's commands; anything else is ignored.
                self.pass
                    .commands
                    .extend(commands.into_iter().filter(|c| c.project == project));
            }
            Err(SyncFailure::Aborted) => {
                self.pass.held_done = true;
            }
            Err(SyncFailure::Network(reason)) => self.sync_failed(project, reason, true),
            Err(SyncFailure::Refused(reason)) => self.sync_failed(project, reason, false),
        }
        self.drive(now);
    }

    /// A sync, claim or control request got an answer.
    pub(super) fn server_answered(&mut self, now: Timestamp) {
        self.events.extend(self.link.reach.answered(now));
    }

    /// A sync, claim or control request got no usable answer.
    pub(super) fn server_silent(&mut self, reason: &str, now: Timestamp) {
        self.events.extend(self.link.reach.no_answer(reason, now));
    }

    /// A sync brought nothing: the pass ends here, and the next one retries.
    fn sync_failed(&mut self, project: ProjectId, reason: String, unreachable: bool) {
        self.events.push_back(RelayEvent::SyncFailed {
            project,
            reason,
            unreachable,
        });
        self.link.failures = self.link.failures.saturating_add(1);
        self.pass.projects.clear();
        self.pass.held_done = true;
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
            phase: StopPhase::Draining,
        });
        self.events.push_back(RelayEvent::Stopping {
            running: self.current_command(),
        });
        self.pass.commands.clear();
        self.pass.projects.clear();
        self.unconfirmed = None;
        if matches!(self.awaiting, Awaiting::Sync { .. }) {
            self.actions.push_back(Action::AbortHeldSync);
        }
        if let Some(run) = self.awaiting.run() {
            let command = run.id();
            match run.phase {
                Phase::AwaitingApproval { .. } => {
                    self.actions.push_back(Action::WithdrawApproval { command });
                    let error = format!("{WORKER_STOPPED_BEFORE_APPROVAL}; the Graph did not run.");
                    self.finish_unstarted(FinishStatus::Failed, error, now);
                }
                // The executor applies its grace; a later cancel from the
                // agent is still said (and the run is then reported cancelled).
                Phase::Executing { cancel: None, .. } => {
                    self.actions.push_back(Action::CancelExecution { command });
                }
                _ => {}
            }
        }
        if let Some(run) = self.awaiting.run_mut() {
            run.progress.pending = None;
        }
        self.drive(now);
    }

    /// Shutdown's last steps, once nothing else is awaited: load the outbox,
    /// post each report once, then stop.
    pub(super) fn drive_stop(&mut self) {
        let Some(stop) = self.stop.as_mut() else {
            return;
        };
        // While a run is current the pass awaits it: it still executes (or
        // waits for its cancel to land), or its report is on its way.
        if !matches!(self.awaiting, Awaiting::Nothing) {
            return;
        }
        match stop.phase {
            StopPhase::Done => {}
            StopPhase::Draining => {
                stop.phase = StopPhase::Flushing {
                    delivered: 0,
                    kept: 0,
                };
                self.outbox.retry.clear();
                self.awaiting = Awaiting::OutboxLoad;
                self.actions.push_back(Action::LoadOutbox);
            }
            StopPhase::Flushing { delivered, kept } => {
                if let Some(item) = self.outbox.retry.pop_front() {
                    self.awaiting = Awaiting::OutboxPost(item.command);
                    self.actions.push_back(Action::PostReport(item));
                    return;
                }
                stop.phase = StopPhase::Done;
                self.pass.active = false;
                self.events
                    .push_back(RelayEvent::Stopped { delivered, kept });
            }
        }
    }

    /// The outbox write asked by [`Action::StoreReport`] finished. The report
    /// is posted either way: a failed write must not also lose the result.
    pub fn handle_report_stored(&mut self, command: CommandId, now: Timestamp) {
        match &mut self.awaiting {
            Awaiting::Run(run) if run.id() == command && matches!(run.phase, Phase::Storing(_)) => {
                let Phase::Storing(item) = std::mem::replace(&mut run.phase, Phase::Posting) else {
                    unreachable!("matched just above");
                };
                self.actions.push_back(Action::PostReport(item));
            }
            Awaiting::StoreDeclined(c) if *c == command => {
                self.awaiting = Awaiting::PostDeclined(command);
                self.actions
                    .push_back(Action::PostReport(declined_item(command, now)));
            }
            _ => return,
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
        let from_pass_start = match &self.awaiting {
            Awaiting::OutboxPost(c) if *c == command => true,
            Awaiting::PostDeclined(c) if *c == command => false,
            Awaiting::Run(run) if run.id() == command && run.phase == Phase::Posting => false,
            _ => return,
        };
        // Ends the current run too, if this was its report.
        self.awaiting = Awaiting::Nothing;
        if let Some(Stop {
            phase: StopPhase::Flushing { delivered, kept },
            ..
        }) = self.stop.as_mut()
        {
            match outcome {
                PostOutcome::Retry(_) => *kept += 1,
                PostOutcome::Acknowledged | PostOutcome::Rejected(_) => *delivered += 1,
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
                    self.outbox.clear = false;
                }
            }
        }
        self.drive(now);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
