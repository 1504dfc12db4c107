//! The `/mcp` handlers.

use std::panic::AssertUnwindSafe;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use graph_relay_core::authz::ScopeDenied;
use graph_relay_core::mcp::{
    Caller, ErrorCode, Incoming, McpSession, McpSessionCreateError, McpSessionOwner, Notifier,
    Outgoing,
};
use serde_json::json;

use crate::mcp_headers::{self, McpHeaderError, McpRoute};
use crate::mcp_reply::{into_json_reply, json_reply};
use crate::{Authenticated, HttpState, gate};

/// Who may use the sessions `who` creates: the agent (owner, name) and its token.
fn session_owner(who: &Authenticated, caller: &Caller) -> McpSessionOwner {
    McpSessionOwner {
        caller: caller.clone(),
        token_sha256: who.token_sha256.clone(),
    }
}

/// A new, unguessable `MCP-Session-Id`: 256 random bits as hex.
fn new_session_id() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The answer to a request whose session store failed: the same retryable
/// 503 (with `Retry-After`) as a failure of the queue's store; the client
/// may retry, its session is not lost.
fn session_store_failed(id: Option<serde_json::Value>, error: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %error, "the MCP session store failed");
    json_reply(&Outgoing::store_unavailable(id))
}

/// Writes a session's state back after a request; a failure is logged (the
/// session keeps its previous state, which differs only before
/// `notifications/initialized`).
async fn put_session(state: &HttpState, id: &str, owner: &McpSessionOwner, session: McpSession) {
    if let Err(e) = state.inner.mcp_sessions.put(id, owner, &session).await {
        tracing::warn!(error = %e, "cannot write an MCP session's state");
    }
}

/// True when handling a request changed the session (only `initialize`
/// and `notifications/initialized` do): an unchanged one is not written
/// back, so a shared store pays no write for most requests.
fn changed_by(before: &McpSession, after: &McpSession) -> bool {
    before != after
}

/// The one `insufficient_scope` answer of HTTP: 403 with a `WWW-Authenticate`
/// challenge naming the scope the authorization table requires.
fn insufficient_scope(state: &HttpState, denied: &ScopeDenied) -> Response {
    let ScopeDenied { subject, scope } = denied;
    let description = format!("{subject} requires the scope {scope}");
    let value = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\", error_description=\"{description}\"",
        state.metadata_url()
    );
    let mut response = (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": "insufficient_scope", "scope": scope, "error_description": description})),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// 401 for a held request whose token was revoked while it waited.
fn revoked_while_held(state: &HttpState) -> Response {
    state.unauthorized(
        Some("invalid_token"),
        Some("the token was revoked"),
        "the token was revoked while this request was held",
    )
}

/// The token behind a held request was revoked; the request was abandoned.
struct Revoked;

/// Runs the core inside this request's task, catching a panic (which is
/// answered -32603 instead of taking the connection down). Handling is
/// async end to end: a `wait_seconds` call parks on the queue's signals
/// and the tokio timer, holding no thread. If the caller's token is
/// revoked meanwhile, the work is abandoned (dropped).
///
/// No task of its own: spawning one per request cost a task allocation,
/// a copy of the whole handling future into it, and a cross-thread wake-up
/// of this one when it ended.
async fn run_core(
    state: &HttpState,
    who: &Authenticated,
    caller: Caller,
    mut session: McpSession,
    incoming: Incoming,
) -> Result<(McpSession, Option<Outgoing>), Revoked> {
    let id = incoming.id().cloned();
    let joined = {
        let work = AssertUnwindSafe(state.mcp().handle_incoming(&mut session, &caller, incoming))
            .catch_unwind();
        let mut work = std::pin::pin!(work);
        // Most requests are answered on their first poll: they cannot have
        // been revoked meanwhile (the token was checked just before), so they
        // need no watch on revocations, which costs a subscription and a
        // waiter in the authenticator's shared notification.
        match futures::poll!(work.as_mut()) {
            std::task::Poll::Ready(joined) => joined,
            std::task::Poll::Pending => tokio::select! {
                joined = work => joined,
                () = state.revoked(who) => return Err(Revoked),
            },
        }
    };
    Ok(match joined {
        Ok(reply) => (session, reply),
        Err(_) => {
            tracing::error!("MCP handling panicked");
            (
                McpSession::new(),
                Some(Outgoing::error(
                    id,
                    ErrorCode::InternalError,
                    "Internal error".into(),
                    None,
                )),
            )
        }
    })
}

/// Most notifications one streamed reply keeps queued for a slow reader;
/// beyond, progress notifications are dropped (only the latest matters)
/// and the result still comes last.
const MAX_QUEUED_NOTIFICATIONS: usize = 64;

/// Sends notifications into a streamed reply.
struct StreamNotifier(tokio::sync::mpsc::Sender<Event>);

impl Notifier for StreamNotifier {
    fn notify(&self, notification: serde_json::Value) {
        // A full queue drops this notification; a later one says more.
        let _ = self.0.try_send(crate::mcp_reply::event(&notification));
    }
}

/// Answers a request that may send notifications before its result (a
/// waiting `get_graph_run` with a progress token) with an SSE response:
/// each notification is an event as it happens, the JSON-RPC result is the
/// last event, then the stream ends. `done` gets the session back once the
/// request is handled. A client that goes away abandons the work; a token
/// revoked meanwhile ends the stream without a result.
fn stream_core(
    state: &HttpState,
    who: Authenticated,
    caller: Caller,
    session: McpSession,
    incoming: Incoming,
    done: impl FnOnce(McpSession) + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(MAX_QUEUED_NOTIFICATIONS);
    let server = state.mcp().clone();
    let watcher = state.clone();
    let id = incoming.id().cloned();
    tokio::spawn(async move {
        let notifier = StreamNotifier(tx.clone());
        let mut work = tokio::spawn(async move {
            let mut session = session;
            let reply = server
                .handle_notifying(&mut session, &caller, incoming, &notifier)
                .await;
            (session, reply)
        });
        let joined = tokio::select! {
            joined = &mut work => joined,
            () = watcher.revoked(&who) => {
                work.abort();
                return;
            }
            () = tx.closed() => {
                work.abort();
                return;
            }
        };
        let reply = match joined {
            Ok((session, reply)) => {
                done(session);
                reply
            }
            Err(e) => {
                tracing::error!(error = %e, "MCP handling panicked");
                Some(Outgoing::error(
                    id,
                    ErrorCode::InternalError,
                    "Internal error".into(),
                    None,
                ))
            }
        };
        if let Some(reply) = reply {
            let _ = tx.send(crate::mcp_reply::event(reply.message())).await;
        }
    });
    crate::mcp_reply::sse_response(rx)
}

/// `/mcp`, every method: the only edge of this path. The checks the
/// layers of [`crate::router`] make for every other route are made here,
/// in the same order, with the same functions, and without the layers'
/// plumbing (the layers cost about a tenth of a request):
///
/// 1. the request timeout (408, empty, as `tower_http`'s `TimeoutLayer`
///    answers);
/// 2. the Host/Origin check (403);
/// 3. `GET` (and `HEAD`): 405, no stream is offered;
/// 4. the agent's credentials, before the body is read (401/503; a device
///    token is 401);
/// 5. `POST`: the body limit (413 as a JSON-RPC error), then
///    [`post_message`]; `DELETE`: [`delete`]; any other method: 405 naming
///    the methods served.
pub(crate) async fn serve(state: HttpState, request: Request) -> Response {
    let timeout = state.config().request_timeout;
    match tokio::time::timeout(timeout, checked(state, request)).await {
        Ok(response) => response,
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

async fn checked(state: HttpState, request: Request) -> Response {
    if let Err(refused) = state.check_host_and_origin(request.headers()) {
        return gate::closing(refused);
    }
    let method = request.method().clone();
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        return no_stream(&method);
    }
    let (who, caller) = match gate::agent_of(&state, request.headers()).await {
        Ok(agent) => agent,
        Err(refused) => return refused,
    };
    if method == axum::http::Method::DELETE {
        return delete(&state, &who, &caller, request.headers()).await;
    }
    if method != axum::http::Method::POST {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(
                header::ALLOW,
                HeaderValue::from_static("GET,HEAD,POST,DELETE"),
            )],
        )
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let limit = state.config().max_body_bytes;
    let body =
        match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit)).await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyRefusal::TooLarge),
            // The words axum's `Bytes` extractor answers with.
            Err(e) => Err(BodyRefusal::Unreadable(format!(
                "Failed to buffer the request body: {e}"
            ))),
        };
    post_message(state, who, caller, &parts.headers, body).await
}

/// Why a request's body was not read.
enum BodyRefusal {
    /// Longer than [`crate::HttpConfig::max_body_bytes`].
    TooLarge,
    /// The connection failed while it was read (the text to answer).
    Unreadable(String),
}

/// The rest of [`post`], once the caller is known.
async fn post_message(
    state: HttpState,
    who: Authenticated,
    caller: Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BodyRefusal>,
) -> Response {
    // A body the server would not read is a JSON-RPC error too, not
    // axum's plain text.
    let body = match body {
        Ok(body) => body,
        Err(BodyRefusal::TooLarge) => {
            let limit = state.config().max_body_bytes;
            return McpHeaderError::BodyTooLarge { limit }.into_response();
        }
        Err(BodyRefusal::Unreadable(text)) => {
            return McpHeaderError::BodyUnreadable(text).into_response();
        }
    };
    if let Err(refused) = mcp_headers::check_media_types(headers) {
        return refused.into_response();
    }
    let incoming = match Incoming::parse(&body) {
        Ok(incoming) => incoming,
        Err(reply) => return into_json_reply(*reply),
    };
    // The authorization table, before any work.
    if let Err(denied) = state.mcp().authorize(&incoming, &caller) {
        return insufficient_scope(&state, &denied);
    }
    let owner = session_owner(&who, &caller);
    let route = match mcp_headers::route(headers, &incoming) {
        Ok(route) => route,
        Err(refused) => return refused.into_response(),
    };
    match route {
        McpRoute::Initialize => initialize(&state, who, caller, &owner, incoming).await,
        McpRoute::Session(session_id) => {
            in_session(&state, who, caller, owner, session_id, headers, incoming).await
        }
        // Notifications and responses outside a session: accepted, nothing to do.
        McpRoute::NoReply => StatusCode::ACCEPTED.into_response(),
        // A self-contained 2026-07-28 request.
        McpRoute::Stateless => {
            if incoming.method() == Some("subscriptions/listen") {
                return crate::listen::serve(&state, who, caller, incoming).await;
            }
            if state.mcp().may_notify(&incoming) && mcp_headers::accepts_sse(headers) {
                return stream_core(&state, who, caller, McpSession::new(), incoming, drop);
            }
            sessionless(&state, &who, caller, incoming).await
        }
        // An initialize-era ping without its session.
        McpRoute::SessionlessPing => sessionless(&state, &who, caller, incoming).await,
    }
}

/// A request handled outside any initialize-era session, answered as JSON.
async fn sessionless(
    state: &HttpState,
    who: &Authenticated,
    caller: Caller,
    incoming: Incoming,
) -> Response {
    match run_core(state, who, caller, McpSession::new(), incoming).await {
        Ok((_, Some(reply))) => into_json_reply(reply),
        Ok((_, None)) => StatusCode::ACCEPTED.into_response(),
        Err(Revoked) => revoked_while_held(state),
    }
}

/// `initialize`: a new initialize-era session, kept in the session store
/// when the handshake succeeded, its id in `MCP-Session-Id`.
async fn initialize(
    state: &HttpState,
    who: Authenticated,
    caller: Caller,
    owner: &McpSessionOwner,
    incoming: Incoming,
) -> Response {
    let Ok((session, reply)) = run_core(state, &who, caller, McpSession::new(), incoming).await
    else {
        return revoked_while_held(state);
    };
    let Some(reply) = reply else {
        return StatusCode::ACCEPTED.into_response();
    };
    if session.negotiated_version().is_none() || reply.error_code().is_some() {
        return json_reply(&reply);
    }
    let id = new_session_id();
    let now = state.mcp().queue().now();
    let created = state
        .inner
        .mcp_sessions
        .create(&id, owner, &session, &state.config().mcp_sessions, now)
        .await;
    match created {
        Ok(()) => {
            let mut response = json_reply(&reply);
            if let Some((name, value)) = mcp_headers::session_id_value(&id) {
                response.headers_mut().insert(name, value);
            }
            response
        }
        Err(McpSessionCreateError::Full(full)) => {
            let refusal = Outgoing::error(
                reply.message().get("id").cloned(),
                ErrorCode::LimitExceeded,
                format!("Service unavailable: {full}"),
                Some(json!({"limit": full.limit, "name": "max_sessions"})),
            )
            .with_status(503);
            let mut response = json_reply(&refusal);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            response
        }
        Err(e) => session_store_failed(reply.message().get("id").cloned(), &e),
    }
}

/// A request inside the initialize-era session `session_id`: read from
/// the store, handled, and written back when it changed.
async fn in_session(
    state: &HttpState,
    who: Authenticated,
    caller: Caller,
    owner: McpSessionOwner,
    session_id: &str,
    headers: &HeaderMap,
    incoming: Incoming,
) -> Response {
    let now = state.mcp().queue().now();
    let found = state
        .inner
        .mcp_sessions
        .get(session_id, &owner, &state.config().mcp_sessions, now)
        .await;
    let session = match found {
        Ok(Some(s)) => s,
        Ok(None) => {
            return McpHeaderError::SessionNotFound {
                id: incoming.id().cloned(),
            }
            .into_response();
        }
        Err(e) => {
            return session_store_failed(incoming.id().cloned(), &e);
        }
    };
    if let Err(refused) =
        mcp_headers::check_session_version(headers, &incoming, session.negotiated_version())
    {
        return refused.into_response();
    }
    if state.mcp().may_notify(&incoming) && mcp_headers::accepts_sse(headers) {
        let sessions = state.clone();
        let session_id = session_id.to_owned();
        let before = session.clone();
        return stream_core(state, who, caller, session, incoming, move |session| {
            if changed_by(&before, &session) {
                tokio::spawn(async move {
                    put_session(&sessions, &session_id, &owner, session).await;
                });
            }
        });
    }
    let before = session.clone();
    let Ok((session, reply)) = run_core(state, &who, caller, session, incoming).await else {
        return revoked_while_held(state);
    };
    if changed_by(&before, &session) {
        put_session(state, session_id, &owner, session).await;
    }
    match reply {
        Some(reply) => into_json_reply(reply),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// `GET /mcp`: no server-sent event stream is offered (`HEAD` gets the
/// same head without the body).
fn no_stream(method: &axum::http::Method) -> Response {
    let mut response = (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static("POST, DELETE"))],
        axum::Json(json!({"error": "method_not_allowed", "error_description": "this server does not offer an SSE stream; POST JSON-RPC messages to /mcp"})),
    )
        .into_response();
    if method == axum::http::Method::HEAD {
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

/// `DELETE /mcp`: ends an initialize-era session.
async fn delete(
    state: &HttpState,
    who: &Authenticated,
    caller: &Caller,
    headers: &HeaderMap,
) -> Response {
    match mcp_headers::session_id(headers) {
        None => McpHeaderError::DeleteWithoutSession.into_response(),
        Some(id) => {
            let owner = session_owner(who, caller);
            match state.inner.mcp_sessions.delete(id, &owner).await {
                Ok(true) => StatusCode::NO_CONTENT.into_response(),
                Ok(false) => McpHeaderError::DeleteUnknownSession.into_response(),
                Err(e) => session_store_failed(None, &e),
            }
        }
    }
}

/// The `/mcp` endpoint as one service: [`serve`], for every method.
#[derive(Clone)]
pub(crate) struct Endpoint {
    state: HttpState,
}

impl Endpoint {
    /// `/mcp` served by an [`Endpoint`], next to the routes of `routes`.
    pub(crate) fn mount(routes: axum::Router, state: HttpState) -> axum::Router {
        routes.route_service(crate::MCP_PATH, Self { state })
    }
}

impl tower::Service<Request> for Endpoint {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move { Ok(serve(state, request).await) })
    }
}
