//! The persistence boundary.
//!
//! A [`Store`] keeps commands, idempotency keys, shared sessions and device
//! liveness. It decides nothing: the [`Queue`](crate::queue::Queue) computes
//! every transition and asks the store to write it with
//! [`Store::update_command`], a compare-and-swap on the record's revision.
//! Look-ups of commands are keyed by ((owner, agent), command) or
//! ((owner, device), command), so "not yours" and "does not exist" are one
//! code path. A name alone is never an identity: two owners may both have
//! an agent called `assistant` or a desktop called `desktop`, and every
//! method that finds something for an agent or a device matches the owner
//! too.
//!
//! Implementations must pass the conformance suite in
//! `graph_relay_core::testkit` (feature `testkit`) unchanged.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::command::CommandRecord;
use crate::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::session::{SessionMeta, SharedSession};
use crate::time::Timestamp;

mod layer;
pub use layer::{LayeredStore, StoreLayer};

/// A failure of the storage backend. Nothing about the command is decided by it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or refused the operation.
    #[error("store backend error: {0}")]
    Backend(String),
    /// Stored data could not be read back.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

/// A live idempotency key: (owner, agent, key) → the command it created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The owner of the agent that used the key.
    pub owner: OwnerId,
    /// The agent that used the key; keys are scoped per (owner, agent).
    pub agent: AgentId,
    /// The key.
    pub key: IdempotencyKey,
    /// The command created under it.
    pub command: CommandId,
    /// Digest of the session and arguments of that first request.
    pub fingerprint: String,
    /// After this instant the key is forgotten and may be reused.
    pub expires_at: Timestamp,
}

/// Result of [`Store::insert_command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The command and its key were written.
    Inserted,
    /// A live key with the same (owner, agent, key) exists; nothing was written.
    KeyTaken(IdempotencyRecord),
}

/// Result of [`Store::record_sync_within`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundedSync {
    /// The sync was recorded.
    Recorded,
    /// The sync would have shared the device into one project more than
    /// allowed; nothing was written.
    TooManyProjects,
}

/// Result of [`Store::insert_command_if_shared`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardedInsert {
    /// The session still names the command's project, device and slug, and
    /// the insert went as [`Store::insert_command`] says.
    Checked(InsertOutcome),
    /// The session no longer names them (un-shared, shared elsewhere first,
    /// or shared again under another slug); nothing was written.
    SessionChanged,
}

impl GuardedInsert {
    /// The outcome of an insert a store ran without the share check, for
    /// a store that runs both kinds through one path: such an insert never
    /// finds its share changed, and one that says so is reported as a
    /// backend failure rather than taken as an outcome.
    pub fn unguarded(self) -> Result<InsertOutcome, StoreError> {
        match self {
            Self::Checked(outcome) => Ok(outcome),
            Self::SessionChanged => Err(StoreError::Backend(
                "an insert without a share check was refused for its share".into(),
            )),
        }
    }
}

/// Whether `shared`, what [`Store::find_shared_session`] answers for a
/// command's session, names the project, device and slug `command` was
/// built with: the check of [`Store::insert_command_if_shared`].
pub fn shared_as_built(shared: &SharedSession, command: &CommandRecord) -> bool {
    shared.project == command.project
        && shared.device == command.device
        && shared.meta.slug == command.slug
}

/// A desktop's latest contact other than a sync, as
/// [`Store::touch_devices`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTouch {
    /// Its owner.
    pub owner: OwnerId,
    /// The desktop.
    pub device: DeviceId,
    /// When it was last seen.
    pub at: Timestamp,
}

/// What the server knows of a desktop's liveness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// The desktop.
    pub device: DeviceId,
    /// Its owner.
    pub owner: OwnerId,
    /// The last sync request.
    pub last_sync_at: Option<Timestamp>,
    /// The last request of any kind.
    pub last_seen_at: Timestamp,
    /// Whether the desktop long-polls: it sent a held sync and, since,
    /// only syncs that keep the mode (see
    /// [`Queue::sync`](crate::queue::Queue::sync)); what the last sync's
    /// [`DeviceContact::Sync`] recorded.
    pub long_poll: bool,
}

impl DeviceRecord {
    /// What [`Store::touch_device`] makes of this record: `contact` at
    /// `now` (times never move back; a sync also sets the mode).
    pub fn record_contact(&mut self, contact: DeviceContact, now: Timestamp) {
        self.last_seen_at = self.last_seen_at.max(now);
        if let DeviceContact::Sync { long_poll } = contact {
            self.last_sync_at = Some(self.last_sync_at.map_or(now, |t| t.max(now)));
            self.long_poll = long_poll;
        }
    }
}

/// How a device was just seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceContact {
    /// A sync request (long-poll or not).
    Sync {
        /// The desktop long-polls: this sync was held, or it is one of the
        /// unheld syncs of a long-polling relay's pass.
        long_poll: bool,
    },
    /// Any other request (start, control, complete).
    Other,
}

/// One bounded pruning step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneRequest {
    /// Idempotency keys with `expires_at <= now` are deleted.
    pub now: Timestamp,
    /// Terminal commands with `finished_at <= terminal_before` are deleted,
    /// unless a live idempotency key still points at them. `None` keeps them.
    pub terminal_before: Option<Timestamp>,
    /// At most this many keys and at most this many commands per call.
    pub batch: usize,
}

/// What a pruning step removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneReport {
    /// Idempotency keys deleted.
    pub keys: usize,
    /// Terminal commands deleted.
    pub commands: usize,
}

/// How a process learns of writes that *other* processes make to the same
/// store, so that requests it holds see them (see [`crate::hold`]).
///
/// The [`Queue`](crate::queue::Queue) wakes its own held requests after
/// each of its own writes. Writes by another process reach them in one of
/// three ways, and the cheaper the way, the less a held request has to
/// look at the store while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExternalWrites {
    /// No other process can write to this store (it lives in this
    /// process's memory): held requests never need to look again on their
    /// own.
    None,
    /// [`Store::external_write_marker`] changes whenever another process
    /// committed a write. [`Queue::maintain`](crate::queue::Queue::maintain)
    /// reads it once per call and wakes every held request when it moved,
    /// so a held request does not look again on its own.
    Marker,
    /// Only a fresh read shows them: every held request looks again every
    /// [`QueueConfig::hold_recheck`](crate::queue::QueueConfig::hold_recheck)
    /// (or `wait_recheck`), unless a signal [`Forwarder`](crate::signals::Forwarder)
    /// installed on the queue's signals [delivers](crate::signals::Forwarder::delivers)
    /// other processes' notifications.
    Poll,
}

/// Durable state of the queue. See the module docs for the contract.
///
/// Three implementations ship (`graph-relay-store-memory`, `-sqlite`,
/// `-postgres`); a new one, or a wrapper around one, proves itself with the
/// store conformance suite (feature `testkit`):
/// `graph_relay_core::store_conformance_suite!(block_on, async { fresh_store() })`
/// in a test file generates one test per scenario of the contract
/// (`store-sqlite/tests/conformance.rs` runs it on a wrapper of
/// `SqliteStore` that owns its temporary file).
///
/// The queue uses a store only through this trait:
///
/// ```
/// use std::sync::Arc;
/// use graph_relay_core::prelude::*;
///
/// fn queue_on(store: Arc<dyn Store>) -> Queue {
///     Queue::new(store, Arc::new(SystemClock), Arc::new(RandomIds), QueueConfig::default())
/// }
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// The live (unexpired at `now`) idempotency key for (owner, agent, key), if any.
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// Atomically writes `command` and `key` unless a live key for the same
    /// (owner, agent, key) exists, in which case nothing is written and that
    /// key is returned. An expired key for the same triple is replaced.
    /// Concurrent calls with the same (owner, agent, key) insert exactly one
    /// command. `key.owner` and `key.agent` are `command.owner` and
    /// `command.agent`.
    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError>;

    /// [`insert_command`](Self::insert_command), but only if
    /// [`find_shared_session`](Self::find_shared_session)`(command.owner,
    /// projects, command.graph_session_id)` still answers a session that
    /// names `command`'s project, device and slug ([`shared_as_built`]);
    /// otherwise nothing is written and [`GuardedInsert::SessionChanged`]
    /// is returned. A live key may be answered
    /// [`KeyTaken`](InsertOutcome::KeyTaken) whether or not the share
    /// changed: the queue answers a retry from its key either way.
    ///
    /// The queue calls it when it built `command` on a share it guessed
    /// (the session's share for an earlier run, or the one a sync uploaded
    /// it to), to skip the look-up. The default looks the
    /// session up and then inserts: two calls, as many as a fresh look-up
    /// costs, and the same race with a concurrent un-share. A store that can
    /// check and insert in one statement (the Postgres store does) saves
    /// a round trip per run by overriding it.
    async fn insert_command_if_shared(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        projects: &[ProjectId],
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        let shared = self
            .find_shared_session(&command.owner, projects, &command.graph_session_id)
            .await?;
        if !shared.is_some_and(|shared| shared_as_built(&shared, command)) {
            return Ok(GuardedInsert::SessionChanged);
        }
        Ok(GuardedInsert::Checked(
            self.insert_command(command, key, now).await?,
        ))
    }

    /// The command `id` if `agent` of `owner` queued it.
    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError>;

    /// The command `id` if it is assigned to `device` of `owner`.
    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError>;

    /// The command `id` of `owner`, whoever queued or runs it: for the
    /// server's own maintenance (the lease sweep), never for a request.
    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError>;

    /// Running commands assigned to `device` of `owner`, at most `limit`, in
    /// any order.
    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError>;

    /// Running commands whose lease lapsed at `now` (`lease_expires_at <=
    /// now`) or that have no lease, oldest lease first, at most `limit`.
    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError>;

    /// Replaces the stored command with `next` if its stored revision is
    /// `next.revision - 1`. Returns `false` (and writes nothing) otherwise,
    /// or if the command does not exist.
    ///
    /// Every change of a stored command raises its revision: a queue tries
    /// this swap on its own copy of the command without reading it first
    /// (see [`Queue`](crate::queue::Queue)), so a change that kept the
    /// revision would be overwritten.
    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError>;

    /// Queued commands of (owner, project) assigned to `device`, oldest
    /// first: by `created_at`, then in the order they were inserted (so runs
    /// queued within the same millisecond keep their order); at most `limit`.
    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError>;

    /// Replaces the sessions `device` shares to (owner, project) with
    /// `sessions`, stamped `now`. Other devices' sessions are untouched.
    async fn replace_shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Records a sync of `device` of `owner` at `now`: afterwards the store
    /// is as if [`Store::replace_shared_sessions`] had replaced its sessions
    /// shared to (owner, project) with `sessions` and then
    /// [`Store::touch_device`] had recorded the contact
    /// [`DeviceContact::Sync`] with `long_poll`, both at `now`. This is what
    /// [`Queue::sync`](crate::queue::Queue::sync) writes.
    ///
    /// The default calls those two methods. A store where each call is a
    /// round trip should override it: most syncs repeat what the device
    /// shared last time (a long-polling desktop re-syncs after every hold),
    /// and such a sync only needs the stamps moved, which one statement can
    /// do after comparing `sessions` with what is stored. What is stored
    /// is the reference, not what this process wrote last: another process
    /// on the same store may have written this device's sessions since.
    async fn record_sync(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        long_poll: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.replace_shared_sessions(owner, project, device, sessions, now)
            .await?;
        self.touch_device(owner, device, DeviceContact::Sync { long_poll }, now)
            .await
    }

    /// [`record_sync`](Self::record_sync), unless the sync would make
    /// `device` share into more than `max_projects` projects of `owner`:
    /// `sessions` is not empty, `device` shares nothing to `project` yet,
    /// and it shares into `max_projects` other projects already. Then
    /// nothing is written and [`BoundedSync::TooManyProjects`] is returned.
    /// An empty list (un-sharing) is always recorded.
    ///
    /// The default asks [`shared_projects`](Self::shared_projects), then
    /// records: two calls, between which another process may share this
    /// device into one more project. A store that can check inside the
    /// write (the SQLite store does, and only when the device shares
    /// nothing to `project` yet) saves a read per sync by overriding it.
    #[allow(clippy::too_many_arguments)]
    async fn record_sync_within(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        long_poll: bool,
        max_projects: usize,
        now: Timestamp,
    ) -> Result<BoundedSync, StoreError> {
        if !sessions.is_empty() {
            let shared = self
                .shared_projects(owner, device, max_projects.saturating_add(1))
                .await?;
            if shared.len() >= max_projects && !shared.contains(project) {
                return Ok(BoundedSync::TooManyProjects);
            }
        }
        self.record_sync(owner, project, device, sessions, long_poll, now)
            .await?;
        Ok(BoundedSync::Recorded)
    }

    /// The projects of `owner` that `device` currently shares at least one
    /// session to, in ascending order; at most `limit`.
    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError>;

    /// Sessions shared to (owner, project) by any device, ordered by
    /// graph session id, then device; at most `limit`.
    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError>;

    /// The session `id` shared to one of `projects` of `owner`: the first
    /// project in `projects` order that has it; within a project, the
    /// smallest device id.
    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError>;

    /// Records that `device` of `owner` was seen at `now`.
    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Records several desktops' contacts other than syncs at once: for
    /// each, what [`Store::touch_device`] with [`DeviceContact::Other`]
    /// records. The queue gathers its desktops' contacts and writes them
    /// this way about once a second ([`Queue::maintain`](crate::queue::Queue::maintain)),
    /// so a durable store should write them together (one transaction, one
    /// statement) rather than one by one, as this default does. Each
    /// (owner, device) appears at most once.
    async fn touch_devices(&self, contacts: &[DeviceTouch]) -> Result<(), StoreError> {
        for contact in contacts {
            self.touch_device(
                &contact.owner,
                &contact.device,
                DeviceContact::Other,
                contact.at,
            )
            .await?;
        }
        Ok(())
    }

    /// Liveness of `device` of `owner`, if it was ever seen.
    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError>;

    /// Deletes expired keys and old terminal commands, each at most `batch`.
    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError>;

    /// How this process learns of other processes' writes to this store.
    /// The default, [`ExternalWrites::Poll`], is always correct; a wrapper
    /// around another store should forward both this and
    /// [`Store::external_write_marker`].
    fn external_writes(&self) -> ExternalWrites {
        ExternalWrites::Poll
    }

    /// Under [`ExternalWrites::Marker`]: a value that changes whenever
    /// another process committed a write since the last call (and never
    /// because of this store's own writes). Other stores answer a constant.
    async fn external_write_marker(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unguarded_insert_takes_its_outcome_and_reports_a_changed_share_as_a_failure() {
        assert!(matches!(
            GuardedInsert::Checked(InsertOutcome::Inserted).unguarded(),
            Ok(InsertOutcome::Inserted)
        ));
        assert!(matches!(
            GuardedInsert::SessionChanged.unguarded(),
            Err(StoreError::Backend(_))
        ));
    }
}
