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
mod command_line;
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
mod stores;
mod tokens;
mod worker;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use graph_relay_core::catalog::ToolCatalog;
use graph_relay_core::prelude::*;
use graph_relay_transport_http::Server;
use graph_relay_transport_http::auth::DeviceToken;
use graph_relay_transport_http::config::ConfigFile;
use graph_relay_transport_http::{ServerError, maintain, shutdown_signal};

use crate::command_line::{Command, StoreArgs};
use crate::stores::{open_any_store, open_postgres, open_store};
use crate::tokens::{bootstrap, find_agent, select_principals, token};

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
            connection_threads,
        } => serve(
            listen,
            &store,
            &config,
            ServeFlags {
                anonymous: insecure_anonymous_agent,
                leases: Leases {
                    seconds: lease_seconds,
                    controls: lease_controls,
                },
                max_wait_seconds,
                metrics,
                connection_threads: connection_threads.map_or_else(one_per_processor, usize::from),
            },
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

/// One connection thread per processor the process may use.
fn one_per_processor() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The flags of `graph-relay serve` beyond the listener, store and file.
struct ServeFlags {
    anonymous: Option<String>,
    leases: Leases,
    max_wait_seconds: Option<u32>,
    metrics: Option<SocketAddr>,
    /// 0 serves the connections on the runtime's workers.
    connection_threads: usize,
}

/// `graph-relay serve`: the flags mapped onto the configuration file's
/// settings, then the library's server.
fn serve(
    listen: SocketAddr,
    store: &StoreArgs,
    config_path: &Path,
    flags: ServeFlags,
) -> Result<(), CliError> {
    let ServeFlags {
        anonymous,
        leases,
        max_wait_seconds,
        metrics,
        connection_threads,
    } = flags;
    if !config_path.exists() {
        bootstrap(config_path, listen)?;
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if connection_threads > 0 {
        // The connections have threads of their own: this runtime accepts
        // them and runs the maintenance and the metrics listener.
        runtime.worker_threads(1);
    }
    let runtime = runtime.enable_all().build()?;
    let stores = stores::open_for_serve(store, &runtime)?;
    let catalog = ToolCatalog::builder()
        .wait_seconds(max_wait_seconds)
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut builder = Server::builder(stores.queue)
        .config_file(config_path)?
        .catalog(catalog)
        .connection_threads(connection_threads);
    leases.apply(builder.queue_config_mut());
    if let Some(address) = metrics {
        builder = builder.metrics(address);
    }
    if let Some(stats) = stores.stats {
        builder = builder.operator_stats(stats);
    }
    if let Some(name) = anonymous {
        let file = ConfigFile::load(config_path)?;
        builder = builder.anonymous_agent(find_agent(&file, &name)?);
    }
    let postgres = stores.postgres;
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

impl Leases {
    /// Sets the settings given in `queue`.
    fn apply(&self, queue: &mut QueueConfig) {
        if let Some(seconds) = self.seconds {
            queue.lease_long_poll = Duration::from_secs(seconds);
        }
        if let Some(controls) = self.controls {
            queue.lease_interval_controls = controls;
        }
    }
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
