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
//! - A relay made by [`Relay::new`] announces that it restarted
//!   ([`Action::Sync`]'s `restarted`), with the command it executes
//!   (`running`), until one sync carrying the announcement succeeded: the
//!   server then ends at once what the device's previous process left
//!   `running`. The announcement waits for an empty outbox: the outbox is
//!   re-sent before the first sync of each pass, and while a report of it
//!   is still undelivered (say the server answers 503) the pass syncs
//!   without the announcement, so a result recorded before a crash always
//!   reaches the server before the server closes its run. If the report can
//!   never be delivered, the run's lease lapses on the server, the report is
//!   then refused for good (`run_closed`, dropped) and the announcement follows.
//! - The relay remembers every project it has synced ([`Action::RememberProject`],
//!   written before the sync is sent; hand the remembered ones back with
//!   [`Relay::remember_synced`] after a restart). A remembered project that is no
//!   longer enabled is synced with an empty list, which removes its shares on the
//!   server, until one such sync succeeded; then it is forgotten
//!   ([`Action::ForgetProject`]). Commands such a sync hands out fail the re-check.
//!
//! # Runs the server closed
//! The server holds a lease on every running command that the control
//! requests renew. When a control answer says the command is no longer
//! running (its lease lapsed while the desktop was unreachable, or it was
//! closed after a restart), the relay stops the execution once
//! ([`Action::CancelExecution`]), polls no more, and reports nothing when it
//! ends ([`RelayEvent::ClosedByServer`], [`RelayEvent::Abandoned`]): the
//! server would refuse the report for good. A report that reaches the
//! server after the close anyway is refused with `retryable: false` and
//! dropped, like any final refusal.
//!
//! # Progress
//! The executor's progress reports ([`Relay::handle_progress`]) are
//! coalesced per run: the latest one is posted ([`Action::PostProgress`])
//! at most once per [`RelayConfig::progress_interval`], one post at a time,
//! without the outbox (only the latest report matters, and a lost one is
//! replaced by the next). Reports stop when the run's execution ends or
//! the server refused one for good.
//!
//! # Local approval
//! A Graph may need the owner's approval before each run
//! ([`SharedSet::require_approval`]; the server never sees that setting).
//! Its command is claimed as usual, so the server shows it `running`; the
//! relay then asks the owner ([`Action::AskApproval`]), posts the progress
//! [`WAITING_FOR_APPROVAL`], and keeps polling control (which renews the
//! lease and notices a cancel). Then:
//! - approved ([`Relay::handle_approval`]): the consent re-check runs again;
//!   if it holds, the command is claimed again under the same execution
//!   (the server may have closed it during a long wait, say its lease lapsed
//!   while the desktop was unreachable; then nothing runs), and the Graph
//!   starts;
//! - denied: the run ends `failed` with [`DECLINED_ON_THE_DESKTOP`] and the
//!   owner's reason, if any;
//! - no answer before the deadline: the prompt is withdrawn
//!   ([`Action::WithdrawApproval`]) and the run ends `failed`, saying so;
//! - the agent cancels: the prompt is withdrawn and the run ends `cancelled`;
//! - the server closes the run: the prompt is withdrawn, nothing is reported;
//! - the worker stops ([`Relay::handle_shutdown`]): the prompt is withdrawn
//!   and the run ends `failed`, saying so.
//!
//! Nothing runs before it is approved.
//!
//! # Cancel on the desktop
//! The owner may cancel the current run on the desktop
//! ([`Relay::handle_local_cancel`], the console's cancel button). It ends
//! like an agent's cancel: the engine is asked to stop once, and the run is
//! reported `cancelled` (fenced by its execution id, through the outbox)
//! with [`CANCELLED_ON_THE_DESKTOP`] as its error, so the agent reads who
//! cancelled it. A run waiting for approval is withdrawn and never runs.
//!
//! # Refusals
//! Whether a refused request is tried again is the server's word: its
//! `retryable` flag, carried by a [`Refusal`] and mapped onto [`PostOutcome`],
//! [`ClaimOutcome`] and [`SyncFailure`] in one place. Every driver (HTTP, the
//! simulator) goes through it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::command::{CommandStatus, InvalidProgress};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::executor::ProgressReport;
use crate::ids::{AgentId, CommandId, ExecutionId, GraphSessionId, ProjectId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::queue::ControlAnswer;
use crate::session::{MAX_SESSIONS_PER_SYNC, SessionMeta};
use crate::time::{Timestamp, splitmix64};

pub mod driver;
pub mod in_process;

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
    /// Shortest time between two progress posts of one run (1 s).
    pub progress_interval: Duration,
    /// On shutdown, how long the relay waits for the running command to end
    /// and its report to be posted before it gives up on it (the outbox
    /// keeps whatever was stored) (30 s).
    pub shutdown_timeout: Duration,
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
            progress_interval: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

impl RelayConfig {
    /// A relay in `mode` whose cadence is the one `queue` announces, so the
    /// queue's hints (`poll_after_seconds`, the offline rule, leases in
    /// interval mode) agree with what the relay does: the pass interval is
    /// [`QueueConfig::sync_interval`](crate::queue::QueueConfig::sync_interval),
    /// the control poll [`QueueConfig::control_interval`](crate::queue::QueueConfig::control_interval)
    /// and the progress interval [`QueueConfig::progress_interval`](crate::queue::QueueConfig::progress_interval).
    /// The one place an in-process desktop takes its cadence from.
    pub fn matching(queue: &crate::queue::QueueConfig, mode: RelayMode) -> Self {
        Self {
            mode,
            pass_interval: queue.sync_interval,
            control_interval: queue.control_interval,
            progress_interval: queue.progress_interval,
            ..Self::default()
        }
    }
}

/// The sessions the owner shared, per enabled project (the desktop's
/// consent), and the sessions whose runs need the owner's approval first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedSet {
    projects: BTreeMap<ProjectId, BTreeMap<GraphSessionId, SessionMeta>>,
    approvals: BTreeMap<GraphSessionId, Duration>,
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

    /// Every run of `session` waits for the owner's approval on the desktop,
    /// for at most `timeout`.
    pub fn require_approval(&mut self, session: GraphSessionId, timeout: Duration) {
        self.approvals.insert(session, timeout);
    }

    /// How long a run of `session` waits for the owner's approval, if it needs it.
    pub fn approval(&self, session: &GraphSessionId) -> Option<Duration> {
        self.approvals.get(session).copied()
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

/// The progress a run shows while it waits for the owner's approval.
pub const WAITING_FOR_APPROVAL: &str = "Waiting for the owner's approval on the desktop";
/// How the error of a run the owner declined begins (the owner's reason follows).
pub const DECLINED_ON_THE_DESKTOP: &str = "Declined on the desktop";
/// The progress a run shows once the owner approved it (until the Graph reports).
pub const APPROVED_ON_THE_DESKTOP: &str = "Approved on the desktop; the Graph is starting";
/// How the error of a run nobody approved in time begins.
pub const NOT_APPROVED_IN_TIME: &str = "Not approved on the desktop in time";
/// The error of a run the owner cancelled on the desktop (the console's
/// cancel button); the run ends `cancelled`.
pub const CANCELLED_ON_THE_DESKTOP: &str = "Cancelled on the desktop by the owner";
/// How the error of a run given up because the worker stopped begins.
pub const WORKER_STOPPED_BEFORE_APPROVAL: &str =
    "The desktop's worker stopped before the owner approved the run";
/// The error of a run the server granted while the worker was stopping.
pub const WORKER_STOPPED_BEFORE_START: &str =
    "The desktop's worker stopped before the Graph started; the Graph did not run.";

/// The owner's answer to [`Action::AskApproval`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Run it.
    Approved,
    /// Do not run it; the owner's reason, if given.
    Denied(Option<String>),
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
    /// The agent that queued the run, for the owner's eyes on the desktop
    /// (the console shows it). `None` when the server did not say (a
    /// server from before the relay API carried `agent_id`). Never part
    /// of an identity: the desktop decides nothing by it.
    pub agent: Option<AgentId>,
}

impl From<&crate::command::CommandRecord> for RelayCommand {
    /// What a sync hands the relay for a queued command: an in-process
    /// desktop turns the queue's records into relay commands with it.
    ///
    /// ```
    /// use graph_relay_core::command::CommandRecord;
    /// use graph_relay_core::prelude::*;
    /// use graph_relay_core::relay::RelayCommand;
    /// let record = CommandRecord::queued(
    ///     CommandId::parse("67e55044-10b1-426f-9247-bb680e5fe0c8")?,
    ///     AgentId::parse("assistant")?,
    ///     OwnerId::parse("alice")?,
    ///     ProjectId::parse("research")?,
    ///     DeviceId::parse("desktop")?,
    ///     GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef")?,
    ///     serde_json::Map::new(),
    ///     IdempotencyKey::parse("key-0001")?,
    ///     Timestamp(0),
    /// );
    /// let command = RelayCommand::from(&record);
    /// assert_eq!((command.id, command.project), (record.id, record.project));
    /// assert_eq!(command.agent.map(|a| a.to_string()).as_deref(), Some("assistant"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(c: &crate::command::CommandRecord) -> Self {
        Self {
            id: c.id,
            project: c.project.clone(),
            graph_session_id: c.graph_session_id.clone(),
            arguments: (*c.arguments).clone(),
            slug: c.slug.to_string(),
            agent: Some(c.agent.clone()),
        }
    }
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

impl ExecutionOutcome {
    /// A completed execution with `result` (no tokens, cost or error known).
    pub fn completed(result: Value) -> Self {
        Self {
            result,
            ..Self::default()
        }
    }
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
        /// This process has just started, and the server may end the device's
        /// other running commands: true from [`Relay::new`] until one sync
        /// saying so succeeded, except while the outbox still holds reports.
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
    /// Ask whether the agent cancelled (and renew the run's lease); answer
    /// with [`Relay::handle_control_response`].
    Control {
        /// The running command.
        command: CommandId,
        /// Ask the server to hold the request until cancellation (or its bound).
        long_poll: bool,
    },
    /// Ask the owner whether the job may run, until `until` (a prompt, a
    /// hook); answer with [`Relay::handle_approval`]. Nothing runs before.
    AskApproval {
        /// The run waiting for approval.
        job: Job,
        /// When the relay gives up waiting.
        until: Timestamp,
    },
    /// The question of [`Action::AskApproval`] is moot (timed out, cancelled,
    /// closed): withdraw the prompt. No answer.
    WithdrawApproval {
        /// The command.
        command: CommandId,
    },
    /// Ask the engine to stop the execution (the agent cancelled, or the
    /// server closed the run). Sent at most once per command.
    CancelExecution {
        /// The running command.
        command: CommandId,
    },
    /// Send the run's latest progress; answer with
    /// [`Relay::handle_progress_posted`]. Not stored: a lost report is
    /// replaced by the next one.
    PostProgress {
        /// The running command.
        command: CommandId,
        /// The execution it runs under.
        execution: ExecutionId,
        /// What the Graph said last.
        report: ProgressReport,
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
    /// The run waits for the owner's approval.
    ApprovalRequested {
        /// The command.
        command: CommandId,
        /// Until when.
        until: Timestamp,
    },
    /// The owner approved the run.
    Approved {
        /// The command.
        command: CommandId,
    },
    /// The owner declined the run; it ends `failed`.
    ApprovalDenied {
        /// The command.
        command: CommandId,
        /// The owner's reason, if given.
        reason: Option<String>,
    },
    /// Nobody approved the run in time; it ends `failed`.
    ApprovalTimedOut {
        /// The command.
        command: CommandId,
    },
    /// The agent cancelled; the engine was asked to stop.
    CancelSent {
        /// The command.
        command: CommandId,
    },
    /// The owner cancelled the run on the desktop
    /// ([`Relay::handle_local_cancel`]); it ends `cancelled`.
    CancelledOnTheDesktop {
        /// The command.
        command: CommandId,
    },
    /// The server closed the run while it was executing here (its lease
    /// lapsed, or it was closed after a restart): the engine was asked to
    /// stop, and nothing will be reported.
    ClosedByServer {
        /// The command.
        command: CommandId,
        /// How the server closed it.
        status: CommandStatus,
    },
    /// The execution of a run the server had closed ended; its result is
    /// not reported (the server would refuse it for good).
    Abandoned {
        /// The command.
        command: CommandId,
    },
    /// The server refused a progress report for good (the run is no longer
    /// running under this execution); no more progress is sent for the run.
    ProgressRefused {
        /// The command.
        command: CommandId,
        /// The server's reason.
        reason: String,
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
    /// Shutdown began ([`Relay::handle_shutdown`]): nothing new is synced or
    /// claimed; the running command, if any, is being stopped.
    Stopping {
        /// The command running at that moment.
        running: Option<CommandId>,
    },
    /// The running command did not end and report within
    /// [`RelayConfig::shutdown_timeout`]; the relay stops without it.
    GaveUpWaiting {
        /// The command.
        command: CommandId,
    },
    /// The relay stopped ([`Relay::is_stopped`]) after one last delivery
    /// attempt of the outbox.
    Stopped {
        /// Reports delivered (or refused for good and dropped) by that attempt.
        delivered: usize,
        /// Reports still in the outbox.
        kept: usize,
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

    /// The command running now, if any.
    pub fn running(&self) -> Option<CommandId> {
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
            running: self.running(),
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
        if let PostOutcome::Rejected(reason) = outcome {
            current.progress.refused = true;
            current.progress.pending = None;
            self.events
                .push_back(RelayEvent::ProgressRefused { command, reason });
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
        // Full jitter between half and the whole back-off.
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
            agent: None,
        }
    }

    /// A control answer: keep running.
    fn go_on() -> ControlAnswer {
        ControlAnswer {
            cancel_requested: false,
            status: CommandStatus::Running,
        }
    }

    /// A control answer: the agent asked to cancel.
    fn cancel_asked() -> ControlAnswer {
        ControlAnswer {
            cancel_requested: true,
            status: CommandStatus::Running,
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
                r.handle_control_response(command(1, 1, "a").id, Ok(go_on()), secs(t));
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
        r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
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
        r.handle_control_response(c.id, Ok(go_on()), secs(29));
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
        r.handle_control_response(c.id, Ok(cancel_asked()), secs(1));
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
    fn a_project_withdrawn_while_a_sync_sharing_into_it_is_in_flight_is_emptied_before_it_is_forgotten()
     {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(0));
        assert!(matches!(
            drain_all(&mut r).as_slice(),
            [Action::RememberProject(_), Action::Sync { sessions, .. }] if !sessions.is_empty()
        ));
        // The owner withdraws the project while that sync is in flight; the
        // server takes the sync, so it holds the session's share.
        r.handle_shared_set(SharedSet::new(), secs(1));
        r.handle_sync_response(Ok(vec![]), secs(1));
        assert!(
            !drain_all(&mut r)
                .iter()
                .any(|a| matches!(a, Action::ForgetProject(_))),
            "not forgotten: the server still holds its shares"
        );
        assert!(r.synced_projects().eq([&project()]));
        // The next pass empties it, and only then forgets it.
        r.handle_timeout(secs(20));
        drain_all(&mut r);
        r.handle_outbox_loaded(vec![], secs(20));
        assert!(matches!(
            drain_all(&mut r).as_slice(),
            [Action::Sync { sessions, .. }] if sessions.is_empty()
        ));
        r.handle_sync_response(Ok(vec![]), secs(20));
        assert_eq!(drain_all(&mut r), vec![Action::ForgetProject(project())]);
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

    /// An interval relay executing `command(1, 1, "a")` since `secs(0)`,
    /// with `command(2, 1, "a")` queued behind it.
    fn executing_relay() -> (Relay, RelayCommand) {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
        (r, c)
    }

    fn execution_of(r: &Relay) -> ExecutionId {
        r.current.as_ref().expect("executing").job.execution.clone()
    }

    fn report(message: &str, percent: f64) -> ProgressReport {
        ProgressReport {
            message: Some(message.into()),
            percent: Some(percent),
        }
    }

    fn at_ms(ms: u64) -> Timestamp {
        T0.plus(Duration::from_millis(ms))
    }

    #[test]
    fn a_restart_is_announced_only_once_the_outbox_is_empty() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        let old = OutboxItem {
            command: command(9, 1, "a").id,
            report: RelayReport::Declined,
            stored_at: T0,
            attempts: 0,
        };
        // Pass 1: the report from before the crash is not delivered (503):
        // the pass syncs, but without the announcement.
        r.handle_timeout(secs(0));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![old.clone()], secs(0));
        assert_eq!(drain(&mut r), vec![Action::PostReport(old.clone())]);
        r.handle_report_posted(old.command, PostOutcome::Retry("503".into()), secs(0));
        let a = drain(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [
                    Action::RecordAttempt(_),
                    Action::Sync {
                        restarted: false,
                        ..
                    }
                ]
            ),
            "{a:?}"
        );
        r.handle_sync_response(Ok(vec![]), secs(0));
        assert!(r.announces_restart(), "the announcement is only held back");
        // Pass 2: the server refuses it for good (its run was closed when the
        // lease lapsed): dropped, the outbox is empty, the restart is announced.
        r.handle_timeout(secs(20));
        drain(&mut r);
        r.handle_outbox_loaded(vec![old.clone()], secs(20));
        drain(&mut r);
        r.handle_report_posted(
            old.command,
            PostOutcome::Rejected("409 run_closed: discarded".into()),
            secs(20),
        );
        let a = drain(&mut r);
        assert!(
            matches!(
                a.as_slice(),
                [Action::RemoveReport(c), Action::Sync { restarted: true, running: None, .. }]
                    if *c == old.command
            ),
            "{a:?}"
        );
        r.handle_sync_response(Ok(vec![]), secs(20));
        assert!(!r.announces_restart());
        // Pass 3: nothing left to re-send, nothing to announce.
        r.handle_timeout(secs(40));
        drain(&mut r);
        r.handle_outbox_loaded(vec![], secs(40));
        assert!(matches!(
            drain(&mut r).as_slice(),
            [Action::Sync {
                restarted: false,
                ..
            }]
        ));
    }

    #[test]
    fn a_run_the_server_closed_is_stopped_once_and_nothing_is_reported() {
        let (mut r, c) = executing_relay();
        r.handle_timeout(secs(3));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
        // The lease lapsed while the desktop was unreachable.
        let closed = ControlAnswer {
            cancel_requested: false,
            status: CommandStatus::Failed,
        };
        r.handle_control_response(c.id, Ok(closed), secs(40));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        assert!(std::iter::from_fn(|| r.poll_event()).any(|e| e
            == RelayEvent::ClosedByServer {
                command: c.id,
                status: CommandStatus::Failed
            }));
        // No more control requests, no second stop, no progress.
        r.handle_timeout(secs(60));
        let execution = execution_of(&r);
        assert_eq!(
            r.handle_progress(c.id, &execution, report("late", 90.0), secs(60)),
            Ok(())
        );
        assert!(drain(&mut r).is_empty());
        // The engine stopped: no report is stored or posted, and the pass
        // goes on with the next command.
        r.handle_execution_finished(
            c.id,
            ExecutionOutcome {
                status: Some(FinishStatus::Cancelled),
                ..Default::default()
            },
            secs(61),
        );
        let a = drain(&mut r);
        assert!(
            matches!(a.as_slice(), [Action::Claim { command, .. }] if *command == command_id(2)),
            "{a:?}"
        );
        assert!(
            std::iter::from_fn(|| r.poll_event())
                .any(|e| e == RelayEvent::Abandoned { command: c.id })
        );
    }

    fn command_id(n: u128) -> CommandId {
        command(n, 1, "a").id
    }

    #[test]
    fn a_closed_answer_after_a_cancel_stops_nothing_twice() {
        let (mut r, c) = executing_relay();
        r.handle_timeout(secs(3));
        drain(&mut r);
        r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        // A late answer (e.g. held on another server) says the run is closed.
        let closed = ControlAnswer {
            cancel_requested: true,
            status: CommandStatus::Cancelled,
        };
        r.handle_control_response(c.id, Ok(closed), secs(4));
        assert!(drain(&mut r).is_empty(), "one stop only");
    }

    #[test]
    fn progress_is_posted_at_once_then_the_latest_at_most_once_a_second() {
        let (mut r, c) = executing_relay();
        let execution = execution_of(&r);
        r.handle_progress(c.id, &execution, report("step 1", 20.0), at_ms(100))
            .unwrap();
        assert_eq!(
            drain(&mut r),
            vec![Action::PostProgress {
                command: c.id,
                execution: execution.clone(),
                report: report("step 1", 20.0)
            }]
        );
        // Three more within the second: kept, only the latest.
        for (ms, n) in [(200, 2), (500, 3), (900, 4)] {
            r.handle_progress(
                c.id,
                &execution,
                report(&format!("step {n}"), f64::from(n) * 20.0),
                at_ms(ms),
            )
            .unwrap();
        }
        r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(300));
        assert!(drain(&mut r).is_empty());
        assert_eq!(r.poll_timeout(), Some(at_ms(1100)));
        r.handle_timeout(at_ms(1099));
        assert!(drain(&mut r).is_empty());
        r.handle_timeout(at_ms(1100));
        assert_eq!(
            drain(&mut r),
            vec![Action::PostProgress {
                command: c.id,
                execution: execution.clone(),
                report: report("step 4", 80.0)
            }]
        );
        // Nothing pending: no timer for progress.
        r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(1200));
        assert_eq!(r.poll_timeout(), Some(secs(3)), "only the control poll");
    }

    #[test]
    fn a_progress_post_in_flight_holds_the_next_one_and_a_failure_loses_only_that_report() {
        let (mut r, c) = executing_relay();
        let execution = execution_of(&r);
        r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
            .unwrap();
        drain(&mut r);
        r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(1500))
            .unwrap();
        r.handle_timeout(at_ms(2000));
        assert!(
            drain(&mut r).is_empty(),
            "the first post is still in flight"
        );
        r.handle_progress_posted(c.id, PostOutcome::Retry("timeout".into()), at_ms(2500));
        assert_eq!(
            drain(&mut r),
            vec![Action::PostProgress {
                command: c.id,
                execution: execution.clone(),
                report: report("b", 2.0)
            }]
        );
    }

    #[test]
    fn progress_stops_when_the_run_ends_or_the_server_refuses_it() {
        let (mut r, c) = executing_relay();
        let execution = execution_of(&r);
        r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
            .unwrap();
        drain(&mut r);
        r.handle_progress_posted(
            c.id,
            PostOutcome::Rejected("409 progress_refused: not running".into()),
            at_ms(100),
        );
        assert!(
            std::iter::from_fn(|| r.poll_event()).any(
                |e| matches!(e, RelayEvent::ProgressRefused { command, .. } if command == c.id)
            )
        );
        r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(2000))
            .unwrap();
        r.handle_timeout(at_ms(3000));
        assert!(
            !drain(&mut r)
                .iter()
                .any(|a| matches!(a, Action::PostProgress { .. })),
            "no progress after a final refusal"
        );

        let (mut r, c) = executing_relay();
        let execution = execution_of(&r);
        r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
            .unwrap();
        r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(10))
            .unwrap();
        drain(&mut r);
        r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(20));
        r.handle_execution_finished(c.id, ExecutionOutcome::default(), at_ms(30));
        r.handle_timeout(at_ms(5000));
        assert!(
            !drain(&mut r)
                .iter()
                .any(|a| matches!(a, Action::PostProgress { .. })),
            "the pending report is dropped when the run ends"
        );
    }

    #[test]
    fn progress_of_another_execution_is_dropped_and_an_invalid_report_refused() {
        let (mut r, c) = executing_relay();
        let stale = ExecutionId::parse("exec-stale").unwrap();
        r.handle_progress(c.id, &stale, report("a", 1.0), at_ms(0))
            .unwrap();
        r.handle_progress(command_id(7), &stale, report("a", 1.0), at_ms(0))
            .unwrap();
        assert!(drain(&mut r).is_empty());
        let execution = execution_of(&r);
        assert!(matches!(
            r.handle_progress(c.id, &execution, report("a", 101.0), at_ms(0)),
            Err(InvalidProgress::Percent(_))
        ));
        assert!(drain(&mut r).is_empty());
    }

    /// An interval relay whose `command(1, 1, "a")` (session 1 needs
    /// approval, 600 s) was just claimed at `secs(0)`; `command(2, 1, "a")`
    /// is queued behind it. Returns the actions of the grant.
    fn waiting_relay() -> (Relay, RelayCommand, Vec<Action>) {
        let mut set = shared(&[(1, "a")]);
        set.require_approval(session(1, "a").graph_session_id, Duration::from_secs(600));
        let mut r = Relay::new(interval(), set, secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
        let a = drain(&mut r);
        (r, c, a)
    }

    fn stored_completion(a: &[Action]) -> Option<&ResultEnvelope> {
        a.iter().find_map(|x| match x {
            Action::StoreReport(OutboxItem {
                report: RelayReport::Completion { envelope },
                ..
            }) => Some(envelope),
            _ => None,
        })
    }

    fn error_of(envelope: &ResultEnvelope) -> Option<&str> {
        envelope.body.as_ref().and_then(|b| b.error.as_deref())
    }

    #[test]
    fn a_run_needing_approval_is_claimed_asked_and_runs_only_once_approved() {
        let (mut r, c, a) = waiting_relay();
        let execution = execution_of(&r);
        assert_eq!(
            a,
            vec![
                Action::AskApproval {
                    job: Job {
                        command: c.clone(),
                        execution: execution.clone(),
                        channel: c.id.channel(),
                    },
                    until: secs(600),
                },
                Action::PostProgress {
                    command: c.id,
                    execution: execution.clone(),
                    report: ProgressReport {
                        message: Some(WAITING_FOR_APPROVAL.into()),
                        percent: None
                    }
                },
            ]
        );
        r.handle_progress_posted(c.id, PostOutcome::Acknowledged, secs(0));
        // While it waits: control polls (the lease, a cancel), a sync names it.
        r.handle_timeout(secs(3));
        assert_eq!(
            drain(&mut r),
            vec![Action::Control {
                command: c.id,
                long_poll: false
            }]
        );
        r.handle_control_response(c.id, Ok(go_on()), secs(3));
        assert_eq!(r.executing(), Some(c.id));
        assert_eq!(r.poll_timeout(), Some(secs(6)));
        r.handle_timeout(secs(6));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(5));
        // The server confirms the run is still ours before anything runs.
        assert_eq!(
            drain(&mut r),
            vec![Action::Claim {
                command: c.id,
                execution: execution.clone()
            }]
        );
        // The control answer that was in flight is ignored meanwhile.
        r.handle_control_response(c.id, Ok(go_on()), secs(5));
        assert!(drain(&mut r).is_empty());
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(5));
        let a = drain(&mut r);
        assert!(
            matches!(&a[..], [Action::Execute(job), Action::PostProgress { report, .. }]
                if job.command.id == c.id
                    && report.message.as_deref() == Some(APPROVED_ON_THE_DESKTOP)),
            "{a:?}"
        );
        // Control polling goes on for the execution.
        r.handle_timeout(secs(8));
        assert!(
            drain(&mut r)
                .iter()
                .any(|x| matches!(x, Action::Control { .. })),
            "control resumes"
        );
    }

    #[test]
    fn an_approved_run_the_server_closed_during_the_wait_never_starts() {
        let (mut r, c, _) = waiting_relay();
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(200));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
        // Its lease lapsed while the desktop was unreachable.
        r.handle_claim_response(
            c.id,
            ClaimOutcome::Refused("409 start_refused: the command is already failed".into()),
            secs(200),
        );
        let a = drain(&mut r);
        assert!(
            !a.iter()
                .any(|x| matches!(x, Action::Execute(_) | Action::StoreReport(_))),
            "{a:?}"
        );
        assert!(
            matches!(a.as_slice(), [Action::Claim { command, .. }] if *command == command_id(2)),
            "{a:?}"
        );
    }

    #[test]
    fn an_approval_survives_a_confirming_claim_without_an_answer() {
        let (mut r, c, _) = waiting_relay();
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(5));
        drain(&mut r);
        r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(5));
        drain(&mut r);
        r.handle_timeout(secs(20));
        drain(&mut r);
        r.handle_outbox_loaded(vec![], secs(20));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(20));
        let a = drain(&mut r);
        assert!(
            matches!(a.first(), Some(Action::Execute(job)) if job.command.id == c.id),
            "not asked again: {a:?}"
        );
    }

    #[test]
    fn a_denied_run_fails_with_the_owners_reason_and_never_runs() {
        let (mut r, c, _) = waiting_relay();
        r.handle_approval(
            c.id,
            ApprovalDecision::Denied(Some("  not on my budget ".into())),
            secs(10),
        );
        let a = drain(&mut r);
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Failed);
        assert_eq!(
            error_of(envelope),
            Some("Declined on the desktop: not on my budget")
        );
        // Without a reason: the bare text.
        let (mut r, c, _) = waiting_relay();
        r.handle_approval(c.id, ApprovalDecision::Denied(None), secs(10));
        let a = drain(&mut r);
        assert_eq!(
            error_of(stored_completion(&a).unwrap()),
            Some(DECLINED_ON_THE_DESKTOP)
        );
    }

    #[test]
    fn an_approval_that_does_not_come_in_time_fails_the_run_and_withdraws_the_prompt() {
        let (mut r, c, _) = waiting_relay();
        // Control keeps the lease alive meanwhile.
        for t in (3..600).step_by(3) {
            r.handle_timeout(secs(t));
            for action in drain(&mut r) {
                if let Action::Control { .. } = action {
                    r.handle_control_response(c.id, Ok(go_on()), secs(t));
                }
            }
        }
        r.handle_timeout(secs(600));
        let a = drain(&mut r);
        assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Failed);
        let error = error_of(envelope).unwrap();
        assert!(
            error.starts_with(NOT_APPROVED_IN_TIME) && error.contains("600 s"),
            "{error}"
        );
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))));
        // A late approval changes nothing.
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(601));
        assert!(
            !drain(&mut r)
                .iter()
                .any(|x| matches!(x, Action::Execute(_)))
        );
    }

    #[test]
    fn a_cancel_while_waiting_withdraws_the_prompt_and_ends_cancelled() {
        let (mut r, c, _) = waiting_relay();
        r.handle_timeout(secs(3));
        drain(&mut r);
        r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
        let a = drain(&mut r);
        assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
        assert!(
            !a.iter()
                .any(|x| matches!(x, Action::Execute(_) | Action::CancelExecution { .. })),
            "{a:?}"
        );
        assert_eq!(
            stored_completion(&a).map(|e| e.status),
            Some(FinishStatus::Cancelled)
        );
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(4));
        assert!(
            !drain(&mut r)
                .iter()
                .any(|x| matches!(x, Action::Execute(_)))
        );
    }

    #[test]
    fn a_cancel_on_the_desktop_stops_the_execution_once_and_ends_cancelled() {
        let (mut r, c) = executing_relay();
        assert!(
            !r.handle_local_cancel(command_id(2), secs(1)),
            "not the current run"
        );
        assert!(r.handle_local_cancel(c.id, secs(1)));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        assert_eq!(
            std::iter::from_fn(|| r.poll_event())
                .filter(|e| matches!(e, RelayEvent::CancelledOnTheDesktop { .. }))
                .count(),
            1
        );
        // A second click, or the agent's cancel afterwards, stops nothing twice.
        assert!(!r.handle_local_cancel(c.id, secs(2)));
        r.handle_timeout(secs(3));
        for action in drain(&mut r) {
            assert!(matches!(action, Action::Control { .. }), "{action:?}");
            r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
        }
        assert!(
            !drain(&mut r)
                .iter()
                .any(|x| matches!(x, Action::CancelExecution { .. }))
        );
        // The Graph finished between the click and the stop: still cancelled,
        // with the owner's word for it, under the run's execution id.
        let outcome = ExecutionOutcome {
            status: Some(FinishStatus::Completed),
            result: json!("done"),
            error: Some("terminated by SIGTERM".into()),
            ..Default::default()
        };
        let execution = execution_of(&r);
        r.handle_execution_finished(c.id, outcome, secs(4));
        let a = drain(&mut r);
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        assert_eq!(envelope.execution_id, execution);
        assert_eq!(error_of(envelope), Some(CANCELLED_ON_THE_DESKTOP));
        assert!(!r.handle_local_cancel(c.id, secs(5)), "already reported");
    }

    #[test]
    fn a_cancel_on_the_desktop_while_waiting_withdraws_the_prompt_and_runs_nothing() {
        let (mut r, c, _) = waiting_relay();
        assert!(r.handle_local_cancel(c.id, secs(2)));
        let a = drain(&mut r);
        assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
        assert!(
            !a.iter()
                .any(|x| matches!(x, Action::Execute(_) | Action::CancelExecution { .. })),
            "{a:?}"
        );
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        assert!(error_of(envelope).is_some_and(|e| e.starts_with(CANCELLED_ON_THE_DESKTOP)));
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(3));
        assert!(
            !drain(&mut r)
                .iter()
                .any(|x| matches!(x, Action::Execute(_)))
        );
    }

    #[test]
    fn a_cancel_on_the_desktop_after_the_server_closed_the_run_changes_nothing() {
        let (mut r, c) = executing_relay();
        r.handle_timeout(secs(3));
        drain(&mut r);
        let closed = ControlAnswer {
            cancel_requested: false,
            status: CommandStatus::Failed,
        };
        r.handle_control_response(c.id, Ok(closed), secs(3));
        drain(&mut r);
        assert!(!r.handle_local_cancel(c.id, secs(4)));
        assert!(drain(&mut r).is_empty());
    }

    #[test]
    fn consent_withdrawn_while_waiting_is_checked_again_right_before_the_start() {
        let (mut r, c, _) = waiting_relay();
        let mut set = shared(&[]);
        set.require_approval(session(1, "a").graph_session_id, Duration::from_secs(600));
        r.handle_shared_set(set, secs(5));
        drain(&mut r);
        r.handle_approval(c.id, ApprovalDecision::Approved, secs(6));
        let a = drain(&mut r);
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        assert_eq!(error_of(envelope), Some(crate::command::NO_LONGER_SHARED));
    }

    #[test]
    fn a_run_the_server_closed_while_waiting_withdraws_the_prompt_and_reports_nothing() {
        let (mut r, c, _) = waiting_relay();
        r.handle_timeout(secs(3));
        drain(&mut r);
        let closed = ControlAnswer {
            cancel_requested: false,
            status: CommandStatus::Failed,
        };
        r.handle_control_response(c.id, Ok(closed), secs(40));
        let a = drain(&mut r);
        assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
        assert!(stored_completion(&a).is_none(), "{a:?}");
        assert!(
            matches!(&a[1..], [Action::Claim { command, .. }] if *command == command_id(2)),
            "the pass goes on: {a:?}"
        );
    }

    #[test]
    fn a_worker_stopping_while_a_run_waits_gives_it_up_with_a_clear_reason() {
        let (mut r, c, _) = waiting_relay();
        r.handle_shutdown(secs(7));
        let a = drain(&mut r);
        assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Failed);
        assert!(
            error_of(envelope)
                .unwrap()
                .starts_with(WORKER_STOPPED_BEFORE_APPROVAL)
        );
    }

    #[test]
    fn shutdown_stops_the_run_reports_it_flushes_the_outbox_once_and_then_stops() {
        let (mut r, c) = executing_relay();
        r.handle_shutdown(secs(1));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        assert!(!r.is_stopped());
        // Nothing new is asked for while the run ends: no control, no pass.
        r.handle_timeout(secs(25));
        assert!(drain(&mut r).is_empty());
        r.handle_execution_finished(
            c.id,
            ExecutionOutcome {
                status: Some(FinishStatus::Cancelled),
                ..Default::default()
            },
            secs(26),
        );
        let a = drain(&mut r);
        let envelope = stored_completion(&a).expect("the run's report");
        assert_eq!(envelope.status, FinishStatus::Cancelled);
        let item = match &a[..] {
            [Action::StoreReport(item)] => item.clone(),
            other => panic!("{other:?}"),
        };
        r.handle_report_stored(c.id, secs(26));
        assert_eq!(drain(&mut r), vec![Action::PostReport(item.clone())]);
        r.handle_report_posted(c.id, PostOutcome::Retry("down".into()), secs(27));
        // The report stays in the outbox, which gets one last attempt.
        assert_eq!(
            drain(&mut r),
            vec![Action::RecordAttempt(c.id), Action::LoadOutbox]
        );
        let older = OutboxItem {
            command: command_id(9),
            report: RelayReport::Declined,
            stored_at: secs(0),
            attempts: 3,
        };
        r.handle_outbox_loaded(vec![older.clone(), item.clone()], secs(27));
        assert_eq!(drain(&mut r), vec![Action::PostReport(older.clone())]);
        r.handle_report_posted(older.command, PostOutcome::Acknowledged, secs(27));
        assert_eq!(
            drain(&mut r),
            vec![
                Action::RemoveReport(older.command),
                Action::PostReport(item)
            ]
        );
        r.handle_report_posted(c.id, PostOutcome::Retry("still down".into()), secs(28));
        assert_eq!(drain(&mut r), vec![Action::RecordAttempt(c.id)]);
        assert!(r.is_stopped());
        let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
        assert!(events.contains(&RelayEvent::Stopping {
            running: Some(c.id)
        }));
        assert_eq!(
            events.last(),
            Some(&RelayEvent::Stopped {
                delivered: 1,
                kept: 1
            })
        );
        assert_eq!(r.poll_timeout(), None);
        // Later calls change nothing.
        r.handle_shutdown(secs(30));
        r.handle_timeout(secs(90));
        assert!(drain(&mut r).is_empty());
    }

    #[test]
    fn shutdown_gives_up_a_run_that_does_not_end_in_time() {
        let (mut r, c) = executing_relay();
        r.handle_shutdown(secs(1));
        assert_eq!(
            drain(&mut r),
            vec![Action::CancelExecution { command: c.id }]
        );
        let deadline = secs(1).plus(RelayConfig::default().shutdown_timeout);
        assert_eq!(r.poll_timeout(), Some(deadline));
        r.handle_timeout(deadline);
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], deadline);
        assert!(r.is_stopped());
        let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
        assert!(events.contains(&RelayEvent::GaveUpWaiting { command: c.id }));
    }

    #[test]
    fn a_claim_granted_while_stopping_never_runs() {
        let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        let c = command(1, 1, "a");
        pass_with(&mut r, secs(0), vec![c.clone()]);
        r.handle_shutdown(secs(1));
        assert!(drain(&mut r).is_empty(), "the claim is in flight");
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(2));
        let a = drain(&mut r);
        assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
        let envelope = stored_completion(&a).expect("a completion");
        assert_eq!(envelope.status, FinishStatus::Failed);
        assert_eq!(error_of(envelope), Some(WORKER_STOPPED_BEFORE_START));
    }

    #[test]
    fn shutdown_aborts_a_held_sync_and_syncs_nothing_more() {
        let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
        r.handle_timeout(secs(0));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(0));
        let a = drain(&mut r);
        assert!(matches!(a.as_slice(), [Action::Sync { .. }]), "{a:?}");
        r.handle_shutdown(secs(1));
        assert_eq!(drain(&mut r), vec![Action::AbortHeldSync]);
        r.handle_sync_response(Err(SyncFailure::Aborted), secs(1));
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(1));
        assert!(r.is_stopped());
        r.handle_shared_set(shared(&[(1, "a"), (2, "b")]), secs(2));
        r.handle_timeout(secs(100));
        assert!(drain(&mut r).is_empty());
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
