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
//! its extensions, for the handler.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::{HttpState, Principal};

/// Who a request's bearer token belongs to, as established before its body
/// was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The agent or device.
    pub principal: Principal,
    /// SHA-256 of the token (what revocation is checked against); `None`
    /// for an anonymous caller.
    pub token_sha256: Option<String>,
}

/// Marks `response` so that the connection is closed after it.
fn closing(mut response: Response) -> Response {
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

/// An agent's token, for `/mcp`.
pub(crate) async fn agent(
    State(state): State<HttpState>,
    mut request: Request,
    next: Next,
) -> Response {
    let who = match state.authenticate_request(request.headers()).await {
        Ok(who) => who,
        Err(response) => return closing(response),
    };
    if let Principal::Device(_) = who.principal {
        let value = format!(
            "Bearer resource_metadata=\"{}\", error=\"invalid_token\", error_description=\"a device token cannot be used on /mcp\"",
            state.metadata_url()
        );
        let mut response = (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_token", "error_description": "this is a device (relay) token; /mcp needs an agent token"})),
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        return closing(response);
    }
    state.watch_revocations();
    request.extensions_mut().insert(who);
    next.run(request).await
}
