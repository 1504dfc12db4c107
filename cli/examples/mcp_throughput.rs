//! Requests/s and p50/p99 of `tools/call` (`get_graph_run`, `run_graph_session`)
//! through the `/mcp` router in-process (`oneshot`) and over loopback HTTP/1.1
//! (one keep-alive connection), on a SQLite store in a temporary directory.
//! Run: `cargo run --release -p graph-relay --example mcp_throughput [N]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::{HttpConfig, HttpState, router};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tower::ServiceExt;

const GS: &str = "gs_0123456789abcdef0123456789abcdef";

fn body(i: usize, tool: &str, command: &str) -> String {
    let args = if tool == "run_graph_session" {
        format!(r#"{{"graph_session_id":"{GS}","idempotency_key":"bench-key-{i:08}"}}"#)
    } else {
        format!(r#"{{"command_id":"{command}"}}"#)
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{tool}","arguments":{args},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    )
}

/// True when `bytes` is a successful, non-error tool result.
fn succeeded(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .is_ok_and(|v| v["result"]["isError"] == serde_json::Value::Bool(false))
}

fn report(label: &str, mut samples: Vec<Duration>, total: Duration) {
    samples.sort_unstable();
    let p = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{label:<44} {:>8.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs  (n={})",
        samples.len() as f64 / total.as_secs_f64(),
        p(0.50).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        samples.len()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let store = Arc::new(graph_relay_store_sqlite::SqliteStore::open(
        dir.path().join("bench.db"),
    )?);
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let owner = OwnerId::parse("alice")?;
    let device = Device::new(DeviceId::parse("desktop")?, owner.clone());
    let meta = SessionMeta {
        graph_session_id: GraphSessionId::parse(GS)?,
        name: "Bench".into(),
        description: "".into(),
        slug: "bench".into(),
        version: "1".into(),
        status: "ready".into(),
    };
    queue
        .sync(
            &device,
            &SyncRequest {
                project: ProjectId::parse("p1")?,
                sessions: vec![meta],
                long_poll: false,
                restarted: false,
                running: None,
            },
        )
        .await?;
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "bench".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token("bench-token"),
            revoked: false,
        }],
        devices: vec![],
    };
    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "bench"),
    );
    let state = HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens)?),
        HttpConfig::default(),
    );
    let app = router(state);
    let send = |b: String| {
        Request::post("/mcp")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("authorization", "Bearer bench-token")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header(
                "mcp-name",
                if b.contains("run_graph_session") {
                    "run_graph_session"
                } else {
                    "get_graph_run"
                },
            )
            .body(Body::from(b))
            .unwrap()
    };
    // One run to read.
    let first = app
        .clone()
        .oneshot(send(body(usize::MAX / 2, "run_graph_session", "")))
        .await?;
    let bytes = axum::body::to_bytes(first.into_body(), 1 << 20).await?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)?;
    let command = v["result"]["structuredContent"]["command_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    for (tool, offset) in [("get_graph_run", 0), ("run_graph_session", 0)] {
        let mut samples = Vec::with_capacity(n);
        let start = Instant::now();
        for i in 0..n {
            let t = Instant::now();
            let response = app
                .clone()
                .oneshot(send(body(offset + i, tool, &command)))
                .await?;
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
            samples.push(t.elapsed());
            if !succeeded(&bytes) {
                return Err(
                    format!("{tool} #{i} failed: {}", String::from_utf8_lossy(&bytes)).into(),
                );
            }
        }
        report(
            &format!("in-process {tool} (sqlite)"),
            samples,
            start.elapsed(),
        );
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut conn = BufReader::new(stream);
    for (tool, offset) in [("get_graph_run", 0), ("run_graph_session", n)] {
        let mut samples = Vec::with_capacity(n);
        let start = Instant::now();
        for i in 0..n {
            let b = body(offset + i, tool, &command);
            let request = format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer bench-token\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            );
            let t = Instant::now();
            conn.get_mut().write_all(request.as_bytes()).await?;
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                conn.read_line(&mut line).await?;
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse()?;
                }
            }
            let mut buf = vec![0; length];
            conn.read_exact(&mut buf).await?;
            samples.push(t.elapsed());
            if !succeeded(&buf) {
                return Err(
                    format!("{tool} #{i} failed: {}", String::from_utf8_lossy(&buf)).into(),
                );
            }
        }
        report(
            &format!("loopback {tool} (sqlite)"),
            samples,
            start.elapsed(),
        );
    }
    Ok(())
}
