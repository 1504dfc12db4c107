//! MCP message handling, shared by every transport (no IO).
//!
//! A transport hands [`McpServer::handle`] the bytes of one JSON-RPC message
//! together with the connection's [`McpSession`] and the authenticated
//! [`Caller`], and writes back the [`Outgoing`] message, if any.
//!
//! ```text
//!  bytes ─► Incoming::parse ─► (transport checks: headers, scopes) ─► McpServer::handle_incoming ─► Outgoing
//! ```
//!
//! # Authorization
//! Every method needs what the one table in [`crate::authz`] says, and
//! [`McpServer::handle_incoming`] checks it before anything else: a method
//! missing from the table is not answered at all (`-32601`), and a caller
//! without the scope gets `-32003` naming it ([`ScopeDenied`]). Transports
//! call [`McpServer::authorize`] first to refuse with their own status (HTTP
//! 403 `insufficient_scope`) before any work.
//!
//! # Bounds
//! `initialize`'s `clientInfo` and `capabilities` may each be at most
//! [`MAX_INITIALIZE_FIELD_BYTES`] serialized (`-32602` beyond); a session
//! keeps `clientInfo` as compact JSON text, so what it retains is bounded
//! by that constant ([`McpSession::retained_bytes`]).
//!
//! # Revisions
//! - **Initialize era** (2025-03-26, 2025-06-18, 2025-11-25): `initialize`
//!   negotiates a version for the session (a supported request is echoed,
//!   anything else gets the counter-offer 2025-11-25), then
//!   `notifications/initialized`; `ping` answers `{}`.
//! - **2026-07-28**: no handshake. Every request carries
//!   `_meta["io.modelcontextprotocol/protocolVersion"]` and
//!   `_meta["io.modelcontextprotocol/clientCapabilities"]` (missing: `-32602`;
//!   unsupported version: `-32022` with `data: {supported, requested}`).
//!   Results carry `resultType: "complete"` and the server info in `_meta`;
//!   `tools/list` and `server/discover` carry `ttlMs` and `cacheScope`.
//!   `ping` and `initialize`-era notifications do not exist there.
//!
//! A request is handled in the modern way when it carries the `_meta`
//! version and its session has not negotiated an initialize-era version.
//!
//! # Errors
//! Protocol errors are JSON-RPC errors: `-32700` (not JSON), `-32600`
//! (batch array, wrong `jsonrpc`, missing `method`, request without `id`),
//! `-32601` (unknown method), `-32602` (unknown tool, malformed params).
//! Bad tool *arguments*, unknown or foreign runs and unshared sessions are
//! tool execution errors (`isError: true`) whose text names the problem, as
//! 2025-11-25 specifies, so the model can correct itself.

mod escape;
mod jsonrpc;
mod limits;
mod progress;
mod result;
mod session_store;
mod tasks;
mod tool_list;
mod tools;
mod version;
pub(crate) mod wire;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use self::jsonrpc::MetaProbe;
pub use self::jsonrpc::{
    ErrorCode, Incoming, IncomingKind, META_CLIENT_CAPABILITIES, META_CLIENT_INFO,
    META_PROTOCOL_VERSION, META_SERVER_INFO, Outgoing, RequestId, STORE_RETRY_AFTER_SECONDS,
    STORE_UNAVAILABLE, unsupported_version_data,
};
pub use self::limits::{MAX_INITIALIZE_FIELD_BYTES, compact_json_len_within};
pub use self::progress::{NoNotifier, Notifier};
use self::result::{Answer, Revision};
pub use self::session_store::{
    DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSIONS_PER_AGENT, DEFAULT_SESSION_IDLE_TIMEOUT,
    MAX_MCP_SESSION_STATE_BYTES, McpSessionCreateError, McpSessionFigures, McpSessionLimits,
    McpSessionOwner, McpSessionStore, McpSessionsFull,
};
pub use self::tasks::{MAX_LISTEN_TASKS, TASKS_EXTENSION, TaskListen};
pub use self::version::ProtocolVersion;
use crate::authz::Method;
use crate::authz::ScopeDenied;
use crate::catalog::ToolCatalog;
use crate::principal::Agent;
use crate::queue::Queue;
use crate::time::Sleeper;

/// The instructions graph-relay gives the model in `initialize` and
/// `server/discover`: that a run is a ticket and which tool reads it, the
/// lesson of the published system (a model cannot infer a queue from a
/// tool name).
pub const DEFAULT_INSTRUCTIONS: &str = "run_graph_session queues a Graph run on the owner's desktop and returns a ticket at once; read the result with get_graph_run (first check after about 20 s).";

/// How the server names itself to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Implementation name, e.g. `graph-relay`.
    pub name: String,
    /// Implementation version.
    pub version: String,
    /// Optional instructions for the model, sent in `initialize` and `server/discover`.
    pub instructions: Option<String>,
}

impl ServerInfo {
    /// A server called `name` at `version`, without instructions.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            instructions: None,
        }
    }

    /// The `serverInfo` of replies.
    fn implementation(&self) -> wire::Implementation {
        wire::Implementation {
            name: self.name.clone(),
            version: self.version.clone(),
        }
    }
}

/// The authenticated agent behind a message and the scopes its token grants.
///
/// Cheap to clone (two shared pointers): a transport clones it on every
/// request (from its token table into the request, and into the task that
/// handles it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The agent; runs are filed under it.
    pub agent: Arc<Agent>,
    /// OAuth2 scopes granted (stdio: from configuration).
    pub scopes: Arc<BTreeSet<String>>,
}

impl Caller {
    /// A caller with `scopes`.
    pub fn new<I, S>(agent: Agent, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            agent: Arc::new(agent),
            scopes: Arc::new(scopes.into_iter().map(Into::into).collect()),
        }
    }
}

/// Per-connection state of the initialize era. A 2026-07-28 client needs
/// none: transports may use a fresh default session for each of its requests.
///
/// Serializable, so that an [`McpSessionStore`] shared by several servers
/// can keep it: [`McpSession::to_state`] writes at most
/// [`MAX_MCP_SESSION_STATE_BYTES`], since `clientInfo` is bounded by
/// [`MAX_INITIALIZE_FIELD_BYTES`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct McpSession {
    version: Option<ProtocolVersion>,
    initialized: bool,
    /// `clientInfo` as compact JSON (at most [`MAX_INITIALIZE_FIELD_BYTES`]).
    client_info: Option<Box<str>>,
}

impl McpSession {
    /// A session before `initialize`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The version `initialize` negotiated, if it happened.
    pub fn negotiated_version(&self) -> Option<ProtocolVersion> {
        self.version
    }

    /// True once `notifications/initialized` arrived.
    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// The `clientInfo` sent with `initialize`.
    pub fn client_info(&self) -> Option<Value> {
        serde_json::from_str(self.client_info.as_deref()?).ok()
    }

    /// Bytes of client data the session keeps (its `clientInfo` as compact
    /// JSON), at most [`MAX_INITIALIZE_FIELD_BYTES`].
    pub fn retained_bytes(&self) -> usize {
        self.client_info.as_deref().map_or(0, str::len)
    }

    /// The session as stored text (JSON), at most
    /// [`MAX_MCP_SESSION_STATE_BYTES`] for any session the core made.
    pub fn to_state(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// [`to_state`](Self::to_state), refused when longer than
    /// [`MAX_MCP_SESSION_STATE_BYTES`]: the bound every session store
    /// keeps, checked here once for all of them.
    pub fn bounded_state(&self) -> Result<String, McpSessionCreateError> {
        let state = self.to_state();
        if state.len() > MAX_MCP_SESSION_STATE_BYTES {
            return Err(McpSessionCreateError::TooLarge {
                bytes: state.len(),
                limit: MAX_MCP_SESSION_STATE_BYTES,
            });
        }
        Ok(state)
    }

    /// A session read back from [`to_state`](Self::to_state)'s text; `None`
    /// when it is not one, or longer than [`MAX_MCP_SESSION_STATE_BYTES`].
    pub fn from_state(text: &str) -> Option<Self> {
        if text.len() > MAX_MCP_SESSION_STATE_BYTES {
            return None;
        }
        serde_json::from_str(text).ok()
    }
}

/// Default `ttlMs` of cacheable 2026-07-28 results (5 minutes).
pub const DEFAULT_LIST_TTL_MS: u64 = 300_000;

/// The MCP server: protocol rules over a [`Queue`] and a [`ToolCatalog`].
/// Cheap to clone; share one between connections.
///
/// A transport keeps one [`McpSession`] per connection (or per
/// `MCP-Session-Id`), authenticates the [`Caller`], and hands each message's
/// bytes to [`McpServer::handle`]; what comes back is the reply to write,
/// if any:
///
/// ```
/// use futures::executor::block_on;
/// use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
/// use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo};
/// use graph_relay_core::prelude::*;
///
/// fn serve_one_line(queue: Queue, line: &[u8]) -> Option<String> {
///     let server = McpServer::new(queue, ToolCatalog::published(), ServerInfo::new("my-server", "1.0"));
///     let agent = Agent::new(
///         AgentId::parse("assistant").ok()?,
///         OwnerId::parse("alice").ok()?,
///         [ProjectId::parse("research").ok()?],
///     );
///     let caller = Caller::new(agent, [READ_SCOPE, RUN_SCOPE]);
///     let mut session = McpSession::new();
///     let reply = block_on(server.handle(&mut session, &caller, line))?;
///     Some(reply.message().to_string())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    queue: Queue,
    catalog: ToolCatalog,
    info: ServerInfo,
    /// The `_meta` of 2026-07-28 results (`ServerInfoMeta`), compact JSON.
    server_info_meta: Vec<u8>,
    tools_list: Vec<wire::Tool>,
    /// The `tools/list` result of each era, rendered once: it is the same
    /// for every caller (see `McpServer::tools_list`).
    tools_list_rendered: ToolsListRendered,
    list_ttl_ms: u64,
    sleeper: Option<Arc<dyn Sleeper>>,
}

/// The `tools/list` result of each era, rendered ([`Revision::render`]).
#[derive(Debug, Clone, Default)]
struct ToolsListRendered {
    legacy: Arc<[u8]>,
    modern: Arc<[u8]>,
}

/// The `_meta` of a 2026-07-28 result.
#[derive(serde::Serialize)]
struct ServerInfoMeta<'a> {
    #[serde(rename = "io.modelcontextprotocol/serverInfo")]
    server_info: &'a wire::Implementation,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("catalog", &self.catalog)
            .field("info", &self.info)
            .field("list_ttl_ms", &self.list_ttl_ms)
            .field("can_wait", &self.sleeper.is_some())
            .finish_non_exhaustive()
    }
}

/// How a request is being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    /// Inside an initialize-era session at this version (or before initialize).
    Legacy(Option<ProtocolVersion>),
    /// A self-contained 2026-07-28 request.
    Modern,
}

impl McpServer {
    /// A server for `queue` exposing `catalog`, naming itself `info`.
    pub fn new(queue: Queue, catalog: ToolCatalog, info: ServerInfo) -> Self {
        let tools_list = catalog.tool_definitions();
        let implementation = info.implementation();
        let mut server_info_meta = Vec::new();
        escape::write_json(
            &mut server_info_meta,
            &ServerInfoMeta {
                server_info: &implementation,
            },
        );
        Self::prerendered(Inner {
            queue,
            catalog,
            server_info_meta,
            info,
            tools_list,
            tools_list_rendered: ToolsListRendered::default(),
            list_ttl_ms: DEFAULT_LIST_TTL_MS,
            sleeper: None,
        })
    }

    /// A server over `inner` with its `tools/list` results rendered.
    fn prerendered(inner: Inner) -> Self {
        let mut server = Self {
            inner: Arc::new(inner),
        };
        let rendered = ToolsListRendered {
            legacy: server.render_tools_list(Era::Legacy(None)),
            modern: server.render_tools_list(Era::Modern),
        };
        if let Some(inner) = Arc::get_mut(&mut server.inner) {
            inner.tools_list_rendered = rendered;
        }
        server
    }

    /// The same server with another `ttlMs` for `tools/list` and `server/discover`.
    #[must_use]
    pub fn with_list_ttl_ms(self, ttl_ms: u64) -> Self {
        let mut inner = (*self.inner).clone();
        inner.list_ttl_ms = ttl_ms;
        Self::prerendered(inner)
    }

    /// The same server with the runtime's timer, which `get_graph_run`'s
    /// `wait_seconds` needs (see [`ToolCatalog::max_wait_seconds`]). Without
    /// one, a call with `wait_seconds` is answered at once.
    #[must_use]
    pub fn with_sleeper(self, sleeper: Arc<dyn Sleeper>) -> Self {
        let mut inner = (*self.inner).clone();
        inner.sleeper = Some(sleeper);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The runtime's timer, if the transport supplied one.
    pub fn sleeper(&self) -> Option<&Arc<dyn Sleeper>> {
        self.inner.sleeper.as_ref()
    }

    /// The queue.
    pub fn queue(&self) -> &Queue {
        &self.inner.queue
    }

    /// The catalog.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.inner.catalog
    }

    /// The server info.
    pub fn info(&self) -> &ServerInfo {
        &self.inner.info
    }

    /// The scopes `incoming` needs under the authorization table
    /// ([`crate::authz`]) and this server's catalog. `None` when it needs
    /// none: open methods, notifications, responses, methods this server
    /// does not answer, and `tools/call` of an unknown tool (which fails
    /// later with `-32602`).
    pub fn required_scopes(&self, incoming: &Incoming) -> Option<&[String]> {
        let method = Method::parse(incoming.method()?)?;
        let scopes = method
            .access()
            .scopes(&self.inner.catalog, incoming.tool_name());
        (!scopes.is_empty()).then_some(scopes)
    }

    /// The first scope `incoming` needs that `caller` lacks, if any.
    pub fn missing_scope<'a>(&'a self, incoming: &Incoming, caller: &Caller) -> Option<&'a str> {
        self.required_scopes(incoming)?
            .iter()
            .find(|s| !caller.scopes.contains(*s))
            .map(String::as_str)
    }

    /// The authorization check every message passes: `Err` names what was
    /// refused (the tool for `tools/call`, else the method) and the first
    /// missing scope. Cheap and free of IO: transports call it before any
    /// work and render the refusal as their `insufficient_scope` answer;
    /// [`McpServer::handle_incoming`] calls it too.
    pub fn authorize(&self, incoming: &Incoming, caller: &Caller) -> Result<(), ScopeDenied> {
        let Some(scope) = self.missing_scope(incoming, caller) else {
            return Ok(());
        };
        let subject = incoming
            .tool_name()
            .or_else(|| incoming.method())
            .unwrap_or_default();
        Err(ScopeDenied {
            subject: subject.to_owned(),
            scope: scope.to_owned(),
        })
    }

    /// Parses and handles one message. `None` when nothing is to be sent
    /// back (notifications and client responses).
    ///
    /// The future is `Send`, so a multi-threaded runtime can run it as a
    /// task of its own (transport-http spawns it on tokio); it does no IO
    /// but the store's and the [`Sleeper`]'s. A
    /// single-client transport may as well block on it (transport-stdio).
    pub async fn handle(
        &self,
        session: &mut McpSession,
        caller: &Caller,
        bytes: &[u8],
    ) -> Option<Outgoing> {
        match Incoming::parse(bytes) {
            Ok(incoming) => self.handle_incoming(session, caller, incoming).await,
            Err(reply) => Some(*reply),
        }
    }

    /// Accepts a 2026-07-28 `subscriptions/listen` for task notifications
    /// (the tasks extension). A streaming transport sends
    /// [`TaskListen::acknowledged`] first, then a [`McpServer::task_notification`]
    /// for each watched task whenever the queue signals a change to it.
    pub async fn listen(
        &self,
        caller: &Caller,
        incoming: &Incoming,
    ) -> Result<TaskListen, Outgoing> {
        let id = incoming.id().cloned().unwrap_or(Value::Null);
        if let Err(denied) = self.authorize(incoming, caller) {
            return Err(denied.to_outgoing(Some(id)));
        }
        match self.era(&McpSession::new(), incoming) {
            Ok(Era::Modern) => tasks::listen(self, caller, incoming, &id).await,
            Ok(Era::Legacy(_)) => Err(Outgoing::error(
                Some(id),
                ErrorCode::MethodNotFound,
                "Method not found: `subscriptions/listen` exists only in protocol 2026-07-28"
                    .to_owned(),
                None,
            )),
            Err(reply) => Err(reply),
        }
    }

    /// The `notifications/tasks` message for a task of `caller`, and whether
    /// it is terminal; `None` for a task that is unknown or not the caller's.
    pub async fn task_notification(
        &self,
        caller: &Caller,
        id: &crate::ids::CommandId,
    ) -> Option<(Value, bool)> {
        tasks::notification(self, caller, id).await
    }

    /// Handles one parsed message (see [`McpServer::handle`]).
    /// Notifications the request would send before its result are dropped;
    /// a streaming transport calls [`McpServer::handle_notifying`].
    pub async fn handle_incoming(
        &self,
        session: &mut McpSession,
        caller: &Caller,
        incoming: Incoming,
    ) -> Option<Outgoing> {
        self.handle_notifying(session, caller, incoming, &NoNotifier)
            .await
    }

    /// True when handling `incoming` may send notifications before its
    /// result: a `tools/call` that carries `_meta.progressToken`. A
    /// streaming transport answers such a request with a stream (HTTP: an
    /// SSE response) and passes a [`Notifier`] to
    /// [`McpServer::handle_notifying`].
    pub fn may_notify(&self, incoming: &Incoming) -> bool {
        incoming.method() == Some("tools/call") && progress::token(incoming).is_some()
    }

    /// [`McpServer::handle_incoming`], sending the request's notifications
    /// (MCP progress of a waiting `get_graph_run`, see [`Notifier`]) to
    /// `notifier` as they happen, all before the result is returned.
    pub async fn handle_notifying(
        &self,
        session: &mut McpSession,
        caller: &Caller,
        incoming: Incoming,
        notifier: &dyn Notifier,
    ) -> Option<Outgoing> {
        let method_name = incoming.method().unwrap_or_default().to_owned();
        let id = match incoming.kind() {
            IncomingKind::Response => return None,
            IncomingKind::Notification => {
                take_notification(session, &method_name);
                return None;
            }
            IncomingKind::Request { id } => id.clone(),
        };
        // The authorization table decides first; a method it does not list
        // is never dispatched.
        let method = Method::parse(&method_name).filter(|m| *m != Method::Notification);
        if let Err(denied) = self.authorize(&incoming, caller) {
            return Some(denied.to_outgoing(Some(id)));
        }
        let era = match self.era(session, &incoming) {
            Ok(era) => era,
            Err(reply) => return Some(reply),
        };
        let result = match (method, era) {
            (Some(Method::Initialize), _) => {
                self.initialize(session, &id, &incoming).map(Answer::Value)
            }
            (Some(Method::Ping), Era::Legacy(_)) => {
                Ok(Answer::Value(wire::to_value(&wire::EmptyResult {})))
            }
            (Some(Method::ServerDiscover), Era::Modern) => Ok(Answer::Value(self.discover())),
            (Some(Method::ToolsList), _) => Ok(Answer::Rendered(if era == Era::Modern {
                self.inner.tools_list_rendered.modern.clone()
            } else {
                self.inner.tools_list_rendered.legacy.clone()
            })),
            (Some(Method::SubscriptionsListen), Era::Modern) => Err(Outgoing::error(
                Some(id.clone()),
                ErrorCode::MethodNotFound,
                "Method not found: `subscriptions/listen` needs a streaming transport (Streamable HTTP with text/event-stream)".to_owned(),
                None,
            )),
            (
                Some(Method::TasksGet | Method::TasksCancel | Method::TasksUpdate),
                Era::Modern,
            ) => tasks::handle(self, caller, &incoming, &id)
                .await
                .map(Answer::Value),
            (Some(Method::ToolsCall), _) => tools::call(
                self,
                caller,
                &incoming,
                self.version_of(era),
                era == Era::Modern && tasks::declared(&incoming),
                notifier,
            )
            .await
            .map_err(|e| e.into_outgoing(&id)),
            (_, era) => Err(method_not_found(&id, era, &method_name)),
        };
        Some(match result {
            Ok(answer) => self.reply(&id, era, answer),
            Err(reply) => reply,
        })
    }

    /// The reply carrying `answer` in `era`.
    fn reply(&self, id: &RequestId, era: Era, answer: Answer) -> Outgoing {
        self.revision(era).reply(id, &answer)
    }

    /// What `era` adds to every result.
    fn revision(&self, era: Era) -> Revision<'_> {
        match era {
            Era::Modern => Revision::Modern {
                meta: &self.inner.server_info_meta,
            },
            Era::Legacy(_) => Revision::Legacy,
        }
    }

    /// Decides how a request is handled, or refuses it.
    fn era(&self, session: &McpSession, incoming: &Incoming) -> Result<Era, Outgoing> {
        let id = incoming.id().cloned();
        if incoming.is_initialize() || session.version.is_some() {
            return Ok(Era::Legacy(session.version));
        }
        let (protocol_version, client_capabilities) = match incoming.meta_probe() {
            Some(MetaProbe::Object(members)) => {
                (&members.protocol_version, &members.client_capabilities)
            }
            Some(MetaProbe::NotObject) => {
                return Err(Outgoing::error(
                    id,
                    ErrorCode::InvalidParams,
                    "Invalid params: `_meta` must be an object".to_owned(),
                    None,
                )
                .with_status(400));
            }
            None => {
                if incoming.method() == Some("ping") {
                    // The initialize era allows ping before initialize.
                    return Ok(Era::Legacy(None));
                }
                return Err(missing_protocol_version(id));
            }
        };
        let requested = match protocol_version {
            Some(Value::String(v)) => v.as_str(),
            Some(_) => {
                return Err(Outgoing::error(
                    id,
                    ErrorCode::InvalidParams,
                    format!("Invalid params: `_meta.{META_PROTOCOL_VERSION}` must be a string"),
                    None,
                )
                .with_status(400));
            }
            None => {
                return Err(missing_protocol_version(id));
            }
        };
        if ProtocolVersion::parse(requested).is_none_or(|v| !v.is_modern()) {
            return Err(Outgoing::error(
                id,
                ErrorCode::UnsupportedProtocolVersion,
                "Unsupported protocol version".to_owned(),
                Some(unsupported_version_data(requested)),
            ));
        }
        if !client_capabilities.as_ref().is_some_and(Value::is_object) {
            return Err(Outgoing::error(
                id,
                ErrorCode::InvalidParams,
                format!(
                    "Invalid params: `_meta.{META_CLIENT_CAPABILITIES}` is required (an object, `{{}}` when the client has none)"
                ),
                None,
            )
            .with_status(400));
        }
        Ok(Era::Modern)
    }

    fn version_of(&self, era: Era) -> ProtocolVersion {
        match era {
            Era::Modern => ProtocolVersion::V2026_07_28,
            Era::Legacy(v) => v.unwrap_or(ProtocolVersion::LATEST_LEGACY),
        }
    }

    fn initialize(
        &self,
        session: &mut McpSession,
        id: &RequestId,
        incoming: &Incoming,
    ) -> Result<Value, Outgoing> {
        if session.version.is_some() {
            return Err(Outgoing::error(
                Some(id.clone()),
                ErrorCode::InvalidRequest,
                "Invalid request: this session is already initialized; open a new connection or session to initialize again".to_owned(),
                None,
            ));
        }
        let Some(requested) = incoming.protocol_version_param().and_then(Value::as_str) else {
            return Err(Outgoing::error(
                Some(id.clone()),
                ErrorCode::InvalidParams,
                "Invalid params: `initialize` needs `protocolVersion` (a string)".to_owned(),
                None,
            ));
        };
        // Echo a supported initialize-era version; counter-offer otherwise.
        let version = ProtocolVersion::parse(requested)
            .filter(|v| !v.is_modern())
            .unwrap_or(ProtocolVersion::LATEST_LEGACY);
        // Bounded before anything is kept: a session holds at most this much.
        // (Measured as the message was read: a field too large to keep
        // was not built.)
        let mut client_info = None;
        for (field, member) in [
            ("clientInfo", incoming.client_info()),
            ("capabilities", incoming.capabilities()),
        ] {
            let value = match member {
                None => continue,
                Some(jsonrpc::Limited::Within(value)) => value,
                Some(jsonrpc::Limited::TooLarge) => {
                    return Err(Outgoing::error(
                        Some(id.clone()),
                        ErrorCode::InvalidParams,
                        format!(
                            "Invalid params: `{field}` is larger than {MAX_INITIALIZE_FIELD_BYTES} bytes (16 KiB) as JSON, the most this server accepts in `initialize`"
                        ),
                        Some(wire::to_value(&wire::FieldLimitData {
                            field: field.to_owned(),
                            limit: MAX_INITIALIZE_FIELD_BYTES,
                        })),
                    ));
                }
            };
            if field == "clientInfo" {
                client_info = Some(value.to_string().into_boxed_str());
            }
        }
        session.version = Some(version);
        session.initialized = false;
        session.client_info = client_info;
        Ok(wire::to_value(&wire::InitializeResult {
            capabilities: wire::ServerCapabilities {
                extensions: None,
                tools: wire::ToolsCapability {
                    list_changed: false,
                },
            },
            instructions: self.inner.info.instructions.clone(),
            protocol_version: version.as_str().to_owned(),
            server_info: self.inner.info.implementation(),
        }))
    }

    fn discover(&self) -> Value {
        wire::to_value(&wire::DiscoverResult {
            cache_scope: "public".to_owned(),
            capabilities: wire::ServerCapabilities {
                extensions: Some([(TASKS_EXTENSION.to_owned(), Value::Object(Map::new()))].into()),
                tools: wire::ToolsCapability {
                    list_changed: false,
                },
            },
            instructions: self.inner.info.instructions.clone(),
            supported_versions: vec![ProtocolVersion::V2026_07_28.as_str().to_owned()],
            ttl_ms: self.inner.list_ttl_ms,
        })
    }

    /// The `tools/list` result of `era`, rendered once (in
    /// [`McpServer::new`]): it is the same for every caller.
    fn render_tools_list(&self, era: Era) -> Arc<[u8]> {
        let modern = era == Era::Modern;
        let list = wire::ListToolsResult {
            // The catalog is the same for every caller.
            cache_scope: modern.then(|| "public".to_owned()),
            tools: self.inner.tools_list.clone(),
            ttl_ms: modern.then_some(self.inner.list_ttl_ms),
        };
        self.revision(era)
            .render(&Answer::Value(wire::to_value(&list)))
    }
}

#[cfg(test)]
mod replies;
#[cfg(test)]
mod tests;

// The refusal is the authorization table's decision; its JSON-RPC form is
// this module's.
impl ScopeDenied {
    /// The JSON-RPC answer to request `id`: `-32003` naming the scope, with
    /// `data: {error: "insufficient_scope", scope, subject}` and HTTP 403.
    pub fn to_outgoing(&self, id: Option<RequestId>) -> Outgoing {
        Outgoing::error(
            id,
            ErrorCode::InsufficientScope,
            self.to_string(),
            Some(
                json!({"error": "insufficient_scope", "scope": self.scope, "subject": self.subject}),
            ),
        )
    }
}

/// The refusal of a request that carries no `_meta` protocol version and
/// is not inside an initialize-era session.
fn missing_protocol_version(id: Option<Value>) -> Outgoing {
    Outgoing::error(
        id,
        ErrorCode::InvalidParams,
        format!(
            "Invalid params: missing `_meta.{META_PROTOCOL_VERSION}`; send `initialize` first (protocol 2025-11-25 and earlier) or carry the per-request fields of 2026-07-28"
        ),
        None,
    )
    .with_status(400)
}

/// Takes a notification: they need no scope (see `crate::authz`), and only
/// `notifications/initialized` changes anything, completing the session's
/// handshake. The others (cancelled, progress, roots) need no action: every
/// request is answered at once.
fn take_notification(session: &mut McpSession, method: &str) {
    if method == "notifications/initialized" && session.version.is_some() {
        session.initialized = true;
    }
}

/// The refusal of a method this server does not offer in `era`: a 2026-07-28
/// request also gets HTTP 404.
fn method_not_found(id: &RequestId, era: Era, method: &str) -> Outgoing {
    match era {
        Era::Modern => Outgoing::error(
            Some(id.clone()),
            ErrorCode::MethodNotFound,
            format!("Method not found: `{method}` does not exist in protocol 2026-07-28"),
            None,
        )
        .with_status(404),
        Era::Legacy(_) => Outgoing::error(
            Some(id.clone()),
            ErrorCode::MethodNotFound,
            format!("Method not found: `{method}`"),
            None,
        ),
    }
}
