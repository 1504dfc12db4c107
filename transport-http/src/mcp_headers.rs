//! The MCP Streamable HTTP header rules, for an integrator's own `/mcp`
//! handler.
//!
//! [`mcp_routes`](crate::mcp_routes) applies them already; a server that
//! writes its own `/mcp` endpoint around
//! [`McpServer`](graph_relay_core::mcp::McpServer) calls them in this order
//! to answer exactly as this crate does:
//!
//! 1. [`check_media_types`] on the headers (415 / 406), before parsing;
//! 2. [`Incoming::parse`] on the body, then the authorization table
//!    ([`McpServer::authorize`](graph_relay_core::mcp::McpServer::authorize));
//! 3. [`route`]: which of the five cases the message is, with the
//!    2026-07-28 header rules (`MCP-Protocol-Version`, `Mcp-Method`,
//!    `Mcp-Name` must match the body: 400 `-32020`) and the missing-session
//!    rule (400) applied;
//! 4. for [`McpRoute::Session`], the session look-up
//!    ([`McpHeaderError::SessionNotFound`], 404, when it finds nothing) and
//!    [`check_session_version`] (400).
//!
//! Every refusal is an [`McpHeaderError`], which renders (via
//! [`IntoResponse`]) as the JSON-RPC error with its HTTP status.
//!
//! ```
//! use axum::http::{HeaderMap, HeaderValue};
//! use graph_relay_core::mcp::Incoming;
//! use graph_relay_transport_http::mcp_headers::{self, McpRoute};
//!
//! let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list",
//!                 "params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
//! let mut headers = HeaderMap::new();
//! headers.insert("content-type", HeaderValue::from_static("application/json"));
//! mcp_headers::check_media_types(&headers).expect("JSON in, JSON out");
//! let incoming = Incoming::parse(body).expect("a JSON-RPC request");
//!
//! // A 2026-07-28 request must repeat its version and method in headers.
//! let refused = mcp_headers::route(&headers, &incoming).unwrap_err();
//! assert_eq!(refused.status(), 400);
//!
//! headers.insert("mcp-protocol-version", HeaderValue::from_static("2026-07-28"));
//! headers.insert("mcp-method", HeaderValue::from_static("tools/list"));
//! assert_eq!(mcp_headers::route(&headers, &incoming), Ok(McpRoute::Stateless));
//! ```

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use graph_relay_core::mcp::{ErrorCode, Incoming, Outgoing, ProtocolVersion};
use serde_json::Value;

/// `MCP-Session-Id`: the initialize-era session.
pub const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`.
pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method` (2026-07-28): the body's method.
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name` (2026-07-28): the body's tool (or prompt, resource) name.
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// What a `POST /mcp` message is, by its body and headers: how to handle it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpRoute<'h> {
    /// `initialize`: handle it in a fresh session and, when it succeeds,
    /// keep the session and send its id as `MCP-Session-Id` with the result.
    Initialize,
    /// A message inside the initialize-era session with this id: look it
    /// up (unknown → [`McpHeaderError::SessionNotFound`]), then
    /// [`check_session_version`].
    Session(&'h str),
    /// A notification or response outside any session: answer 202 with no
    /// body.
    NoReply,
    /// A self-contained 2026-07-28 request whose headers match its body:
    /// handle it in a fresh session.
    Stateless,
    /// A `ping` without a session: handle it in a fresh session.
    SessionlessPing,
}

/// A message refused by the header rules. Renders as the JSON-RPC error
/// with [`McpHeaderError::status`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpHeaderError {
    /// The body is not `Content-Type: application/json` (415).
    #[error("Invalid request: the body must be `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// `Accept` names neither `application/json` nor a wildcard (406).
    #[error("Invalid request: this server answers with application/json; include it in Accept")]
    NotAcceptable,
    /// A 2026-07-28 request whose `MCP-Protocol-Version`, `Mcp-Method` or
    /// `Mcp-Name` is missing or differs from its body (400, `-32020`).
    #[error("Header mismatch: {detail}")]
    HeaderMismatch {
        /// The request's JSON-RPC id.
        id: Option<Value>,
        /// Which header, and how.
        detail: String,
    },
    /// An initialize-era request without `MCP-Session-Id` (400).
    #[error(
        "Bad Request: missing MCP-Session-Id; send initialize first, or use protocol 2026-07-28 with its per-request _meta fields"
    )]
    MissingSession,
    /// `MCP-Session-Id` names no live session of this caller (404): the
    /// client must initialize again.
    #[error("Session not found: it ended or expired; send initialize again without MCP-Session-Id")]
    SessionNotFound {
        /// The request's JSON-RPC id.
        id: Option<Value>,
    },
    /// `MCP-Protocol-Version` is not the version the session negotiated (400).
    #[error(
        "Bad Request: MCP-Protocol-Version `{sent}` is not the version this session negotiated ({})",
        negotiated.map_or("none", ProtocolVersion::as_str)
    )]
    SessionVersion {
        /// The request's JSON-RPC id.
        id: Option<Value>,
        /// The header's value.
        sent: String,
        /// What the session negotiated.
        negotiated: Option<ProtocolVersion>,
    },
    /// `DELETE /mcp` without `MCP-Session-Id` (400).
    #[error("Bad Request: DELETE needs MCP-Session-Id")]
    DeleteWithoutSession,
    /// `DELETE /mcp` of a session this caller does not have (404).
    #[error("Session not found")]
    DeleteUnknownSession,
    /// The body is larger than the server reads (413).
    #[error("Invalid request: the body is larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body could not be read (400), e.g. the client stopped sending.
    #[error("Invalid request: the body could not be read: {0}")]
    BodyUnreadable(String),
}

impl McpHeaderError {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Self::HeaderMismatch { .. }
            | Self::MissingSession
            | Self::SessionVersion { .. }
            | Self::DeleteWithoutSession
            | Self::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::SessionNotFound { .. } | Self::DeleteUnknownSession => StatusCode::NOT_FOUND,
        }
    }

    /// The JSON-RPC error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::HeaderMismatch { .. } => ErrorCode::HeaderMismatch,
            _ => ErrorCode::InvalidRequest,
        }
    }

    /// The JSON-RPC error reply (with its HTTP status).
    pub fn to_outgoing(&self) -> Outgoing {
        let id = match self {
            Self::HeaderMismatch { id, .. }
            | Self::SessionNotFound { id }
            | Self::SessionVersion { id, .. } => id.clone(),
            _ => None,
        };
        Outgoing::error(id, self.code(), self.to_string(), None).with_status(self.status().as_u16())
    }
}

impl IntoResponse for McpHeaderError {
    fn into_response(self) -> Response {
        crate::mcp_reply::json_reply(&self.to_outgoing())
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// True when a comma-separated media-type list names one of `accepted`
/// (case-insensitive) or `*/*`.
fn lists_media_type(list: &str, accepted: &[&str]) -> bool {
    list.split(',').any(|a| {
        let a = a.split(';').next().unwrap_or_default().trim();
        a == "*/*" || accepted.iter().any(|t| a.eq_ignore_ascii_case(t))
    })
}

/// `Content-Type` must be `application/json` (415); `Accept`, when
/// present, must allow `application/json` (406).
///
/// ```
/// use axum::http::{HeaderMap, HeaderValue};
/// use graph_relay_transport_http::mcp_headers::{check_media_types, McpHeaderError};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(check_media_types(&headers), Err(McpHeaderError::UnsupportedMediaType));
/// headers.insert("content-type", HeaderValue::from_static("application/json; charset=utf-8"));
/// headers.insert("accept", HeaderValue::from_static("text/html"));
/// assert_eq!(check_media_types(&headers), Err(McpHeaderError::NotAcceptable));
/// headers.insert("accept", HeaderValue::from_static("application/json, text/event-stream"));
/// assert_eq!(check_media_types(&headers), Ok(()));
/// ```
pub fn check_media_types(headers: &HeaderMap) -> Result<(), McpHeaderError> {
    let content_type = header_str(headers, &header::CONTENT_TYPE).unwrap_or_default();
    if !content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    {
        return Err(McpHeaderError::UnsupportedMediaType);
    }
    if let Some(accept) = header_str(headers, &header::ACCEPT)
        && !lists_media_type(accept, &["application/json", "application/*"])
    {
        return Err(McpHeaderError::NotAcceptable);
    }
    Ok(())
}

/// True when the client accepts an SSE response (`text/event-stream` or
/// `*/*` in `Accept`): only then may a request that sends notifications
/// before its result be answered with a stream.
pub fn accepts_sse(headers: &HeaderMap) -> bool {
    header_str(headers, &header::ACCEPT)
        .is_some_and(|accept| lists_media_type(accept, &["text/event-stream"]))
}

/// The session id a request names (`MCP-Session-Id`), if any.
pub fn session_id(headers: &HeaderMap) -> Option<&str> {
    header_str(headers, &SESSION_ID)
}

/// The header value announcing a new session's id; `None` for an id that
/// cannot be a header value.
pub fn session_id_value(id: &str) -> Option<(HeaderName, HeaderValue)> {
    HeaderValue::from_str(id).ok().map(|v| (SESSION_ID, v))
}

/// Which case a parsed `POST /mcp` message is, applying the header rules
/// that need no session store: a 2026-07-28 request's headers must match
/// its body, and an initialize-era request other than `initialize` and
/// `ping` needs `MCP-Session-Id`. The cases are tried in the order of
/// [`McpRoute`]'s variants.
pub fn route<'h>(
    headers: &'h HeaderMap,
    incoming: &Incoming,
) -> Result<McpRoute<'h>, McpHeaderError> {
    if incoming.is_initialize() {
        return Ok(McpRoute::Initialize);
    }
    if let Some(id) = session_id(headers) {
        return Ok(McpRoute::Session(id));
    }
    if !incoming.is_request() {
        return Ok(McpRoute::NoReply);
    }
    if incoming.meta_protocol_version().is_some() {
        check_stateless(headers, incoming)?;
        return Ok(McpRoute::Stateless);
    }
    if incoming.method() == Some("ping") {
        return Ok(McpRoute::SessionlessPing);
    }
    Err(McpHeaderError::MissingSession)
}

/// The 2026-07-28 rule: `MCP-Protocol-Version` equals the body's
/// `_meta` version, `Mcp-Method` its method, and (for a message with a
/// `name` parameter such as `tools/call`) `Mcp-Name` its name, plain or
/// as `=?base64?…?=`.
pub fn check_stateless(headers: &HeaderMap, incoming: &Incoming) -> Result<(), McpHeaderError> {
    let mismatch = |detail: String| {
        Err(McpHeaderError::HeaderMismatch {
            id: incoming.id().cloned(),
            detail,
        })
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

/// Inside a session: an `MCP-Protocol-Version`, when sent, must be a known
/// version and the one the session negotiated (400 otherwise).
pub fn check_session_version(
    headers: &HeaderMap,
    incoming: &Incoming,
    negotiated: Option<ProtocolVersion>,
) -> Result<(), McpHeaderError> {
    match header_str(headers, &PROTOCOL_VERSION) {
        Some(v)
            if ProtocolVersion::parse(v).is_none()
                || Some(v) != negotiated.map(ProtocolVersion::as_str) =>
        {
            Err(McpHeaderError::SessionVersion {
                id: incoming.id().cloned(),
                sent: v.to_owned(),
                negotiated,
            })
        }
        _ => Ok(()),
    }
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

/// Base64 in either alphabet, padded or not (the `base64` crate).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    use base64::alphabet;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    // Padding optional, either alphabet (clients differ).
    const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .ok()
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

    #[test]
    fn refusals_keep_their_status_code_and_id() {
        let e = McpHeaderError::SessionNotFound {
            id: Some(Value::from(7)),
        };
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        let reply = e.to_outgoing();
        assert_eq!(reply.http_status(), 404);
        assert_eq!(reply.message()["id"], 7);
        assert_eq!(reply.message()["error"]["code"], -32600);
        let m = McpHeaderError::HeaderMismatch {
            id: None,
            detail: "Mcp-Method is required".into(),
        };
        assert_eq!(m.to_outgoing().message()["error"]["code"], -32020);
        assert_eq!(m.to_string(), "Header mismatch: Mcp-Method is required");
    }
}
