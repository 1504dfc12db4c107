//! Figures of a cluster run taken every `--report-every` seconds: the
//! servers' resident memory and sockets, the database's table and index
//! sizes and its connections, and the pickup of the runs sent in the
//! interval. A row goes to stderr as each interval ends (a long soak shows
//! how it goes), and every row is in the report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::cluster::Cluster;
use super::own_postgres::DatabaseFigures;
use super::tally::Tally;
use super::{Latency, ProcessSample};

/// One server at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSample {
    /// Its name (`s1`, …).
    pub name: String,
    /// Its process id, while it runs.
    pub pid: Option<u32>,
    /// Resident memory, MiB.
    pub rss_mib: Option<f64>,
    /// Open sockets (HTTP connections, its Postgres connections,
    /// listeners).
    pub sockets: Option<usize>,
}

/// The cluster at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSample {
    /// Seconds since the start of the load.
    pub at_s: f64,
    /// Each server.
    pub servers: Vec<ServerSample>,
    /// The database (`None` while it does not answer).
    pub database: Option<DatabaseFigures>,
}

/// One interval's row.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalRow {
    /// Seconds since the start of the load, at the interval's end.
    pub until_s: f64,
    /// Pickup of the runs sent in the interval and picked up by its end
    /// by an in-process desktop (a worker's runs are read from its ledger
    /// at the end).
    pub pickup_ms: Latency,
    /// The cluster at the interval's end.
    pub sample: ClusterSample,
}

/// Takes a sample of every server and of the database.
pub async fn sample(cluster: &Cluster, origin: Instant) -> ClusterSample {
    let servers = cluster
        .server_names()
        .into_iter()
        .zip(cluster.pids())
        .map(|(name, pid)| {
            let process = pid.and_then(ProcessSample::of);
            ServerSample {
                name,
                pid,
                rss_mib: process.map(|p| p.rss_bytes as f64 / (1024.0 * 1024.0)),
                sockets: pid.and_then(sockets_of),
            }
        })
        .collect();
    ClusterSample {
        at_s: origin.elapsed().as_secs_f64(),
        servers,
        database: cluster.postgres().figures().await,
    }
}

/// Takes a row every `every` until `stop` turns true, printing each on
/// stderr; returns the rows.
pub async fn every(
    cluster: Arc<Cluster>,
    tally: Arc<Tally>,
    origin: Instant,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<IntervalRow> {
    let mut rows = Vec::new();
    let mut from = origin;
    loop {
        let deadline = tokio::time::Instant::from_std(from + every);
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let to = Instant::now();
        let row = IntervalRow {
            until_s: to.saturating_duration_since(origin).as_secs_f64(),
            pickup_ms: Latency::of(tally.pickups_sent_between(from, to)),
            sample: sample(&cluster, origin).await,
        };
        eprintln!("{}", row.line());
        rows.push(row);
        from = to;
    }
    rows
}

impl IntervalRow {
    /// The row as one line.
    pub fn line(&self) -> String {
        let p = &self.pickup_ms;
        let rss: Vec<String> = self
            .sample
            .servers
            .iter()
            .map(|s| s.rss_mib.map_or("down".to_owned(), |m| format!("{m:.0}")))
            .collect();
        let sockets: Vec<String> = self
            .sample
            .servers
            .iter()
            .map(|s| s.sockets.map_or("-".to_owned(), |n| n.to_string()))
            .collect();
        let database = self.sample.database.as_ref().map_or_else(
            || "database: no answer".to_owned(),
            |d| {
                format!(
                    "pg connections {}  tables+indexes {:.1} MiB",
                    d.connection_count(),
                    d.total_bytes() as f64 / (1024.0 * 1024.0)
                )
            },
        );
        format!(
            "+{:>6.0}s  picked up {:>5}  pickup p50 {:>7.1}  p99 {:>7.1}  max {:>8.1} ms  RSS MiB {}  sockets {}  {database}",
            self.until_s,
            p.count,
            p.p50,
            p.p99,
            p.max,
            rss.join("/"),
            sockets.join("/"),
        )
    }
}

/// Open sockets of process `pid` (`/proc/PID/fd` links to `socket:`).
fn sockets_of(pid: u32) -> Option<usize> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        entries
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count(),
    )
}
