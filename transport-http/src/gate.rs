//! What a request passes before its handler runs, decided from the headers
//! alone: no byte of the body has been read yet.
//!
//! 1. [`host_and_origin`] (every route): `Host` and `Origin` (403).
//! 2. [`bearer`] (the relay API) and [`agent`] (`POST`/`DELETE /mcp`): the
//!    bearer token (401 with the `WWW-Authenticate` challenge; a device token
//!    on `/mcp` is refused the same way).
//!
//! A refusal carries `Connection: close`: the server answers at once and
//! drops the connection instead of reading (or waiting for) a body it will
//! never use. An accepted request carries its [`Authenticated`] caller in
//! its extensions, for the handler, which takes it with the
//! [`AgentPrincipal`] or [`DevicePrincipal`] extractor.

use axum::extract::{FromRef, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use graph_relay_core::mcp::Caller;
use graph_relay_core::principal::Device;

use crate::relay_wire::ErrorReply;

use crate::{Authenticated, HttpState, Principal};

/// Marks `response` so that the connection is closed after it.
pub(crate) fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Host and Origin, for every route.
pub(crate) async fn host_and_origin(
    State(state): State<HttpState>,
    request: Request,
    next: Next,
) -> Response {
    match state.check_host_and_origin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(response) => closing(response),
    }
}

/// Any valid token (the relay API checks that it is a device's).
pub(crate) async fn bearer(
    State(state): State<HttpState>,
    mut request: Request,
    next: Next,
) -> Response {
    match state.authenticate_request(request.headers()).await {
        Ok(who) => {
            state.watch_revocations();
            request.extensions_mut().insert(who);
            next.run(request).await
        }
        Err(response) => closing(response),
    }
}

/// The agent a `/mcp` request comes from, by its headers alone: the
/// credentials check of the `/mcp` endpoint. `Err` is the refusal to send (401/503, `Connection: close`; a
/// device's token is 401). Starts the revocation watch on success.
pub(crate) async fn agent_of(
    state: &HttpState,
    headers: &axum::http::HeaderMap,
) -> Result<(Authenticated, Caller), Response> {
    let who = state.authenticate_request(headers).await.map_err(closing)?;
    let caller = match &who.principal {
        Principal::Agent(caller) => caller.clone(),
        Principal::Device(_) => return Err(closing(device_on_mcp(state))),
    };
    state.watch_revocations();
    Ok((who, caller))
}

/// 401 for a device's credentials on `/mcp`.
fn device_on_mcp(state: &HttpState) -> Response {
    state.unauthorized(
        Some("invalid_token"),
        Some("a device token cannot be used on /mcp"),
        "this is a device (relay) token; /mcp needs an agent token",
    )
}

/// 403 for an agent's credentials on the relay API.
pub(crate) fn agent_on_relay_api() -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(ErrorReply {
            error: "device_token_required".into(),
            message: "the relay API needs a device token; agent tokens are for /mcp".into(),
            retryable: false,
        }),
    )
        .into_response()
}

/// The caller of a request: what a gate layer established, else
/// authenticated here from the headers.
async fn caller_of(parts: &mut Parts, state: &HttpState) -> Result<Authenticated, Response> {
    if let Some(who) = parts.extensions.get::<Authenticated>() {
        return Ok(who.clone());
    }
    let who = state
        .authenticate_request(&parts.headers)
        .await
        .map_err(closing)?;
    state.watch_revocations();
    parts.extensions.insert(who.clone());
    Ok(who)
}

/// The authenticated agent of a request, as an axum extractor: for an
/// integrator's own handlers next to (or instead of) [`mcp_routes`](crate::mcp_routes).
///
/// It takes the caller the routes' gate already authenticated (no second
/// look-up), or authenticates the request's headers with the state's
/// [`Authenticator`](crate::auth::Authenticator) itself. It rejects exactly as
/// `/mcp` does: 401 with the authenticator's challenge for missing or
/// refused credentials and for a device's, 503 when the authenticator
/// cannot decide. The state must give an [`HttpState`] ([`FromRef`]).
///
/// ```
/// use axum::routing::get;
/// use axum::{Json, Router};
/// use graph_relay_transport_http::{AgentPrincipal, HttpState};
///
/// async fn whoami(AgentPrincipal { caller, .. }: AgentPrincipal) -> Json<serde_json::Value> {
///     Json(serde_json::json!({
///         "owner": caller.agent.owner.as_str(),
///         "agent": caller.agent.id.as_str(),
///     }))
/// }
///
/// fn app(state: HttpState) -> Router {
///     Router::new().route("/whoami", get(whoami)).with_state(state)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPrincipal {
    /// The agent and its granted scopes.
    pub caller: Caller,
    /// SHA-256 of its credential; `None` for an anonymous caller.
    pub token_sha256: Option<String>,
}

impl AgentPrincipal {
    /// The caller as the transport keeps it (for [`HttpState::revoked`]).
    pub fn authenticated(&self) -> Authenticated {
        Authenticated {
            principal: Principal::Agent(self.caller.clone()),
            token_sha256: self.token_sha256.clone(),
        }
    }
}

impl<S> FromRequestParts<S> for AgentPrincipal
where
    HttpState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let state = HttpState::from_ref(state);
        let who = caller_of(parts, &state).await?;
        match who.principal {
            Principal::Agent(caller) => Ok(Self {
                caller,
                token_sha256: who.token_sha256,
            }),
            Principal::Device(_) => Err(closing(device_on_mcp(&state))),
        }
    }
}

/// The authenticated device (relay) of a request, as an axum extractor:
/// the relay API's caller.
///
/// Like [`AgentPrincipal`] it reuses what the routes' gate established or
/// authenticates the headers itself, and rejects as the relay API does:
/// 401 with the authenticator's challenge, 503 when the authenticator
/// cannot decide, and 403 `device_token_required` for an agent's
/// credentials.
///
/// ```
/// use axum::Router;
/// use axum::routing::post;
/// use graph_relay_transport_http::{DevicePrincipal, HttpState};
///
/// async fn heartbeat(DevicePrincipal { device, .. }: DevicePrincipal) -> String {
///     format!("hello {}", device.id.as_str())
/// }
///
/// fn app(state: HttpState) -> Router {
///     Router::new().route("/heartbeat", post(heartbeat)).with_state(state)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePrincipal {
    /// The device (its owner and id).
    pub device: Device,
    /// SHA-256 of its credential; `None` for an anonymous caller.
    pub token_sha256: Option<String>,
}

impl<S> FromRequestParts<S> for DevicePrincipal
where
    HttpState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let state = HttpState::from_ref(state);
        let who = caller_of(parts, &state).await?;
        match who.principal {
            Principal::Device(device) => Ok(Self {
                device,
                token_sha256: who.token_sha256,
            }),
            Principal::Agent(_) => Err(agent_on_relay_api()),
        }
    }
}
