//! # graph-relay-transport-http
//!
//! MCP over Streamable HTTP for graph-relay, with the OAuth2
//! resource-server checks in front of it. [`router`] builds an
//! [`axum::Router`] that integrators mount in their own app or serve alone.
//!
//! ```text
//!  POST /mcp ─► Host/Origin ─► bearer token (Authenticator) ─► headers & session
//!            ─► scope of the tool (403 insufficient_scope) ─► core::mcp::McpServer ─► JSON
//! ```
//!
//! - `POST /mcp`: one JSON-RPC message; a request is answered with
//!   `application/json`, a notification or response with 202.
//! - `GET /mcp`: 405 (no SSE stream is offered). `DELETE /mcp` ends an
//!   initialize-era session.
//! - Initialize-era clients get an `MCP-Session-Id` with their `initialize`
//!   result and must send it (and, after 2025-03-26, `MCP-Protocol-Version`)
//!   afterwards: missing 400, unknown 404. 2026-07-28 requests are stateless
//!   and must carry `MCP-Protocol-Version`, `Mcp-Method` and (for
//!   `tools/call`) `Mcp-Name` matching the body (400, `-32020` otherwise).
//! - `GET /.well-known/oauth-protected-resource[/mcp]`: RFC 9728 metadata.
//! - Every `/mcp` request needs `Authorization: Bearer <agent token>`: 401
//!   with `WWW-Authenticate: Bearer resource_metadata="…"` otherwise; a
//!   device token is refused there. A `tools/call` whose tool needs a scope
//!   the token lacks gets 403 `insufficient_scope` naming it, before any
//!   queue work.
//! - Hosts and origins are checked (DNS rebinding): by default only
//!   loopback names; 403 otherwise. Bodies are bounded (413) and requests
//!   time out (408).
//!
//! The state ([`HttpState`]) carries the MCP server, the authenticator and
//! the configuration; the relay API shares it:
//!
//! - `POST /external-assistants/graph-relays/sync`, `…/commands/{id}/start`,
//!   `…/control`, `…/complete`, `…/decline`, `…/progress` with a *device* token, and
//!   `GET …/openapi.json` describing every body ([`relay_wire`],
//!   [`relay_api`]). Long-poll syncs and controls are held up to
//!   [`RelayApiConfig::hold`].
//! - [`relay_client`] is the other end: the desktop relay's HTTP client and
//!   the driver that runs `core::relay` over it.

pub mod auth;
mod listen;
mod mcp_endpoint;
pub mod relay_api;
pub mod relay_client;
pub mod relay_wire;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use graph_relay_core::mcp::McpServer;
use serde_json::json;

pub use crate::auth::{AuthError, Authenticator, Principal};
pub use crate::relay_api::RelayApiConfig;
pub use crate::sessions::SessionLimits;
use crate::sessions::Sessions;

/// Path of the MCP endpoint.
pub const MCP_PATH: &str = "/mcp";
/// Path of the protected resource metadata (RFC 9728).
pub const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// Settings of the HTTP transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Public base URL, e.g. `https://relay.example.com` (no trailing slash).
    /// `None`: derived from each request's `Host` as `http://<host>`.
    pub public_url: Option<String>,
    /// Authorization servers announced in the resource metadata.
    pub authorization_servers: Vec<String>,
    /// Host names (without port) accepted in `Host`; `"*"` accepts any.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) accepted in `Origin`; `"*"` accepts any.
    /// Loopback origins (`http(s)://localhost|127.0.0.1|[::1]`, any port) are
    /// always accepted when the host is allowed.
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Whole-request timeout (408 beyond).
    pub request_timeout: Duration,
    /// Bounds on initialize-era sessions.
    pub sessions: SessionLimits,
    /// The relay API (hold bound of long-poll requests).
    pub relay: RelayApiConfig,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            public_url: None,
            authorization_servers: Vec::new(),
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            allowed_origins: Vec::new(),
            max_body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            sessions: SessionLimits::default(),
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
    sessions: Sessions,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl HttpState {
    /// State for an MCP server behind `auth`, configured by `config`.
    pub fn new(mcp: McpServer, auth: Arc<dyn Authenticator>, config: HttpConfig) -> Self {
        let sessions = Sessions::new(config.sessions.clone());
        Self {
            inner: Arc::new(StateInner {
                mcp,
                auth,
                config,
                sessions,
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

    /// Number of live initialize-era sessions.
    pub fn session_count(&self) -> usize {
        self.inner.sessions.len()
    }

    /// The public base URL for a request with `headers`.
    pub fn base_url(&self, headers: &HeaderMap) -> String {
        match &self.inner.config.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let host = headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("localhost");
                format!("http://{host}")
            }
        }
    }

    /// The URL of the resource metadata, as put in `WWW-Authenticate`.
    pub fn metadata_url(&self, headers: &HeaderMap) -> String {
        format!("{}{PRM_PATH}{MCP_PATH}", self.base_url(headers))
    }

    /// Checks `Host` and `Origin` (DNS-rebinding protection). Route groups
    /// call it first; `Err` is the 403 to return.
    #[allow(clippy::result_large_err)]
    pub fn check_host_and_origin(&self, headers: &HeaderMap) -> Result<(), Response> {
        let config = &self.inner.config;
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(host_name);
        let host_ok = config.allowed_hosts.iter().any(|h| h == "*")
            || host.is_some_and(|h| {
                config
                    .allowed_hosts
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(h))
            });
        if !host_ok {
            return Err(forbidden(
                "forbidden_host",
                "the Host header names a host this server does not serve",
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            let allowed = config
                .allowed_origins
                .iter()
                .any(|o| o == "*" || o == origin)
                || is_loopback_origin(origin);
            if !allowed {
                return Err(forbidden(
                    "forbidden_origin",
                    "the Origin of this request is not allowed",
                ));
            }
        }
        Ok(())
    }

    /// Authenticates the bearer token of a request. `Err` is the 401 (or
    /// 503) to return, with the `WWW-Authenticate` challenge.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, Response> {
        let challenge = |error: Option<(&str, &str)>| {
            let mut value = format!(
                "Bearer resource_metadata=\"{}\"",
                self.metadata_url(headers)
            );
            let body = match error {
                Some((code, description)) => {
                    value.push_str(&format!(
                        ", error=\"{code}\", error_description=\"{description}\""
                    ));
                    json!({"error": code, "error_description": description})
                }
                None => {
                    json!({"error": "unauthorized", "error_description": "this endpoint needs an OAuth2 bearer token (Authorization: Bearer <token>)"})
                }
            };
            let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
            if let Ok(v) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            response
        };
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return match self.inner.auth.anonymous().await {
                Some(principal) => Ok(principal),
                None => Err(challenge(None)),
            };
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()));
        let Some(token) = token else {
            return Err(challenge(Some((
                "invalid_request",
                "the Authorization header must be `Bearer <token>`",
            ))));
        };
        match self.inner.auth.authenticate(token).await {
            Ok(principal) => Ok(principal),
            Err(AuthError::InvalidToken) => Err(challenge(Some((
                "invalid_token",
                "the token is unknown, revoked or malformed",
            )))),
            Err(AuthError::Unavailable(reason)) => {
                tracing::error!(%reason, "authenticator unavailable");
                Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(json!({"error": "temporarily_unavailable"})),
                )
                    .into_response())
            }
        }
    }
}

/// `host[:port]` → `host` (IPv6 literals keep their brackets).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn is_loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    matches!(host_name(rest), "localhost" | "127.0.0.1" | "[::1]") && !rest.contains('/')
}

fn forbidden(code: &str, description: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": code, "error_description": description})),
    )
        .into_response()
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
/// limit and timeout.
pub fn router(state: HttpState) -> Router {
    use axum::routing::post;
    let limit = state.config().max_body_bytes;
    let timeout = state.config().request_timeout;
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
        .route(
            MCP_PATH,
            axum::routing::post(mcp_endpoint::post)
                .get(mcp_endpoint::get)
                .delete(mcp_endpoint::delete),
        )
        .route(PRM_PATH, get(resource_metadata))
        .route(&format!("{PRM_PATH}{MCP_PATH}"), get(resource_metadata))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .with_state(state)
}

/// RFC 9728 protected resource metadata for `/mcp`.
async fn resource_metadata(
    axum::extract::State(state): axum::extract::State<HttpState>,
    headers: HeaderMap,
) -> Response {
    if let Err(response) = state.check_host_and_origin(&headers) {
        return response;
    }
    let base = state.base_url(&headers);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_loopback_origins() {
        assert_eq!(host_name("127.0.0.1:8787"), "127.0.0.1");
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("example.com"), "example.com");
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("https://[::1]"));
        assert!(!is_loopback_origin("http://evil.example.com"));
        assert!(!is_loopback_origin("http://localhost.evil.com"));
        assert!(!is_loopback_origin("null"));
    }
}
