//! Progress over real sockets: a waiting `get_graph_run` that carries a
//! progress token is answered with an SSE stream of `notifications/progress`
//! ending with its result; without a token (or without SSE in `Accept`) the
//! answer stays one JSON body; `subscriptions/listen` streams each progress
//! report as a task status message. The desktop is simulated on the queue.

mod common;

use std::time::Duration;

use common::*;
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::prelude::*;
use graph_relay_transport_http::{HttpConfig, HttpState, ServeConfig};
use serde_json::{Value, json};

/// A server on a real socket whose progress may be written every 10 ms.
async fn server() -> (HttpState, String) {
    let (state, addr) = serve_on_socket(
        |addr| async move {
            let auth = graph_relay_transport_http::auth::StaticTokens::new(&tokens()).unwrap();
            state_with_queue(
                HttpConfig {
                    listen_addr: Some(addr),
                    ..HttpConfig::default()
                },
                std::sync::Arc::new(auth),
                QueueConfig {
                    progress_interval: Duration::from_millis(10),
                    ..QueueConfig::default()
                },
            )
            .await
        },
        ServeConfig::default(),
    )
    .await;
    (state, format!("http://{addr}/mcp"))
}

/// Reads SSE events from a streamed response, one JSON-RPC message each.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return Some(serde_json::from_str(data).expect("JSON data"));
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.response.chunk())
                .await
                .expect("an event within 20 s")
                .expect("the stream")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

async fn post(
    url: &str,
    method: &str,
    name: Option<&str>,
    params: Value,
    accept: &str,
) -> reqwest::Response {
    let mut params = params;
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(FULL)
        .header("accept", accept)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .json(&json!({"jsonrpc": "2.0", "id": 5, "method": method, "params": params}));
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    request.send().await.expect("HTTP answer")
}

/// Queues a run (a plain ticket) and starts it on the desktop.
async fn running(state: &HttpState, url: &str, key: &str) -> (CommandId, ExecutionId) {
    let reply: Value = post(
        url,
        "tools/call",
        Some("run_graph_session"),
        json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS, "idempotency_key": key}}),
        "application/json",
    )
    .await
    .json()
    .await
    .unwrap();
    let id = reply["result"]["taskId"]
        .as_str()
        .or(reply["result"]["structuredContent"]["command_id"].as_str())
        .unwrap_or_else(|| panic!("{reply}"));
    let command = CommandId::parse(id).unwrap();
    let execution = ExecutionId::parse(&format!("exec-{key}")).unwrap();
    state
        .mcp()
        .queue()
        .start(&desktop(), &command, &execution)
        .await
        .unwrap();
    (command, execution)
}

async fn report(state: &HttpState, command: &CommandId, execution: &ExecutionId, step: u32) {
    // Past the 10 ms throttle, so the report is written at once.
    tokio::time::sleep(Duration::from_millis(20)).await;
    state
        .mcp()
        .queue()
        .report_progress(
            &desktop(),
            command,
            execution,
            Some(format!("step {step} of 3")),
            Some(f64::from(step * 30)),
        )
        .await
        .unwrap();
}

async fn complete(state: &HttpState, command: &CommandId, execution: &ExecutionId) {
    let envelope = ResultEnvelope::build(
        execution.clone(),
        FinishStatus::Completed,
        EnvelopeBody {
            result: json!("done"),
            ..Default::default()
        },
    );
    state
        .mcp()
        .queue()
        .complete(&desktop(), command, &envelope)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_waiting_get_with_a_progress_token_streams_progress_then_the_result() {
    let (state, url) = server().await;
    let (command, execution) = running(&state, &url, "progress-sse-1").await;
    let response = post(
        &url,
        "tools/call",
        Some("get_graph_run"),
        json!({"name": "get_graph_run", "arguments": {"command_id": command.to_string(), "wait_seconds": 15},
               "_meta": {"progressToken": "tok-1"}}),
        "application/json, text/event-stream",
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = Events {
        response,
        buffer: String::new(),
    };
    let first = events.next().await.unwrap();
    assert_eq!(first["method"], "notifications/progress");
    assert_eq!(first["params"]["progressToken"], "tok-1");
    assert_eq!(first["params"]["progress"], 0.0);
    assert_eq!(
        first["params"]["message"],
        "Running on the owner's desktop."
    );
    for step in 1..=3 {
        report(&state, &command, &execution, step).await;
        let event = events.next().await.unwrap();
        assert_eq!(
            event["params"],
            json!({"progressToken": "tok-1", "progress": f64::from(step * 30), "total": 100,
                   "message": format!("Running on the owner's desktop: step {step} of 3 ({}%).", step * 30)})
        );
    }
    complete(&state, &command, &execution).await;
    let last = events.next().await.unwrap();
    assert_eq!(last["id"], 5);
    assert_eq!(last["result"]["structuredContent"]["status"], "completed");
    assert_eq!(
        last["result"]["structuredContent"]["progress"]["percent"],
        90.0
    );
    assert!(
        events.next().await.is_none(),
        "the stream ends after the result"
    );
}

#[tokio::test]
async fn without_a_token_or_without_sse_the_answer_is_one_json_body() {
    let (state, url) = server().await;
    let (command, execution) = running(&state, &url, "progress-json-1").await;
    report(&state, &command, &execution, 1).await;
    // No progress token: JSON, at once with wait 0.
    let plain = post(
        &url,
        "tools/call",
        Some("get_graph_run"),
        json!({"name": "get_graph_run", "arguments": {"command_id": command.to_string()}}),
        "application/json, text/event-stream",
    )
    .await;
    assert_eq!(plain.headers()["content-type"], "application/json");
    let body: Value = plain.json().await.unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["progress"]["message"],
        "step 1 of 3"
    );
    // A token, but the client takes JSON only: one JSON body once the run ends.
    let waiting = tokio::spawn({
        let url = url.clone();
        async move {
            post(
                &url,
                "tools/call",
                Some("get_graph_run"),
                json!({"name": "get_graph_run", "arguments": {"command_id": command.to_string(), "wait_seconds": 15},
                       "_meta": {"progressToken": 7}}),
                "application/json",
            )
            .await
        }
    });
    let queue = state.mcp().queue().clone();
    eventually(Duration::from_secs(10), "the call waits", || {
        queue.signals().waiting() > 0
    })
    .await;
    complete(&state, &command, &execution).await;
    let response = waiting.await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["result"]["structuredContent"]["status"], "completed");
}

#[tokio::test]
async fn listen_streams_each_progress_report_as_a_status_message() {
    let (state, url) = server().await;
    let (command, execution) = running(&state, &url, "progress-listen-1").await;
    let response = post(
        &url,
        "subscriptions/listen",
        None,
        json!({"notifications": {"taskIds": [command.to_string()]}}),
        "application/json, text/event-stream",
    )
    .await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = Events {
        response,
        buffer: String::new(),
    };
    assert_eq!(
        events.next().await.unwrap()["method"],
        "notifications/subscriptions/acknowledged"
    );
    let running = events.next().await.unwrap();
    assert_eq!(
        running["params"]["statusMessage"],
        "Running on the owner's desktop."
    );
    for step in 1..=3 {
        report(&state, &command, &execution, step).await;
        let task = events.next().await.unwrap();
        assert_eq!(task["method"], "notifications/tasks");
        assert_eq!(task["params"]["status"], "working");
        assert_eq!(
            task["params"]["statusMessage"],
            format!(
                "Running on the owner's desktop: step {step} of 3 ({}%).",
                step * 30
            )
        );
    }
    complete(&state, &command, &execution).await;
    let done = events.next().await.unwrap();
    assert_eq!(done["params"]["status"], "completed");
    assert_eq!(
        events.next().await.unwrap()["result"]["resultType"],
        "complete"
    );
}
