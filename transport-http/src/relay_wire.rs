//! The relay HTTP API on the wire: paths, bodies and the OpenAPI document.
//!
//! Shared by the server handlers ([`crate::relay_api`]) and the relay's
//! client ([`crate::relay_http`]), so both sides agree by construction.
//! [`openapi`] describes every body; the server serves it at
//! [`OPENAPI_PATH`] and the repository keeps a copy in
//! `transport-http/relay-api.openapi.json` that a test compares with it.
//!
//! | method | path (under [`RELAY_PREFIX`]) | body | answer |
//! |---|---|---|---|
//! | POST | `/sync` | [`SyncBody`] | [`SyncReply`] |
//! | POST | `/commands/{command_id}/start` | [`StartBody`] | [`StartReply`] |
//! | POST | `/commands/{command_id}/control` | [`ControlBody`] | [`ControlReply`] |
//! | POST | `/commands/{command_id}/complete` | the result envelope (SPEC §7) | [`ReportReply`] |
//! | POST | `/commands/{command_id}/decline` | `{}` | [`ReportReply`] |
//! | POST | `/commands/{command_id}/progress` | [`ProgressBody`] | [`ProgressReply`] |
//! | GET | `/openapi.json` | | this document |
//!
//! Every refusal is an [`ErrorReply`] with `retryable` telling the relay
//! whether sending the same request again can ever succeed.

use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{AgentId, CommandId, ExecutionId, GraphSessionId, ProjectId};
use graph_relay_core::limits;
use graph_relay_core::relay::RelayCommand;
use graph_relay_core::session::SessionMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Prefix of every relay route.
pub const RELAY_PREFIX: &str = "/external-assistants/graph-relays";
/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/external-assistants/graph-relays/openapi.json";

/// The path of the sync route.
pub fn sync_path() -> String {
    format!("{RELAY_PREFIX}/sync")
}

/// The path of a per-command route (`start`, `control`, `complete`,
/// `decline`, `progress`).
pub fn command_path(command: &CommandId, verb: &str) -> String {
    format!("{RELAY_PREFIX}/commands/{command}/{verb}")
}

/// `POST /sync`: the sessions shared to one project; asks for its queued commands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncBody {
    /// The project the owner enabled on the desktop.
    pub project_id: ProjectId,
    /// The sessions shared to it (at most 100).
    #[serde(default)]
    pub sessions: Vec<SessionMeta>,
    /// Hold the request until work is queued for this device (or the hold bound passes).
    #[serde(default)]
    pub long_poll: bool,
    /// True on the first syncs a relay process sends after it started, until
    /// one succeeded: the server then ends this device's running commands
    /// other than `running_command_id` (they died with the previous process).
    #[serde(default)]
    pub restarted: bool,
    /// The command the relay is executing right now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_command_id: Option<CommandId>,
}

/// One queued command as a sync hands it out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireCommand {
    /// The ticket.
    pub command_id: CommandId,
    /// The saved Graph to run.
    pub graph_session_id: GraphSessionId,
    /// The project it was filed under.
    pub project_id: ProjectId,
    /// Input for the Graph.
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// The session's slug when the run was queued.
    #[serde(default)]
    pub slug: String,
    /// `graph:external:<command id>`.
    pub channel: String,
    /// The agent that queued the run (its name under the device's owner),
    /// for the owner's console. Optional on the wire: a server from before
    /// this field sends none, and a relay from before it ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
}

impl WireCommand {
    /// The wire form of a queued command.
    pub fn from_record(c: &CommandRecord) -> Self {
        Self {
            command_id: c.id,
            graph_session_id: c.graph_session_id.clone(),
            project_id: c.project.clone(),
            arguments: (*c.arguments).clone(),
            slug: c.slug.to_string(),
            channel: c.id.channel(),
            agent_id: Some(c.agent.clone()),
        }
    }

    /// What the relay state machine consumes.
    pub fn into_relay_command(self) -> RelayCommand {
        RelayCommand {
            id: self.command_id,
            project: self.project_id,
            graph_session_id: self.graph_session_id,
            arguments: self.arguments,
            slug: self.slug,
            agent: self.agent_id,
        }
    }
}

/// The answer to a sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncReply {
    /// Queued commands of the project for this device, oldest first.
    pub commands: Vec<WireCommand>,
    /// When to sync again if nothing changes (0 for a long-poll sync).
    pub poll_after_seconds: u64,
}

/// `POST /commands/{id}/start`: claim the command under an execution id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The execution id the relay will run it under.
    pub execution_id: ExecutionId,
}

/// The command is running under the execution id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartReply {
    /// The command.
    pub command_id: CommandId,
    /// Always `running`.
    pub status: String,
    /// The execution id it runs under.
    pub execution_id: ExecutionId,
}

/// `POST /commands/{id}/control`: did the agent cancel?
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlBody {
    /// Hold the request until cancellation is requested (or the hold bound passes).
    #[serde(default)]
    pub long_poll: bool,
}

/// `POST /commands/{id}/decline`: the re-check failed; an empty object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclineBody {}

/// The answer to a control request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlReply {
    /// The agent asked to cancel: stop the execution.
    pub cancel_requested: bool,
    /// The command's status now.
    pub status: String,
}

/// A completion or decline was recorded, or changed nothing because the
/// command was already closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportReply {
    /// The command's status now.
    pub status: String,
    /// True when the report changed nothing: the same report had been
    /// recorded before, or (decline) the command was already closed.
    pub duplicate: bool,
    /// When nothing changed, what the command's state already was, for the
    /// relay's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /commands/{id}/progress`: how far the running Graph got. Both
/// `message` (at most [`MAX_PROGRESS_MESSAGE`](graph_relay_core::limits::MAX_PROGRESS_MESSAGE)
/// characters) and `percent` (0 to 100) are optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressBody {
    /// The execution the report is about; a report of another execution is refused.
    pub execution_id: ExecutionId,
    /// A short text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How far, from 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
}

/// A progress report was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressReply {
    /// Always `running`: progress is taken only while the command runs.
    pub status: String,
    /// `recorded` (written, the agent sees it now), `coalesced` (kept and
    /// written within the server's progress interval, 1 s, unless a newer
    /// report replaces it) or `unchanged` (the same as the one recorded).
    pub recorded: String,
}

/// Every refusal of the relay API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// A stable code, e.g. `command_not_found`, `completion_refused`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// False: the same request can never succeed (drop it); true: try again later.
    pub retryable: bool,
}

/// The OpenAPI 3.1 document of the relay API.
pub fn openapi() -> Value {
    let mut schemas = exchange_schemas();
    schemas.extend(report_schemas());
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "graph-relay relay API",
            "version": "1",
            "description": "The HTTP API a desktop relay uses to pull queued Graph runs, claim them, poll for cancellation and report results. Every request carries `Authorization: Bearer <device token>`; a device sees only its own owner's projects and the commands assigned to it."
        },
        "components": {
            "securitySchemes": {"deviceToken": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "security": [{"deviceToken": []}],
        "paths": paths(),
    })
}

/// A JSON string.
fn string() -> Value {
    json!({"type": "string"})
}

/// A command's status.
fn status() -> Value {
    json!({"type": "string", "enum": ["queued", "running", "completed", "failed", "cancelled"]})
}

/// The members of `value`, an object literal.
fn members(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(members) => members,
        _ => Map::new(),
    }
}

/// The schemas of syncing, claiming and controlling a command.
fn exchange_schemas() -> Map<String, Value> {
    let (string, status) = (string(), status());
    members(json!({
        "SessionMeta": {
            "type": "object",
            "additionalProperties": false,
            "required": ["graph_session_id", "name", "slug"],
            "properties": {
                "graph_session_id": {"type": "string", "pattern": "^gs_[0-9a-f]{32}$"},
                "name": {"type": "string", "minLength": 1, "maxLength": limits::MAX_SESSION_NAME_CHARS},
                "description": {"type": "string", "maxLength": limits::MAX_SESSION_DESCRIPTION_CHARS},
                "slug": {"type": "string", "minLength": 1, "maxLength": limits::MAX_SESSION_SLUG_CHARS},
                "version": {"type": "string", "maxLength": limits::MAX_SESSION_LABEL_CHARS},
                "status": {"type": "string", "maxLength": limits::MAX_SESSION_LABEL_CHARS}
            }
        },
        "SyncBody": {
            "type": "object",
            "additionalProperties": false,
            "required": ["project_id"],
            "properties": {
                "project_id": string,
                "sessions": {"type": "array", "maxItems": limits::MAX_SESSIONS_PER_SYNC, "items": {"$ref": "#/components/schemas/SessionMeta"}},
                "long_poll": {"type": "boolean", "default": false, "description": "Hold the request until a command is queued for this device or the hold bound (25 s by default) passes."},
                "restarted": {"type": "boolean", "default": false, "description": "True on the first syncs a relay process sends after it started, until one succeeded: the server ends this device's running commands other than running_command_id at once (they died with the previous process)."},
                "running_command_id": {"type": "string", "format": "uuid", "description": "The command the relay is executing right now; absent when it runs nothing."}
            }
        },
        "Command": {
            "type": "object",
            "required": ["command_id", "graph_session_id", "project_id", "arguments", "slug", "channel"],
            "properties": {
                "command_id": {"type": "string", "format": "uuid"},
                "graph_session_id": {"type": "string", "pattern": "^gs_[0-9a-f]{32}$"},
                "project_id": string,
                "arguments": {"type": "object"},
                "slug": string,
                "channel": {"type": "string", "description": "graph:external:<command id>"},
                "agent_id": {"type": "string", "description": "The agent that queued the run (its name under the device's owner), for the owner's eyes on the desktop. Optional: a server from before this field sends none."}
            }
        },
        "SyncReply": {
            "type": "object",
            "required": ["commands", "poll_after_seconds"],
            "properties": {
                "commands": {"type": "array", "items": {"$ref": "#/components/schemas/Command"}},
                "poll_after_seconds": {"type": "integer", "minimum": 0}
            }
        },
        "StartBody": {
            "type": "object",
            "additionalProperties": false,
            "required": ["execution_id"],
            "properties": {"execution_id": string}
        },
        "StartReply": {
            "type": "object",
            "required": ["command_id", "status", "execution_id"],
            "properties": {"command_id": {"type": "string", "format": "uuid"}, "status": {"const": "running"}, "execution_id": string}
        },
        "ControlBody": {
            "type": "object",
            "additionalProperties": false,
            "properties": {"long_poll": {"type": "boolean", "default": false, "description": "Hold the request until the agent cancels, the command ends, or the hold bound passes."}}
        },
        "ControlReply": {
            "type": "object",
            "required": ["cancel_requested", "status"],
            "properties": {"cancel_requested": {"type": "boolean"}, "status": status}
        }
    }))
}

/// The schemas of reporting on a command, and of refusals.
fn report_schemas() -> Map<String, Value> {
    let (string, status) = (string(), status());
    members(json!({
        "ResultEnvelope": {
            "description": format!("SPEC §7: the full form when its compact JSON is at most {} UTF-16 code units, otherwise the truncated form. `error` is at most {} UTF-16 code units.", group(limits::RESULT_LIMIT), group(limits::ERROR_LIMIT)),
            "oneOf": [
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["execution_id", "status"],
                    "properties": {
                        "execution_id": string,
                        "status": {"type": "string", "enum": ["completed", "failed", "cancelled"]},
                        "result": {"description": "The Graph's output; `null` when absent (the relay always sends it)."},
                        "total_tokens": {"type": ["integer", "null"], "minimum": 0, "description": "`null` when absent."},
                        "reported_cost": {"type": ["number", "null"], "description": "`null` when absent."},
                        "error": {"type": "string"}
                    }
                },
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["execution_id", "status", "result_truncated"],
                    "properties": {
                        "execution_id": string,
                        "status": {"type": "string", "enum": ["completed", "failed", "cancelled"]},
                        "result_truncated": {"const": true}
                    }
                }
            ]
        },
        "DeclineBody": {"type": "object", "additionalProperties": false, "properties": {}},
        "ReportReply": {
            "type": "object",
            "required": ["status", "duplicate"],
            "properties": {"status": status, "duplicate": {"type": "boolean"}, "message": string}
        },
        "ProgressBody": {
            "type": "object",
            "additionalProperties": false,
            "required": ["execution_id"],
            "properties": {
                "execution_id": string,
                "message": {"type": "string", "maxLength": limits::MAX_PROGRESS_MESSAGE, "description": format!("At most {} characters.", limits::MAX_PROGRESS_MESSAGE)},
                "percent": {"type": "number", "minimum": 0, "maximum": 100}
            }
        },
        "ProgressReply": {
            "type": "object",
            "required": ["status", "recorded"],
            "properties": {
                "status": {"const": "running"},
                "recorded": {"type": "string", "enum": ["recorded", "coalesced", "unchanged"], "description": "recorded: written, the agent sees it now; coalesced: kept, and written within the server's progress interval (1 s) unless a newer report replaces it; unchanged: the same report as the one recorded."}
            }
        },
        "BearerError": {
            "type": "object",
            "required": ["error", "error_description"],
            "properties": {
                "error": {"type": "string", "description": "unauthorized (no token), invalid_token, or an OAuth2 error code such as temporarily_unavailable"},
                "error_description": string
            }
        },
        "ErrorReply": {
            "type": "object",
            "required": ["error", "message", "retryable"],
            "properties": {
                "error": {"type": "string", "description": "invalid_json, invalid_request, invalid_sessions, too_many_projects, invalid_envelope, invalid_progress, command_not_found, start_refused, not_started, run_closed, completion_refused, decline_refused, progress_refused, device_token_required, payload_too_large, store_unavailable"},
                "message": string,
                "retryable": {"type": "boolean", "description": "false: the same request can never succeed; a relay drops the report and logs the message"}
            }
        }
    }))
}

/// A refusal of the relay API ([`ErrorReply`]), described as `text`.
fn refusal(text: &str) -> Value {
    json!({"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}})
}

/// A success whose body is schema `schema`, described as `text`.
fn success(schema: &str, text: &str) -> Value {
    json!({"description": text, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

/// A request body of schema `schema`.
fn request_body(schema: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

/// A refusal of the bearer check: an OAuth2 error (RFC 6750),
/// `{error, error_description}`.
fn bearer_refusal(text: &str) -> Value {
    json!({"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BearerError"}}}})
}

/// A refusal that is either the relay API's or the bearer check's.
fn either_refusal(text: &str) -> Value {
    json!({"description": text, "content": {"application/json": {"schema": {"anyOf": [{"$ref": "#/components/schemas/ErrorReply"}, {"$ref": "#/components/schemas/BearerError"}]}}}})
}

/// An operation's own `responses`, with the refusals every operation shares.
fn responses(own: Vec<(&str, Value)>) -> Value {
    let mut responses: Map<String, Value> =
        own.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    responses.insert(
        "400".into(),
        refusal("The body or the path is malformed (not retryable)."),
    );
    responses.insert("401".into(), bearer_refusal("No valid bearer token."));
    responses.insert(
        "403".into(),
        either_refusal("The token is not a device token (device_token_required), or the Host/Origin is refused (an OAuth2 error)."),
    );
    responses.insert(
        "413".into(),
        refusal("The body is larger than the server accepts (not retryable)."),
    );
    responses.insert(
        "503".into(),
        either_refusal("The queue is unavailable (store_unavailable), or the token could not be checked (temporarily_unavailable); retry later."),
    );
    Value::Object(responses)
}

/// The operations, by path.
fn paths() -> Value {
    let command_param = json!([{"name": "command_id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}}]);
    json!({
        "/external-assistants/graph-relays/sync": {"post": {
            "summary": "Upload the sessions shared to a project and receive its queued commands",
            "requestBody": request_body("SyncBody"),
            "responses": responses(vec![
                ("200", success("SyncReply", "The queued commands (possibly none).")),
                ("422", refusal("A session breaks a rule, is listed twice, or there are more than 100 (invalid_sessions); or the device already shares into as many projects as it may, 100 by default (too_many_projects). Not retryable.")),
            ])
        }},
        "/external-assistants/graph-relays/commands/{command_id}/start": {"post": {
            "summary": "Claim a queued command: it becomes running under the execution id",
            "parameters": command_param,
            "requestBody": request_body("StartBody"),
            "responses": responses(vec![
                ("200", success("StartReply", "Run it (also for a retried claim with the same execution id).")),
                ("404", refusal("Unknown, or not assigned to this device.")),
                ("409", refusal("Cancelled meanwhile or running under another execution: do not run it.")),
            ])
        }},
        "/external-assistants/graph-relays/commands/{command_id}/control": {"post": {
            "summary": "Ask whether the agent cancelled a running command (optionally held)",
            "parameters": command_param,
            "requestBody": request_body("ControlBody"),
            "responses": responses(vec![
                ("200", success("ControlReply", "Whether to stop the execution.")),
                ("404", refusal("Unknown, or not assigned to this device.")),
            ])
        }},
        "/external-assistants/graph-relays/commands/{command_id}/complete": {"post": {
            "summary": "Report how an execution ended (fenced by execution id)",
            "parameters": command_param,
            "requestBody": request_body("ResultEnvelope"),
            "responses": responses(vec![
                ("200", success("ReportReply", "Recorded, or the same completion had been recorded (duplicate: true).")),
                ("404", refusal("Unknown, or not assigned to this device (not retryable).")),
                ("409", refusal("The command never started (not_started: still queued, or closed before it started); the server closed the run because the desktop stopped reporting on it, its lease lapsed or the desktop restarted, so this late result is discarded (run_closed); the completion is for another execution, or the command finished differently (completion_refused). Not retryable.")),
                ("422", refusal("The envelope breaks SPEC §7 (not retryable).")),
            ])
        }},
        "/external-assistants/graph-relays/commands/{command_id}/decline": {"post": {
            "summary": "Close a queued command as cancelled: the session is no longer shared with this project",
            "parameters": command_param,
            "requestBody": request_body("DeclineBody"),
            "responses": responses(vec![
                ("200", success("ReportReply", "Closed; or the command was already closed, and nothing changed (duplicate: true, with a message saying how it was closed).")),
                ("404", refusal("Unknown, or not assigned to this device (not retryable).")),
                ("409", refusal("Already running (not retryable).")),
            ])
        }},
        "/external-assistants/graph-relays/commands/{command_id}/progress": {"post": {
            "summary": "Report how far a running Graph got (fenced by execution id; never changes the status)",
            "description": "A relay posts the latest report at most once a second per run; the server writes at most one per second per run and coalesces the rest. Progress needs no outbox: a lost report is replaced by the next.",
            "parameters": command_param,
            "requestBody": request_body("ProgressBody"),
            "responses": responses(vec![
                ("200", success("ProgressReply", "Taken (recorded, coalesced or unchanged).")),
                ("404", refusal("Unknown, or not assigned to this device (not retryable).")),
                ("409", refusal("The command is not running (still queued, or closed) or runs under another execution (progress_refused). Not retryable: send no more progress for this execution.")),
                ("422", refusal(&format!("The message is longer than {} characters or the percent is not a number from 0 to 100 (invalid_progress). Not retryable.", limits::MAX_PROGRESS_MESSAGE))),
            ])
        }},
        "/external-assistants/graph-relays/openapi.json": {"get": {
            "summary": "This document",
            "security": [],
            "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {}}}}
        }}
    })
}

/// `n` with a comma between thousands (100000 → "100,000"), as the
/// document's prose writes numbers.
fn group(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_agent_id_still_reads_and_one_with_it_carries_it() {
        let id = "67e55044-10b1-426f-9247-bb680e5fe0c8";
        let old = json!({"command_id": id, "graph_session_id": "gs_0123456789abcdef0123456789abcdef",
            "project_id": "p1", "arguments": {"n": 1}, "slug": "drafts", "channel": format!("graph:external:{id}")});
        let parsed: WireCommand =
            serde_json::from_value(old.clone()).expect("an older server's command");
        assert_eq!(parsed.agent_id, None);
        assert_eq!(parsed.clone().into_relay_command().agent, None);
        assert_eq!(
            serde_json::to_value(&parsed).expect("JSON"),
            old,
            "absent stays absent"
        );

        let mut new = old;
        new["agent_id"] = json!("assistant");
        let parsed: WireCommand = serde_json::from_value(new).expect("a command naming its agent");
        let command = parsed.into_relay_command();
        assert_eq!(
            command.agent.map(|a| a.to_string()).as_deref(),
            Some("assistant")
        );
    }
}
