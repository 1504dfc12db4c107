//! The command state machine (SPEC §4).
//!
//! A [`CommandRecord`] is one queued Graph run. Its state changes only
//! through the transition methods below, which are pure: given `now` they
//! change the record in place (bumping its `revision`) or refuse and leave
//! it as it was. The [`Queue`](crate::queue::Queue) applies them to a fresh
//! copy and stores persist the result with a conditional write on the
//! previous revision; they never decide a transition themselves.
//!
//! ```text
//!            start(exec)             complete(exec, env)
//!  queued ─────────────────► running ───────────────────► completed | failed | cancelled
//!    │  cancel / decline        │ cancel: sets the flag; the relay's outcome
//!    ▼                          │ is then recorded as cancelled
//!  cancelled                    │ lease lapsed / desktop restarted:
//!                               ▼ failed (cancelled if the agent cancels)
//! ```
//!
//! # Leases
//! A running command holds a lease: `start` grants it and the executing
//! desktop's control requests renew it. When the lease lapses (no word
//! from the desktop for the lease's length) the run is over: the next look
//! at it (a read, a report, the server's sweep) closes it `failed` with
//! [`LEASE_LAPSED`], or `cancelled` if the agent cancels it then or had
//! asked before. It is never run again: Graph runs have side effects. A
//! result that arrives afterwards is refused ([`CompleteRefused::Lapsed`])
//! and discarded; the run stays as it was closed, and the desktop's log
//! shows the refusal. A desktop that restarts says so on its first sync,
//! and its other running commands are closed at once the same way.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::envelope::{FinishStatus, ResultEnvelope};
use crate::ids::{
    AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::time::Timestamp;

/// The message a command is closed with when the relay's re-check fails (SPEC §6).
pub const NO_LONGER_SHARED: &str = "Graph session is no longer shared with this project";
/// The reason recorded when an agent cancels a command before the desktop started it.
pub const CANCELLED_WHILE_QUEUED: &str = "Cancelled by the agent before the desktop started it";
/// The reason recorded when a running command ends after the agent asked to cancel it.
pub const CANCELLED_WHILE_RUNNING: &str = "Cancelled by the agent while it was running";
/// How the reason of a run whose lease lapsed begins.
pub const LEASE_LAPSED: &str = "The owner's desktop stopped reporting on this run";
/// How the reason of a run closed because its desktop restarted begins.
pub const DESKTOP_RESTARTED: &str = "The owner's desktop restarted while this run was running";
/// The progress a run shows while it waits for the owner's approval on the
/// desktop: the relay reports it, and [`CommandRecord::awaits_approval`]
/// reads it back (the server never sees the approval settings themselves).
pub const WAITING_FOR_APPROVAL: &str = "Waiting for the owner's approval on the desktop";

/// Where a command is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommandStatus {
    /// Waiting for the desktop to pick it up.
    Queued,
    /// The desktop started it.
    Running,
    /// Finished; the result is available.
    Completed,
    /// Finished with an error.
    Failed,
    /// Stopped before or while running.
    Cancelled,
}

impl CommandStatus {
    /// `completed`, `failed` and `cancelled` never change again.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

impl From<FinishStatus> for CommandStatus {
    fn from(s: FinishStatus) -> Self {
        match s {
            FinishStatus::Completed => Self::Completed,
            FinishStatus::Failed => Self::Failed,
            FinishStatus::Cancelled => Self::Cancelled,
        }
    }
}

/// One queued Graph run and everything the server knows about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRecord {
    /// The ticket.
    pub id: CommandId,
    /// The agent that queued it; only this agent can read or cancel it.
    pub agent: AgentId,
    /// The owner of the project and desktop.
    pub owner: OwnerId,
    /// The project the run is filed under.
    pub project: ProjectId,
    /// The desktop that shares the session and will run it.
    pub device: DeviceId,
    /// The saved Graph to run.
    pub graph_session_id: GraphSessionId,
    /// Input for the Graph (shared: copies of a record do not copy it).
    pub arguments: std::sync::Arc<Map<String, Value>>,
    /// The session's slug when the run was queued; the relay's re-check
    /// refuses to run the command if the desktop's slug differs now.
    #[serde(default)]
    pub slug: std::sync::Arc<str>,
    /// The agent's retry key.
    pub idempotency_key: IdempotencyKey,
    /// Where the command is in its life.
    pub status: CommandStatus,
    /// The agent asked to cancel while it was running.
    pub cancel_requested: bool,
    /// The engine's execution id, once started.
    pub execution_id: Option<ExecutionId>,
    /// When it was queued.
    pub created_at: Timestamp,
    /// When the desktop started it.
    pub started_at: Option<Timestamp>,
    /// When the agent asked to cancel it.
    pub cancel_requested_at: Option<Timestamp>,
    /// When it reached a terminal state.
    pub finished_at: Option<Timestamp>,
    /// The completion as the relay posted it (kept verbatim to recognise duplicates).
    pub completion: Option<ResultEnvelope>,
    /// Why it was closed without a completion, or why it was cancelled.
    pub reason: Option<String>,
    /// While running: when the lease lapses unless the desktop renews it.
    /// `None` on a running record written before leases existed; the
    /// server's sweep grants it one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<Timestamp>,
    /// The last time the executing desktop was heard from about this run
    /// (its start or a lease renewal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard_at: Option<Timestamp>,
    /// The latest progress the running Graph reported; kept after the run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Bumped by every transition; stores write conditionally on it.
    pub revision: u64,
}

use crate::limits::MAX_PROGRESS_MESSAGE;

/// What a running Graph last said about how far it got. Progress never
/// changes a run's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// A short text for people, at most [`MAX_PROGRESS_MESSAGE`] characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How far, from 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// When the server recorded it.
    pub updated_at: Timestamp,
}

/// A progress report that breaks a rule; nothing is recorded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidProgress {
    /// The message is too long.
    #[error("progress `message` is {0} characters long; the limit is {MAX_PROGRESS_MESSAGE}")]
    MessageTooLong(usize),
    /// The percentage is not a number from 0 to 100.
    #[error("progress `percent` must be a number from 0 to 100; got {0}")]
    Percent(f64),
}

impl Progress {
    /// A report of `message` and `percent` recorded at `now`, if both keep their rules.
    pub fn new(
        message: Option<String>,
        percent: Option<f64>,
        now: Timestamp,
    ) -> Result<Self, InvalidProgress> {
        if let Some(m) = &message {
            let length = m.chars().count();
            if length > MAX_PROGRESS_MESSAGE {
                return Err(InvalidProgress::MessageTooLong(length));
            }
        }
        if let Some(p) = percent
            && !(p.is_finite() && (0.0..=100.0).contains(&p))
        {
            return Err(InvalidProgress::Percent(p));
        }
        Ok(Self {
            message,
            percent,
            updated_at: now,
        })
    }

    /// The same report, ignoring when it was recorded.
    pub fn same_report(&self, other: &Progress) -> bool {
        self.message == other.message && self.percent == other.percent
    }
}

/// Why a progress report was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProgressRefused {
    /// The command is not running (queued, or already closed): progress
    /// cannot revive or move it.
    #[error("the command is {0}, not running; progress is taken only while it runs")]
    NotRunning(&'static str),
    /// The report names another execution than the one running.
    #[error("the progress is for another execution than the one running")]
    StaleExecution,
}

/// Why `start` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StartRefused {
    /// The command was cancelled (or otherwise closed) before it started.
    #[error("the command is already {0}; it must not run")]
    Finished(&'static str),
    /// The command is running under another execution id.
    #[error("the command is already running under another execution")]
    OtherExecution,
}

/// Why `complete` was refused. Nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CompleteRefused {
    /// The command is still queued: nothing has started, so there is no
    /// execution to complete.
    #[error("the command has not started yet; there is no execution to complete")]
    NotStarted,
    /// The command was closed (e.g. cancelled while queued, or declined)
    /// before any execution started: there is none to complete.
    #[error(
        "the command was {0} before it started, so there is no execution to complete; do not run it"
    )]
    ClosedBeforeStart(&'static str),
    /// The run's lease lapsed (or its desktop restarted) and the server
    /// closed it; a result arriving now is discarded.
    #[error(
        "the server closed this run as {0} because the desktop stopped reporting on it (its lease lapsed or the desktop restarted); this late result is discarded"
    )]
    Lapsed(&'static str),
    /// The completion names another execution than the one that started.
    #[error("the completion is for another execution than the one running")]
    StaleExecution,
    /// The command already ended with a different completion (or without one).
    #[error("the command already finished differently")]
    Conflict,
}

/// Why `decline` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the command is already running; it can no longer be declined")]
pub struct DeclineRefused;

impl CommandRecord {
    /// A new queued command.
    #[allow(clippy::too_many_arguments)]
    pub fn queued(
        id: CommandId,
        agent: AgentId,
        owner: OwnerId,
        project: ProjectId,
        device: DeviceId,
        graph_session_id: GraphSessionId,
        arguments: Map<String, Value>,
        idempotency_key: IdempotencyKey,
        now: Timestamp,
    ) -> Self {
        Self {
            id,
            agent,
            owner,
            project,
            device,
            graph_session_id,
            arguments: std::sync::Arc::new(arguments),
            slug: std::sync::Arc::default(),
            idempotency_key,
            status: CommandStatus::Queued,
            cancel_requested: false,
            execution_id: None,
            created_at: now,
            started_at: None,
            cancel_requested_at: None,
            finished_at: None,
            completion: None,
            reason: None,
            lease_expires_at: None,
            heard_at: None,
            progress: None,
            revision: 0,
        }
    }

    /// Makes `self` equal to `next`, a later revision of the same command.
    /// Only the fields a transition changes are copied when the request
    /// fields (ids, arguments, slug, key, creation time) are the same
    /// shared values, which they are for every record the queue writes;
    /// otherwise the whole record is copied. For stores that keep records
    /// in memory.
    pub fn overwrite_with(&mut self, next: &CommandRecord) {
        let same_request = self.id == next.id
            && self.agent == next.agent
            && self.owner == next.owner
            && self.project == next.project
            && self.device == next.device
            && self.graph_session_id == next.graph_session_id
            && std::sync::Arc::ptr_eq(&self.arguments, &next.arguments)
            && std::sync::Arc::ptr_eq(&self.slug, &next.slug)
            && self.idempotency_key == next.idempotency_key
            && self.created_at == next.created_at;
        if !same_request {
            self.clone_from(next);
            return;
        }
        let Self {
            id: _,
            agent: _,
            owner: _,
            project: _,
            device: _,
            graph_session_id: _,
            arguments: _,
            slug: _,
            idempotency_key: _,
            created_at: _,
            status,
            cancel_requested,
            execution_id,
            started_at,
            cancel_requested_at,
            finished_at,
            completion,
            reason,
            lease_expires_at,
            heard_at,
            progress,
            revision,
        } = next;
        self.status = *status;
        self.cancel_requested = *cancel_requested;
        if self.execution_id != *execution_id {
            self.execution_id.clone_from(execution_id);
        }
        self.started_at = *started_at;
        self.cancel_requested_at = *cancel_requested_at;
        self.finished_at = *finished_at;
        self.completion.clone_from(completion);
        self.reason.clone_from(reason);
        self.lease_expires_at = *lease_expires_at;
        self.heard_at = *heard_at;
        self.progress.clone_from(progress);
        self.revision = *revision;
    }

    /// The length of the lease the command holds, as granted at its start
    /// or last renewal; `None` when it holds none (not running).
    pub fn lease(&self) -> Option<std::time::Duration> {
        Some(self.lease_expires_at?.since(self.heard_at?))
    }

    /// True when the command is running and its lease has lapsed at `now`:
    /// the run is over, whatever the stored status still says.
    pub fn is_lapsed(&self, now: Timestamp) -> bool {
        self.status == CommandStatus::Running && self.lease_expires_at.is_some_and(|t| t <= now)
    }

    /// True while the run is claimed but waits for the owner's approval on
    /// the desktop: running, with [`WAITING_FOR_APPROVAL`] as its latest
    /// progress. Its status stays `running`; only what the agent reads
    /// about it differs (the Graph has not started).
    pub fn awaits_approval(&self) -> bool {
        self.status == CommandStatus::Running
            && self
                .progress
                .as_ref()
                .and_then(|p| p.message.as_deref())
                .is_some_and(|m| m == WAITING_FOR_APPROVAL)
    }

    /// True when the server closed the command after it started without a
    /// report from the desktop (its lease lapsed, or the desktop restarted).
    pub fn closed_without_report(&self) -> bool {
        self.status.is_terminal() && self.started_at.is_some() && self.completion.is_none()
    }

    /// The command as it is at `now`: a running command whose lease has
    /// lapsed is closed (see [`CommandRecord::lapse_in_place`]); anything
    /// else is returned unchanged. Pure: what a read shows before anything
    /// is written.
    pub fn at(&self, now: Timestamp) -> std::borrow::Cow<'_, Self> {
        if self.is_lapsed(now) {
            let mut lapsed = self.clone();
            lapsed.lapse_in_place(now);
            std::borrow::Cow::Owned(lapsed)
        } else {
            std::borrow::Cow::Borrowed(self)
        }
    }

    // The transitions proper. Each one changes the record in place and bumps
    // the revision, or returns `Ok(false)` / an error having changed nothing,
    // so a caller that owns a fresh copy (the queue) needs no second one.

    /// [`CommandRecord::cancel`] on this record; `true` if it changed. A
    /// running command whose lease has lapsed is cancelled at once: its
    /// desktop will never stop it or report.
    pub(crate) fn cancel_in_place(&mut self, now: Timestamp) -> bool {
        if self.is_lapsed(now) {
            self.cancel_requested = true;
            self.cancel_requested_at = Some(now);
            let why = self.lapse_reason();
            self.close_unreported(now, why);
            return true;
        }
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Cancelled;
                self.cancel_requested = true;
                self.cancel_requested_at = Some(now);
                self.finished_at = Some(now);
                self.reason = Some(CANCELLED_WHILE_QUEUED.to_owned());
            }
            CommandStatus::Running if !self.cancel_requested => {
                self.cancel_requested = true;
                self.cancel_requested_at = Some(now);
            }
            _ => return false,
        }
        self.revision += 1;
        true
    }

    /// [`CommandRecord::start`] on this record with a lease of `lease`;
    /// `Ok(false)` for a retried start that needs no write.
    pub(crate) fn start_in_place(
        &mut self,
        execution: &ExecutionId,
        now: Timestamp,
        lease: std::time::Duration,
    ) -> Result<bool, StartRefused> {
        if self.is_lapsed(now) {
            self.lapse_in_place(now);
            return Err(StartRefused::Finished(self.status.as_str()));
        }
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Running;
                self.execution_id = Some(execution.clone());
                self.started_at = Some(now);
                self.lease_expires_at = Some(now.plus(lease));
                self.heard_at = Some(now);
                self.revision += 1;
                Ok(true)
            }
            CommandStatus::Running if self.execution_id.as_ref() == Some(execution) => {
                Ok(self.renew_in_place(now, lease))
            }
            CommandStatus::Running => Err(StartRefused::OtherExecution),
            terminal => Err(StartRefused::Finished(terminal.as_str())),
        }
    }

    /// [`CommandRecord::complete`] on this record; `Ok(false)` for a duplicate.
    pub(crate) fn complete_in_place(
        &mut self,
        envelope: &ResultEnvelope,
        now: Timestamp,
    ) -> Result<bool, CompleteRefused> {
        if self.is_lapsed(now) {
            let mut closed = self.clone();
            closed.lapse_in_place(now);
            return Err(CompleteRefused::Lapsed(closed.status.as_str()));
        }
        match self.status {
            CommandStatus::Queued => Err(CompleteRefused::NotStarted),
            CommandStatus::Running => {
                if self.execution_id.as_ref() != Some(&envelope.execution_id) {
                    return Err(CompleteRefused::StaleExecution);
                }
                self.status = if self.cancel_requested {
                    self.reason = Some(CANCELLED_WHILE_RUNNING.to_owned());
                    CommandStatus::Cancelled
                } else {
                    envelope.status.into()
                };
                self.finished_at = Some(now);
                self.completion = Some(envelope.clone());
                self.revision += 1;
                Ok(true)
            }
            _ if self.completion.as_ref() == Some(envelope) => Ok(false),
            terminal if self.started_at.is_none() => {
                Err(CompleteRefused::ClosedBeforeStart(terminal.as_str()))
            }
            terminal if self.closed_without_report() => {
                Err(CompleteRefused::Lapsed(terminal.as_str()))
            }
            _ if self.execution_id.as_ref() != Some(&envelope.execution_id) => {
                Err(CompleteRefused::StaleExecution)
            }
            _ => Err(CompleteRefused::Conflict),
        }
    }

    /// Renews the lease of a running command to `now + lease`. Written only
    /// when less than half of `lease` is left, so a desktop that polls often
    /// costs a write per half lease, not one per poll; `heard_at` is then up
    /// to half a lease old. `false`: nothing to write (not running, lapsed,
    /// or not yet due).
    pub(crate) fn renew_in_place(&mut self, now: Timestamp, lease: std::time::Duration) -> bool {
        if self.status != CommandStatus::Running || self.is_lapsed(now) {
            return false;
        }
        let due = match self.lease_expires_at {
            None => true,
            Some(expires) => expires.since(now) < lease / 2,
        };
        if !due {
            return false;
        }
        self.lease_expires_at = Some(now.plus(lease));
        self.heard_at = Some(now);
        self.revision += 1;
        true
    }

    /// Records `progress` of the running execution `execution`. `Ok(false)`:
    /// the same report as the one recorded, nothing to write. Fenced by
    /// execution id; refused unless running, so progress never moves a run
    /// or revives a closed one.
    pub fn progress_in_place(
        &mut self,
        execution: &ExecutionId,
        progress: Progress,
        now: Timestamp,
    ) -> Result<bool, ProgressRefused> {
        let status = self.at(now).status;
        if status != CommandStatus::Running {
            return Err(ProgressRefused::NotRunning(status.as_str()));
        }
        if self.execution_id.as_ref() != Some(execution) {
            return Err(ProgressRefused::StaleExecution);
        }
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.same_report(&progress))
        {
            return Ok(false);
        }
        self.progress = Some(progress);
        self.revision += 1;
        Ok(true)
    }

    /// Closes a running command whose lease has lapsed at `now`: `failed`
    /// with a [`LEASE_LAPSED`] reason naming the last time the desktop was
    /// heard from, or `cancelled` if the agent asked to cancel. It ends at
    /// the instant the lease lapsed, so every look at it agrees. `false`:
    /// not running, or the lease has not lapsed.
    pub fn lapse_in_place(&mut self, now: Timestamp) -> bool {
        let Some(expired) = self.lease_expires_at.filter(|_| self.is_lapsed(now)) else {
            return false;
        };
        let why = self.lapse_reason();
        self.close_unreported(expired, why);
        true
    }

    /// When the executing desktop was last heard from, as text.
    fn last_heard(&self) -> String {
        self.heard_at
            .or(self.started_at)
            .map_or_else(|| "an unknown time".to_owned(), Timestamp::to_rfc3339)
    }

    /// Why a lapsed run ended.
    fn lapse_reason(&self) -> String {
        let expired = self
            .lease_expires_at
            .map_or_else(|| "an unknown time".to_owned(), Timestamp::to_rfc3339);
        format!(
            "{LEASE_LAPSED}: it was last heard from at {} and its lease lapsed at {expired}. The run may or may not have finished on the desktop; it is not run again.",
            self.last_heard()
        )
    }

    /// Closes a running command whose desktop announced, at `now`, that it
    /// restarted and is not running it. `false`: not running.
    pub fn close_after_restart_in_place(&mut self, now: Timestamp) -> bool {
        if self.status != CommandStatus::Running {
            return false;
        }
        if self.is_lapsed(now) {
            return self.lapse_in_place(now);
        }
        let what = format!(
            "{DESKTOP_RESTARTED}: it restarted at {} and was last heard from about this run at {}. The run may or may not have finished on the desktop; it is not run again.",
            now.to_rfc3339(),
            self.last_heard()
        );
        self.close_unreported(now, what);
        true
    }

    /// A running command ends without a report: `cancelled` if the agent
    /// asked, else `failed`; `what` says why.
    fn close_unreported(&mut self, at: Timestamp, what: String) {
        if self.cancel_requested {
            self.status = CommandStatus::Cancelled;
            self.reason = Some(format!("{CANCELLED_WHILE_RUNNING}. {what}"));
        } else {
            self.status = CommandStatus::Failed;
            self.reason = Some(what);
        }
        self.finished_at = Some(at);
        self.lease_expires_at = None;
        self.revision += 1;
    }

    /// [`CommandRecord::decline`] on this record; `Ok(false)` if already terminal.
    pub(crate) fn decline_in_place(&mut self, now: Timestamp) -> Result<bool, DeclineRefused> {
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Cancelled;
                self.finished_at = Some(now);
                self.reason = Some(NO_LONGER_SHARED.to_owned());
                self.revision += 1;
                Ok(true)
            }
            CommandStatus::Running => Err(DeclineRefused),
            _ => Ok(false),
        }
    }
}

/// A stable digest of what a run was asked to do, to tell a retry (same
/// digest) from a reused key with other arguments. Object keys are sorted
/// at every depth, so `{"a":1,"b":2}` and `{"b":2,"a":1}` are the same request.
///
/// The digest is SHA-256 (lowercase hex) of the session id, a newline, and
/// the canonical compact JSON of the arguments (keys sorted, serde_json's
/// escapes and number format). The text is fed to the hash as it is
/// produced, never built in memory. Stores keep these digests, so the
/// format never changes.
pub fn request_fingerprint(
    graph_session_id: &GraphSessionId,
    arguments: &Map<String, Value>,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(graph_session_id.as_str().as_bytes());
    hasher.update(b"\n");
    canonical_map(&mut hasher, arguments);
    let digest = hasher.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(digest.len() * 2);
    for b in digest {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    hex
}

/// Feeds text to a hash through `std::fmt::Write`, for number formatting.
struct HashText<'a>(&'a mut Sha256);

impl std::fmt::Write for HashText<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

fn canonical_map(out: &mut Sha256, map: &Map<String, Value>) {
    out.update(b"{");
    // serde_json's default map is ordered already; sort only if not.
    if map.keys().is_sorted() {
        for (i, (k, v)) in map.iter().enumerate() {
            canonical_entry(out, i, k, v);
        }
    } else {
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (i, (k, v)) in entries.into_iter().enumerate() {
            canonical_entry(out, i, k, v);
        }
    }
    out.update(b"}");
}

fn canonical_entry(out: &mut Sha256, index: usize, key: &str, value: &Value) {
    if index > 0 {
        out.update(b",");
    }
    canonical_string(out, key);
    out.update(b":");
    canonical_value(out, value);
}

fn canonical_value(out: &mut Sha256, value: &Value) {
    match value {
        Value::Object(map) => canonical_map(out, map),
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                canonical_value(out, item);
            }
            out.update(b"]");
        }
        Value::String(text) => canonical_string(out, text),
        Value::Null => out.update(b"null"),
        Value::Bool(true) => out.update(b"true"),
        Value::Bool(false) => out.update(b"false"),
        // Formatting into a hash cannot fail.
        Value::Number(n) => drop(std::fmt::Write::write_fmt(
            &mut HashText(out),
            format_args!("{n}"),
        )),
    }
}

/// A JSON string literal exactly as serde_json writes it: `"` and `\\`
/// escaped, `\b \f \n \r \t` short, other controls as `\u00xx`
/// (lowercase hex), everything else as is.
fn canonical_string(out: &mut Sha256, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.update(b"\"");
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.update(&bytes[start..i]);
        if short.is_empty() {
            out.update([
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0x0f)],
            ]);
        } else {
            out.update(short);
        }
        start = i + 1;
    }
    out.update(&bytes[start..]);
    out.update(b"\"");
}

#[cfg(test)]
mod tests {
    use super::*;

    // The decisions of a transition as values, for these tests only.

    /// What `cancel` decided.
    #[derive(Debug, Clone, PartialEq)]
    #[must_use]
    #[allow(clippy::large_enum_variant)] // returned once and moved into the store
    enum CancelDecision {
        /// Write this record: queued → cancelled, or the running flag set.
        Apply(CommandRecord),
        /// Nothing to write: already terminal or already flagged.
        Unchanged,
    }

    /// What `start` decided.
    #[derive(Debug, Clone, PartialEq)]
    #[must_use]
    #[allow(clippy::large_enum_variant)] // returned once and moved into the store
    enum StartDecision {
        /// Write this record: queued → running.
        Apply(CommandRecord),
        /// Already running under the same execution id: a retried start.
        AlreadyStarted,
    }

    /// What `complete` decided.
    #[derive(Debug, Clone, PartialEq)]
    #[must_use]
    #[allow(clippy::large_enum_variant)] // returned once and moved into the store
    enum CompleteDecision {
        /// Write this record: running → terminal.
        Apply(CommandRecord),
        /// The same completion was already applied: acknowledge, change nothing.
        Duplicate,
    }

    /// What `decline` decided.
    #[derive(Debug, Clone, PartialEq)]
    #[must_use]
    #[allow(clippy::large_enum_variant)] // returned once and moved into the store
    enum DeclineDecision {
        /// Write this record: queued → cancelled with [`NO_LONGER_SHARED`].
        Apply(CommandRecord),
        /// Already terminal: nothing to do.
        Unchanged,
    }

    impl CommandRecord {
        /// The agent asks to cancel. Queued: cancelled at once. Running: the flag
        /// is set for the relay's control poll. Terminal or already flagged: no change.
        fn cancel(&self, now: Timestamp) -> CancelDecision {
            let mut next = self.clone();
            if next.cancel_in_place(now) {
                CancelDecision::Apply(next)
            } else {
                CancelDecision::Unchanged
            }
        }

        /// The relay starts the command under `execution`.
        fn start(
            &self,
            execution: &ExecutionId,
            now: Timestamp,
            lease: std::time::Duration,
        ) -> Result<StartDecision, StartRefused> {
            let mut next = self.clone();
            Ok(if next.start_in_place(execution, now, lease)? {
                StartDecision::Apply(next)
            } else {
                StartDecision::AlreadyStarted
            })
        }

        /// The relay reports how the execution ended. Fenced by execution id: the
        /// first completion wins, an identical duplicate is acknowledged, anything
        /// else is refused. If the agent asked to cancel, the command ends
        /// `cancelled` whatever the relay reports.
        fn complete(
            &self,
            envelope: &ResultEnvelope,
            now: Timestamp,
        ) -> Result<CompleteDecision, CompleteRefused> {
            let mut next = self.clone();
            Ok(if next.complete_in_place(envelope, now)? {
                CompleteDecision::Apply(next)
            } else {
                CompleteDecision::Duplicate
            })
        }

        /// The relay's re-check just before running failed: close as cancelled
        /// with [`NO_LONGER_SHARED`].
        fn decline(&self, now: Timestamp) -> Result<DeclineDecision, DeclineRefused> {
            let mut next = self.clone();
            Ok(if next.decline_in_place(now)? {
                DeclineDecision::Apply(next)
            } else {
                DeclineDecision::Unchanged
            })
        }
    }
    use crate::envelope::EnvelopeBody;
    use serde_json::json;

    fn record() -> CommandRecord {
        CommandRecord::queued(
            CommandId::parse("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap(),
            AgentId::parse("agent").unwrap(),
            OwnerId::parse("owner").unwrap(),
            ProjectId::parse("proj").unwrap(),
            DeviceId::parse("desk").unwrap(),
            GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap(),
            Map::new(),
            IdempotencyKey::parse("key-0001").unwrap(),
            Timestamp(1000),
        )
    }

    fn exec(s: &str) -> ExecutionId {
        ExecutionId::parse(s).unwrap()
    }

    const LEASE: std::time::Duration = std::time::Duration::from_secs(60);

    #[test]
    fn a_lease_is_granted_renewed_by_half_and_lapses_into_failed() {
        let running = started();
        assert_eq!(running.lease_expires_at, Some(Timestamp(62_000)));
        assert_eq!(running.heard_at, Some(Timestamp(2000)));
        assert!(!running.is_lapsed(Timestamp(61_999)));
        assert!(running.is_lapsed(Timestamp(62_000)));
        // Renewal writes only once less than half the lease is left.
        let mut renewed = running.clone();
        assert!(!renewed.renew_in_place(Timestamp(30_000), LEASE));
        assert_eq!(renewed, running);
        assert!(renewed.renew_in_place(Timestamp(40_000), LEASE));
        assert_eq!(renewed.lease_expires_at, Some(Timestamp(100_000)));
        assert_eq!(renewed.heard_at, Some(Timestamp(40_000)));
        assert_eq!(renewed.revision, running.revision + 1);
        // A retried start is a contact too.
        let mut retried = running.clone();
        assert_eq!(
            retried.start_in_place(&exec("e1"), Timestamp(45_000), LEASE),
            Ok(true)
        );
        assert_eq!(retried.lease_expires_at, Some(Timestamp(105_000)));

        // A read after the lapse shows it closed, at the instant it lapsed.
        let seen = running.at(Timestamp(90_000)).into_owned();
        assert_eq!(seen.status, CommandStatus::Failed);
        assert_eq!(seen.finished_at, Some(Timestamp(62_000)));
        let reason = seen.reason.clone().unwrap_or_default();
        assert!(reason.starts_with(LEASE_LAPSED), "{reason}");
        assert!(
            reason.contains(&Timestamp(2000).to_rfc3339()),
            "names the last contact: {reason}"
        );
        assert!(seen.closed_without_report());
        // The write the sweep makes later is the same record.
        let mut swept = running.clone();
        assert!(swept.lapse_in_place(Timestamp(120_000)));
        assert_eq!(swept, seen);
        assert!(!swept.lapse_in_place(Timestamp(130_000)), "once");
        // Nothing renews, starts or completes a lapsed run.
        let mut late = running.clone();
        assert!(!late.renew_in_place(Timestamp(70_000), LEASE));
        let result = env("e1", FinishStatus::Completed, json!("late"));
        assert_eq!(
            running.complete(&result, Timestamp(70_000)),
            Err(CompleteRefused::Lapsed("failed"))
        );
        assert_eq!(
            swept.complete(&result, Timestamp(70_000)),
            Err(CompleteRefused::Lapsed("failed"))
        );
        assert_eq!(
            running.start(&exec("e1"), Timestamp(70_000), LEASE),
            Err(StartRefused::Finished("failed"))
        );
    }

    #[test]
    fn cancelling_a_lapsed_run_ends_it_cancelled_at_once() {
        let running = started();
        let CancelDecision::Apply(cancelled) = running.cancel(Timestamp(70_000)) else {
            panic!("a lapsed run is cancelled")
        };
        assert_eq!(cancelled.status, CommandStatus::Cancelled);
        assert_eq!(cancelled.finished_at, Some(Timestamp(70_000)));
        assert!(
            cancelled
                .reason
                .as_deref()
                .is_some_and(|r| r.contains(LEASE_LAPSED))
        );
        // Flagged before the lapse: the lapse ends it cancelled too.
        let CancelDecision::Apply(flagged) = running.cancel(Timestamp(10_000)) else {
            panic!("flag")
        };
        let ended = flagged.at(Timestamp(62_000)).into_owned();
        assert_eq!(ended.status, CommandStatus::Cancelled);
        assert_eq!(ended.finished_at, Some(Timestamp(62_000)));
        // A desktop that restarted closes what it no longer runs.
        let mut restarted = running.clone();
        assert!(restarted.close_after_restart_in_place(Timestamp(5000)));
        assert_eq!(restarted.status, CommandStatus::Failed);
        assert_eq!(restarted.finished_at, Some(Timestamp(5000)));
        assert!(
            restarted
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(DESKTOP_RESTARTED))
        );
        assert_eq!(
            restarted.complete(
                &env("e1", FinishStatus::Completed, json!(1)),
                Timestamp(6000)
            ),
            Err(CompleteRefused::Lapsed("failed"))
        );
        assert!(!record().close_after_restart_in_place(Timestamp(5000)));
    }

    fn env(e: &str, status: FinishStatus, result: Value) -> ResultEnvelope {
        ResultEnvelope::build(
            exec(e),
            status,
            EnvelopeBody {
                result,
                ..EnvelopeBody::default()
            },
        )
    }

    fn started() -> CommandRecord {
        match record().start(&exec("e1"), Timestamp(2000), LEASE).unwrap() {
            StartDecision::Apply(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cancel_queued_is_immediate_and_terminal() {
        let CancelDecision::Apply(c) = record().cancel(Timestamp(1500)) else {
            panic!()
        };
        assert_eq!(c.status, CommandStatus::Cancelled);
        assert_eq!(c.finished_at, Some(Timestamp(1500)));
        assert_eq!(c.revision, 1);
        assert_eq!(c.cancel(Timestamp(1600)), CancelDecision::Unchanged);
        assert_eq!(
            c.start(&exec("e1"), Timestamp(1700), LEASE),
            Err(StartRefused::Finished("cancelled"))
        );
    }

    #[test]
    fn cancel_running_sets_flag_and_wins_over_a_late_finish() {
        let CancelDecision::Apply(flagged) = started().cancel(Timestamp(3000)) else {
            panic!()
        };
        assert_eq!(flagged.status, CommandStatus::Running);
        assert!(flagged.cancel_requested);
        assert_eq!(flagged.cancel(Timestamp(3100)), CancelDecision::Unchanged);
        let late = env("e1", FinishStatus::Completed, json!("done"));
        let Ok(CompleteDecision::Apply(done)) = flagged.complete(&late, Timestamp(4000)) else {
            panic!()
        };
        assert_eq!(done.status, CommandStatus::Cancelled);
        assert_eq!(done.reason.as_deref(), Some(CANCELLED_WHILE_RUNNING));
    }

    #[test]
    fn completion_is_fenced_by_execution() {
        let running = started();
        assert_eq!(
            running.start(&exec("e1"), Timestamp(2100), LEASE),
            Ok(StartDecision::AlreadyStarted)
        );
        assert_eq!(
            running.start(&exec("e2"), Timestamp(2100), LEASE),
            Err(StartRefused::OtherExecution)
        );
        let other = env("e2", FinishStatus::Completed, json!(1));
        assert_eq!(
            running.complete(&other, Timestamp(3000)),
            Err(CompleteRefused::StaleExecution)
        );
        let first = env("e1", FinishStatus::Completed, json!(1));
        let Ok(CompleteDecision::Apply(done)) = running.complete(&first, Timestamp(3000)) else {
            panic!()
        };
        assert_eq!(done.status, CommandStatus::Completed);
        assert_eq!(
            done.complete(&first, Timestamp(3500)),
            Ok(CompleteDecision::Duplicate)
        );
        let different = env("e1", FinishStatus::Failed, json!(null));
        assert_eq!(
            done.complete(&different, Timestamp(3500)),
            Err(CompleteRefused::Conflict)
        );
        assert_eq!(
            done.complete(&other, Timestamp(3500)),
            Err(CompleteRefused::StaleExecution)
        );
        assert_eq!(
            record().complete(&first, Timestamp(3500)),
            Err(CompleteRefused::NotStarted)
        );
        // Closed before it ever started: said so, not "another execution".
        let CancelDecision::Apply(cancelled) = record().cancel(Timestamp(1)) else {
            panic!()
        };
        let refused = cancelled.complete(&first, Timestamp(3500));
        assert_eq!(
            refused,
            Err(CompleteRefused::ClosedBeforeStart("cancelled"))
        );
        let text = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("cancelled before it started"), "{text}");
    }

    #[test]
    fn decline_closes_queued_with_the_exact_message() {
        let Ok(DeclineDecision::Apply(d)) = record().decline(Timestamp(5000)) else {
            panic!()
        };
        assert_eq!(d.status, CommandStatus::Cancelled);
        assert_eq!(
            d.reason.as_deref(),
            Some("Graph session is no longer shared with this project")
        );
        assert_eq!(d.decline(Timestamp(5001)), Ok(DeclineDecision::Unchanged));
        assert_eq!(started().decline(Timestamp(5001)), Err(DeclineRefused));
    }

    #[test]
    fn terminal_states_never_change() {
        let CancelDecision::Apply(cancelled) = record().cancel(Timestamp(1)) else {
            panic!()
        };
        let Ok(CompleteDecision::Apply(completed)) =
            started().complete(&env("e1", FinishStatus::Completed, json!(1)), Timestamp(3))
        else {
            panic!()
        };
        for t in [cancelled, completed] {
            assert_eq!(t.cancel(Timestamp(9)), CancelDecision::Unchanged);
            assert!(t.start(&exec("e9"), Timestamp(9), LEASE).is_err());
            assert!(matches!(
                t.decline(Timestamp(9)),
                Ok(DeclineDecision::Unchanged)
            ));
            assert!(!matches!(
                t.complete(&env("e9", FinishStatus::Failed, json!(0)), Timestamp(9)),
                Ok(CompleteDecision::Apply(_))
            ));
        }
    }

    /// The first implementation: the canonical text built in memory with
    /// serde_json's own string writer, then hashed. Digests already stored
    /// must stay valid, so the streaming version must agree with it.
    fn reference_fingerprint(gs: &GraphSessionId, arguments: &Map<String, Value>) -> String {
        fn value(out: &mut String, v: &Value) {
            match v {
                Value::Object(map) => {
                    let mut keys: Vec<&String> = map.keys().collect();
                    keys.sort_unstable();
                    out.push('{');
                    for (i, k) in keys.into_iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::to_string(k).unwrap());
                        out.push(':');
                        value(out, &map[k]);
                    }
                    out.push('}');
                }
                Value::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        value(out, item);
                    }
                    out.push(']');
                }
                Value::String(t) => out.push_str(&serde_json::to_string(t).unwrap()),
                scalar => out.push_str(&scalar.to_string()),
            }
        }
        let mut text = format!("{}\n", gs.as_str());
        value(&mut text, &Value::Object(arguments.clone()));
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn streaming_fingerprint_equals_the_stored_format() {
        let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
        let mut every_byte = String::new();
        for c in 0u8..0x80 {
            every_byte.push(char::from(c));
        }
        let samples = [
            json!({}),
            json!({"n": 1}),
            json!({"b": 2, "a": [1, -2.5, 1e300, 0.1, null, true, false]}),
            json!({"text": every_byte, "日本": "😀 \u{7f} \u{2028}", "": {"z": {}, "y": []}}),
            json!({"deep": {"b": {"d": 1, "c": 2}, "a": [{"y": 1, "x": 2}]}, "u64": u64::MAX, "i64": i64::MIN}),
        ];
        for sample in samples {
            let Value::Object(map) = sample else { panic!() };
            assert_eq!(
                request_fingerprint(&gs, &map),
                reference_fingerprint(&gs, &map),
                "{map:?}"
            );
        }
    }

    #[test]
    fn overwrite_with_makes_records_equal() {
        // A later revision of the same command: the cheap path.
        let mut stored = record();
        let running = started();
        stored.overwrite_with(&running);
        assert_eq!(stored, running);
        let Ok(CompleteDecision::Apply(done)) = running.complete(
            &env("e1", FinishStatus::Completed, json!({"ok": 1})),
            Timestamp(3000),
        ) else {
            panic!()
        };
        stored.overwrite_with(&done);
        assert_eq!(stored, done);
        // A different request (other arguments): everything is copied.
        let mut other = record();
        other.arguments = std::sync::Arc::new(Map::from_iter([("x".to_owned(), json!(1))]));
        other.revision = 9;
        stored.overwrite_with(&other);
        assert_eq!(stored, other);
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[\\x00-\\x1f\"\\\\a-z\u{7f}\u{2028}é😀]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec(("[a-z\\x00-\\x1f\"é]{0,6}", inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn streaming_fingerprint_equals_the_reference_for_any_arguments(
            entries in proptest::collection::vec(("[a-z\\x00-\\x1f\"é]{0,6}", json_value()), 0..6)
        ) {
            let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
            let map: Map<String, Value> = entries.into_iter().collect();
            proptest::prop_assert_eq!(
                request_fingerprint(&gs, &map),
                reference_fingerprint(&gs, &map)
            );
        }
    }

    #[test]
    fn fingerprint_ignores_key_order_only() {
        let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
        let a: Map<String, Value> =
            serde_json::from_str(r#"{"a":1,"b":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Map<String, Value> =
            serde_json::from_str(r#"{"b":{"x":"s","y":[1,2]},"a":1}"#).unwrap();
        let c: Map<String, Value> =
            serde_json::from_str(r#"{"a":1,"b":{"y":[2,1],"x":"s"}}"#).unwrap();
        assert_eq!(request_fingerprint(&gs, &a), request_fingerprint(&gs, &b));
        assert_ne!(request_fingerprint(&gs, &a), request_fingerprint(&gs, &c));
        assert_eq!(request_fingerprint(&gs, &a).len(), 64);
    }
}
