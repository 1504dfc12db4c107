//! Every reply an agent can get, pinned by insta snapshots
//! (`core/src/mcp/snapshots/`), and decoded with the official SDK's model
//! types (rmcp) so a reply an SDK client cannot read fails here first.
//!
//! The fixture is deterministic: a [`crate::time::ManualClock`] at
//! 2026-01-01T00:00:00Z and [`crate::time::SeededIds`] with seed 7, so the
//! command ids and timestamps in the snapshots are the same on every run.
//! A changed reply fails until its snapshot is reviewed and accepted
//! (`cargo insta review`, or `INSTA_UPDATE=always`).

use std::sync::Arc;

use futures::executor::block_on;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::tests::{Fixture, GS, fixture, modern_meta};
use super::wire;
use super::*;
use crate::command::{CommandRecord, CommandStatus, Progress};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::ids::{CommandId, ExecutionId};
use crate::time::Timestamp;

/// What the `result` (or `error`) of a reply is, for decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Initialize,
    Discover,
    ToolsList,
    CallTool,
    CreateTask,
    GetTask,
    Empty,
    TaskAck,
    Error,
    TaskNotification,
    Acknowledged,
    Progress,
}

/// Keeps the notifications a waiting request sends.
#[derive(Default)]
struct Notifications(std::sync::Mutex<Vec<Value>>);

impl Notifier for Notifications {
    fn notify(&self, notification: Value) {
        self.0.lock().unwrap().push(notification);
    }
}

/// One reply, named for its snapshot.
struct Reply {
    name: String,
    kind: Kind,
    message: Value,
}

/// A fixed moment after the fixture's clock (2026-01-01T00:00:00Z).
fn at(seconds: u64) -> Timestamp {
    Timestamp(1_767_225_600_000 + seconds * 1000)
}

fn tasks_meta() -> Value {
    let mut meta = modern_meta();
    meta[META_CLIENT_CAPABILITIES] = json!({"extensions": {TASKS_EXTENSION: {}}});
    meta
}

struct Recorder<'a> {
    fixture: &'a Fixture,
    replies: Vec<Reply>,
}

impl Recorder<'_> {
    fn push(&mut self, name: &str, kind: Kind, message: Value) {
        assert!(
            self.replies.iter().all(|r| r.name != name),
            "two replies named {name}"
        );
        self.replies.push(Reply {
            name: name.to_owned(),
            kind,
            message,
        });
    }

    /// Sends `request` in `session` as `caller` and records the reply.
    fn send(
        &mut self,
        name: &str,
        kind: Kind,
        session: &mut McpSession,
        caller: &Caller,
        request: Value,
    ) -> Value {
        let reply = self
            .fixture
            .send(session, caller, &request)
            .expect("a request gets a reply");
        assert_canonical(&reply);
        let message = reply.message().clone();
        self.push(name, kind, message.clone());
        message
    }

    /// A `tools/call` in a fresh 2025-11-25 session.
    fn call_legacy(&mut self, name: &str, kind: Kind, tool: &str, arguments: Value) -> Value {
        let mut session = self.fixture.legacy("2025-11-25");
        let alice = self.fixture.alice.clone();
        self.send(
            name,
            kind,
            &mut session,
            &alice,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}}),
        )
    }

    /// A 2026-07-28 request with `meta`.
    fn modern(&mut self, name: &str, kind: Kind, method: &str, params: Value, meta: Value) {
        let mut params = params;
        params["_meta"] = meta;
        let alice = self.fixture.alice.clone();
        self.send(
            name,
            kind,
            &mut McpSession::new(),
            &alice,
            json!({"jsonrpc": "2.0", "id": "m1", "method": method, "params": params}),
        );
    }

    /// Raw bytes outside any session.
    fn raw(&mut self, name: &str, bytes: &[u8]) {
        let reply = self.fixture.raw(bytes);
        assert_canonical(&reply);
        self.push(name, Kind::Error, reply.message().clone());
    }
}

/// The bytes a transport writes are exactly the compact rendering of the
/// message a [`Value`] gives (keys in lexicographic order): typed replies
/// serialized straight to bytes and pre-rendered ones included, so the
/// snapshots (taken of the message) pin the bytes too.
fn assert_canonical(reply: &Outgoing) {
    let rendered = serde_json::to_vec(reply.message()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(reply.as_bytes()),
        String::from_utf8_lossy(&rendered),
        "the bytes on the wire differ from the message's rendering"
    );
}

/// Queues a run with `key` and returns its command id.
fn queue_run(f: &Fixture, key: &str) -> CommandId {
    let reply = f.call_legacy(
        &f.alice,
        "run_graph_session",
        json!({"graph_session_id": GS, "idempotency_key": key}),
    );
    let id = reply["result"]["structuredContent"]["command_id"]
        .as_str()
        .expect("a ticket");
    CommandId::parse(id).unwrap()
}

/// Rewrites the stored command `id` (the state a relay would have produced).
fn set(f: &Fixture, id: CommandId, edit: impl FnOnce(&mut CommandRecord)) {
    let mut commands = f.store.commands.lock().unwrap();
    let command = commands.get_mut(&id).expect("a stored command");
    edit(command);
    // As every write does: a queue's copy of the command is out of date now.
    command.revision += 1;
}

fn started(c: &mut CommandRecord) {
    c.status = CommandStatus::Running;
    c.execution_id = Some(ExecutionId::parse("exec-1").unwrap());
    c.started_at = Some(at(20));
}

fn finished(c: &mut CommandRecord, status: FinishStatus, body: Option<EnvelopeBody>) {
    started(c);
    c.status = match status {
        FinishStatus::Completed => CommandStatus::Completed,
        FinishStatus::Failed => CommandStatus::Failed,
        FinishStatus::Cancelled => CommandStatus::Cancelled,
    };
    c.finished_at = Some(at(80));
    c.completion = Some(ResultEnvelope {
        execution_id: ExecutionId::parse("exec-1").unwrap(),
        status,
        body: body.map(Arc::new),
    });
}

/// Runs in every state an agent can see, by command id.
struct Runs {
    queued: CommandId,
    running: CommandId,
    cancel_requested: CommandId,
    completed: CommandId,
    failed: CommandId,
    truncated: CommandId,
    cancelled: CommandId,
    lapsed: CommandId,
}

fn runs(f: &Fixture) -> Runs {
    let runs = Runs {
        queued: queue_run(f, "key-queued"),
        running: queue_run(f, "key-running"),
        cancel_requested: queue_run(f, "key-cancel-requested"),
        completed: queue_run(f, "key-completed"),
        failed: queue_run(f, "key-failed"),
        truncated: queue_run(f, "key-truncated"),
        cancelled: queue_run(f, "key-cancelled"),
        lapsed: queue_run(f, "key-lapsed"),
    };
    set(f, runs.running, |c| {
        started(c);
        c.progress = Some(Progress {
            message: Some("step 2 of 5".into()),
            percent: Some(40.0),
            updated_at: at(50),
        });
    });
    set(f, runs.cancel_requested, |c| {
        started(c);
        c.cancel_requested = true;
        c.cancel_requested_at = Some(at(30));
    });
    set(f, runs.completed, |c| {
        let body = EnvelopeBody {
            result: json!({"summary": "3 drafts written", "drafts": 3}),
            total_tokens: Some(1234),
            reported_cost: Some(0.0125),
            error: None,
        };
        finished(c, FinishStatus::Completed, Some(body));
    });
    set(f, runs.failed, |c| {
        let body = EnvelopeBody {
            result: Value::Null,
            total_tokens: None,
            reported_cost: None,
            error: Some("Tool `send_mail` timed out".into()),
        };
        finished(c, FinishStatus::Failed, Some(body));
    });
    set(f, runs.truncated, |c| {
        finished(c, FinishStatus::Completed, None);
    });
    set(f, runs.cancelled, |c| {
        finished(c, FinishStatus::Cancelled, None);
        c.reason = Some("Graph session is no longer shared with this project".into());
    });
    set(f, runs.lapsed, |c| {
        started(c);
        c.status = CommandStatus::Failed;
        c.finished_at = Some(at(200));
        c.reason =
            Some("The desktop stopped renewing the run's lease; it was not re-run.".to_owned());
    });
    runs
}

/// Every reply, in a fixed order.
fn all_replies() -> Vec<Reply> {
    let f = fixture();
    let runs = runs(&f);
    let mut r = Recorder {
        fixture: &f,
        replies: Vec::new(),
    };
    let alice = f.alice.clone();
    let reader = f.reader.clone();

    // --- The initialize era -------------------------------------------------
    for (name, version) in [
        ("initialize_2025_03_26", "2025-03-26"),
        ("initialize_2025_06_18", "2025-06-18"),
        ("initialize_2025_11_25", "2025-11-25"),
        ("initialize_counter_offer", "2024-11-05"),
    ] {
        r.send(
            name,
            Kind::Initialize,
            &mut McpSession::new(),
            &alice,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}),
        );
    }
    let mut session = f.legacy("2025-11-25");
    r.send(
        "initialize_twice",
        Kind::Error,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 2, "method": "initialize",
               "params": {"protocolVersion": "2025-11-25"}}),
    );
    r.send(
        "initialize_without_version",
        Kind::Error,
        &mut McpSession::new(),
        &alice,
        json!({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}}),
    );
    r.send(
        "initialize_client_info_too_large",
        Kind::Error,
        &mut McpSession::new(),
        &alice,
        json!({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "clientInfo": {"name": "x".repeat(MAX_INITIALIZE_FIELD_BYTES)}}}),
    );
    r.send(
        "ping",
        Kind::Empty,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}),
    );
    r.send(
        "tools_list_legacy",
        Kind::ToolsList,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}),
    );
    r.send(
        "method_not_found_legacy",
        Kind::Error,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 7, "method": "resources/list"}),
    );
    r.send(
        "scope_denied",
        Kind::Error,
        &mut session,
        &reader,
        json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
               "params": {"name": "run_graph_session",
                          "arguments": {"graph_session_id": GS, "idempotency_key": "key-denied"}}}),
    );
    r.send(
        "unknown_tool",
        Kind::Error,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
               "params": {"name": "delete_everything", "arguments": {}}}),
    );
    r.send(
        "tool_call_without_name",
        Kind::Error,
        &mut session,
        &alice,
        json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {}}),
    );

    // --- Tool results (2025-11-25) -------------------------------------------
    let run = json!({"graph_session_id": GS, "idempotency_key": "key-ticket"});
    r.call_legacy(
        "run_ticket",
        Kind::CallTool,
        "run_graph_session",
        run.clone(),
    );
    r.call_legacy("run_replayed", Kind::CallTool, "run_graph_session", run);
    r.call_legacy(
        "run_unshared_session",
        Kind::CallTool,
        "run_graph_session",
        json!({"graph_session_id": "gs_ffffffffffffffffffffffffffffffff",
               "idempotency_key": "key-unshared"}),
    );
    r.call_legacy(
        "run_invalid_arguments",
        Kind::CallTool,
        "run_graph_session",
        json!({"graph_session_id": GS, "idempotency_key": "short"}),
    );
    r.call_legacy(
        "list_sessions",
        Kind::CallTool,
        "list_graph_sessions",
        json!({"project_id": "p1"}),
    );
    r.call_legacy(
        "list_sessions_unknown_project",
        Kind::CallTool,
        "list_graph_sessions",
        json!({"project_id": "p2", "limit": 50}),
    );
    r.call_legacy(
        "list_sessions_invalid_limit",
        Kind::CallTool,
        "list_graph_sessions",
        json!({"project_id": "p1", "limit": 51}),
    );
    for (name, id) in [
        ("get_queued", runs.queued),
        ("get_running_with_progress", runs.running),
        ("get_cancel_requested", runs.cancel_requested),
        ("get_completed", runs.completed),
        ("get_failed", runs.failed),
        ("get_truncated", runs.truncated),
        ("get_cancelled", runs.cancelled),
        ("get_lapsed", runs.lapsed),
    ] {
        r.call_legacy(
            name,
            Kind::CallTool,
            "get_graph_run",
            json!({"command_id": id}),
        );
    }
    r.call_legacy(
        "get_not_found",
        Kind::CallTool,
        "get_graph_run",
        json!({"command_id": "00000000-0000-4000-8000-000000000000"}),
    );
    r.call_legacy(
        "get_invalid_command_id",
        Kind::CallTool,
        "get_graph_run",
        json!({"command_id": "not-a-uuid"}),
    );
    r.call_legacy(
        "cancel_terminal",
        Kind::CallTool,
        "cancel_graph_run",
        json!({"command_id": runs.completed}),
    );
    let other = f.other.clone();
    let mut other_session = f.legacy("2025-11-25");
    r.send(
        "cancel_another_agents_run",
        Kind::CallTool,
        &mut other_session,
        &other,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "cancel_graph_run", "arguments": {"command_id": runs.queued}}}),
    );
    let to_cancel = queue_run(&f, "key-to-cancel");
    r.call_legacy(
        "cancel_queued",
        Kind::CallTool,
        "cancel_graph_run",
        json!({"command_id": to_cancel}),
    );

    // 2025-03-26 has no structured content.
    let mut old = f.legacy("2025-03-26");
    r.send(
        "run_ticket_2025_03_26",
        Kind::CallTool,
        &mut old,
        &alice,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "run_graph_session",
            "arguments": {"graph_session_id": GS, "idempotency_key": "key-2025-03-26"}}}),
    );

    // `notifications/progress` of a waiting `get_graph_run`: a counter while
    // queued, then the desktop's percentage.
    let sent = Notifications::default();
    let mut progress = progress::ProgressNotifications::new(json!("p-1"), &sent);
    for id in [runs.queued, runs.running] {
        let view = block_on(f.server.queue().get_graph_run(&alice.agent, &id)).unwrap();
        progress.observe(&view);
    }
    let [queued, running] = <[Value; 2]>::try_from(sent.0.lock().unwrap().clone()).unwrap();
    r.push("notification_progress_queued", Kind::Progress, queued);
    r.push("notification_progress_running", Kind::Progress, running);

    // --- 2026-07-28 ---------------------------------------------------------
    r.modern(
        "discover",
        Kind::Discover,
        "server/discover",
        json!({}),
        modern_meta(),
    );
    r.modern(
        "tools_list_modern",
        Kind::ToolsList,
        "tools/list",
        json!({}),
        modern_meta(),
    );
    r.modern(
        "run_ticket_modern",
        Kind::CallTool,
        "tools/call",
        json!({"name": "run_graph_session",
               "arguments": {"graph_session_id": GS, "idempotency_key": "key-modern"}}),
        modern_meta(),
    );
    r.modern(
        "get_completed_modern",
        Kind::CallTool,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": runs.completed}}),
        modern_meta(),
    );
    r.modern(
        "create_task",
        Kind::CreateTask,
        "tools/call",
        json!({"name": "run_graph_session",
               "arguments": {"graph_session_id": GS, "idempotency_key": "key-task"}}),
        tasks_meta(),
    );
    for (name, id) in [
        ("tasks_get_working", runs.queued),
        ("tasks_get_running", runs.running),
        ("tasks_get_cancel_requested", runs.cancel_requested),
        ("tasks_get_completed", runs.completed),
        ("tasks_get_failed", runs.failed),
        ("tasks_get_truncated", runs.truncated),
        ("tasks_get_cancelled", runs.cancelled),
    ] {
        r.modern(
            name,
            Kind::GetTask,
            "tasks/get",
            json!({"taskId": id}),
            tasks_meta(),
        );
    }
    r.modern(
        "tasks_get_not_found",
        Kind::Error,
        "tasks/get",
        json!({"taskId": "00000000-0000-4000-8000-000000000000"}),
        tasks_meta(),
    );
    r.modern(
        "tasks_get_without_task_id",
        Kind::Error,
        "tasks/get",
        json!({}),
        tasks_meta(),
    );
    r.modern(
        "tasks_get_undeclared",
        Kind::Error,
        "tasks/get",
        json!({"taskId": runs.queued}),
        modern_meta(),
    );
    r.modern(
        "tasks_update",
        Kind::TaskAck,
        "tasks/update",
        json!({"taskId": runs.running, "inputResponses": {}}),
        tasks_meta(),
    );
    r.modern(
        "tasks_cancel",
        Kind::TaskAck,
        "tasks/cancel",
        json!({"taskId": runs.running}),
        tasks_meta(),
    );
    r.modern(
        "method_not_found_modern",
        Kind::Error,
        "ping",
        json!({}),
        modern_meta(),
    );
    r.modern(
        "listen_without_stream",
        Kind::Error,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [runs.queued]}}),
        tasks_meta(),
    );
    let mut unsupported = modern_meta();
    unsupported[META_PROTOCOL_VERSION] = json!("2099-01-01");
    r.modern(
        "unsupported_version",
        Kind::Error,
        "tools/list",
        json!({}),
        unsupported,
    );
    let mut no_capabilities = modern_meta();
    no_capabilities
        .as_object_mut()
        .unwrap()
        .remove(META_CLIENT_CAPABILITIES);
    r.modern(
        "missing_client_capabilities",
        Kind::Error,
        "tools/list",
        json!({}),
        no_capabilities,
    );
    r.send(
        "missing_protocol_version",
        Kind::Error,
        &mut McpSession::new(),
        &alice,
        json!({"jsonrpc": "2.0", "id": 11, "method": "tools/list"}),
    );

    // --- Notifications ------------------------------------------------------
    let (notification, terminal) =
        block_on(f.server.task_notification(&alice, &runs.completed)).expect("alice's task");
    assert!(terminal);
    r.push(
        "notification_task_completed",
        Kind::TaskNotification,
        notification,
    );
    let (notification, terminal) =
        block_on(f.server.task_notification(&alice, &runs.queued)).expect("alice's task");
    assert!(!terminal);
    r.push(
        "notification_task_working",
        Kind::TaskNotification,
        notification,
    );
    let listen = Incoming::from_value(json!({
        "jsonrpc": "2.0", "id": "l1", "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [runs.queued, runs.completed,
                    "00000000-0000-4000-8000-000000000000"]},
                   "_meta": tasks_meta()}}))
    .unwrap();
    let accepted = block_on(f.server.listen(&alice, &listen)).expect("accepted");
    r.push(
        "notification_listen_acknowledged",
        Kind::Acknowledged,
        accepted.acknowledged,
    );

    // --- Protocol errors outside any session --------------------------------
    r.raw("parse_error", b"{not json");
    r.raw("batch_refused", b"[]");
    r.raw(
        "wrong_jsonrpc_version",
        br#"{"jsonrpc": "1.0", "id": 1, "method": "ping"}"#,
    );
    r.raw("missing_method", br#"{"jsonrpc": "2.0", "id": 1}"#);

    // A claimed run waiting for the owner's approval on the desktop: queued
    // last, so that the ids of the runs above stay as they were.
    let awaiting = queue_run(&f, "key-awaiting-approval");
    set(&f, awaiting, |c| {
        started(c);
        c.progress = Some(Progress {
            message: Some(crate::command::WAITING_FOR_APPROVAL.into()),
            percent: None,
            updated_at: at(21),
        });
    });
    r.call_legacy(
        "get_awaiting_approval",
        Kind::CallTool,
        "get_graph_run",
        json!({"command_id": awaiting}),
    );
    r.modern(
        "tasks_get_awaiting_approval",
        Kind::GetTask,
        "tasks/get",
        json!({"taskId": awaiting}),
        tasks_meta(),
    );

    // A server with instructions says them in initialize and discover.
    let mut info = ServerInfo::new("graph-relay", "0.1.0");
    info.instructions = Some("Queue Graph runs; read results with get_graph_run.".into());
    let instructed = McpServer::new(f.server.queue().clone(), ToolCatalog::published(), info);
    let with_instructions = Fixture {
        server: instructed,
        store: f.store.clone(),
        alice: f.alice.clone(),
        reader: f.reader.clone(),
        other: f.other.clone(),
    };
    let mut r2 = Recorder {
        fixture: &with_instructions,
        replies: std::mem::take(&mut r.replies),
    };
    r2.send(
        "initialize_with_instructions",
        Kind::Initialize,
        &mut McpSession::new(),
        &alice,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
               "params": {"protocolVersion": "2025-11-25", "capabilities": {}}}),
    );
    r2.modern(
        "discover_with_instructions",
        Kind::Discover,
        "server/discover",
        json!({}),
        modern_meta(),
    );
    r2.replies
}

#[test]
fn every_reply_matches_its_snapshot() {
    let replies = all_replies();
    assert!(replies.len() > 60, "{} replies", replies.len());
    for reply in &replies {
        let text = serde_json::to_string_pretty(&reply.message).unwrap();
        insta::assert_snapshot!(reply.name.as_str(), text);
    }
}

fn decode<T: DeserializeOwned>(name: &str, what: &str, value: &Value) -> T {
    match serde_json::from_value(value.clone()) {
        Ok(decoded) => decoded,
        Err(e) => panic!("{name}: rmcp cannot decode the {what}: {e}\n{value:#}"),
    }
}

#[test]
fn every_reply_decodes_with_rmcp_model_types() {
    use rmcp::model;
    for Reply {
        name,
        kind,
        message,
    } in all_replies()
    {
        let envelope: model::ServerJsonRpcMessage = decode(&name, "message", &message);
        let result = &message["result"];
        match kind {
            Kind::Error => {
                assert!(
                    matches!(envelope, model::JsonRpcMessage::Error(_)),
                    "{name}: not an error"
                );
                let error: model::ErrorData = decode(&name, "error", &message["error"]);
                assert_eq!(
                    i64::from(error.code.0),
                    message["error"]["code"].as_i64().unwrap()
                );
            }
            Kind::TaskNotification => {
                let notification: model::TaskStatusNotification =
                    decode(&name, "notification", &message);
                assert_eq!(
                    notification.params.task.task.task_id,
                    message["params"]["taskId"].as_str().unwrap()
                );
            }
            Kind::Progress => {
                let notification: model::ProgressNotification =
                    decode(&name, "notification", &message);
                assert_eq!(
                    Some(notification.params.progress),
                    message["params"]["progress"].as_f64()
                );
            }
            Kind::Acknowledged => {
                let _: model::SubscriptionsAcknowledgedNotification =
                    decode(&name, "notification", &message);
            }
            Kind::Initialize => {
                let init: model::InitializeResult = decode(&name, "result", result);
                assert_eq!(init.server_info.name, "graph-relay");
            }
            Kind::Discover => {
                let _: model::DiscoverResult = decode(&name, "result", result);
            }
            Kind::ToolsList => {
                let list: model::ListToolsResult = decode(&name, "result", result);
                assert_eq!(list.tools.len(), 4, "{name}");
            }
            Kind::CallTool => {
                let call: model::CallToolResult = decode(&name, "result", result);
                assert_eq!(
                    call.is_error,
                    result["isError"].as_bool(),
                    "{name}: isError"
                );
                assert_eq!(call.content.len(), 1, "{name}");
                assert_eq!(
                    call.structured_content.as_ref(),
                    result.get("structuredContent"),
                    "{name}"
                );
            }
            Kind::CreateTask => {
                let created: model::CreateTaskResult = decode(&name, "result", result);
                assert_eq!(created.task.task_id, result["taskId"].as_str().unwrap());
            }
            Kind::GetTask => {
                let task: model::GetTaskResult = decode(&name, "result", result);
                assert_eq!(task.task.task.task_id, result["taskId"].as_str().unwrap());
            }
            Kind::Empty => {
                let _: model::EmptyResult = decode(&name, "result", result);
            }
            Kind::TaskAck => {
                let _: model::TaskAckResult = decode(&name, "result", result);
            }
        }
    }
}

/// The typed wire model reads back every structured content and task it
/// wrote: the types describe the replies, not just produce them.
#[test]
fn the_wire_types_read_back_what_they_wrote() {
    for reply in all_replies() {
        let result = &reply.message["result"];
        match reply.kind {
            Kind::CallTool => {
                let call: wire::CallToolResult = serde_json::from_value(result.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
                assert_eq!(call.is_error, result["isError"].as_bool().unwrap());
                if let Some(structured) = &call.structured_content {
                    assert_eq!(
                        wire::to_value(structured)["command_id"],
                        result["structuredContent"]["command_id"],
                        "{}",
                        reply.name
                    );
                }
            }
            Kind::GetTask | Kind::CreateTask => {
                let _: wire::Task = serde_json::from_value(result.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
            }
            Kind::Initialize => {
                let init: wire::InitializeResult = serde_json::from_value(result.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
                assert_eq!(&wire::to_value(&init), result, "{}", reply.name);
            }
            Kind::ToolsList => {
                let list: wire::ListToolsResult = serde_json::from_value(result.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
                assert_eq!(list.tools.len(), 4);
                if result.get("_meta").is_none() {
                    assert_eq!(&wire::to_value(&list), result, "{}", reply.name);
                }
            }
            Kind::Discover => {
                let _: wire::DiscoverResult = serde_json::from_value(result.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
            }
            Kind::Progress => {
                let notification: wire::JsonRpcNotification<wire::ProgressParams> =
                    serde_json::from_value(reply.message.clone())
                        .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
                assert_eq!(wire::to_value(&notification), reply.message);
            }
            Kind::Error => {
                let error: wire::JsonRpcErrorResponse =
                    serde_json::from_value(reply.message.clone())
                        .unwrap_or_else(|e| panic!("{}: {e}", reply.name));
                assert_eq!(wire::to_value(&error), reply.message, "{}", reply.name);
            }
            _ => {}
        }
    }
}

/// Written directly (not through a `Value`), a wire value has the same
/// bytes: fields are declared in the order of their wire names.
#[test]
fn typed_serialization_is_byte_identical_to_the_value_form() {
    for reply in all_replies() {
        let result = &reply.message["result"];
        if reply.kind == Kind::CallTool && result.get("structuredContent").is_some() {
            let call: wire::CallToolResult = serde_json::from_value(result.clone()).unwrap();
            let direct = serde_json::to_string(&call.structured_content).unwrap();
            assert_eq!(
                direct,
                result["structuredContent"].to_string(),
                "{}",
                reply.name
            );
            // The ticket's text is a sentence; every other text is the JSON.
            if !matches!(call.structured_content, Some(wire::ToolOutput::Ticket(_))) {
                assert_eq!(direct, result["content"][0]["text"], "{}", reply.name);
            }
        }
    }
}
