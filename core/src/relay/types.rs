//! The relay's public types: configuration, the shared set, commands and
//! jobs, actions, events and the outcomes the driver reports back.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::command::CommandStatus;
use crate::envelope::FinishStatus;
use crate::ids::{AgentId, CommandId, ExecutionId, GraphSessionId, ProjectId};
use crate::limits::MAX_SESSIONS_PER_SYNC;
use crate::outbox::OutboxItem;
use crate::queue::SyncRequest;
use crate::relay::executor::ProgressReport;
use crate::session::SessionMeta;
use crate::time::Timestamp;

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
    /// Long-poll mode: first back-off after a failed request (1 s). It
    /// doubles with each failure in a row, up to [`RelayConfig::backoff_max`].
    pub backoff_min: Duration,
    /// Long-poll mode: largest back-off (5 s). Each pause is drawn between
    /// half the back-off and the whole of it (equal jitter, from
    /// [`RelayConfig::seed`]), so desktops that lost the same server do not
    /// come back in step.
    ///
    /// Why 5 s: the outages a relay meets are short (a server restarted or
    /// replaced behind its load balancer, a database failing over: a few
    /// seconds), and a cap of C brings the desktop back at most C after the
    /// server is, so work queued meanwhile is picked up within seconds
    /// rather than half a minute later. The price is paid while the server
    /// is down: one request per 2.5 to 5 s per desktop, i.e. about 2,700
    /// connection attempts a second for 10,000 desktops. That is acceptable:
    /// against a dead server they are refused by the operating system or the
    /// load balancer without reaching any graph-relay code, and a live server
    /// at its connection cap answers them with a cheap 503 before reading a
    /// body. A much lower cap would buy little (a restart is rarely shorter
    /// than a second or two) and multiply that load.
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
            backoff_max: Duration::from_secs(5),
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
    /// Read every pending outbox item; answer with [`Relay::handle_outbox_loaded`](super::Relay::handle_outbox_loaded).
    LoadOutbox,
    /// Sync one project with this request, as the relay built it; answer
    /// with [`Relay::handle_sync_response`](super::Relay::handle_sync_response).
    /// Its `sessions` are the project's shared sessions (at most 100; none for
    /// a project no longer enabled); `long_poll` asks the server to hold the
    /// request until work arrives; `restarted` says this process has just
    /// started and the server may end the device's other running commands
    /// (true from [`Relay::new`](super::Relay::new) until one sync saying so
    /// succeeded, except while the outbox still holds reports); `running` is
    /// the command the relay executes right now, if any.
    Sync(SyncRequest),
    /// Record durably that the server holds shares of this relay in the
    /// project (before its sync is sent), so that a later run of the relay
    /// still empties them once the project is no longer enabled. No answer.
    RememberProject(ProjectId),
    /// Forget the project: its empty sync succeeded, the server holds no
    /// shares of this relay there any more. No answer.
    ForgetProject(ProjectId),
    /// Abort the held sync in flight (the shared set changed); answer with
    /// [`Relay::handle_sync_response`](super::Relay::handle_sync_response) carrying [`SyncFailure::Aborted`].
    AbortHeldSync,
    /// Ask the server to move the command to `running` under `execution`;
    /// answer with [`Relay::handle_claim_response`](super::Relay::handle_claim_response).
    Claim {
        /// The command.
        command: CommandId,
        /// The execution id it will run under.
        execution: ExecutionId,
    },
    /// Start the job on the executor; report its end with [`Relay::handle_execution_finished`](super::Relay::handle_execution_finished).
    Execute(Job),
    /// Ask whether the agent cancelled (and renew the run's lease); answer
    /// with [`Relay::handle_control_response`](super::Relay::handle_control_response).
    Control {
        /// The running command.
        command: CommandId,
        /// Ask the server to hold the request until cancellation (or its bound).
        long_poll: bool,
    },
    /// Ask the owner whether the job may run, until `until` (a prompt, a
    /// hook); answer with [`Relay::handle_approval`](super::Relay::handle_approval). Nothing runs before.
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
    /// [`Relay::handle_progress_posted`](super::Relay::handle_progress_posted). Not stored: a lost report is
    /// replaced by the next one.
    PostProgress {
        /// The running command.
        command: CommandId,
        /// The execution it runs under.
        execution: ExecutionId,
        /// What the Graph said last.
        report: ProgressReport,
    },
    /// Write the item durably; answer with [`Relay::handle_report_stored`](super::Relay::handle_report_stored).
    StoreReport(OutboxItem),
    /// Send the item to the server; answer with [`Relay::handle_report_posted`](super::Relay::handle_report_posted).
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
    /// ([`Relay::handle_local_cancel`](super::Relay::handle_local_cancel)); it ends `cancelled`.
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
    /// The server took a progress report of the running command.
    ProgressPosted {
        /// The command.
        command: CommandId,
    },
    /// The server stopped answering: a sync, claim or control request got
    /// no usable answer (none at all, or a refusal to be retried), after the
    /// last one got an answer (or as the first request of the relay). The
    /// relay retries on its own; see [`RelayEvent::StillUnreachable`] and
    /// [`RelayEvent::ServerBack`].
    ServerLost {
        /// Why the request got no answer.
        reason: String,
    },
    /// The server still does not answer. Said after each of the first few
    /// attempts of an outage, then at most once per gap that doubles from
    /// 10 s to 5 minutes (see [`reachability`](super::reachability)), never
    /// once per retry.
    StillUnreachable {
        /// Requests without an answer since the outage began, this one included.
        attempts: u32,
        /// Since the first of them.
        unreachable_for: Duration,
        /// Why this one got no answer.
        reason: String,
    },
    /// The server answers again after [`RelayEvent::ServerLost`]; said once.
    ServerBack {
        /// From the first request without an answer to this answer.
        unreachable_for: Duration,
        /// Requests that got no answer meanwhile.
        attempts: u32,
    },
    /// A control request (is the run still wanted?) got no usable answer;
    /// the next one goes after the control interval.
    ControlFailed {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
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
    /// Shutdown began ([`Relay::handle_shutdown`](super::Relay::handle_shutdown)): nothing new is synced or
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
    /// The relay stopped ([`Relay::is_stopped`](super::Relay::is_stopped)) after one last delivery
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
