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

use crate::envelope::{FinishStatus, ResultEnvelope};
use crate::ids::{
    AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::time::Timestamp;

mod fingerprint;
mod json;
mod progress;
mod refusals;
mod split;
#[cfg(test)]
mod tests;
mod transitions;

pub use self::fingerprint::request_fingerprint;
pub use self::progress::{InvalidProgress, Progress, ProgressRefused};
pub use self::refusals::{CompleteRefused, DeclineRefused, StartRefused};
pub use self::split::RecordHead;

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
}
