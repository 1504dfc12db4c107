//! `graph-relay worker`: the desktop relay over HTTP.
//!
//! Wires the pieces together: the graphs file (consent and run
//! specifications, re-read on change), the relay state machine, the HTTP
//! transport, the SQLite outbox and the process executor, and prints one
//! status line per event on stderr. SIGINT/SIGTERM cancel the current run
//! (SIGTERM to its process group, SIGKILL after the grace), report it
//! through the outbox and try once more to deliver every pending report.
//!
//! Before its first pass the worker ends the Graph processes a crashed
//! predecessor left running on the same outbox ([`crate::orphans`]); its
//! first syncs then tell the server it restarted, so the runs that died with
//! the predecessor end at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use graph_relay_core::ids::GraphSessionId;
use graph_relay_core::relay::driver::{DriverEvent, RelayDriver, RelayTransport, SharedSetSender};
use graph_relay_core::relay::executor::{Approver, Executor};
use graph_relay_core::relay::{Relay, RelayConfig, RelayEvent, RelayMode};
use graph_relay_core::time::Clock;
use graph_relay_core::time::SystemClock;
use graph_relay_store_sqlite::SqliteOutbox;
use graph_relay_transport_http::TokioSleeper;
use graph_relay_transport_http::relay_http::{HttpRelayConfig, HttpRelayTransport};
use graph_relay_transport_http::relay_metrics::RelayMetrics;

use crate::approval::HookApprover;
use crate::console::{Console, ConsoleApprover, ConsoleExecutor};
use crate::graphs::{self, GraphSpec, Graphs};
use crate::process_executor::ProcessExecutor;
use crate::run_status::{CurrentRun, Watched, report_long_runs};

/// How the relay asks for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Held requests: work and cancellations arrive at once (default).
    LongPoll,
    /// The published relay: a pass every 20 s, a control poll every 3 s.
    Interval,
}

impl Mode {
    /// The name on the command line and in status lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::LongPoll => "long-poll",
            Mode::Interval => "interval",
        }
    }
}

/// How much the worker says on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// Problems only: an unreachable server (and its return), failed
    /// deliveries, refusals, warnings.
    Quiet,
    /// One line per run event, sync and problem (default).
    Normal,
    /// Also every pass, and the log of the HTTP client and the server code.
    Verbose,
}

impl Verbosity {
    /// Whether the line for `event` is shown at this verbosity.
    ///
    /// An outage is a problem at every verbosity, its end included: a
    /// `--quiet` log that said the server was lost must also say when it
    /// came back. The relay decides when an outage is worth a line
    /// ([`RelayEvent::ServerLost`], [`RelayEvent::StillUnreachable`],
    /// [`RelayEvent::ServerBack`]); the failed requests behind them are
    /// verbose only.
    pub fn shows(self, event: &DriverEvent) -> bool {
        let problem = matches!(
            event,
            DriverEvent::OutboxError(_)
                | DriverEvent::Relay(
                    RelayEvent::SyncFailed {
                        unreachable: false,
                        ..
                    } | RelayEvent::ServerLost { .. }
                        | RelayEvent::StillUnreachable { .. }
                        | RelayEvent::ServerBack { .. }
                        | RelayEvent::ClaimRefused { .. }
                        | RelayEvent::ClaimUnconfirmed { .. }
                        | RelayEvent::ProgressRefused { .. }
                        | RelayEvent::DeliveryFailed { .. }
                        | RelayEvent::Dropped { .. }
                        | RelayEvent::ClosedByServer { .. }
                )
        );
        // Passes, accepted progress and unanswered requests come often (a
        // request goes unanswered every few seconds while the server is
        // away; the outage lines above speak for them): verbose only.
        let pass = matches!(
            event,
            DriverEvent::Relay(
                RelayEvent::PassStarted
                    | RelayEvent::PassFinished { .. }
                    | RelayEvent::ProgressPosted { .. }
                    | RelayEvent::ControlFailed { .. }
                    | RelayEvent::SyncFailed {
                        unreachable: true,
                        ..
                    }
            )
        );
        match self {
            Verbosity::Quiet => problem,
            Verbosity::Normal => !pass,
            Verbosity::Verbose => true,
        }
    }
}

/// Options of `graph-relay worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8787.
    #[arg(long)]
    pub server: String,
    /// File holding the device token (`grd_…`).
    #[arg(long)]
    pub token_file: PathBuf,
    /// The Graphs this desktop shares and how to run them (re-read on change).
    #[arg(long)]
    pub graphs: PathBuf,
    /// long-poll (default) or interval.
    #[arg(long, value_enum, default_value = "long-poll")]
    pub mode: Mode,
    /// SQLite file of the outbox (reports not yet delivered). Default: one
    /// file per server and device token in the platform's data directory
    /// (e.g. ~/.local/share/graph-relay/ on Linux), printed at start.
    #[arg(long, value_name = "FILE")]
    pub outbox: Option<PathBuf>,
    /// Print only problems (an unreachable server and its return, failed
    /// deliveries, refusals, warnings).
    #[arg(long, short, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Also print every pass and the log of the HTTP client.
    #[arg(long, short)]
    pub verbose: bool,
    /// Seconds between SIGTERM and SIGKILL when a run is cancelled.
    #[arg(long, default_value_t = 5)]
    pub grace_seconds: u64,
    /// Serve the local console (approve or decline runs waiting for
    /// approval, watch and cancel the running run, see the last 50
    /// finished runs) on this loopback address, e.g. 127.0.0.1:8788; off by
    /// default. Its URL, with a secret drawn at start, is printed once.
    #[arg(long, value_name = "127.0.0.1:PORT")]
    pub console: Option<std::net::SocketAddr>,
    /// Serve `GET /metrics` (Prometheus: outbox, runs, failures, server
    /// reachability) on this address, e.g. 127.0.0.1:9188; off by default.
    /// On a loopback address only a loopback `Host` is answered.
    #[arg(long, value_name = "127.0.0.1:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Seconds between status lines while a run runs (how long, and its
    /// latest progress); 0 for none.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub progress_every: u64,
}

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The graphs file is unusable.
    #[error(transparent)]
    Graphs(#[from] graphs::GraphsError),
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The outbox could not be opened.
    #[error("cannot open the outbox {path}: {message}")]
    Outbox {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] graph_relay_transport_http::relay_http::ClientBuildError),
    /// The console could not start.
    #[error(transparent)]
    Console(#[from] crate::console::ConsoleError),
    /// The runtime could not start.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// `--metrics` names an address other than loopback.
    #[error(
        "--metrics {0}: the worker serves its metrics on a loopback address only (e.g. 127.0.0.1:9188)"
    )]
    MetricsNotLoopback(std::net::SocketAddr),
    /// No `--outbox` and no platform data directory (no home directory).
    #[error("no data directory for the outbox (is HOME set?); pass --outbox FILE")]
    NoDataDir,
}

impl WorkerArgs {
    /// What the worker prints.
    pub fn verbosity(&self) -> Verbosity {
        match (self.quiet, self.verbose) {
            (true, _) => Verbosity::Quiet,
            (false, true) => Verbosity::Verbose,
            (false, false) => Verbosity::Normal,
        }
    }
}

/// The default outbox for a worker of `server` with `token`:
/// `outbox-<12 hex>.db` in the platform's data directory for graph-relay
/// (created if missing). The name is the start of SHA-256 over the server
/// URL and the token, so two workers of different devices or servers on one
/// machine never share an outbox (a shared one would deliver one device's
/// reports with another's token, and a starting worker ends the processes
/// recorded in its outbox), while the same worker finds its pending reports
/// again after a restart.
pub fn default_outbox(server: &str, token: &str) -> Result<PathBuf, WorkerError> {
    let dirs =
        directories::ProjectDirs::from("", "", "graph-relay").ok_or(WorkerError::NoDataDir)?;
    let dir = dirs.data_dir();
    std::fs::create_dir_all(dir)?;
    let key = graph_relay_transport_http::auth::hash_token(&format!(
        "{}\n{token}",
        server.trim_end_matches('/')
    ));
    Ok(dir.join(format!("outbox-{}.db", &key[..12])))
}

/// A warning for each Graph that needs the owner's approval but has no
/// hook (`approval_command`) to ask: without a console to answer, its runs
/// could only time out.
fn unaskable_approvals(specs: &HashMap<GraphSessionId, GraphSpec>) -> Vec<String> {
    specs
        .iter()
        .filter_map(|(id, spec)| {
            let approval = spec.approval.as_ref().filter(|a| a.command.is_none())?;
            Some(format!(
                "warning: graph {id} needs the owner's approval but has no approval_command and the worker has no --console: its runs wait {} s for an approval that this worker cannot ask for, then fail",
                approval.timeout.as_secs()
            ))
        })
        .collect()
}

/// The device token in `path` (surrounding whitespace removed).
fn read_token(path: &Path) -> Result<String, WorkerError> {
    let text = std::fs::read_to_string(path).map_err(|source| WorkerError::Token {
        path: path.to_owned(),
        source,
    })?;
    Ok(text.trim().to_owned())
}

/// The relay's configuration from the command line: its mode, a fresh
/// seed for execution ids, and time to stop within the grace period.
fn relay_config(args: &WorkerArgs) -> RelayConfig {
    RelayConfig {
        mode: match args.mode {
            Mode::LongPoll => RelayMode::LongPoll,
            Mode::Interval => RelayMode::Interval,
        },
        seed: uuid::Uuid::new_v4().as_u128() as u64,
        shutdown_timeout: Duration::from_secs(args.grace_seconds + 20),
        ..RelayConfig::default()
    }
}

/// Runs the worker until SIGINT/SIGTERM.
pub fn run(args: WorkerArgs) -> Result<(), WorkerError> {
    let verbosity = args.verbosity();
    let status = move |line: &str| {
        if verbosity != Verbosity::Quiet || line.starts_with("warning:") {
            print_status(line);
        }
    };
    if let Some(address) = args.metrics
        && !address.ip().is_loopback()
    {
        return Err(WorkerError::MetricsNotLoopback(address));
    }
    let graphs = load_graphs(&args, status)?;
    let token = read_token(&args.token_file)?;
    let (outbox_path, outbox) = open_outbox(&args, &token)?;
    let http = HttpRelayTransport::new(HttpRelayConfig::new(&args.server, token))?;
    let transport: Arc<dyn RelayTransport> = Arc::new(http);
    let specs = Arc::new(RwLock::new(graphs.specs));
    let grace = Duration::from_secs(args.grace_seconds);
    let current = CurrentRun::default();
    let process = process_executor(&specs, grace, &outbox, &current);
    let hook = HookApprover::new(specs.clone());
    let clock = Arc::new(SystemClock);
    let relay = Relay::new(relay_config(&args), graphs.shared.clone(), clock.now());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let console = match args.console {
            Some(address) => Some(Console::start(address).await?),
            None => None,
        };
        let (executor, approver) = watched_by(console.as_ref(), process, hook);
        let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
        let metrics = match args.metrics {
            Some(address) => Some(
                serve_metrics(address, outbox.clone(), clock.clone(), stopped_rx, status).await?,
            ),
            None => None,
        };
        let driver = RelayDriver::new(
            relay,
            transport,
            outbox.clone(),
            executor,
            clock,
            Arc::new(TokioSleeper),
        )
        .with_approver(approver);
        let shared_tx = driver.shared_set_sender();
        if let Some(console) = &console {
            attach_console(console, &driver, status);
        }
        // Signal handlers first: a stop asked for once the line below is
        // printed must find them.
        let stop = graph_relay_transport_http::shutdown_signal();
        status(&format!(
            "worker: relaying {} for {} ({}; outbox {})",
            args.graphs.display(),
            args.server,
            args.mode.as_str(),
            outbox_path.display()
        ));
        crate::orphans::end_left_over(&outbox, grace, |line| status(&line)).await;
        spawn_watchers(&args, shared_tx, specs, current, status);
        driver
            .run(
                stop,
                observer(metrics.as_deref(), console.as_ref(), verbosity),
            )
            .await;
        let _ = stopped_tx.send(true);
        status("worker: stopped");
        Ok::<(), WorkerError>(())
    })?;
    Ok(())
}

/// The graphs file, with a warning for each way it cannot work as meant:
/// nothing shared, or approvals no one can give without a console.
fn load_graphs(args: &WorkerArgs, status: impl Fn(&str)) -> Result<Graphs, WorkerError> {
    let graphs = Graphs::load(&args.graphs)?;
    if let Some(warning) = graphs::nothing_shared_warning(&args.graphs, &graphs.shared) {
        status(&warning);
    }
    if args.console.is_none() {
        for warning in unaskable_approvals(&graphs.specs) {
            status(&warning);
        }
    }
    Ok(graphs)
}

/// The outbox named on the command line, or the default one for this
/// server and token; returns its path too, for the status line.
fn open_outbox(
    args: &WorkerArgs,
    token: &str,
) -> Result<(PathBuf, Arc<SqliteOutbox>), WorkerError> {
    let outbox_path = match &args.outbox {
        Some(path) => path.clone(),
        None => default_outbox(&args.server, token)?,
    };
    let outbox = Arc::new(
        SqliteOutbox::open(&outbox_path).map_err(|e| WorkerError::Outbox {
            path: outbox_path.clone(),
            message: e.to_string(),
        })?,
    );
    Ok((outbox_path, outbox))
}

/// Runs each Graph as a process (ended `grace` after a cancel, its pid
/// kept in the outbox's ledger for a successor), watched as the current run.
fn process_executor(
    specs: &graphs::SpecTable,
    grace: Duration,
    outbox: &Arc<SqliteOutbox>,
    current: &CurrentRun,
) -> Arc<dyn Executor> {
    Arc::new(Watched::new(
        ProcessExecutor::new(specs.clone(), grace).with_ledger(outbox.clone()),
        current.clone(),
    ))
}

/// The executor and approver the driver uses: with a console, the runs it
/// shows are watched as they run and approvals are asked there.
fn watched_by(
    console: Option<&Console>,
    process: Arc<dyn Executor>,
    hook: HookApprover,
) -> (Arc<dyn Executor>, Arc<dyn Approver>) {
    match console {
        Some(console) => (
            Arc::new(ConsoleExecutor::new(console.clone(), process)),
            Arc::new(ConsoleApprover::new(console.clone(), hook)),
        ),
        None => (process, Arc::new(hook)),
    }
}

/// Lets the console cancel the driver's runs, and says where it is.
fn attach_console(console: &Console, driver: &RelayDriver, status: impl Fn(&str)) {
    console.attach(driver.local_canceller());
    status(&format!(
        "console: {} (approve, decline or cancel runs; keep this URL private)",
        console.url()
    ));
}

/// The tasks that run beside the driver: the graphs file's watch (a change
/// reaches the relay as a new shared set) and, if asked, the reminder of a
/// run that takes long.
fn spawn_watchers(
    args: &WorkerArgs,
    shared_tx: SharedSetSender,
    specs: graphs::SpecTable,
    current: CurrentRun,
    status: impl Fn(&str) + Copy + Send + 'static,
) {
    tokio::spawn(graphs::watch(
        args.graphs.clone(),
        Duration::from_secs(1),
        shared_tx,
        specs,
        move |line| status(&line),
    ));
    if args.progress_every > 0 {
        tokio::spawn(report_long_runs(
            current,
            Duration::from_secs(args.progress_every),
            move |line| status(line),
        ));
    }
}

/// Where each driver event goes: the metrics, the console, and a status
/// line when the verbosity shows it.
fn observer<'a>(
    metrics: Option<&'a RelayMetrics>,
    console: Option<&'a Console>,
    verbosity: Verbosity,
) -> impl FnMut(DriverEvent) + 'a {
    move |event| {
        if let Some(metrics) = metrics {
            metrics.observe(&event);
        }
        if let (Some(console), DriverEvent::Relay(event)) = (console, &event) {
            console.observe(event);
        }
        if verbosity.shows(&event)
            && let Some(line) = describe(&event)
        {
            print_status(&line);
        }
    }
}

/// Starts the metrics listener at `address` until `stopped` turns true,
/// and says where it listens; returns the metrics to feed.
async fn serve_metrics(
    address: std::net::SocketAddr,
    outbox: Arc<SqliteOutbox>,
    clock: Arc<SystemClock>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    status: impl Fn(&str),
) -> std::io::Result<Arc<RelayMetrics>> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let local = listener.local_addr()?;
    let metrics = Arc::new(RelayMetrics::new(outbox, clock));
    tokio::spawn(graph_relay_transport_http::serve(
        listener,
        metrics.router(local),
        graph_relay_transport_http::ServeConfig::default(),
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ));
    status(&format!("metrics: http://{local}/metrics"));
    Ok(metrics)
}

/// One human status line, through tracing (target
/// [`STATUS_TARGET`](crate::STATUS_TARGET), printed bare on stderr): at
/// warn level when it begins with `warning:` (a lost server among them),
/// else at info.
fn print_status(line: &str) {
    if line.starts_with("warning:") {
        tracing::warn!(target: crate::STATUS_TARGET, "{line}");
    } else {
        tracing::info!(target: crate::STATUS_TARGET, "{line}");
    }
}

/// The status line of an event (`None`: not worth a line).
pub fn describe(event: &DriverEvent) -> Option<String> {
    Some(match event {
        DriverEvent::Relay(e) => match e {
            RelayEvent::PassStarted => "pass: started".into(),
            RelayEvent::PassFinished { .. } => "pass: finished".into(),
            RelayEvent::Synced { project, commands } => {
                format!("sync: project {project}: {commands} command(s) queued")
            }
            RelayEvent::Unshared { project } => format!(
                "sync: project {project} unshared: no Graph is shared there any more, and the server no longer lists any"
            ),
            RelayEvent::SyncFailed {
                project, reason, ..
            } => {
                format!("sync: project {project} failed: {reason}")
            }
            RelayEvent::Declined { command } => format!(
                "declined {command}: {}",
                graph_relay_core::command::NO_LONGER_SHARED
            ),
            RelayEvent::ClaimRefused { command, reason } => {
                format!("not run {command}: {reason}")
            }
            RelayEvent::ClaimUnconfirmed { command, reason } => {
                format!("start of {command} unconfirmed ({reason}); claiming it again next pass")
            }
            RelayEvent::Started { command, execution } => {
                format!("started {command} (execution {execution})")
            }
            RelayEvent::CancelSent { command } => {
                format!("cancelling {command}: the agent asked to stop it")
            }
            RelayEvent::CancelledOnTheDesktop { command } => {
                format!("cancelling {command}: the owner cancelled it on the desktop")
            }
            RelayEvent::ApprovalRequested { command, until } => format!(
                "waiting for the owner's approval of {command} (until {})",
                until.to_rfc3339()
            ),
            RelayEvent::Approved { command } => format!("approved {command} on the desktop"),
            RelayEvent::ApprovalDenied { command, reason } => match reason {
                Some(reason) => format!("declined {command} on the desktop: {reason}"),
                None => format!("declined {command} on the desktop"),
            },
            RelayEvent::ApprovalTimedOut { command } => {
                format!("not approved in time: {command} did not run")
            }
            RelayEvent::ClosedByServer { command, status } => format!(
                "stopping {command}: the server closed the run as {} (its lease lapsed or the desktop restarted); its result will not be reported",
                status.as_str()
            ),
            RelayEvent::Abandoned { command } => {
                format!("stopped {command}: the server had closed the run; nothing reported")
            }
            RelayEvent::ProgressPosted { command } => format!("progress of {command} posted"),
            RelayEvent::ServerLost { reason } => format!(
                "warning: server unreachable ({reason}); retrying every few seconds, and saying so now and then"
            ),
            RelayEvent::StillUnreachable {
                attempts,
                unreachable_for,
                reason,
            } => format!(
                "warning: server still unreachable: {attempts} attempts without an answer over {} ({reason}); retrying",
                span(*unreachable_for)
            ),
            RelayEvent::ServerBack {
                unreachable_for,
                attempts,
            } => format!(
                "server reachable again after {} unreachable ({attempts} attempts without an answer)",
                span(*unreachable_for)
            ),
            RelayEvent::ControlFailed { command, reason } => {
                format!("control poll for {command} failed (retrying): {reason}")
            }
            RelayEvent::ProgressRefused { command, reason } => {
                format!("progress of {command} refused; sending no more: {reason}")
            }
            RelayEvent::Finished {
                command,
                status,
                truncated,
            } => format!(
                "finished {command}: {}{}",
                status.as_str(),
                if *truncated {
                    " (result truncated)"
                } else {
                    ""
                }
            ),
            RelayEvent::Delivered { command } => format!("delivered {command}"),
            RelayEvent::DeliveryFailed { command, reason } => {
                format!("delivery of {command} failed (kept in the outbox): {reason}")
            }
            RelayEvent::Dropped { command, reason } => {
                format!("report for {command} dropped: {reason}")
            }
            RelayEvent::Stopping { running } => match running {
                Some(c) => format!("stopping: cancelling {c}"),
                None => "stopping".into(),
            },
            RelayEvent::GaveUpWaiting { command } => {
                format!(
                    "stopping: gave up waiting for {command} (its report stays in the outbox if stored)"
                )
            }
            RelayEvent::Stopped { delivered, kept } => {
                format!("outbox flushed: {delivered} delivered, {kept} kept")
            }
        },
        DriverEvent::OutboxError(e) => format!("outbox: {e}"),
    })
}

/// A length of time for a status line: `800 ms`, `14 s`, `3 min 20 s`, `2 h 5 min`.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_relay_core::ids::ProjectId;

    fn relay(event: RelayEvent) -> DriverEvent {
        DriverEvent::Relay(event)
    }

    #[test]
    fn an_outage_is_shown_at_every_verbosity_and_its_unanswered_requests_only_when_verbose() {
        let p1 = ProjectId::parse("p1").expect("id");
        let lost = relay(RelayEvent::ServerLost {
            reason: "network error: connection refused".into(),
        });
        let still = relay(RelayEvent::StillUnreachable {
            attempts: 4,
            unreachable_for: Duration::from_secs(200),
            reason: "network error: connection refused".into(),
        });
        let back = relay(RelayEvent::ServerBack {
            unreachable_for: Duration::from_millis(14_200),
            attempts: 5,
        });
        let unanswered = relay(RelayEvent::SyncFailed {
            project: p1.clone(),
            reason: "network error: connection refused".into(),
            unreachable: true,
        });
        // A refusal is not an outage: it is always said.
        let refused = relay(RelayEvent::SyncFailed {
            project: p1,
            reason: "422 too_many_projects".into(),
            unreachable: false,
        });
        for verbosity in [Verbosity::Quiet, Verbosity::Normal, Verbosity::Verbose] {
            for event in [&lost, &still, &back, &refused] {
                assert!(verbosity.shows(event), "{verbosity:?} {event:?}");
            }
            assert_eq!(
                verbosity.shows(&unanswered),
                verbosity == Verbosity::Verbose
            );
        }
        assert_eq!(
            describe(&lost).as_deref(),
            Some(
                "warning: server unreachable (network error: connection refused); retrying every few seconds, and saying so now and then"
            )
        );
        assert_eq!(
            describe(&still).as_deref(),
            Some(
                "warning: server still unreachable: 4 attempts without an answer over 3 min 20 s (network error: connection refused); retrying"
            )
        );
        assert_eq!(
            describe(&back).as_deref(),
            Some("server reachable again after 14 s unreachable (5 attempts without an answer)")
        );
    }
}
