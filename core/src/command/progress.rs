//! What a running Graph says about how far it got.

use serde::{Deserialize, Serialize};

use crate::limits::MAX_PROGRESS_MESSAGE;
use crate::time::Timestamp;

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
