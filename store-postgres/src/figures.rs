//! What a server's metrics show about the queue on Postgres: how many
//! runs wait and run, the oldest waiting one, the desktops known and
//! online, and the runs that finished in an interval (for the pickup and
//! cancel latency histograms). Totals over every owner, for the operator.
//!
//! Two statements per call, both on indexed columns but for the finished
//! runs' times, which are read from their records.

use graph_relay_core::time::Timestamp;

use crate::store::{PostgresStore, backend, corrupt, millis, timestamp};
use graph_relay_core::store::StoreError;

/// When a desktop last had to be heard from to count as online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnlineSince {
    /// For a desktop whose last sync was a held (long-poll) one.
    pub long_poll: Timestamp,
    /// For a desktop that syncs at an interval.
    pub interval: Timestamp,
}

/// A snapshot of the queue ([`PostgresStore::queue_figures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFigures {
    /// Runs queued now.
    pub queued: u64,
    /// Runs running now.
    pub running: u64,
    /// When the oldest queued run was queued.
    pub oldest_queued_at: Option<Timestamp>,
    /// Desktops ever seen.
    pub desktops_known: u64,
    /// Desktops whose last contact (sync or other) is no earlier than
    /// [`OnlineSince`] says for their mode.
    pub desktops_online: u64,
    /// Runs that finished in the interval asked for, in no order.
    pub finished: Vec<FinishedRun>,
}

/// A finished run's times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedRun {
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    /// When it was queued.
    pub created_at: Timestamp,
    /// When a desktop started it, if one did.
    pub started_at: Option<Timestamp>,
    /// When its agent asked to cancel it, if it did.
    pub cancel_requested_at: Option<Timestamp>,
    /// When it finished.
    pub finished_at: Timestamp,
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
                    (SELECT count(*) FROM commands WHERE status = 'queued'),
                    (SELECT count(*) FROM commands WHERE status = 'running'),
                    (SELECT min(created_at) FROM commands WHERE status = 'queued'),
                    (SELECT count(*) FROM devices),
                    (SELECT count(*) FROM devices
                     WHERE GREATEST(last_seen_at, coalesce(last_sync_at, last_seen_at))
                           >= CASE WHEN long_poll THEN $1::bigint ELSE $2::bigint END)",
            )
            .await
            .map_err(backend)?;
        let finished = client
            .prepare_cached(
                "SELECT status, finished_at,
                        (record::jsonb ->> 'created_at')::bigint,
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
                Ok(FinishedRun {
                    status: r.try_get(0).map_err(corrupt)?,
                    finished_at: timestamp(r.try_get(1).map_err(corrupt)?)?,
                    created_at: optional(r.try_get(2).map_err(corrupt)?)?.ok_or_else(|| {
                        StoreError::Corrupt("a finished record without created_at".into())
                    })?,
                    started_at: optional(r.try_get(3).map_err(corrupt)?)?,
                    cancel_requested_at: optional(r.try_get(4).map_err(corrupt)?)?,
                })
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
