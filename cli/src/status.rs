//! `graph-relay status`: the operator's view of the queue (desktops,
//! shares, the queue, the last hour's runs and pickup latency) as tables
//! or `--json`. The document is the library's
//! ([`StatusReport`]); this module
//! only fetches and renders it.
//!
//! It reads the SQLite file read-only, next to a running server, or, with
//! `--server URL --token FILE`, asks a running server: `GET /admin/status`
//! on its metrics listener (never the MCP port: the status spans every
//! owner), which a server on SQLite or Postgres answers to a bearer of the
//! operator token.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use graph_relay_core::stats::{QueueStats, STATUS_WINDOW, StatusReport};
use graph_relay_core::time::Clock;
use graph_relay_core::time::SystemClock;
use graph_relay_store_sqlite::stats::{ReadQueueStats, StatsError};
use graph_relay_transport_http::metrics::STATUS_PATH;

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
            let stats = QueueStats::read(&args.db, SystemClock.now(), STATUS_WINDOW, args.limit)?;
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

/// The status as tables; `source` names the database or server read.
pub fn render(source: &str, report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "graph-relay status of {source} at {}", report.now);
    write_desktops(&mut out, report);
    write_shared(&mut out, report);
    write_queue(&mut out, report);
    write_last_hour(&mut out, report);
    out
}

/// Each desktop: when it was last seen, how it polls, what it runs.
fn write_desktops(out: &mut String, report: &StatusReport) {
    let millis = Duration::from_millis;
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
}

/// What each project shares, from how many desktops.
fn write_shared(out: &mut String, report: &StatusReport) {
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
}

/// The queue's depth and its oldest runs.
fn write_queue(out: &mut String, report: &StatusReport) {
    let millis = Duration::from_millis;
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
}

/// How the runs of the last hour ended, and how long their pickup took.
fn write_last_hour(out: &mut String, report: &StatusReport) {
    let millis = Duration::from_millis;
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
