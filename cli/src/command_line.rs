//! The command line: the commands and their flags (clap), and the store
//! flags `serve`, `stdio` and `dev-share` share.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};

use crate::{demo, help, loadtest, status, worker};

#[derive(Debug, clap::Args)]
pub(crate) struct StoreArgs {
    /// SQLite database file (shared by `serve` and `stdio`).
    #[arg(long, default_value = "graph-relay.db", conflicts_with = "memory")]
    pub(crate) db: PathBuf,
    /// Keep the queue in memory (lost on exit).
    #[arg(long)]
    pub(crate) memory: bool,
    /// PostgreSQL URL (`postgres://user@host:5432/db`), for several servers
    /// sharing one queue (`serve` and `stdio`); they wake each other's held
    /// requests with LISTEN/NOTIFY.
    #[arg(long, value_name = "URL", conflicts_with_all = ["memory", "db"])]
    pub(crate) postgres: Option<String>,
    /// Postgres schema for the tables (created if missing); default: the
    /// connection's search_path.
    #[arg(long, value_name = "SCHEMA", requires = "postgres")]
    pub(crate) postgres_schema: Option<String>,
    /// Most connections this process keeps to Postgres for its requests,
    /// 1 to 1000 (default 16); the wake-up listener has one more. Every
    /// server's pool counts against the database's `max_connections`.
    #[arg(long, value_name = "N", requires = "postgres", value_parser = postgres_pool_size)]
    pub(crate) postgres_pool: Option<usize>,
}

/// Most connections `--postgres-pool` accepts.
pub(crate) const MAX_POSTGRES_POOL: usize = 1000;

/// `--postgres-pool`: a whole number of connections, 1 to [`MAX_POSTGRES_POOL`].
fn postgres_pool_size(value: &str) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_POSTGRES_POOL).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of connections from 1 to {MAX_POSTGRES_POOL}, got `{value}`"
        )),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve MCP over Streamable HTTP at /mcp.
    #[command(after_help = help::SERVE)]
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        #[command(flatten)]
        store: StoreArgs,
        /// Configuration file; created with a development agent and device if absent.
        #[arg(long, default_value = "graph-relay.toml")]
        config: PathBuf,
        /// Serve requests WITHOUT a bearer token as this configured agent
        /// (`NAME`, or `OWNER/NAME` when several owners use the name).
        /// For local development and the MCP conformance suite only;
        /// refused unless listening on a loopback address.
        #[arg(long, value_name = "AGENT")]
        insecure_anonymous_agent: Option<String>,
        /// The lease of a run on a long-polling desktop in seconds (default
        /// 60, or `[server] lease_seconds`): a run whose desktop says
        /// nothing for this long ends `failed`.
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
        lease_seconds: Option<u64>,
        /// The lease of a run on a desktop in interval mode, in control
        /// intervals of 3 s (default 10, or `[server] lease_interval_controls`;
        /// fewer than 3 count as 3).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        lease_controls: Option<u32>,
        /// Offer `wait_seconds` (up to this many seconds) on `get_graph_run`,
        /// so clients can wait for a run instead of polling. Off by default,
        /// which keeps the published tool schema exactly. Must stay below the
        /// request timeout (30 s unless configured).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..=3600))]
        max_wait_seconds: Option<u32>,
        /// Serve `GET /metrics` (Prometheus) on a listener of its own at this
        /// address, e.g. 127.0.0.1:9187 (or `[server] metrics_listen`). Its
        /// figures are totals over every owner: keep it where only the
        /// operator reaches it.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
        /// Threads that serve the connections, each keeping its own
        /// connections for their life (default: one per processor). 0
        /// serves them on the shared worker pool instead, whose workers
        /// wake each other to share tasks: more CPU per request when most
        /// connections are held long-polls.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
        connection_threads: Option<u16>,
    },
    /// The whole system in one command: a server, a worker with sample
    /// Graphs and a scripted agent, in a temporary folder; then snippets to
    /// connect real clients to it.
    Demo(demo::DemoArgs),
    /// An operator's view of a server's SQLite database (read-only), or of
    /// a running server's queue (`--server`, on SQLite or Postgres):
    /// desktops, shared sessions, the queue, the last hour's runs and
    /// pickup latency.
    Status(status::StatusArgs),
    /// Load a server with simulated desktops and agents and report pickup,
    /// cancel and result latency, errors, and the server's CPU and RSS.
    Loadtest(loadtest::LoadtestArgs),
    /// Serve one MCP client over stdin/stdout as a configured agent.
    Stdio {
        #[command(flatten)]
        store: StoreArgs,
        /// Configuration file holding the agent.
        #[arg(long, default_value = "graph-relay.toml")]
        config: PathBuf,
        /// The agent (a `[[agent]]` name in the configuration, or
        /// `OWNER/NAME` when several owners use the name).
        #[arg(long)]
        agent: String,
        /// Longest accepted input line in bytes.
        #[arg(long, default_value_t = graph_relay_transport_stdio::DEFAULT_MAX_LINE_BYTES)]
        max_line_bytes: usize,
    },
    /// Run the desktop relay: pull queued runs from a server and run the
    /// Graphs declared in a graphs file.
    #[command(after_help = help::WORKER)]
    Worker(worker::WorkerArgs),
    /// Rerun the published experiments (and a desktop that dies mid-run) on
    /// a virtual clock.
    Sim {
        /// Experiments to run (all when none is given): pickup,
        /// five-at-once, polling, cancellation, idempotency, offline,
        /// result-size, second-agent, desktop-dies.
        experiments: Vec<String>,
        /// Seed of the run.
        #[arg(long, default_value_t = graph_relay_sim::DEFAULT_SEED)]
        seed: u64,
        /// Print every figure as one JSON document instead of tables.
        #[arg(long)]
        json: bool,
        /// Also write SVG plots into this folder.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
    },
    /// Approve a run waiting for approval, through a worker's local console.
    Approve {
        /// The console's URL, as the worker printed it (secret included).
        #[arg(long)]
        console: String,
        /// The run's command id.
        command: String,
    },
    /// Decline a run waiting for approval, through a worker's local console.
    Deny {
        /// The console's URL, as the worker printed it (secret included).
        #[arg(long)]
        console: String,
        /// The run's command id.
        command: String,
        /// Why (at most 500 characters); the agent reads it.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Print the completion script of SHELL on stdout, e.g.
    /// `graph-relay completions bash > /etc/bash_completion.d/graph-relay`.
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout, or write one page per command
    /// into a folder (`graph-relay.1`, `graph-relay-serve.1`, …).
    Man {
        /// Write the pages into this folder instead.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Create, list and revoke tokens.
    Token {
        /// Configuration file.
        #[arg(long, default_value = "graph-relay.toml", global = true)]
        config: PathBuf,
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Development: share a session to a project as a device would on sync.
    #[command(hide = true)]
    DevShare {
        #[command(flatten)]
        store: StoreArgs,
        /// Configuration file holding the device.
        #[arg(long, default_value = "graph-relay.toml")]
        config: PathBuf,
        /// The device (a `[[device]]` name, or `OWNER/NAME`).
        #[arg(long)]
        device: String,
        /// The project.
        #[arg(long)]
        project: String,
        /// The graph session id (`gs_` + 32 hex).
        #[arg(long)]
        session: String,
        /// Display name.
        #[arg(long, default_value = "Development graph")]
        name: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Kind {
    Agent,
    Device,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token; it is printed once, only its hash is stored.
    Create {
        /// agent or device.
        kind: Kind,
        /// Agent or device name.
        name: String,
        /// Owner.
        #[arg(long, default_value = "dev")]
        owner: String,
        /// Connected project (agents; repeatable).
        #[arg(long = "project")]
        projects: Vec<String>,
        /// Granted scope (agents; repeatable; default: read and run).
        #[arg(long = "scope")]
        scopes: Vec<String>,
    },
    /// Create (or replace) the operator token, which reads the status on
    /// the metrics listener (`status --server URL --token FILE`); it is
    /// printed once, only its hash is stored.
    Operator,
    /// List tokens (names and hash prefixes; never the tokens).
    List,
    /// Revoke every token of `NAME` (or `OWNER/NAME` when several owners use
    /// the name), or the one whose hash starts with the given prefix.
    Revoke {
        /// Name or hash prefix (at least 8 hex digits).
        target: String,
    },
}
