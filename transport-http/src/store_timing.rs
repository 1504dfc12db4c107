//! How long the store takes: [`TimedStore`] wraps any [`Store`] and
//! observes each call's wall time, failed or not, in the histogram
//! `graph_relay_store_operation_seconds{operation}` of the serving metrics
//! ([`Metrics::timed_store`](crate::metrics::Metrics::timed_store)).
//!
//! The `operation` label is the name of the [`Store`] method
//! ([`OPERATIONS`]): a fixed set of seventeen, whatever the requests carry.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use graph_relay_core::session::{SessionMeta, SharedSession};
use graph_relay_core::store::{
    DeviceContact, DeviceRecord, ExternalWrites, IdempotencyRecord, InsertOutcome, PruneReport,
    PruneRequest, Store, StoreError,
};
use graph_relay_core::time::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// The `operation` label values: the [`Store`] methods.
pub const OPERATIONS: [&str; 17] = [
    "idempotency",
    "insert_command",
    "command_for_agent",
    "command_for_device",
    "command_for_owner",
    "running_commands",
    "lapsed_commands",
    "update_command",
    "queued_commands",
    "replace_shared_sessions",
    "record_sync",
    "shared_projects",
    "shared_sessions",
    "find_shared_session",
    "touch_device",
    "device",
    "prune",
];

/// Upper bounds (seconds) of the buckets: from an in-memory look-up to a
/// store that stalls.
const BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    operation: &'static str,
}

/// The histogram family of store operations, by operation.
pub(crate) type OperationHistograms = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// A new, empty family with the store buckets.
pub(crate) fn operation_histograms() -> OperationHistograms {
    Family::new_with_constructor(|| Histogram::new(BUCKETS))
}

/// A [`Store`] that times every call of the store it wraps.
pub struct TimedStore {
    inner: Arc<dyn Store>,
    histograms: OperationHistograms,
}

impl std::fmt::Debug for TimedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedStore").finish_non_exhaustive()
    }
}

impl TimedStore {
    pub(crate) fn new(inner: Arc<dyn Store>, histograms: OperationHistograms) -> Self {
        Self { inner, histograms }
    }

    async fn timed<T>(&self, operation: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        self.histograms
            .get_or_create(&OperationLabels { operation })
            .observe(started.elapsed().as_secs_f64());
        out
    }
}

#[async_trait]
impl Store for TimedStore {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.timed(
            "idempotency",
            self.inner.idempotency(owner, agent, key, now),
        )
        .await
    }

    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        self.timed(
            "insert_command",
            self.inner.insert_command(command, key, now),
        )
        .await
    }

    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.timed(
            "command_for_agent",
            self.inner.command_for_agent(owner, agent, id),
        )
        .await
    }

    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.timed(
            "command_for_device",
            self.inner.command_for_device(owner, device, id),
        )
        .await
    }

    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.timed("command_for_owner", self.inner.command_for_owner(owner, id))
            .await
    }

    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.timed(
            "running_commands",
            self.inner.running_commands(owner, device, limit),
        )
        .await
    }

    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.timed("lapsed_commands", self.inner.lapsed_commands(now, limit))
            .await
    }

    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        self.timed("update_command", self.inner.update_command(next))
            .await
    }

    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.timed(
            "queued_commands",
            self.inner.queued_commands(owner, project, device, limit),
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
        self.timed(
            "replace_shared_sessions",
            self.inner
                .replace_shared_sessions(owner, project, device, sessions, now),
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
        self.timed(
            "record_sync",
            self.inner
                .record_sync(owner, project, device, sessions, long_poll, now),
        )
        .await
    }

    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        self.timed(
            "shared_projects",
            self.inner.shared_projects(owner, device, limit),
        )
        .await
    }

    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        self.timed(
            "shared_sessions",
            self.inner.shared_sessions(owner, project, limit),
        )
        .await
    }

    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        self.timed(
            "find_shared_session",
            self.inner.find_shared_session(owner, projects, id),
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
        self.timed(
            "touch_device",
            self.inner.touch_device(owner, device, contact, now),
        )
        .await
    }

    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        self.timed("device", self.inner.device(owner, device)).await
    }

    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        self.timed("prune", self.inner.prune(request)).await
    }

    fn external_writes(&self) -> ExternalWrites {
        self.inner.external_writes()
    }

    /// Not timed: it is read once per maintenance tick, not per request.
    async fn external_write_marker(&self) -> Result<u64, StoreError> {
        self.inner.external_write_marker().await
    }
}
