//! What an operator asks of a queue database: which desktops are online,
//! what is shared, what waits, how runs ended and how long pickups took.
//!
//! [`QueueStats::read`] opens the database file **read-only** on its own
//! connection (it never creates, migrates or writes the file, so it can run
//! next to a live server) and answers from the indexed columns and the
//! stored records. `graph-relay status` prints it; `serve --metrics` reads
//! it at each scrape.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

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

/// How a desktop was last heard from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesktopStats {
    /// Its owner.
    pub owner: String,
    /// Its name.
    pub device: String,
    /// The last request of any kind (sync, control, report).
    pub last_seen_at: Timestamp,
    /// The last sync, if it ever synced.
    pub last_sync_at: Option<Timestamp>,
    /// Whether its last sync was a held (long-poll) one.
    pub long_poll: bool,
    /// Runs assigned to it that are `running` now.
    pub running: u64,
}

impl DesktopStats {
    /// Online: heard from within three expected sync gaps (25 s holds in
    /// long-poll mode, 20 s passes in interval mode), the rule by which
    /// `get_graph_run` says a desktop looks offline.
    pub fn is_online(&self, now: Timestamp) -> bool {
        let last = self
            .last_sync_at
            .map_or(self.last_seen_at, |s| s.max(self.last_seen_at));
        last >= online_since(now, self.long_poll)
    }
}

/// The earliest last contact at which a desktop in long-poll mode
/// (`long_poll`) or interval mode still counts as online at `now`: three
/// expected sync gaps back (25 s holds, 20 s passes). Other stores count
/// online desktops by the same rule.
pub fn online_since(now: Timestamp, long_poll: bool) -> Timestamp {
    let gap = if long_poll {
        Duration::from_secs(25)
    } else {
        Duration::from_secs(20)
    };
    now.minus(gap * 3)
}

/// Sessions shared to one project of one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectShares {
    /// The owner.
    pub owner: String,
    /// The project.
    pub project: String,
    /// Distinct graph sessions shared there.
    pub sessions: u64,
    /// Desktops sharing them.
    pub desktops: u64,
}

/// A queued run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedRun {
    /// Its command id.
    pub command_id: String,
    /// The owner.
    pub owner: String,
    /// The project it was filed under.
    pub project: String,
    /// The desktop it is assigned to.
    pub device: String,
    /// When it was queued.
    pub created_at: Timestamp,
}

/// A finished run, as metrics count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedRun {
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    /// When it finished.
    pub finished_at: Timestamp,
    /// Queued → running, if it ever ran.
    pub pickup: Option<Duration>,
    /// Cancel requested → finished, if the agent asked to cancel it.
    pub cancel: Option<Duration>,
}

/// A snapshot of a queue database.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    /// The time the snapshot is for.
    pub now: Timestamp,
    /// Every desktop ever seen, by owner and name.
    pub desktops: Vec<DesktopStats>,
    /// Shared sessions per (owner, project).
    pub shares: Vec<ProjectShares>,
    /// Queued runs, oldest first (at most the limit asked for).
    pub queue: Vec<QueuedRun>,
    /// All queued runs.
    pub queued: u64,
    /// All running runs.
    pub running: u64,
    /// Runs that finished within the window, by status, plus the runs
    /// queued and running now.
    pub recent_by_status: BTreeMap<String, u64>,
    /// Pickup latencies (queued → running) of the runs that started within
    /// the window, ascending.
    pub pickups: Vec<Duration>,
}

impl QueueStats {
    /// Reads the database at `path` read-only: everything as of `now`,
    /// finished runs and pickups of the last `window`, at most `queue_limit`
    /// queued runs listed.
    pub fn read(
        path: &Path,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<Self, StatsError> {
        let conn = open_read_only(path)?;
        let since =
            i64::try_from(now.as_millis().saturating_sub(millis(window))).unwrap_or(i64::MAX);

        let mut running_by_device: BTreeMap<(String, String), u64> = BTreeMap::new();
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
        let running = running_by_device.values().sum();

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

        let mut shares = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT owner, project, COUNT(DISTINCT graph_session_id), COUNT(DISTINCT device)
             FROM shared_sessions GROUP BY owner, project ORDER BY owner, project",
        )?;
        for row in stmt.query_map([], |r| {
            Ok(ProjectShares {
                owner: r.get(0)?,
                project: r.get(1)?,
                sessions: count(r.get(2)?),
                desktops: count(r.get(3)?),
            })
        })? {
            shares.push(row?);
        }

        let queued: i64 = conn.query_row(
            "SELECT COUNT(*) FROM commands WHERE status = 'queued'",
            [],
            |r| r.get(0),
        )?;
        let mut queue = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT id, owner, project, device, created_at FROM commands
             WHERE status = 'queued' ORDER BY created_at, rowid LIMIT ?1",
        )?;
        let limit = i64::try_from(queue_limit).unwrap_or(i64::MAX);
        for row in stmt.query_map(params![limit], |r| {
            Ok(QueuedRun {
                command_id: r.get(0)?,
                owner: r.get(1)?,
                project: r.get(2)?,
                device: r.get(3)?,
                created_at: stamp(r.get(4)?),
            })
        })? {
            queue.push(row?);
        }

        let mut recent_by_status = BTreeMap::new();
        for run in finished_since(&conn, since)? {
            *recent_by_status.entry(run.status).or_insert(0) += 1;
        }
        recent_by_status.insert("queued".to_owned(), count(queued));
        recent_by_status.insert("running".to_owned(), running);

        // Runs that started within the window: finished ones (the index on
        // finished_at) and running ones (the index on running commands).
        let mut pickups = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT json_extract(record, '$.created_at'), json_extract(record, '$.started_at')
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

        Ok(Self {
            now,
            desktops,
            shares,
            queue,
            queued: count(queued),
            running,
            recent_by_status,
            pickups,
        })
    }

    /// The `q` quantile (0 to 1) of the pickups, nearest rank; `None` without pickups.
    pub fn pickup_quantile(&self, q: f64) -> Option<Duration> {
        if self.pickups.is_empty() {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.pickups.len() as f64).ceil() as usize;
        self.pickups
            .get(rank.saturating_sub(1).min(self.pickups.len() - 1))
            .copied()
    }
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
        "SELECT status, finished_at, json_extract(record, '$.created_at'), json_extract(record, '$.started_at'),
                json_extract(record, '$.cancel_requested_at')
         FROM commands WHERE finished_at > ?1 AND finished_at <= ?2",
    )?;
    let rows = stmt.query_map(params![after, until], finished_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn finished_since(conn: &Connection, since: i64) -> Result<Vec<FinishedRun>, StatsError> {
    let mut stmt = conn.prepare(
        "SELECT status, finished_at, json_extract(record, '$.created_at'), json_extract(record, '$.started_at'),
                json_extract(record, '$.cancel_requested_at')
         FROM commands WHERE finished_at >= ?1",
    )?;
    let rows = stmt.query_map(params![since], finished_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn finished_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FinishedRun> {
    let finished_at = stamp(r.get(1)?);
    let created: Option<i64> = r.get(2)?;
    let started: Option<i64> = r.get(3)?;
    let cancel_requested: Option<i64> = r.get(4)?;
    Ok(FinishedRun {
        status: r.get(0)?,
        finished_at,
        pickup: match (created, started) {
            (Some(c), Some(s)) => Some(stamp(s).since(stamp(c))),
            _ => None,
        },
        cancel: cancel_requested.map(|t| finished_at.since(stamp(t))),
    })
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
