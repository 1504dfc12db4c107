//! The cluster's part of `graph-relay loadtest --cluster`'s report: each
//! fault's window (from [`faults`]), the rows taken every
//! `--report-every` seconds and the cluster before and after the load,
//! as JSON and as the table printed after the load's own figures.

use std::fmt::Write;

use serde::Serialize;

use super::ClusterRun;
use super::agents::RunRecord;
use super::faults::{self, FaultFigures, RECOVERED_P99_MS};
use super::samples::{self, ClusterSample};
use super::tally::Tally;

/// What a cluster run adds to the report.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// The load balancer's URL.
    pub balancer: String,
    /// Each server: name and URL.
    pub servers: Vec<String>,
    /// The baseline, then each fault.
    pub faults: Vec<faults::FaultFigures>,
    /// One row every `--report-every` seconds.
    pub intervals: Vec<samples::IntervalRow>,
    /// The cluster before the load.
    pub start: samples::ClusterSample,
    /// The cluster after it.
    pub end: samples::ClusterSample,
    /// Servers that exited without being told to (each is an error).
    pub unplanned_exits: Vec<String>,
}

/// The cluster's part of the report: each fault's window, the rows, the
/// first and last samples; a failed fault and a server that exited on its
/// own are errors.
pub(super) fn cluster_report(
    run: ClusterRun,
    tally: &Tally,
    records: &[RunRecord],
    twice: &[bool],
    never: &[bool],
) -> ClusterReport {
    let lines = run.cluster.log().lines();
    let observations = tally.observations();
    let timeline = faults::Timeline {
        origin: run.origin,
        end: run.end,
        records,
        twice,
        never,
        observations: &observations,
        lines: &lines,
    };
    let faults = timeline.windows(&run.events);
    for event in &run.events {
        if event.error.is_some() {
            tally.error("fault_failed");
        }
    }
    let unplanned_exits = run.cluster.log().unplanned_exits();
    for _ in &unplanned_exits {
        tally.error("server_exited_on_its_own");
    }
    ClusterReport {
        balancer: run.cluster.url().to_owned(),
        servers: run
            .cluster
            .server_names()
            .into_iter()
            .zip(run.cluster.server_urls())
            .map(|(name, url)| format!("{name} {url}"))
            .collect(),
        faults,
        intervals: run.intervals,
        start: run.first,
        end: run.last,
        unplanned_exits,
    }
}

impl ClusterReport {
    /// The cluster's figures as text.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\ncluster  HAProxy {} → {}",
            self.balancer,
            self.servers.join(", ")
        );
        let _ = writeln!(
            out,
            "\n{:<19} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6} {:>6} {:>6} {:>9} {:>11} {:>13}",
            "fault",
            "at s",
            "held s",
            "issued",
            "acked",
            "lost",
            "twice",
            "stuck",
            "other",
            "p99 ms",
            "worst 1s p99",
            format!("p99<{RECOVERED_P99_MS:.0}ms after"),
        );
        for f in &self.faults {
            let other: usize = f.ended_otherwise.values().sum();
            let _ = writeln!(
                out,
                "{:<19} {:>6.1} {:>6.1} {:>6} {:>6} {:>5} {:>6} {:>6} {:>6} {:>9.1} {:>11.1} {:>13}",
                f.fault,
                f.injected_at_s,
                f.held_s,
                f.issued,
                f.acknowledged,
                f.lost,
                f.executed_twice,
                f.stuck,
                other,
                f.pickup_ms.p99,
                f.worst_second_p99_ms,
                match f.p99_recovered_after_s {
                    _ if f.fault == "baseline" => "-".to_owned(),
                    Some(s) => format!("{s:.1} s"),
                    None => "not in window".to_owned(),
                },
            );
        }
        for f in &self.faults {
            fault_details(&mut out, f);
        }
        if !self.intervals.is_empty() {
            let _ = writeln!(
                out,
                "\nevery interval (pickup of the runs sent in it; the cluster at its end)"
            );
            for row in &self.intervals {
                let _ = writeln!(out, "  {}", row.line());
            }
        }
        let _ = writeln!(out);
        sample_lines(&mut out, "start", &self.start);
        sample_lines(&mut out, "end", &self.end);
        for exit in &self.unplanned_exits {
            let _ = writeln!(out, "\n{exit}");
        }
        out
    }
}

/// What happened around one fault, beyond the counts.
fn fault_details(out: &mut String, f: &FaultFigures) {
    let _ = writeln!(out, "\n{}: {}", f.fault, f.what);
    if let Some(e) = &f.error {
        let _ = writeln!(out, "  FAILED: {e}");
    }
    for (what, n) in &f.ended_otherwise {
        let _ = writeln!(out, "  ended otherwise: {what} ×{n}");
    }
    let counts = |map: &std::collections::BTreeMap<String, u64>| {
        if map.is_empty() {
            return "nothing".to_owned();
        }
        map.iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let _ = writeln!(out, "  agents saw: {}", counts(&f.agents_saw));
    let _ = writeln!(out, "  desktops saw: {}", counts(&f.desktops_saw));
    for line in &f.balancer {
        let _ = writeln!(out, "  balancer {line}");
    }
    if f.server_warnings > 0 || !f.server_lines.is_empty() {
        let _ = writeln!(
            out,
            "  servers: {} warning or error lines",
            f.server_warnings
        );
        for line in &f.server_lines {
            let _ = writeln!(out, "    {line}");
        }
    }
}

/// The servers and the database at one moment.
fn sample_lines(out: &mut String, name: &str, sample: &ClusterSample) {
    let servers: Vec<String> = sample
        .servers
        .iter()
        .map(|s| {
            format!(
                "{} RSS {} sockets {}",
                s.name,
                s.rss_mib
                    .map_or("n/a".to_owned(), |m| format!("{m:.1} MiB")),
                s.sockets.map_or("n/a".to_owned(), |n| n.to_string())
            )
        })
        .collect();
    let _ = writeln!(out, "{name:<5} {}", servers.join("  "));
    match &sample.database {
        None => {
            let _ = writeln!(out, "      database: no answer");
        }
        Some(d) => {
            let connections: Vec<String> = d
                .connections
                .iter()
                .map(|(state, n)| format!("{state} {n}"))
                .collect();
            let _ = writeln!(
                out,
                "      database connections {} ({})",
                d.connection_count(),
                connections.join(", ")
            );
            let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
            let tables: Vec<String> = d
                .tables
                .iter()
                .filter(|t| t.table_bytes + t.index_bytes > 16 * 1024)
                .map(|t| {
                    format!(
                        "{} {:.2}+{:.2}",
                        t.name,
                        mib(t.table_bytes),
                        mib(t.index_bytes)
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "      tables+indexes {:.2} MiB in all: {} (MiB, table+indexes; the smaller ones left out)",
                mib(d.total_bytes()),
                tables.join(", ")
            );
        }
    }
}
