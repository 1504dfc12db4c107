//! [`Server`] and its builder: everything a graph-relay server runs, as one
//! value (the docs are on [`Server`]).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use graph_relay_core::catalog::{CatalogError, ToolCatalog};
use graph_relay_core::mcp::{Caller, DEFAULT_INSTRUCTIONS, McpServer, McpSessionStore, ServerInfo};
use graph_relay_core::queue::{Queue, QueueConfig};
use graph_relay_core::stats::OperatorStats;
use graph_relay_core::store::Store;
use graph_relay_core::time::{RandomIds, SystemClock};
use tokio::net::TcpListener;

use crate::auth::{AnonymousFallback, TokenConfigError};
use crate::config::{ConfigError, ConfigFile};
use crate::metrics::Metrics;
use crate::oauth::{AuthChain, OAuthAuthenticator, OAuthConfig, OAuthConfigError, OAuthStartError};
use crate::serve::{RESERVED_FILES, raise_open_file_limit};
use crate::token_file::TokenFile;
use crate::{Authenticator, HttpConfig, HttpState, ServeConfig, TokioSleeper};

/// How long [`ServerBuilder::build`] waits for the authorization server's
/// keys before it serves anyway (answering OAuth tokens 503 until they
/// load): long enough that the first requests after a start are not
/// refused, short enough not to hold a restart up.
pub const OAUTH_START_WAIT: Duration = Duration::from_secs(3);

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration file cannot be read or parsed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Its static tokens are not valid.
    #[error(transparent)]
    Tokens(#[from] TokenConfigError),
    /// Its `[oauth]` section is not valid.
    #[error("[oauth]: {0}")]
    OAuth(#[from] OAuthConfigError),
    /// The OAuth key loader could not start.
    #[error("[oauth]: {0}")]
    OAuthStart(#[from] OAuthStartError),
    /// The tool catalog is not valid.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A `wait_seconds` call could outlive the request timeout that ends it.
    #[error(
        "the longest wait_seconds ({wait} s) must stay below the request timeout ({timeout} s)"
    )]
    WaitPastTimeout {
        /// The catalog's longest wait, in seconds.
        wait: u32,
        /// The request timeout, in seconds.
        timeout: u64,
    },
    /// An anonymous agent on an address other machines can reach.
    #[error("an anonymous agent is only allowed on a loopback address, not {0}")]
    AnonymousNotLoopback(SocketAddr),
    /// A listener could not be bound or read.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the metrics listener serves and who may read the status.
#[derive(Debug, Clone, Default)]
struct MetricsSettings {
    listen: Option<SocketAddr>,
    operator_token_sha256: Option<String>,
}

/// Builds a [`Server`] (its docs say what it runs).
pub struct ServerBuilder {
    store: Arc<dyn Store>,
    queue: QueueConfig,
    info: ServerInfo,
    catalog: Option<ToolCatalog>,
    http: HttpConfig,
    serve: ServeConfig,
    connection_threads: usize,
    tokens: Option<Arc<dyn Authenticator>>,
    oauth: Option<OAuthConfig>,
    authenticators: Vec<Arc<dyn Authenticator>>,
    anonymous: Option<Caller>,
    metrics: MetricsSettings,
    stats: Option<Arc<dyn OperatorStats>>,
    routes: Option<Router<HttpState>>,
    mcp_sessions: Option<Arc<dyn McpSessionStore>>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("queue", &self.queue)
            .field("http", &self.http)
            .field("serve", &self.serve)
            .field("connection_threads", &self.connection_threads)
            .field("oauth", &self.oauth.is_some())
            .field("authenticators", &self.authenticators.len())
            .finish_non_exhaustive()
    }
}

impl ServerBuilder {
    /// The settings of a configuration file: `[server]` (the edge, sessions,
    /// leases, the metrics listener and operator token) and `[oauth]`, and
    /// its static tokens, read once. [`config_file`](Self::config_file)
    /// re-reads the tokens when the file changes instead.
    pub fn config(self, file: &ConfigFile) -> Result<Self, ServerError> {
        let tokens = crate::auth::StaticTokens::new(&file.tokens())?;
        self.settings(file, Arc::new(tokens))
    }

    /// The configuration file at `path`, as [`config`](Self::config), with
    /// its tokens re-read whenever the file changes: a token removed or
    /// marked `revoked` stops working at once, and its sessions end.
    pub fn config_file(self, path: impl AsRef<Path>) -> Result<Self, ServerError> {
        let path = path.as_ref();
        let file = ConfigFile::load(path)?;
        let tokens = TokenFile::open(path)?;
        self.settings(&file, Arc::new(tokens))
    }

    fn settings(
        mut self,
        file: &ConfigFile,
        tokens: Arc<dyn Authenticator>,
    ) -> Result<Self, ServerError> {
        if let Some(oauth) = &file.oauth {
            oauth.validate()?;
        }
        self.http = file.server.http_config();
        if let Some(oauth) = &file.oauth
            && self.http.authorization_servers.is_empty()
        {
            // The resource metadata sends OAuth clients to the issuer.
            self.http.authorization_servers = vec![oauth.issuer.clone()];
        }
        self.serve = file.server.serve_config();
        self.queue = file.server.queue_config(self.queue);
        self.oauth = file.oauth.clone();
        self.tokens = Some(tokens);
        self.metrics = MetricsSettings {
            listen: file.server.metrics_listen,
            operator_token_sha256: file.server.operator_token_sha256.clone(),
        };
        Ok(self)
    }

    /// The queue's tunables (leases, holds, pruning), replacing those of
    /// the configuration file.
    #[must_use]
    pub fn queue_config(mut self, queue: QueueConfig) -> Self {
        self.queue = queue;
        self
    }

    /// The queue's tunables as they stand, to change one of them.
    pub fn queue_config_mut(&mut self) -> &mut QueueConfig {
        &mut self.queue
    }

    /// The HTTP transport's settings, replacing those of the file.
    #[must_use]
    pub fn http_config(mut self, http: HttpConfig) -> Self {
        self.http = http;
        self
    }

    /// The serving loop's bounds, replacing those of the file.
    #[must_use]
    pub fn serve_config(mut self, serve: ServeConfig) -> Self {
        self.serve = serve;
        self
    }

    /// Serves the connections on `threads` threads of their own, each a
    /// single-threaded runtime, instead of the runtime that runs
    /// [`Server::serve`] (see [`serve_on_threads`](crate::serve_on_threads)
    /// for when that pays). 0, the default, serves them on the caller's
    /// runtime; `graph-relay serve` uses one thread per processor.
    #[must_use]
    pub fn connection_threads(mut self, threads: usize) -> Self {
        self.connection_threads = threads;
        self
    }

    /// The name, version and instructions `initialize` announces (default:
    /// `graph-relay`, this crate's version, and
    /// [`DEFAULT_INSTRUCTIONS`]).
    #[must_use]
    pub fn info(mut self, info: ServerInfo) -> Self {
        self.info = info;
        self
    }

    /// The tools' names, descriptions, scopes and `wait_seconds` (default:
    /// the published catalog).
    #[must_use]
    pub fn catalog(mut self, catalog: ToolCatalog) -> Self {
        self.catalog = Some(catalog);
        self
    }

    /// Adds an authenticator, tried after the file's static tokens and
    /// before the authorization server's tokens (see
    /// [`AuthChain`]): API keys, a proxy's client certificate, a session
    /// cookie. The first authenticator's [`Authenticator::challenge`]
    /// writes the 401.
    #[must_use]
    pub fn authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Self {
        self.authenticators.push(authenticator);
        self
    }

    /// Requests with no credentials at all act as `caller`. For a
    /// development server only: [`build`](Self::build) refuses it unless
    /// the listener is on a loopback address.
    #[must_use]
    pub fn anonymous_agent(mut self, caller: Caller) -> Self {
        self.anonymous = Some(caller);
        self
    }

    /// Serves `GET /metrics` (and, with an operator token, `GET
    /// /admin/status`) on a listener of its own at `listen`; every store
    /// call is timed into the metrics. Overrides the file's
    /// `metrics_listen`.
    #[must_use]
    pub fn metrics(mut self, listen: SocketAddr) -> Self {
        self.metrics.listen = Some(listen);
        self
    }

    /// Where the metrics and the operator's status read the queue's figures
    /// (the SQLite and Postgres stores offer them; without a source the
    /// metrics show the HTTP and in-process figures, and the status
    /// answers 501).
    #[must_use]
    pub fn operator_stats(mut self, stats: Arc<dyn OperatorStats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Where initialize-era MCP sessions (`MCP-Session-Id`) are kept
    /// (default: [`MemoryMcpSessionStore`](crate::mcp_sessions::MemoryMcpSessionStore),
    /// this process's memory). Servers that share a queue behind a load
    /// balancer should share this too (e.g. `PostgresMcpSessionStore` on
    /// the queue's database): then any of them serves any session and no
    /// affinity is needed. The bounds are the configuration's `[server]`
    /// session settings ([`HttpConfig::mcp_sessions`]).
    #[must_use]
    pub fn mcp_session_store(mut self, sessions: Arc<dyn McpSessionStore>) -> Self {
        self.mcp_sessions = Some(sessions);
        self
    }

    /// Routes of the integrator's own, served behind the same edge as the
    /// MCP endpoint (Host/Origin check, body limit, request timeout); their
    /// handlers take the caller with [`AgentPrincipal`](crate::AgentPrincipal)
    /// or [`DevicePrincipal`](crate::DevicePrincipal).
    #[must_use]
    pub fn routes(mut self, routes: Router<HttpState>) -> Self {
        self.routes = Some(match self.routes.take() {
            Some(existing) => existing.merge(routes),
            None => routes,
        });
        self
    }

    /// Builds the server on `listener`: the queue, the authenticators (the
    /// OAuth key loader is started and given [`OAUTH_START_WAIT`]), the
    /// routes and, if asked, the metrics listener. Must run inside a tokio
    /// runtime. Nothing is served until [`Server::serve`].
    pub async fn build(self, listener: TcpListener) -> Result<Server, ServerError> {
        let local = listener.local_addr()?;
        let catalog = match self.catalog {
            Some(catalog) => catalog,
            None => ToolCatalog::builder().build()?,
        };
        let http = bound_http(
            self.http,
            &catalog,
            self.anonymous.is_some(),
            self.serve.max_connections,
            local,
        )?;

        let metrics = self.metrics.listen.map(|_| {
            let metrics = Metrics::new(self.stats.clone());
            Arc::new(match self.metrics.operator_token_sha256.clone() {
                Some(hash) => metrics.with_operator_status(hash, self.stats.clone()),
                None => metrics,
            })
        });
        let store = match &metrics {
            Some(metrics) => Arc::new(metrics.timed_store(self.store)) as Arc<dyn Store>,
            None => self.store,
        };
        let queue = Queue::new(
            store,
            Arc::new(SystemClock),
            Arc::new(RandomIds),
            self.queue,
        );
        let waits = catalog.max_wait_seconds().is_some();
        let mut mcp = McpServer::new(queue, catalog, self.info);
        if waits {
            mcp = mcp.with_sleeper(Arc::new(TokioSleeper));
        }

        let auth = authenticators(
            self.tokens.into_iter().chain(self.authenticators).collect(),
            self.oauth.as_ref(),
            &http.resource_url(),
        )
        .await?;
        let auth = with_anonymous(auth, self.anonymous);
        let state = match self.mcp_sessions {
            Some(sessions) => HttpState::with_mcp_session_store(mcp, auth, http, sessions),
            None => HttpState::new(mcp, auth, http),
        };
        state.watch_revocations();
        let mut app = crate::router(state.clone());
        if let Some(routes) = self.routes {
            app = app.merge(crate::edge_layers(routes, state.clone()));
        }
        let metrics = match (self.metrics.listen, metrics) {
            (Some(address), Some(metrics)) => {
                let listener = TcpListener::bind(address).await?;
                let at = listener.local_addr()?;
                if !at.ip().is_loopback() {
                    tracing::warn!(%at, "metrics on a non-loopback address: they are totals over every owner; keep the port reachable by the operator only");
                }
                if self.stats.is_none() {
                    tracing::info!(
                        "metrics: the store offers no queue figures; serving the HTTP and in-process figures only"
                    );
                }
                app = metrics.instrument(app);
                tracing::info!(%at, "metrics at http://{at}/metrics");
                Some((listener, metrics.router(state.clone(), at)))
            }
            _ => None,
        };
        Ok(Server {
            state,
            app,
            listener,
            serve: self.serve,
            connection_threads: self.connection_threads,
            metrics,
        })
    }

    /// [`build`](Self::build) then [`Server::serve`]: the whole server in
    /// one call, until `shutdown` resolves.
    pub async fn serve<F>(self, listener: TcpListener, shutdown: F) -> Result<(), ServerError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.build(listener).await?.serve(shutdown).await?;
        Ok(())
    }
}

/// The edge's settings for a server bound at `local`, once the settings
/// are checked against each other: a `wait_seconds` bound must end before
/// the request timeout, an anonymous agent is served on loopback only, and
/// the open-file limit is raised for `max_connections` (or a warning says
/// why not).
fn bound_http(
    mut http: HttpConfig,
    catalog: &ToolCatalog,
    anonymous: bool,
    max_connections: usize,
    local: SocketAddr,
) -> Result<HttpConfig, ServerError> {
    if let Some(wait) = catalog.max_wait_seconds()
        && Duration::from_secs(u64::from(wait)) + Duration::from_secs(1) > http.request_timeout
    {
        return Err(ServerError::WaitPastTimeout {
            wait,
            timeout: http.request_timeout.as_secs(),
        });
    }
    if anonymous && !local.ip().is_loopback() {
        return Err(ServerError::AnonymousNotLoopback(local));
    }
    check_open_file_limit(max_connections);
    // The Host port check and the published URLs use the bound address.
    http.listen_addr = Some(local);
    if local.ip().is_unspecified() && http.public_url.is_none() {
        tracing::warn!(
            "listening on every interface without `public_url`: the resource metadata names http://localhost:{}; set [server] public_url to the address clients use",
            local.port()
        );
    }
    Ok(http)
}

/// `auth`, or, with an anonymous caller (a loopback development server),
/// `auth` falling back to that caller for requests without credentials.
fn with_anonymous(
    auth: Arc<dyn Authenticator>,
    anonymous: Option<Caller>,
) -> Arc<dyn Authenticator> {
    match anonymous {
        Some(caller) => {
            tracing::warn!(agent = %caller.agent.id, "requests without credentials are served as this agent");
            Arc::new(AnonymousFallback::new(auth, caller))
        }
        None => auth,
    }
}

/// The chain of `sources`, then the authorization server's tokens.
async fn authenticators(
    mut sources: Vec<Arc<dyn Authenticator>>,
    oauth: Option<&OAuthConfig>,
    resource: &str,
) -> Result<Arc<dyn Authenticator>, ServerError> {
    if let Some(config) = oauth {
        let oauth = OAuthAuthenticator::start(config, resource)?;
        tracing::info!(issuer = %oauth.issuer(), audience = %oauth.audience(), "accepting OAuth access tokens from the authorization server");
        if !oauth.wait_until_ready(OAUTH_START_WAIT).await {
            tracing::warn!(issuer = %oauth.issuer(), "serving without the authorization server's keys: OAuth tokens are answered 503 until they are loaded");
        }
        sources.push(Arc::new(oauth));
    }
    Ok(Arc::new(AuthChain::new(sources)))
}

/// Raises the soft open-file limit to the hard one; warns when it stays
/// below what `max_connections` connections need.
fn check_open_file_limit(max_connections: usize) {
    let needed = u64::try_from(max_connections)
        .unwrap_or(u64::MAX)
        .saturating_add(RESERVED_FILES);
    match raise_open_file_limit() {
        Ok(limit) => {
            if limit.now > limit.before {
                tracing::info!(
                    before = limit.before,
                    now = limit.now,
                    "raised the open-file limit"
                );
            }
            if limit.now < needed {
                tracing::warn!(
                    limit = limit.now,
                    needed,
                    max_connections,
                    "the open-file limit is below what the connection cap needs; the server may stop accepting before the cap (raise `ulimit -n` or lower [server] max_connections)"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot check the open-file limit"),
    }
}

/// A built server, ready to [`serve`](Self::serve).
///
/// A whole server as a library value: [`Server::builder`] takes a store,
/// the configuration and any authenticators of the integrator's own, and
/// the [`Server`] it builds runs everything a correct graph-relay server
/// runs, which `graph-relay serve` is only a thin wrapper around:
///
/// - the MCP endpoint, the relay API and the OAuth resource metadata
///   ([`router`](crate::router)), plus routes of the integrator's own
///   behind the same edge ([`ServerBuilder::routes`]);
/// - the bounded edge: a connection cap, header-read and idle timeouts
///   ([`serve`](crate::serve())), Host/Origin checks, body limits and
///   request timeouts;
/// - the queue's maintenance ([`Queue::run_maintenance`]): without it a
///   run whose desktop died stays `running` forever, coalesced progress is
///   never written and nothing is pruned;
/// - the revocation watch: a revoked token's sessions, streams and waits
///   end within a second;
/// - the initialize-era session table ([`ServerBuilder::mcp_session_store`]):
///   this process's memory by default, or a store shared by every server of
///   a cluster (the Postgres store's), so that any server serves any
///   `MCP-Session-Id` and a load balancer needs no affinity; expired
///   sessions are swept every ten seconds;
/// - graceful shutdown: held requests answer at once, then requests in
///   flight finish;
/// - when asked, the metrics listener with the operator's `/admin/status`
///   ([`ServerBuilder::metrics`]).
///
/// ```no_run
/// use std::sync::Arc;
/// use graph_relay_store_memory::MemoryStore;
/// use graph_relay_transport_http::config::ConfigFile;
/// use graph_relay_transport_http::{Server, shutdown_signal};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
/// Server::builder(Arc::new(MemoryStore::new()))
///     .config_file("graph-relay.toml")?
///     .serve(listener, shutdown_signal())
///     .await?;
/// # Ok(()) }
/// ```
///
/// An integrator who mounts [`router`](crate::router) (or its parts) in an
/// app of their own instead must run the rest themselves: see
/// "What you must run yourself" in the crate docs.
pub struct Server {
    state: HttpState,
    app: Router,
    listener: TcpListener,
    serve: ServeConfig,
    connection_threads: usize,
    metrics: Option<(TcpListener, Router)>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr())
            .field("metrics_addr", &self.metrics_addr())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A builder for a server on `store` with the default settings (those
    /// of an empty configuration file, and no authenticator: add one, or a
    /// configuration file).
    pub fn builder(store: Arc<dyn Store>) -> ServerBuilder {
        let mut info = ServerInfo::new("graph-relay", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(DEFAULT_INSTRUCTIONS.to_owned());
        ServerBuilder {
            store,
            queue: QueueConfig::default(),
            info,
            catalog: None,
            http: HttpConfig::default(),
            serve: ServeConfig::default(),
            connection_threads: 0,
            tokens: None,
            oauth: None,
            authenticators: Vec::new(),
            anonymous: None,
            metrics: MetricsSettings::default(),
            stats: None,
            routes: None,
            mcp_sessions: None,
        }
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.state
            .config()
            .listen_addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The metrics listener's address, when the server has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// The routes' shared state (the MCP server, the authenticator, the
    /// configuration).
    pub fn state(&self) -> &HttpState {
        &self.state
    }

    /// The queue, e.g. to connect a shared store's wake-ups to it before
    /// serving.
    pub fn queue(&self) -> &Queue {
        self.state.mcp().queue()
    }

    /// Serves until `shutdown` resolves: the routes on the bounded edge,
    /// the queue's maintenance once a second and the metrics listener.
    /// On shutdown every held request answers at once and waits and
    /// listen streams end ([`Queue::shut_down`]), the server stops
    /// accepting and lets what is in flight finish (up to
    /// [`ServeConfig::shutdown_grace`]). Returns once every connection is
    /// closed.
    pub async fn serve<F>(self, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let queue = self.queue().clone();
        let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
        let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let maintenance = tokio::spawn(maintain(queue.clone(), stopped(stopped_rx.clone())));
        let sweeping = tokio::spawn(sweep_mcp_sessions(
            self.state.clone(),
            stopped(stopped_rx.clone()),
        ));
        let metrics = self.metrics.map(|(listener, router)| {
            tokio::spawn(crate::serve(
                listener,
                router,
                ServeConfig::default(),
                stopped(stopped_rx.clone()),
            ))
        });
        let local = self.listener.local_addr()?;
        tracing::info!(%local, "graph-relay serving MCP at http://{local}/mcp");
        let stopping = queue.clone();
        let shutdown = async move {
            shutdown.await;
            stopping.shut_down();
            let _ = stopped_tx.send(true);
        };
        let served = match self.connection_threads {
            0 => crate::serve(self.listener, self.app, self.serve, shutdown).await,
            threads => {
                crate::serve_on_threads(self.listener, self.app, self.serve, threads, shutdown)
                    .await
            }
        };
        let _ = maintenance.await;
        let _ = sweeping.await;
        if let Some(metrics) = metrics {
            let _ = metrics.await;
        }
        tracing::info!("graph-relay stopped");
        served
    }
}

/// The queue's maintenance until `stopped` resolves or the queue shuts
/// down, on the tokio timer, logged through `tracing`: what [`Server`]
/// runs, for a server that mounts the routes itself ([`Queue::run_maintenance`]
/// with a log). Runs whose lease lapsed are logged at `info`; a failing
/// store is logged at most once a minute and tried again at the next step.
///
/// ```no_run
/// # fn demo(queue: graph_relay_core::queue::Queue) {
/// tokio::spawn(graph_relay_transport_http::maintain(queue, std::future::pending()));
/// # }
/// ```
pub async fn maintain(queue: Queue, stopped: impl Future<Output = ()>) {
    let mut last_warning: Option<tokio::time::Instant> = None;
    queue
        .run_maintenance(&TokioSleeper, stopped, |step| match step {
            Ok(report) if report.leases > 0 => tracing::info!(
                runs = report.leases,
                "closed runs whose desktop stopped reporting (lease lapsed)"
            ),
            Ok(_) => {}
            Err(e) => {
                if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    tracing::warn!(error = %e, "queue maintenance failed; trying again");
                    last_warning = Some(tokio::time::Instant::now());
                }
            }
        })
        .await;
}

/// How often [`Server`] deletes expired initialize-era sessions.
pub const MCP_SESSION_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Deletes expired initialize-era sessions from the state's session store
/// every [`MCP_SESSION_SWEEP_EVERY`] (a bounded batch each time) until
/// `stopped` resolves: what [`Server`] runs. Expired sessions are never
/// served even unswept; the sweep frees their room (and rows).
pub async fn sweep_mcp_sessions(state: HttpState, stopped: impl Future<Output = ()>) {
    let sweep = async {
        let mut last_warning: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(MCP_SESSION_SWEEP_EVERY).await;
            let now = state.mcp().queue().now();
            let limits = &state.config().mcp_sessions;
            if let Err(e) = state.mcp_session_store().sweep(limits, now).await
                && last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
            {
                tracing::warn!(error = %e, "sweeping expired MCP sessions failed; trying again");
                last_warning = Some(tokio::time::Instant::now());
            }
        }
    };
    tokio::select! {
        () = sweep => {},
        () = stopped => {},
    }
}

/// Resolves on SIGINT or SIGTERM (Ctrl-C elsewhere): the usual shutdown
/// future for [`Server::serve`]. On Unix the handlers are installed when
/// this is called, not when the future is first polled, so a signal that
/// arrives in between still stops the server gracefully.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            async fn next(stream: Option<tokio::signal::unix::Signal>) {
                match stream {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            let (int, term) = streams;
            tokio::select! {
                () = next(int) => {},
                () = next(term) => {},
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutdown requested; finishing requests in flight");
    }
}
