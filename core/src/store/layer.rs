//! A store wrapped by something done around each of its calls: timing
//! them (the metrics' store histograms), or failing them on purpose (the
//! outage tests). The wrapper forwards every [`Store`] method through one
//! [`StoreLayer::around`], so a layer is written once, not per method.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;

use super::*;

/// What a [`LayeredStore`] does around each call of the store it wraps.
///
/// ```
/// use futures::future::BoxFuture;
/// use graph_relay_core::store::{StoreError, StoreLayer};
///
/// /// Prints each operation's name.
/// struct Trace;
///
/// impl StoreLayer for Trace {
///     fn around<'a, T: Send + 'a>(
///         &'a self,
///         operation: &'static str,
///         call: BoxFuture<'a, Result<T, StoreError>>,
///     ) -> BoxFuture<'a, Result<T, StoreError>> {
///         Box::pin(async move {
///             eprintln!("store: {operation}");
///             call.await
///         })
///     }
/// }
/// ```
pub trait StoreLayer: Send + Sync + 'static {
    /// Runs `call`, the wrapped store's method `operation` (its name, e.g.
    /// `update_command`), and returns what it returns, or anything else.
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>>;
}

/// A [`Store`] whose every call goes through a [`StoreLayer`]. It forwards
/// [`Store::external_writes`] and [`Store::external_write_marker`] as they
/// are, so a layer never changes how other processes' writes are seen.
pub struct LayeredStore<L> {
    inner: Arc<dyn Store>,
    layer: L,
}

impl<L> std::fmt::Debug for LayeredStore<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayeredStore").finish_non_exhaustive()
    }
}

impl<L: StoreLayer> LayeredStore<L> {
    /// `inner` with `layer` around each call.
    pub fn new(inner: Arc<dyn Store>, layer: L) -> Self {
        Self { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

#[async_trait]
impl<L: StoreLayer> Store for LayeredStore<L> {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.layer
            .around(
                "idempotency",
                Box::pin(self.inner.idempotency(owner, agent, key, now)),
            )
            .await
    }

    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        self.layer
            .around(
                "insert_command",
                Box::pin(self.inner.insert_command(command, key, now)),
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
        self.layer
            .around(
                "insert_command_if_shared",
                Box::pin(
                    self.inner
                        .insert_command_if_shared(command, key, projects, now),
                ),
            )
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
        self.layer
            .around(
                "record_sync",
                Box::pin(self.inner.record_sync_within(
                    owner,
                    project,
                    device,
                    sessions,
                    long_poll,
                    max_projects,
                    now,
                )),
            )
            .await
    }

    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.layer
            .around(
                "command_for_agent",
                Box::pin(self.inner.command_for_agent(owner, agent, id)),
            )
            .await
    }

    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.layer
            .around(
                "command_for_device",
                Box::pin(self.inner.command_for_device(owner, device, id)),
            )
            .await
    }

    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.layer
            .around(
                "command_for_owner",
                Box::pin(self.inner.command_for_owner(owner, id)),
            )
            .await
    }

    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.layer
            .around(
                "running_commands",
                Box::pin(self.inner.running_commands(owner, device, limit)),
            )
            .await
    }

    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.layer
            .around(
                "lapsed_commands",
                Box::pin(self.inner.lapsed_commands(now, limit)),
            )
            .await
    }

    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        self.layer
            .around("update_command", Box::pin(self.inner.update_command(next)))
            .await
    }

    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.layer
            .around(
                "queued_commands",
                Box::pin(self.inner.queued_commands(owner, project, device, limit)),
            )
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
        self.layer
            .around(
                "replace_shared_sessions",
                Box::pin(
                    self.inner
                        .replace_shared_sessions(owner, project, device, sessions, now),
                ),
            )
            .await
    }

    async fn record_sync(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        long_poll: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.layer
            .around(
                "record_sync",
                Box::pin(
                    self.inner
                        .record_sync(owner, project, device, sessions, long_poll, now),
                ),
            )
            .await
    }

    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        self.layer
            .around(
                "shared_projects",
                Box::pin(self.inner.shared_projects(owner, device, limit)),
            )
            .await
    }

    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        self.layer
            .around(
                "shared_sessions",
                Box::pin(self.inner.shared_sessions(owner, project, limit)),
            )
            .await
    }

    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        self.layer
            .around(
                "find_shared_session",
                Box::pin(self.inner.find_shared_session(owner, projects, id)),
            )
            .await
    }

    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.layer
            .around(
                "touch_device",
                Box::pin(self.inner.touch_device(owner, device, contact, now)),
            )
            .await
    }

    async fn touch_devices(&self, contacts: &[DeviceTouch]) -> Result<(), StoreError> {
        self.layer
            .around(
                "touch_devices",
                Box::pin(self.inner.touch_devices(contacts)),
            )
            .await
    }

    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        self.layer
            .around("device", Box::pin(self.inner.device(owner, device)))
            .await
    }

    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        self.layer
            .around("prune", Box::pin(self.inner.prune(request)))
            .await
    }

    fn external_writes(&self) -> ExternalWrites {
        self.inner.external_writes()
    }

    /// Not timed: it is read once per maintenance tick, not per request.
    async fn external_write_marker(&self) -> Result<u64, StoreError> {
        self.inner.external_write_marker().await
    }
}
