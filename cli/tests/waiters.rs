//! `get_graph_run {wait_seconds}` over real HTTP: many calls wait at once
//! and each returns `completed` as soon as its run completes (woken by the
//! queue, well before the wait would have ended). Not timed: the figures are
//! in `cargo run --release -p graph-relay --example waiters`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_sqlite::SqliteStore;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::{HttpConfig, HttpState, TokioSleeper, router};
use serde_json::{Value, json};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const AGENT_TOKEN: &str = "gra_waiters_test_token";
const CALLS: usize = 50;
/// What each call asks for: far longer than the test may take, so a call
/// that returns `completed` was woken by its run, not by its timer.
const WAIT_SECONDS: u32 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_waiting_calls_return_completed_once_their_runs_complete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::new(
        Arc::new(SqliteStore::open(dir.path().join("queue.db")).expect("store")),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(WAIT_SECONDS))
        .build()
        .expect("catalog");
    let server = McpServer::new(
        queue.clone(),
        catalog,
        ServerInfo::new("graph-relay", "test"),
    )
    .with_sleeper(Arc::new(TokioSleeper));
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "waiter".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(AGENT_TOKEN),
            revoked: false,
        }],
        devices: vec![],
    };
    let state = HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens).expect("tokens")),
        HttpConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });

    let owner = OwnerId::parse("alice").expect("owner");
    let project = ProjectId::parse("p1").expect("project");
    let device = Device::new(DeviceId::parse("desktop").expect("device"), owner.clone());
    queue
        .sync(
            &device,
            &SyncRequest {
                project: project.clone(),
                sessions: vec![SessionMeta {
                    graph_session_id: GraphSessionId::parse(GS).expect("session"),
                    name: "Waiters".into(),
                    description: "".into(),
                    slug: "waiters".into(),
                    version: "1".into(),
                    status: "ready".into(),
                }],
                long_poll: true,
                restarted: false,
                running: None,
            },
        )
        .await
        .expect("sync");
    let agent = Agent::new(AgentId::parse("waiter").expect("agent"), owner, [project]);
    let mut runs = Vec::new();
    for i in 0..CALLS {
        let ticket = queue
            .run_graph_session(
                &agent,
                RunArgs {
                    graph_session_id: GraphSessionId::parse(GS).expect("session"),
                    arguments: serde_json::Map::new(),
                    idempotency_key: IdempotencyKey::parse(&format!("waiter-key-{i:04}"))
                        .expect("key"),
                },
            )
            .await
            .expect("queued");
        runs.push(ticket.command.id);
    }

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CALLS)
        .build()
        .expect("client");
    let calls: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let client = client.clone();
            let url = url.clone();
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                "name": "get_graph_run",
                "arguments": {"command_id": id.to_string(), "wait_seconds": WAIT_SECONDS},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}}}});
            tokio::spawn(async move {
                let reply: Value = client
                    .post(&url)
                    .bearer_auth(AGENT_TOKEN)
                    .header("accept", "application/json")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", "get_graph_run")
                    .json(&body)
                    .send()
                    .await
                    .expect("HTTP answer")
                    .json()
                    .await
                    .expect("JSON body");
                reply
            })
        })
        .collect();

    // Every call is parked on the queue, none has answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue.signals().waiting() < CALLS {
        assert!(
            Instant::now() < deadline,
            "only {} of {CALLS} calls parked",
            queue.signals().waiting()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "a call returned before its run completed"
    );

    // The relay side starts and completes each run.
    let opened_wait = Instant::now();
    for (i, id) in runs.iter().enumerate() {
        let execution = ExecutionId::parse(&format!("exec-{i:04}")).expect("execution");
        queue.start(&device, id, &execution).await.expect("start");
        let envelope = ResultEnvelope::build(
            execution,
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!({"n": i}),
                ..EnvelopeBody::default()
            },
        );
        queue
            .complete(&device, id, &envelope)
            .await
            .expect("complete");
    }

    for (i, (call, id)) in calls.into_iter().zip(&runs).enumerate() {
        let reply = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("woken by the completion, not by the end of the wait")
            .expect("call task");
        let run = &reply["result"]["structuredContent"];
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        assert_eq!(run["command_id"], id.to_string(), "{reply}");
        assert_eq!(run["status"], "completed", "{reply}");
        assert_eq!(run["result"], json!({"n": i}), "{reply}");
    }
    assert!(
        opened_wait.elapsed() < Duration::from_secs(u64::from(WAIT_SECONDS)),
        "the calls only returned when their wait ended"
    );
}
