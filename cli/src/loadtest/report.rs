//! The harness's report: what the runs came to, their latencies, the
//! servers' processes, and the baselines measured beside them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use super::agents::RunRecord;
use super::cluster_report::{ClusterReport, cluster_report};
use super::server::ProcessSample;
use super::tally::{Tally, lock};
use super::{ClusterRun, LoadtestArgs, duration};
use crate::baseline::{self, Round};

/// Timings and samples of the phases, for the report.
pub(super) struct Phases {
    pub(super) connect_seconds: f64,
    pub(super) issued_seconds: f64,
    pub(super) load_seconds: f64,
    /// Per server, in order.
    pub(super) idle_cpu: Vec<Option<f64>>,
    pub(super) load_cpu: Vec<Option<f64>>,
    pub(super) server_end: Vec<Option<ProcessSample>>,
    pub(super) harness_cpu: Option<f64>,
}

/// The harness's report (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was asked for.
    pub config: ReportConfig,
    /// Desktops connected and how long that took.
    pub connect: ConnectFigures,
    /// Counts of runs.
    pub runs: RunCounts,
    /// Latencies in milliseconds: `pickup`, `cancel`, `result`.
    pub latency_ms: BTreeMap<String, Latency>,
    /// Errors by kind (empty when everything went right).
    pub errors: BTreeMap<String, u64>,
    /// The server's process, when it runs on this machine (with several
    /// `--server`, the first one's; see `servers`).
    pub server: ServerFigures,
    /// Every server's process figures, in the order of `--server` (one
    /// entry without it).
    pub servers: Vec<ServerFigures>,
    /// The harness's own CPU during the load, in percent of one core.
    pub harness_cpu_percent: Option<f64>,
    /// With `--cluster`: the faults, the rows and the samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
    /// The servers' CPU during the load over the runs issued, in
    /// milliseconds per run; unknown when a server's process is.
    pub server_cpu_ms_per_run: Option<f64>,
    /// The baselines measured after the load, and that CPU per run in
    /// their CPU per request.
    pub baselines: Baselines,
}

/// Whether the baselines were measured (`--baseline-seconds`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Baselines {
    /// `--baseline-seconds 0`, or the load failed before they were due.
    NotAsked,
    /// Asked for and not measured: why (for instance, the examples are not
    /// built).
    NotMeasured(String),
    /// Measured.
    Measured(BaselineFigures),
}

/// The baselines, each the median of its windows, and the server's CPU per
/// run in their CPU per request.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineFigures {
    /// Windows per baseline.
    pub rounds: usize,
    /// Connections loading each baseline.
    pub connections: usize,
    /// The fixed reply's answer, bytes.
    pub reply_bytes: usize,
    /// The rmcp `echo` example.
    pub rmcp_echo: Round,
    /// The `fixed_reply` example: serve's HTTP stack, nothing else.
    pub fixed_reply: Round,
    /// `server_cpu_ms_per_run` over the echo's CPU per request: how many
    /// echo requests a run costs.
    pub run_in_echo_requests: Option<f64>,
    /// The same over the fixed reply's CPU per request.
    pub run_in_fixed_replies: Option<f64>,
}

/// Windows per baseline.
const BASELINE_ROUNDS: usize = 3;
/// Connections loading each baseline (as `vs_rmcp` by default).
const BASELINE_CONNECTIONS: usize = 64;

/// Measures the baselines after the load, unless `--baseline-seconds 0`.
pub(super) async fn baselines(args: &LoadtestArgs, report: &Report) -> Baselines {
    if args.baseline_seconds <= 0.0 {
        return Baselines::NotAsked;
    }
    let reply_bytes = baseline::DEFAULT_REPLY_BYTES;
    let measured = baseline::measure_baselines(
        reply_bytes,
        BASELINE_CONNECTIONS,
        BASELINE_ROUNDS,
        args.baseline_seconds,
    )
    .await;
    match measured {
        Err(e) => Baselines::NotMeasured(e.to_string()),
        Ok((rmcp_echo, fixed_reply)) => {
            let per_run = report.server_cpu_ms_per_run;
            let in_requests = |round: &Round| {
                per_run.map(|ms| ms * 1000.0 / round.cpu_us_per_request.max(f64::MIN_POSITIVE))
            };
            Baselines::Measured(BaselineFigures {
                rounds: BASELINE_ROUNDS,
                connections: BASELINE_CONNECTIONS,
                reply_bytes,
                run_in_echo_requests: in_requests(&rmcp_echo),
                run_in_fixed_replies: in_requests(&fixed_reply),
                rmcp_echo,
                fixed_reply,
            })
        }
    }
}

/// The servers' CPU over the load, per run issued (ms), when every
/// server's CPU is known.
fn cpu_ms_per_run(load_cpu: &[Option<f64>], load_seconds: f64, runs: usize) -> Option<f64> {
    let percent: f64 = load_cpu.iter().copied().sum::<Option<f64>>()?;
    (runs > 0 && !load_cpu.is_empty())
        .then(|| percent / 100.0 * load_seconds * 1000.0 / runs as f64)
}

/// The options of the run, as used.
#[derive(Debug, Clone, Serialize)]
pub struct ReportConfig {
    /// Desktops.
    pub desktops: usize,
    /// Agents.
    pub agents: usize,
    /// Target runs per second.
    pub rate: f64,
    /// Load phase, seconds.
    pub duration_seconds: f64,
    /// Each Graph's run time, seconds.
    pub run_seconds: f64,
    /// `wait` (`wait_seconds`) or `poll`.
    pub mode: String,
    /// Share of runs cancelled.
    pub cancel_fraction: f64,
}

/// How the desktops connected.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectFigures {
    /// Desktops whose first sync was answered.
    pub desktops_connected: usize,
    /// Seconds until the last one was.
    pub seconds: f64,
}

/// Counts of runs.
#[derive(Debug, Clone, Serialize)]
pub struct RunCounts {
    /// Runs the scheduler issued.
    pub issued: usize,
    /// Runs the server queued (a ticket came back).
    pub queued: usize,
    /// Runs the agents read `completed`.
    pub completed: usize,
    /// Runs the agents cancelled and read `cancelled`.
    pub cancelled: usize,
    /// Queued runs a desktop executed exactly once.
    pub executed_once: usize,
    /// Queued runs executed more than once (each is an error).
    pub executed_twice: usize,
    /// Queued runs never executed (each is an error).
    pub never_executed: usize,
    /// Runs issued per second, as achieved.
    pub issued_per_second: f64,
    /// Seconds from the first run issued to the last one read.
    pub load_seconds: f64,
}

/// One latency's distribution, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Latency {
    /// The distribution of `samples` (nearest rank); zeros when empty.
    pub(super) fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let rank = |p: f64| {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples
                .get(rank.clamp(1, samples.len().max(1)) - 1)
                .copied()
                .map_or(0.0, ms)
        };
        Self {
            count: samples.len(),
            p50: rank(50.0),
            p99: rank(99.0),
            max: rank(100.0),
        }
    }
}

/// The server's process figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerFigures {
    /// The server's base URL.
    pub url: String,
    /// Its process id, when known.
    pub pid: Option<u32>,
    /// CPU with every desktop connected and no runs, percent of one core.
    pub idle_cpu_percent: Option<f64>,
    /// CPU during the load, percent of one core.
    pub load_cpu_percent: Option<f64>,
    /// Resident memory at the end of the load, MiB.
    pub rss_mib: Option<f64>,
    /// Peak resident memory, MiB.
    pub peak_rss_mib: Option<f64>,
}

/// Builds the report from the runs and the desktops' tally.
pub(super) fn summarize(
    args: &LoadtestArgs,
    tally: &Tally,
    records: Vec<RunRecord>,
    cluster: Option<ClusterRun>,
    phases: Phases,
) -> Report {
    let (twice, never) = count_executions(tally, &records);
    let runs = run_counts(tally, &records, &twice, &never, &phases);
    let cluster = cluster.map(|run| cluster_report(run, tally, &records, &twice, &never));
    let servers = server_figures(&phases);
    let errors = tally
        .errors
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    Report {
        config: ReportConfig {
            desktops: args.desktops,
            agents: args.agents,
            rate: args.rate,
            duration_seconds: duration(args),
            run_seconds: args.run_seconds,
            mode: if args.wait { "wait" } else { "poll" }.into(),
            cancel_fraction: args.cancel_fraction,
        },
        connect: ConnectFigures {
            desktops_connected: tally.connected.load(Ordering::Relaxed),
            seconds: phases.connect_seconds,
        },
        runs,
        latency_ms: latencies(&records),
        errors,
        server: servers.first().cloned().unwrap_or_default(),
        servers,
        harness_cpu_percent: phases.harness_cpu,
        cluster,
        server_cpu_ms_per_run: cpu_ms_per_run(&phases.load_cpu, phases.load_seconds, records.len()),
        baselines: Baselines::NotAsked,
    }
}

/// What the runs came to; a run executed twice or never is also counted
/// as an error of the tally.
fn run_counts(
    tally: &Tally,
    records: &[RunRecord],
    twice: &[bool],
    never: &[bool],
    phases: &Phases,
) -> RunCounts {
    let executed_twice = twice.iter().filter(|t| **t).count();
    let never_executed = never.iter().filter(|n| **n).count();
    let executed_once = records
        .iter()
        .zip(twice.iter().zip(never))
        .filter(|(r, (t, n))| r.command.is_some() && !**t && !**n)
        .count();
    for _ in 0..executed_twice {
        tally.error("executed_twice");
    }
    for _ in 0..never_executed {
        tally.error("never_executed");
    }
    let ended_as = |cancel: bool, status: &str| {
        records
            .iter()
            .filter(|r| r.error.is_none() && r.cancel == cancel)
            .filter(|r| r.status.as_deref() == Some(status))
            .count()
    };
    RunCounts {
        issued: records.len(),
        queued: records.iter().filter(|r| r.command.is_some()).count(),
        completed: ended_as(false, "completed"),
        cancelled: ended_as(true, "cancelled"),
        executed_once,
        executed_twice,
        never_executed,
        issued_per_second: if phases.issued_seconds > 0.0 {
            records.len() as f64 / phases.issued_seconds
        } else {
            records.len() as f64
        },
        load_seconds: phases.load_seconds,
    }
}

/// The latencies of the runs, by name (see the module docs of `loadtest`).
fn latencies(records: &[RunRecord]) -> BTreeMap<String, Latency> {
    let mut latency = BTreeMap::new();
    latency.insert(
        "pickup".to_owned(),
        Latency::of(records.iter().filter_map(|r| r.pickup).collect()),
    );
    latency.insert(
        "cancel".to_owned(),
        Latency::of(records.iter().filter_map(|r| r.cancel_latency).collect()),
    );
    if records.iter().any(|r| r.worker) {
        latency.insert(
            "pickup_worker".to_owned(),
            Latency::of(records.iter().filter_map(|r| r.worker_pickup).collect()),
        );
    }
    latency.insert(
        "result".to_owned(),
        Latency::of(records.iter().filter_map(|r| r.result_latency).collect()),
    );
    latency
}

/// Each server's process figures at the end of the load.
fn server_figures(phases: &Phases) -> Vec<ServerFigures> {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    phases
        .server_end
        .iter()
        .enumerate()
        .map(|(i, end)| ServerFigures {
            url: String::new(),
            pid: None,
            idle_cpu_percent: phases.idle_cpu.get(i).copied().flatten(),
            load_cpu_percent: phases.load_cpu.get(i).copied().flatten(),
            rss_mib: end.map(|s| mib(s.rss_bytes)),
            peak_rss_mib: end.map(|s| mib(s.peak_rss_bytes)),
        })
        .collect()
}

/// Per run, in order: whether it was executed twice (its command started
/// more than once, or the run started under two command ids), and whether
/// it was acknowledged and never executed. A command executed that no
/// acknowledged run names is an error of its own.
pub(super) fn count_executions(tally: &Tally, records: &[RunRecord]) -> (Vec<bool>, Vec<bool>) {
    let mut executions = tally.executions();
    let runs = lock(&tally.runs);
    let mut twice = Vec::with_capacity(records.len());
    let mut never = Vec::with_capacity(records.len());
    for record in records {
        let ids = u64::try_from(record.run)
            .ok()
            .and_then(|run| runs.get(&run))
            .map_or(0, BTreeSet::len);
        let starts = record
            .command
            .as_ref()
            .and_then(|id| executions.remove(id))
            .map_or(0, |e| e.starts);
        twice.push(starts > 1 || ids > 1);
        never.push(record.command.is_some() && starts == 0);
    }
    // A command no agent got a ticket for (its answer was lost and the
    // agent gave up, or a second command for one run).
    let unknown = executions.values().filter(|e| e.starts > 0).count();
    drop(runs);
    drop(executions);
    for _ in 0..unknown {
        tally.error("executed_unknown_command");
    }
    (twice, never)
}

impl Report {
    /// The report as a table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let c = &self.config;
        let r = &self.runs;
        let _ = writeln!(
            out,
            "graph-relay loadtest: {} desktops, {} agents, {} runs/s for {} s, runs of {} s, agents {}, {:.0}% cancelled",
            c.desktops,
            c.agents,
            c.rate,
            c.duration_seconds,
            c.run_seconds,
            if c.mode == "wait" {
                "wait (wait_seconds)"
            } else {
                "poll"
            },
            c.cancel_fraction * 100.0
        );
        let urls: Vec<&str> = self.servers.iter().map(|s| s.url.as_str()).collect();
        let _ = writeln!(
            out,
            "server{} {}  desktops connected {} in {:.1} s",
            if urls.len() > 1 { "s" } else { "" },
            urls.join(" "),
            self.connect.desktops_connected,
            self.connect.seconds
        );
        let _ = writeln!(
            out,
            "runs   issued {} ({:.1}/s)  queued {}  completed {}  cancelled {}  executed once {}  twice {}  never {}",
            r.issued,
            r.issued_per_second,
            r.queued,
            r.completed,
            r.cancelled,
            r.executed_once,
            r.executed_twice,
            r.never_executed
        );
        let _ = writeln!(
            out,
            "\n{:<8} {:>7} {:>10} {:>10} {:>10}",
            "latency", "count", "p50 ms", "p99 ms", "max ms"
        );
        for (name, l) in &self.latency_ms {
            let _ = writeln!(
                out,
                "{name:<8} {:>7} {:>10.2} {:>10.2} {:>10.2}",
                l.count, l.p50, l.p99, l.max
            );
        }
        let _ = writeln!(out);
        out.push_str(&self.processes_table());
        out.push_str(&self.baselines_table());
        if let Some(cluster) = &self.cluster {
            out.push_str(&cluster.table());
            let _ = writeln!(out);
        }
        if self.errors.is_empty() {
            let _ = writeln!(out, "errors none");
        } else {
            let _ = writeln!(out, "errors");
            for (kind, n) in &self.errors {
                let _ = writeln!(out, "  {kind:<32} {n}");
            }
        }
        out
    }

    /// Each server's CPU and memory, and the harness's CPU.
    fn processes_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("n/a".to_owned(), |v| format!("{v:.1}{unit}"));
        for (i, s) in self.servers.iter().enumerate() {
            let name = if self.servers.len() > 1 {
                format!("server {}", i + 1)
            } else {
                "server".to_owned()
            };
            let _ = writeln!(
                out,
                "{name} CPU idle {}  under load {}  (of one core)  RSS {}  peak {}",
                opt(s.idle_cpu_percent, "%"),
                opt(s.load_cpu_percent, "%"),
                opt(s.rss_mib, " MiB"),
                opt(s.peak_rss_mib, " MiB")
            );
        }
        let _ = writeln!(
            out,
            "harness CPU under load {}",
            opt(self.harness_cpu_percent, "%")
        );
        out
    }

    /// The server's CPU per run, and the baselines beside it.
    fn baselines_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let per_run = self
            .server_cpu_ms_per_run
            .map_or("n/a".to_owned(), |ms| format!("{ms:.2} ms"));
        let _ = writeln!(out, "server CPU per run {per_run}");
        match &self.baselines {
            Baselines::NotAsked => {}
            Baselines::NotMeasured(why) => {
                let _ = writeln!(out, "baselines not measured: {why}");
            }
            Baselines::Measured(b) => {
                for (name, r) in [("rmcp echo", &b.rmcp_echo), ("fixed reply", &b.fixed_reply)] {
                    let _ = writeln!(
                        out,
                        "baseline {name:<12} {:>8.0} req/s  {:>6.1} µs CPU/req  (median of {}, {} connections)",
                        r.rate, r.cpu_us_per_request, b.rounds, b.connections
                    );
                }
                let ratio = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    out,
                    "a run costs the server {} rmcp echo requests, {} fixed replies of {} bytes",
                    ratio(b.run_in_echo_requests),
                    ratio(b.run_in_fixed_replies),
                    b.reply_bytes
                );
            }
        }
        out
    }
}
