//! What an operator reads about a queue: which desktops are online, what
//! is shared, what waits, how runs ended and how long pickups took.
//!
//! Plain data, filled by the stores that keep a database
//! (`graph_relay_store_sqlite::stats::QueueStats::read` on the SQLite file,
//! `PostgresStore::queue_stats` on Postgres) with the same meaning for
//! every field, and read by `graph-relay status`, `/admin/status` and the
//! metrics. Only the rules that need no IO live here: when a desktop counts
//! as online, a finished run's latencies, and the pickup quantiles.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::store::StoreError;
use crate::time::Timestamp;

mod report;
pub use report::{
    DesktopStatus, LastHour, QueueStatus, QueuedStatus, STATUS_WINDOW, SharedStatus, StatusReport,
};

/// What a store tells the operator about its queue: the status document's
/// snapshot and the metrics' figures. Totals over every owner: a server
/// answers them on its operator listener only, never to an agent or a
/// desktop. The SQLite and Postgres stores implement it with the same
/// meaning for every field; a server built with one serves
/// `/admin/status` and the queue gauges of its metrics from it.
///
/// ```
/// use std::time::Duration;
/// use graph_relay_core::stats::{OperatorStats, QueueFigures, QueueStats, StatusReport};
/// use graph_relay_core::store::StoreError;
/// use graph_relay_core::time::Timestamp;
///
/// /// A queue that is always empty.
/// struct Empty;
///
/// #[graph_relay_core::async_trait]
/// impl OperatorStats for Empty {
///     async fn stats(&self, now: Timestamp, _: Duration, _: usize) -> Result<QueueStats, StoreError> {
///         Ok(QueueStats { now, ..QueueStats::default() })
///     }
///     async fn figures(&self, _: Timestamp, _: Timestamp, _: Timestamp) -> Result<QueueFigures, StoreError> {
///         Ok(QueueFigures::default())
///     }
/// }
///
/// let stats = futures::executor::block_on(Empty.stats(Timestamp(0), Duration::from_secs(60), 20))?;
/// let report = StatusReport::from_stats(&stats);
/// assert_eq!(report.queue.depth, 0);
/// # Ok::<(), StoreError>(())
/// ```
#[async_trait::async_trait]
pub trait OperatorStats: Send + Sync {
    /// The queue as of `now`, with the runs that finished and the pickups
    /// of the runs that started no earlier than `window` before it, listing
    /// at most `queue_limit` queued runs (oldest first).
    async fn stats(
        &self,
        now: Timestamp,
        window: Duration,
        queue_limit: usize,
    ) -> Result<QueueStats, StoreError>;

    /// The metrics' figures at `now`, with the runs that finished after
    /// `after` and no later than `until`. Cheaper than [`stats`](Self::stats):
    /// a scrape reads it every few seconds.
    async fn figures(
        &self,
        now: Timestamp,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueFigures, StoreError>;
}

/// The queue's figures as the metrics show them ([`OperatorStats::figures`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueFigures {
    /// Runs queued now.
    pub queued: u64,
    /// Runs running now.
    pub running: u64,
    /// When the oldest queued run was queued.
    pub oldest_queued_at: Option<Timestamp>,
    /// Desktops ever seen.
    pub desktops_known: u64,
    /// Desktops online now ([`online_since`]).
    pub desktops_online: u64,
    /// Runs that finished in the interval asked for, in no order, with
    /// their pickup and cancel latencies.
    pub finished: Vec<FinishedRun>,
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
/// expected sync gaps back (25 s holds, 20 s passes). Every store counts
/// online desktops by this rule.
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

impl FinishedRun {
    /// The run with `status` that finished at `finished_at`, from the times
    /// its record holds: the pickup needs both `created_at` and
    /// `started_at`; the cancel latency runs from `cancel_requested_at`.
    pub fn from_times(
        status: String,
        finished_at: Timestamp,
        created_at: Option<Timestamp>,
        started_at: Option<Timestamp>,
        cancel_requested_at: Option<Timestamp>,
    ) -> Self {
        Self {
            status,
            finished_at,
            pickup: match (created_at, started_at) {
                (Some(created), Some(started)) => Some(started.since(created)),
                _ => None,
            },
            cancel: cancel_requested_at.map(|t| finished_at.since(t)),
        }
    }
}

/// A snapshot of a queue database.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueStats {
    /// The time the snapshot is for.
    pub now: Timestamp,
    /// Every desktop ever seen, by owner and name (bytewise order).
    pub desktops: Vec<DesktopStats>,
    /// Shared sessions per (owner, project), in bytewise order.
    pub shares: Vec<ProjectShares>,
    /// Queued runs, oldest first, ties in the order they were queued (at
    /// most the limit asked for).
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

/// The start of the window of `window` ending at `now` (saturating at the
/// epoch): finished runs and pickups at or after it count as recent.
pub fn window_start(now: Timestamp, window: Duration) -> Timestamp {
    now.minus(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(pickups: &[u64]) -> QueueStats {
        QueueStats {
            now: Timestamp(0),
            desktops: Vec::new(),
            shares: Vec::new(),
            queue: Vec::new(),
            queued: 0,
            running: 0,
            recent_by_status: BTreeMap::new(),
            pickups: pickups
                .iter()
                .map(|&ms| Duration::from_millis(ms))
                .collect(),
        }
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        assert_eq!(stats(&[]).pickup_quantile(0.5), None);
        let s = stats(&[10, 20, 30, 40]);
        assert_eq!(s.pickup_quantile(0.5), Some(Duration::from_millis(20)));
        assert_eq!(s.pickup_quantile(0.99), Some(Duration::from_millis(40)));
        assert_eq!(s.pickup_quantile(0.0), Some(Duration::from_millis(10)));
        assert_eq!(s.pickup_quantile(7.0), Some(Duration::from_millis(40)));
    }

    #[test]
    fn a_desktop_is_online_within_three_gaps_of_its_mode() {
        let now = Timestamp(1_000_000);
        let desktop = |last_seen_ms_ago: u64, long_poll: bool| DesktopStats {
            owner: "alice".into(),
            device: "desk".into(),
            last_seen_at: now.minus(Duration::from_millis(last_seen_ms_ago)),
            last_sync_at: None,
            long_poll,
            running: 0,
        };
        assert!(desktop(60_000, false).is_online(now));
        assert!(!desktop(60_001, false).is_online(now));
        assert!(desktop(75_000, true).is_online(now));
        assert!(!desktop(75_001, true).is_online(now));
        // A later sync than the last request counts.
        let mut synced = desktop(100_000, false);
        synced.last_sync_at = Some(now);
        assert!(synced.is_online(now));
    }

    #[test]
    fn a_finished_run_has_a_pickup_only_if_it_started() {
        let t = Timestamp;
        let run =
            FinishedRun::from_times("completed".into(), t(50), Some(t(10)), Some(t(30)), None);
        assert_eq!(run.pickup, Some(Duration::from_millis(20)));
        assert_eq!(run.cancel, None);
        let run =
            FinishedRun::from_times("cancelled".into(), t(50), Some(t(10)), None, Some(t(45)));
        assert_eq!(run.pickup, None);
        assert_eq!(run.cancel, Some(Duration::from_millis(5)));
        assert_eq!(window_start(t(5), Duration::from_secs(1)), t(0));
    }
}
