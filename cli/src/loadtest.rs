//! `graph-relay loadtest`: how many desktops and agents one server holds,
//! and how fast runs go through it, for sizing a deployment.
//!
//! The harness connects N simulated desktops and M agents to a server:
//!
//! - **the server** is, by default, this binary's `serve` started as a child
//!   process on a SQLite file in a temporary folder, with a configuration
//!   written for the run (so one command runs everything, and the server's
//!   CPU and RSS are its own, read from `/proc/<pid>`). With `--server URL`
//!   it is a running server: the harness adds its tokens (owner
//!   `loadtest-<tag>`) to that server's `--config` file, which the server
//!   reloads, and removes them at the end; `--server-pid` names the
//!   process whose CPU and RSS to read when it runs on this machine.
//! - **several servers** sharing one queue (`serve --postgres` on one
//!   database): `--server URL` given once per server, all reading the one
//!   token file given with `--config`, and `--server-pid` once per server
//!   in the same order. Desktop *i* connects to server *i mod n* and agent
//!   *j* to server *(j + 1) mod n*: runs go round robin over both, so with
//!   desktops and agents in multiples of *n* every run is queued on another
//!   server than the one its desktop waits on, and its pickup depends on
//!   the servers waking each other.
//! - **a cluster** (`--cluster`): a Postgres of the harness's own, several
//!   `serve --postgres` servers on it and HAProxy in front, checking each
//!   server's `/readyz`; desktops and agents go through HAProxy only
//!   ([`cluster`]). With `--faults` the harness injects faults while the
//!   load runs (a server killed or stopped, every database connection
//!   terminated, the database crashed, its disk full) and reports what
//!   each did to the runs ([`faults`]); every `--report-every` seconds it
//!   samples the servers and the database ([`samples`]), which makes a
//!   long run a soak test.
//! - **desktops** are real relays: the core's `RelayDriver` with the HTTP
//!   transport in long-poll mode, each with its own device token and an
//!   in-memory outbox. All belong to one owner and share into one project;
//!   each shares its own Graph session (`gs_…` numbered after the desktop),
//!   because the queue assigns a session shared by several desktops to one
//!   of them. Their executor runs the Graph in-process: it sleeps
//!   `--run-seconds` and completes, or, for a run the harness will cancel,
//!   waits for the cancel ([`desktops`]). A cluster also has `--workers`
//!   `graph-relay worker` processes, whose Graph is a shell script that
//!   writes the command id it runs under to a ledger ([`workers`]).
//! - **agents** speak MCP over HTTP (`run_graph_session`, then
//!   `get_graph_run` with `wait_seconds` under `--wait`, or polling), each
//!   with its own agent token ([`agents`]). Runs are issued at `--rate`
//!   per second for `--duration` seconds, round robin over agents and
//!   desktops (and workers).
//!
//! Figures (milliseconds; p50, p99 and max by nearest rank):
//!
//! - **pickup**: the agent sends `run_graph_session` → the desktop's
//!   executor starts the run (**pickup_worker**: → a worker's Graph wrote
//!   its ledger line, by the wall clock, process start included);
//! - **cancel**: the agent sends `cancel_graph_run` on a running run → the
//!   agent reads it `cancelled`;
//! - **result**: the desktop's executor returns → the agent reads the run
//!   `completed`.
//!
//! Every execution is counted per command id at the desktops, and per run
//! (the run's number is in the arguments its Graph gets): an acknowledged
//! run that was never executed, or one executed twice (a command id
//! started twice, or one run started under two command ids), is an error.
//! Agents retry what a careful MCP client retries (no answer, a 502/503/504,
//! a JSON-RPC error marked retryable), waiting `Retry-After` when given, and
//! a run started again reuses its idempotency key; what they retried is
//! counted by kind. Errors are counted by kind; the command exits non-zero
//! when there is any. Under `--faults`, failed requests of agents and
//! desktops are what the faults are expected to cause: they are reported
//! per fault, and only what the runs came to (lost, twice, stuck, ended
//! otherwise) and a server that exited on its own are errors.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, TokenConfigError, TokenKind, hash_token, new_token,
};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};
use graph_relay_transport_http::relay_http::ClientBuildError;
use graph_relay_transport_http::serve::raise_open_file_limit;
use serde::Serialize;
use tokio::sync::{oneshot, watch};

use crate::children::Watched;
use crate::mcp_client::{McpClient, McpClientError};

mod agents;
mod cluster;
mod cluster_report;
mod desktops;
mod faults;
mod own_postgres;
mod samples;
mod tally;
mod workers;

use agents::{RunPlan, RunRecord, one_run};
use desktops::start_desktop;
use tally::{Tally, lock};

pub use cluster::ClusterArgs;
use cluster_report::{ClusterReport, cluster_report};

/// Most desktops one harness connects.
pub const MAX_DESKTOPS: usize = 20_000;
/// Most agents one harness runs.
pub const MAX_AGENTS: usize = 2_000;
/// Highest target rate, in runs per second.
pub const MAX_RATE: f64 = 1_000.0;
/// Longest load phase, in seconds (a day: a soak test).
pub const MAX_DURATION_SECONDS: f64 = 86_400.0;
/// The load phase when `--duration` is not given and there are no faults.
const DEFAULT_DURATION_SECONDS: f64 = 10.0;
/// Longest `--fault-hold` and `--fault-gap`, in seconds.
pub const MAX_FAULT_SECONDS: f64 = 600.0;
/// Longest simulated Graph run, in seconds.
pub const MAX_RUN_SECONDS: f64 = 60.0;
/// Most runs in one harness run (rate × duration).
pub const MAX_RUNS: usize = 100_000;
/// `wait_seconds` of the agents under `--wait` (the local server offers it).
const WAIT_SECONDS: u32 = 20;
/// How long a run may take to be picked up or to end before it is an error.
const RUN_DEADLINE: Duration = Duration::from_secs(90);
/// `serve`'s lease of a run on a long-polling desktop, when not given.
const DEFAULT_LEASE_SECONDS: u64 = 60;
/// The project every desktop shares into and every agent is connected to.
const PROJECT: &str = "loadtest";

/// Options of `graph-relay loadtest`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadtestArgs {
    /// A running server (`http://host:port`) instead of one started for the
    /// run; needs `--config`. Loopback only unless `--allow-remote`. Give it
    /// once per server to load several servers sharing one queue (desktops
    /// and agents are spread round robin over them).
    #[arg(long, value_name = "URL", requires = "config")]
    pub server: Vec<String>,
    /// With `--server`: the servers' `graph-relay.toml` (one file, read by
    /// every server); the harness adds its tokens to it for the run and
    /// removes them afterwards.
    #[arg(long, value_name = "FILE", requires = "server")]
    pub config: Option<PathBuf>,
    /// With `--server` on this machine: the server's process id, for its
    /// CPU and RSS; once per `--server`, in the same order (the first pid is
    /// the first server's).
    #[arg(long, value_name = "PID", requires = "server")]
    pub server_pid: Vec<u32>,
    /// Allow a `--server` that is not on a loopback address.
    #[arg(long)]
    pub allow_remote: bool,
    /// Simulated desktops (relays over HTTP in long-poll mode).
    #[arg(long, default_value_t = 50)]
    pub desktops: usize,
    /// Agents (MCP clients over HTTP).
    #[arg(long, default_value_t = 20)]
    pub agents: usize,
    /// Target rate of new runs, per second.
    #[arg(long, value_name = "RUNS_PER_S", default_value_t = 10.0)]
    pub rate: f64,
    /// How long runs are issued, in seconds (default 10; with `--faults`,
    /// long enough for every fault and the gaps around them).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// How long each Graph runs on its desktop, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.1)]
    pub run_seconds: f64,
    /// Agents wait for the result with `wait_seconds` instead of polling.
    #[arg(long)]
    pub wait: bool,
    /// Without `--wait`: milliseconds between two polls of a run.
    #[arg(long, value_name = "MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(20..=60_000))]
    pub poll_ms: u64,
    /// Share of runs the agents cancel once they run (0 to 1).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.0)]
    pub cancel_fraction: f64,
    /// Seconds of measuring the server with every desktop connected and no
    /// runs, before the load.
    #[arg(long, value_name = "SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub idle_seconds: u64,
    /// Print the report as one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The cluster and its faults.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Why the harness could not run, or found errors.
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// An option is out of its bounds.
    #[error("{0}")]
    Bounds(String),
    /// The server URL is not usable.
    #[error("--server must be http://HOST:PORT, got `{0}`")]
    BadUrl(String),
    /// The server is not on a loopback address.
    #[error("--server {0} is not a loopback address; pass --allow-remote to load a remote server")]
    NotLoopback(String),
    /// A file or socket could not be used.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The configuration could not be read or written.
    #[error(transparent)]
    Config(#[from] graph_relay_transport_http::config::ConfigError),
    /// The generated tokens are unusable.
    #[error(transparent)]
    Tokens(#[from] TokenConfigError),
    /// The server did not start or stop as it should.
    #[error("the server: {0}")]
    Server(String),
    /// A desktop's HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] ClientBuildError),
    /// An agent's HTTP client could not be built.
    #[error(transparent)]
    Mcp(#[from] McpClientError),
    /// Not every desktop connected.
    #[error("only {connected} of {desktops} desktops connected within {seconds} s")]
    NotConnected {
        /// Desktops whose first sync was answered.
        connected: usize,
        /// Desktops started.
        desktops: usize,
        /// How long the harness waited.
        seconds: u64,
    },
    /// The report could not be written as JSON.
    #[error("cannot write the report: {0}")]
    Json(#[from] serde_json::Error),
    /// The cluster could not be started or faulted.
    #[error("the cluster: {0}")]
    Cluster(String),
    /// The cluster's own Postgres could not be set up.
    #[error("the cluster's database: {0}")]
    Postgres(#[from] own_postgres::PostgresError),
    /// The load ran, and some runs went wrong (the report says which).
    #[error("{0} errors during the load (see the report)")]
    Failed(u64),
}

/// Runs the harness and prints its report; fails when any run went wrong.
pub fn run(args: LoadtestArgs) -> Result<(), LoadtestError> {
    validate(&args)?;
    // One connection per desktop (its held request; a second one only
    // while it reports), the agents' requests in flight, and slack.
    let needed = u64::try_from(args.desktops + args.agents * 2 + 512).unwrap_or(u64::MAX);
    let open_files = match raise_open_file_limit() {
        Ok(limit) => Some(limit.now),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the open-file limit");
            None
        }
    };
    if let Some(limit) = open_files
        && limit < needed
    {
        return Err(LoadtestError::Bounds(format!(
            "{} desktops and {} agents need about {needed} open files; the limit is {limit} (raise the hard limit: `ulimit -Hn`)",
            args.desktops, args.agents
        )));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(load(&args))?;
    runtime.shutdown_timeout(Duration::from_secs(5));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    let errors: u64 = report.errors.values().sum();
    if errors > 0 {
        return Err(LoadtestError::Failed(errors));
    }
    Ok(())
}

/// Checks every bound before anything starts.
fn validate(args: &LoadtestArgs) -> Result<(), LoadtestError> {
    let bounds = |what: String| Err(LoadtestError::Bounds(what));
    if args.desktops == 0 || args.desktops > MAX_DESKTOPS {
        return bounds(format!(
            "--desktops must be 1 to {MAX_DESKTOPS}, got {}",
            args.desktops
        ));
    }
    if args.agents == 0 || args.agents > MAX_AGENTS {
        return bounds(format!(
            "--agents must be 1 to {MAX_AGENTS}, got {}",
            args.agents
        ));
    }
    if !(args.rate > 0.0 && args.rate <= MAX_RATE) {
        return bounds(format!(
            "--rate must be above 0 and at most {MAX_RATE} runs/s, got {}",
            args.rate
        ));
    }
    let duration = duration(args);
    if !(duration > 0.0 && duration <= MAX_DURATION_SECONDS) {
        return bounds(format!(
            "--duration must be above 0 and at most {MAX_DURATION_SECONDS} s, got {duration}"
        ));
    }
    let c = &args.cluster;
    for (name, value) in [("--fault-hold", c.fault_hold), ("--fault-gap", c.fault_gap)] {
        if !(value > 0.0 && value <= MAX_FAULT_SECONDS) {
            return bounds(format!(
                "{name} must be above 0 and at most {MAX_FAULT_SECONDS} s, got {value}"
            ));
        }
    }
    let needed = faults::schedule_seconds(c.faults.len(), c.fault_hold, c.fault_gap);
    if !c.faults.is_empty() && duration < needed {
        return bounds(format!(
            "--duration {duration} s is too short for {} faults: they need {needed} s \
             (--fault-gap, then each fault's --fault-hold and a gap)",
            c.faults.len()
        ));
    }
    if !(args.run_seconds >= 0.0 && args.run_seconds <= MAX_RUN_SECONDS) {
        return bounds(format!(
            "--run-seconds must be 0 to {MAX_RUN_SECONDS}, got {}",
            args.run_seconds
        ));
    }
    if !(0.0..=1.0).contains(&args.cancel_fraction) {
        return bounds(format!(
            "--cancel-fraction must be 0 to 1, got {}",
            args.cancel_fraction
        ));
    }
    if planned_runs(args) > MAX_RUNS {
        return bounds(format!(
            "--rate × --duration asks for {} runs; at most {MAX_RUNS}",
            planned_runs(args)
        ));
    }
    if args.server_pid.len() > args.server.len() {
        return bounds(format!(
            "{} --server-pid for {} --server: give at most one pid per server, in the same order",
            args.server_pid.len(),
            args.server.len()
        ));
    }
    for url in &args.server {
        let host = server_host(url)?;
        let loopback = host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback && !args.allow_remote {
            return Err(LoadtestError::NotLoopback(url.clone()));
        }
    }
    Ok(())
}

/// How many runs the load phase issues.
fn planned_runs(args: &LoadtestArgs) -> usize {
    // Both factors are bounded and positive: the product is a small float.
    (args.rate * duration(args)).round().max(1.0) as usize
}

/// The load phase in seconds: `--duration`, else what the faults need,
/// else the default.
fn duration(args: &LoadtestArgs) -> f64 {
    let c = &args.cluster;
    args.duration.unwrap_or(if c.faults.is_empty() {
        DEFAULT_DURATION_SECONDS
    } else {
        faults::schedule_seconds(c.faults.len(), c.fault_hold, c.fault_gap)
    })
}

/// How long an agent keeps at one run (its pickup, its end) before the
/// run counts as not picked up or stuck. In a cluster a run may wait out a
/// fault, and a run whose desktop went quiet ends only when its lease
/// lapses.
fn run_deadline(args: &LoadtestArgs) -> Duration {
    if !args.cluster.cluster {
        return RUN_DEADLINE;
    }
    let lease = args.cluster.lease_seconds.unwrap_or(DEFAULT_LEASE_SECONDS) as f64;
    RUN_DEADLINE.max(Duration::from_secs_f64(
        lease + args.cluster.fault_hold + 30.0,
    ))
}

/// The host of an `http(s)://host[:port]` URL.
fn server_host(url: &str) -> Result<&str, LoadtestError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| LoadtestError::BadUrl(url.into()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let host = if authority.starts_with('[') {
        authority.split_inclusive(']').next().unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default()
    };
    if host.is_empty() {
        return Err(LoadtestError::BadUrl(url.into()));
    }
    Ok(host)
}

/// The Graph session desktop `index` shares.
fn session_id(index: usize) -> String {
    format!("gs_{:032x}", 0x10ad_0000_0000_0000_u128 + index as u128)
}

/// The whole run: server, desktops, idle window, load, drain, report.
async fn load(args: &LoadtestArgs) -> Result<Report, LoadtestError> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let owner = if !args.server.is_empty() {
        format!("loadtest-{tag}")
    } else {
        "loadtest".to_owned()
    };
    let device_tokens: Vec<String> = (0..args.desktops)
        .map(|_| new_token(TokenKind::Device))
        .collect();
    let agent_tokens: Vec<String> = (0..args.agents)
        .map(|_| new_token(TokenKind::Agent))
        .collect();
    let worker_tokens: Vec<String> = (0..worker_count(args))
        .map(|_| new_token(TokenKind::Device))
        .collect();
    let agents: Vec<AgentToken> = agent_tokens
        .iter()
        .enumerate()
        .map(|(i, token)| AgentToken {
            name: format!("loadtest-agent-{i}"),
            owner: owner.clone(),
            projects: vec![PROJECT.into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(token),
            revoked: false,
        })
        .collect();
    let devices: Vec<DeviceToken> = device_tokens
        .iter()
        .enumerate()
        .map(|(i, token)| (format!("loadtest-desktop-{i}"), token))
        .chain(
            worker_tokens
                .iter()
                .enumerate()
                .map(|(k, token)| (format!("loadtest-worker-{}", k + 1), token)),
        )
        .map(|(name, token)| DeviceToken {
            name,
            owner: owner.clone(),
            token_sha256: hash_token(token),
            revoked: false,
        })
        .collect();

    let mut server = match &args.config {
        _ if args.cluster.cluster => ServerUnderTest::cluster(args, agents, devices).await?,
        Some(config) if !args.server.is_empty() => {
            ServerUnderTest::external(
                &args.server,
                config,
                &owner,
                agents,
                devices,
                &args.server_pid,
            )
            .await?
        }
        _ => ServerUnderTest::local(args, agents, devices).await?,
    };
    let tokens = Tokens {
        desktops: &device_tokens,
        agents: &agent_tokens,
        workers: &worker_tokens,
    };
    let outcome = drive(args, &tokens, &server).await;
    let stopped = server.stop().await;
    let mut report = outcome?;
    stopped?;
    for (figures, target) in report.servers.iter_mut().zip(&server.targets) {
        figures.url = target.base.clone();
        figures.pid = target.pid;
    }
    if let Some(first) = report.servers.first() {
        report.server = first.clone();
    }
    Ok(report)
}

/// Desktops, idle window, load and drain against the servers.
/// The tokens of the load's parties.
struct Tokens<'a> {
    desktops: &'a [String],
    agents: &'a [String],
    /// Of the `graph-relay worker` processes (`--cluster --workers`).
    workers: &'a [String],
}

/// Worker processes of a cluster run.
fn worker_count(args: &LoadtestArgs) -> usize {
    if args.cluster.cluster {
        usize::try_from(args.cluster.workers).unwrap_or(0)
    } else {
        0
    }
}

async fn drive(
    args: &LoadtestArgs,
    tokens: &Tokens<'_>,
    server: &ServerUnderTest,
) -> Result<Report, LoadtestError> {
    let agent_tokens = tokens.agents;
    let bases: Vec<&str> = server.entry.iter().map(String::as_str).collect();
    let n = bases.len().max(1);
    let tally = Arc::new(Tally::default());
    let faulty = !args.cluster.faults.is_empty();
    tally.faulty.store(faulty, Ordering::Relaxed);
    let fleet = Fleet::connect(args, tokens, &bases, server, &tally).await?;
    let fleet_connect_seconds = fleet.connect_seconds;
    // From here on a failed sync is an error, not a desktop still connecting.
    tally.loaded.store(true, Ordering::Relaxed);

    // Idle window: every desktop held, no runs.
    let idle_start = server.sample();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle_cpu = cpu_since(&server.sample(), &idle_start);

    // Load.
    // Agent j on the server after desktop j's: see the module docs.
    let deadline = run_deadline(args);
    let clients = agent_tokens
        .iter()
        .enumerate()
        .map(|(j, token)| McpClient::new(bases[(j + 1) % n], token, deadline))
        .collect::<Result<Vec<_>, _>>()?;
    let load_start_server = server.sample();
    let load_start_self = ProcessSample::of_self();
    let first_sample = match &server.cluster {
        Some(cluster) => Some(samples::sample(cluster, Instant::now()).await),
        None => None,
    };
    let origin = Instant::now();
    let start = tokio::time::Instant::from_std(origin);
    let (sampling_tx, sampling_rx) = watch::channel(false);
    let injector = server.cluster.clone().filter(|_| faulty).map(|cluster| {
        let c = &args.cluster;
        let (faults, hold, gap) = (
            c.faults.clone(),
            Duration::from_secs_f64(c.fault_hold),
            Duration::from_secs_f64(c.fault_gap),
        );
        tokio::spawn(async move { faults::inject(&cluster, &faults, start, hold, gap).await })
    });
    let sampler = server.cluster.clone().map(|cluster| {
        tokio::spawn(samples::every(
            cluster,
            Arc::clone(&tally),
            origin,
            Duration::from_secs(args.cluster.report_every),
            sampling_rx,
        ))
    });
    let (mut records, issued_seconds) =
        issue_runs(args, tokens, &clients, &tally, start, deadline).await;
    let load_seconds = start.elapsed().as_secs_f64();
    let load_end_server = server.sample();
    let load_self = ProcessSample::of_self().cpu_percent_since(&load_start_self);
    let end = Instant::now();
    let events = match injector {
        Some(injector) => injector.await.unwrap_or_else(|_| {
            tally.error("fault_injector_failed");
            Vec::new()
        }),
        None => Vec::new(),
    };
    let _ = sampling_tx.send(true);
    let intervals = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let cluster = match (&server.cluster, first_sample) {
        (Some(cluster), Some(first)) => Some(ClusterRun {
            cluster: Arc::clone(cluster),
            origin,
            end,
            events,
            intervals,
            first,
            last: samples::sample(cluster, origin).await,
        }),
        _ => None,
    };

    // Stop the desktops before the server.
    tally.loaded.store(false, Ordering::Relaxed);
    fleet.stop(&tally, &mut records).await;

    Ok(summarize(
        args,
        &tally,
        records,
        cluster,
        Phases {
            connect_seconds: fleet_connect_seconds,
            issued_seconds,
            load_seconds,
            idle_cpu,
            load_cpu: cpu_since(&load_end_server, &load_start_server),
            server_end: load_end_server,
            harness_cpu: load_self,
        },
    ))
}

/// The simulated desktops and the worker processes of a run, connected.
struct Fleet {
    desktops: Vec<tokio::task::JoinHandle<()>>,
    workers: Option<workers::Workers>,
    stop: watch::Sender<bool>,
    /// How long connecting every one of them took.
    connect_seconds: f64,
}

impl Fleet {
    /// Starts the desktops (desktop `i` on entry `i`) and the workers, and
    /// waits until every one has synced (an error after a deadline that
    /// grows with their number).
    async fn connect(
        args: &LoadtestArgs,
        tokens: &Tokens<'_>,
        bases: &[&str],
        server: &ServerUnderTest,
        tally: &Arc<Tally>,
    ) -> Result<Self, LoadtestError> {
        let device_tokens = tokens.desktops;
        let n = bases.len().max(1);
        let run_time = Duration::from_secs_f64(args.run_seconds);
        let connect_start = Instant::now();
        let (stop, stop_rx) = watch::channel(false);
        let mut desktops = Vec::with_capacity(device_tokens.len());
        for (index, token) in device_tokens.iter().enumerate() {
            desktops.push(start_desktop(
                index,
                bases[index % n],
                token,
                Arc::clone(tally),
                run_time,
                stop_rx.clone(),
            )?);
            if index % 100 == 99 {
                tokio::task::yield_now().await;
            }
        }
        let workers = match &server.cluster {
            Some(cluster) if !tokens.workers.is_empty() => Some(
                workers::Workers::start(
                    cluster.dir(),
                    bases[0],
                    tokens.workers,
                    device_tokens.len(),
                    args.run_seconds,
                    Arc::clone(tally),
                )
                .await?,
            ),
            _ => None,
        };
        let fleet = Self {
            desktops,
            workers,
            stop,
            connect_seconds: 0.0,
        };
        let connect_deadline = Duration::from_secs(30 + (device_tokens.len() / 100) as u64);
        while tally.connected.load(Ordering::Relaxed) < device_tokens.len()
            || tally.workers_connected.load(Ordering::Relaxed) < tokens.workers.len()
        {
            if connect_start.elapsed() > connect_deadline {
                let connected = tally.connected.load(Ordering::Relaxed)
                    + tally.workers_connected.load(Ordering::Relaxed);
                fleet.stop(tally, &mut []).await;
                return Err(LoadtestError::NotConnected {
                    connected,
                    desktops: device_tokens.len() + tokens.workers.len(),
                    seconds: connect_deadline.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            connect_seconds: connect_start.elapsed().as_secs_f64(),
            ..fleet
        })
    }

    /// Stops every desktop and worker; what the workers' Graphs wrote in
    /// their ledger is matched with `records`.
    async fn stop(self, tally: &Tally, records: &mut [RunRecord]) {
        let _ = self.stop.send(true);
        if let Some(workers) = self.workers {
            let ledger = workers.stop().await;
            tally.count_ledger(&ledger, records);
        }
        for desktop in self.desktops {
            if tokio::time::timeout(Duration::from_secs(15), desktop)
                .await
                .is_err()
            {
                tally.error("desktop_did_not_stop");
            }
        }
    }
}

/// Issues the planned runs at the configured rate from `start`, each run
/// by the next agent's client, and waits for every one to end; returns
/// their records and how long issuing them took.
async fn issue_runs(
    args: &LoadtestArgs,
    tokens: &Tokens<'_>,
    clients: &[McpClient],
    tally: &Arc<Tally>,
    start: tokio::time::Instant,
    deadline: Duration,
) -> (Vec<RunRecord>, f64) {
    let total = planned_runs(args);
    let key_tag = uuid::Uuid::new_v4().simple().to_string();
    let desktops = tokens.desktops.len();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / args.rate)).await;
        // Round robin over the desktops, then the workers; a worker's
        // run is never cancelled (its start is read from its ledger at
        // the end, and a cancel waits for the start).
        let desktop = i % (desktops + tokens.workers.len());
        let worker = desktop >= desktops;
        let plan = RunPlan {
            index: i,
            desktop,
            worker,
            cancel: !worker && cancels(i, args.cancel_fraction),
            key: format!("loadtest-{key_tag}-{i}"),
            wait: args.wait,
            poll: Duration::from_millis(args.poll_ms),
            deadline,
        };
        tasks.spawn(one_run(
            clients[i % clients.len()].clone(),
            Arc::clone(tally),
            plan,
        ));
    }
    let issued_seconds = start.elapsed().as_secs_f64();
    let mut records = Vec::with_capacity(total);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(record) => records.push(record),
            Err(e) => tally.error(if e.is_panic() {
                "harness_task_panicked"
            } else {
                "harness_task_cancelled"
            }),
        }
    }
    (records, issued_seconds)
}

/// What a cluster run adds to the report's inputs.
struct ClusterRun {
    cluster: Arc<cluster::Cluster>,
    origin: Instant,
    end: Instant,
    events: Vec<faults::FaultEvent>,
    intervals: Vec<samples::IntervalRow>,
    first: samples::ClusterSample,
    last: samples::ClusterSample,
}

/// CPU use of each server between two samples of all of them.
fn cpu_since(now: &[Option<ProcessSample>], then: &[Option<ProcessSample>]) -> Vec<Option<f64>> {
    now.iter()
        .zip(then)
        .map(|(now, then)| now.cpu_percent_since(then))
        .collect()
}

/// Whether run `i` is one the agents cancel: spread evenly, `fraction` of all.
fn cancels(i: usize, fraction: f64) -> bool {
    ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor()
}

/// One server the load goes to.
struct Target {
    base: String,
    pid: Option<u32>,
}

/// The servers the load goes to, and how to read their processes.
struct ServerUnderTest {
    /// One, or (with several `--server`) every server, in order.
    targets: Vec<Target>,
    /// Where desktops and agents connect: the targets, or a cluster's
    /// load balancer.
    entry: Vec<String>,
    /// The cluster, with `--cluster`.
    cluster: Option<Arc<cluster::Cluster>>,
    /// The child process and its folder, when the harness started it.
    child: Option<(tokio::process::Child, tempfile::TempDir)>,
    /// With an external server: its configuration file and the owner whose
    /// tokens the harness added.
    added: Option<(PathBuf, String)>,
}

impl ServerUnderTest {
    /// Starts this binary's `serve` on a SQLite file in a temporary folder.
    async fn local(
        args: &LoadtestArgs,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
    ) -> Result<Self, LoadtestError> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("graph-relay.toml");
        let file = ConfigFile {
            server: ServerSection {
                max_connections: Some(max_connections(args)),
                ..ServerSection::default()
            },
            oauth: None,
            agents,
            devices,
        };
        file.save(&config)?;
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&config)
            .arg("--db")
            .arg(dir.path().join("queue.db"))
            .args(["--max-wait-seconds", &WAIT_SECONDS.to_string()])
            .env("GRAPH_RELAY_LOG", "info")
            .watched()
            .spawn()
            .map_err(|e| LoadtestError::Server(format!("cannot start `serve`: {e}")))?;
        let pid = child.id();
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| LoadtestError::Server("no stderr".into()))?;
        // Read the log: the address, then drain it.
        let (address_tx, address_rx) = oneshot::channel();
        tokio::spawn(read_server_log(stderr, address_tx));
        let base = tokio::time::timeout(Duration::from_secs(30), address_rx)
            .await
            .map_err(|_| LoadtestError::Server("did not start within 30 s".into()))?
            .map_err(|_| LoadtestError::Server("exited before it listened".into()))?;
        Ok(Self {
            entry: vec![base.clone()],
            targets: vec![Target { base, pid }],
            cluster: None,
            child: Some((child, dir)),
            added: None,
        })
    }

    /// Starts a cluster: its Postgres, its servers and HAProxy.
    async fn cluster(
        args: &LoadtestArgs,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
    ) -> Result<Self, LoadtestError> {
        let cluster =
            cluster::Cluster::start(&args.cluster, max_connections(args), agents, devices).await?;
        Ok(Self {
            targets: cluster
                .server_urls()
                .into_iter()
                .map(|base| Target { base, pid: None })
                .collect(),
            entry: vec![cluster.url().to_owned()],
            cluster: Some(Arc::new(cluster)),
            child: None,
            added: None,
        })
    }

    /// Running servers sharing the token file `config`: adds the harness's
    /// tokens to it. `pids` are the servers' process ids, in their order.
    async fn external(
        urls: &[String],
        config: &Path,
        owner: &str,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
        pids: &[u32],
    ) -> Result<Self, LoadtestError> {
        let mut file = ConfigFile::load(config)?;
        file.agents.extend(agents);
        file.devices.extend(devices);
        file.save(config)?;
        // The server looks at its token file four times a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let targets: Vec<Target> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| Target {
                base: url.trim_end_matches('/').to_owned(),
                pid: pids.get(i).copied(),
            })
            .collect();
        Ok(Self {
            entry: targets.iter().map(|t| t.base.clone()).collect(),
            targets,
            cluster: None,
            child: None,
            added: Some((config.to_owned(), owner.to_owned())),
        })
    }

    /// CPU and memory of each server's process, where it is known.
    fn sample(&self) -> Vec<Option<ProcessSample>> {
        match &self.cluster {
            // A cluster's servers change their process when restarted.
            Some(cluster) => cluster
                .pids()
                .into_iter()
                .map(|pid| pid.and_then(ProcessSample::of))
                .collect(),
            None => self
                .targets
                .iter()
                .map(|t| t.pid.and_then(ProcessSample::of))
                .collect(),
        }
    }

    /// Stops the child server (SIGTERM, then SIGKILL after 15 s), or
    /// removes the harness's tokens from an external server's file.
    async fn stop(&mut self) -> Result<(), LoadtestError> {
        if let Some(cluster) = self.cluster.take() {
            cluster.stop().await;
        }
        if let Some((path, owner)) = self.added.take() {
            let mut file = ConfigFile::load(&path)?;
            file.agents.retain(|a| a.owner != owner);
            file.devices.retain(|d| d.owner != owner);
            file.save(&path)?;
        }
        if let Some((mut child, _dir)) = self.child.take() {
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(LoadtestError::Server(e.to_string())),
                Err(_) => {
                    let _ = child.kill().await;
                    return Err(LoadtestError::Server(
                        "did not stop within 15 s; killed".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Connections a server should take: every desktop's held sync and its
/// posts, every agent's requests in flight, and slack.
fn max_connections(args: &LoadtestArgs) -> usize {
    let in_flight = (args.rate * (args.run_seconds + f64::from(WAIT_SECONDS))).ceil() as usize;
    args.desktops + args.agents * 2 + in_flight + 256
}

/// Reads the child server's log: sends its base URL once it listens, then
/// passes warnings and errors on to this process's stderr.
async fn read_server_log(stderr: tokio::process::ChildStderr, address: oneshot::Sender<String>) {
    use tokio::io::AsyncBufReadExt;
    let mut address = Some(address);
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(rest) = line.split("serving MCP at ").nth(1)
            && let Some(tx) = address.take()
        {
            let url = rest.split_whitespace().next().unwrap_or_default();
            let _ = tx.send(url.trim_end_matches("/mcp").to_owned());
            continue;
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            eprintln!("server | {line}");
        }
    }
}

/// CPU time and memory of a process at one moment (`/proc/<pid>`).
#[derive(Debug, Clone, Copy)]
struct ProcessSample {
    /// Whose (`None`: this process).
    pid: Option<u32>,
    at: Instant,
    cpu: Duration,
    rss_bytes: u64,
    peak_rss_bytes: u64,
}

impl ProcessSample {
    /// Process `pid`, or `None` where `/proc` does not have it.
    fn of(pid: u32) -> Option<Self> {
        Self::read(&format!("/proc/{pid}"), Some(pid))
    }

    /// This process.
    fn of_self() -> Option<Self> {
        Self::read("/proc/self", None)
    }

    fn read(dir: &str, pid: Option<u32>) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        // Fields after the command name, which ends at the last ')':
        // state is field 3; utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|hz| u64::try_from(hz).ok())
            .filter(|hz| *hz > 0)
            .unwrap_or(100);
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        let kib = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        Some(Self {
            pid,
            at: Instant::now(),
            cpu: Duration::from_secs_f64(ticks as f64 / hz as f64),
            rss_bytes: kib("VmRSS:")?,
            peak_rss_bytes: kib("VmHWM:").unwrap_or_default(),
        })
    }
}

/// CPU use between two samples, in percent of one core.
trait CpuSince {
    fn cpu_percent_since(&self, earlier: &Self) -> Option<f64>;
}

impl CpuSince for Option<ProcessSample> {
    fn cpu_percent_since(&self, earlier: &Self) -> Option<f64> {
        let (now, then) = ((*self)?, (*earlier)?);
        // A server restarted in between: the CPU of two processes.
        if now.pid != then.pid {
            return None;
        }
        let wall = now.at.saturating_duration_since(then.at).as_secs_f64();
        (wall > 0.0).then(|| now.cpu.saturating_sub(then.cpu).as_secs_f64() / wall * 100.0)
    }
}

/// Timings and samples of the phases, for the report.
struct Phases {
    connect_seconds: f64,
    issued_seconds: f64,
    load_seconds: f64,
    /// Per server, in order.
    idle_cpu: Vec<Option<f64>>,
    load_cpu: Vec<Option<f64>>,
    server_end: Vec<Option<ProcessSample>>,
    harness_cpu: Option<f64>,
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
    fn of(mut samples: Vec<Duration>) -> Self {
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
fn summarize(
    args: &LoadtestArgs,
    tally: &Tally,
    records: Vec<RunRecord>,
    cluster: Option<ClusterRun>,
    phases: Phases,
) -> Report {
    let (twice, never) = count_executions(tally, &records);
    let executed_twice = twice.iter().filter(|t| **t).count();
    let never_executed = never.iter().filter(|n| **n).count();
    let executed_once = records
        .iter()
        .zip(twice.iter().zip(&never))
        .filter(|(r, (t, n))| r.command.is_some() && !**t && !**n)
        .count();
    for _ in 0..executed_twice {
        tally.error("executed_twice");
    }
    for _ in 0..never_executed {
        tally.error("never_executed");
    }
    let cluster = cluster.map(|run| cluster_report(run, tally, &records, &twice, &never));
    let queued = records.iter().filter(|r| r.command.is_some()).count();
    let ok = |r: &&RunRecord| r.error.is_none();
    let completed = records
        .iter()
        .filter(ok)
        .filter(|r| !r.cancel && r.status.as_deref() == Some("completed"))
        .count();
    let cancelled = records
        .iter()
        .filter(ok)
        .filter(|r| r.cancel && r.status.as_deref() == Some("cancelled"))
        .count();
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
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let servers: Vec<ServerFigures> = phases
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
        .collect();
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
        runs: RunCounts {
            issued: records.len(),
            queued,
            completed,
            cancelled,
            executed_once,
            executed_twice,
            never_executed,
            issued_per_second: if phases.issued_seconds > 0.0 {
                records.len() as f64 / phases.issued_seconds
            } else {
                records.len() as f64
            },
            load_seconds: phases.load_seconds,
        },
        latency_ms: latency,
        errors,
        server: servers.first().cloned().unwrap_or_default(),
        servers,
        harness_cpu_percent: phases.harness_cpu,
        cluster,
    }
}

/// Per run, in order: whether it was executed twice (its command started
/// more than once, or the run started under two command ids), and whether
/// it was acknowledged and never executed. A command executed that no
/// acknowledged run names is an error of its own.
fn count_executions(tally: &Tally, records: &[RunRecord]) -> (Vec<bool>, Vec<bool>) {
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
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("n/a".to_owned(), |v| format!("{v:.1}{unit}"));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancels_spreads_the_fraction() {
        let n = (0..1000).filter(|&i| cancels(i, 0.1)).count();
        assert_eq!(n, 100);
        assert_eq!((0..50).filter(|&i| cancels(i, 0.0)).count(), 0);
        assert_eq!((0..50).filter(|&i| cancels(i, 1.0)).count(), 50);
    }

    #[test]
    fn latency_uses_nearest_rank() {
        let samples = (1..=100).map(Duration::from_millis).collect();
        let l = Latency::of(samples);
        assert_eq!((l.count, l.p50, l.p99, l.max), (100, 50.0, 99.0, 100.0));
        assert_eq!(Latency::of(Vec::new()).count, 0);
    }

    #[test]
    fn server_host_reads_the_authority() {
        assert_eq!(server_host("http://127.0.0.1:8787").ok(), Some("127.0.0.1"));
        assert_eq!(server_host("http://[::1]:8787/").ok(), Some("[::1]"));
        assert_eq!(
            server_host("https://relay.example.com").ok(),
            Some("relay.example.com")
        );
        assert!(server_host("ftp://x").is_err());
    }
}
