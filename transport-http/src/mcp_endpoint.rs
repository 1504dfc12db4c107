//! The `/mcp` handlers.

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use graph_relay_core::mcp::{
    Caller, ErrorCode, Incoming, McpSession, Notifier, Outgoing, ProtocolVersion, ScopeDenied,
};
use serde_json::json;

use crate::auth::Principal;
use crate::sessions::{Lookup, SessionOwner};
use crate::{Authenticated, HttpState};

/// `MCP-Session-Id`.
pub(crate) static SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`.
static PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method` (2026-07-28).
static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name` (2026-07-28).
static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

pub(crate) fn json_reply(reply: &Outgoing) -> Response {
    let status = StatusCode::from_u16(reply.http_status()).unwrap_or(StatusCode::OK);
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        reply.to_bytes(),
    )
        .into_response()
}

fn plain_error(
    status: StatusCode,
    id: Option<serde_json::Value>,
    code: ErrorCode,
    message: String,
) -> Response {
    json_reply(&Outgoing::error(id, code, message, None).with_status(status.as_u16()))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The agent the gate authenticated (it refuses device tokens on `/mcp`).
#[allow(clippy::result_large_err)]
fn agent(who: &Authenticated) -> Result<Caller, Response> {
    match &who.principal {
        Principal::Agent(caller) => Ok(caller.clone()),
        Principal::Device(_) => Err(StatusCode::UNAUTHORIZED.into_response()),
    }
}

/// Who may use the sessions `who` creates: the agent (owner, name) and its token.
fn session_owner(who: &Authenticated, caller: &Caller) -> SessionOwner {
    SessionOwner {
        agent: (caller.agent.owner.clone(), caller.agent.id.clone()),
        token_sha256: who.token_sha256.clone(),
    }
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
    let value = format!(
        "Bearer resource_metadata=\"{}\", error=\"invalid_token\", error_description=\"the token was revoked\"",
        state.metadata_url()
    );
    let mut response = (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": "invalid_token", "error_description": "the token was revoked while this request was held"})),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// Decodes an `Mcp-Name` value: plain, or `=?base64?<b64>?=` for non-ASCII.
fn decode_name(value: &str) -> Option<String> {
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(b64) => String::from_utf8(base64_decode(b64)?).ok(),
        None => Some(value.to_owned()),
    }
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for b in text.bytes().filter(|&b| b != b'=') {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The 2026-07-28 header rules: version, method and name must match the body.
#[allow(clippy::result_large_err)]
fn check_modern_headers(headers: &HeaderMap, incoming: &Incoming) -> Result<(), Response> {
    let id = incoming.id().cloned();
    let mismatch = |what: String| {
        Err(plain_error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            ErrorCode::HeaderMismatch,
            format!("Header mismatch: {what}"),
        ))
    };
    let body_version = incoming.meta_protocol_version().unwrap_or_default();
    match header_str(headers, &PROTOCOL_VERSION) {
        None => return mismatch("MCP-Protocol-Version is required".into()),
        Some(v) if v != body_version => {
            return mismatch(format!(
                "MCP-Protocol-Version is `{v}` but _meta says `{body_version}`"
            ));
        }
        Some(_) => {}
    }
    let method = incoming.method().unwrap_or_default();
    match header_str(headers, &MCP_METHOD) {
        None => return mismatch("Mcp-Method is required".into()),
        Some(m) if m != method => {
            return mismatch(format!(
                "Mcp-Method is `{m}` but the body's method is `{method}`"
            ));
        }
        Some(_) => {}
    }
    if let Some(name) = incoming.name_param() {
        match header_str(headers, &MCP_NAME).map(decode_name) {
            None => return mismatch(format!("Mcp-Name is required for {method}")),
            Some(Some(h)) if h == name => {}
            Some(_) => return mismatch(format!("Mcp-Name does not match `{name}`")),
        }
    }
    Ok(())
}

/// The token behind a held request was revoked; the request was abandoned.
struct Revoked;

/// Runs the core on its own task (a panic answers -32603 instead of taking
/// the connection down). Handling is async end to end: a `wait_seconds`
/// call parks on the queue's signals and the tokio timer, holding no thread.
/// If the caller's token is revoked meanwhile, the work is abandoned.
async fn run_core(
    state: &HttpState,
    who: &Authenticated,
    caller: Caller,
    mut session: McpSession,
    incoming: Incoming,
) -> Result<(McpSession, Option<Outgoing>), Revoked> {
    let server = state.mcp().clone();
    let id = incoming.id().cloned();
    let mut task = tokio::spawn(async move {
        let reply = server
            .handle_incoming(&mut session, &caller, incoming)
            .await;
        (session, reply)
    });
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = state.revoked(who) => {
            task.abort();
            return Err(Revoked);
        }
    };
    Ok(match joined {
        Ok(done) => done,
        Err(e) => {
            tracing::error!(error = %e, "MCP handling panicked");
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
struct StreamNotifier(tokio::sync::mpsc::Sender<Bytes>);

impl Notifier for StreamNotifier {
    fn notify(&self, notification: serde_json::Value) {
        // A full queue drops this notification; a later one says more.
        let _ = self.0.try_send(crate::listen::event(&notification));
    }
}

/// True when the client accepts an SSE response.
fn accepts_sse(headers: &HeaderMap) -> bool {
    header_str(headers, &header::ACCEPT).is_some_and(|accept| {
        accept.split(',').any(|a| {
            let a = a.split(';').next().unwrap_or_default().trim();
            a.eq_ignore_ascii_case("text/event-stream") || a == "*/*"
        })
    })
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
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(MAX_QUEUED_NOTIFICATIONS);
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
            let _ = tx.send(crate::listen::event(reply.message())).await;
        }
    });
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|item| item.map(Ok::<_, std::convert::Infallible>))
    });
    let mut response = (StatusCode::OK, Body::from_stream(stream)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// `POST /mcp`. The gate authenticated the agent before the body was read.
pub(crate) async fn post(
    State(state): State<HttpState>,
    Extension(who): Extension<Authenticated>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = match agent(&who) {
        Ok(c) => c,
        Err(response) => return response,
    };
    let content_type = header_str(&headers, &header::CONTENT_TYPE).unwrap_or_default();
    if !content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    {
        return plain_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            ErrorCode::InvalidRequest,
            "Invalid request: the body must be `Content-Type: application/json`".into(),
        );
    }
    if let Some(accept) = header_str(&headers, &header::ACCEPT) {
        let ok = accept.split(',').any(|a| {
            let a = a.split(';').next().unwrap_or_default().trim();
            a.eq_ignore_ascii_case("application/json")
                || a == "*/*"
                || a.eq_ignore_ascii_case("application/*")
        });
        if !ok {
            return plain_error(
                StatusCode::NOT_ACCEPTABLE,
                None,
                ErrorCode::InvalidRequest,
                "Invalid request: this server answers with application/json; include it in Accept"
                    .into(),
            );
        }
    }
    let incoming = match Incoming::parse(&body) {
        Ok(incoming) => incoming,
        Err(reply) => return json_reply(&reply),
    };
    // The authorization table, before any work.
    if let Err(denied) = state.mcp().authorize(&incoming, &caller) {
        return insufficient_scope(&state, &denied);
    }
    let session_header = header_str(&headers, &SESSION_ID);
    let owner = session_owner(&who, &caller);

    // 1. A new initialize-era session.
    if incoming.is_initialize() {
        let principal = who.principal.clone();
        let Ok((session, reply)) =
            run_core(&state, &who, caller, McpSession::new(), incoming).await
        else {
            return revoked_while_held(&state);
        };
        let Some(reply) = reply else {
            return StatusCode::ACCEPTED.into_response();
        };
        if session.negotiated_version().is_none() || reply.error_code().is_some() {
            return json_reply(&reply);
        }
        return match state.inner.sessions.create(owner, principal, session) {
            Ok(id) => {
                let mut response = json_reply(&reply);
                if let Ok(v) = HeaderValue::from_str(&id) {
                    response.headers_mut().insert(SESSION_ID.clone(), v);
                }
                response
            }
            Err(full) => {
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
        };
    }

    // 2. Inside an initialize-era session.
    if let Some(session_id) = session_header {
        let session = match state.inner.sessions.get(session_id, &owner) {
            Lookup::Found(s) => s,
            Lookup::NotFound => {
                return plain_error(
                    StatusCode::NOT_FOUND,
                    incoming.id().cloned(),
                    ErrorCode::InvalidRequest,
                    "Session not found: it ended or expired; send initialize again without MCP-Session-Id".into(),
                );
            }
        };
        let negotiated = session.negotiated_version();
        if let Some(v) = header_str(&headers, &PROTOCOL_VERSION)
            && (ProtocolVersion::parse(v).is_none()
                || Some(v) != negotiated.map(ProtocolVersion::as_str))
        {
            return plain_error(
                StatusCode::BAD_REQUEST,
                incoming.id().cloned(),
                ErrorCode::InvalidRequest,
                format!(
                    "Bad Request: MCP-Protocol-Version `{v}` is not the version this session negotiated ({})",
                    negotiated.map_or("none", ProtocolVersion::as_str)
                ),
            );
        }
        if state.mcp().may_notify(&incoming) && accepts_sse(&headers) {
            let sessions = state.clone();
            let session_id = session_id.to_owned();
            return stream_core(&state, who, caller, session, incoming, move |session| {
                sessions.inner.sessions.put(&session_id, &owner, session);
            });
        }
        let Ok((session, reply)) = run_core(&state, &who, caller, session, incoming).await else {
            return revoked_while_held(&state);
        };
        state.inner.sessions.put(session_id, &owner, session);
        return match reply {
            Some(reply) => json_reply(&reply),
            None => StatusCode::ACCEPTED.into_response(),
        };
    }

    // 3. Notifications and responses outside a session: accepted, nothing to do.
    if !incoming.is_request() {
        return StatusCode::ACCEPTED.into_response();
    }

    // 4. A self-contained 2026-07-28 request.
    if incoming.meta_protocol_version().is_some() {
        if let Err(response) = check_modern_headers(&headers, &incoming) {
            return response;
        }
        if incoming.method() == Some("subscriptions/listen") {
            return crate::listen::serve(&state, who, caller, incoming).await;
        }
        if state.mcp().may_notify(&incoming) && accepts_sse(&headers) {
            return stream_core(&state, who, caller, McpSession::new(), incoming, drop);
        }
        return match run_core(&state, &who, caller, McpSession::new(), incoming).await {
            Ok((_, Some(reply))) => json_reply(&reply),
            Ok((_, None)) => StatusCode::ACCEPTED.into_response(),
            Err(Revoked) => revoked_while_held(&state),
        };
    }

    // 5. An initialize-era request without its session: ping is allowed, the rest is refused.
    if incoming.method() == Some("ping") {
        return match run_core(&state, &who, caller, McpSession::new(), incoming).await {
            Ok((_, Some(reply))) => json_reply(&reply),
            Ok((_, None)) => StatusCode::ACCEPTED.into_response(),
            Err(Revoked) => revoked_while_held(&state),
        };
    }
    plain_error(
        StatusCode::BAD_REQUEST,
        None,
        ErrorCode::InvalidRequest,
        "Bad Request: missing MCP-Session-Id; send initialize first, or use protocol 2026-07-28 with its per-request _meta fields".into(),
    )
}

/// `GET /mcp`: no server-sent event stream is offered.
pub(crate) async fn get() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static("POST, DELETE"))],
        axum::Json(json!({"error": "method_not_allowed", "error_description": "this server does not offer an SSE stream; POST JSON-RPC messages to /mcp"})),
    )
        .into_response()
}

/// `DELETE /mcp`: ends an initialize-era session.
pub(crate) async fn delete(
    State(state): State<HttpState>,
    Extension(who): Extension<Authenticated>,
    headers: HeaderMap,
) -> Response {
    let caller = match agent(&who) {
        Ok(c) => c,
        Err(response) => return response,
    };
    match header_str(&headers, &SESSION_ID) {
        None => plain_error(
            StatusCode::BAD_REQUEST,
            None,
            ErrorCode::InvalidRequest,
            "Bad Request: DELETE needs MCP-Session-Id".into(),
        ),
        Some(id)
            if state
                .inner
                .sessions
                .remove(id, &session_owner(&who, &caller)) =>
        {
            StatusCode::NO_CONTENT.into_response()
        }
        Some(_) => plain_error(
            StatusCode::NOT_FOUND,
            None,
            ErrorCode::InvalidRequest,
            "Session not found".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_name_decoding() {
        assert_eq!(
            decode_name("get_graph_run").as_deref(),
            Some("get_graph_run")
        );
        assert_eq!(decode_name("=?base64?w6l0w6k=?=").as_deref(), Some("été"));
        assert_eq!(decode_name("=?base64?***?="), None);
    }
}
