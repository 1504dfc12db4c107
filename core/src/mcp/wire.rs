//! The typed wire model: every reply an agent can get, as serde types.
//!
//! Modelled on rmcp's `model.rs`: `camelCase` MCP fields,
//! `skip_serializing_if` for what is optional, and a wire error
//! ([`ErrorObject`]) separate from the Rust error enums.
//!
//! Fields are declared in the lexicographic order of their wire names, so a
//! value serializes to the same bytes whether it is written directly or
//! through a [`serde_json::Value`] (whose objects keep keys sorted).
//! Snapshot tests pin every reply an agent can get (`core/src/mcp/snapshots`;
//! the transports' own refusals in `transport-http/tests/snapshots` and
//! `transport-stdio/src/snapshots`), and tests decode each of them with
//! rmcp's model types.
//!
//! Tool results carry the snake_case structured content the tools published
//! ([`GraphRunTicket`], [`GraphRun`], [`SessionList`]); the MCP envelope
//! around them is camelCase.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::command::{CommandRecord, CommandStatus};
use crate::ids::{CommandId, ExecutionId, GraphSessionId, ProjectId};
use crate::queue::{RunTicket, RunView, SessionList as QueueSessionList};

/// The JSON-RPC version every message carries.
pub const JSONRPC_VERSION: &str = "2.0";

fn is_false(b: &bool) -> bool {
    !*b
}

/// Reads a present field as `Some`, even when it is `null`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

// ---------------------------------------------------------------------------
// JSON-RPC envelopes
// ---------------------------------------------------------------------------

/// A JSON-RPC response carrying a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonRpcResponse<R = Value> {
    /// The request's id.
    pub id: Value,
    /// Always `"2.0"`.
    pub jsonrpc: String,
    /// The method's result.
    pub result: R,
}

impl<R> JsonRpcResponse<R> {
    /// A response to request `id`.
    pub fn new(id: Value, result: R) -> Self {
        Self {
            id,
            jsonrpc: JSONRPC_VERSION.to_owned(),
            result,
        }
    }
}

/// A JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonRpcErrorResponse {
    /// What went wrong.
    pub error: ErrorObject,
    /// The request's id (`null` when it could not be read).
    pub id: Value,
    /// Always `"2.0"`.
    pub jsonrpc: String,
}

impl JsonRpcErrorResponse {
    /// An error response to request `id` (`None`: `null`).
    pub fn new(id: Option<Value>, error: ErrorObject) -> Self {
        Self {
            error,
            id: id.unwrap_or(Value::Null),
            jsonrpc: JSONRPC_VERSION.to_owned(),
        }
    }
}

/// The `error` member of a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// The JSON-RPC error code.
    pub code: i64,
    /// Structured details, when the error has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// A sentence naming the problem.
    pub message: String,
}

/// The `data` of `-32022` (unsupported protocol version).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsupportedVersionData {
    /// The version the request carried.
    pub requested: String,
    /// The versions this server speaks.
    pub supported: Vec<String>,
}

/// The `data` of `-32021` (missing required client capability).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MissingCapabilityData {
    /// The capabilities the request must declare.
    pub required_capabilities: RequiredCapabilities,
}

/// Client capabilities a request must declare.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequiredCapabilities {
    /// Extensions by identifier, each with its (empty) settings.
    pub extensions: BTreeMap<String, Value>,
}

impl MissingCapabilityData {
    /// The data naming one required extension.
    pub fn extension(id: &str) -> Self {
        Self {
            required_capabilities: RequiredCapabilities {
                extensions: [(id.to_owned(), Value::Object(serde_json::Map::new()))].into(),
            },
        }
    }
}

/// The `data` of an error that is worth retrying: the queue's store could
/// not serve the request, and the same request may succeed later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryableData {
    /// Always true.
    pub retryable: bool,
    /// How long to wait before trying again.
    pub retry_after_seconds: u64,
}

/// The `data` of an error about a field over its limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldLimitData {
    /// The field.
    pub field: String,
    /// Its limit.
    pub limit: usize,
}

/// The `data` of the error a line-delimited transport (stdio) answers an
/// over-long line with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LineLimitData {
    /// The most bytes one line may have.
    pub max_line_bytes: usize,
}

/// A JSON-RPC notification from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonRpcNotification<P = Value> {
    /// Always `"2.0"`.
    pub jsonrpc: String,
    /// The notification's method.
    pub method: String,
    /// Its parameters.
    pub params: P,
}

impl<P> JsonRpcNotification<P> {
    /// A notification `method` with `params`.
    pub fn new(method: &str, params: P) -> Self {
        Self {
            jsonrpc: JSONRPC_VERSION.to_owned(),
            method: method.to_owned(),
            params,
        }
    }
}

/// The parameters of `notifications/progress`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressParams {
    /// The run's status as a sentence.
    pub message: String,
    /// Always above the last value sent for the token.
    pub progress: f64,
    /// The request's `_meta.progressToken`.
    pub progress_token: Value,
    /// `100` when `progress` is a percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u32>,
}

/// The empty result (`ping`, `tasks/cancel`, `tasks/update`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmptyResult {}

// ---------------------------------------------------------------------------
// initialize, server/discover, tools/list
// ---------------------------------------------------------------------------

/// Name and version of an implementation (`serverInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Implementation {
    /// Implementation name, e.g. `graph-relay`.
    pub name: String,
    /// Implementation version.
    pub version: String,
}

/// The `tools` capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolsCapability {
    /// Whether the server sends `notifications/tools/list_changed` (never).
    pub list_changed: bool,
}

/// What the server can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerCapabilities {
    /// Extensions by identifier (2026-07-28: the tasks extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<BTreeMap<String, Value>>,
    /// Tools.
    pub tools: ToolsCapability,
}

/// The result of `initialize` (protocols 2025-03-26 to 2025-11-25).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// What the server can do.
    pub capabilities: ServerCapabilities,
    /// Instructions for the model, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The negotiated version.
    pub protocol_version: String,
    /// The server's name and version.
    pub server_info: Implementation,
}

/// The result of `server/discover` (2026-07-28).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverResult {
    /// Who may cache it (`public`).
    pub cache_scope: String,
    /// What the server can do.
    pub capabilities: ServerCapabilities,
    /// Instructions for the model, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Protocol versions of the per-request era this server speaks.
    pub supported_versions: Vec<String>,
    /// How long it may be cached, in milliseconds.
    pub ttl_ms: u64,
}

/// One tool of `tools/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    /// Hints about what calling it does.
    pub annotations: ToolAnnotations,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: Value,
    /// Its name.
    pub name: String,
    /// The OAuth2 scopes a call needs.
    pub security_schemes: Vec<SecurityScheme>,
}

/// The behaviour hints of a [`Tool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// It may destroy or change data (absent for read-only tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling it twice has no further effect (absent when unstated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// It only reads.
    pub read_only_hint: bool,
}

/// How a [`Tool`] is authorized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityScheme {
    /// The scopes it needs.
    pub scopes: Vec<String>,
    /// Always `"oauth2"`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// The result of `tools/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListToolsResult {
    /// Who may cache it (2026-07-28 only: `public`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_scope: Option<String>,
    /// The tool definitions ([`crate::catalog::ToolCatalog::tool_definitions`]).
    pub tools: Vec<Tool>,
    /// How long it may be cached, in milliseconds (2026-07-28 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

// ---------------------------------------------------------------------------
// tools/call
// ---------------------------------------------------------------------------

/// One content block of a tool result: always text here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextContent {
    /// The text.
    pub text: String,
    /// Always `"text"`.
    #[serde(rename = "type")]
    pub kind: String,
}

impl TextContent {
    /// A text block.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            kind: "text".to_owned(),
        }
    }
}

/// The result of `tools/call`: a success with structured content, or a tool
/// execution error (`isError: true`) whose text names the problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolResult {
    /// The text for the model.
    pub content: Vec<TextContent>,
    /// True for a tool execution error.
    pub is_error: bool,
    /// The same answer as a JSON object (2025-06-18 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<ToolOutput>,
}

impl CallToolResult {
    /// A tool execution error with `text`.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![TextContent::new(text)],
            is_error: true,
            structured_content: None,
        }
    }

    /// A success: `text`, and `structured` when the revision has structured content.
    pub fn success(text: String, structured: Option<ToolOutput>) -> Self {
        Self {
            content: vec![TextContent::new(text)],
            is_error: false,
            structured_content: structured,
        }
    }

    /// A result whose text is the compact JSON of `structured`, which it
    /// carries as structured content too when `with_structured` (the
    /// revision has structured content).
    pub fn of_output(structured: ToolOutput, is_error: bool, with_structured: bool) -> Self {
        let text = to_json(&structured);
        Self {
            content: vec![TextContent::new(text)],
            is_error,
            structured_content: with_structured.then_some(structured),
        }
    }
}

/// The structured content of a tool's success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolOutput {
    /// `run_graph_session`.
    Ticket(GraphRunTicket),
    /// `list_graph_sessions`.
    Sessions(SessionList),
    /// `get_graph_run` and `cancel_graph_run`.
    Run(Box<GraphRun>),
}

/// The ticket `run_graph_session` returns: the run is queued, not done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphRunTicket {
    /// The command: the ticket.
    pub command_id: CommandId,
    /// The session it runs.
    pub graph_session_id: GraphSessionId,
    /// A sentence for the model: this is a ticket, and which tool reads the result.
    pub message: String,
    /// When to call `get_graph_run` first.
    pub poll_after_seconds: u64,
    /// The project it is filed under.
    pub project_id: ProjectId,
    /// True when the key had been used already and no run was queued.
    pub replayed: bool,
    /// The command's status.
    pub status: CommandStatus,
}

impl From<&RunTicket> for GraphRunTicket {
    fn from(ticket: &RunTicket) -> Self {
        let c = &ticket.command;
        Self {
            command_id: c.id,
            graph_session_id: c.graph_session_id.clone(),
            message: ticket.message(),
            poll_after_seconds: ticket.poll_after_seconds,
            project_id: c.project.clone(),
            replayed: ticket.replayed,
            status: c.status,
        }
    }
}

/// A run as its agent sees it (`get_graph_run`, `cancel_graph_run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphRun {
    /// Present (true) once a running run was asked to cancel.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cancel_requested: bool,
    /// The command.
    pub command_id: CommandId,
    /// When it was queued (RFC 3339).
    pub created_at: String,
    /// Set when a queued run's desktop looks offline: since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_offline_since: Option<String>,
    /// Why it failed or was cancelled, or the Graph's own error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The desktop engine's execution id, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<ExecutionId>,
    /// When it ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The session it runs.
    pub graph_session_id: GraphSessionId,
    /// When to look again; absent once terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_after_seconds: Option<u64>,
    /// The latest progress report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RunProgress>,
    /// The project it is filed under.
    pub project_id: ProjectId,
    /// The cost the desktop reported (`null` when it reported none).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub reported_cost: Option<Option<f64>>,
    /// The Graph's result (completed or failed, when it fit the envelope).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub result: Option<Value>,
    /// Present (true) when the result did not fit the envelope.
    #[serde(default, skip_serializing_if = "is_false")]
    pub result_truncated: bool,
    /// When the desktop started it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// The command's status.
    pub status: CommandStatus,
    /// What the run is doing, when its status alone would mislead: only
    /// while a `running` run waits for the owner's approval on the desktop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// The tokens the desktop reported (`null` when it reported none).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub total_tokens: Option<Option<u64>>,
}

impl From<&RunView> for GraphRun {
    fn from(view: &RunView) -> Self {
        let c: &CommandRecord = &view.command;
        let mut run = Self {
            cancel_requested: c.cancel_requested,
            command_id: c.id,
            created_at: c.created_at.to_rfc3339(),
            device_offline_since: view.device_offline_since.map(|t| t.to_rfc3339()),
            error: None,
            execution_id: c.execution_id.clone(),
            finished_at: c.finished_at.map(|t| t.to_rfc3339()),
            graph_session_id: c.graph_session_id.clone(),
            poll_after_seconds: view.poll_after_seconds,
            progress: c.progress.as_ref().map(|p| RunProgress {
                message: p.message.clone(),
                percent: p.percent,
                updated_at: p.updated_at.to_rfc3339(),
            }),
            project_id: c.project.clone(),
            reported_cost: None,
            result: None,
            result_truncated: false,
            started_at: c.started_at.map(|t| t.to_rfc3339()),
            status: c.status,
            status_message: c
                .awaits_approval()
                .then(|| super::tasks::AWAITING_APPROVAL.to_owned()),
            total_tokens: None,
        };
        if c.status.is_terminal() {
            let body = c.completion.as_ref().map(|env| env.body.as_deref());
            if c.status != CommandStatus::Cancelled {
                match body {
                    Some(None) => run.result_truncated = true,
                    Some(Some(body)) => {
                        run.result = Some(body.result.clone());
                        run.total_tokens = Some(body.total_tokens);
                        run.reported_cost = Some(body.reported_cost);
                        run.error.clone_from(&body.error);
                    }
                    None => {}
                }
            }
            // The queue's reason wins; a cancelled run shows its Graph's error otherwise.
            let cancelled_error = body
                .flatten()
                .and_then(|b| b.error.as_ref())
                .filter(|_| c.status == CommandStatus::Cancelled);
            if let Some(reason) = c.reason.as_ref().or(cancelled_error) {
                run.error = Some(reason.clone());
            }
        }
        run
    }
}

/// A progress report as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunProgress {
    /// A short text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How far, from 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// When the server recorded it (RFC 3339).
    pub updated_at: String,
}

/// The sessions of one project (`list_graph_sessions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionList {
    /// The project.
    pub project_id: ProjectId,
    /// What the relays' last syncs uploaded.
    pub sessions: Vec<SessionEntry>,
}

impl From<&QueueSessionList> for SessionList {
    fn from(list: &QueueSessionList) -> Self {
        Self {
            project_id: list.project.clone(),
            sessions: list
                .sessions
                .iter()
                .map(|s| SessionEntry {
                    description: s.meta.description.to_string(),
                    graph_session_id: s.meta.graph_session_id.clone(),
                    name: s.meta.name.to_string(),
                    slug: s.meta.slug.to_string(),
                    status: s.meta.status.to_string(),
                    synced_at: s.synced_at.to_rfc3339(),
                    version: s.meta.version.to_string(),
                })
                .collect(),
        }
    }
}

/// One shared session in [`SessionList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEntry {
    /// Its description.
    pub description: String,
    /// Its id.
    pub graph_session_id: GraphSessionId,
    /// Its name.
    pub name: String,
    /// Its slug.
    pub slug: String,
    /// Its status on the desktop.
    pub status: String,
    /// When the relay last uploaded it (RFC 3339).
    pub synced_at: String,
    /// Its version.
    pub version: String,
}

// ---------------------------------------------------------------------------
// The tasks extension (2026-07-28)
// ---------------------------------------------------------------------------

/// A task (the tasks extension): a run seen as a task whose id is the
/// command id. `tasks/get`, `notifications/tasks` and `CreateTaskResult`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When anything about it last changed (RFC 3339).
    pub last_updated_at: String,
    /// How often to poll, in milliseconds; absent once terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_ms: Option<u64>,
    /// The tool result, once completed or failed (`DetailedTask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CallToolResult>,
    /// `"task"` in a `CreateTaskResult`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_type: Option<String>,
    /// `working`, `completed` or `cancelled`.
    pub status: String,
    /// A sentence about the status.
    pub status_message: String,
    /// The command id.
    pub task_id: CommandId,
    /// How long it is kept: always `null` (unbounded by this server).
    pub ttl_ms: Option<u64>,
}

/// The parameters of `notifications/subscriptions/acknowledged`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListenAcknowledged {
    /// What the stream will notify about.
    pub notifications: ListenNotifications,
}

/// The notifications a listen stream carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenNotifications {
    /// The tasks it watches.
    pub task_ids: Vec<CommandId>,
}

/// Serializes a wire value straight to compact JSON text: the same text as
/// `to_value(value).to_string()`, because wire types declare their fields
/// in the lexicographic order of their wire names, without the [`Value`].
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("wire types serialize to JSON")
}

/// [`to_json`] as bytes, into a buffer sized for a run (no regrowth on the
/// way for most).
pub(crate) fn to_json_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(512);
    serde_json::to_writer(&mut bytes, value).expect("wire types serialize to JSON");
    bytes
}

/// Serializes a wire value into a [`Value`].
///
/// The wire types hold only strings, numbers, ids and maps with string keys,
/// so this cannot fail.
pub fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("wire types serialize to JSON")
}

// ---------------------------------------------------------------------------
// The queue's answers, rendered (kept here: rendering is the wire's job)
// ---------------------------------------------------------------------------

impl RunTicket {
    /// The structured result of `run_graph_session`.
    pub fn to_json(&self) -> Value {
        to_value(&GraphRunTicket::from(self))
    }
}

impl RunView {
    /// The structured result of `get_graph_run`.
    pub fn to_json(&self) -> Value {
        to_value(&GraphRun::from(self))
    }
}

impl QueueSessionList {
    /// The structured result of `list_graph_sessions`.
    pub fn to_json(&self) -> Value {
        to_value(&SessionList::from(self))
    }
}
