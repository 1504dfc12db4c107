//! # graph-relay-transport-http
//!
//! MCP over Streamable HTTP for graph-relay, with the OAuth2
//! resource-server checks in front of it, the relay HTTP API, and the
//! relay's HTTP client.
//!
//! A whole server is one value: [`Server::builder`] takes a store, the
//! configuration file ([`config`]) and authenticators of your own, and the
//! [`Server`] runs the routes on the bounded edge together with the queue's
//! maintenance, the revocation watch, graceful shutdown and the metrics
//! listener ([`Server`] says what each is for). `graph-relay serve` is a
//! thin wrapper around it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use graph_relay_store_memory::MemoryStore;
//! use graph_relay_transport_http::Server;
//! use graph_relay_transport_http::shutdown_signal;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! Server::builder(Arc::new(MemoryStore::new()))
//!     .config_file("graph-relay.toml")?
//!     .serve(listener, shutdown_signal())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! [`router`] builds the same routes as an [`axum::Router`] to mount in an
//! app of your own, and [`serve()`] serves it (or any router) with a
//! connection cap and timeouts; a server assembled that way must run the
//! rest itself (the "Build your own server" guide in `docs/` lists it).
//! [`serve_on_threads`] (and [`ServerBuilder::connection_threads`]) serve
//! the connections on threads of their own, each keeping its connections,
//! which costs less CPU where most connections are held long-polls.
//!
//! Its parts compose: [`mcp_routes`], [`relay_routes`] and
//! [`metadata_routes`] each carry their own edge layers; handlers of an
//! integrator's own take the caller with the [`AgentPrincipal`] and
//! [`DevicePrincipal`] extractors; an [`Authenticator`] reads whatever
//! headers it likes and writes its own 401 ([`Authenticator::challenge`]);
//! and [`mcp_headers`] holds the MCP header rules for an `/mcp` endpoint
//! written from scratch. `examples/api_key_server.rs` puts them together.
//!
//! ```text
//!  connection ─► serve: cap (503), header-read and idle timeouts
//!  POST /mcp  ─► Host/Origin (403) ─► bearer token (401, Connection: close)   ← headers only
//!             ─► body ─► headers & session ─► authorization table (403 insufficient_scope)
//!             ─► core::mcp::McpServer ─► JSON or an SSE stream
//! ```
//!
//! - `POST /mcp`: one JSON-RPC message; a request is answered with
//!   `application/json`, a notification or response with 202. A
//!   `tools/call` carrying `_meta.progressToken` from a client that accepts
//!   `text/event-stream` is answered with an SSE stream: the
//!   `notifications/progress` of a waiting `get_graph_run` as they happen,
//!   then the result.
//! - Credentials are checked by the [`Authenticator`]: the static token file
//!   ([`token_file::TokenFile`]), access tokens of an OAuth authorization server
//!   ([`oauth::OAuthAuthenticator`]: JWTs checked with its JWKS, opaque
//!   tokens by introspection), or both ([`oauth::AuthChain`]).
//! - `GET /mcp`: 405 (no SSE stream is offered). `DELETE /mcp` ends an
//!   initialize-era session.
//! - Initialize-era clients get an `MCP-Session-Id` with their `initialize`
//!   result and must send it (and, after 2025-03-26, `MCP-Protocol-Version`)
//!   afterwards: missing 400, unknown 404. A session belongs to the agent
//!   (owner, name) and the token that created it; sessions are bounded per
//!   agent and in all ([`McpSessionLimits`]). Sessions live in an
//!   [`McpSessionStore`]: this
//!   process's memory by default ([`MemoryMcpSessionStore`]), or a store
//!   shared by every server of a cluster
//!   ([`ServerBuilder::mcp_session_store`], e.g. the Postgres store's), so
//!   that a load balancer needs no affinity. 2026-07-28 requests are stateless
//!   and must carry `MCP-Protocol-Version`, `Mcp-Method` and (for
//!   `tools/call`) `Mcp-Name` matching the body (400, `-32020` otherwise).
//! - `GET /.well-known/oauth-protected-resource/mcp`: RFC 9728 metadata of
//!   `/mcp`, whose URLs come from [`HttpConfig::public_url`] or the
//!   listening address, never from the request. Only there: the root
//!   `/.well-known/oauth-protected-resource` would describe the origin, and
//!   a client must refuse a document whose `resource` is not the URL it
//!   derived the location from (RFC 9728 §3.3), so it answers 404.
//! - Every `/mcp` request needs `Authorization: Bearer <agent token>`,
//!   checked before the body is read: 401 with
//!   `WWW-Authenticate: Bearer resource_metadata="…"` otherwise (with
//!   `error="invalid_token"` and an `error_description` saying why a token
//!   was refused; 503 while an authorization server's keys cannot be had);
//!   a device token is refused there. A message the token's scopes do not cover
//!   (the one table in `graph_relay_core::authz`: tools, `tasks/*`,
//!   `subscriptions/listen`) gets 403 `insufficient_scope` naming the scope,
//!   before any queue work.
//! - Hosts and origins are parsed strictly ([`host_origin`]) and checked (DNS
//!   rebinding): by default only loopback names on the listening port; 403
//!   otherwise. Bodies are bounded (413) and requests time out (408).
//! - `subscriptions/listen` streams are bounded per agent and in lifetime
//!   ([`ListenLimits`]).
//! - When the [`Authenticator`] reports that a token was revoked, its open
//!   listen streams, held `wait_seconds` calls and sessions end within a
//!   second ([`HttpState::revoked`]).
//!
//! The state ([`HttpState`]) carries the MCP server, the authenticator and
//! the configuration; the relay API shares it:
//!
//! - `POST /external-assistants/graph-relays/sync`, `…/commands/{id}/start`,
//!   `…/control`, `…/complete`, `…/decline`, `…/progress` with a *device* token, and
//!   `GET …/openapi.json` describing every body ([`relay_wire`],
//!   [`relay_api`]). Long-poll syncs and controls are held up to
//!   [`RelayApiConfig::hold`].
//! - [`relay_http`] is the other end: the relay's HTTP transport for the
//!   core's runtime-free driver (`core::relay::driver`, re-exported there).

/// The "Build your own server" guide's examples, compiled and run as
/// doctests so the guide cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/your-own-server.md")]
struct YourOwnServerGuide;

pub mod auth;
pub mod config;
mod connection_threads;
mod gate;
pub mod health;
pub mod host_origin;
mod listen;
mod mcp_endpoint;
pub mod mcp_headers;
mod mcp_reply;
pub mod mcp_sessions;
pub mod metrics;
pub mod oauth;
pub mod relay_api;
pub mod relay_http;
pub mod relay_metrics;
pub mod relay_wire;
mod serve;
mod server;
pub mod store_timing;
pub mod token_file;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use graph_relay_core::mcp::McpServer;
use serde_json::json;

use crate::auth::{AuthError, Authenticated, Authenticator, Principal};
pub use crate::gate::{AgentPrincipal, DevicePrincipal};
use crate::host_origin::{Authority, AuthorityError, Origin};
pub use crate::listen::ListenLimits;
use crate::mcp_sessions::MemoryMcpSessionStore;
use crate::relay_api::RelayApiConfig;
pub use crate::serve::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_RETRY_AFTER, DEFAULT_SHUTDOWN_GRACE, MAX_REFUSING, OpenFileLimit, OpenFileLimitError,
    RESERVED_FILES, ServeConfig, raise_open_file_limit, serve, serve_on_threads,
};
pub use crate::server::{
    MCP_SESSION_SWEEP_EVERY, OAUTH_START_WAIT, Server, ServerBuilder, ServerError, maintain,
    shutdown_signal, sweep_mcp_sessions,
};
use graph_relay_core::mcp::{McpSessionLimits, McpSessionOwner, McpSessionStore};

/// Path of the MCP endpoint.
pub const MCP_PATH: &str = "/mcp";
/// The well-known prefix of the protected resource metadata (RFC 9728);
/// the metadata of `/mcp` is served at [`PRM_PATH`]`/mcp` only.
pub const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// Settings of the HTTP transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Public base URL, e.g. `https://relay.example.com` (no trailing slash).
    /// `None`: `http://<listen_addr>` (or `http://localhost` when that is
    /// unknown too). Never derived from a request's `Host`.
    pub public_url: Option<String>,
    /// The address the server listens on; `graph-relay serve` sets it from
    /// the bound listener. Its port is what `Host` must carry (see
    /// [`HttpConfig::allowed_ports`]) and, without `public_url`, it is the
    /// base of the URLs the server publishes.
    pub listen_addr: Option<SocketAddr>,
    /// Authorization servers announced in the resource metadata.
    pub authorization_servers: Vec<String>,
    /// Hosts accepted in `Host` (`name`, `1.2.3.4`, `[::1]`, optionally with
    /// `:port`); `"*"` accepts any well-formed host on any port. Each value
    /// is parsed strictly ([`host_origin`]): userinfo, look-alike suffixes and
    /// malformed values are refused whatever this list says.
    pub allowed_hosts: Vec<String>,
    /// Ports accepted in `Host` besides the port of `listen_addr` and that
    /// of `public_url`. A `Host` without a port means 80 or 443. When no
    /// port is known at all (no `listen_addr`, no `public_url`, this list
    /// empty, e.g. a router mounted by an embedder), ports are not checked.
    pub allowed_ports: Vec<u16>,
    /// Origins (`scheme://host[:port]`) accepted in `Origin`; `"*"` accepts any.
    /// Loopback origins (`http(s)://localhost|127.0.0.1|[::1]`, any port) are
    /// always accepted when the host is allowed.
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Whole-request timeout (408 beyond).
    pub request_timeout: Duration,
    /// Bounds on initialize-era MCP sessions.
    pub mcp_sessions: McpSessionLimits,
    /// Bounds on `subscriptions/listen` streams.
    pub listen: ListenLimits,
    /// The relay API (hold bound of long-poll requests).
    pub relay: RelayApiConfig,
}

impl HttpConfig {
    /// The public base URL: `public_url`, else `http://<listen_addr>`, else
    /// `http://localhost`. Never taken from a request.
    pub fn base_url(&self) -> String {
        if let Some(url) = &self.public_url {
            return url.trim_end_matches('/').to_owned();
        }
        match self.listen_addr {
            Some(addr) => {
                let host = match addr.ip() {
                    ip if ip.is_unspecified() => "localhost".to_owned(),
                    IpAddr::V4(ip) => ip.to_string(),
                    IpAddr::V6(ip) => format!("[{ip}]"),
                };
                format!("http://{host}:{}", addr.port())
            }
            None => "http://localhost".to_owned(),
        }
    }

    /// The resource URL of the MCP endpoint (`base_url` + `/mcp`): what the
    /// resource metadata announces and OAuth tokens must name as audience.
    pub fn resource_url(&self) -> String {
        format!("{}{MCP_PATH}", self.base_url())
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            public_url: None,
            listen_addr: None,
            authorization_servers: Vec::new(),
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            allowed_ports: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            mcp_sessions: McpSessionLimits::default(),
            listen: ListenLimits::default(),
            relay: RelayApiConfig::default(),
        }
    }
}

/// Shared state of every route. Cheap to clone.
#[derive(Clone)]
pub struct HttpState {
    inner: Arc<StateInner>,
}

struct StateInner {
    mcp: McpServer,
    auth: Arc<dyn Authenticator>,
    config: HttpConfig,
    mcp_sessions: Arc<dyn McpSessionStore>,
    listens: listen::Streams,
    hosts: HostRules,
    /// Set once the task that ends sessions of revoked tokens runs.
    watching_revocations: AtomicBool,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// [`HttpConfig`]'s host, port and origin lists, parsed once.
struct HostRules {
    any_host: bool,
    hosts: Vec<Authority>,
    /// The ports `Host` may carry: `allowed_ports`, the listening port and
    /// that of `public_url`. Empty: not checked.
    ports: Vec<u16>,
    any_origin: bool,
    origins: Vec<Origin>,
}

impl HostRules {
    fn new(config: &HttpConfig) -> Self {
        let hosts = config
            .allowed_hosts
            .iter()
            .filter(|h| *h != "*")
            .filter_map(|h| match Authority::parse(h) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(host = %h, error = %e, "ignoring a malformed entry of allowed_hosts");
                    None
                }
            })
            .collect();
        let origins = config
            .allowed_origins
            .iter()
            .filter(|o| *o != "*")
            .filter_map(|o| match Origin::parse(o) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(origin = %o, error = %e, "ignoring a malformed entry of allowed_origins");
                    None
                }
            })
            .collect();
        let mut ports = config.allowed_ports.clone();
        ports.extend(config.listen_addr.map(|a| a.port()));
        if let Some(url) = &config.public_url {
            match Origin::of_url(url) {
                Ok(origin) => ports.push(origin.port()),
                Err(e) => tracing::warn!(%url, error = %e, "public_url is not an http(s) URL"),
            }
        }
        Self {
            any_host: config.allowed_hosts.iter().any(|h| h == "*"),
            hosts,
            ports,
            any_origin: config.allowed_origins.iter().any(|o| o == "*"),
            origins,
        }
    }
}

/// Why a `Host` or `Origin` was refused (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostRefusal {
    /// No `Host` header.
    #[error("the request has no Host header")]
    MissingHost,
    /// A `Host` that is not `host[:port]` by RFC 3986.
    #[error("the Host header is malformed: {0}")]
    MalformedHost(AuthorityError),
    /// A well-formed host this server does not serve.
    #[error("the Host header names a host this server does not serve")]
    UnknownHost,
    /// A served host on a port this server does not listen on.
    #[error("the Host header names a port this server does not listen on")]
    WrongPort,
    /// An `Origin` that is not allowed (or not an origin at all).
    #[error("the Origin of this request is not allowed")]
    Origin,
}

impl HttpState {
    /// State for an MCP server behind `auth`, configured by `config`.
    pub fn new(mcp: McpServer, auth: Arc<dyn Authenticator>, config: HttpConfig) -> Self {
        Self::with_mcp_session_store(mcp, auth, config, Arc::new(MemoryMcpSessionStore::new()))
    }

    /// [`new`](Self::new), keeping initialize-era sessions in `sessions`
    /// instead of this process's memory: a store shared by several servers
    /// (e.g. the Postgres store's) lets any of them serve any session, so a
    /// load balancer needs no affinity.
    pub fn with_mcp_session_store(
        mcp: McpServer,
        auth: Arc<dyn Authenticator>,
        config: HttpConfig,
        mcp_sessions: Arc<dyn McpSessionStore>,
    ) -> Self {
        let listens = listen::Streams::new(config.listen.clone());
        let hosts = HostRules::new(&config);
        Self {
            inner: Arc::new(StateInner {
                mcp,
                auth,
                config,
                mcp_sessions,
                listens,
                hosts,
                watching_revocations: AtomicBool::new(false),
            }),
        }
    }

    /// The MCP server (and through it the queue).
    pub fn mcp(&self) -> &McpServer {
        &self.inner.mcp
    }

    /// The authenticator.
    pub fn authenticator(&self) -> &Arc<dyn Authenticator> {
        &self.inner.auth
    }

    /// The configuration.
    pub fn config(&self) -> &HttpConfig {
        &self.inner.config
    }

    /// Number of live initialize-era sessions (as far as the session store
    /// knows without a query: a shared store counts at its last sweep).
    pub fn session_count(&self) -> usize {
        self.inner.mcp_sessions.figures().sessions
    }

    /// Where initialize-era sessions are kept.
    pub fn mcp_session_store(&self) -> &Arc<dyn McpSessionStore> {
        &self.inner.mcp_sessions
    }

    /// Bytes of client data the live sessions keep (their `clientInfo`),
    /// at most `max_sessions` × `MAX_INITIALIZE_FIELD_BYTES`.
    pub fn session_bytes(&self) -> usize {
        self.inner.mcp_sessions.figures().bytes
    }

    /// Number of open `subscriptions/listen` streams.
    pub fn listen_count(&self) -> usize {
        self.inner.listens.total()
    }

    /// The public base URL: `public_url`, else `http://<listen_addr>`, else
    /// `http://localhost`. Never taken from a request.
    pub fn base_url(&self) -> String {
        self.inner.config.base_url()
    }

    /// The URL of the resource metadata, as put in `WWW-Authenticate`.
    pub fn metadata_url(&self) -> String {
        format!("{}{PRM_PATH}{MCP_PATH}", self.base_url())
    }

    /// Checks `Host` and `Origin` (DNS-rebinding protection). Every route
    /// passes it before its handler; `Err` is the 403 to return.
    #[allow(clippy::result_large_err)]
    pub fn check_host_and_origin(&self, headers: &HeaderMap) -> Result<(), Response> {
        self.host_refusal(headers).map_err(|refusal| {
            let code = match refusal {
                HostRefusal::Origin => "forbidden_origin",
                _ => "forbidden_host",
            };
            forbidden(code, &refusal.to_string())
        })
    }

    /// The Host/Origin rule (see [`HttpConfig::allowed_hosts`]).
    pub fn host_refusal(&self, headers: &HeaderMap) -> Result<(), HostRefusal> {
        let rules = &self.inner.hosts;
        let host = headers
            .get(header::HOST)
            .ok_or(HostRefusal::MissingHost)?
            .to_str()
            .map_err(|_| {
                HostRefusal::MalformedHost(AuthorityError::BadCharacter(
                    char::REPLACEMENT_CHARACTER,
                ))
            })?;
        let host = Authority::parse(host).map_err(HostRefusal::MalformedHost)?;
        if !rules.any_host {
            let same_host = || rules.hosts.iter().filter(|a| a.host == host.host);
            let pinned = same_host().any(|a| a.port.is_some() && a.port == host.port);
            if !pinned {
                if !same_host().any(|a| a.port.is_none()) {
                    return Err(HostRefusal::UnknownHost);
                }
                let port_ok = rules.ports.is_empty()
                    || match host.port {
                        Some(port) => rules.ports.contains(&port),
                        // No port: the scheme's default.
                        None => rules.ports.iter().any(|p| matches!(p, 80 | 443)),
                    };
                if !port_ok {
                    return Err(HostRefusal::WrongPort);
                }
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let parsed = origin
                .to_str()
                .ok()
                .and_then(|text| Origin::parse(text).ok());
            let allowed = rules.any_origin
                || parsed.as_ref().is_some_and(|p| {
                    p.authority.host.is_loopback() || rules.origins.iter().any(|a| a.same_as(p))
                });
            if !allowed {
                return Err(HostRefusal::Origin);
            }
        }
        Ok(())
    }

    /// Authenticates a request from its headers, through
    /// [`Authenticator::authenticate_request`]. `Err` is the 401 (written
    /// by [`Authenticator::challenge`]) or 503 to return.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, Response> {
        self.authenticate_request(headers)
            .await
            .map(|who| who.principal)
    }

    /// [`HttpState::authenticate`], keeping the credential's hash (what
    /// revocation is checked against).
    pub async fn authenticate_request(
        &self,
        headers: &HeaderMap,
    ) -> Result<Authenticated, Response> {
        self.inner
            .auth
            .authenticate_request(headers)
            .await
            .map_err(|e| self.refusal(&e))
    }

    /// The answer to a request whose credentials `error` refused: 401 with
    /// the authenticator's challenge, or 503 with `Retry-After` when the
    /// authenticator could not decide.
    ///
    /// ```
    /// # async fn demo(state: graph_relay_transport_http::HttpState) {
    /// use graph_relay_transport_http::auth::AuthError;
    ///
    /// let response = state.refusal(&AuthError::MissingCredentials);
    /// assert_eq!(response.status(), 401);
    /// assert!(response.headers().contains_key("www-authenticate"));
    /// # }
    /// ```
    pub fn refusal(&self, error: &AuthError) -> Response {
        // Quoted-string safe: the descriptions lose quotes and backslashes.
        let quoted = |text: &str| text.replace(['"', '\\'], "'");
        match error {
            AuthError::MissingCredentials => self.unauthorized(
                None,
                None,
                "this endpoint needs an OAuth2 bearer token (Authorization: Bearer <token>)",
            ),
            AuthError::MalformedCredentials(why) => {
                let description = quoted(why);
                self.unauthorized(Some("invalid_request"), Some(&description), &description)
            }
            AuthError::InvalidToken => {
                let description = "the token is unknown, revoked or malformed";
                self.unauthorized(Some("invalid_token"), Some(description), description)
            }
            AuthError::Refused(refusal) => {
                let description = quoted(&refusal.to_string());
                self.unauthorized(Some("invalid_token"), Some(&description), &description)
            }
            AuthError::Unavailable(reason) => {
                tracing::warn!(%reason, "a token could not be checked; answering 503");
                let mut response = (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(
                        json!({"error": "temporarily_unavailable", "error_description": reason}),
                    ),
                )
                    .into_response();
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                response
            }
        }
    }

    /// 401 through [`Authenticator::challenge`].
    pub(crate) fn unauthorized(
        &self,
        error: Option<&str>,
        description: Option<&str>,
        message: &str,
    ) -> Response {
        let metadata = self.metadata_url();
        self.inner.auth.challenge(&auth::Challenge {
            resource_metadata: &metadata,
            error,
            description,
            message,
        })
    }

    /// Resolves once the token behind `who` is revoked, removed or changed
    /// (see [`Authenticator::revocations`]); never for an anonymous caller
    /// or an authenticator that cannot revoke.
    pub async fn revoked(&self, who: &Authenticated) {
        let auth = &self.inner.auth;
        let (Some(hash), Some(mut changes)) = (&who.token_sha256, auth.revocations()) else {
            return std::future::pending().await;
        };
        loop {
            if !auth.still_valid(hash, &who.principal).await {
                return;
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Starts (once, on the current tokio runtime) the task that ends the
    /// sessions of revoked tokens as soon as the authenticator reports a
    /// change. The gate calls it on the first authenticated request.
    pub(crate) fn watch_revocations(&self) {
        if self.inner.watching_revocations.load(Ordering::Relaxed) {
            return;
        }
        let Some(mut changes) = self.inner.auth.revocations() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.watching_revocations.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let ended = end_revoked(
                    inner.mcp_sessions.as_ref(),
                    inner.auth.as_ref(),
                    inner.config.mcp_sessions.max_sessions,
                )
                .await;
                if ended > 0 {
                    tracing::info!(ended, "ended the sessions of revoked tokens");
                }
            }
        });
    }
}

/// Ends every session (in `sessions`, shared or not) whose token `auth` no
/// longer accepts as the same principal; returns how many ended. At most
/// `limit` distinct holders are checked per call (a store holds no more
/// than `max_sessions` sessions).
async fn end_revoked(
    sessions: &dyn McpSessionStore,
    auth: &dyn Authenticator,
    limit: usize,
) -> usize {
    let holders: Vec<McpSessionOwner> = match sessions.holders(limit.max(1)).await {
        Ok(holders) => holders,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the sessions' tokens for the revocation check");
            return 0;
        }
    };
    let mut ended = 0;
    for holder in holders {
        let Some(hash) = &holder.token_sha256 else {
            continue;
        };
        let principal = Principal::Agent(holder.caller.clone());
        if auth.still_valid(hash, &principal).await {
            continue;
        }
        match sessions.end_holder(&holder).await {
            Ok(n) => ended += n,
            Err(e) => tracing::warn!(error = %e, "cannot end the sessions of a revoked token"),
        }
    }
    ended
}

fn forbidden(code: &str, description: &str) -> Response {
    let mut response = (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": code, "error_description": description})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The tokio timer as the core's [`Sleeper`](graph_relay_core::time::Sleeper),
/// for `get_graph_run`'s `wait_seconds`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioSleeper;

impl graph_relay_core::time::Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The router: `/mcp`, the resource metadata and the relay API, with body
/// limit and timeout: [`mcp_routes`], [`relay_routes`] and
/// [`metadata_routes`] in one.
///
/// Every route first passes the Host/Origin check; `POST`/`DELETE /mcp`
/// and the relay routes then pass the credentials check, both from the
/// headers alone, before any byte of the body is read (a refusal closes
/// the connection). A path no route knows passes the Host/Origin check
/// too before its 404. `POST /mcp`, the busiest route, makes the same
/// checks in the same order itself, without the layers' plumbing; the
/// answers are the same.
///
/// Serve it with [`serve`] (the connection cap and the header and idle
/// timeouts), and run what [`Server`] otherwise runs beside it (the
/// queue's [`maintain`]ance above all; the "Build your own server" guide
/// lists it all), or let [`Server`] do both.
///
/// ```
/// use graph_relay_transport_http::{HttpState, ServeConfig, router, serve, shutdown_signal};
///
/// # async fn demo(state: HttpState) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// tokio::spawn(graph_relay_transport_http::maintain(
///     state.mcp().queue().clone(),
///     shutdown_signal(),
/// ));
/// serve(listener, router(state), ServeConfig::default(), shutdown_signal()).await
/// # }
/// ```
pub fn router(state: HttpState) -> Router {
    let routes = relay_route_set().merge(metadata_route_set());
    let health = health::health_routes(state.clone());
    mcp_endpoint::Endpoint::mount(edge_layers(routes, state.clone()).merge(health), state)
}

/// `GET`/`POST`/`DELETE /mcp` (the MCP Streamable HTTP endpoint), with the
/// Host/Origin check (403), the agent credentials check before the body
/// (401), the body limit (413) and the request timeout (408) of
/// [`HttpConfig`]: what [`router`] serves at [`MCP_PATH`].
///
/// Compose it with an integrator's own routes; their state is theirs, and
/// a handler of theirs can take the caller with [`AgentPrincipal`]:
///
/// ```
/// use axum::Router;
/// use axum::routing::get;
/// use graph_relay_transport_http::{HttpState, mcp_routes, metadata_routes, relay_routes};
///
/// fn app(state: HttpState) -> Router {
///     Router::new()
///         .route("/healthz", get(|| async { "ok" }))
///         .merge(mcp_routes(state.clone()))
///         .merge(relay_routes(state.clone()))
///         .merge(metadata_routes(state))
/// }
/// ```
pub fn mcp_routes(state: HttpState) -> Router {
    mcp_endpoint::Endpoint::mount(Router::new(), state)
}

/// The relay API under [`relay_wire::RELAY_PREFIX`] (`sync`, and `start`,
/// `control`, `complete`, `decline`, `progress` of a command) with the
/// device credentials check before the body (401; an agent's credentials
/// get 403), and `GET` [`relay_wire::OPENAPI_PATH`]; all with the
/// Host/Origin check, body limit and request timeout of [`HttpConfig`],
/// as [`router`] serves them. See [`mcp_routes`] for composing.
pub fn relay_routes(state: HttpState) -> Router {
    edge_layers(relay_route_set(), state)
}

/// `GET` [`PRM_PATH`]`/mcp`: the RFC 9728 protected resource metadata of
/// `/mcp` (what OAuth clients discover the authorization server by), with the Host/Origin check, body limit and
/// timeout, as [`router`] serves them. A server whose
/// [`Authenticator`] is not OAuth may leave it out. See [`mcp_routes`] for
/// composing.
pub fn metadata_routes(state: HttpState) -> Router {
    edge_layers(metadata_route_set(), state)
}

/// The relay API routes and the OpenAPI document. Each relay handler takes
/// [`DevicePrincipal`] first, which checks the bearer token before the
/// path or the body is read.
fn relay_route_set() -> Router<HttpState> {
    use axum::routing::post;
    let prefix = relay_wire::RELAY_PREFIX;
    Router::new()
        .route(&format!("{prefix}/sync"), post(relay_api::sync))
        .route(
            &format!("{prefix}/commands/{{command_id}}/start"),
            post(relay_api::start),
        )
        .route(
            &format!("{prefix}/commands/{{command_id}}/control"),
            post(relay_api::control),
        )
        .route(
            &format!("{prefix}/commands/{{command_id}}/complete"),
            post(relay_api::complete),
        )
        .route(
            &format!("{prefix}/commands/{{command_id}}/decline"),
            post(relay_api::decline),
        )
        .route(
            &format!("{prefix}/commands/{{command_id}}/progress"),
            post(relay_api::progress),
        )
        .route(relay_wire::OPENAPI_PATH, get(relay_api::openapi))
}

/// The resource metadata route: at the path-suffixed location only, where
/// its `resource` (`…/mcp`) is the URL a client derives the location from
/// (RFC 9728 §3.3).
fn metadata_route_set() -> Router<HttpState> {
    Router::new().route(&format!("{PRM_PATH}{MCP_PATH}"), get(resource_metadata))
}

/// The layers every route passes: Host/Origin, body limit, timeout.
pub(crate) fn edge_layers(routes: Router<HttpState>, state: HttpState) -> Router {
    let limit = state.config().max_body_bytes;
    let timeout = state.config().request_timeout;
    routes
        .layer(gate::HostAndOriginLayer(state.clone()))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .with_state(state)
}

/// RFC 9728 protected resource metadata for `/mcp`. Its URLs come from
/// the configuration, never from the request.
async fn resource_metadata(
    axum::extract::State(state): axum::extract::State<HttpState>,
) -> Response {
    let base = state.base_url();
    let mut scopes: Vec<&str> = state
        .mcp()
        .catalog()
        .tools()
        .iter()
        .flat_map(|t| t.scopes.iter().map(String::as_str))
        .collect();
    scopes.sort_unstable();
    scopes.dedup();
    let servers = if state.config().authorization_servers.is_empty() {
        vec![base.clone()]
    } else {
        state.config().authorization_servers.clone()
    };
    axum::Json(json!({
        "resource": format!("{base}{MCP_PATH}"),
        "authorization_servers": servers,
        "scopes_supported": scopes,
        "bearer_methods_supported": ["header"],
        "resource_name": state.mcp().info().name,
    }))
    .into_response()
}
