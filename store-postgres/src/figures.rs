//! What an operator reads about the queue on Postgres. Totals over every
//! owner, for the operator only.
//!
//! * [`PostgresStore::queue_figures`], what a server's metrics show: how
//!   many runs wait and run, the oldest waiting one, the desktops known and
//!   online, and the runs that finished in an interval (for the pickup and
//!   cancel latency histograms). Two statements per call, both on indexed
//!   columns but for the finished runs' times, which are read from their
//!   records.
//! * [`PostgresStore::queue_stats`], the operator's status
//!   (`/admin/status`): the core's [`QueueStats`], with the same meaning
//!   for every field as the SQLite store's `QueueStats::read`. One
//!   statement, so one snapshot of the database.

use std::collections::BTreeMap;
use std::time::Duration;

use graph_relay_core::stats::{
    DesktopStats, FinishedRun, OperatorStats, ProjectShares, QueueFigures, QueueStats, QueuedRun,
    online_since, window_start,
};
use graph_relay_core::time::Timestamp;
use serde::de::DeserializeOwned;

use crate::rows::{backend, corrupt, millis, timestamp};
use crate::store::PostgresStore;
use graph_relay_core::store::StoreError;

/// When a desktop last had to be heard from to count as online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnlineSince {
    /// For a desktop whose last sync was a held (long-poll) one.
    pub long_poll: Timestamp,
    /// For a desktop that syncs at an interval.
    pub interval: Timestamp,
}

impl PostgresStore {
    /// The queue now, and the runs that finished after `after` and no
    /// later than `until`.
    pub async fn queue_figures(
        &self,
        online: OnlineSince,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueFigures, StoreError> {
        let client = self.client().await?;
        let counts = client
            .prepare_cached(
                "SELECT
                    (SELECT count(*) FROM commands WHERE finished_at IS NULL AND status = 'queued'),
                    (SELECT count(*) FROM commands WHERE finished_at IS NULL AND status = 'running'),
                    (SELECT min(created_at) FROM commands WHERE finished_at IS NULL AND status = 'queued'),
                    (SELECT count(*) FROM devices),
                    (SELECT count(*) FROM devices
                     WHERE GREATEST(last_seen_at, coalesce(last_sync_at, last_seen_at))
                           >= CASE WHEN long_poll THEN $1::bigint ELSE $2::bigint END)",
            )
            .await
            .map_err(backend)?;
        let finished = client
            .prepare_cached(
                "SELECT status, finished_at, created_at,
                        (record::jsonb ->> 'started_at')::bigint,
                        (record::jsonb ->> 'cancel_requested_at')::bigint
                 FROM commands WHERE finished_at > $1 AND finished_at <= $2",
            )
            .await
            .map_err(backend)?;
        self.sent(2);
        let row = client
            .query_one(
                &counts,
                &[&millis(online.long_poll)?, &millis(online.interval)?],
            )
            .await
            .map_err(backend)?;
        let count = |i: usize| -> Result<u64, StoreError> {
            let n: i64 = row.try_get(i).map_err(corrupt)?;
            u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("a count of {n}")))
        };
        let oldest: Option<i64> = row.try_get(2).map_err(corrupt)?;
        let rows = client
            .query(&finished, &[&millis(after)?, &millis(until)?])
            .await
            .map_err(backend)?;
        let optional = |v: Option<i64>| v.map(timestamp).transpose();
        let finished = rows
            .iter()
            .map(|r| {
                let created_at = optional(r.try_get(2).map_err(corrupt)?)?.ok_or_else(|| {
                    StoreError::Corrupt("a finished record without created_at".into())
                })?;
                Ok(FinishedRun::from_times(
                    r.try_get(0).map_err(corrupt)?,
                    timestamp(r.try_get(1).map_err(corrupt)?)?,
                    Some(created_at),
                    optional(r.try_get(3).map_err(corrupt)?)?,
                    optional(r.try_get(4).map_err(corrupt)?)?,
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(QueueFigures {
            queued: count(0)?,
            running: count(1)?,
            oldest_queued_at: optional(oldest)?,
            desktops_known: count(3)?,
            desktops_online: count(4)?,
            finished,
        })
    }
}

/// The status in one statement. Each part is aggregated into one JSON
/// array (one row in all, one snapshot): desktops and shares in bytewise
/// order (`COLLATE "C"`, as SQLite's default), the queue oldest first with
/// ties in insertion order, finished runs by status, and the times of the
/// runs that started within the window. `$1` is the window's start, `$2`
/// the most queued runs listed.
const QUEUE_STATS: &str = r#"
WITH running AS (
    SELECT owner, device, count(*) AS n FROM commands
    WHERE finished_at IS NULL AND status = 'running' GROUP BY owner, device
),
desktops AS (
    SELECT coalesce(json_agg(json_build_array(
               d.owner, d.device, d.last_sync_at, d.last_seen_at, d.long_poll, coalesce(r.n, 0))
           ORDER BY d.owner COLLATE "C", d.device COLLATE "C"), '[]') AS list
    FROM devices AS d LEFT JOIN running AS r ON r.owner = d.owner AND r.device = d.device
),
shares AS (
    SELECT coalesce(json_agg(json_build_array(owner, project, sessions, desktops)
           ORDER BY owner COLLATE "C", project COLLATE "C"), '[]') AS list
    FROM (SELECT owner, project, count(DISTINCT graph_session_id) AS sessions,
                 count(DISTINCT device) AS desktops
          FROM shared_sessions GROUP BY owner, project) AS s
),
queue AS (
    SELECT coalesce(json_agg(json_build_array(id, owner, project, device, created_at)
           ORDER BY created_at, seq), '[]') AS list
    FROM (SELECT id, owner, project, device, created_at, seq FROM commands
          WHERE finished_at IS NULL AND status = 'queued' ORDER BY created_at, seq LIMIT $2) AS q
),
finished AS (
    SELECT coalesce(json_agg(json_build_array(status, n)), '[]') AS list
    FROM (SELECT status, count(*) AS n FROM commands
          WHERE finished_at >= $1 GROUP BY status) AS f
),
pickups AS (
    SELECT coalesce(json_agg(json_build_array(created, started)), '[]') AS list
    FROM (SELECT created_at AS created,
                 (record::jsonb ->> 'started_at')::bigint AS started
          FROM commands WHERE finished_at >= $1 OR (finished_at IS NULL AND status = 'running')) AS p
    WHERE started >= $1 AND created IS NOT NULL
)
SELECT (SELECT count(*) FROM commands WHERE finished_at IS NULL AND status = 'queued'),
       (SELECT coalesce(sum(n), 0)::bigint FROM running),
       desktops.list::text, shares.list::text, queue.list::text,
       finished.list::text, pickups.list::text
FROM desktops, shares, queue, finished, pickups
"#;

impl PostgresStore {
    /// The operator's status as of `now`: every desktop, the shares, at
    /// most `queue_limit` queued runs (oldest first) and the counts, and
    /// the runs that finished, and the pickups of the runs that started,
    /// no earlier than `window` before `now`. The same document as the
    /// SQLite store's `QueueStats::read` of the same queue; one statement.
    pub async fn queue_stats(
        &self,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<QueueStats, StoreError> {
        let since = millis(window_start(now, window))?;
        // As the SQLite store: a limit past i64 lists everything.
        let limit = i64::try_from(queue_limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let statement = self.statement(&client, QUEUE_STATS).await?;
        let row = client
            .query_one(&statement, &[&since, &limit])
            .await
            .map_err(backend)?;
        let queued = count(row.try_get(0).map_err(corrupt)?)?;
        let running = count(row.try_get(1).map_err(corrupt)?)?;
        let list = |i: usize| -> Result<String, StoreError> { row.try_get(i).map_err(corrupt) };
        let desktops = desktops(&list(2)?)?;
        let shares = shares(&list(3)?)?;
        let queue = queue(&list(4)?)?;
        let mut recent_by_status = recent_by_status(&list(5)?)?;
        recent_by_status.insert("queued".to_owned(), queued);
        recent_by_status.insert("running".to_owned(), running);
        let pickups = pickups(&list(6)?)?;
        Ok(QueueStats {
            now,
            desktops,
            shares,
            queue,
            queued,
            running,
            recent_by_status,
            pickups,
        })
    }
}

/// The status's desktops: (owner, device, last sync, last seen, long
/// poll, running runs) each.
fn desktops(json: &str) -> Result<Vec<DesktopStats>, StoreError> {
    decode::<Vec<(String, String, Option<i64>, i64, bool, i64)>>("desktops", json)?
        .into_iter()
        .map(
            |(owner, device, last_sync, last_seen, long_poll, running)| {
                Ok(DesktopStats {
                    owner,
                    device,
                    last_seen_at: timestamp(last_seen)?,
                    last_sync_at: last_sync.map(timestamp).transpose()?,
                    long_poll,
                    running: count(running)?,
                })
            },
        )
        .collect()
}

/// The status's shares: (owner, project, sessions, desktops) each.
fn shares(json: &str) -> Result<Vec<ProjectShares>, StoreError> {
    decode::<Vec<(String, String, i64, i64)>>("shares", json)?
        .into_iter()
        .map(|(owner, project, sessions, desktops)| {
            Ok(ProjectShares {
                owner,
                project,
                sessions: count(sessions)?,
                desktops: count(desktops)?,
            })
        })
        .collect()
}

/// The status's queued runs: (id, owner, project, device, created) each.
fn queue(json: &str) -> Result<Vec<QueuedRun>, StoreError> {
    decode::<Vec<(String, String, String, String, i64)>>("queue", json)?
        .into_iter()
        .map(|(command_id, owner, project, device, created_at)| {
            Ok(QueuedRun {
                command_id,
                owner,
                project,
                device,
                created_at: timestamp(created_at)?,
            })
        })
        .collect()
}

/// The status's finished runs in the window: (status, count) each.
fn recent_by_status(json: &str) -> Result<BTreeMap<String, u64>, StoreError> {
    decode::<Vec<(String, i64)>>("finished runs", json)?
        .into_iter()
        .map(|(status, n)| Ok((status, count(n)?)))
        .collect()
}

/// The status's pickups: (created, started) each, as the time between
/// them, shortest first.
fn pickups(json: &str) -> Result<Vec<Duration>, StoreError> {
    let mut pickups = decode::<Vec<(i64, i64)>>("pickups", json)?
        .into_iter()
        .map(|(created, started)| Ok(timestamp(started)?.since(timestamp(created)?)))
        .collect::<Result<Vec<Duration>, StoreError>>()?;
    pickups.sort();
    Ok(pickups)
}

/// A count read from the database.
fn count(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("a count of {n}")))
}

/// One of the status statement's JSON arrays.
fn decode<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("the status's {what} do not decode: {e}")))
}

/// What the operator's status and the metrics read: [`PostgresStore::queue_stats`]
/// and [`PostgresStore::queue_figures`] with the core's online rule.
#[async_trait::async_trait]
impl OperatorStats for PostgresStore {
    async fn stats(
        &self,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<QueueStats, StoreError> {
        self.queue_stats(now, window, queue_limit).await
    }

    async fn figures(
        &self,
        now: Timestamp,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueFigures, StoreError> {
        let online = OnlineSince {
            long_poll: online_since(now, true),
            interval: online_since(now, false),
        };
        self.queue_figures(online, after, until).await
    }
}
