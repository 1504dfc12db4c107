//! The relay's durable outbox (SPEC §6).
//!
//! Every report a relay owes the server (a completion, or a command closed
//! by the consent re-check) is written to the outbox **before** it is sent
//! and removed only after the server acknowledged it with a 2xx, or answered
//! that it can never take it. A lost POST is therefore re-sent on the next
//! pass, and a relay killed between finishing a run and reporting it
//! delivers the result after a restart.
//!
//! The outbox also remembers the projects the relay has synced, so that a
//! project the owner withdrew (even while the relay was down) is synced once
//! with an empty list, which ends its shares on the server.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::envelope::ResultEnvelope;
use crate::ids::{CommandId, ProjectId};
use crate::time::Timestamp;

/// What the relay owes the server about one command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RelayReport {
    /// The run ended: post this envelope.
    Completion {
        /// The bounded result.
        envelope: ResultEnvelope,
    },
    /// The re-check before running failed: close the command as cancelled
    /// with "Graph session is no longer shared with this project".
    Declined,
}

/// One pending report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxItem {
    /// The command the report is about. At most one item per command.
    pub command: CommandId,
    /// The report.
    pub report: RelayReport,
    /// When it was first stored.
    pub stored_at: Timestamp,
    /// How many times sending it failed so far.
    pub attempts: u32,
}

/// The outbox could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The backend failed (disk full, file locked, …).
    #[error("outbox backend error: {0}")]
    Backend(String),
    /// A stored item could not be decoded.
    #[error("outbox item is corrupt: {0}")]
    Corrupt(String),
}

/// Durable storage of pending reports on the desktop.
///
/// An implementation keeps at most one item per command and must not lose
/// an item it acknowledged ([`Outbox::put`] returns once it is durable);
/// the project methods have defaults for outboxes that do not remember
/// projects. `graph-relay-store-sqlite` has the durable one; the
/// `outbox_conformance_suite!` (feature
/// `testkit`) checks any other. A minimal one in memory (not durable, so
/// only for tests):
///
/// ```
/// use std::sync::Mutex;
/// use graph_relay_core::ids::CommandId;
/// use graph_relay_core::outbox::{Outbox, OutboxError, OutboxItem};
///
/// #[derive(Default)]
/// struct InMemory(Mutex<Vec<OutboxItem>>);
///
/// #[async_trait::async_trait]
/// impl Outbox for InMemory {
///     async fn put(&self, item: &OutboxItem) -> Result<(), OutboxError> {
///         let mut items = self.0.lock().unwrap();
///         items.retain(|i| i.command != item.command);
///         items.push(item.clone());
///         Ok(())
///     }
///     async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError> {
///         Ok(self.0.lock().unwrap().clone())
///     }
///     async fn record_attempt(&self, command: &CommandId) -> Result<(), OutboxError> {
///         for item in self.0.lock().unwrap().iter_mut().filter(|i| i.command == *command) {
///             item.attempts += 1;
///         }
///         Ok(())
///     }
///     async fn remove(&self, command: &CommandId) -> Result<(), OutboxError> {
///         self.0.lock().unwrap().retain(|i| i.command != *command);
///         Ok(())
///     }
/// }
///
/// let outbox = InMemory::default();
/// assert!(futures::executor::block_on(outbox.pending()).unwrap().is_empty());
/// ```
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Stores `item`, replacing any item for the same command. Returns only
    /// once the item is durable (committed to disk for durable outboxes).
    async fn put(&self, item: &OutboxItem) -> Result<(), OutboxError>;

    /// All pending items, oldest `stored_at` first (then by command id).
    async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError>;

    /// Records one more failed attempt for `command`'s item, if present.
    async fn record_attempt(&self, command: &CommandId) -> Result<(), OutboxError>;

    /// Deletes the item for `command` (acknowledged, or refused for good).
    /// Removing an absent item is not an error.
    async fn remove(&self, command: &CommandId) -> Result<(), OutboxError>;

    /// The projects recorded with [`Outbox::remember_project`] and not
    /// forgotten since, in order. The relay reads them once, when it starts.
    ///
    /// The defaults of this method and the next two keep nothing: right for
    /// an outbox that does not outlive the process, since the relay itself
    /// remembers its projects while it runs. A durable outbox keeps them, so
    /// that a project withdrawn while the relay was down is still emptied.
    async fn synced_projects(&self) -> Result<Vec<ProjectId>, OutboxError> {
        Ok(Vec::new())
    }

    /// Records durably that the relay syncs `project` (the server may hold
    /// its shares there). Recording a project twice is not an error.
    async fn remember_project(&self, project: &ProjectId) -> Result<(), OutboxError> {
        let _ = project;
        Ok(())
    }

    /// Forgets `project`: the server holds no shares of the relay there any
    /// more. Forgetting an unknown project is not an error.
    async fn forget_project(&self, project: &ProjectId) -> Result<(), OutboxError> {
        let _ = project;
        Ok(())
    }
}
