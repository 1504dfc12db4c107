//! [`SqliteStore`]: the queue's [`Store`] on SQLite.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use graph_relay_core::session::{SessionMeta, SharedSession};
use graph_relay_core::store::{
    BoundedSync, DeviceContact, DeviceRecord, DeviceTouch, ExternalWrites, GuardedInsert,
    IdempotencyRecord, InsertOutcome, PruneReport, PruneRequest, Store, StoreError,
};
use graph_relay_core::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

use crate::cache::{MetaCache, RecordCache};
use crate::database::{Database, DbError, Statements};
use crate::shares::ShareGuard;
use crate::{OpenError, SqliteOptions, schema, shares};

#[cfg(test)]
mod plans;
mod rows;
#[cfg(test)]
mod tests;

use self::rows::{
    CommandRow, decode_row, decode_session, id_text, millis, parse, revision, store_error,
};
pub(crate) use self::rows::{sql_limit, timestamp};

/// The columns of `commands` that [`decode_row`] reads, in its order.
macro_rules! select_commands {
    ($($tail:literal)*) => {
        concat!(
            "SELECT id, agent, device, status, revision, record, owner, project, idempotency_key,
                created_at, finished_at, lease_expires_at FROM commands ",
            $($tail),*
        )
    };
}

/// A device's queued commands in one project, oldest first: its open ones
/// (`finished_at IS NULL` literally, so the partial index applies) filtered
/// on the row. The rowid, which ends every index entry, is the insertion
/// order: same-millisecond runs keep their order. The limit is a literal
/// (see [`sql_limit`]).
fn queued_commands_sql(limit: usize) -> String {
    format!(
        "{} LIMIT {}",
        select_commands!(
            "WHERE owner = ?1 AND device = ?3 AND project = ?2 AND finished_at IS NULL"
            " AND status = 'queued' ORDER BY created_at, rowid"
        ),
        sql_limit(limit)
    )
}

/// A device's running commands: its open ones filtered on the row.
fn running_commands_sql(limit: usize) -> String {
    format!(
        "{} LIMIT {}",
        select_commands!(
            "WHERE owner = ?1 AND device = ?2 AND finished_at IS NULL AND status = 'running'"
        ),
        sql_limit(limit)
    )
}

/// The running commands whose lease lapsed at `?1`, through the index of
/// running commands by lease. NULLs sort first: leases to grant, then the
/// oldest lapses.
fn lapsed_commands_sql(limit: usize) -> String {
    format!(
        "{} LIMIT {}",
        select_commands!(
            "WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at <= ?1)"
            " ORDER BY lease_expires_at"
        ),
        sql_limit(limit)
    )
}

/// A transition to a terminal state: the only one that sets `finished_at`
/// (and so moves the command from the open index to the finished one).
const FINISH_COMMAND: &str = "UPDATE commands SET status = ?2, finished_at = ?3, revision = ?4,
        record = ?5, lease_expires_at = ?7
    WHERE id = ?1 AND revision = ?6";

/// A transition that leaves the command open (a start, a lease renewal, a
/// progress report): `finished_at` is not assigned, so SQLite leaves the
/// open and the finished index alone. A finished row is never reopened:
/// such a swap changes nothing. `?3` (the NULL `finished_at`) is unused.
const MOVE_OPEN_COMMAND: &str = "UPDATE commands SET status = ?2, revision = ?4, record = ?5,
        lease_expires_at = ?7
    WHERE id = ?1 AND revision = ?6 AND finished_at IS NULL AND ?3 IS NULL";

/// The command holding idempotency key `?3` of agent `?2` of owner `?1`,
/// live or expired: at most one row does (the unique index `commands_keys`).
const KEY_HOLDER: &str = "SELECT id, key_fingerprint, key_expires_at FROM commands
    WHERE idempotency_key = ?3 AND agent = ?2 AND owner = ?1 AND key_expires_at IS NOT NULL";

/// Lets command `?1` go of its key: the key is free for a new command.
const RELEASE_KEY: &str =
    "UPDATE commands SET key_fingerprint = NULL, key_expires_at = NULL WHERE id = ?1";

/// A device's liveness (owner `?1`, device `?2`).
const DEVICE: &str = "SELECT last_sync_at, last_seen_at, long_poll FROM devices
    WHERE owner = ?1 AND device = ?2";

/// Releases up to `batch` keys expired at `?1`, oldest first (the limit is
/// a literal, see [`sql_limit`]).
fn expired_keys_sql(batch: i64) -> String {
    format!(
        "UPDATE commands SET key_fingerprint = NULL, key_expires_at = NULL WHERE rowid IN (
            SELECT rowid FROM commands
            WHERE key_expires_at <= ?1 ORDER BY key_expires_at LIMIT {batch})"
    )
}

/// The write job of a sync of `device` to `project`, its project bound
/// unchecked.
fn sync_write(
    owner: &OwnerId,
    project: &ProjectId,
    device: &DeviceId,
    sessions: &[SessionMeta],
    long_poll: bool,
    now: Timestamp,
) -> Result<shares::SyncWrite, StoreError> {
    Ok(shares::SyncWrite {
        owner: owner.clone(),
        project: project.clone(),
        device: device.clone(),
        shares: shares::encode(sessions).map_err(store_error)?,
        long_poll,
        now: millis(now)?,
        max_projects: None,
    })
}

/// A durable [`Store`] in one SQLite file. See the crate docs for the design.
///
/// Cheap to share behind an `Arc`; several stores (in one or several
/// processes) may open the same file. Dropping it waits for the writes
/// already sent and closes the file.
#[derive(Debug)]
pub struct SqliteStore {
    db: Database,
    path: PathBuf,
    /// Records written or decoded last, by their JSON (see [`RecordCache`]).
    records: RecordCache,
    /// Session metadata decoded last, by its JSON.
    metas: Arc<MetaCache>,
}

impl SqliteStore {
    /// Inserts `command` with `key` ([`Store::insert_command`]); with
    /// `guard`, only while the session resolves to the command's share
    /// among those projects ([`Store::insert_command_if_shared`]).
    async fn insert(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        guard: Option<&[ProjectId]>,
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        let row = CommandRow::encode(command.clone()).map_err(store_error)?;
        let entry = Arc::clone(&row.entry);
        let key = key.clone();
        let now = millis(now)?;
        let expires_at = millis(key.expires_at)?;
        let statements = Arc::clone(self.db.statements());
        let guard = guard.map(|projects| ShareGuard {
            metas: Arc::clone(&self.metas),
            owner: command.owner.clone(),
            session: command.graph_session_id.clone(),
            projects: projects.to_vec(),
            project: command.project.clone(),
            device: command.device.clone(),
            slug: Arc::clone(&command.slug),
        });
        let outcome = self
            .db
            .write(move |conn| {
                // The share first, under the same write lock as the key
                // below: a share that changed writes nothing.
                if let Some(guard) = &guard
                    && !guard.holds(conn, &statements)?
                {
                    return Ok((GuardedInsert::SessionChanged, false));
                }
                // Under the write lock of BEGIN IMMEDIATE: no other
                // connection can take the same key between the statements
                // below. The row holds its key; a row already holding it
                // makes the insert write nothing.
                let held = Some((key.fingerprint.as_str(), expires_at));
                if row.insert(conn, &statements, held)? {
                    return Ok((GuardedInsert::Checked(InsertOutcome::Inserted), true));
                }
                let of = KeyOf {
                    owner: &key.owner,
                    agent: &key.agent,
                    key: &key.key,
                };
                let Some(holder) = key_holder(conn, &statements, &of)? else {
                    return Err(row.id_taken());
                };
                if holder.is_live(now) {
                    let taken = InsertOutcome::KeyTaken(holder.record(&of)?);
                    return Ok((GuardedInsert::Checked(taken), false));
                }
                // The key expired: its old command lets go of it.
                statements.add(1);
                conn.prepare_cached(RELEASE_KEY)?
                    .execute(params![holder.command])?;
                if row.insert(conn, &statements, held)? {
                    Ok((GuardedInsert::Checked(InsertOutcome::Inserted), true))
                } else {
                    Err(row.id_taken())
                }
            })
            .await
            .map_err(store_error)?;
        let (outcome, inserted) = outcome;
        if inserted {
            self.records.put(command.id, entry);
        }
        Ok(outcome)
    }

    /// Applies `sync` in a write transaction: true when it was recorded,
    /// false when its project bound refused it.
    async fn write_sync(&self, sync: shares::SyncWrite) -> Result<bool, StoreError> {
        let statements = Arc::clone(self.db.statements());
        self.db
            .write(move |conn| shares::record_sync(conn, &statements, &sync))
            .await
            .map_err(store_error)
    }

    /// The first command `sql` selects with `params` (the query names its
    /// owner, so "not yours" is "not found").
    fn one_command(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let mut stmt = conn.prepare_cached(sql)?;
                let mut rows = stmt.query(params)?;
                rows.next()?
                    .map(|row| decode_row(row, &self.records))
                    .transpose()
            })
            .map_err(store_error)
    }

    /// Every command `sql` selects with `params`, in its order; `sql` ends
    /// with its `LIMIT`.
    fn commands(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let mut stmt = conn.prepare_cached(sql)?;
                let mut rows = stmt.query(params)?;
                let mut commands = Vec::new();
                while let Some(row) = rows.next()? {
                    commands.push(decode_row(row, &self.records)?);
                }
                Ok(commands)
            })
            .map_err(store_error)
    }

    /// Opens (creating and migrating if needed) the database at `path` with
    /// the default options: `synchronous = NORMAL`, 5 s busy timeout, up
    /// to four read connections. Blocks briefly (file checks, migrations): call it at start-up.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::open_with(path, &SqliteOptions::default())
    }

    /// Opens the database at `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, OpenError> {
        let path = path.as_ref().to_owned();
        let db = schema::open(&path, options, "graph-relay-store")?;
        Ok(Self {
            db,
            path,
            records: RecordCache::default(),
            metas: Arc::default(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many SQL statements this store has executed against its
    /// database since it was opened: every execution of a query or a
    /// write by one of its calls (a statement run once per row or per
    /// project counts once per run), and every `BEGIN`, `COMMIT`,
    /// savepoint and `ROLLBACK` of its writer. Concurrent writes share one
    /// transaction (group commit), so their `BEGIN` and `COMMIT` count once
    /// for the whole group. Not counted: the statements of opening and
    /// migrating the file, and the background checkpoints of the WAL.
    ///
    /// One relaxed atomic load: cheap enough to sample at any rate. Meant
    /// for benchmarks and tests (e.g. to catch a change that adds a
    /// statement to a hot path).
    pub fn statements_executed(&self) -> u64 {
        self.db.statements().get()
    }

    /// Number of commands stored, in every state.
    pub async fn command_count(&self) -> Result<u64, StoreError> {
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let n: i64 = conn
                    .prepare_cached("SELECT count(*) FROM commands")?
                    .query_row([], |r| r.get(0))?;
                Ok(u64::try_from(n).unwrap_or(0))
            })
            .map_err(store_error)
    }

    /// Writes `commands` in one transaction, without idempotency keys: for
    /// restoring a backup, moving from another store, or filling a database
    /// for a benchmark. Fails (and writes nothing) if an id already exists.
    pub async fn import_commands(&self, commands: Vec<CommandRecord>) -> Result<(), StoreError> {
        let rows = commands
            .iter()
            .cloned()
            .map(CommandRow::encode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        let statements = Arc::clone(self.db.statements());
        self.db
            .write(move |conn| {
                for row in &rows {
                    if !row.insert(conn, &statements, None)? {
                        return Err(row.id_taken());
                    }
                }
                Ok(())
            })
            .await
            .map_err(store_error)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = millis(now)?;
        let key = KeyOf { owner, agent, key };
        self.db
            .read(|conn| match key_holder(conn, self.db.statements(), &key)? {
                Some(holder) if holder.is_live(now) => holder.record(&key).map(Some),
                _ => Ok(None),
            })
            .map_err(store_error)
    }

    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        self.insert(command, key, None, now).await?.unguarded()
    }

    async fn insert_command_if_shared(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        projects: &[ProjectId],
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        // The share is checked inside the insert's write transaction: no
        // separate read transaction.
        self.insert(command, key, Some(projects), now).await
    }

    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.one_command(
            select_commands!("WHERE id = ?1 AND owner = ?2 AND agent = ?3"),
            params![id_text(id), owner.as_str(), agent.as_str()],
        )
    }

    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.one_command(
            select_commands!("WHERE id = ?1 AND owner = ?2 AND device = ?3"),
            params![id_text(id), owner.as_str(), device.as_str()],
        )
    }

    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.one_command(
            select_commands!("WHERE id = ?1 AND owner = ?2"),
            params![id_text(id), owner.as_str()],
        )
    }

    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.commands(
            &running_commands_sql(limit),
            params![owner.as_str(), device.as_str()],
        )
    }

    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.commands(&lapsed_commands_sql(limit), params![millis(now)?])
    }

    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        let Some(previous) = next.revision.checked_sub(1) else {
            return Ok(false);
        };
        let previous = revision(previous)?;
        let row = CommandRow::encode(next.clone()).map_err(store_error)?;
        let entry = Arc::clone(&row.entry);
        let statements = Arc::clone(self.db.statements());
        let changed = self
            .db
            .write(move |conn| {
                // One conditional statement: the compare-and-swap on the
                // revision. Only what a transition can change is written: the
                // id, agent, owner, project, device, key and creation time of
                // a command never change (and are checked against the record
                // at every read).
                statements.add(1);
                let sql = if row.finished_at.is_some() {
                    FINISH_COMMAND
                } else {
                    MOVE_OPEN_COMMAND
                };
                let changed = conn.prepare_cached(sql)?.execute(params![
                    row.id,
                    row.entry.record.status.as_str(),
                    row.finished_at,
                    row.revision,
                    row.entry.json,
                    previous,
                    row.lease_expires_at
                ])?;
                Ok(changed == 1)
            })
            .await
            .map_err(store_error)?;
        if changed {
            self.records.put(next.id, entry);
        }
        Ok(changed)
    }

    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.commands(
            &queued_commands_sql(limit),
            params![owner.as_str(), project.as_str(), device.as_str()],
        )
    }

    async fn replace_shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let (owner, project, device) = (owner.clone(), project.clone(), device.clone());
        let now = millis(now)?;
        let rows = shares::encode(sessions).map_err(store_error)?;
        let statements = Arc::clone(self.db.statements());
        self.db
            .write(move |conn| {
                shares::replace(conn, &statements, (&owner, &project, &device), &rows, now)
            })
            .await
            .map_err(store_error)
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
        let sync = sync_write(owner, project, device, sessions, long_poll, now)?;
        self.write_sync(sync).await.map(|_| ())
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
        // The bound is checked in the sync's own write transaction, and
        // only when the device shares nothing to the project yet.
        let sync = shares::SyncWrite {
            max_projects: Some(max_projects),
            ..sync_write(owner, project, device, sessions, long_poll, now)?
        };
        Ok(if self.write_sync(sync).await? {
            BoundedSync::Recorded
        } else {
            BoundedSync::TooManyProjects
        })
    }

    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let mut stmt = conn.prepare_cached(&shares::shared_projects_sql(limit))?;
                let mut rows = stmt.query(params![owner.as_str(), device.as_str()])?;
                let mut projects = Vec::new();
                while let Some(row) = rows.next()? {
                    let text: String = row.get(0)?;
                    projects.push(parse(ProjectId::parse(&text), "shared_sessions.project")?);
                }
                Ok(projects)
            })
            .map_err(store_error)
    }

    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        let limit = sql_limit(limit);
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT project, device, synced_at, meta FROM shared_sessions
                     WHERE owner = ?1 AND project = ?2
                     ORDER BY graph_session_id, device LIMIT {limit}"
                ))?;
                let mut rows = stmt.query(params![owner.as_str(), project.as_str()])?;
                let mut sessions = Vec::new();
                while let Some(row) = rows.next()? {
                    sessions.push(decode_session(row, &self.metas)?);
                }
                Ok(sessions)
            })
            .map_err(store_error)
    }

    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        self.db
            .read(|conn| {
                let mut stmt = conn.prepare_cached(shares::FIRST_SHARE)?;
                for project in projects {
                    self.db.statements().add(1);
                    let mut rows =
                        stmt.query(params![owner.as_str(), project.as_str(), id.as_str()])?;
                    if let Some(row) = rows.next()? {
                        return decode_session(row, &self.metas).map(Some);
                    }
                }
                Ok(None)
            })
            .map_err(store_error)
    }

    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let (owner, device) = (owner.clone(), device.clone());
        let now = millis(now)?;
        let (synced_at, long_poll) = match contact {
            DeviceContact::Sync { long_poll } => (Some(now), long_poll),
            DeviceContact::Other => (None, false),
        };
        let statements = Arc::clone(self.db.statements());
        self.db
            .write(move |conn| {
                statements.add(1);
                conn.prepare_cached(shares::TOUCH_DEVICE)?.execute(params![
                    owner.as_str(),
                    device.as_str(),
                    synced_at,
                    now,
                    long_poll
                ])?;
                Ok(())
            })
            .await
            .map_err(store_error)
    }

    async fn touch_devices(&self, contacts: &[DeviceTouch]) -> Result<(), StoreError> {
        let rows = contacts
            .iter()
            .map(|c| Ok((c.owner.clone(), c.device.clone(), millis(c.at)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let statements = Arc::clone(self.db.statements());
        // One transaction for all of them: the writer's commit, not each
        // contact's, is what costs.
        self.db
            .write(move |conn| {
                let mut touch = conn.prepare_cached(shares::TOUCH_DEVICE)?;
                for (owner, device, at) in &rows {
                    statements.add(1);
                    touch.execute(params![
                        owner.as_str(),
                        device.as_str(),
                        None::<i64>,
                        at,
                        false
                    ])?;
                }
                Ok(())
            })
            .await
            .map_err(store_error)
    }

    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        self.db
            .read(|conn| {
                self.db.statements().add(1);
                let found = conn
                    .prepare_cached(DEVICE)?
                    .query_row(params![owner.as_str(), device.as_str()], |r| {
                        Ok((
                            r.get::<_, Option<i64>>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, bool>(2)?,
                        ))
                    })
                    .optional()?;
                let Some((last_sync_at, last_seen_at, long_poll)) = found else {
                    return Ok(None);
                };
                Ok(Some(DeviceRecord {
                    device: device.clone(),
                    owner: owner.clone(),
                    last_sync_at: last_sync_at.map(timestamp).transpose()?,
                    last_seen_at: timestamp(last_seen_at)?,
                    long_poll,
                }))
            })
            .map_err(store_error)
    }

    /// Another process may open the same file; `PRAGMA data_version` on
    /// the writer connection tells when one committed.
    fn external_writes(&self) -> ExternalWrites {
        ExternalWrites::Marker
    }

    /// `PRAGMA data_version` of the writer connection: it changes when
    /// another connection (another process, or a second store on the same
    /// file) committed since, never for this store's own writes, which all
    /// go through that connection.
    async fn external_write_marker(&self) -> Result<u64, StoreError> {
        let version = self
            .db
            .write(
                |conn| Ok(conn.query_row("PRAGMA data_version", [], |row| row.get::<_, i64>(0))?),
            )
            .await
            .map_err(store_error)?;
        Ok(version.unsigned_abs())
    }

    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        let now = millis(request.now)?;
        let cutoff = request.terminal_before.map(millis).transpose()?;
        let batch = sql_limit(request.batch);
        let statements = Arc::clone(self.db.statements());
        self.db
            .write(move |conn| {
                statements.add(1 + u64::from(cutoff.is_some()));
                let keys = conn
                    .prepare_cached(&expired_keys_sql(batch))?
                    .execute(params![now])?;
                let commands = match cutoff {
                    None => 0,
                    Some(cutoff) => conn
                        .prepare_cached(&format!(
                            "DELETE FROM commands WHERE rowid IN (
                                SELECT c.rowid FROM commands AS c
                                WHERE c.finished_at IS NOT NULL AND c.finished_at <= ?1
                                  AND c.status IN ('completed', 'failed', 'cancelled')
                                  AND (c.key_expires_at IS NULL OR c.key_expires_at <= ?2)
                                ORDER BY c.finished_at LIMIT {batch})"
                        ))?
                        .execute(params![cutoff, now])?,
                };
                Ok(PruneReport { keys, commands })
            })
            .await
            .map_err(store_error)
    }
}

/// The command that holds an idempotency key, and what the key records.
struct KeyHolder {
    command: String,
    fingerprint: String,
    expires_at: i64,
}

impl KeyHolder {
    /// A key is live strictly before its `expires_at`; at that instant a
    /// new command may take it.
    fn is_live(&self, now: i64) -> bool {
        self.expires_at > now
    }

    /// The key as the store's callers see it: `key` with this holder's
    /// command, fingerprint and expiry.
    fn record(&self, key: &KeyOf<'_>) -> Result<IdempotencyRecord, DbError> {
        Ok(IdempotencyRecord {
            owner: key.owner.clone(),
            agent: key.agent.clone(),
            key: key.key.clone(),
            command: parse(CommandId::parse(&self.command), "commands.id")?,
            fingerprint: self.fingerprint.clone(),
            expires_at: timestamp(self.expires_at)?,
        })
    }
}

/// Which key: (owner, agent, key).
struct KeyOf<'a> {
    owner: &'a OwnerId,
    agent: &'a AgentId,
    key: &'a IdempotencyKey,
}

/// The command holding `key`, live or expired, if any.
fn key_holder(
    conn: &Connection,
    statements: &Statements,
    key: &KeyOf<'_>,
) -> Result<Option<KeyHolder>, DbError> {
    statements.add(1);
    Ok(conn
        .prepare_cached(KEY_HOLDER)?
        .query_row(
            params![key.owner.as_str(), key.agent.as_str(), key.key.as_str()],
            |r| {
                Ok(KeyHolder {
                    command: r.get(0)?,
                    fingerprint: r.get(1)?,
                    expires_at: r.get(2)?,
                })
            },
        )
        .optional()?)
}
