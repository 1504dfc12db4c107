//! # graph-relay
//!
//! The `graph-relay` binary: the MCP server over Streamable HTTP (`serve`)
//! or stdio (`stdio`), on a SQLite database (default) or in memory; the
//! desktop relay (`worker`) that runs the Graphs declared in `graphs.toml`;
//! the token commands that maintain `graph-relay.toml` (hashes only); and
//! the simulator of the published experiments (`sim`).

mod approval;
mod baseline;
mod children;
mod console;
mod demo;
mod graphs;
mod help;
mod loadtest;
mod mcp_client;
mod orphans;
mod process_executor;
mod run_status;
mod status;
mod worker;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{Caller, DEFAULT_INSTRUCTIONS, McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_core::stats::OperatorStats;
use graph_relay_core::store::Store;
use graph_relay_transport_http::auth::{AgentToken, DeviceToken, TokenKind, hash_token, new_token};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};
use graph_relay_transport_http::server::{ServerError, maintain, shutdown_signal};
use graph_relay_transport_http::{Principal, Server};

/// mimalloc instead of the system allocator: a request allocates and frees
/// many small blocks (HTTP parts, JSON, the store's rows), and glibc's
/// malloc/free took about a fifth of `serve`'s CPU under load
/// (`cargo run --release -p graph-relay --example vs_rmcp` measures it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "graph-relay",
    version,
    about = "Queue Graph runs for AI agents over MCP; relays on desktops run them."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct StoreArgs {
    /// SQLite database file (shared by `serve` and `stdio`).
    #[arg(long, default_value = "graph-relay.db", conflicts_with = "memory")]
    db: PathBuf,
    /// Keep the queue in memory (lost on exit).
    #[arg(long)]
    memory: bool,
    /// PostgreSQL URL (`postgres://user@host:5432/db`), for several servers
    /// sharing one queue (`serve` and `stdio`); they wake each other's held
    /// requests with LISTEN/NOTIFY.
    #[arg(long, value_name = "URL", conflicts_with_all = ["memory", "db"])]
    postgres: Option<String>,
    /// Postgres schema for the tables (created if missing); default: the
    /// connection's search_path.
    #[arg(long, value_name = "SCHEMA", requires = "postgres")]
    postgres_schema: Option<String>,
    /// Most connections this process keeps to Postgres for its requests,
    /// 1 to 1000 (default 16); the wake-up listener has one more. Every
    /// server's pool counts against the database's `max_connections`.
    #[arg(long, value_name = "N", requires = "postgres", value_parser = postgres_pool_size)]
    postgres_pool: Option<usize>,
}

/// Most connections `--postgres-pool` accepts.
const MAX_POSTGRES_POOL: usize = 1000;

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
enum Command {
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
enum Kind {
    Agent,
    Device,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
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

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] graph_relay_transport_http::config::ConfigError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Tokens(#[from] graph_relay_transport_http::auth::TokenConfigError),
    #[error(transparent)]
    OAuth(#[from] graph_relay_transport_http::oauth::OAuthConfigError),
    #[error("cannot open the database: {0}")]
    Db(String),
    #[error("{0}")]
    Usage(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    #[error(transparent)]
    Demo(#[from] demo::DemoError),
    #[error(transparent)]
    Loadtest(#[from] loadtest::LoadtestError),
    #[error(transparent)]
    Status(#[from] status::StatusError),
    #[error(transparent)]
    Sim(#[from] graph_relay_sim::UnknownExperiment),
    #[error(transparent)]
    Plot(#[from] graph_relay_sim::plot::PlotError),
}

/// The tracing target of the worker's human status lines.
pub const STATUS_TARGET: &str = "graph_relay::status";

/// Two outputs on stderr: the worker's status lines ([`STATUS_TARGET`]) as
/// bare human-readable lines, whatever `GRAPH_RELAY_LOG` says (the worker
/// decides which it emits: `--quiet`, `--verbose`), and every other event in
/// the usual format, filtered by `GRAPH_RELAY_LOG` (default `default_filter`).
fn init_logging(default_filter: &str) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let status = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.target() == STATUS_TARGET
        }));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_env("GRAPH_RELAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter))
                .add_directive(
                    format!("{STATUS_TARGET}=off")
                        .parse()
                        .expect("a constant directive"),
                ),
        );
    tracing_subscriber::registry().with(status).with(log).init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own steps; the server's log would drown them.
    // The worker prints its own status lines: only warnings from the log
    // unless it is asked to be verbose.
    let default_filter = match &cli.command {
        Command::Demo(_) | Command::Loadtest(_) => "warn",
        Command::Worker(args) if !args.verbose => "warn",
        _ => "info",
    };
    init_logging(default_filter);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("graph-relay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve {
            listen,
            store,
            config,
            insecure_anonymous_agent,
            lease_seconds,
            lease_controls,
            max_wait_seconds,
            metrics,
        } => serve(
            listen,
            &store,
            &config,
            insecure_anonymous_agent,
            Leases {
                seconds: lease_seconds,
                controls: lease_controls,
            },
            max_wait_seconds,
            metrics,
        ),
        Command::Status(args) => Ok(status::run(&args)?),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "graph-relay", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { out } => man(out.as_deref()),
        Command::Stdio {
            store,
            config,
            agent,
            max_line_bytes,
        } => stdio(&store, &config, &agent, max_line_bytes),
        Command::Token { config, command } => token(&config, command),
        Command::Worker(args) => Ok(worker::run(args)?),
        Command::Demo(args) => Ok(demo::run(args)?),
        Command::Loadtest(args) => Ok(loadtest::run(args)?),
        Command::Approve { console, command } => answer(&console, &command, true, None),
        Command::Deny {
            console,
            command,
            reason,
        } => answer(&console, &command, false, reason),
        Command::Sim {
            experiments,
            seed,
            json,
            plot,
        } => sim(&experiments, seed, json, plot.as_deref()),
        Command::DevShare {
            store,
            config,
            device,
            project,
            session,
            name,
        } => dev_share(&store, &config, &device, &project, &session, &name),
    }
}

fn open_store(args: &StoreArgs) -> Result<Arc<dyn Store>, CliError> {
    if args.postgres.is_some() {
        return Err(CliError::Usage(
            "--postgres is supported by `serve` and `stdio`".into(),
        ));
    }
    if args.memory {
        return Ok(Arc::new(graph_relay_store_memory::MemoryStore::new()));
    }
    Ok(Arc::new(open_sqlite(args)?))
}

/// The SQLite store of `--db`.
fn open_sqlite(args: &StoreArgs) -> Result<graph_relay_store_sqlite::SqliteStore, CliError> {
    graph_relay_store_sqlite::SqliteStore::open(&args.db)
        .map_err(|e| CliError::Db(format!("{}: {e}", args.db.display())))
}

/// The Postgres store of `--postgres`, connected and migrated on `runtime`
/// (which then drives its connections); `None` without the flag.
fn open_postgres(
    args: &StoreArgs,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<graph_relay_store_postgres::PostgresStore>, CliError> {
    let Some(url) = &args.postgres else {
        return Ok(None);
    };
    let defaults = graph_relay_store_postgres::PostgresOptions::default();
    let options = graph_relay_store_postgres::PostgresOptions {
        schema: args.postgres_schema.clone(),
        pool_size: args.postgres_pool.unwrap_or(defaults.pool_size),
        ..defaults
    };
    runtime
        .block_on(graph_relay_store_postgres::PostgresStore::connect(
            url, &options,
        ))
        .map(Some)
        .map_err(|e| CliError::Db(format!("postgres: {e}")))
}

/// `postgres` (opened by [`open_postgres`]) or else `open_store`; with
/// Postgres, the queue's signals are forwarded to (and woken by) the other
/// servers on the database.
fn open_any_store(
    args: &StoreArgs,
    postgres: Option<graph_relay_store_postgres::PostgresStore>,
    runtime: &tokio::runtime::Runtime,
) -> Result<McpServer, CliError> {
    match postgres {
        None => mcp_server(open_store(args)?),
        Some(pg) => {
            let server = mcp_server(Arc::new(pg.clone()))?;
            let _enter = runtime.enter();
            // The listener runs (and reconnects) for the life of the runtime.
            let _listener = pg.signal_bridge(server.queue().signals().clone()).install();
            tracing::info!(schema = ?pg.schema(), "queue and MCP sessions on Postgres; wake-ups over LISTEN/NOTIFY");
            Ok(server)
        }
    }
}

/// The MCP server of `graph-relay stdio`: the published catalog on `store`.
fn mcp_server(store: Arc<dyn Store>) -> Result<McpServer, CliError> {
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let mut info = ServerInfo::new("graph-relay", env!("CARGO_PKG_VERSION"));
    info.instructions = Some(DEFAULT_INSTRUCTIONS.into());
    let catalog = ToolCatalog::builder()
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(McpServer::new(queue, catalog, info))
}

/// Creates `path` with a development agent and device; prints their tokens once.
fn bootstrap(path: &Path, listen: SocketAddr) -> Result<(), CliError> {
    let agent_token = new_token(TokenKind::Agent);
    let device_token = new_token(TokenKind::Device);
    let file = ConfigFile {
        server: ServerSection::default(),
        oauth: None,
        agents: vec![AgentToken {
            name: "dev-agent".into(),
            owner: "dev".into(),
            projects: vec!["default".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(&agent_token),
            revoked: false,
        }],
        devices: vec![DeviceToken {
            name: "dev-desktop".into(),
            owner: "dev".into(),
            token_sha256: hash_token(&device_token),
            revoked: false,
        }],
    };
    file.save(path)?;
    eprintln!(
        "Created {} with a development agent and device. These tokens are shown ONCE:\n\n  agent  dev-agent    {agent_token}\n  device dev-desktop  {device_token}\n\nConnect an MCP client to http://{listen}/mcp with header\n  Authorization: Bearer {agent_token}\nor over stdio: graph-relay stdio --agent dev-agent --config {}\nConnect a relay (worker) to http://{listen} with the device token.\n",
        path.display(),
        path.display()
    );
    Ok(())
}

/// `graph-relay serve`: the flags mapped onto the configuration file's
/// settings, then the library's server.
fn serve(
    listen: SocketAddr,
    store: &StoreArgs,
    config_path: &Path,
    anonymous: Option<String>,
    leases: Leases,
    max_wait_seconds: Option<u32>,
    metrics: Option<SocketAddr>,
) -> Result<(), CliError> {
    if !config_path.exists() {
        bootstrap(config_path, listen)?;
    }
    let file = ConfigFile::load(config_path)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let postgres = open_postgres(store, &runtime)?;
    let (queue_store, stats): (Arc<dyn Store>, Option<Arc<dyn OperatorStats>>) = match &postgres {
        Some(pg) => (Arc::new(pg.clone()), Some(Arc::new(pg.clone()))),
        None if store.memory => (open_store(store)?, None),
        None => {
            let sqlite = Arc::new(open_sqlite(store)?);
            (sqlite.clone(), Some(sqlite))
        }
    };
    let catalog = ToolCatalog::builder()
        .wait_seconds(max_wait_seconds)
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut builder = Server::builder(queue_store)
        .config_file(config_path)?
        .catalog(catalog);
    let queue = builder.queue_config_mut();
    if let Some(seconds) = leases.seconds {
        queue.lease_long_poll = Duration::from_secs(seconds);
    }
    if let Some(controls) = leases.controls {
        queue.lease_interval_controls = controls;
    }
    if let Some(address) = metrics {
        builder = builder.metrics(address);
    }
    if let Some(stats) = stats {
        builder = builder.operator_stats(stats);
    }
    if let Some(name) = anonymous {
        builder = builder.anonymous_agent(find_agent(&file, &name)?);
    }
    if let Some(pg) = &postgres {
        // Sessions in the queue's database: any server of the cluster
        // serves any MCP-Session-Id, so the load balancer needs no affinity.
        builder = builder.mcp_session_store(Arc::new(pg.mcp_session_store()));
    }
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let server = builder.build(listener).await?;
        if let Some(pg) = postgres {
            // The listener runs (and reconnects) for the life of the runtime.
            let _listener = pg.signal_bridge(server.queue().signals().clone()).install();
            tracing::info!(schema = ?pg.schema(), "queue and MCP sessions on Postgres; wake-ups over LISTEN/NOTIFY");
        }
        server.serve(shutdown_signal()).await?;
        Ok(())
    })
}

/// `graph-relay man`: the page of the binary on stdout, or into `out` the
/// pages of the binary and of each visible command.
fn man(out: Option<&Path>) -> Result<(), CliError> {
    let command = <Cli as clap::CommandFactory>::command();
    let Some(dir) = out else {
        clap_mangen::Man::new(command).render(&mut std::io::stdout())?;
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    let mut pages = vec![("graph-relay".to_owned(), command.clone())];
    for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("graph-relay-{}", sub.get_name());
        pages.push((
            name.clone(),
            sub.clone()
                .display_name(name)
                .version(env!("CARGO_PKG_VERSION")),
        ));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut file = std::fs::File::create(&path)?;
        clap_mangen::Man::new(page).render(&mut file)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `approve` / `deny`: one request to the worker's local console.
fn answer(
    console: &str,
    command: &str,
    approve: bool,
    reason: Option<String>,
) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let line = runtime
        .block_on(console::answer_from_terminal(
            console, command, approve, reason,
        ))
        .map_err(CliError::Usage)?;
    println!("{line}");
    Ok(())
}

/// The lease settings given on the command line (they win over the file).
struct Leases {
    seconds: Option<u64>,
    controls: Option<u32>,
}

fn sim(names: &[String], seed: u64, json: bool, plot: Option<&Path>) -> Result<(), CliError> {
    let outcomes = graph_relay_sim::run(names, seed)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&graph_relay_sim::render_json(&outcomes, seed))
                .unwrap_or_default()
        );
    } else {
        print!("{}", graph_relay_sim::render_text(&outcomes, seed));
    }
    if let Some(dir) = plot {
        for path in graph_relay_sim::plot::write_all(&outcomes, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Which entries a command-line `NAME` or `OWNER/NAME` means: identity is
/// (owner, name), so a bare name that several owners use is refused with
/// the choices spelled out. `entries` are `(owner, name)` pairs; returns
/// the indexes of the matching ones (never empty).
fn select_principals<'a>(
    what: &str,
    target: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<usize>, CliError> {
    let (owner, name) = match target.split_once('/') {
        Some((owner, name)) => (Some(owner), name),
        None => (None, target),
    };
    let mut found = Vec::new();
    let mut owners = std::collections::BTreeSet::new();
    for (index, (o, n)) in entries.enumerate() {
        if n == name && owner.is_none_or(|wanted| wanted == o) {
            found.push(index);
            owners.insert(o);
        }
    }
    if found.is_empty() {
        return Err(CliError::Usage(format!(
            "no {what} `{target}` in the configuration"
        )));
    }
    if owners.len() > 1 {
        let choices: Vec<String> = owners.iter().map(|o| format!("{o}/{name}")).collect();
        return Err(CliError::Usage(format!(
            "{what} `{name}` exists for several owners; say which: {}",
            choices.join(", ")
        )));
    }
    Ok(found)
}

fn find_agent(file: &ConfigFile, name: &str) -> Result<Caller, CliError> {
    let active: Vec<&AgentToken> = file.agents.iter().filter(|a| !a.revoked).collect();
    let picked = select_principals(
        "agent",
        name,
        active.iter().map(|a| (a.owner.as_str(), a.name.as_str())),
    )
    .map_err(|e| match e {
        CliError::Usage(text) if text.starts_with("no agent") => CliError::Usage(format!(
            "{text} (create one with `graph-relay token create agent {name}`)"
        )),
        other => other,
    })?;
    let entry = active[picked[0]];
    let one = graph_relay_transport_http::auth::TokenConfig {
        agents: vec![entry.clone()],
        devices: vec![],
    };
    match one.principals()?.into_values().next() {
        Some(Principal::Agent(caller)) => Ok(caller),
        _ => Err(CliError::Usage(format!("agent `{name}` is not usable"))),
    }
}

fn stdio(
    store: &StoreArgs,
    config_path: &Path,
    agent: &str,
    max_line_bytes: usize,
) -> Result<(), CliError> {
    let file = ConfigFile::load(config_path)?;
    let caller = find_agent(&file, agent)?;
    // Postgres needs a runtime for its connections; stdio itself blocks on
    // this thread while the runtime's workers drive them.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _enter = runtime.enter();
    let postgres = open_postgres(store, &runtime)?;
    let server = open_any_store(store, postgres, &runtime)?;
    runtime.spawn(maintain(server.queue().clone(), std::future::pending()));
    let config = graph_relay_transport_stdio::StdioConfig { max_line_bytes };
    tracing::info!(agent = %caller.agent.id, "graph-relay serving MCP on stdio");
    graph_relay_transport_stdio::serve_stdio(&server, &caller, &config)
        .map(|report| tracing::info!(?report, "stdio client disconnected"))
        .map_err(|e| CliError::Io(std::io::Error::other(e)))
}

fn token(config_path: &Path, command: TokenCommand) -> Result<(), CliError> {
    let mut file = if config_path.exists() {
        ConfigFile::load(config_path)?
    } else {
        ConfigFile::default()
    };
    match command {
        TokenCommand::Create {
            kind,
            name,
            owner,
            projects,
            scopes,
        } => create_token(&mut file, config_path, kind, name, owner, projects, scopes),
        TokenCommand::Operator => {
            let token = new_token(TokenKind::Operator);
            file.server.operator_token_sha256 = Some(hash_token(&token));
            file.save(config_path)?;
            eprintln!(
                "Created the operator token in {} (serve reads it at start). It is shown once:",
                config_path.display()
            );
            println!("{token}");
            Ok(())
        }
        TokenCommand::List => {
            list_tokens(&file);
            Ok(())
        }
        TokenCommand::Revoke { target } => revoke_tokens(&mut file, config_path, &target),
    }
}

/// `token create`: a new agent or device token, validated with the rest
/// of the file before it is written, and shown once.
fn create_token(
    file: &mut ConfigFile,
    config_path: &Path,
    kind: Kind,
    name: String,
    owner: String,
    projects: Vec<String>,
    scopes: Vec<String>,
) -> Result<(), CliError> {
    let (token, kind_name) = match kind {
        Kind::Agent => {
            let token = new_token(TokenKind::Agent);
            file.agents.push(AgentToken {
                name: name.clone(),
                owner,
                projects: if projects.is_empty() {
                    vec!["default".into()]
                } else {
                    projects
                },
                scopes: if scopes.is_empty() {
                    vec![READ_SCOPE.into(), RUN_SCOPE.into()]
                } else {
                    scopes
                },
                token_sha256: hash_token(&token),
                revoked: false,
            });
            (token, "agent")
        }
        Kind::Device => {
            let token = new_token(TokenKind::Device);
            file.devices.push(DeviceToken {
                name: name.clone(),
                owner,
                token_sha256: hash_token(&token),
                revoked: false,
            });
            (token, "device")
        }
    };
    // Validate before writing.
    graph_relay_transport_http::auth::TokenConfig {
        agents: file.agents.clone(),
        devices: file.devices.clone(),
    }
    .principals()?;
    file.save(config_path)?;
    eprintln!(
        "Created {kind_name} token for `{name}` in {}. It is shown once:",
        config_path.display()
    );
    println!("{token}");
    Ok(())
}

/// `token list`: every token of the file, active or revoked.
fn list_tokens(file: &ConfigFile) {
    println!(
        "{:<7} {:<24} {:<16} {:<14} {:<8} scopes/projects",
        "kind", "name", "owner", "hash", "state"
    );
    for a in &file.agents {
        println!(
            "{:<7} {:<24} {:<16} {:<14} {:<8} {} / {}",
            "agent",
            a.name,
            a.owner,
            &a.token_sha256[..12.min(a.token_sha256.len())],
            if a.revoked { "revoked" } else { "active" },
            a.scopes.join(" "),
            a.projects.join(" ")
        );
    }
    for d in &file.devices {
        println!(
            "{:<7} {:<24} {:<16} {:<14} {:<8}",
            "device",
            d.name,
            d.owner,
            &d.token_sha256[..12.min(d.token_sha256.len())],
            if d.revoked { "revoked" } else { "active" }
        );
    }
}

/// `token revoke`: by hash prefix, or every active token of one (owner,
/// name).
fn revoke_tokens(file: &mut ConfigFile, config_path: &Path, target: &str) -> Result<(), CliError> {
    let by_hash = target.len() >= 8 && target.bytes().all(|b| b.is_ascii_hexdigit());
    let mut count = 0;
    if by_hash {
        for a in file
            .agents
            .iter_mut()
            .filter(|a| a.token_sha256.starts_with(target) && !a.revoked)
        {
            a.revoked = true;
            count += 1;
        }
        for d in file
            .devices
            .iter_mut()
            .filter(|d| d.token_sha256.starts_with(target) && !d.revoked)
        {
            d.revoked = true;
            count += 1;
        }
    }
    if count == 0 {
        // By name: every active token of one (owner, name), agents
        // and devices alike; a name several owners use needs its owner.
        let agents: Vec<usize> = (0..file.agents.len())
            .filter(|&i| !file.agents[i].revoked)
            .collect();
        let devices: Vec<usize> = (0..file.devices.len())
            .filter(|&i| !file.devices[i].revoked)
            .collect();
        let entries = agents
            .iter()
            .map(|&i| (file.agents[i].owner.as_str(), file.agents[i].name.as_str()))
            .chain(devices.iter().map(|&i| {
                (
                    file.devices[i].owner.as_str(),
                    file.devices[i].name.as_str(),
                )
            }));
        let picked = match select_principals("token", target, entries) {
            Ok(picked) => picked,
            Err(CliError::Usage(text)) if text.starts_with("no token") => Vec::new(),
            Err(e) => return Err(e),
        };
        for index in picked {
            match agents.get(index) {
                Some(&i) => file.agents[i].revoked = true,
                None => file.devices[devices[index - agents.len()]].revoked = true,
            }
            count += 1;
        }
    }
    if count == 0 {
        return Err(CliError::Usage(format!(
            "no active token matches `{target}`"
        )));
    }
    file.save(config_path)?;
    eprintln!("Revoked {count} token(s); a running server picks this up within seconds.");
    Ok(())
}

fn dev_share(
    store: &StoreArgs,
    config_path: &Path,
    device: &str,
    project: &str,
    session: &str,
    name: &str,
) -> Result<(), CliError> {
    let file = ConfigFile::load(config_path)?;
    let active: Vec<&DeviceToken> = file.devices.iter().filter(|d| !d.revoked).collect();
    let picked = select_principals(
        "device",
        device,
        active.iter().map(|d| (d.owner.as_str(), d.name.as_str())),
    )?;
    let entry = active[picked[0]];
    let bad = |e: graph_relay_core::ids::InvalidId| CliError::Usage(e.to_string());
    let device = Device::new(
        DeviceId::parse(&entry.name).map_err(bad)?,
        OwnerId::parse(&entry.owner).map_err(bad)?,
    );
    let request = SyncRequest {
        project: ProjectId::parse(project).map_err(bad)?,
        sessions: vec![SessionMeta {
            graph_session_id: GraphSessionId::parse(session).map_err(bad)?,
            name: name.into(),
            description: "".into(),
            slug: name.to_lowercase().replace(' ', "-").into(),
            version: "1".into(),
            status: "ready".into(),
        }],
        long_poll: false,
        restarted: false,
        running: None,
    };
    let queue = Queue::new(
        open_store(store)?,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let response = futures::executor::block_on(queue.sync(&device, &request))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    eprintln!(
        "Shared {session} to project {project} as device {}; {} command(s) queued for it.",
        device.id,
        response.commands.len()
    );
    Ok(())
}
