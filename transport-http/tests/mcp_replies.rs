//! The replies only Streamable HTTP gives an agent (header rules, sessions,
//! media types, bearer challenges, body limits), pinned by insta snapshots
//! (`transport-http/tests/snapshots/`) with their HTTP status; every
//! JSON-RPC body among them decodes with the official SDK's model types
//! (rmcp). The replies of the MCP methods themselves are pinned in core
//! (`core/src/mcp/snapshots/`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::{HttpConfig, HttpState, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const FULL: &str = "tok-full";
const READER: &str = "tok-reader";
const OTHER: &str = "tok-other";
const HOST: &str = "127.0.0.1:8787";

fn state() -> HttpState {
    let queue = Queue::new(
        Arc::new(MemoryStore::new()),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let agent = |name: &str, token: &str, scopes: &[&str]| AgentToken {
        name: name.into(),
        owner: "alice".into(),
        projects: vec!["p1".into()],
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        token_sha256: hash_token(token),
        revoked: false,
    };
    let tokens = TokenConfig {
        agents: vec![
            agent("assistant", FULL, &[READ_SCOPE, RUN_SCOPE]),
            agent("reader", READER, &[READ_SCOPE]),
            agent("helper", OTHER, &[READ_SCOPE, RUN_SCOPE]),
        ],
        devices: vec![],
    };
    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "test"),
    );
    HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens).unwrap()),
        HttpConfig {
            listen_addr: Some(HOST.parse().unwrap()),
            max_body_bytes: 4096,
            ..HttpConfig::default()
        },
    )
}

struct Reply {
    status: u16,
    session: Option<String>,
    body: Value,
}

async fn send(state: &HttpState, request: Request<Body>) -> Reply {
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    // A body that is not JSON (the body limit's plain text) is kept as text.
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Reply {
        status,
        session,
        body,
    }
}

/// A `POST /mcp` with the usual headers, then `headers` (which may repeat one to override it).
fn post(token: Option<&str>, headers: &[(&str, &str)], body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post("/mcp").header("host", HOST);
    let overridden = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if !overridden("content-type") {
        request = request.header("content-type", "application/json");
    }
    if !overridden("accept") {
        request = request.header("accept", "application/json, text/event-stream");
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.body(body.into()).unwrap()
}

fn modern_params(method: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string()
}

/// Every HTTP-only reply, named, in a fixed order.
async fn replies() -> Vec<(&'static str, Reply)> {
    let s = state();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let mut out = Vec::new();

    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let initialized = send(&s, post(Some(FULL), &[], init)).await;
    assert_eq!(initialized.status, 200);
    let session = initialized.session.clone().expect("a session id");

    out.push((
        "http_missing_session",
        send(&s, post(Some(FULL), &[], list.clone())).await,
    ));
    out.push((
        "http_unknown_session",
        send(
            &s,
            post(Some(FULL), &[("mcp-session-id", "nope")], list.clone()),
        )
        .await,
    ));
    out.push((
        "http_another_agents_session",
        send(
            &s,
            post(Some(OTHER), &[("mcp-session-id", &session)], list.clone()),
        )
        .await,
    ));
    out.push((
        "http_session_version_mismatch",
        send(
            &s,
            post(
                Some(FULL),
                &[
                    ("mcp-session-id", &session),
                    ("mcp-protocol-version", "2025-06-18"),
                ],
                list.clone(),
            ),
        )
        .await,
    ));
    out.push((
        "http_modern_without_mcp_method",
        send(
            &s,
            post(
                Some(FULL),
                &[("mcp-protocol-version", "2026-07-28")],
                modern_params("tools/list"),
            ),
        )
        .await,
    ));
    out.push((
        "http_mcp_method_mismatch",
        send(
            &s,
            post(
                Some(FULL),
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", "server/discover"),
                ],
                modern_params("tools/list"),
            ),
        )
        .await,
    ));
    out.push((
        "http_scope_denied",
        send(
            &s,
            post(
                Some(READER),
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", "tools/call"),
                    ("mcp-name", "run_graph_session"),
                ],
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": "run_graph_session", "arguments": {},
                    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                              "io.modelcontextprotocol/clientCapabilities": {}}}})
                .to_string(),
            ),
        )
        .await,
    ));
    out.push((
        "http_wrong_content_type",
        send(
            &s,
            post(Some(FULL), &[("content-type", "text/plain")], list.clone()),
        )
        .await,
    ));
    out.push((
        "http_not_acceptable",
        send(
            &s,
            post(Some(FULL), &[("accept", "text/html")], list.clone()),
        )
        .await,
    ));
    out.push((
        "http_body_too_large",
        send(&s, post(Some(FULL), &[], vec![b' '; 8192])).await,
    ));
    out.push((
        "http_no_token",
        send(&s, post(None, &[], list.clone())).await,
    ));
    out.push((
        "http_unknown_token",
        send(&s, post(Some("tok-unknown"), &[], list.clone())).await,
    ));
    out
}

fn render(reply: &Reply) -> String {
    format!(
        "HTTP {}\n{}",
        reply.status,
        serde_json::to_string_pretty(&reply.body).unwrap()
    )
}

#[tokio::test]
async fn every_http_only_reply_matches_its_snapshot() {
    for (name, reply) in replies().await {
        insta::assert_snapshot!(name, render(&reply));
    }
}

#[tokio::test]
async fn every_json_rpc_reply_decodes_with_rmcp() {
    let mut decoded = 0;
    for (name, reply) in replies().await {
        if reply.body.get("jsonrpc").is_none() {
            // Refused before MCP: an OAuth2 error body (401/403, RFC 6750)
            // or the body limit's plain text (413).
            assert!(
                reply.body["error"].is_string() || reply.status == 413,
                "{name}: {}",
                reply.body
            );
            continue;
        }
        let message: rmcp::model::ServerJsonRpcMessage = serde_json::from_value(reply.body.clone())
            .unwrap_or_else(|e| panic!("{name}: rmcp cannot decode it: {e}\n{:#}", reply.body));
        assert!(
            matches!(message, rmcp::model::JsonRpcMessage::Error(_)),
            "{name}: not an error"
        );
        let _: rmcp::model::ErrorData = serde_json::from_value(reply.body["error"].clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        decoded += 1;
    }
    assert!(decoded >= 8, "{decoded} JSON-RPC replies");
}
