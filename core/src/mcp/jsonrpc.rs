//! JSON-RPC 2.0 framing: one incoming message parsed and classified, one
//! outgoing message with the HTTP status a transport should use.
//!
//! Only single messages are accepted: batch arrays were dropped by MCP in
//! 2025-06-18 and graph-relay refuses them in every revision.

mod bounded;
mod fast;
mod probe;

use std::sync::OnceLock;

use serde::Serialize;
use serde_json::{Map, Value};

pub(super) use self::bounded::Limited;
use self::bounded::Measure;
pub(super) use self::probe::MetaProbe;
use self::probe::{Probe, Probed};
use super::limits::MAX_INITIALIZE_FIELD_BYTES;
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

/// What a request the queue's store could not serve is answered
/// ([`Outgoing::store_unavailable`]).
pub const STORE_UNAVAILABLE: &str =
    "Service unavailable: the queue's store cannot be reached right now; retry later";
/// How long a client is told to wait before retrying such a request: a
/// restarted or failed-over database is usually back within seconds, and a
/// held request costs the server little.
pub const STORE_RETRY_AFTER_SECONDS: u64 = 1;

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
///
/// The members of `params` that the server reads on every request (`name`,
/// `arguments`, the `_meta` fields of 2026-07-28, …) are decoded when the
/// message is parsed; the whole `params` object only when
/// [`Incoming::params`] or [`Incoming::meta`] is first called (a
/// tree of the whole object cost more than the rest of the parse).
#[derive(Clone)]
pub struct Incoming {
    kind: IncomingKind,
    method: Option<String>,
    params: Params,
}

impl PartialEq for Incoming {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.method == other.method && self.params() == other.params()
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("kind", &self.kind)
            .field("method", &self.method)
            .field("params", self.params())
            .finish()
    }
}

/// The `params` of a message: what the handlers read on every request,
/// and the whole object, decoded on first use.
#[derive(Clone, Default)]
struct Params {
    probe: Probe,
    /// The whole object (empty when `params` is absent or `null`).
    map: OnceLock<Map<String, Value>>,
    /// The message's bytes, from which `map` is decoded on first use
    /// (`None` once it is known).
    source: Option<Box<[u8]>>,
}

impl Params {
    /// No params (absent, `null`, or a client's response).
    fn empty() -> Self {
        Self {
            probe: Probe::default(),
            map: OnceLock::from(Map::new()),
            source: None,
        }
    }
}

impl Incoming {
    /// Parses one message. On failure returns the error reply to send
    /// (`-32700` for bytes that are not JSON, `-32600` for anything else
    /// that is not a single JSON-RPC 2.0 request, notification or response).
    pub fn parse(bytes: &[u8]) -> Result<Self, Box<Outgoing>> {
        // The common case, a JSON object, is read straight into its parts
        // (no map of the top-level members). Anything it does not accept
        // is parsed again the general way, which decides the error.
        if let Some(envelope) = fast::envelope(bytes) {
            return Self::classify(envelope, Some(bytes)).map_err(Box::new);
        }
        Self::parse_general(bytes)
    }

    /// [`Incoming::parse`] without the plain-shape reader (see `fast`).
    pub(super) fn parse_general(bytes: &[u8]) -> Result<Self, Box<Outgoing>> {
        if let Ok(envelope) = serde_json::from_slice::<Envelope>(bytes) {
            return Self::classify(envelope, Some(bytes)).map_err(Box::new);
        }
        // Not a message: what it is, read as a `Value` would be (the same
        // refusals) but without building one.
        let measure: Measure = serde_json::from_slice(bytes).map_err(|e| {
            Box::new(Outgoing::error(
                None,
                ErrorCode::ParseError,
                format!("Parse error: the message is not valid JSON ({e})"),
                None,
            ))
        })?;
        let value = match measure.kind {
            // The refusal depends only on the kind.
            bounded::Kind::Array => Value::Array(Vec::new()),
            // Not reached: the envelope reader accepts every JSON object.
            bounded::Kind::Object => serde_json::from_slice(bytes).unwrap_or_default(),
            _ => Value::Null,
        };
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
        let params = match object.remove("params") {
            None => None,
            Some(Value::Null) => Some(ParamsValue::Null),
            Some(Value::Object(map)) => Some(ParamsValue::Object(Params {
                probe: Probe::of_map(&map),
                map: OnceLock::from(map),
                source: None,
            })),
            Some(_) => Some(ParamsValue::Other),
        };
        Self::classify(
            Envelope {
                id: object.remove("id"),
                jsonrpc_ok: object.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
                method: object.remove("method"),
                answered: object.contains_key("result") || object.contains_key("error"),
                params,
            },
            None,
        )
    }

    /// The checks of [`Incoming::from_value`] on a message's members;
    /// `source` is the message's bytes when it was parsed from them (the
    /// whole `params` object is decoded from them on first use).
    fn classify(envelope: Envelope, source: Option<&[u8]>) -> Result<Self, Outgoing> {
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
                    params: Params::empty(),
                })
            } else {
                Err(invalid(id, "Invalid request: `method` is missing"))
            };
        };
        let params = match params {
            None | Some(ParamsValue::Null) => Params::empty(),
            Some(ParamsValue::Object(mut p)) => {
                if p.map.get().is_none() {
                    p.source = source.map(Box::from);
                }
                p
            }
            Some(ParamsValue::Other) => {
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

    /// The params object (empty when absent). Decoded from the message's
    /// bytes on first use.
    pub fn params(&self) -> &Map<String, Value> {
        self.params.map.get_or_init(|| {
            self.params
                .source
                .as_deref()
                .and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok())
                .and_then(|mut message| match message.get_mut("params")?.take() {
                    Value::Object(params) => Some(params),
                    _ => None,
                })
                // Not reached: the bytes parsed, with an object as `params`.
                .unwrap_or_default()
        })
    }

    /// `params.arguments`.
    pub(super) fn arguments(&self) -> Option<&Value> {
        Some(&self.params.probe.arguments.as_ref()?.value)
    }

    /// The size of the run's `arguments` inside `params.arguments`, when
    /// they were too large to keep and an empty object stands for them.
    pub(super) fn arguments_too_large(&self) -> Option<usize> {
        self.params.probe.arguments.as_ref()?.too_large
    }

    /// `params.protocolVersion` (of `initialize`).
    pub(super) fn protocol_version_param(&self) -> Option<&Value> {
        self.params.probe.protocol_version.as_ref()
    }

    /// `params.clientInfo` (of `initialize`), whole if within
    /// [`MAX_INITIALIZE_FIELD_BYTES`].
    pub(super) fn client_info(&self) -> Option<&Limited> {
        self.params.probe.client_info.as_ref()
    }

    /// `params.notifications` (of `subscriptions/listen`).
    pub(super) fn notifications(&self) -> Option<&Value> {
        self.params.probe.notifications.as_ref()
    }

    /// `params.capabilities` (of `initialize`), whole if within
    /// [`MAX_INITIALIZE_FIELD_BYTES`].
    pub(super) fn capabilities(&self) -> Option<&Limited> {
        self.params.probe.capabilities.as_ref()
    }

    /// `params.taskId`.
    pub(super) fn task_id(&self) -> Option<&Value> {
        self.params.probe.task_id.as_ref()
    }

    /// What `params._meta` is, with the members the server reads (`None`
    /// when there is none).
    pub(super) fn meta_probe(&self) -> Option<&MetaProbe> {
        self.params.probe.meta.as_ref()
    }

    /// The members of `params._meta` the server reads, when it is an object.
    fn meta_members(&self) -> Option<&probe::MetaMembers> {
        match self.params.probe.meta.as_ref()? {
            MetaProbe::Object(members) => Some(members),
            MetaProbe::NotObject => None,
        }
    }

    /// `_meta.io.modelcontextprotocol/clientCapabilities`, when `_meta` is an object.
    pub(super) fn client_capabilities(&self) -> Option<&Value> {
        self.meta_members()?.client_capabilities.as_ref()
    }

    /// `_meta.progressToken`, when `_meta` is an object.
    pub(super) fn progress_token(&self) -> Option<&Value> {
        self.meta_members()?.progress_token.as_ref()
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
        self.params().get("_meta").and_then(Value::as_object)
    }

    /// The protocol version a 2026-07-28-style request carries in `_meta`,
    /// as sent (it may be one this server does not support).
    pub fn meta_protocol_version(&self) -> Option<&str> {
        self.meta_members()?.protocol_version.as_ref()?.as_str()
    }

    /// The value the 2026-07-28 `Mcp-Name` header must equal: `params.name`
    /// for `tools/call` and `prompts/get`, `params.uri` for `resources/read`,
    /// `params.taskId` for the tasks extension's `tasks/*` methods.
    pub fn name_param(&self) -> Option<&str> {
        let probe = &self.params.probe;
        match self.method()? {
            "tools/call" | "prompts/get" => probe.name.as_ref()?.as_str(),
            "resources/read" => probe.uri.as_ref()?.as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => probe.task_id.as_ref()?.as_str(),
            _ => None,
        }
    }

    /// The tool a `tools/call` names.
    pub fn tool_name(&self) -> Option<&str> {
        if self.method()? == "tools/call" {
            self.params.probe.name.as_ref()?.as_str()
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
    params: Option<ParamsValue>,
}

/// What the `params` member is.
// Short-lived (one parse), and nearly always `Object`: a box would cost an
// allocation per message.
#[allow(clippy::large_enum_variant)]
enum ParamsValue {
    /// `null`.
    Null,
    /// An object: its probe (`map` and `source` are set later).
    Object(Params),
    /// Anything else.
    Other,
}

/// The next value of `map` as its raw text, for [`bounded`]'s readers.
fn raw_value<'de, A: serde::de::MapAccess<'de>>(
    map: &mut A,
) -> Result<&'de serde_json::value::RawValue, A::Error> {
    map.next_value()
}

/// A [`bounded`] reader's error as the map reader's.
fn bounded_error<E: serde::de::Error>(e: serde_json::Error) -> E {
    E::custom(e)
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
                    // Every value is read as a `Value` would be (or, for
                    // `params`, with every member read as one), so that
                    // exactly the messages the general parse accepts are
                    // accepted; only what is read is kept (`bounded`).
                    let value = match member {
                        Member::Params => {
                            envelope.params = Some(map.next_value()?);
                            continue;
                        }
                        Member::Answer | Member::Other => {
                            map.next_value::<Measure>()?;
                            envelope.answered |= matches!(member, Member::Answer);
                            continue;
                        }
                        Member::Id | Member::Jsonrpc | Member::Method => {
                            bounded::scalar(raw_value(&mut map)?)
                                .map_err(bounded_error::<A::Error>)?
                        }
                    };
                    match member {
                        Member::Id => envelope.id = Some(value),
                        Member::Jsonrpc => envelope.jsonrpc_ok = value.as_str() == Some("2.0"),
                        _ => envelope.method = Some(value),
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
    /// lexicographic order of their wire names (as every wire type of
    /// this module is), so the bytes are those of [`Outgoing::result`].
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
        Self::result_written(id, result.len(), |bytes| bytes.extend_from_slice(result))
    }

    /// A success response whose result `write` appends as compact,
    /// canonical JSON (see [`Outgoing::prerendered_result`]) to the
    /// message's bytes, which have room for `len` more.
    pub(super) fn result_written(
        id: &RequestId,
        len: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Self {
        let mut bytes = Vec::with_capacity(len + 48);
        bytes.extend_from_slice(b"{\"id\":");
        // An id is a string or an integer, which serialize infallibly.
        if serde_json::to_writer(&mut bytes, id).is_err() {
            bytes.extend_from_slice(b"null");
        }
        bytes.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
        write(&mut bytes);
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

    /// The answer to request `id` when the queue's store could not serve
    /// it (a database outage, a dropped connection): a passing failure, so
    /// it says so in every protocol revision and on every transport. The
    /// JSON-RPC error is `-32603` with `data` `{"retryable": true,
    /// "retryAfterSeconds": 1}` ([`STORE_RETRY_AFTER_SECONDS`]), and the
    /// suggested HTTP status is 503, which HTTP transports send with
    /// `Retry-After`. The queue's errors decide which failures these are
    /// (their `is_retryable()`); nothing else answers with it.
    pub fn store_unavailable(id: Option<RequestId>) -> Self {
        Self::error(
            id,
            ErrorCode::InternalError,
            STORE_UNAVAILABLE.to_owned(),
            Some(to_value(&super::wire::RetryableData {
                retryable: true,
                retry_after_seconds: STORE_RETRY_AFTER_SECONDS,
            })),
        )
        .with_status(503)
    }

    /// The answer of a line-delimited transport (stdio) to a line of `size`
    /// bytes, over its bound of `max_line_bytes`: an invalid request naming
    /// both, with the bound as `data.maxLineBytes`.
    pub fn line_too_long(size: usize, max_line_bytes: usize) -> Self {
        Self::error(
            None,
            ErrorCode::InvalidRequest,
            format!(
                "Invalid request: the message is {size} bytes long; this server accepts at most {max_line_bytes} bytes per line"
            ),
            Some(to_value(&super::wire::LineLimitData { max_line_bytes })),
        )
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
