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

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, TokenConfigError, TokenKind, hash_token, new_token,
};
use graph_relay_transport_http::raise_open_file_limit;
use graph_relay_transport_http::relay_http::ClientBuildError;
use tokio::sync::watch;

use crate::mcp_client::{McpClient, McpClientError};

mod agents;
mod cluster;
mod cluster_report;
mod desktops;
mod faults;
mod own_postgres;
mod report;
mod samples;
mod server;
mod tally;
mod workers;

use agents::{RunPlan, RunRecord, one_run};
use desktops::start_desktop;
use tally::Tally;

pub use cluster::ClusterArgs;
use report::{Latency, Phases, Report, baselines, summarize};
use server::{CpuSince, ProcessSample, ServerUnderTest, cpu_since};

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
/// Longest window of each baseline measurement, in seconds.
pub const MAX_BASELINE_SECONDS: f64 = 60.0;
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
    /// Seconds of each of three windows in which, after the load, the
    /// harness loads two baselines in turn (64 connections): the rmcp
    /// `echo` example and the `fixed_reply` example (serve's HTTP stack
    /// answering a fixed result), so that the server's CPU per run is also
    /// given in their CPU per request, a figure that travels between
    /// machines. They are found beside this binary (build them with `cargo
    /// build --release -p graph-relay --example rmcp_echo --example
    /// fixed_reply`) or named by RMCP_ECHO_BIN and FIXED_REPLY_BIN; when
    /// missing, the report says so. 0 skips them.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub baseline_seconds: f64,
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
    let report = runtime.block_on(async {
        let mut report = load(&args).await?;
        report.baselines = baselines(&args, &report).await;
        Ok::<_, LoadtestError>(report)
    })?;
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
    validate_load(args)?;
    validate_faults(args)?;
    validate_servers(args)
}

/// The load's own bounds: parties, rate, duration, runs, baselines.
fn validate_load(args: &LoadtestArgs) -> Result<(), LoadtestError> {
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
    if !(args.run_seconds >= 0.0 && args.run_seconds <= MAX_RUN_SECONDS) {
        return bounds(format!(
            "--run-seconds must be 0 to {MAX_RUN_SECONDS}, got {}",
            args.run_seconds
        ));
    }
    if !(args.baseline_seconds >= 0.0 && args.baseline_seconds <= MAX_BASELINE_SECONDS) {
        return bounds(format!(
            "--baseline-seconds must be 0 to {MAX_BASELINE_SECONDS}, got {}",
            args.baseline_seconds
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
    Ok(())
}

/// The faults fit their bounds and the load's duration.
fn validate_faults(args: &LoadtestArgs) -> Result<(), LoadtestError> {
    let bounds = |what: String| Err(LoadtestError::Bounds(what));
    let duration = duration(args);
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
    Ok(())
}

/// One pid at most per server, and servers on loopback unless allowed.
fn validate_servers(args: &LoadtestArgs) -> Result<(), LoadtestError> {
    let bounds = |what: String| Err(LoadtestError::Bounds(what));
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
    let watchers = ClusterWatchers::start(args, server, &tally, origin, faulty);
    let (mut records, issued_seconds) =
        issue_runs(args, tokens, &clients, &tally, start, deadline).await;
    let load_seconds = start.elapsed().as_secs_f64();
    let load_end_server = server.sample();
    let load_self = ProcessSample::of_self().cpu_percent_since(&load_start_self);
    let end = Instant::now();
    let cluster = watchers.finish(server, &tally, first_sample, end).await;

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

/// What watches a cluster while the load runs: the fault injector (under
/// `--faults`) and the sampler.
struct ClusterWatchers {
    origin: Instant,
    injector: Option<tokio::task::JoinHandle<Vec<faults::FaultEvent>>>,
    sampler: Option<tokio::task::JoinHandle<Vec<samples::IntervalRow>>>,
    stop_sampling: watch::Sender<bool>,
}

impl ClusterWatchers {
    /// Starts them for a cluster run (nothing otherwise); the faults'
    /// schedule counts from `origin`.
    fn start(
        args: &LoadtestArgs,
        server: &ServerUnderTest,
        tally: &Arc<Tally>,
        origin: Instant,
        faulty: bool,
    ) -> Self {
        let start = tokio::time::Instant::from_std(origin);
        let (stop_sampling, sampling_rx) = watch::channel(false);
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
                Arc::clone(tally),
                origin,
                Duration::from_secs(args.cluster.report_every),
                sampling_rx,
            ))
        });
        Self {
            origin,
            injector,
            sampler,
            stop_sampling,
        }
    }

    /// Waits for the injector, stops the sampler and gathers what the
    /// cluster's report needs (`None` without a cluster).
    async fn finish(
        self,
        server: &ServerUnderTest,
        tally: &Tally,
        first_sample: Option<samples::ClusterSample>,
        end: Instant,
    ) -> Option<ClusterRun> {
        let events = match self.injector {
            Some(injector) => injector.await.unwrap_or_else(|_| {
                tally.error("fault_injector_failed");
                Vec::new()
            }),
            None => Vec::new(),
        };
        let _ = self.stop_sampling.send(true);
        let intervals = match self.sampler {
            Some(sampler) => sampler.await.unwrap_or_default(),
            None => Vec::new(),
        };
        let (cluster, first) = (server.cluster.as_ref()?, first_sample?);
        Some(ClusterRun {
            cluster: Arc::clone(cluster),
            origin: self.origin,
            end,
            events,
            intervals,
            first,
            last: samples::sample(cluster, self.origin).await,
        })
    }
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

/// Whether run `i` is one the agents cancel: spread evenly, `fraction` of all.
fn cancels(i: usize, fraction: f64) -> bool {
    ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor()
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
