//! JSON-RPC 2.0 framing: one incoming message parsed and classified, one
//! outgoing message with the HTTP status a transport should use.
//!
//! Only single messages are accepted: batch arrays were dropped by MCP in
//! 2025-06-18 and graph-relay refuses them in every revision.

use std::sync::OnceLock;

use serde::Serialize;
use serde_json::{Map, Value};

use super::version::ProtocolVersion;
use super::wire::{
    ErrorObject, JSONRPC_VERSION, JsonRpcErrorResponse, JsonRpcResponse, UnsupportedVersionData,
    to_value,
};

/// `_meta` key carrying the protocol version of a 2026-07-28 request.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key carrying the client capabilities of a 2026-07-28 request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying the client implementation of a 2026-07-28 request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key under which 2026-07-28 results carry the server implementation.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The JSON-RPC and MCP error codes graph-relay emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// -32700: the bytes are not JSON.
    ParseError,
    /// -32600: JSON, but not a valid JSON-RPC request.
    InvalidRequest,
    /// -32601: no such method (in this revision).
    MethodNotFound,
    /// -32602: the params are wrong (unknown tool, missing `_meta` field, …).
    InvalidParams,
    /// -32603: the server failed.
    InternalError,
    /// -32020 (2026-07-28): an HTTP header disagrees with the body.
    HeaderMismatch,
    /// -32021 (2026-07-28): the request needs a capability the client did not declare.
    MissingRequiredCapability,
    /// -32022 (2026-07-28): the requested protocol version is not supported.
    UnsupportedProtocolVersion,
    /// -32003 (graph-relay): the token lacks a scope the authorization table
    /// ([`crate::authz`]) requires; `data` names it. HTTP 403.
    InsufficientScope,
    /// -32004 (graph-relay): a bound of the server is reached (sessions,
    /// listen streams); the message names the limit and `data.limit` gives it.
    LimitExceeded,
}

impl ErrorCode {
    /// The numeric code.
    pub const fn code(self) -> i64 {
        match self {
            Self::ParseError => -32700,
            Self::InvalidRequest => -32600,
            Self::MethodNotFound => -32601,
            Self::InvalidParams => -32602,
            Self::InternalError => -32603,
            Self::HeaderMismatch => -32020,
            Self::MissingRequiredCapability => -32021,
            Self::UnsupportedProtocolVersion => -32022,
            Self::InsufficientScope => -32003,
            Self::LimitExceeded => -32004,
        }
    }
}

/// A request id: a string or an integer (MCP forbids `null`).
pub type RequestId = Value;

/// What kind of JSON-RPC message arrived.
#[derive(Debug, Clone, PartialEq)]
pub enum IncomingKind {
    /// A request: it gets exactly one response.
    Request {
        /// Its id.
        id: RequestId,
    },
    /// A notification (`notifications/…`): no response.
    Notification,
    /// A response from the client (to a request the server never sends): ignored.
    Response,
}

/// One parsed, well-formed JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    kind: IncomingKind,
    method: Option<String>,
    params: Map<String, Value>,
}

impl Incoming {
    /// Parses one message. On failure returns the error reply to send
    /// (`-32700` for bytes that are not JSON, `-32600` for anything else
    /// that is not a single JSON-RPC 2.0 request, notification or response).
    pub fn parse(bytes: &[u8]) -> Result<Self, Box<Outgoing>> {
        // The common case, a JSON object, is read straight into its parts
        // (no map of the top-level members). Anything it does not accept
        // is parsed again the general way, which decides the error.
        if let Ok(envelope) = serde_json::from_slice::<Envelope>(bytes) {
            return Self::classify(envelope).map_err(Box::new);
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            Box::new(Outgoing::error(
                None,
                ErrorCode::ParseError,
                format!("Parse error: the message is not valid JSON ({e})"),
                None,
            ))
        })?;
        Self::from_value(value).map_err(Box::new)
    }

    /// Classifies an already-decoded JSON value (see [`Incoming::parse`]).
    pub fn from_value(value: Value) -> Result<Self, Outgoing> {
        let mut object = match value {
            Value::Object(object) => object,
            Value::Array(_) => {
                return Err(invalid(
                    None,
                    "Invalid request: batch arrays are not supported; send one JSON-RPC message per request",
                ));
            }
            _ => {
                return Err(invalid(
                    None,
                    "Invalid request: a JSON-RPC message must be a JSON object",
                ));
            }
        };
        Self::classify(Envelope {
            id: object.remove("id"),
            jsonrpc_ok: object.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
            method: object.remove("method"),
            answered: object.contains_key("result") || object.contains_key("error"),
            params: object.remove("params"),
        })
    }

    /// The checks of [`Incoming::from_value`] on a message's members.
    fn classify(envelope: Envelope) -> Result<Self, Outgoing> {
        let Envelope {
            id,
            jsonrpc_ok,
            method,
            answered,
            params,
        } = envelope;
        let id = match id {
            None => None,
            Some(id @ Value::String(_)) => Some(id),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
            Some(_) => {
                return Err(invalid(
                    None,
                    "Invalid request: `id` must be a string or an integer",
                ));
            }
        };
        if !jsonrpc_ok {
            return Err(invalid(
                id,
                "Invalid request: `jsonrpc` must be exactly \"2.0\"",
            ));
        }
        let method = match method {
            Some(Value::String(m)) => Some(m),
            Some(_) => return Err(invalid(id, "Invalid request: `method` must be a string")),
            None => None,
        };
        let Some(method) = method else {
            return if id.is_some() && answered {
                Ok(Self {
                    kind: IncomingKind::Response,
                    method: None,
                    params: Map::new(),
                })
            } else {
                Err(invalid(id, "Invalid request: `method` is missing"))
            };
        };
        let params = match params {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p,
            Some(_) => {
                return Err(Outgoing::error(
                    id,
                    ErrorCode::InvalidParams,
                    "Invalid params: `params` must be an object".to_owned(),
                    None,
                )
                .with_status(400));
            }
        };
        let kind = match id {
            Some(id) => IncomingKind::Request { id },
            None if method.starts_with("notifications/") => IncomingKind::Notification,
            None => {
                return Err(invalid(
                    None,
                    &format!(
                        "Invalid request: `{method}` is a request and needs an `id` (only notifications/* may omit it)"
                    ),
                ));
            }
        };
        Ok(Self {
            kind,
            method: Some(method),
            params,
        })
    }

    /// Request, notification or response.
    pub fn kind(&self) -> &IncomingKind {
        &self.kind
    }

    /// The request id, for requests.
    pub fn id(&self) -> Option<&RequestId> {
        match &self.kind {
            IncomingKind::Request { id } => Some(id),
            _ => None,
        }
    }

    /// The method, unless this is a response.
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The params object (empty when absent).
    pub fn params(&self) -> &Map<String, Value> {
        &self.params
    }

    /// True for a request.
    pub fn is_request(&self) -> bool {
        matches!(self.kind, IncomingKind::Request { .. })
    }

    /// True for a notification.
    pub fn is_notification(&self) -> bool {
        matches!(self.kind, IncomingKind::Notification)
    }

    /// True for a client's response.
    pub fn is_response(&self) -> bool {
        matches!(self.kind, IncomingKind::Response)
    }

    /// True for an `initialize` request.
    pub fn is_initialize(&self) -> bool {
        self.is_request() && self.method() == Some("initialize")
    }

    /// The `_meta` object of the params, if any.
    pub fn meta(&self) -> Option<&Map<String, Value>> {
        self.params.get("_meta").and_then(Value::as_object)
    }

    /// The protocol version a 2026-07-28-style request carries in `_meta`,
    /// as sent (it may be one this server does not support).
    pub fn meta_protocol_version(&self) -> Option<&str> {
        self.meta()?.get(META_PROTOCOL_VERSION)?.as_str()
    }

    /// The value the 2026-07-28 `Mcp-Name` header must equal: `params.name`
    /// for `tools/call` and `prompts/get`, `params.uri` for `resources/read`,
    /// `params.taskId` for the tasks extension's `tasks/*` methods.
    pub fn name_param(&self) -> Option<&str> {
        match self.method()? {
            "tools/call" | "prompts/get" => self.params.get("name")?.as_str(),
            "resources/read" => self.params.get("uri")?.as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => self.params.get("taskId")?.as_str(),
            _ => None,
        }
    }

    /// The tool a `tools/call` names.
    pub fn tool_name(&self) -> Option<&str> {
        if self.method()? == "tools/call" {
            self.params.get("name")?.as_str()
        } else {
            None
        }
    }
}

/// The members of a JSON-RPC message object that decide what it is. A
/// member given twice counts with its last value, as in a [`Map`].
#[derive(Default)]
struct Envelope {
    id: Option<Value>,
    /// `jsonrpc` is exactly the string `"2.0"`.
    jsonrpc_ok: bool,
    method: Option<Value>,
    /// A `result` or `error` member is present.
    answered: bool,
    params: Option<Value>,
}

/// A member name of a JSON-RPC message, read without allocating.
enum Member {
    Id,
    Jsonrpc,
    Method,
    Params,
    Answer,
    Other,
}

impl<'de> serde::Deserialize<'de> for Member {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Member;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Member, E> {
                Ok(match name {
                    "id" => Member::Id,
                    "jsonrpc" => Member::Jsonrpc,
                    "method" => Member::Method,
                    "params" => Member::Params,
                    "result" | "error" => Member::Answer,
                    _ => Member::Other,
                })
            }
        }
        deserializer.deserialize_identifier(Name)
    }
}

impl<'de> serde::Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Envelope;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC message object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Envelope, A::Error> {
                let mut envelope = Envelope::default();
                while let Some(member) = map.next_key::<Member>()? {
                    // Every value is read as a `Value`, so that exactly the
                    // messages the general parse accepts are accepted.
                    let value: Value = map.next_value()?;
                    match member {
                        Member::Id => envelope.id = Some(value),
                        Member::Jsonrpc => envelope.jsonrpc_ok = value.as_str() == Some("2.0"),
                        Member::Method => envelope.method = Some(value),
                        Member::Params => envelope.params = Some(value),
                        Member::Answer => envelope.answered = true,
                        Member::Other => {}
                    }
                }
                Ok(envelope)
            }
        }
        deserializer.deserialize_map(Members)
    }
}

fn invalid(id: Option<RequestId>, message: &str) -> Outgoing {
    Outgoing::error(id, ErrorCode::InvalidRequest, message.to_owned(), None)
}

/// One message to send back, with the HTTP status a transport should use.
///
/// The message is kept as the compact JSON bytes a transport writes,
/// rendered once when the reply is made: typed replies are serialized
/// straight to bytes (no [`Value`] tree), and every reply's bytes are the
/// canonical rendering of its message (keys in lexicographic order, as a
/// [`Value`] writes them). [`Outgoing::message`] decodes them on demand.
#[derive(Clone)]
pub struct Outgoing {
    bytes: Vec<u8>,
    message: OnceLock<Value>,
    error: Option<ErrorCode>,
    http_status: u16,
}

/// `{"id":…,"jsonrpc":"2.0","result":…}` over borrowed parts: the fields of
/// [`JsonRpcResponse`] in the same order, without owning them.
#[derive(Serialize)]
struct ResponseRef<'a, R: ?Sized> {
    id: &'a RequestId,
    jsonrpc: &'static str,
    result: &'a R,
}

impl Outgoing {
    /// A success response.
    pub fn result(id: RequestId, result: Value) -> Self {
        let message = to_value(&JsonRpcResponse::new(id, result));
        Self {
            bytes: render(&message),
            message: OnceLock::from(message),
            error: None,
            http_status: 200,
        }
    }

    /// A success response whose result is the typed wire value `result`,
    /// serialized straight to bytes. Its fields must be declared in the
    /// lexicographic order of their wire names (as every type of
    /// [`super::wire`] is), so the bytes are those of [`Outgoing::result`].
    pub fn typed_result<R: Serialize + ?Sized>(id: &RequestId, result: &R) -> Self {
        Self::rendered(render(&ResponseRef {
            id,
            jsonrpc: JSONRPC_VERSION,
            result,
        }))
    }

    /// A success response whose result is `result`, already rendered as
    /// compact, canonical JSON (see [`Outgoing::typed_result`]): only the
    /// envelope around it is written.
    pub fn prerendered_result(id: &RequestId, result: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(result.len() + 48);
        bytes.extend_from_slice(b"{\"id\":");
        // An id is a string or an integer, which serialize infallibly.
        if serde_json::to_writer(&mut bytes, id).is_err() {
            bytes.extend_from_slice(b"null");
        }
        bytes.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
        bytes.extend_from_slice(result);
        bytes.push(b'}');
        Self::rendered(bytes)
    }

    fn rendered(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            message: OnceLock::new(),
            error: None,
            http_status: 200,
        }
    }

    /// An error response; `id` is `null` when the request's id is unknown.
    /// The HTTP status defaults by code: 400 for parse, invalid-request,
    /// header-mismatch and unsupported-version errors, 403 for
    /// insufficient scope, 429 for a reached limit, 500 for internal
    /// errors, 200 otherwise (see [`Outgoing::with_status`]).
    pub fn error(
        id: Option<RequestId>,
        code: ErrorCode,
        message: String,
        data: Option<Value>,
    ) -> Self {
        let error = ErrorObject {
            code: code.code(),
            data,
            message,
        };
        let http_status = match code {
            ErrorCode::ParseError
            | ErrorCode::InvalidRequest
            | ErrorCode::HeaderMismatch
            | ErrorCode::MissingRequiredCapability
            | ErrorCode::UnsupportedProtocolVersion => 400,
            ErrorCode::InternalError => 500,
            ErrorCode::InsufficientScope => 403,
            ErrorCode::LimitExceeded => 429,
            ErrorCode::MethodNotFound | ErrorCode::InvalidParams => 200,
        };
        let message = to_value(&JsonRpcErrorResponse::new(id, error));
        Self {
            bytes: render(&message),
            message: OnceLock::from(message),
            error: Some(code),
            http_status,
        }
    }

    /// The same message with another suggested HTTP status.
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.http_status = status;
        self
    }

    /// The JSON-RPC message (decoded from its bytes on first use).
    pub fn message(&self) -> &Value {
        self.message.get_or_init(|| {
            // The bytes were rendered from a wire value: they are JSON.
            serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
        })
    }

    /// The message as compact JSON bytes (no trailing newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.clone()
    }

    /// The message as compact JSON bytes (no trailing newline), without a copy.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The message's compact JSON bytes, taken out of the reply.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The error code, for an error response.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.error
    }

    /// The `result` member, for a success response.
    pub fn result_value(&self) -> Option<&Value> {
        self.message().get("result")
    }

    /// The HTTP status a Streamable HTTP transport should answer with.
    pub fn http_status(&self) -> u16 {
        self.http_status
    }
}

impl PartialEq for Outgoing {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
            && self.error == other.error
            && self.http_status == other.http_status
    }
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("message", &String::from_utf8_lossy(&self.bytes))
            .field("error", &self.error)
            .field("http_status", &self.http_status)
            .finish()
    }
}

/// Compact JSON of a wire value. The wire types hold only strings,
/// numbers, ids and maps with string keys, so this cannot fail.
fn render<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(512);
    serde_json::to_writer(&mut bytes, value).expect("wire types serialize to JSON");
    bytes
}

/// The `data` of an unsupported-version error: `{supported, requested}`.
pub fn unsupported_version_data(requested: &str) -> Value {
    to_value(&UnsupportedVersionData {
        requested: requested.to_owned(),
        supported: ProtocolVersion::supported_strings()
            .into_iter()
            .map(str::to_owned)
            .collect(),
    })
}
