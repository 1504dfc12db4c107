//! The desktop relay as a sans-IO state machine (SPEC §6).
//!
//! [`Relay`] decides everything the desktop half does: when a pass runs,
//! which project to sync, the re-check before running, one command at a
//! time, the control poll, the single cancel, and that every report goes
//! through the outbox before it is posted. It performs nothing itself.
//!
//! # Call order (after quinn-proto's `Connection`)
//! 1. Feed inputs with the `handle_*` methods, each with `now`.
//! 2. Drain [`Relay::poll_action`] and perform every [`Action`]; report each
//!    one's outcome with the matching `handle_*` call.
//! 3. Drain [`Relay::poll_event`] for status lines (optional).
//! 4. Sleep until [`Relay::poll_timeout`] (or until an outcome arrives), then
//!    call [`Relay::handle_timeout`].
//!
//! At most one request of the pass is outstanding at a time (outbox load,
//! a report post, a sync, a claim); while a command runs, the execution and
//! its control requests proceed beside it. The HTTP driver in
//! `graph-relay-transport-http` and the simulator in `graph-relay-sim` both
//! drive this type; neither contains relay logic.
//!
//! # Modes
//! - [`RelayMode::Interval`] is the published relay: a pass every 20 s (ticks
//!   at a fixed phase; a tick that comes while a pass is busy is skipped),
//!   and a pass right after the shared set changes (if idle); a control poll
//!   every 3 s while a command runs.
//! - [`RelayMode::LongPoll`] (the default) runs passes back to back: when a
//!   pass found nothing to do, it ends with one *held* sync that the server
//!   answers as soon as work is queued for this device (or after its hold
//!   bound); control requests are held likewise and answered at once when
//!   the agent cancels. Network failures back off with jitter.
//!
//! # Restarts and withdrawn projects
//! - Until one sync succeeds, every sync of a relay made by [`Relay::new`]
//!   says so ([`Action::Sync`]'s `restarted`), with the command it executes
//!   (`running`): the server then ends at once what the device's previous
//!   process left `running`. The outbox is re-sent before the first sync of
//!   each pass, so a result recorded before a crash reaches the server first.
//! - The relay remembers every project it has synced ([`Action::RememberProject`],
//!   written before the sync is sent; hand the remembered ones back with
//!   [`Relay::remember_synced`] after a restart). A remembered project that is no
//!   longer enabled is synced with an empty list, which removes its shares on the
//!   server, until one such sync succeeded; then it is forgotten
//!   ([`Action::ForgetProject`]). Commands such a sync hands out fail the re-check.
//!
//! # Refusals
//! Whether a refused request is tried again is the server's word: its
//! `retryable` flag, carried by a [`Refusal`] and mapped onto [`PostOutcome`],
//! [`ClaimOutcome`] and [`SyncFailure`] in one place. Every driver (HTTP, the
//! simulator) goes through it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::ids::{CommandId, ExecutionId, GraphSessionId, ProjectId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::session::{MAX_SESSIONS_PER_SYNC, SessionMeta};
use crate::time::{Timestamp, splitmix64};

/// How the relay asks for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayMode {
    /// The published relay: a pass every `pass_interval`, control every `control_interval`.
    Interval,
    /// Held requests: work and cancellations arrive as soon as they exist.
    #[default]
    LongPoll,
}

/// Tunables of the relay. Defaults follow the published relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// Interval or long-poll.
    pub mode: RelayMode,
    /// Interval mode: time between passes (20 s).
    pub pass_interval: Duration,
    /// Interval mode: time between control polls while a command runs (3 s);
    /// long-poll mode: the pause before retrying a failed control request.
    pub control_interval: Duration,
    /// Long-poll mode: first back-off after a failed request (1 s).
    pub backoff_min: Duration,
    /// Long-poll mode: largest back-off (30 s).
    pub backoff_max: Duration,
    /// Seed of the jitter and of execution ids, for reproducible runs.
    pub seed: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            mode: RelayMode::LongPoll,
            pass_interval: Duration::from_secs(20),
            control_interval: Duration::from_secs(3),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            seed: 0x6772_6170_6872_656c,
        }
    }
}

/// The sessions the owner shared, per enabled project (the desktop's consent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedSet {
    projects: BTreeMap<ProjectId, BTreeMap<GraphSessionId, SessionMeta>>,
}

impl SharedSet {
    /// An empty set: no project enabled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Enables `project` (with no sessions yet).
    pub fn enable(&mut self, project: ProjectId) {
        self.projects.entry(project).or_default();
    }

    /// Shares `session` to `project`, enabling the project.
    pub fn share(&mut self, project: ProjectId, session: SessionMeta) {
        self.projects
            .entry(project)
            .or_default()
            .insert(session.graph_session_id.clone(), session);
    }

    /// The enabled projects, in order.
    pub fn projects(&self) -> impl Iterator<Item = &ProjectId> {
        self.projects.keys()
    }

    /// True if `project` is enabled (with or without sessions).
    pub fn is_enabled(&self, project: &ProjectId) -> bool {
        self.projects.contains_key(project)
    }

    /// The sessions shared to `project` (at most 100 are synced).
    pub fn sessions(&self, project: &ProjectId) -> Vec<SessionMeta> {
        self.projects
            .get(project)
            .map(|m| m.values().take(MAX_SESSIONS_PER_SYNC).cloned().collect())
            .unwrap_or_default()
    }

    /// The consent re-check: the project is still enabled, the session still
    /// shared to it, and its slug unchanged (an empty expected slug skips that part).
    pub fn still_shared(&self, project: &ProjectId, session: &GraphSessionId, slug: &str) -> bool {
        self.projects
            .get(project)
            .and_then(|m| m.get(session))
            .is_some_and(|meta| slug.is_empty() || &*meta.slug == slug)
    }
}

/// A command handed to the relay by a sync.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayCommand {
    /// The ticket.
    pub id: CommandId,
    /// The project it was filed under.
    pub project: ProjectId,
    /// The saved Graph to run.
    pub graph_session_id: GraphSessionId,
    /// Input for the Graph.
    pub arguments: Map<String, Value>,
    /// The session's slug when it was queued (empty if unknown).
    pub slug: String,
}

/// One run for the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The command.
    pub command: RelayCommand,
    /// The execution id the relay claimed it under.
    pub execution: ExecutionId,
    /// `graph:external:<command id>`.
    pub channel: String,
}

/// How an execution ended, as the executor reports it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExecutionOutcome {
    /// Completed, failed or cancelled; `None` means completed.
    pub status: Option<FinishStatus>,
    /// The Graph's output.
    pub result: Value,
    /// Tokens spent, if known.
    pub total_tokens: Option<u64>,
    /// Cost, if known.
    pub reported_cost: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Action {
    /// Read every pending outbox item; answer with [`Relay::handle_outbox_loaded`].
    LoadOutbox,
    /// Sync one project; answer with [`Relay::handle_sync_response`].
    Sync {
        /// The project.
        project: ProjectId,
        /// Its shared sessions (at most 100; none for a project no longer enabled).
        sessions: Vec<SessionMeta>,
        /// Ask the server to hold the request until work arrives.
        long_poll: bool,
        /// True until one sync of this relay succeeded: this process has just
        /// started, and the server may end the device's other running commands.
        restarted: bool,
        /// The command the relay executes right now, if any.
        running: Option<CommandId>,
    },
    /// Record durably that the server holds shares of this relay in the
    /// project (before its sync is sent), so that a later run of the relay
    /// still empties them once the project is no longer enabled. No answer.
    RememberProject(ProjectId),
    /// Forget the project: its empty sync succeeded, the server holds no
    /// shares of this relay there any more. No answer.
    ForgetProject(ProjectId),
    /// Abort the held sync in flight (the shared set changed); answer with
    /// [`Relay::handle_sync_response`] carrying [`SyncFailure::Aborted`].
    AbortHeldSync,
    /// Ask the server to move the command to `running` under `execution`;
    /// answer with [`Relay::handle_claim_response`].
    Claim {
        /// The command.
        command: CommandId,
        /// The execution id it will run under.
        execution: ExecutionId,
    },
    /// Start the job on the executor; report its end with [`Relay::handle_execution_finished`].
    Execute(Job),
    /// Ask whether the agent cancelled; answer with [`Relay::handle_control_response`].
    Control {
        /// The running command.
        command: CommandId,
        /// Ask the server to hold the request until cancellation (or its bound).
        long_poll: bool,
    },
    /// Ask the engine to stop the execution. Sent at most once per command.
    CancelExecution {
        /// The running command.
        command: CommandId,
    },
    /// Write the item durably; answer with [`Relay::handle_report_stored`].
    StoreReport(OutboxItem),
    /// Send the item to the server; answer with [`Relay::handle_report_posted`].
    PostReport(OutboxItem),
    /// Delete the item (it was acknowledged or refused for good). No answer.
    RemoveReport(CommandId),
    /// Count a failed delivery of the item. No answer.
    RecordAttempt(CommandId),
}

/// A status line worth showing.
#[derive(Debug, Clone, PartialEq)]
pub enum RelayEvent {
    /// A pass began.
    PassStarted,
    /// A pass ended; the next one is due at this time (`None`: on a change or at once).
    PassFinished {
        /// When the next pass is due.
        next: Option<Timestamp>,
    },
    /// A sync answered with this many commands.
    Synced {
        /// The project.
        project: ProjectId,
        /// Queued commands received.
        commands: usize,
    },
    /// A project no longer enabled was synced with an empty list: the server
    /// removed its shares, and the relay forgot the project.
    Unshared {
        /// The project.
        project: ProjectId,
    },
    /// A sync failed.
    SyncFailed {
        /// The project.
        project: ProjectId,
        /// Why.
        reason: String,
        /// No answer came (the server is unreachable or restarting), as
        /// opposed to a refusal: the relay simply tries again.
        unreachable: bool,
    },
    /// The re-check failed: the command is closed as cancelled without running.
    Declined {
        /// The command.
        command: CommandId,
    },
    /// A claim got no answer: it is claimed again, with the same execution
    /// id, at the start of the next pass.
    ClaimUnconfirmed {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
    },
    /// The server refused the claim (e.g. cancelled meanwhile): not run.
    ClaimRefused {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
    },
    /// The command started.
    Started {
        /// The command.
        command: CommandId,
        /// Its execution id.
        execution: ExecutionId,
    },
    /// The agent cancelled; the engine was asked to stop.
    CancelSent {
        /// The command.
        command: CommandId,
    },
    /// The execution ended.
    Finished {
        /// The command.
        command: CommandId,
        /// As reported to the server.
        status: FinishStatus,
        /// The envelope had to be truncated.
        truncated: bool,
    },
    /// A report reached the server.
    Delivered {
        /// The command.
        command: CommandId,
    },
    /// A report could not be sent; it stays in the outbox for the next pass.
    DeliveryFailed {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
    },
    /// The server refused a report for good; it was dropped from the outbox.
    Dropped {
        /// The command.
        command: CommandId,
        /// The server's reason.
        reason: String,
    },
}

/// Why a sync brought nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncFailure {
    /// No answer, or a refusal the server marked retryable (or did not mark):
    /// try again later.
    Network(String),
    /// The server refused the request for good (`retryable: false`): fix the configuration.
    Refused(String),
    /// The driver aborted a held sync on request.
    Aborted,
}

/// How the server answered a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The command is running under our execution id: run it.
    Granted,
    /// The server said no for good (cancelled meanwhile, unknown, already
    /// started elsewhere): never run it.
    Refused(String),
    /// No answer, or a retryable refusal: do not run it now; it is claimed
    /// again (same execution id) on the next pass.
    Network(String),
}

/// How the server answered a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    /// 2xx: recorded (or a duplicate of what was recorded).
    Acknowledged,
    /// The server said it can never take it (`retryable: false`): drop it, log why.
    Rejected(String),
    /// No answer, a retryable refusal, or a refusal without the server's
    /// word on retrying: keep it for the next pass.
    Retry(String),
}

/// A request the server did not accept, or that got no usable answer.
///
/// The one mapping from the server's answer onto the relay's inputs: the
/// server's `retryable` flag decides. `Some(false)` is final (a report is
/// dropped, a claim is not run, a sync counts as refused); `Some(true)` and
/// `None` (no answer at all, or an answer without the flag, e.g. from a proxy
/// or an authentication layer) are tried again later, so that a report is
/// never dropped on a guess. The HTTP client and the simulator both build
/// their outcomes through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The server's `retryable` flag, if its answer carried one.
    pub retryable: Option<bool>,
    /// What happened, for the log (status, code and the server's message).
    pub reason: String,
}

impl Refusal {
    /// A refusal with the server's flag (`None`: the answer carried none).
    pub fn new(retryable: Option<bool>, reason: impl Into<String>) -> Self {
        Self {
            retryable,
            reason: reason.into(),
        }
    }

    /// No answer at all (network error, timeout): tried again.
    pub fn no_answer(reason: impl Into<String>) -> Self {
        Self::new(None, reason)
    }

    /// True when the server said the same request can never succeed.
    pub fn is_final(&self) -> bool {
        self.retryable == Some(false)
    }
}

impl From<Refusal> for PostOutcome {
    fn from(refusal: Refusal) -> Self {
        if refusal.is_final() {
            PostOutcome::Rejected(refusal.reason)
        } else {
            PostOutcome::Retry(refusal.reason)
        }
    }
}

impl From<Refusal> for ClaimOutcome {
    fn from(refusal: Refusal) -> Self {
        if refusal.is_final() {
            ClaimOutcome::Refused(refusal.reason)
        } else {
            ClaimOutcome::Network(refusal.reason)
        }
    }
}

impl From<Refusal> for SyncFailure {
    fn from(refusal: Refusal) -> Self {
        if refusal.is_final() {
            SyncFailure::Refused(refusal.reason)
        } else {
            SyncFailure::Network(refusal.reason)
        }
    }
}

/// What the pass is waiting for.
#[derive(Debug, Clone, PartialEq)]
enum Awaiting {
    Nothing,
    OutboxLoad,
    OutboxPost(CommandId),
    Sync { project: ProjectId, held: bool },
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
    /// [`Action::Execute`] was emitted and the execution has not finished.
    executing: bool,
    control_in_flight: bool,
    next_control_at: Option<Timestamp>,
    report: Option<OutboxItem>,
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
            executing: false,
            control_in_flight: false,
            next_control_at: None,
            report: None,
        }
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
    unconfirmed: Option<(RelayCommand, ExecutionId)>,
    /// Until one sync succeeded: this process has just started.
    restarted: bool,
    /// Projects the server may hold shares of this relay in (remembered
    /// before their first sync; forgotten after an empty sync succeeded).
    synced: BTreeSet<ProjectId>,
    rng: u64,
    actions: VecDeque<Action>,
    events: VecDeque<RelayEvent>,
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
            synced: BTreeSet::new(),
            rng,
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

    /// True until one sync succeeded: the syncs announce a restart.
    pub fn announces_restart(&self) -> bool {
        self.restarted
    }

    /// The shared set the re-check uses.
    pub fn shared(&self) -> &SharedSet {
        &self.shared
    }

    /// The command running now, if any.
    pub fn running(&self) -> Option<CommandId> {
        self.current.as_ref().map(|c| c.job.command.id)
    }

    /// True while a pass is in progress.
    pub fn is_busy(&self) -> bool {
        self.in_pass
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
        deadline
    }

    // ----- inputs -----------------------------------------------------------

    /// Timers: a pass tick, a back-off, a control poll.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.maybe_send_control(now);
        self.drive(now);
    }

    /// The owner changed what is shared (e.g. the graphs file was edited).
    /// The re-check uses the new set at once; a pass runs right away if idle.
    pub fn handle_shared_set(&mut self, shared: SharedSet, now: Timestamp) {
        if shared == self.shared {
            return;
        }
        self.shared = shared;
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
        }
        self.drive(now);
    }

    /// The answer to [`Action::Sync`].
    pub fn handle_sync_response(
        &mut self,
        result: Result<Vec<RelayCommand>, SyncFailure>,
        now: Timestamp,
    ) {
        let Awaiting::Sync { project, held } =
            std::mem::replace(&mut self.awaiting, Awaiting::Nothing)
        else {
            return;
        };
        if held {
            self.held_done = true;
        }
        match result {
            Ok(commands) => {
                self.failures = 0;
                self.restarted = false;
                self.events.push_back(RelayEvent::Synced {
                    project: project.clone(),
                    commands: commands.len(),
                });
                // An empty sync of a project no longer enabled succeeded: the
                // server holds no shares of ours there now. (If the project was
                // enabled again meanwhile, it stays remembered.)
                if !self.is_enabled(&project) && self.synced.remove(&project) {
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
        match outcome {
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
                if let Some(current) = self.current.as_mut() {
                    let job = current.job.clone();
                    self.events.push_back(RelayEvent::Started {
                        command,
                        execution: job.execution.clone(),
                    });
                    self.actions.push_back(Action::Execute(job));
                    current.executing = true;
                    self.awaiting = Awaiting::Execution(command);
                    match self.config.mode {
                        RelayMode::Interval => {
                            current.next_control_at = Some(now.plus(self.config.control_interval))
                        }
                        RelayMode::LongPoll => current.next_control_at = Some(now),
                    }
                }
                self.maybe_send_control(now);
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
                    self.unconfirmed = Some((current.job.command, current.job.execution));
                }
                self.failures = self.failures.saturating_add(1);
                self.projects.clear();
                self.commands.clear();
                self.end_pass(now);
            }
        }
        self.drive(now);
    }

    /// The answer to [`Action::Control`].
    pub fn handle_control_response(
        &mut self,
        command: CommandId,
        result: Result<bool, String>,
        now: Timestamp,
    ) {
        // Only the execution running now listens to control answers: a late
        // answer from an earlier attempt at the same command (say, before a
        // claim that got no answer) must not cancel a run that has not started.
        if self.awaiting != Awaiting::Execution(command) {
            return;
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
        match result {
            Ok(true) => {
                if !current.cancel_sent {
                    current.cancel_sent = true;
                    self.actions.push_back(Action::CancelExecution { command });
                    self.events.push_back(RelayEvent::CancelSent { command });
                }
                current.next_control_at = None;
            }
            Ok(false) => {
                current.next_control_at = Some(match self.config.mode {
                    RelayMode::Interval => now.plus(self.config.control_interval),
                    RelayMode::LongPoll => now,
                });
            }
            Err(_) => current.next_control_at = Some(now.plus(self.config.control_interval)),
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
        // Once the relay has asked the engine to stop, the run is recorded as
        // cancelled even if the Graph finished between the flag and the stop.
        let status = if current.cancel_sent {
            FinishStatus::Cancelled
        } else {
            outcome.status.unwrap_or(FinishStatus::Completed)
        };
        let envelope = ResultEnvelope::build(
            current.job.execution.clone(),
            status,
            EnvelopeBody {
                result: outcome.result,
                total_tokens: outcome.total_tokens,
                reported_cost: outcome.reported_cost,
                error: outcome.error,
            },
        );
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
            }
        }
        if !from_pass_start {
            self.current = None;
        }
        self.drive(now);
    }

    // ----- the pass ---------------------------------------------------------

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
        // Full jitter between half and the whole back-off.
        let half = base / 2;
        let span = u64::try_from(half.as_millis()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_millis(self.next_random() % span)
    }

    fn maybe_send_control(&mut self, now: Timestamp) {
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
            if let Some((command, execution)) = self.unconfirmed.take() {
                let id = command.id;
                let current = Current::new(command, execution.clone());
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
        self.awaiting = Awaiting::Sync {
            project: project.clone(),
            held,
        };
        self.actions.push_back(Action::Sync {
            project,
            sessions,
            long_poll: held,
            restarted: self.restarted,
            running,
        });
    }

    /// The command whose execution runs now (started and not yet finished).
    fn executing(&self) -> Option<CommandId> {
        self.current
            .as_ref()
            .filter(|c| c.executing)
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
mod tests {
    use super::*;
    use serde_json::json;

    const T0: Timestamp = Timestamp(1_000_000);

    fn secs(s: u64) -> Timestamp {
        T0.plus(Duration::from_secs(s))
    }

    fn project() -> ProjectId {
        ProjectId::parse("p1").unwrap()
    }

    fn session(n: u32, slug: &str) -> SessionMeta {
        SessionMeta {
            graph_session_id: GraphSessionId::parse(&format!("gs_{n:032x}")).unwrap(),
            name: format!("g{n}").into(),
            description: "".into(),
            slug: slug.into(),
            version: "1".into(),
            status: "ready".into(),
        }
    }

    fn shared(slugs: &[(u32, &str)]) -> SharedSet {
        let mut s = SharedSet::new();
        s.enable(project());
        for (n, slug) in slugs {
            s.share(project(), session(*n, slug));
        }
        s
    }

    fn command(id: u128, n: u32, slug: &str) -> RelayCommand {
        RelayCommand {
            id: CommandId::from_uuid(uuid::Uuid::from_u128(id)),
            project: project(),
            graph_session_id: session(n, slug).graph_session_id,
            arguments: Map::new(),
            slug: slug.into(),
        }
    }

    fn interval() -> RelayConfig {
        RelayConfig {
            mode: RelayMode::Interval,
            ..RelayConfig::default()
        }
    }

    /// Every pending action.
    fn drain_all(r: &mut Relay) -> Vec<Action> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    /// The pending actions but the bookkeeping of synced projects.
    fn drain(r: &mut Relay) -> Vec<Action> {
        drain_all(r)
            .into_iter()
            .filter(|a| !matches!(a, Action::RememberProject(_) | Action::ForgetProject(_)))
            .collect()
    }

    /// Runs the pass start: empty outbox, sync answered with `commands`.
    fn pass_with(r: &mut Relay, now: Timestamp, commands: Vec<RelayCommand>) -> Vec<Action> {
        assert_eq!(drain(r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], now);
        let a = drain(r);
        assert!(
            matches!(
                a.as_slice(),
                [Action::Sync {
                    long_poll: false,
                    ..
                }]
            ),
            "{a:?}"
        );
        r.handle_sync_response(Ok(commands), now);
        drain(r)
    }

    #[test]
    fn interval_mode_passes_every_20_s_with_a_fixed_phase() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(7));
        assert_eq!(r.poll_timeout(), Some(secs(7)));
        r.handle_timeout(secs(6));
        assert!(drain(&mut r).is_empty(), "not due yet");
        r.handle_timeout(secs(7));
        assert!(pass_with(&mut r, secs(7), vec![]).is_empty());
        assert!(!r.is_busy());
        assert_eq!(r.poll_timeout(), Some(secs(27)));
    }

    #[test]
    fn a_tick_during_a_busy_pass_is_skipped() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let a = pass_with(&mut r, secs(0), vec![command(1, 1, "a")]);
        assert!(matches!(a.as_slice(), [Action::Claim { .. }]));
        r.handle_claim_response(command(1, 1, "a").id, ClaimOutcome::Granted, secs(0));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
        // The run lasts 50 s: ticks at 20 and 40 come while busy.
        for t in (3..=48).step_by(3) {
            r.handle_timeout(secs(t));
            for action in drain(&mut r) {
                assert!(
                    matches!(
                        action,
                        Action::Control {
                            long_poll: false,
                            ..
                        }
                    ),
                    "{action:?}"
                );
                r.handle_control_response(command(1, 1, "a").id, Ok(false), secs(t));
            }
        }
        r.handle_execution_finished(command(1, 1, "a").id, ExecutionOutcome::default(), secs(50));
        let a = drain(&mut r);
        let [Action::StoreReport(item)] = a.as_slice() else {
            panic!("{a:?}")
        };
        r.handle_report_stored(item.command, secs(50));
        let a = drain(&mut r);
        assert!(matches!(a.as_slice(), [Action::PostReport(_)]));
        r.handle_report_posted(item.command, PostOutcome::Acknowledged, secs(50));
        assert_eq!(drain(&mut r), vec![Action::RemoveReport(item.command)]);
        assert!(!r.is_busy());
        // The next pass keeps the phase: 60 s, not 50 + 20.
        assert_eq!(r.poll_timeout(), Some(secs(60)));
    }

    #[test]
    fn control_polls_every_3_s_and_cancel_is_sent_once_and_wins() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone()]);
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
        drain(&mut r);
        assert_eq!(r.poll_timeout(), Some(secs(3)));
        r.handle_timeout(secs(3));
        assert_eq!(
            drain(&mut r),
            vec![Action::Control {
                command: c.id,
                long_poll: false
            }]
        );
        r.handle_control_response(c.id, Ok(true), secs(3));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        // No more control polls, no second cancel.
        r.handle_timeout(secs(30));
        assert!(
            drain(&mut r)
                .iter()
                .all(|a| !matches!(a, Action::Control { .. } | Action::CancelExecution { .. }))
        );
        // The Graph finished anyway: recorded as cancelled.
        let outcome = ExecutionOutcome {
            status: Some(FinishStatus::Completed),
            result: json!("done"),
            ..Default::default()
        };
        r.handle_execution_finished(c.id, outcome, secs(31));
        let a = drain(&mut r);
        let [
            Action::StoreReport(OutboxItem {
                report: RelayReport::Completion { envelope },
                ..
            }),
        ] = a.as_slice()
        else {
            panic!("{a:?}")
        };
        assert_eq!(envelope.status, FinishStatus::Cancelled);
    }

    #[test]
    fn recheck_declines_unshared_and_renamed_sessions() {
        let mut r = Relay::new(interval(), shared(&[(1, "a"), (2, "b")]), secs(0));
        r.handle_timeout(secs(0));
        // Session 3 is not shared; session 2's slug changed since it was queued.
        let a = pass_with(
            &mut r,
            secs(0),
            vec![
                command(1, 3, "c"),
                command(2, 2, "old-slug"),
                command(3, 1, "a"),
            ],
        );
        let [Action::StoreReport(item)] = a.as_slice() else {
            panic!("{a:?}")
        };
        assert_eq!(item.report, RelayReport::Declined);
        assert_eq!(item.command, command(1, 3, "c").id);
        r.handle_report_stored(item.command, secs(0));
        assert!(matches!(
            drain(&mut r).as_slice(),
            [Action::PostReport(OutboxItem {
                report: RelayReport::Declined,
                ..
            })]
        ));
        r.handle_report_posted(item.command, PostOutcome::Acknowledged, secs(0));
        let a = drain(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [
                    Action::RemoveReport(_),
                    Action::StoreReport(OutboxItem {
                        report: RelayReport::Declined,
                        ..
                    })
                ]
            ),
            "{a:?}"
        );
        r.handle_report_stored(command(2, 2, "old-slug").id, secs(0));
        drain(&mut r);
        r.handle_report_posted(
            command(2, 2, "old-slug").id,
            PostOutcome::Acknowledged,
            secs(0),
        );
        let a = drain(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [Action::RemoveReport(_), Action::Claim { .. }]
            ),
            "{a:?}"
        );
    }

    #[test]
    fn a_change_to_the_shared_set_applies_to_the_recheck_at_once() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(0));
        drain(&mut r);
        // The owner un-shares while the sync is in flight.
        r.handle_shared_set(shared(&[]), secs(1));
        r.handle_sync_response(Ok(vec![command(1, 1, "a")]), secs(1));
        assert!(matches!(
            drain(&mut r).as_slice(),
            [Action::StoreReport(OutboxItem {
                report: RelayReport::Declined,
                ..
            })]
        ));
    }

    #[test]
    fn outbox_items_are_resent_first_and_kept_on_failure() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        let old = OutboxItem {
            command: command(9, 1, "a").id,
            report: RelayReport::Declined,
            stored_at: T0,
            attempts: 1,
        };
        r.handle_outbox_loaded(vec![old.clone()], secs(0));
        assert_eq!(drain(&mut r), vec![Action::PostReport(old.clone())]);
        r.handle_report_posted(
            old.command,
            PostOutcome::Retry("connection refused".into()),
            secs(0),
        );
        let a = drain(&mut r);
        assert_eq!(
            a[0],
            Action::RecordAttempt(old.command),
            "kept, not removed"
        );
        assert!(matches!(a[1], Action::Sync { .. }));
        assert!(!a.iter().any(|x| matches!(x, Action::RemoveReport(_))));
    }

    #[test]
    fn a_refused_report_is_dropped_and_a_refused_claim_never_runs() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
        r.handle_claim_response(c.id, ClaimOutcome::Refused("cancelled".into()), secs(0));
        let a = drain(&mut r);
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))));
        assert!(
            matches!(a.as_slice(), [Action::Claim { .. }]),
            "the next command is claimed: {a:?}"
        );
    }

    #[test]
    fn long_poll_holds_one_sync_when_idle_and_control_is_held_too() {
        let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        assert!(pass_with(&mut r, secs(0), vec![]).iter().any(|a| matches!(
            a,
            Action::Sync {
                long_poll: true,
                ..
            }
        )));
        // The held sync returns when work arrives.
        let c = command(1, 1, "a");
        r.handle_sync_response(Ok(vec![c.clone()]), secs(4));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(4));
        let a = drain(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [
                    Action::Execute(_),
                    Action::Control {
                        long_poll: true,
                        ..
                    }
                ]
            ),
            "{a:?}"
        );
        r.handle_control_response(c.id, Ok(false), secs(29));
        assert_eq!(
            drain(&mut r),
            vec![Action::Control {
                command: c.id,
                long_poll: true
            }]
        );
        r.handle_control_response(c.id, Err("timeout".into()), secs(30));
        assert!(
            drain(&mut r).is_empty(),
            "a failed control waits before retrying"
        );
        assert_eq!(r.poll_timeout(), Some(secs(33)));
        r.handle_timeout(secs(33));
        assert_eq!(
            drain(&mut r),
            vec![Action::Control {
                command: c.id,
                long_poll: true
            }]
        );
    }

    #[test]
    fn long_poll_backs_off_with_jitter_after_failures() {
        let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        drain(&mut r);
        r.handle_outbox_loaded(vec![], secs(0));
        drain(&mut r);
        r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(0));
        assert!(!r.is_busy());
        let wake = r.poll_timeout().unwrap();
        assert!(wake > secs(0) && wake <= secs(1), "{wake:?}");
        let mut last = Duration::ZERO;
        let mut now = wake;
        for _ in 0..8 {
            r.handle_timeout(now);
            drain(&mut r);
            r.handle_outbox_loaded(vec![], now);
            drain(&mut r);
            r.handle_sync_response(Err(SyncFailure::Network("down".into())), now);
            let next = r.poll_timeout().unwrap();
            last = next.since(now);
            now = next;
        }
        assert!(
            last <= Duration::from_secs(30) && last >= Duration::from_secs(15),
            "{last:?}"
        );
    }

    #[test]
    fn shared_set_change_aborts_a_held_sync() {
        let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        pass_with(&mut r, secs(0), vec![]);
        r.handle_shared_set(shared(&[(1, "a"), (2, "b")]), secs(2));
        assert_eq!(drain(&mut r), vec![Action::AbortHeldSync]);
        r.handle_sync_response(Err(SyncFailure::Aborted), secs(2));
        // A new pass starts at once with the new set.
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    }

    #[test]
    fn a_claim_without_an_answer_is_claimed_again_under_the_same_execution() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        let a = pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
        let [Action::Claim { execution, .. }] = a.as_slice() else {
            panic!("{a:?}")
        };
        let execution = execution.clone();
        r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(1));
        assert!(drain(&mut r).is_empty(), "the pass ends");
        assert!(!r.is_busy());
        r.handle_timeout(secs(20));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(20));
        assert_eq!(
            drain(&mut r),
            vec![Action::Claim {
                command: c.id,
                execution: execution.clone()
            }]
        );
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(20));
        let a = drain(&mut r);
        assert!(
            matches!(a.as_slice(), [Action::Execute(job)] if job.execution == execution),
            "{a:?}"
        );
    }

    #[test]
    fn an_unconfirmed_claim_of_an_unshared_session_is_closed_as_cancelled() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone()]);
        r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(1));
        r.handle_shared_set(shared(&[]), secs(2));
        r.handle_timeout(secs(20));
        drain(&mut r);
        r.handle_outbox_loaded(vec![], secs(20));
        let a = drain(&mut r);
        let [
            Action::StoreReport(OutboxItem {
                report: RelayReport::Completion { envelope },
                ..
            }),
        ] = a.as_slice()
        else {
            panic!("{a:?}")
        };
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        assert_eq!(
            envelope.body.as_ref().and_then(|b| b.error.as_deref()),
            Some(crate::command::NO_LONGER_SHARED)
        );
        assert!(
            !a.iter()
                .any(|x| matches!(x, Action::Claim { .. } | Action::Execute(_)))
        );
    }

    #[test]
    fn consent_withdrawn_while_the_claim_is_in_flight_means_it_never_runs() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone()]);
        r.handle_shared_set(shared(&[]), secs(1));
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
        let a = drain(&mut r);
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
        let [
            Action::StoreReport(OutboxItem {
                report: RelayReport::Completion { envelope },
                ..
            }),
        ] = a.as_slice()
        else {
            panic!("{a:?}")
        };
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        assert_eq!(
            envelope.body.as_ref().and_then(|b| b.error.as_deref()),
            Some(crate::command::NO_LONGER_SHARED)
        );
    }

    #[test]
    fn a_late_control_answer_does_not_touch_a_command_not_yet_running() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone()]);
        // A stale "cancel requested" for this command arrives while it is being claimed.
        r.handle_control_response(c.id, Ok(true), secs(1));
        assert!(drain(&mut r).is_empty());
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
    }

    #[test]
    fn the_first_syncs_announce_the_restart_after_the_outbox_and_until_one_succeeds() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        assert!(r.announces_restart());
        r.handle_timeout(secs(0));
        assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
        // A result recorded before the crash goes out before any sync.
        let old = OutboxItem {
            command: command(9, 1, "a").id,
            report: RelayReport::Declined,
            stored_at: T0,
            attempts: 0,
        };
        r.handle_outbox_loaded(vec![old.clone()], secs(0));
        assert_eq!(drain_all(&mut r), vec![Action::PostReport(old.clone())]);
        r.handle_report_posted(old.command, PostOutcome::Acknowledged, secs(0));
        assert_eq!(
            drain_all(&mut r),
            vec![
                Action::RemoveReport(old.command),
                Action::RememberProject(project()),
                Action::Sync {
                    project: project(),
                    sessions: vec![session(1, "a")],
                    long_poll: false,
                    restarted: true,
                    running: None,
                },
            ]
        );
        // That sync got no answer: the next pass announces the restart again.
        r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(0));
        r.handle_timeout(secs(20));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(20));
        let a = drain_all(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [Action::Sync {
                    restarted: true,
                    running: None,
                    ..
                }]
            ),
            "{a:?}"
        );
        r.handle_sync_response(Ok(vec![]), secs(20));
        assert!(!r.announces_restart());
        // Once one sync succeeded, later syncs are ordinary.
        r.handle_timeout(secs(40));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(40));
        let a = drain_all(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [Action::Sync {
                    restarted: false,
                    ..
                }]
            ),
            "{a:?}"
        );
    }

    #[test]
    fn a_project_no_longer_enabled_is_synced_empty_until_that_succeeds_then_forgotten() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(0));
        let a = drain_all(&mut r);
        assert_eq!(a[0], Action::RememberProject(project()), "{a:?}");
        r.handle_sync_response(Ok(vec![]), secs(0));
        assert!(r.synced_projects().eq([&project()]));
        // The owner removes the project's last graph and the project itself.
        r.handle_shared_set(SharedSet::new(), secs(5));
        assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(5));
        let empty_sync = Action::Sync {
            project: project(),
            sessions: vec![],
            long_poll: false,
            restarted: false,
            running: None,
        };
        assert_eq!(drain_all(&mut r), vec![empty_sync.clone()]);
        // Not acknowledged: still remembered, synced empty again next pass.
        r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(5));
        assert!(drain_all(&mut r).is_empty());
        r.handle_timeout(secs(20));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(20));
        assert_eq!(drain_all(&mut r), vec![empty_sync]);
        // Acknowledged: forgotten; a command it hands out fails the re-check.
        let queued = command(1, 1, "a");
        r.handle_sync_response(Ok(vec![queued.clone()]), secs(20));
        let a = drain_all(&mut r);
        assert_eq!(a[0], Action::ForgetProject(project()), "{a:?}");
        assert!(
            matches!(
                &a[1..],
                [Action::StoreReport(OutboxItem {
                    report: RelayReport::Declined,
                    command,
                    ..
                })] if *command == queued.id
            ),
            "{a:?}"
        );
        assert!(
            std::iter::from_fn(|| r.poll_event())
                .any(|e| e == RelayEvent::Unshared { project: project() })
        );
        assert_eq!(r.synced_projects().count(), 0);
        r.handle_report_stored(queued.id, secs(20));
        drain_all(&mut r);
        r.handle_report_posted(queued.id, PostOutcome::Acknowledged, secs(20));
        drain_all(&mut r);
        // Later passes sync nothing.
        r.handle_timeout(secs(40));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(40));
        assert!(drain_all(&mut r).is_empty());
        assert!(!r.is_busy());
    }

    #[test]
    fn a_project_enabled_again_while_its_empty_sync_is_in_flight_stays_remembered() {
        let mut r = Relay::new(interval(), SharedSet::new(), secs(0));
        r.remember_synced([project()]);
        r.handle_timeout(secs(0));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(0));
        assert!(matches!(
            drain_all(&mut r).as_slice(),
            [Action::Sync { sessions, .. }] if sessions.is_empty()
        ));
        r.handle_shared_set(shared(&[(1, "a")]), secs(1));
        r.handle_sync_response(Ok(vec![]), secs(1));
        assert!(
            !drain_all(&mut r)
                .iter()
                .any(|a| matches!(a, Action::ForgetProject(_)))
        );
        assert!(r.synced_projects().eq([&project()]));
    }

    #[test]
    fn projects_remembered_by_an_earlier_run_are_emptied_after_a_restart() {
        let mut r = Relay::new(RelayConfig::default(), SharedSet::new(), secs(0));
        r.remember_synced([project()]);
        r.handle_timeout(secs(0));
        assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(0));
        assert_eq!(
            drain_all(&mut r),
            vec![Action::Sync {
                project: project(),
                sessions: vec![],
                long_poll: false,
                restarted: true,
                running: None,
            }]
        );
        r.handle_sync_response(Ok(vec![]), secs(0));
        assert_eq!(drain_all(&mut r), vec![Action::ForgetProject(project())]);
        // Nothing enabled, nothing left to empty: the relay waits for a change.
        assert!(!r.is_busy());
        assert_eq!(r.poll_timeout(), Some(secs(20)));
    }

    #[test]
    fn the_servers_retryable_flag_alone_decides_what_is_tried_again() {
        let refused = Refusal::new(Some(false), "403 device_token_required: no");
        let retry = Refusal::new(Some(true), "503 store_unavailable: later");
        let silent = Refusal::new(None, "401: no flag");
        let down = Refusal::no_answer("connection refused");
        assert!(refused.is_final());
        assert_eq!(
            PostOutcome::from(refused.clone()),
            PostOutcome::Rejected(refused.reason.clone())
        );
        assert_eq!(
            ClaimOutcome::from(refused.clone()),
            ClaimOutcome::Refused(refused.reason.clone())
        );
        assert_eq!(
            SyncFailure::from(refused.clone()),
            SyncFailure::Refused(refused.reason.clone())
        );
        for r in [retry, silent, down] {
            assert!(!r.is_final());
            assert_eq!(
                PostOutcome::from(r.clone()),
                PostOutcome::Retry(r.reason.clone())
            );
            assert_eq!(
                ClaimOutcome::from(r.clone()),
                ClaimOutcome::Network(r.reason.clone())
            );
            assert_eq!(
                SyncFailure::from(r.clone()),
                SyncFailure::Network(r.reason.clone())
            );
        }
    }

    #[test]
    fn one_command_at_a_time() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let cs: Vec<_> = (1..=3).map(|i| command(i, 1, "a")).collect();
        let mut a = pass_with(&mut r, secs(0), cs.clone());
        for c in &cs {
            assert_eq!(a.len(), 1);
            assert!(matches!(&a[0], Action::Claim { command, .. } if *command == c.id));
            assert!(r.running() == Some(c.id));
            r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
            assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
            r.handle_execution_finished(c.id, ExecutionOutcome::default(), secs(2));
            drain(&mut r);
            r.handle_report_stored(c.id, secs(2));
            drain(&mut r);
            r.handle_report_posted(c.id, PostOutcome::Acknowledged, secs(2));
            a = drain(&mut r);
            a.retain(|x| !matches!(x, Action::RemoveReport(_)));
        }
        assert!(a.is_empty());
        assert!(!r.is_busy());
    }
}
