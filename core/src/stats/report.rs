//! The operator's status document: what `graph-relay status --json`
//! prints and `/admin/status` answers, made from a [`QueueStats`]. Times
//! are RFC 3339 text and durations whole milliseconds, so that any client
//! can read it without this crate.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::QueueStats;

/// How far back the status's "last hour" reaches.
pub const STATUS_WINDOW: Duration = Duration::from_secs(3600);

/// The status document (`status --json`, `/admin/status`): times in RFC
/// 3339, durations in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// When it was read.
    pub now: String,
    /// Every desktop ever seen.
    pub desktops: Vec<DesktopStatus>,
    /// Shared sessions per (owner, project).
    pub shared: Vec<SharedStatus>,
    /// The queue.
    pub queue: QueueStatus,
    /// The last hour's runs and pickups.
    pub last_hour: LastHour,
}

/// One desktop in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesktopStatus {
    /// Its owner.
    pub owner: String,
    /// Its name.
    pub desktop: String,
    /// Its last request of any kind.
    pub last_seen_at: String,
    /// How long ago that was.
    pub last_seen_ms_ago: u64,
    /// `long-poll` or `interval`.
    pub mode: String,
    /// Heard from within three expected sync gaps.
    pub online: bool,
    /// Its runs running now.
    pub running: u64,
}

/// The sessions shared to one project, in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedStatus {
    /// The owner.
    pub owner: String,
    /// The project.
    pub project: String,
    /// Distinct graph sessions shared there.
    pub sessions: u64,
    /// Desktops sharing them.
    pub desktops: u64,
}

/// The queue in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// Queued runs, all of them.
    pub depth: u64,
    /// The oldest queued runs (at most the limit asked for).
    pub oldest_first: Vec<QueuedStatus>,
}

/// One queued run in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedStatus {
    /// Its command id.
    pub command_id: String,
    /// The owner.
    pub owner: String,
    /// The project it was filed under.
    pub project: String,
    /// The desktop it is assigned to.
    pub desktop: String,
    /// When it was queued.
    pub queued_at: String,
    /// How long it has waited.
    pub age_ms: u64,
}

/// The last hour in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastHour {
    /// Runs finished in the last hour by status, plus those queued and
    /// running now.
    pub runs_by_status: BTreeMap<String, u64>,
    /// Runs that started in the last hour.
    pub pickups: usize,
    /// Their median pickup latency (queued → running).
    pub pickup_p50_ms: Option<u64>,
    /// Their 99th percentile pickup latency.
    pub pickup_p99_ms: Option<u64>,
}

impl StatusReport {
    /// The report of a database snapshot.
    pub fn from_stats(stats: &QueueStats) -> Self {
        let now = stats.now;
        Self {
            now: now.to_rfc3339(),
            desktops: stats
                .desktops
                .iter()
                .map(|d| DesktopStatus {
                    owner: d.owner.clone(),
                    desktop: d.device.clone(),
                    last_seen_at: d.last_seen_at.to_rfc3339(),
                    last_seen_ms_ago: ms(now.since(d.last_seen_at)),
                    mode: mode(d.long_poll).to_owned(),
                    online: d.is_online(now),
                    running: d.running,
                })
                .collect(),
            shared: stats
                .shares
                .iter()
                .map(|s| SharedStatus {
                    owner: s.owner.clone(),
                    project: s.project.clone(),
                    sessions: s.sessions,
                    desktops: s.desktops,
                })
                .collect(),
            queue: QueueStatus {
                depth: stats.queued,
                oldest_first: stats
                    .queue
                    .iter()
                    .map(|q| QueuedStatus {
                        command_id: q.command_id.clone(),
                        owner: q.owner.clone(),
                        project: q.project.clone(),
                        desktop: q.device.clone(),
                        queued_at: q.created_at.to_rfc3339(),
                        age_ms: ms(now.since(q.created_at)),
                    })
                    .collect(),
            },
            last_hour: LastHour {
                runs_by_status: stats.recent_by_status.clone(),
                pickups: stats.pickups.len(),
                pickup_p50_ms: stats.pickup_quantile(0.5).map(ms),
                pickup_p99_ms: stats.pickup_quantile(0.99).map(ms),
            },
        }
    }
}

fn mode(long_poll: bool) -> &'static str {
    if long_poll { "long-poll" } else { "interval" }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
