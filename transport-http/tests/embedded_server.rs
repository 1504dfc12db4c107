//! A server embedded the way `examples/api_key_server.rs` embeds it, on
//! real sockets: what only a whole server runs must run here too. A run
//! whose desktop stops reporting ends `failed` when its lease lapses (the
//! queue's maintenance, seen in the store itself, not through a read that
//! would close it anyway), a coalesced progress report is written and
//! reaches the agent without another report, and a connection that never
//! sends a request head is closed by the header-read timeout.

#[allow(dead_code)]
#[path = "../examples/api_key_server.rs"]
mod api_key_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::ids::{AgentId, CommandId, OwnerId};
use graph_relay_core::queue::QueueConfig;
use graph_relay_core::store::Store;
use graph_relay_transport_http::relay_wire::RELAY_PREFIX;
use graph_relay_transport_http::{ServeConfig, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const AGENT_KEY: &str = "agent-key-0123456789";
const DEVICE_KEY: &str = "device-key-0123456789";
const GS: &str = "gs_0123456789abcdef0123456789abcdef";
/// How long a test waits for what the server does on its own.
const PATIENCE: Duration = Duration::from_secs(20);

/// The example's server with `queue` and `serve` settings, serving on a
/// loopback port until the test ends; its base URL and store.
async fn embedded(queue: QueueConfig, serve: ServeConfig) -> (String, Arc<dyn Store>) {
    let keys = api_key_server::example_keys(AGENT_KEY, DEVICE_KEY).expect("keys");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server: Server = api_key_server::builder(keys)
        .queue_config(queue)
        .serve_config(serve)
        .build(listener)
        .await
        .expect("build");
    let base = format!("http://{}", server.local_addr());
    let store = server.queue().store().clone();
    tokio::spawn(server.serve(std::future::pending()));
    (base, store)
}

async fn relay(base: &str, path: &str, body: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{base}{RELAY_PREFIX}{path}"))
        .header("x-api-key", DEVICE_KEY)
        .json(&body)
        .send()
        .await
        .expect("relay request");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.expect("relay answer")
}

/// A 2026-07-28 `tools/call` of `tool` by alice's agent; its structured content.
async fn call(base: &str, tool: &str, arguments: Value) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta}});
    let reply: Value = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("x-api-key", AGENT_KEY)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&body)
        .send()
        .await
        .expect("mcp request")
        .json()
        .await
        .expect("mcp answer");
    reply["result"]["structuredContent"].clone()
}

/// The desktop shares the session, the agent queues a run, the desktop
/// picks it up and starts it as `execution`; its command id.
async fn running_run(base: &str, key: &str, execution: &str) -> CommandId {
    let sync = json!({"project_id": "p1", "long_poll": false, "sessions": [
        {"graph_session_id": GS, "name": "Drafts", "slug": "drafts", "version": "1", "status": "ready"}
    ]});
    relay(base, "/sync", sync.clone()).await;
    let ticket = call(
        base,
        "run_graph_session",
        json!({"graph_session_id": GS, "idempotency_key": key}),
    )
    .await;
    let id = ticket["command_id"].as_str().expect("a ticket").to_owned();
    let picked = relay(base, "/sync", sync).await;
    assert_eq!(picked["commands"][0]["command_id"], id.as_str(), "{picked}");
    relay(
        base,
        &format!("/commands/{id}/start"),
        json!({"execution_id": execution}),
    )
    .await;
    CommandId::parse(&id).expect("a command id")
}

/// The command as stored, read from the store itself (a queue read would
/// close a lapsed run by itself).
async fn stored(store: &Arc<dyn Store>, id: &CommandId) -> CommandRecord {
    let owner = OwnerId::parse("alice").expect("owner");
    let agent = AgentId::parse("assistant").expect("agent");
    store
        .command_for_agent(&owner, &agent, id)
        .await
        .expect("store read")
        .expect("the command")
}

/// Waits until the stored command satisfies `done`.
async fn until_stored(
    store: &Arc<dyn Store>,
    id: &CommandId,
    what: &str,
    done: impl Fn(&CommandRecord) -> bool,
) -> CommandRecord {
    let started = Instant::now();
    loop {
        let record = stored(store, id).await;
        if done(&record) {
            return record;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: still {record:?} after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_desktop_stops_reporting_fails_when_its_lease_lapses() {
    // Interval mode: a lease of two 1 s control intervals.
    let queue = QueueConfig {
        control_interval: Duration::from_secs(1),
        lease_interval_controls: 2,
        ..QueueConfig::default()
    };
    let (base, store) = embedded(queue, ServeConfig::default()).await;
    let id = running_run(&base, "lease-key-1", "exec-lease").await;
    // The desktop says nothing more; nobody reads the run.
    let record = until_stored(&store, &id, "the lapsed run", |r| {
        r.status != CommandStatus::Running
    })
    .await;
    assert_eq!(record.status, CommandStatus::Failed, "{record:?}");
    let view = call(
        &base,
        "get_graph_run",
        json!({"command_id": id.to_string()}),
    )
    .await;
    assert_eq!(view["status"], "failed", "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_progress_report_reaches_the_agent() {
    let (base, store) = embedded(QueueConfig::default(), ServeConfig::default()).await;
    let id = running_run(&base, "progress-key-1", "exec-progress").await;
    let path = format!("/commands/{id}/progress");
    // The first report is written; the second, within the progress
    // interval, is only kept, until the maintenance writes it.
    relay(
        &base,
        &path,
        json!({"execution_id": "exec-progress", "message": "first", "percent": 10}),
    )
    .await;
    let second = relay(
        &base,
        &path,
        json!({"execution_id": "exec-progress", "message": "second", "percent": 20}),
    )
    .await;
    assert_eq!(second["recorded"], "coalesced", "{second}");
    until_stored(&store, &id, "the coalesced report", |r| {
        r.progress
            .as_ref()
            .is_some_and(|p| p.message.as_deref() == Some("second"))
    })
    .await;
    let view = call(
        &base,
        "get_graph_run",
        json!({"command_id": id.to_string()}),
    )
    .await;
    assert_eq!(view["status"], "running", "{view}");
    assert!(view.to_string().contains("second"), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_head_is_closed() {
    let serve = ServeConfig {
        header_read_timeout: Duration::from_secs(1),
        ..ServeConfig::default()
    };
    let (base, _store) = embedded(QueueConfig::default(), serve).await;
    let address = base.trim_start_matches("http://").to_owned();
    for opening in [&b""[..], b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"] {
        let mut stream = tokio::net::TcpStream::connect(&address)
            .await
            .expect("connect");
        stream.write_all(opening).await.expect("write");
        let started = Instant::now();
        let mut buffer = Vec::new();
        // The server answers 408 or just closes; either way the read ends.
        let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut buffer)).await;
        assert!(
            read.is_ok(),
            "still open after {PATIENCE:?} with {opening:?} sent"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "closed only after {:?}",
            started.elapsed()
        );
    }
}
