//! MCP progress notifications end to end over a real socket: the official
//! Python `mcp` 2.3.0 client waits for a run with `get_graph_run`
//! (`wait_seconds`) and a progress callback, in both protocol eras, while
//! a simulated desktop reports five steps through `Queue::report_progress`.
//! The client must see the five steps in order, as they happen (the desktop
//! reports the next step only once the client printed the previous one),
//! then the result.
//!
//! The server runs in this process (the HTTP transport's `serve` on
//! 127.0.0.1:0) so the test can act as the desktop on the same queue. A
//! machine without Python opts out with `GRAPH_RELAY_SKIP=peers`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::{HttpConfig, HttpState, ServeConfig, TokioSleeper};
use serde_json::json;

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const TOKEN: &str = "gra_progress_test_agent";

fn desktop() -> Device {
    Device::new(
        DeviceId::parse("desktop").unwrap(),
        OwnerId::parse("alice").unwrap(),
    )
}

/// Serves MCP on 127.0.0.1:0 over a memory queue with GS shared to
/// alice's `p1`; progress may be written every 10 ms.
async fn serve() -> (Queue, String) {
    let store = Arc::new(MemoryStore::new());
    store
        .replace_shared_sessions(
            &OwnerId::parse("alice").unwrap(),
            &ProjectId::parse("p1").unwrap(),
            &DeviceId::parse("desktop").unwrap(),
            &[SessionMeta {
                graph_session_id: GraphSessionId::parse(GS).unwrap(),
                name: "Drafts".into(),
                description: "".into(),
                slug: "drafts".into(),
                version: "1".into(),
                status: "ready".into(),
            }],
            SystemClock.now(),
        )
        .await
        .unwrap();
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig {
            progress_interval: Duration::from_millis(10),
            ..QueueConfig::default()
        },
    );
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(25))
        .build()
        .unwrap();
    let server = McpServer::new(
        queue.clone(),
        catalog,
        ServerInfo::new("graph-relay", "test"),
    )
    .with_sleeper(Arc::new(TokioSleeper));
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "assistant".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(TOKEN),
            revoked: false,
        }],
        devices: vec![],
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens).unwrap()),
        HttpConfig {
            listen_addr: Some(addr),
            ..HttpConfig::default()
        },
    );
    tokio::spawn(graph_relay_transport_http::serve(
        listener,
        graph_relay_transport_http::router(state),
        ServeConfig::default(),
        std::future::pending(),
    ));
    (queue, format!("http://{addr}/mcp"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn python_client_sees_each_progress_report_while_it_waits() {
    let python = common::peers().python;
    let (queue, url) = serve().await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/progress_flow.py");
    for mode in ["legacy", "2026-07-28"] {
        let mut child = Command::new(&python)
            .arg(&script)
            .args([mode, &url, TOKEN])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python");
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), lines.recv())
                .await
                .expect("the client said nothing for 30 s")
                .expect("the client ended early")
        };
        let queued = next().await;
        let command = CommandId::parse(queued.strip_prefix("queued ").expect(&queued)).unwrap();
        // The first notification: the run as the wait begins.
        let first = next().await;
        assert!(first.starts_with("progress 0"), "{first}");
        let device = desktop();
        let execution = ExecutionId::parse(&format!("exec-{mode}")).unwrap();
        queue.start(&device, &command, &execution).await.unwrap();
        let started = next().await;
        assert!(
            started.contains("Running on the owner's desktop"),
            "{started}"
        );
        for step in 1..=5u32 {
            let percent = f64::from(step * 20);
            // Past the throttle (10 ms), so each report is written at once.
            tokio::time::sleep(Duration::from_millis(20)).await;
            queue
                .report_progress(
                    &device,
                    &command,
                    &execution,
                    Some(format!("step {step} of 5")),
                    Some(percent),
                )
                .await
                .unwrap();
            let line = next().await;
            assert!(
                line.starts_with(&format!("progress {percent:.1} 100.0 "))
                    && line.contains(&format!("step {step} of 5 ({percent}%)")),
                "step {step}: {line}"
            );
        }
        let envelope = ResultEnvelope::build(
            execution,
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!("done"),
                ..Default::default()
            },
        );
        queue.complete(&device, &command, &envelope).await.unwrap();
        assert_eq!(next().await, "result completed");
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
