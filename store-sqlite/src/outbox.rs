//! [`SqliteOutbox`]: the relay's durable [`Outbox`] on SQLite.
//!
//! Besides the pending reports (table `outbox`) it keeps the projects the
//! relay has synced (table `relay_projects`) and, through
//! [`crate::graph_processes`], the Graph processes the worker started.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use graph_relay_core::ids::{CommandId, ProjectId};
use graph_relay_core::outbox::{Outbox, OutboxError, OutboxItem, RelayReport};
use rusqlite::params;

use crate::database::{Database, DbError};
use crate::store::timestamp;
use crate::{OpenError, SqliteOptions, Synchronous, schema};

/// A durable relay [`Outbox`]: the table `outbox` of a graph-relay database.
///
/// [`put`](Outbox::put) returns only after the item's transaction committed;
/// an item leaves the file only through [`remove`](Outbox::remove). A relay
/// killed between finishing a run and reporting it finds the report here
/// after a restart.
#[derive(Debug)]
pub struct SqliteOutbox {
    pub(crate) db: Database,
    path: PathBuf,
}

impl SqliteOutbox {
    /// Opens (creating if needed) the outbox in the database at `path` with
    /// `synchronous = FULL`, so a stored item survives power loss as well as
    /// a crash, and one read connection. Blocks briefly: call it at start-up.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::open_with(
            path,
            &SqliteOptions::default()
                .synchronous(Synchronous::Full)
                .readers(1),
        )
    }

    /// Opens the outbox at `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, OpenError> {
        let path = path.as_ref().to_owned();
        let db = schema::open(&path, options, "graph-relay-outbox")?;
        Ok(Self { db, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait]
impl Outbox for SqliteOutbox {
    async fn put(&self, item: &OutboxItem) -> Result<(), OutboxError> {
        let command = item.command.to_string();
        let stored_at = i64::try_from(item.stored_at.as_millis())
            .map_err(|_| OutboxError::Backend("stored_at is out of range".into()))?;
        let attempts = item.attempts;
        let report = serde_json::to_string(&item.report)
            .map_err(|e| OutboxError::Backend(format!("cannot encode the report: {e}")))?;
        self.db
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO outbox (command, stored_at, attempts, report)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (command) DO UPDATE SET
                        stored_at = excluded.stored_at,
                        attempts = excluded.attempts,
                        report = excluded.report",
                )?
                .execute(params![command, stored_at, attempts, report])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError> {
        self.db
            .read(|conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT command, stored_at, attempts, report FROM outbox
                     ORDER BY stored_at, command",
                )?;
                let rows = stmt
                    .query_map([], |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, u32>(2)?,
                            r.get::<_, String>(3)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter()
                    .map(|(command, stored_at, attempts, report)| {
                        let command = CommandId::parse(&command)
                            .map_err(|e| DbError::Corrupt(format!("outbox.command: {e}")))?;
                        let report: RelayReport = serde_json::from_str(&report).map_err(|e| {
                            DbError::Corrupt(format!("outbox item {command}: report: {e}"))
                        })?;
                        Ok(OutboxItem {
                            command,
                            report,
                            stored_at: timestamp(stored_at)?,
                            attempts,
                        })
                    })
                    .collect()
            })
            .map_err(outbox_error)
    }

    async fn record_attempt(&self, command: &CommandId) -> Result<(), OutboxError> {
        let command = command.to_string();
        self.db
            .write(move |conn| {
                conn.prepare_cached(
                    "UPDATE outbox SET attempts = min(attempts + 1, 4294967295) WHERE command = ?1",
                )?
                .execute(params![command])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    async fn remove(&self, command: &CommandId) -> Result<(), OutboxError> {
        let command = command.to_string();
        self.db
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM outbox WHERE command = ?1")?
                    .execute(params![command])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    async fn synced_projects(&self) -> Result<Vec<ProjectId>, OutboxError> {
        self.db
            .read(|conn| {
                let mut stmt =
                    conn.prepare_cached("SELECT project FROM relay_projects ORDER BY project")?;
                let rows = stmt
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter()
                    .map(|p| {
                        ProjectId::parse(&p)
                            .map_err(|e| DbError::Corrupt(format!("relay_projects.project: {e}")))
                    })
                    .collect()
            })
            .map_err(outbox_error)
    }

    async fn remember_project(&self, project: &ProjectId) -> Result<(), OutboxError> {
        let project = project.to_string();
        self.db
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO relay_projects (project) VALUES (?1) ON CONFLICT DO NOTHING",
                )?
                .execute(params![project])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }

    async fn forget_project(&self, project: &ProjectId) -> Result<(), OutboxError> {
        let project = project.to_string();
        self.db
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM relay_projects WHERE project = ?1")?
                    .execute(params![project])?;
                Ok(())
            })
            .await
            .map_err(outbox_error)
    }
}

pub(crate) fn outbox_error(e: DbError) -> OutboxError {
    match e {
        DbError::Corrupt(m) => OutboxError::Corrupt(m),
        other => OutboxError::Backend(other.to_string()),
    }
}
