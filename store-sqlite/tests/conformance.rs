//! The core's store and outbox conformance suites, run unchanged against
//! `SqliteStore` and `SqliteOutbox`, each on a fresh file in its own
//! temporary directory.

use async_trait::async_trait;
use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use graph_relay_core::outbox::{Outbox, OutboxError, OutboxItem};
use graph_relay_core::session::{SessionMeta, SharedSession};
use graph_relay_core::store::{
    BoundedSync, DeviceContact, DeviceRecord, DeviceTouch, ExternalWrites, GuardedInsert,
    IdempotencyRecord, InsertOutcome, PruneReport, PruneRequest, Store, StoreError,
};
use graph_relay_core::time::Timestamp;
use graph_relay_store_sqlite::{SqliteOutbox, SqliteStore};

/// A store or outbox on a file in a temporary directory that is removed
/// after the store is closed (fields drop in order).
struct OnTempFile<T> {
    inner: T,
    _dir: tempfile::TempDir,
}

impl OnTempFile<SqliteStore> {
    fn store() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner = SqliteStore::open(dir.path().join("store.sqlite")).expect("open a fresh store");
        Self { inner, _dir: dir }
    }
}

impl OnTempFile<SqliteOutbox> {
    fn outbox() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner =
            SqliteOutbox::open(dir.path().join("outbox.sqlite")).expect("open a fresh outbox");
        Self { inner, _dir: dir }
    }
}

graph_relay_core::store_conformance_suite!(futures::executor::block_on, async {
    OnTempFile::store()
});

mod outbox {
    graph_relay_core::outbox_conformance_suite!(futures::executor::block_on, async {
        super::OnTempFile::outbox()
    });
}

#[async_trait]
impl Store for OnTempFile<SqliteStore> {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.idempotency(owner, agent, key, now).await
    }
    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        self.inner.insert_command(command, key, now).await
    }
    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.inner.command_for_agent(owner, agent, id).await
    }
    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.inner.command_for_device(owner, device, id).await
    }
    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.inner.command_for_owner(owner, id).await
    }
    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.inner.running_commands(owner, device, limit).await
    }
    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.inner.lapsed_commands(now, limit).await
    }
    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        self.inner.update_command(next).await
    }
    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.inner
            .queued_commands(owner, project, device, limit)
            .await
    }
    async fn replace_shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner
            .replace_shared_sessions(owner, project, device, sessions, now)
            .await
    }
    // The store's own syncs and guarded inserts, not the trait's defaults:
    // the suite checks what the SQLite store does.
    async fn record_sync(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        long_poll: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner
            .record_sync(owner, project, device, sessions, long_poll, now)
            .await
    }
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
        self.inner
            .record_sync_within(
                owner,
                project,
                device,
                sessions,
                long_poll,
                max_projects,
                now,
            )
            .await
    }
    async fn insert_command_if_shared(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        projects: &[ProjectId],
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        self.inner
            .insert_command_if_shared(command, key, projects, now)
            .await
    }
    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        self.inner.shared_projects(owner, device, limit).await
    }
    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        self.inner.shared_sessions(owner, project, limit).await
    }
    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        self.inner.find_shared_session(owner, projects, id).await
    }
    async fn touch_devices(&self, contacts: &[DeviceTouch]) -> Result<(), StoreError> {
        self.inner.touch_devices(contacts).await
    }
    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.touch_device(owner, device, contact, now).await
    }
    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        self.inner.device(owner, device).await
    }
    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        self.inner.prune(request).await
    }
    fn external_writes(&self) -> ExternalWrites {
        self.inner.external_writes()
    }
    async fn external_write_marker(&self) -> Result<u64, StoreError> {
        self.inner.external_write_marker().await
    }
}

#[async_trait]
impl Outbox for OnTempFile<SqliteOutbox> {
    async fn put(&self, item: &OutboxItem) -> Result<(), OutboxError> {
        self.inner.put(item).await
    }
    async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError> {
        self.inner.pending().await
    }
    async fn record_attempt(&self, command: &CommandId) -> Result<(), OutboxError> {
        self.inner.record_attempt(command).await
    }
    async fn remove(&self, command: &CommandId) -> Result<(), OutboxError> {
        self.inner.remove(command).await
    }
}
