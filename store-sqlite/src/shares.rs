//! What a relay's sync writes: the sessions a device shares to one project,
//! and the device's contact.
//!
//! A long-polling desktop syncs again after every held request (every
//! 20–25 s by default), and almost every such sync repeats what is stored.
//! With thousands of desktops those repeats are most of what a quiet
//! server writes, so a sync is one write transaction that compares the
//! given sessions with the stored ones and, when they are the same, only
//! moves their stamps, instead of deleting and inserting every row (which
//! rewrites the table's and its indexes' pages) in one transaction and
//! recording the contact in another. The stored rows are the reference,
//! not what this process wrote last: another process on the same file may
//! have written this device's sessions since.

use std::sync::Arc;

use graph_relay_core::ids::{DeviceId, GraphSessionId, OwnerId, ProjectId};
use graph_relay_core::session::SessionMeta;
use rusqlite::{Connection, params};

use crate::cache::MetaCache;
use crate::database::{DbError, Statements};
use crate::store::sql_limit;

/// Records a device's contact: its last sign of life and, for a sync, when
/// it synced and whether it long-polls (`?3` NULL for another contact).
/// Stamps only move forward, so writes from processes whose clocks differ
/// a little never move liveness back.
pub(crate) const TOUCH_DEVICE: &str =
    "INSERT INTO devices (owner, device, last_sync_at, last_seen_at, long_poll)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (device, owner) DO UPDATE SET
        last_seen_at = max(last_seen_at, excluded.last_seen_at),
        last_sync_at = CASE WHEN excluded.last_sync_at IS NULL THEN last_sync_at
            ELSE max(coalesce(last_sync_at, excluded.last_sync_at), excluded.last_sync_at) END,
        long_poll = CASE WHEN excluded.last_sync_at IS NULL THEN long_poll
            ELSE excluded.long_poll END";

/// Removes a device's shares to one project before a sync writes them
/// anew. The index is named: SQLite's planner (without statistics) would
/// otherwise walk the primary key's (owner, project) prefix, i.e. every
/// share of the project, which with thousands of desktops in one project
/// made each sync cost a scan of all of them.
pub(crate) const DELETE_SHARES: &str =
    "DELETE FROM shared_sessions INDEXED BY shared_sessions_by_device
     WHERE owner = ?1 AND project = ?2 AND device = ?3";

/// The stored shares of one device to one project (the same index).
pub(crate) const SELECT_SHARES: &str = "SELECT graph_session_id, meta
     FROM shared_sessions INDEXED BY shared_sessions_by_device
     WHERE owner = ?1 AND project = ?2 AND device = ?3";

/// Moves the stamps of shares that stay as they are (the same index).
pub(crate) const STAMP_SHARES: &str = "UPDATE shared_sessions INDEXED BY shared_sessions_by_device
     SET synced_at = ?4
     WHERE owner = ?1 AND project = ?2 AND device = ?3 AND synced_at < ?4";

const INSERT_SHARE: &str =
    "INSERT INTO shared_sessions (owner, project, graph_session_id, device, synced_at, meta)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// One device's sync of one project, as its write job applies it.
pub(crate) struct SyncWrite {
    pub(crate) owner: OwnerId,
    pub(crate) project: ProjectId,
    pub(crate) device: DeviceId,
    /// The shared sessions with their metadata as stored (JSON), sorted by id.
    pub(crate) shares: Vec<(GraphSessionId, String)>,
    pub(crate) long_poll: bool,
    /// Milliseconds since the epoch.
    pub(crate) now: i64,
    /// Most projects the device may share into, checked when the sync
    /// shares into a project it shares nothing to yet (`None`: unchecked).
    pub(crate) max_projects: Option<usize>,
}

/// The projects device `?2` of owner `?1` shares into, in ascending order
/// (the device's index; the limit is a literal, see [`sql_limit`]).
pub(crate) fn shared_projects_sql(limit: usize) -> String {
    format!(
        "SELECT DISTINCT project FROM shared_sessions INDEXED BY shared_sessions_by_device
         WHERE owner = ?1 AND device = ?2
         ORDER BY project LIMIT {}",
        sql_limit(limit)
    )
}

/// The sessions' rows as stored: each id with its metadata's JSON, sorted
/// by id (the order the comparison with the stored rows needs).
pub(crate) fn encode(sessions: &[SessionMeta]) -> Result<Vec<(GraphSessionId, String)>, DbError> {
    let mut rows = sessions
        .iter()
        .map(|meta| {
            serde_json::to_string(meta)
                .map(|json| (meta.graph_session_id.clone(), json))
                .map_err(|e| DbError::Encode(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    Ok(rows)
}

/// Replaces the device's shares to the project with `shares`, stamped `now`.
pub(crate) fn replace(
    conn: &Connection,
    statements: &Statements,
    (owner, project, device): (&OwnerId, &ProjectId, &DeviceId),
    shares: &[(GraphSessionId, String)],
    now: i64,
) -> Result<(), DbError> {
    statements.add(1);
    conn.prepare_cached(DELETE_SHARES)?.execute(params![
        owner.as_str(),
        project.as_str(),
        device.as_str()
    ])?;
    let mut insert = conn.prepare_cached(INSERT_SHARE)?;
    for (session, meta) in shares {
        statements.add(1);
        insert.execute(params![
            owner.as_str(),
            project.as_str(),
            session.as_str(),
            device.as_str(),
            now,
            meta
        ])?;
    }
    Ok(())
}

/// Applies `sync` inside the writer's transaction: the shares (their
/// stamps only, when they are what is stored), then the contact. False,
/// with nothing written, when the sync would share the device into a
/// project beyond [`SyncWrite::max_projects`]: looked at only when the
/// device shares nothing to this project yet, so a repeated sync (most of
/// them) reads nothing more.
pub(crate) fn record_sync(
    conn: &Connection,
    statements: &Statements,
    sync: &SyncWrite,
) -> Result<bool, DbError> {
    let key = (&sync.owner, &sync.project, &sync.device);
    let (owner, project, device) = (
        sync.owner.as_str(),
        sync.project.as_str(),
        sync.device.as_str(),
    );
    statements.add(1);
    let mut stored: Vec<(String, String)> = conn
        .prepare_cached(SELECT_SHARES)?
        .query_map(params![owner, project, device], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    if let Some(max) = sync.max_projects
        && stored.is_empty()
        && !sync.shares.is_empty()
    {
        // The project is not among those the device shares into.
        statements.add(1);
        let mut select = conn.prepare_cached(&shared_projects_sql(max))?;
        let mut rows = select.query(params![owner, device])?;
        let mut shared = 0;
        while rows.next()?.is_some() {
            shared += 1;
        }
        if shared >= max {
            return Ok(false);
        }
    }
    stored.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let unchanged = stored.len() == sync.shares.len()
        && stored
            .iter()
            .zip(&sync.shares)
            .all(|((id, meta), (given_id, given_meta))| {
                id == given_id.as_str() && meta == given_meta
            });
    if unchanged {
        statements.add(1);
        conn.prepare_cached(STAMP_SHARES)?
            .execute(params![owner, project, device, sync.now])?;
    } else {
        replace(conn, statements, key, &sync.shares, sync.now)?;
    }
    statements.add(1);
    conn.prepare_cached(TOUCH_DEVICE)?.execute(params![
        owner,
        device,
        Some(sync.now),
        sync.now,
        sync.long_poll
    ])?;
    Ok(true)
}

/// The share of session `?3` of owner `?1` in project `?2`: the smallest
/// device's. `find_shared_session` and a guarded insert run it for each of
/// the agent's projects in its order; the first answer is the share.
pub(crate) const FIRST_SHARE: &str = "SELECT project, device, synced_at, meta FROM shared_sessions
     WHERE owner = ?1 AND project = ?2 AND graph_session_id = ?3
     ORDER BY device LIMIT 1";

/// What a guarded insert (`Store::insert_command_if_shared`) checks, on
/// the writer's connection, inside the insert's transaction.
pub(crate) struct ShareGuard {
    /// The store's decoded metadata, by its JSON (the slug is read from it).
    pub(crate) metas: Arc<MetaCache>,
    pub(crate) owner: OwnerId,
    pub(crate) session: GraphSessionId,
    /// The agent's projects, in its order.
    pub(crate) projects: Vec<ProjectId>,
    pub(crate) project: ProjectId,
    pub(crate) device: DeviceId,
    pub(crate) slug: Arc<str>,
}

impl ShareGuard {
    /// Whether the session still resolves to the guard's project, device
    /// and slug.
    pub(crate) fn holds(
        &self,
        conn: &Connection,
        statements: &Statements,
    ) -> Result<bool, DbError> {
        let mut stmt = conn.prepare_cached(FIRST_SHARE)?;
        for project in &self.projects {
            statements.add(1);
            let mut rows = stmt.query(params![
                self.owner.as_str(),
                project.as_str(),
                self.session.as_str()
            ])?;
            if let Some(row) = rows.next()? {
                let text = |i: usize| row.get_ref(i).map(|v| v.as_str().unwrap_or_default());
                return Ok(text(0)? == self.project.as_str()
                    && text(1)? == self.device.as_str()
                    && self.metas.get_or_decode(text(3)?)?.slug == self.slug);
            }
        }
        Ok(false)
    }
}
