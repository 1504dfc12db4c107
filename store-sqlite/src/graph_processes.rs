//! The Graph processes a worker started, kept in the outbox file (table
//! `relay_processes`) so that the next worker can end what a crashed one
//! left running.
//!
//! A worker records a process group right after it started the Graph's
//! process and removes the record when the run ended cleanly. A record that
//! is still there when a worker starts belongs to a worker that died: the
//! group may still be running, orphaned. The record carries what is needed
//! to tell that group from an unrelated one that got the same id later: the
//! leader's start time (clock ticks since boot, `/proc/<pid>/stat` field 22)
//! and the boot it belongs to.

use graph_relay_core::ids::CommandId;
use graph_relay_core::outbox::OutboxError;
use graph_relay_core::time::Timestamp;
use rusqlite::params;

use crate::database::DbError;
use crate::outbox::{SqliteOutbox, outbox_error};
use crate::store::timestamp;

/// One Graph process group a worker started and has not seen end yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphProcess {
    /// The process group (the id of its leader, the Graph's process).
    pub pgid: i32,
    /// When the leader started, in clock ticks since boot (`/proc/<pid>/stat`
    /// field 22): a process with the same id but another start time is not it.
    pub start_time: u64,
    /// The boot the process ran in (`/proc/sys/kernel/random/boot_id`):
    /// after a reboot nothing recorded before it can still run.
    pub boot_id: String,
    /// The command it runs.
    pub command: CommandId,
    /// When it was recorded.
    pub recorded_at: Timestamp,
}

impl SqliteOutbox {
    /// Records `process` (replacing a record of the same group), durably,
    /// before the call returns.
    pub async fn record_process(&self, process: &GraphProcess) -> Result<(), OutboxError> {
        let pgid = process.pgid;
        let start_time = i64::try_from(process.start_time)
            .map_err(|_| OutboxError::Backend("start_time is out of range".into()))?;
        let recorded_at = i64::try_from(process.recorded_at.as_millis())
            .map_err(|_| OutboxError::Backend("recorded_at is out of range".into()))?;
        let boot_id = process.boot_id.clone();
        let command = process.command.to_string();
        self.db
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO relay_processes (pgid, start_time, boot_id, command, recorded_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (pgid) DO UPDATE SET
                        start_time = excluded.start_time,
                        boot_id = excluded.boot_id,
                        command = excluded.command,
                        recorded_at = excluded.recorded_at",
                )?
                .execute(params![
                    pgid,
                    start_time,
                    boot_id,
                    command,
                    recorded_at
                ])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    /// Removes the record of group `pgid`, if it is the one started at
    /// `start_time` (a newer record of a reused id stays). Removing an absent
    /// record is not an error.
    pub async fn remove_process(&self, pgid: i32, start_time: u64) -> Result<(), OutboxError> {
        let start_time = i64::try_from(start_time)
            .map_err(|_| OutboxError::Backend("start_time is out of range".into()))?;
        self.db
            .write(move |conn| {
                conn.prepare_cached(
                    "DELETE FROM relay_processes WHERE pgid = ?1 AND start_time = ?2",
                )?
                .execute(params![pgid, start_time])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    /// Every recorded process group, oldest record first.
    pub async fn processes(&self) -> Result<Vec<GraphProcess>, OutboxError> {
        self.db
            .read(|conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT pgid, start_time, boot_id, command, recorded_at FROM relay_processes
                     ORDER BY recorded_at, pgid",
                )?;
                let rows = stmt
                    .query_map([], |r| {
                        Ok((
                            r.get::<_, i32>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, String>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter()
                    .map(|(pgid, start_time, boot_id, command, recorded_at)| {
                        Ok(GraphProcess {
                            pgid,
                            start_time: u64::try_from(start_time).map_err(|_| {
                                DbError::Corrupt(format!(
                                    "relay_processes.start_time {start_time} is negative"
                                ))
                            })?,
                            boot_id,
                            command: CommandId::parse(&command).map_err(|e| {
                                DbError::Corrupt(format!("relay_processes.command: {e}"))
                            })?,
                            recorded_at: timestamp(recorded_at)?,
                        })
                    })
                    .collect()
            })
            .map_err(outbox_error)
    }
}
