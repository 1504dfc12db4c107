//! What every part of the store shares: rows decoded into the core's
//! records, timestamps as milliseconds, driver errors as the core's
//! [`StoreError`], and the count of statements sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{DeviceId, ProjectId};
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

/// A row of `id, agent, device, status, revision, record, owner`: the JSON
/// record, checked against the columns.
pub(crate) fn decode_command(row: &Row) -> Result<CommandRecord, StoreError> {
    let id: uuid::Uuid = row.try_get(0).map_err(corrupt)?;
    let agent: &str = row.try_get(1).map_err(corrupt)?;
    let device: &str = row.try_get(2).map_err(corrupt)?;
    let status: &str = row.try_get(3).map_err(corrupt)?;
    let rev: i64 = row.try_get(4).map_err(corrupt)?;
    let json: &str = row.try_get(5).map_err(corrupt)?;
    let owner: &str = row.try_get(6).map_err(corrupt)?;
    let record: CommandRecord = serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("command {id}: record: {e}")))?;
    let consistent = record.id.as_uuid() == &id
        && record.agent.as_str() == agent
        && record.owner.as_str() == owner
        && record.device.as_str() == device
        && record.status.as_str() == status
        && i64::try_from(record.revision).ok() == Some(rev);
    if !consistent {
        return Err(StoreError::Corrupt(format!(
            "command {id}: the columns disagree with the stored record"
        )));
    }
    Ok(record)
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
