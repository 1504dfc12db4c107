//! What an operator reads from the queue database: `graph-relay status`
//! (desktops, shares, the queue, the last hour's runs and pickup latency,
//! as text or `--json`) and the store figures behind `serve --metrics`.
//! On SQLite both open the file read-only, next to a running server; on
//! Postgres the server asks its database.
//!
//! `status --server URL --token FILE` reads the same document from a
//! running server instead: `GET /admin/status` on its metrics listener
//! (never the MCP port: the status spans every owner), answered to a
//! bearer of the operator token by [`SqliteStatus`] or, for a server on
//! Postgres, [`PostgresStatus`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::Clock;
use graph_relay_core::time::{SystemClock, Timestamp};
use graph_relay_store_sqlite::stats::{
    QueueStats, ReadQueueStats, StatsError, finished_between, online_since,
};
use graph_relay_transport_http::metrics::{
    FinishedSample, OperatorStatus, QueueFigures, QueueSnapshot, STATUS_PATH,
};
use serde::{Deserialize, Serialize};

/// Options of `graph-relay status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The server's SQLite database (opened read-only).
    #[arg(long, default_value = "graph-relay.db")]
    pub db: PathBuf,
    /// Ask a running server instead of reading the database: the base URL
    /// of its metrics listener (`serve --metrics`), e.g.
    /// http://127.0.0.1:9187.
    #[arg(long, value_name = "URL", requires = "token")]
    pub server: Option<String>,
    /// File holding the operator token (`graph-relay token operator`), for
    /// `--server`.
    #[arg(long, value_name = "FILE", requires = "server")]
    pub token: Option<PathBuf>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// List at most this many queued runs (oldest first).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// Why `graph-relay status` printed nothing.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The database could not be read.
    #[error(transparent)]
    Stats(#[from] StatsError),
    /// The operator token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server could not be asked.
    #[error("cannot reach {url}: {message}")]
    Request {
        /// The URL asked.
        url: String,
        /// Why.
        message: String,
    },
    /// The server answered with an error.
    #[error("{url} answered {status}: {message}")]
    Refused {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// Its body (bounded).
        message: String,
    },
    /// The server's answer is not a status document.
    #[error("{url} answered something other than a status: {message}")]
    Decode {
        /// The URL asked.
        url: String,
        /// Why.
        message: String,
    },
    /// The runtime for the request could not start.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How far back "recent" runs and pickups reach.
const WINDOW: Duration = Duration::from_secs(3600);

/// The longest error text kept from a server's answer.
const MAX_ERROR_TEXT: usize = 500;

/// Prints the status of the database or server in `args`.
pub fn run(args: &StatusArgs) -> Result<(), StatusError> {
    let (source, report) = match (&args.server, &args.token) {
        (Some(server), Some(token)) => {
            let report = fetch(server, token, args.limit)?;
            (server.clone(), report)
        }
        _ => {
            let stats = QueueStats::read(&args.db, SystemClock.now(), WINDOW, args.limit)?;
            (
                args.db.display().to_string(),
                StatusReport::from_stats(&stats),
            )
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", render(&source, &report));
    }
    Ok(())
}

/// `GET <server>/admin/status?limit=N` with the operator token in `token`.
fn fetch(server: &str, token: &Path, limit: usize) -> Result<StatusReport, StatusError> {
    let secret = std::fs::read_to_string(token)
        .map_err(|source| StatusError::Token {
            path: token.to_owned(),
            source,
        })?
        .trim()
        .to_owned();
    let url = format!("{}{STATUS_PATH}", server.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let request_error = |e: reqwest::Error| StatusError::Request {
            url: url.clone(),
            message: e.to_string(),
        };
        let response = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(request_error)?
            .get(&url)
            .query(&[("limit", limit)])
            .bearer_auth(secret)
            .send()
            .await
            .map_err(request_error)?;
        let status = response.status();
        let body = response.text().await.map_err(request_error)?;
        if !status.is_success() {
            let message: String = body.trim().chars().take(MAX_ERROR_TEXT).collect();
            return Err(StatusError::Refused {
                url: url.clone(),
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_str(&body).map_err(|e| StatusError::Decode {
            url: url.clone(),
            message: e.to_string(),
        })
    })
}

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

/// The status as tables; `source` names the database or server read.
pub fn render(source: &str, report: &StatusReport) -> String {
    use std::fmt::Write;
    let millis = Duration::from_millis;
    let mut out = String::new();
    let _ = writeln!(out, "graph-relay status of {source} at {}", report.now);
    let _ = writeln!(out, "\nDesktops ({})", report.desktops.len());
    if report.desktops.is_empty() {
        let _ = writeln!(out, "  none has connected yet");
    } else {
        let _ = writeln!(
            out,
            "  {:<16} {:<20} {:<12} {:<10} state",
            "owner", "desktop", "last seen", "mode"
        );
        for d in &report.desktops {
            let state = match (d.online, d.running) {
                (true, 0) => "online, idle".to_owned(),
                (true, n) => format!("online, running {n}"),
                (false, 0) => "offline".to_owned(),
                (false, n) => format!("offline, {n} run(s) still running"),
            };
            let _ = writeln!(
                out,
                "  {:<16} {:<20} {:<12} {:<10} {state}",
                d.owner,
                d.desktop,
                ago(millis(d.last_seen_ms_ago)),
                d.mode
            );
        }
    }
    let _ = writeln!(out, "\nShared sessions");
    if report.shared.is_empty() {
        let _ = writeln!(out, "  nothing is shared");
    }
    for s in &report.shared {
        let _ = writeln!(
            out,
            "  {}/{}: {} session(s) from {} desktop(s)",
            s.owner, s.project, s.sessions, s.desktops
        );
    }
    let queue = &report.queue;
    let _ = writeln!(out, "\nQueue ({} queued, oldest first)", queue.depth);
    for q in &queue.oldest_first {
        let _ = writeln!(
            out,
            "  {:>8}  {}  {}/{} on {}",
            ago(millis(q.age_ms)),
            q.command_id,
            q.owner,
            q.project,
            q.desktop
        );
    }
    let listed = queue.oldest_first.len() as u64;
    if queue.depth > listed {
        let _ = writeln!(out, "  … and {} more", queue.depth - listed);
    }
    let _ = writeln!(
        out,
        "\nRuns of the last hour (finished), and now (queued, running)"
    );
    let last = &report.last_hour;
    let by_status: Vec<String> = last
        .runs_by_status
        .iter()
        .map(|(status, n)| format!("{status} {n}"))
        .collect();
    let _ = writeln!(out, "  {}", by_status.join(", "));
    match (last.pickup_p50_ms, last.pickup_p99_ms) {
        (Some(p50), Some(p99)) => {
            let _ = writeln!(
                out,
                "\nPickup latency (queued → running, {} run(s) of the last hour): p50 {}, p99 {}",
                last.pickups,
                short(millis(p50)),
                short(millis(p99))
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

/// The operator's status (`/admin/status`), read from the SQLite file at
/// each request, read-only: the document `status --json` prints.
#[derive(Debug, Clone)]
pub struct SqliteStatus {
    path: PathBuf,
}

impl SqliteStatus {
    /// The status of the database at `path`.
    pub fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(Self { path })
    }
}

#[async_trait::async_trait]
impl OperatorStatus for SqliteStatus {
    async fn status(&self, limit: usize) -> Result<serde_json::Value, String> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let stats = QueueStats::read(&path, SystemClock.now(), WINDOW, limit)
                .map_err(|e| e.to_string())?;
            serde_json::to_value(StatusReport::from_stats(&stats)).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// The operator's status (`/admin/status`) of a server on Postgres, read
/// from the database at each request (one statement): the same document as
/// [`SqliteStatus`] gives for the same queue.
#[derive(Debug, Clone)]
pub struct PostgresStatus {
    store: graph_relay_store_postgres::PostgresStore,
}

impl PostgresStatus {
    /// The status of `store`'s database.
    pub fn new(store: graph_relay_store_postgres::PostgresStore) -> Arc<Self> {
        Arc::new(Self { store })
    }
}

#[async_trait::async_trait]
impl OperatorStatus for PostgresStatus {
    async fn status(&self, limit: usize) -> Result<serde_json::Value, String> {
        let stats = self
            .store
            .queue_stats(SystemClock.now(), WINDOW, limit)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_value(StatusReport::from_stats(&stats)).map_err(|e| e.to_string())
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
                finished: finished.into_iter().map(FinishedSample::from).collect(),
            })
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }
}

/// The metrics' store figures of a server on Postgres, read at each scrape
/// (two statements; totals over every owner, like the SQLite ones).
#[derive(Debug, Clone)]
pub struct PostgresFigures {
    store: graph_relay_store_postgres::PostgresStore,
}

impl PostgresFigures {
    /// Figures from `store`'s database.
    pub fn new(store: graph_relay_store_postgres::PostgresStore) -> Arc<Self> {
        Arc::new(Self { store })
    }
}

#[async_trait::async_trait]
impl QueueFigures for PostgresFigures {
    async fn snapshot(
        &self,
        now: Timestamp,
        after: Timestamp,
        until: Timestamp,
    ) -> Result<QueueSnapshot, String> {
        let online = graph_relay_store_postgres::figures::OnlineSince {
            long_poll: online_since(now, true),
            interval: online_since(now, false),
        };
        let figures = self
            .store
            .queue_figures(online, after, until)
            .await
            .map_err(|e| e.to_string())?;
        Ok(QueueSnapshot {
            queued: figures.queued,
            running: figures.running,
            oldest_queued: figures.oldest_queued_at.map(|t| now.since(t)),
            desktops_online: figures.desktops_online,
            desktops_known: figures.desktops_known,
            finished: figures
                .finished
                .into_iter()
                .map(FinishedSample::from)
                .collect(),
        })
    }
}
