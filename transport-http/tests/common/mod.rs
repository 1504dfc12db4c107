//! A server for the edge tests (authorization, hosts, connections,
//! revocation, sessions): two owners that reuse an agent name, agents with
//! no, read and run scopes, one shared session, driven through the router
//! (`oneshot`) or served on a real socket with `serve`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{AgentToken, DeviceToken, TokenConfig, hash_token};
use graph_relay_transport_http::{
    HttpConfig, HttpState, ServeConfig, TokioSleeper, auth::Authenticator, router, serve,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tower::ServiceExt;

pub const GS: &str = "gs_0123456789abcdef0123456789abcdef";
/// alice/assistant, read and run.
pub const FULL: &str = "tok-full";
/// alice/assistant again, with the read scope only.
pub const ASSISTANT_READ: &str = "tok-assistant-read";
/// alice/assistant again, without any osfoundry scope.
pub const ASSISTANT_NONE: &str = "tok-assistant-none";
/// alice/reader, read only.
pub const READER: &str = "tok-reader";
/// alice/nobody, no osfoundry scope.
pub const NOSCOPE: &str = "tok-noscope";
/// bob/assistant: another owner's agent with the same name as alice's.
pub const BOB: &str = "tok-bob";
/// alice/desktop, a device.
pub const DEVICE: &str = "tok-device";
/// The `Host` oneshot requests carry.
pub const HOST: &str = "127.0.0.1:8787";

pub fn agent_token(owner: &str, name: &str, token: &str, scopes: &[&str]) -> AgentToken {
    AgentToken {
        name: name.into(),
        owner: owner.into(),
        projects: vec!["p1".into()],
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        token_sha256: hash_token(token),
        revoked: false,
    }
}

/// The tokens every edge test starts from.
pub fn tokens() -> TokenConfig {
    TokenConfig {
        agents: vec![
            agent_token("alice", "assistant", FULL, &[READ_SCOPE, RUN_SCOPE]),
            agent_token("alice", "assistant", ASSISTANT_READ, &[READ_SCOPE]),
            agent_token("alice", "assistant", ASSISTANT_NONE, &["profile:email"]),
            agent_token("alice", "reader", READER, &[READ_SCOPE]),
            agent_token("alice", "nobody", NOSCOPE, &["profile:email"]),
            agent_token("bob", "assistant", BOB, &[READ_SCOPE, RUN_SCOPE]),
        ],
        devices: vec![DeviceToken {
            name: "desktop".into(),
            owner: "alice".into(),
            token_sha256: hash_token(DEVICE),
            revoked: false,
        }],
    }
}

/// The token file text of `tokens`.
pub fn token_file(tokens: &TokenConfig) -> String {
    toml::to_string(tokens).expect("tokens as TOML")
}

/// The device that runs alice's Graphs.
pub fn desktop() -> Device {
    Device::new(
        DeviceId::parse("desktop").unwrap(),
        OwnerId::parse("alice").unwrap(),
    )
}

/// A state over a fresh memory store with `GS` shared to alice's `p1` (and
/// bob's `p1`); `get_graph_run` may wait up to 20 s.
pub async fn state(config: HttpConfig, auth: Arc<dyn Authenticator>) -> HttpState {
    state_with_queue(config, auth, QueueConfig::default()).await
}

/// [`state`] with the queue configured by `queue_config`.
pub async fn state_with_queue(
    config: HttpConfig,
    auth: Arc<dyn Authenticator>,
    queue_config: QueueConfig,
) -> HttpState {
    let store = Arc::new(MemoryStore::new());
    // Shared as a desktop's sync would (straight into the store).
    for owner in ["alice", "bob"] {
        store
            .replace_shared_sessions(
                &OwnerId::parse(owner).unwrap(),
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
    }
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        queue_config,
    );
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(20))
        .build()
        .unwrap();
    let server = McpServer::new(queue, catalog, ServerInfo::new("graph-relay", "test"))
        .with_sleeper(Arc::new(TokioSleeper));
    HttpState::new(server, auth, config)
}

/// A state with the static `tokens()`, pretending to listen on `HOST`.
pub async fn static_state(config: HttpConfig) -> HttpState {
    let auth = graph_relay_transport_http::auth::StaticTokens::new(&tokens()).unwrap();
    state(
        HttpConfig {
            listen_addr: config.listen_addr.or(Some(HOST.parse().unwrap())),
            ..config
        },
        Arc::new(auth),
    )
    .await
}

/// A reply read to its end.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

pub async fn send(state: &HttpState, request: Request<Body>) -> Reply {
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// `POST /mcp` with `token` and extra `headers`.
pub fn post(token: Option<&str>, headers: &[(&str, &str)], body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post("/mcp")
        .header("host", HOST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.body(body.into()).unwrap()
}

/// The per-request `_meta` of 2026-07-28, declaring the tasks extension.
pub fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    })
}

/// A 2026-07-28 request: body and headers.
pub fn modern(method: &str, params: Value) -> (String, Vec<(String, String)>) {
    let mut params = params;
    params["_meta"] = modern_meta();
    let mut headers = vec![
        ("mcp-protocol-version".to_owned(), "2026-07-28".to_owned()),
        ("mcp-method".to_owned(), method.to_owned()),
    ];
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str);
    if let Some(name) = name {
        headers.push(("mcp-name".to_owned(), name.to_owned()));
    }
    (
        json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params}).to_string(),
        headers,
    )
}

/// Sends a 2026-07-28 request with `token` through the router.
pub async fn call_modern(state: &HttpState, token: &str, method: &str, params: Value) -> Reply {
    let (body, headers) = modern(method, params);
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    send(state, post(Some(token), &headers, body)).await
}

/// `run_graph_session` as a task; returns the task (command) id.
pub async fn run(state: &HttpState, token: &str, key: &str) -> String {
    let reply = call_modern(
        state,
        token,
        "tools/call",
        json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS, "idempotency_key": key}}),
    )
    .await;
    reply.body["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {}", reply.body))
        .to_owned()
}

/// The `initialize` body of a legacy client; `client_info` is its `clientInfo`.
pub fn initialize_body(client_info: &Value) -> String {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client_info}})
    .to_string()
}

/// Initializes a legacy session as `token`; returns its id.
pub async fn initialize(state: &HttpState, token: &str) -> String {
    let reply = send(
        state,
        post(
            Some(token),
            &[],
            initialize_body(&json!({"name": "t", "version": "1"})),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.headers["mcp-session-id"].to_str().unwrap().to_owned()
}

/// `tools/list` inside session `id` as `token`: its status.
pub async fn use_session(state: &HttpState, token: &str, id: &str) -> StatusCode {
    send(
        state,
        post(
            Some(token),
            &[
                ("mcp-session-id", id),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        ),
    )
    .await
    .status
}

/// Binds 127.0.0.1:0, builds the state (listening address set) with
/// `make`, and serves it with `serve_config`; returns the state and address.
pub async fn serve_on_socket<F, Fut>(make: F, serve_config: ServeConfig) -> (HttpState, SocketAddr)
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = HttpState>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = make(addr).await;
    let app = router(state.clone());
    tokio::spawn(serve(listener, app, serve_config, std::future::pending()));
    (state, addr)
}

/// Polls `check` every 10 ms until it is true; panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads one response head from a raw socket (up to the blank line),
/// byte by byte so that nothing after it is consumed.
pub async fn read_head(stream: &mut TcpStream, within: Duration) -> String {
    let mut text = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(within, async {
        while !text.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("read");
            assert!(
                n > 0,
                "closed before a response: {}",
                String::from_utf8_lossy(&text)
            );
            text.push(byte[0]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no response head within {within:?}"));
    String::from_utf8_lossy(&text).into_owned()
}
