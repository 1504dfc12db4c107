//! Why a transition was refused: nothing changed.

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
