//! What a request passes before its handler runs, decided from the headers
//! alone: no byte of the body has been read yet.
//!
//! 1. [`HostAndOriginLayer`] (every route): `Host` and `Origin` (403).
//! 2. The bearer token (401 with the `WWW-Authenticate` challenge): the
//!    relay API's handlers take [`DevicePrincipal`] as their first
//!    extractor after the state, so it runs before the path or the body is
//!    read (an agent's token gets 403 there); `POST`/`DELETE /mcp` check it
//!    with [`agent_of`] (a device token is refused the same way as a bad
//!    one).
//!
//! A refusal carries `Connection: close`: the server answers at once and
//! drops the connection instead of reading (or waiting for) a body it will
//! never use. An accepted request carries its [`Authenticated`] caller in
//! its extensions, for the handler, which takes it with the
//! [`AgentPrincipal`] or [`DevicePrincipal`] extractor.
//!
//! Both are plain checks on the way in, with no boxed future of their own:
//! every relay request passes them, and a held desktop's re-sync is most of
//! what a quiet server does.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::extract::{FromRef, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::Either;
use graph_relay_core::mcp::Caller;
use graph_relay_core::principal::Device;
use tower::{Layer, Service};

use crate::relay_wire::ErrorReply;

use crate::{Authenticated, HttpState, Principal};

/// Marks `response` so that the connection is closed after it.
pub(crate) fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The Host/Origin check of every route, as a layer: a request whose
/// `Host` or `Origin` this server does not answer gets 403 (with
/// `Connection: close`) before the inner service sees it.
#[derive(Clone)]
pub(crate) struct HostAndOriginLayer(pub(crate) HttpState);

impl<S> Layer<S> for HostAndOriginLayer {
    type Service = HostAndOrigin<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HostAndOrigin {
            state: self.0.clone(),
            inner,
        }
    }
}

/// The service of [`HostAndOriginLayer`].
#[derive(Clone)]
pub(crate) struct HostAndOrigin<S> {
    state: HttpState,
    inner: S,
}

impl<S> Service<Request> for HostAndOrigin<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.state.check_host_and_origin(request.headers()) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(refused) => Either::Left(ready(Ok(closing(refused)))),
        }
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
