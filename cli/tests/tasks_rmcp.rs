//! The tasks extension (`io.modelcontextprotocol/tasks`, MCP 2026-07-28)
//! driven by a real client: the official Rust SDK `rmcp` 3.11 against
//! `graph-relay serve` (Streamable HTTP, bearer token) with a
//! `graph-relay worker` running shell scripts.
//!
//! What rmcp supports and how this test uses it:
//! - `ClientLifecycleMode::Discover { preferred_versions: [2026-07-28] }`:
//!   no `initialize`; the client sends `server/discover` and then stamps every
//!   request with the per-request `_meta` (protocol version, client info and
//!   the client capabilities). The capabilities declare
//!   `extensions["io.modelcontextprotocol/tasks"] = {}` (the SDK's
//!   `ClientCapabilities::extensions`; its `enable_tasks()` builder exists only
//!   with the `server`/`macros` features, which this test leaves off).
//! - Its Streamable HTTP transport (reqwest) sends `MCP-Protocol-Version`,
//!   `Mcp-Method` and `Mcp-Name` (the tool name for `tools/call`, the
//!   `taskId` for `tasks/*`) and the bearer token (`auth_header`).
//! - `Peer::call_tool_once` returns `CallToolResponse::Task(CreateTaskResult)`
//!   for `resultType: "task"`; `Peer::get_task` (`tasks/get`, parsed into a
//!   `DetailedTask` whose `completed` payload is the `CallToolResult`) and
//!   `Peer::cancel_task` (`tasks/cancel`, an empty ack). The SDK has no
//!   polling loop of its own (its `call_tool` refuses a task reply), so the
//!   test polls `tasks/get`, sleeping the `pollIntervalMs` the server gives.
//!
//! What rmcp 3.11 does not support: task status notifications. Its
//! `SubscriptionFilter` (the `notifications` of `subscriptions/listen`) has
//! no `taskIds`, and its subscription streams drop `notifications/tasks`
//! (its own server says "not yet routable through `subscriptions/listen`";
//! clients are to poll `tasks/get`). So the test polls with rmcp, and the
//! raw part below listens.
//!
//! The raw reqwest part checks what a client SDK hides: the header rules for
//! `tasks/*` (`Mcp-Name` must be the task id), a request that does not
//! declare the extension (`-32021`), a task of another agent (`-32602`, the
//! same bytes as an unknown one), and `subscriptions/listen` with `taskIds`
//! streaming `notifications/tasks` over SSE while the worker runs a script
//! that is then cancelled.

mod common;

use std::time::{Duration, Instant};

use common::{Proc, Relay};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, GetTaskParams, GetTaskResult, JsonObject, ProtocolVersion, TASKS_EXTENSION_ID,
    TaskPayload, TaskStatus,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};

const AGENT_TOKEN: &str = "gra_tasks_agent_token_0123456789abcdef";
const OTHER_TOKEN: &str = "gra_tasks_other_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_tasks_device_token_0123456789abcdef";
const GS_ECHO: &str = "gs_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const GS_SLOW: &str = "gs_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const GS_FAIL: &str = "gs_cccccccccccccccccccccccccccccccc";
const DEADLINE: Duration = Duration::from_secs(60);

/// Echoes its arguments and reports usage.
const ECHO: &str = r#"args=$(cat)
printf '{"got": %s, "greeting": "%s"}\n' "$args" "$GREETING"
echo '{"graph_relay": {"total_tokens": 7, "reported_cost": 0.5}}'
"#;
/// Marks that it started, then runs until it is killed.
const SLOW: &str = "echo $$ > \"$GRAPH_RELAY_COMMAND_ID.started\"\nexec sleep 300\n";
/// Fails with a message on stderr.
const FAIL: &str = "echo 'the graph broke' >&2\nexit 4\n";

/// A server and a worker in a temporary folder.
struct Env {
    relay: Relay,
    _server: Proc,
    _worker: Proc,
    url: String,
}

impl Env {
    fn start() -> Self {
        let relay = Relay::new(
            &[("assistant", AGENT_TOKEN), ("other", OTHER_TOKEN)],
            DEVICE_TOKEN,
            DEADLINE,
        );
        relay.write_graphs(
            &[
                (GS_ECHO, "echo", &["p1"]),
                (GS_SLOW, "slow", &["p1"]),
                (GS_FAIL, "fail", &["p1"]),
            ],
            "timeout_seconds = 120\nenv = { GREETING = \"hello\" }\n",
        );
        relay.script("echo", ECHO);
        relay.script("slow", SLOW);
        relay.script("fail", FAIL);
        let (server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);
        let worker = relay.worker(&url, "outbox.db", "2", &[]);
        worker.wait_line("sync: project p1");
        Self {
            relay,
            _server: server,
            _worker: worker,
            url,
        }
    }

    /// An rmcp client on 2026-07-28 that declares the tasks extension.
    async fn rmcp_client(&self) -> RunningService<RoleClient, ClientConfig> {
        let mut capabilities = ClientCapabilities::default();
        capabilities.extensions = Some(
            [(TASKS_EXTENSION_ID.to_owned(), JsonObject::new())]
                .into_iter()
                .collect(),
        );
        let mut config = ClientConfig::default();
        config.capabilities = capabilities;
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.url))
                .auth_header(AGENT_TOKEN),
        );
        config
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .expect("rmcp client starts with server/discover")
    }
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// `tools/call run_graph_session`, which must come back as a task.
async fn queue_task(
    client: &RunningService<RoleClient, ClientConfig>,
    gs: &str,
    key: &str,
    arguments: Value,
) -> rmcp::model::CreateTaskResult {
    let params = CallToolRequestParams::new("run_graph_session").with_arguments(object(
        json!({"graph_session_id": gs, "idempotency_key": key, "arguments": arguments}),
    ));
    match client
        .call_tool_once(params)
        .await
        .expect("tools/call answered")
    {
        CallToolResponse::Task(task) => task,
        other => panic!("expected a task, got {other:?}"),
    }
}

/// Polls `tasks/get` at the server's `pollIntervalMs` until the task is terminal.
async fn wait_terminal(
    client: &RunningService<RoleClient, ClientConfig>,
    task_id: &str,
) -> (GetTaskResult, usize) {
    let deadline = Instant::now() + DEADLINE;
    let mut polls = 0;
    loop {
        let got = client
            .get_task(GetTaskParams::new(task_id))
            .await
            .expect("tasks/get answered");
        polls += 1;
        assert_eq!(got.task.task.task_id, task_id);
        if got.task.status().is_terminal() {
            return (got, polls);
        }
        assert_eq!(got.task.status(), TaskStatus::Working, "{got:?}");
        assert!(Instant::now() < deadline, "{task_id} never ended: {got:?}");
        let interval = got
            .task
            .task
            .poll_interval_ms
            .expect("a working task says when to poll again");
        assert!(
            (1..=60_000).contains(&interval),
            "pollIntervalMs {interval}"
        );
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

fn completed_result(got: &GetTaskResult) -> CallToolResult {
    match &got.task.payload {
        TaskPayload::Completed { result } => {
            serde_json::from_value(Value::Object(result.clone())).expect("a CallToolResult")
        }
        other => panic!("expected a completed payload, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rmcp_queues_waits_reads_inline_and_cancels_tasks_against_serve_and_worker() {
    let env = Env::start();
    let client = env.rmcp_client().await;
    let server = client.peer_info().expect("discovered server");
    assert_eq!(server.protocol_version, ProtocolVersion::V_2026_07_28);
    assert!(
        server
            .capabilities
            .extensions
            .as_ref()
            .is_some_and(|e| e.contains_key(TASKS_EXTENSION_ID)),
        "server/discover announces the tasks extension: {server:?}"
    );

    // Queue, wait, read the result inline.
    let created = queue_task(&client, GS_ECHO, "rmcp-task-echo-1", json!({"x": 1})).await;
    let task_id = created.task.task_id.clone();
    assert!(uuid::Uuid::parse_str(&task_id).is_ok(), "{task_id}");
    assert_eq!(created.task.status, TaskStatus::Working);
    assert!(created.task.poll_interval_ms.is_some());
    assert_eq!(created.task.ttl_ms, None, "terminal runs stay until pruned");
    let (done, polls) = wait_terminal(&client, &task_id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    let result = completed_result(&done);
    assert_eq!(result.is_error, Some(false));
    let run = result.structured_content.expect("structured run");
    assert_eq!(run["command_id"], task_id.as_str());
    assert_eq!(run["status"], "completed");
    assert_eq!(run["result"], json!({"got": {"x": 1}, "greeting": "hello"}));
    assert_eq!(run["total_tokens"], 7);
    assert!(polls >= 1);

    // Same key again: the same task, no second run.
    let replay = queue_task(&client, GS_ECHO, "rmcp-task-echo-1", json!({"x": 1})).await;
    assert_eq!(replay.task.task_id, task_id);
    assert_eq!(replay.task.status, TaskStatus::Completed);

    // A failing Graph is a tool error: a completed task with isError.
    let failing = queue_task(&client, GS_FAIL, "rmcp-task-fail-1", json!({})).await;
    let (done, _) = wait_terminal(&client, &failing.task.task_id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    let result = completed_result(&done);
    assert_eq!(result.is_error, Some(true));
    let run = result.structured_content.expect("structured run");
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"], "the graph broke\n");

    // Cancel while the script runs.
    let slow = queue_task(&client, GS_SLOW, "rmcp-task-slow-1", json!({})).await;
    let slow_id = slow.task.task_id.clone();
    env.relay
        .wait_exists(&format!("{slow_id}.started"), "the slow script")
        .await;
    let running = client
        .get_task(GetTaskParams::new(slow_id.clone()))
        .await
        .expect("tasks/get");
    assert_eq!(running.task.status(), TaskStatus::Working);
    client
        .cancel_task(CancelTaskParams::new(slow_id.clone()))
        .await
        .expect("tasks/cancel acknowledged");
    let (done, _) = wait_terminal(&client, &slow_id).await;
    assert_eq!(done.task.status(), TaskStatus::Cancelled, "{done:?}");
    assert!(matches!(done.task.payload, TaskPayload::Cancelled));
    assert!(done.task.task.status_message.is_some());

    // Cancelling again changes nothing and is still acknowledged.
    client
        .cancel_task(CancelTaskParams::new(slow_id.clone()))
        .await
        .expect("tasks/cancel on a terminal task");
    let again = client
        .get_task(GetTaskParams::new(slow_id))
        .await
        .expect("tasks/get");
    assert_eq!(again.task.status(), TaskStatus::Cancelled);

    // An unknown task is an error, not a hang.
    let unknown = client
        .get_task(GetTaskParams::new(uuid::Uuid::new_v4().to_string()))
        .await;
    assert!(unknown.is_err(), "{unknown:?}");
    client.cancel().await.expect("client stops");
}

/// One raw 2026-07-28 request; returns the HTTP status and the JSON body.
async fn raw(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    method: &str,
    mcp_name: Option<&str>,
    params: Value,
    tasks: bool,
) -> (u16, Value) {
    let caps = if tasks {
        json!({"extensions": {TASKS_EXTENSION_ID: {}}})
    } else {
        json!({})
    };
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    });
    let mut request = http
        .post(format!("{url}/mcp"))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}));
    if let Some(name) = mcp_name {
        request = request.header("mcp-name", name);
    }
    let response = request.send().await.expect("HTTP answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_tasks_requests_follow_the_header_rules_and_hide_other_agents_tasks() {
    let env = Env::start();
    let http = reqwest::Client::new();
    let url = env.url.as_str();
    let (status, reply) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tools/call",
        Some("run_graph_session"),
        json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS_ECHO, "idempotency_key": "raw-task-echo-1", "arguments": {"y": 2}}}),
        true,
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["result"]["resultType"], "task", "{reply}");
    let id = reply["result"]["taskId"]
        .as_str()
        .expect("taskId")
        .to_owned();

    // tasks/get without Mcp-Name, or with another name: 400 header mismatch.
    let params = json!({"taskId": id});
    let (status, reply) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tasks/get",
        None,
        params.clone(),
        true,
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], -32020, "{reply}");
    let (status, reply) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tasks/get",
        Some("get_graph_run"),
        params.clone(),
        true,
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], -32020, "{reply}");

    // Without the extension declared: -32021 naming the extension.
    let (_, reply) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tasks/get",
        Some(&id),
        params.clone(),
        false,
    )
    .await;
    assert_eq!(reply["error"]["code"], -32021, "{reply}");
    assert!(
        reply["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION_ID]
            .is_object(),
        "{reply}"
    );

    // Another agent's task and an unknown one: the same error.
    let (_, foreign) = raw(
        &http,
        url,
        OTHER_TOKEN,
        "tasks/get",
        Some(&id),
        params.clone(),
        true,
    )
    .await;
    let unknown_id = uuid::Uuid::new_v4().to_string();
    let (_, unknown) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tasks/get",
        Some(&unknown_id),
        json!({"taskId": unknown_id}),
        true,
    )
    .await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    assert_eq!(foreign["error"], unknown["error"]);
    let (_, cancel_foreign) = raw(
        &http,
        url,
        OTHER_TOKEN,
        "tasks/cancel",
        Some(&id),
        params.clone(),
        true,
    )
    .await;
    assert_eq!(cancel_foreign["error"]["code"], -32602, "{cancel_foreign}");

    // The owner reads it to the end with the right headers.
    let deadline = Instant::now() + DEADLINE;
    let done = loop {
        let (status, reply) = raw(
            &http,
            url,
            AGENT_TOKEN,
            "tasks/get",
            Some(&id),
            params.clone(),
            true,
        )
        .await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
        if reply["result"]["status"] != "working" {
            break reply["result"].clone();
        }
        assert!(Instant::now() < deadline, "never finished: {reply}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["result"]["got"],
        json!({"y": 2})
    );

    // subscriptions/listen on a running task, then cancel it: the stream
    // carries its notifications and ends once it is terminal.
    let (_, reply) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tools/call",
        Some("run_graph_session"),
        json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS_SLOW, "idempotency_key": "raw-task-slow-1"}}),
        true,
    )
    .await;
    let slow = reply["result"]["taskId"]
        .as_str()
        .expect("taskId")
        .to_owned();
    env.relay
        .wait_exists(&format!("{slow}.started"), "the slow script")
        .await;
    let listen = http
        .post(format!("{url}/mcp"))
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .json(&json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
            "notifications": {"taskIds": [slow]},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}}}}))
        .send()
        .await
        .expect("listen answered");
    assert_eq!(listen.status().as_u16(), 200);
    assert_eq!(listen.headers()["content-type"], "text/event-stream");
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let stream = tokio::spawn(async move {
        let mut listen = listen;
        let mut first_tx = Some(first_tx);
        let mut text = String::new();
        while let Some(chunk) = listen.chunk().await.expect("SSE chunk") {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("notifications/tasks")
                && let Some(tx) = first_tx.take()
            {
                let _ = tx.send(());
            }
        }
        text
    });
    tokio::time::timeout(DEADLINE, first_rx)
        .await
        .expect("a first task notification")
        .expect("stream reader alive");
    let (_, ack) = raw(
        &http,
        url,
        AGENT_TOKEN,
        "tasks/cancel",
        Some(&slow),
        json!({"taskId": slow}),
        true,
    )
    .await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let text = tokio::time::timeout(DEADLINE, stream)
        .await
        .expect("the stream ends once the task is terminal")
        .expect("stream reader");
    let messages: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("JSON in an SSE event"))
        .collect();
    assert_eq!(
        messages.first().map(|m| m["method"].clone()),
        Some(json!("notifications/subscriptions/acknowledged")),
        "{text}"
    );
    let statuses: Vec<&str> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/tasks")
        .map(|m| {
            assert_eq!(m["params"]["taskId"], slow.as_str(), "{m}");
            m["params"]["status"].as_str().expect("status")
        })
        .collect();
    assert_eq!(statuses.first(), Some(&"working"), "{text}");
    assert_eq!(statuses.last(), Some(&"cancelled"), "{text}");
    assert_eq!(
        messages.last().map(|m| m["id"].clone()),
        Some(json!(9)),
        "the stream ends with the listen request's result: {text}"
    );
}
