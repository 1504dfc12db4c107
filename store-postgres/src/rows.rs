//! What every part of the store shares: rows decoded into the core's
//! records, timestamps as milliseconds, driver errors as the core's
//! [`StoreError`], and the count of statements sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use graph_relay_core::command::{CommandRecord, CommandStatus, RecordHead};
use graph_relay_core::ids::{AgentId, CommandId, DeviceId, IdempotencyKey, OwnerId, ProjectId};
use graph_relay_core::session::SharedSession;
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;
use tokio_postgres::Row;

use crate::errors::describe;

/// A count of statements sent, shared by a store's clones and its writer.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatementCounter(Arc<AtomicU64>);

impl StatementCounter {
    /// Counts `n` statements about to be sent.
    pub(crate) fn sent(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The columns a command is read from, in the order [`decode_command`]
/// reads them, each prefixed with `$prefix` (a table alias and its dot, or
/// nothing): the record's head in columns of its own and its body.
macro_rules! command_columns {
    ($prefix:literal) => {
        concat!(
            $prefix,
            "id, ",
            $prefix,
            "agent, ",
            $prefix,
            "owner, ",
            $prefix,
            "project, ",
            $prefix,
            "device, ",
            $prefix,
            "idempotency_key, ",
            $prefix,
            "status, ",
            $prefix,
            "created_at, ",
            $prefix,
            "finished_at, ",
            $prefix,
            "lease_expires_at, ",
            $prefix,
            "revision, ",
            $prefix,
            "record"
        )
    };
}
pub(crate) use command_columns;

/// A row of [`command_columns`] (any columns after them are left alone):
/// the head from its columns, the rest from the `record` column, which
/// holds the record's body, or the whole record in a row written before
/// schema 6 (whose head fields are then ignored for the columns').
pub(crate) fn decode_command(row: &Row) -> Result<CommandRecord, StoreError> {
    let id: uuid::Uuid = row.try_get(0).map_err(corrupt)?;
    let column = |i: usize| -> Result<&str, StoreError> { row.try_get(i).map_err(corrupt) };
    let bad = |name: &str, e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!("command {id}: commands.{name}: {e}"))
    };
    let time = |i: usize| -> Result<Option<Timestamp>, StoreError> {
        row.try_get::<_, Option<i64>>(i)
            .map_err(corrupt)?
            .map(timestamp)
            .transpose()
    };
    let status = column(6)?;
    let revision: i64 = row.try_get(10).map_err(corrupt)?;
    let head = RecordHead {
        id: CommandId::from_uuid(id),
        agent: AgentId::parse(column(1)?).map_err(|e| bad("agent", &e))?,
        owner: OwnerId::parse(column(2)?).map_err(|e| bad("owner", &e))?,
        project: ProjectId::parse(column(3)?).map_err(|e| bad("project", &e))?,
        device: DeviceId::parse(column(4)?).map_err(|e| bad("device", &e))?,
        idempotency_key: IdempotencyKey::parse(column(5)?)
            .map_err(|e| bad("idempotency_key", &e))?,
        status: CommandStatus::parse(status)
            .ok_or_else(|| bad("status", &format!("unknown status {status:?}")))?,
        created_at: time(7)?.ok_or_else(|| bad("created_at", &"missing"))?,
        finished_at: time(8)?,
        lease_expires_at: time(9)?,
        revision: u64::try_from(revision).map_err(|e| bad("revision", &e))?,
    };
    CommandRecord::from_parts(head, column(11)?)
        .map_err(|e| StoreError::Corrupt(format!("command {id}: record: {e}")))
}

pub(crate) fn decode_session(row: &Row) -> Result<SharedSession, StoreError> {
    let project: &str = row.try_get(0).map_err(corrupt)?;
    let device: &str = row.try_get(1).map_err(corrupt)?;
    let meta: &str = row.try_get(3).map_err(corrupt)?;
    Ok(SharedSession {
        project: ProjectId::parse(project)
            .map_err(|e| StoreError::Corrupt(format!("shared_sessions.project: {e}")))?,
        device: DeviceId::parse(device)
            .map_err(|e| StoreError::Corrupt(format!("shared_sessions.device: {e}")))?,
        meta: serde_json::from_str(meta)
            .map_err(|e| StoreError::Corrupt(format!("shared_sessions.meta: {e}")))?,
        synced_at: timestamp(row.try_get(2).map_err(corrupt)?)?,
    })
}

pub(crate) fn backend(e: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(describe(&e))
}

pub(crate) fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(describe(&e))
}

pub(crate) fn millis(t: Timestamp) -> Result<i64, StoreError> {
    i64::try_from(t.as_millis())
        .map_err(|_| StoreError::Backend(format!("timestamp {} ms is out of range", t.as_millis())))
}

pub(crate) fn timestamp(ms: i64) -> Result<Timestamp, StoreError> {
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| StoreError::Corrupt(format!("negative timestamp {ms}")))
}
