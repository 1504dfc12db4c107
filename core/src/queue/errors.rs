//! What each queue operation can fail with, and the one rule of which
//! failures are worth retrying.
//!
//! Every operation has its own enum, so a caller matches only the cases
//! it can meet. The texts an agent reads for something it cannot reach
//! are constants: "does not exist" and "not yours" are the same bytes.

use crate::command::{
    CompleteRefused, DeclineRefused, InvalidProgress, ProgressRefused, StartRefused,
};
use crate::envelope::EnvelopeError;
use crate::ids::{CommandId, GraphSessionId};
use crate::limits::MAX_SESSIONS_PER_SYNC;
use crate::session::InvalidSession;
use crate::store::StoreError;

#[cfg(doc)]
use super::{Queue, QueueConfig};

/// What an agent reads for a run that does not exist or is not its own.
pub const RUN_NOT_FOUND: &str = "Graph run not found or access removed";
/// What an agent reads for a session it cannot reach.
pub const SESSION_NOT_FOUND: &str = "Graph session not found or access removed";
/// What an agent reads for a project it is not connected to.
pub const PROJECT_NOT_FOUND: &str = "Project not found or access removed";

/// Why `run_graph_session` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The session is not shared to any project the agent reaches.
    #[error("{SESSION_NOT_FOUND}")]
    SessionNotFound,
    /// The key was already used by this agent for a different request.
    #[error(
        "idempotency_key was already used for a different request (command {command}); use a new key for a new run"
    )]
    KeyReused {
        /// The command the key belongs to.
        command: CommandId,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `get_graph_run` failed.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// Unknown, or not this agent's.
    #[error("{RUN_NOT_FOUND}")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `cancel_graph_run` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// Unknown, or not this agent's.
    #[error("{RUN_NOT_FOUND}")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `list_graph_sessions` failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The agent is not connected to the project.
    #[error("{PROJECT_NOT_FOUND}")]
    ProjectNotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a relay's sync was refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// More than [`MAX_SESSIONS_PER_SYNC`] sessions.
    #[error("a sync may carry at most {MAX_SESSIONS_PER_SYNC} sessions per project; got {0}")]
    TooManySessions(usize),
    /// The same session listed twice.
    #[error("session {0} is listed more than once")]
    DuplicateSession(GraphSessionId),
    /// The device already shares into as many projects as it may.
    #[error(
        "a device may share sessions into at most {limit} projects and this one would be one more; un-share a project first (sync it with no sessions)"
    )]
    TooManyProjects {
        /// [`QueueConfig::max_projects_per_device`].
        limit: usize,
    },
    /// A session's metadata breaks a rule.
    #[error(transparent)]
    InvalidSession(#[from] InvalidSession),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `start` failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The state machine refused (e.g. it was cancelled: it must not run).
    #[error(transparent)]
    Refused(#[from] StartRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `control` failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `complete` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The envelope breaks SPEC §7.
    #[error(transparent)]
    Invalid(#[from] EnvelopeError),
    /// The state machine refused (stale execution, conflict, not started).
    #[error(transparent)]
    Refused(#[from] CompleteRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a progress report was not taken. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The report breaks a rule (message length, percentage).
    #[error(transparent)]
    Invalid(#[from] InvalidProgress),
    /// Not running, or another execution.
    #[error(transparent)]
    Refused(#[from] ProgressRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `decline` failed.
#[derive(Debug, thiserror::Error)]
pub enum DeclineError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// Already running.
    #[error(transparent)]
    Refused(#[from] DeclineRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why [`Queue::ready`] says the queue cannot serve now.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// [`Queue::shut_down`] was called.
    #[error("shutting down")]
    ShuttingDown,
    /// The store did not answer.
    #[error("the queue's store cannot be reached: {0}")]
    Store(#[from] StoreError),
}

/// Whether trying the same operation again can succeed: only a store
/// failure is passing; every other refusal is final for that request.
macro_rules! retryable_when_the_store_failed {
    ($($error:ident),* $(,)?) => {
        $(
            impl $error {
                /// True when the same request may succeed later (the store
                /// failed); false when it never can (the request itself is
                /// refused). Relays and transports map this to `retryable`.
                pub fn is_retryable(&self) -> bool {
                    matches!(self, Self::Store(_))
                }
            }
        )*
    };
}

retryable_when_the_store_failed!(
    RunError,
    GetError,
    CancelError,
    ListError,
    SyncError,
    StartError,
    ControlError,
    CompleteError,
    ProgressError,
    DeclineError,
);
