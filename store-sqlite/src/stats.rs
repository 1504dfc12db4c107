//! What an operator asks of a queue database: which desktops are online,
//! what is shared, what waits, how runs ended and how long pickups took.
//!
//! [`QueueStats::read`](ReadQueueStats::read) opens the database file **read-only** on its own
//! connection (it never creates, migrates or writes the file, so it can run
//! next to a live server) and answers from the indexed columns and the
//! stored records. `graph-relay status` prints it; `serve --metrics` reads
//! it at each scrape. The snapshot's types are the core's
//! ([`graph_relay_core::stats`]), re-exported here; Postgres fills the same
//! ones (`PostgresStore::queue_stats`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use graph_relay_core::stats::{OperatorStats, QueueFigures, window_start};
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;
use rusqlite::{Connection, OpenFlags, params};

use crate::schema::APPLICATION_ID;

/// Why the statistics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The file is missing or cannot be opened read-only.
    #[error("cannot open {path} read-only: {source}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        source: rusqlite::Error,
    },
    /// The file is not a graph-relay queue database.
    #[error("{0} is not a graph-relay queue database")]
    NotOurs(String),
    /// A query failed.
    #[error("reading the queue database: {0}")]
    Query(#[from] rusqlite::Error),
}

use graph_relay_core::stats::{DesktopStats, FinishedRun, ProjectShares, QueueStats, QueuedRun};

/// Reads a [`QueueStats`] from a SQLite file.
pub trait ReadQueueStats: Sized {
    /// Reads the database at `path` read-only: everything as of `now`,
    /// finished runs and pickups of the last `window`, at most `queue_limit`
    /// queued runs listed.
    fn read(
        path: &Path,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<Self, StatsError>;
}

impl ReadQueueStats for QueueStats {
    fn read(
        path: &Path,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<Self, StatsError> {
        let conn = open_read_only(path)?;
        let since = i64::try_from(window_start(now, window).as_millis()).unwrap_or(i64::MAX);

        let running_by_device = running_by_device(&conn)?;
        let running = running_by_device.values().sum();
        let desktops = desktops(&conn, &running_by_device)?;
        let shares = shares(&conn)?;
        let queued: i64 = conn.query_row(
            "SELECT COUNT(*) FROM commands WHERE finished_at IS NULL AND status = 'queued'",
            [],
            |r| r.get(0),
        )?;
        let queue = queue_head(&conn, queue_limit)?;

        let mut recent_by_status = BTreeMap::new();
        for run in finished_since(&conn, since)? {
            *recent_by_status.entry(run.status).or_insert(0) += 1;
        }
        recent_by_status.insert("queued".to_owned(), count(queued));
        recent_by_status.insert("running".to_owned(), running);

        Ok(Self {
            now,
            desktops,
            shares,
            queue,
            queued: count(queued),
            running,
            recent_by_status,
            pickups: pickups_since(&conn, since)?,
        })
    }
}

/// How many runs each desktop ((owner, device)) is running.
fn running_by_device(conn: &Connection) -> Result<BTreeMap<(String, String), u64>, StatsError> {
    let mut running_by_device = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT owner, device, COUNT(*) FROM commands WHERE status = 'running' GROUP BY owner, device",
    )?;
    for row in stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })? {
        let (owner, device, n) = row?;
        running_by_device.insert((owner, device), count(n));
    }
    Ok(running_by_device)
}

/// Every desktop the server knows, with when it was last heard from and
/// how many runs it is running.
fn desktops(
    conn: &Connection,
    running_by_device: &BTreeMap<(String, String), u64>,
) -> Result<Vec<DesktopStats>, StatsError> {
    let mut desktops = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT owner, device, last_sync_at, last_seen_at, long_poll FROM devices ORDER BY owner, device",
    )?;
    for row in stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, bool>(4)?,
        ))
    })? {
        let (owner, device, last_sync, last_seen, long_poll) = row?;
        let running = running_by_device
            .get(&(owner.clone(), device.clone()))
            .copied()
            .unwrap_or(0);
        desktops.push(DesktopStats {
            owner,
            device,
            last_seen_at: stamp(last_seen),
            last_sync_at: last_sync.map(stamp),
            long_poll,
            running,
        });
    }
    Ok(desktops)
}

/// What each owner's project shares: how many sessions, from how many
/// desktops.
fn shares(conn: &Connection) -> Result<Vec<ProjectShares>, StatsError> {
    let mut stmt = conn.prepare(
        "SELECT owner, project, COUNT(DISTINCT graph_session_id), COUNT(DISTINCT device)
         FROM shared_sessions GROUP BY owner, project ORDER BY owner, project",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(ProjectShares {
            owner: r.get(0)?,
            project: r.get(1)?,
            sessions: count(r.get(2)?),
            desktops: count(r.get(3)?),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The oldest `queue_limit` queued runs, in the order they were queued.
fn queue_head(conn: &Connection, queue_limit: usize) -> Result<Vec<QueuedRun>, StatsError> {
    let mut stmt = conn.prepare(
        "SELECT id, owner, project, device, created_at FROM commands
         WHERE finished_at IS NULL AND status = 'queued' ORDER BY created_at, rowid LIMIT ?1",
    )?;
    let limit = i64::try_from(queue_limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![limit], |r| {
        Ok(QueuedRun {
            command_id: r.get(0)?,
            owner: r.get(1)?,
            project: r.get(2)?,
            device: r.get(3)?,
            created_at: stamp(r.get(4)?),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The pickup latencies, shortest first, of the runs that started since
/// `since`: finished ones (the index on finished_at) and running ones (the
/// index on running commands).
fn pickups_since(conn: &Connection, since: i64) -> Result<Vec<Duration>, StatsError> {
    let mut pickups = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT created_at, json_extract(record, '$.started_at')
         FROM commands
         WHERE ((finished_at IS NOT NULL AND finished_at >= ?1) OR status = 'running')
           AND json_extract(record, '$.started_at') >= ?1",
    )?;
    for row in stmt.query_map(params![since], |r| {
        Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?))
    })? {
        if let (Some(created), Some(started)) = row? {
            pickups.push(stamp(started).since(stamp(created)));
        }
    }
    pickups.sort();
    Ok(pickups)
}

/// The runs that finished after `after` and no later than `until` (both in
/// ms since the epoch), with their pickup latency: what a metrics scrape
/// adds to its counters.
pub fn finished_between(
    path: &Path,
    after: Timestamp,
    until: Timestamp,
) -> Result<Vec<FinishedRun>, StatsError> {
    let conn = open_read_only(path)?;
    let after = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let until = i64::try_from(until.as_millis()).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare(
        "SELECT status, finished_at, created_at, json_extract(record, '$.started_at'),
                json_extract(record, '$.cancel_requested_at')
         FROM commands WHERE finished_at > ?1 AND finished_at <= ?2",
    )?;
    let rows = stmt.query_map(params![after, until], finished_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn finished_since(conn: &Connection, since: i64) -> Result<Vec<FinishedRun>, StatsError> {
    let mut stmt = conn.prepare(
        "SELECT status, finished_at, created_at, json_extract(record, '$.started_at'),
                json_extract(record, '$.cancel_requested_at')
         FROM commands WHERE finished_at >= ?1",
    )?;
    let rows = stmt.query_map(params![since], finished_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn finished_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FinishedRun> {
    let created: Option<i64> = r.get(2)?;
    let started: Option<i64> = r.get(3)?;
    let cancel_requested: Option<i64> = r.get(4)?;
    Ok(FinishedRun::from_times(
        r.get(0)?,
        stamp(r.get(1)?),
        created.map(stamp),
        started.map(stamp),
        cancel_requested.map(stamp),
    ))
}

/// Opens `path` read-only (never creating it) and checks it is ours.
fn open_read_only(path: &Path) -> Result<Connection, StatsError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| StatsError::Open {
        path: path.display().to_string(),
        source,
    })?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|source| StatsError::Open {
            path: path.display().to_string(),
            source,
        })?;
    if id != APPLICATION_ID {
        return Err(StatsError::NotOurs(path.display().to_string()));
    }
    Ok(conn)
}

fn stamp(ms: i64) -> Timestamp {
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The operator's status and the metrics' figures of the store's file,
/// each read on a read-only connection of its own, on a thread of its own
/// (a status lists every desktop: it is not a read to make on an async
/// runtime's worker).
#[async_trait::async_trait]
impl OperatorStats for crate::SqliteStore {
    async fn stats(
        &self,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<QueueStats, StoreError> {
        let path = self.path().to_owned();
        off_thread(move || QueueStats::read(&path, now, window, queue_limit)).await
    }

    async fn figures(
        &self,
        now: Timestamp,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueFigures, StoreError> {
        let path = self.path().to_owned();
        off_thread(move || {
            let stats = QueueStats::read(&path, now, Duration::ZERO, 1)?;
            let finished = finished_between(&path, after, until)?;
            Ok(QueueFigures {
                queued: stats.queued,
                running: stats.running,
                oldest_queued_at: stats.queue.first().map(|q| q.created_at),
                desktops_online: stats.desktops.iter().filter(|d| d.is_online(now)).count() as u64,
                desktops_known: stats.desktops.len() as u64,
                finished,
            })
        })
        .await
    }
}

/// Runs `read` on a thread of its own and waits for it without blocking.
async fn off_thread<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, StatsError> + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("graph-relay-stats".into())
        .spawn(move || {
            let _ = tx.send(read());
        })
        .map_err(|e| StoreError::Backend(format!("cannot start the stats reader: {e}")))?;
    rx.await
        .map_err(|_| StoreError::Backend("the stats reader ended without an answer".into()))?
        .map_err(|e| StoreError::Backend(e.to_string()))
}
