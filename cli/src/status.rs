//! What an operator reads from the queue database: `graph-relay status`
//! (desktops, shares, the queue, the last hour's runs and pickup latency,
//! as text or `--json`) and the store figures behind `serve --metrics`.
//! Both open the SQLite file read-only, next to a running server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::Clock;
use graph_relay_core::time::{SystemClock, Timestamp};
use graph_relay_store_sqlite::stats::{QueueStats, StatsError, finished_between};
use graph_relay_transport_http::metrics::{FinishedSample, QueueFigures, QueueSnapshot};
use serde_json::{Value, json};

/// Options of `graph-relay status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The server's SQLite database (opened read-only).
    #[arg(long, default_value = "graph-relay.db")]
    pub db: PathBuf,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// List at most this many queued runs (oldest first).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// How far back "recent" runs and pickups reach.
const WINDOW: Duration = Duration::from_secs(3600);

/// Prints the status of the database in `args`.
pub fn run(args: &StatusArgs) -> Result<(), StatsError> {
    let stats = QueueStats::read(&args.db, SystemClock.now(), WINDOW, args.limit)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&stats)).unwrap_or_default()
        );
    } else {
        print!("{}", render(&args.db, &stats));
    }
    Ok(())
}

/// The status as one JSON document (times in RFC 3339, durations in ms).
pub fn to_json(stats: &QueueStats) -> Value {
    let now = stats.now;
    json!({
        "now": now.to_rfc3339(),
        "desktops": stats.desktops.iter().map(|d| json!({
            "owner": d.owner,
            "desktop": d.device,
            "last_seen_at": d.last_seen_at.to_rfc3339(),
            "last_seen_ms_ago": ms(now.since(d.last_seen_at)),
            "mode": mode(d.long_poll),
            "online": d.is_online(now),
            "running": d.running,
        })).collect::<Vec<_>>(),
        "shared": stats.shares.iter().map(|s| json!({
            "owner": s.owner,
            "project": s.project,
            "sessions": s.sessions,
            "desktops": s.desktops,
        })).collect::<Vec<_>>(),
        "queue": {
            "depth": stats.queued,
            "oldest_first": stats.queue.iter().map(|q| json!({
                "command_id": q.command_id,
                "owner": q.owner,
                "project": q.project,
                "desktop": q.device,
                "queued_at": q.created_at.to_rfc3339(),
                "age_ms": ms(now.since(q.created_at)),
            })).collect::<Vec<_>>(),
        },
        "last_hour": {
            "runs_by_status": stats.recent_by_status,
            "pickups": stats.pickups.len(),
            "pickup_p50_ms": stats.pickup_quantile(0.5).map(ms),
            "pickup_p99_ms": stats.pickup_quantile(0.99).map(ms),
        },
    })
}

/// The status as tables.
pub fn render(db: &Path, stats: &QueueStats) -> String {
    use std::fmt::Write;
    let now = stats.now;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "graph-relay status of {} at {}",
        db.display(),
        now.to_rfc3339()
    );
    let _ = writeln!(out, "\nDesktops ({})", stats.desktops.len());
    if stats.desktops.is_empty() {
        let _ = writeln!(out, "  none has connected yet");
    } else {
        let _ = writeln!(
            out,
            "  {:<16} {:<20} {:<12} {:<10} state",
            "owner", "desktop", "last seen", "mode"
        );
        for d in &stats.desktops {
            let state = match (d.is_online(now), d.running) {
                (true, 0) => "online, idle".to_owned(),
                (true, n) => format!("online, running {n}"),
                (false, 0) => "offline".to_owned(),
                (false, n) => format!("offline, {n} run(s) still running"),
            };
            let _ = writeln!(
                out,
                "  {:<16} {:<20} {:<12} {:<10} {state}",
                d.owner,
                d.device,
                ago(now.since(d.last_seen_at)),
                mode(d.long_poll)
            );
        }
    }
    let _ = writeln!(out, "\nShared sessions");
    if stats.shares.is_empty() {
        let _ = writeln!(out, "  nothing is shared");
    }
    for s in &stats.shares {
        let _ = writeln!(
            out,
            "  {}/{}: {} session(s) from {} desktop(s)",
            s.owner, s.project, s.sessions, s.desktops
        );
    }
    let _ = writeln!(out, "\nQueue ({} queued, oldest first)", stats.queued);
    for q in &stats.queue {
        let _ = writeln!(
            out,
            "  {:>8}  {}  {}/{} on {}",
            ago(now.since(q.created_at)),
            q.command_id,
            q.owner,
            q.project,
            q.device
        );
    }
    if stats.queued > stats.queue.len() as u64 {
        let _ = writeln!(
            out,
            "  … and {} more",
            stats.queued - stats.queue.len() as u64
        );
    }
    let _ = writeln!(
        out,
        "\nRuns of the last hour (finished), and now (queued, running)"
    );
    let by_status: Vec<String> = stats
        .recent_by_status
        .iter()
        .map(|(status, n)| format!("{status} {n}"))
        .collect();
    let _ = writeln!(out, "  {}", by_status.join(", "));
    match (stats.pickup_quantile(0.5), stats.pickup_quantile(0.99)) {
        (Some(p50), Some(p99)) => {
            let _ = writeln!(
                out,
                "\nPickup latency (queued → running, {} run(s) of the last hour): p50 {}, p99 {}",
                stats.pickups.len(),
                short(p50),
                short(p99)
            );
        }
        _ => {
            let _ = writeln!(out, "\nPickup latency: no run started in the last hour");
        }
    }
    out
}

fn mode(long_poll: bool) -> &'static str {
    if long_poll { "long-poll" } else { "interval" }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `12 ms`, `3.4 s`, `5 min`.
fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d < Duration::from_secs(120) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} min", d.as_secs() / 60)
    }
}

/// `3 s ago`, `12 min ago`, `2 h ago`.
fn ago(d: Duration) -> String {
    let s = d.as_secs();
    if s < 120 {
        format!("{s} s ago")
    } else if s < 7200 {
        format!("{} min ago", s / 60)
    } else {
        format!("{} h ago", s / 3600)
    }
}

/// The metrics' store figures, read from the SQLite file at each scrape.
#[derive(Debug, Clone)]
pub struct SqliteFigures {
    path: PathBuf,
}

impl SqliteFigures {
    /// Figures from the database at `path`.
    pub fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(Self { path })
    }
}

#[async_trait::async_trait]
impl QueueFigures for SqliteFigures {
    async fn snapshot(
        &self,
        now: Timestamp,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueSnapshot, String> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let stats = QueueStats::read(&path, now, Duration::ZERO, 1)?;
            let finished = finished_between(&path, after, until)?;
            Ok::<_, StatsError>(QueueSnapshot {
                queued: stats.queued,
                running: stats.running,
                oldest_queued: stats.queue.first().map(|q| now.since(q.created_at)),
                desktops_online: stats.desktops.iter().filter(|d| d.is_online(now)).count() as u64,
                desktops_known: stats.desktops.len() as u64,
                finished: finished
                    .into_iter()
                    .map(|f| FinishedSample {
                        status: f.status,
                        pickup: f.pickup,
                        cancel: f.cancel,
                    })
                    .collect(),
            })
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }
}
