//! The `/mcp` endpoint through the router (`oneshot`) and over a real socket.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, StaticTokens, TokenConfig, hash_token,
};
use graph_relay_transport_http::{HttpConfig, HttpState, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const FULL: &str = "tok-full";
const READER: &str = "tok-reader";
const OTHER: &str = "tok-other";
const DEVICE: &str = "tok-device";

struct Harness {
    state: HttpState,
    store: Arc<MemoryStore>,
}

/// The address the harness's server pretends to listen on.
const LISTEN: &str = "127.0.0.1:8787";

async fn harness() -> Harness {
    harness_with(HttpConfig {
        listen_addr: Some(LISTEN.parse().unwrap()),
        ..HttpConfig::default()
    })
    .await
}

async fn harness_with(config: HttpConfig) -> Harness {
    let store = Arc::new(MemoryStore::new());
    let queue = Queue::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let device = Device::new(
        DeviceId::parse("desktop").unwrap(),
        OwnerId::parse("alice").unwrap(),
    );
    queue
        .sync(
            &device,
            &SyncRequest {
                project: ProjectId::parse("p1").unwrap(),
                sessions: vec![SessionMeta {
                    graph_session_id: GraphSessionId::parse(GS).unwrap(),
                    name: "Drafts".into(),
                    description: "".into(),
                    slug: "drafts".into(),
                    version: "1".into(),
                    status: "ready".into(),
                }],
                long_poll: false,
                restarted: false,
                running: None,
            },
        )
        .await
        .unwrap();
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
            AgentToken {
                revoked: true,
                ..agent("revoked", "tok-revoked", &[READ_SCOPE])
            },
        ],
        devices: vec![DeviceToken {
            name: "desktop".into(),
            owner: "alice".into(),
            token_sha256: hash_token(DEVICE),
            revoked: false,
        }],
    };
    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "test"),
    );
    let state = HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens).unwrap()),
        config,
    );
    Harness { state, store }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> Reply {
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn post(
        &self,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> Reply {
        let mut request = Request::post("/mcp")
            .header("host", "127.0.0.1:8787")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        self.send(request.body(body.into()).unwrap()).await
    }

    /// Initializes a legacy session; returns its id.
    async fn initialize(&self, token: &str) -> String {
        let reply = self
            .post(Some(token), &[], json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string())
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let id = reply
            .headers
            .get("mcp-session-id")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let note = self
            .post(
                Some(token),
                &[
                    ("mcp-session-id", &id),
                    ("mcp-protocol-version", "2025-11-25"),
                ],
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
            )
            .await;
        assert_eq!(note.status, StatusCode::ACCEPTED);
        id
    }

    async fn legacy_call(&self, token: &str, session: &str, tool: &str, arguments: Value) -> Reply {
        self.post(
            Some(token),
            &[("mcp-session-id", session), ("mcp-protocol-version", "2025-11-25")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}).to_string(),
        )
        .await
    }

    async fn modern(&self, token: &str, method: &str, params: Value) -> Reply {
        let mut params = params;
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut headers = vec![
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
        ];
        if !name.is_empty() {
            headers.push(("mcp-name", name.as_str()));
        }
        self.post(
            Some(token),
            &headers,
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(),
        )
        .await
    }
}

#[tokio::test]
async fn legacy_session_lists_tools_runs_reads_and_cancels() {
    let h = harness().await;
    let session = h.initialize(FULL).await;
    let list = h
        .post(
            Some(FULL),
            &[
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(
        list.body["result"]["tools"],
        ToolCatalog::published().tools_list()
    );
    let run = h
        .legacy_call(
            FULL,
            &session,
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "key-0001"}),
        )
        .await;
    assert_eq!(run.status, StatusCode::OK);
    let ticket = &run.body["result"]["structuredContent"];
    assert_eq!(ticket["status"], "queued");
    let id = ticket["command_id"].as_str().unwrap();
    let get = h
        .legacy_call(FULL, &session, "get_graph_run", json!({"command_id": id}))
        .await;
    assert_eq!(get.body["result"]["structuredContent"]["status"], "queued");
    let other = h.initialize(OTHER).await;
    let hidden = h
        .legacy_call(OTHER, &other, "get_graph_run", json!({"command_id": id}))
        .await;
    assert_eq!(hidden.body["result"]["isError"], true);
    assert_eq!(
        hidden.body["result"]["content"][0]["text"],
        "Graph run not found or access removed"
    );
    let cancel = h
        .legacy_call(
            FULL,
            &session,
            "cancel_graph_run",
            json!({"command_id": id}),
        )
        .await;
    assert_eq!(
        cancel.body["result"]["structuredContent"]["status"],
        "cancelled"
    );
    let ping = h
        .post(
            Some(FULL),
            &[("mcp-session-id", &session)],
            json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}).to_string(),
        )
        .await;
    assert_eq!(ping.body["result"], json!({}));
}

#[tokio::test]
async fn sessions_are_required_bound_and_deletable() {
    let h = harness().await;
    let no_session = h
        .post(
            Some(FULL),
            &[],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(no_session.status, StatusCode::BAD_REQUEST);
    let unknown = h
        .post(
            Some(FULL),
            &[("mcp-session-id", "nope")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let session = h.initialize(FULL).await;
    let stolen = h
        .post(
            Some(OTHER),
            &[("mcp-session-id", &session)],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(
        stolen.status,
        StatusCode::NOT_FOUND,
        "another agent cannot use the session"
    );
    let wrong_version = h
        .post(
            Some(FULL),
            &[
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "1999-01-01"),
            ],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(wrong_version.status, StatusCode::BAD_REQUEST);
    let delete = h
        .send(
            Request::delete("/mcp")
                .header("host", "localhost:8787")
                .header("authorization", format!("Bearer {FULL}"))
                .header("mcp-session-id", &session)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(delete.status, StatusCode::NO_CONTENT);
    let after = h
        .post(
            Some(FULL),
            &[("mcp-session-id", &session)],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
    let get = h
        .send(
            Request::get("/mcp")
                .header("host", "localhost:8787")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn modern_requests_are_stateless_and_header_checked() {
    let h = harness().await;
    let list = h.modern(FULL, "tools/list", json!({})).await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.body["result"]["resultType"], "complete");
    assert!(list.headers.get("mcp-session-id").is_none());
    let discover = h.modern(FULL, "server/discover", json!({})).await;
    assert_eq!(
        discover.body["result"]["supportedVersions"],
        json!(["2026-07-28"])
    );
    let run = h.modern(FULL, "tools/call", json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS, "idempotency_key": "key-0002"}})).await;
    assert_eq!(
        run.body["result"]["structuredContent"]["status"], "queued",
        "{}",
        run.body
    );

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}).to_string();
    let no_method = h
        .post(
            Some(FULL),
            &[("mcp-protocol-version", "2026-07-28")],
            body.clone(),
        )
        .await;
    assert_eq!(no_method.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_method.body["error"]["code"], -32020);
    let mismatch = h
        .post(
            Some(FULL),
            &[
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-method", "tools/list"),
            ],
            body,
        )
        .await;
    assert_eq!(mismatch.body["error"]["code"], -32020);
    let wrong_name = h
        .post(
            Some(FULL),
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "cancel_graph_run")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_graph_run", "arguments": {}, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}).to_string(),
        )
        .await;
    assert_eq!(wrong_name.body["error"]["code"], -32020);
    let unsupported = h
        .post(
            Some(FULL),
            &[("mcp-protocol-version", "1900-01-01"), ("mcp-method", "server/discover")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "1900-01-01", "io.modelcontextprotocol/clientCapabilities": {}}}}).to_string(),
        )
        .await;
    assert_eq!(unsupported.status, StatusCode::BAD_REQUEST);
    assert_eq!(unsupported.body["error"]["code"], -32022);
    assert_eq!(unsupported.body["error"]["data"]["requested"], "1900-01-01");
    let unknown = h.modern(FULL, "prompts/list", json!({})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], -32601);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_writes_nothing() {
    let h = harness().await;
    let session = h.initialize(FULL).await;
    let sid: &str = &session;
    let hdr = [("mcp-session-id", sid)];
    // Protocol-level refusals.
    for (body, status, code) in [
        ("{oops".to_owned(), StatusCode::BAD_REQUEST, -32700),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.to_owned(), StatusCode::BAD_REQUEST, -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#.to_owned(), StatusCode::BAD_REQUEST, -32600),
        (r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"get_graph_run"}}"#.to_owned(), StatusCode::BAD_REQUEST, -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#.to_owned(), StatusCode::OK, -32601),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm_rf","arguments":{}}}"#.to_owned(), StatusCode::OK, -32602),
    ] {
        let reply = h.post(Some(FULL), &hdr, body.clone()).await;
        assert_eq!(reply.status, status, "{body}");
        assert_eq!(reply.body["error"]["code"], code, "{body}");
        assert!(reply.body["error"]["message"].as_str().unwrap().len() > 10);
    }
    // Tool-argument refusals: isError results naming the field.
    for (tool, arguments, needle) in [
        (
            "run_graph_session",
            json!({"graph_session_id": 7, "idempotency_key": "key-0001"}),
            "`graph_session_id` must be a string",
        ),
        (
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "key-0001", "x": 1}),
            "unknown field `x`",
        ),
        (
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "k".repeat(7)}),
            "`idempotency_key` must be 8 to 128",
        ),
        (
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "k".repeat(129)}),
            "`idempotency_key` must be 8 to 128",
        ),
        (
            "get_graph_run",
            json!({"command_id": "not-a-uuid"}),
            "`command_id` must be a UUID",
        ),
        (
            "list_graph_sessions",
            json!({"project_id": "p1", "limit": 0}),
            "`limit` must be an integer from 1 to 50",
        ),
        (
            "list_graph_sessions",
            json!({"project_id": "p1", "limit": 51}),
            "`limit` must be an integer from 1 to 50",
        ),
    ] {
        let reply = h.legacy_call(FULL, sid, tool, arguments.clone()).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body["result"]["isError"], true, "{arguments}");
        let text = reply.body["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(needle), "{text}");
    }
    // Nothing was queued by any of it.
    let project = ProjectId::parse("p1").unwrap();
    let queued = graph_relay_core::store::Store::queued_commands(
        h.store.as_ref(),
        &OwnerId::parse("alice").unwrap(),
        &project,
        &DeviceId::parse("desktop").unwrap(),
        100,
    )
    .await
    .unwrap();
    assert!(queued.is_empty());
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let h = harness_with(HttpConfig {
        max_body_bytes: 1024,
        ..HttpConfig::default()
    })
    .await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(4096)
    );
    let reply = h.post(Some(FULL), &[], big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// `POST /mcp` makes the edge layers' checks itself; the
/// request timeout is one of them: a body that never arrives is 408, empty,
/// as the timeout layer answers on every other route.
#[tokio::test]
async fn a_post_whose_body_never_arrives_is_408() {
    let h = harness_with(HttpConfig {
        request_timeout: std::time::Duration::from_millis(200),
        ..HttpConfig::default()
    })
    .await;
    let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
    let reply = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        h.post(Some(FULL), &[], Body::from_stream(never)),
    )
    .await
    .expect("answered within the request timeout, not never");
    assert_eq!(reply.status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(reply.body, Value::Null, "an empty body");
    // The same timeout on another route: the relay API.
    let request = Request::post("/external-assistants/graph-relays/sync")
        .header("host", "127.0.0.1:8787")
        .header("authorization", format!("Bearer {DEVICE}"))
        .header("content-type", "application/json")
        .body(Body::from_stream(futures::stream::pending::<
            Result<axum::body::Bytes, std::io::Error>,
        >()))
        .unwrap();
    assert_eq!(h.send(request).await.status, StatusCode::REQUEST_TIMEOUT);
}

/// A body that breaks off while it is read is a JSON-RPC error naming why,
/// with nothing done.
#[tokio::test]
async fn a_post_whose_body_breaks_off_is_a_jsonrpc_error() {
    let h = harness().await;
    let broken = futures::stream::iter([
        Ok(axum::body::Bytes::from_static(b"{\"jsonrpc\":")),
        Err(std::io::Error::other("the peer went away")),
    ]);
    let reply = h.post(Some(FULL), &[], Body::from_stream(broken)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["error"]["code"], -32600, "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "Invalid request: the body could not be read: Failed to buffer the request body: "
        ) && message.contains("the peer went away"),
        "{message}"
    );
}

/// Methods other than `POST`, `GET` and `DELETE` on `/mcp`: the agent gate
/// answers first (401 and `Connection: close` without a token), then 405
/// naming the methods served, `POST` among them.
#[tokio::test]
async fn other_methods_on_mcp_are_405_listing_post() {
    let h = harness().await;
    let put = |token: Option<&str>| {
        let mut request = Request::put("/mcp").header("host", "127.0.0.1:8787");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(Body::empty()).unwrap()
    };
    let anonymous = h.send(put(None)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.headers["connection"], "close");
    let reply = h.send(put(Some(FULL))).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.headers["allow"], "GET,HEAD,POST,DELETE");
}

/// `GET` and `HEAD` on `/mcp` need no credentials: 405 naming the methods
/// that serve messages, the body only for `GET`; every method of `/mcp`
/// is checked for its Host first.
#[tokio::test]
async fn get_and_head_on_mcp_are_405_after_the_host_check() {
    let h = harness().await;
    for method in ["GET", "HEAD"] {
        let request = |host: &str| {
            Request::builder()
                .method(method)
                .uri("/mcp")
                .header("host", host)
                .body(Body::empty())
                .unwrap()
        };
        let reply = h.send(request("127.0.0.1:8787")).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(reply.headers["allow"], "POST, DELETE", "{method}");
        let described = reply.body["error"] == "method_not_allowed";
        assert_eq!(described, method == "GET", "{method}: {:?}", reply.body);
        let foreign = h.send(request("evil.example")).await;
        assert_eq!(foreign.status, StatusCode::FORBIDDEN, "{method}");
    }
}

#[tokio::test]
async fn tokens_are_checked_with_challenges() {
    let h = harness().await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}).to_string();
    let missing = h.post(None, &[], init.clone()).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    let challenge = missing
        .headers
        .get("www-authenticate")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp\""
    );
    let malformed = h
        .post(None, &[("authorization", "Basic abc")], init.clone())
        .await;
    assert_eq!(malformed.status, StatusCode::UNAUTHORIZED);
    assert!(
        malformed.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("invalid_request")
    );
    for token in ["tok-unknown", "tok-revoked"] {
        let reply = h.post(Some(token), &[], init.clone()).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert!(
            reply.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .contains("invalid_token")
        );
    }
    let device = h.post(Some(DEVICE), &[], init).await;
    assert_eq!(device.status, StatusCode::UNAUTHORIZED);
    assert!(
        device.body["error_description"]
            .as_str()
            .unwrap()
            .contains("device")
    );
}

#[tokio::test]
async fn a_read_only_token_cannot_run() {
    let h = harness().await;
    let session = h.initialize(READER).await;
    let reply = h
        .legacy_call(
            READER,
            &session,
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "key-0001"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let challenge = reply.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(challenge.contains("scope=\"osfoundry:run\""), "{challenge}");
    assert_eq!(reply.body["scope"], "osfoundry:run");
    let modern = h.modern(READER, "tools/call", json!({"name": "cancel_graph_run", "arguments": {"command_id": "67e55044-10b1-426f-9247-bb680e5fe0c8"}})).await;
    assert_eq!(modern.status, StatusCode::FORBIDDEN);
    let read = h
        .legacy_call(
            READER,
            &session,
            "list_graph_sessions",
            json!({"project_id": "p1"}),
        )
        .await;
    assert_eq!(read.status, StatusCode::OK);
}

#[tokio::test]
async fn hosts_and_origins_are_checked() {
    let h = harness().await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}).to_string();
    let request = |host: &str, origin: &str| {
        Request::post("/mcp")
            .header("host", host)
            .header("origin", origin)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {FULL}"))
            .body(Body::from(init.clone()))
            .unwrap()
    };
    assert_eq!(
        h.send(request("evil.example.com", "http://evil.example.com"))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        h.send(request("127.0.0.1:8787", "http://evil.example.com"))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        h.send(request("127.0.0.1:8787", "http://127.0.0.1:8787"))
            .await
            .status,
        StatusCode::OK
    );
    let custom = harness_with(HttpConfig {
        allowed_hosts: vec!["relay.example.com".into()],
        allowed_origins: vec!["https://app.example.com".into()],
        ..HttpConfig::default()
    })
    .await;
    assert_eq!(
        custom
            .send(request("relay.example.com", "https://app.example.com"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        custom
            .send(request("127.0.0.1:8787", "http://127.0.0.1:8787"))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
}

/// RFC 9728 §3.3: a client must not use a metadata document whose
/// `resource` differs from the resource it derived the URL from. The
/// metadata of `/mcp` is at the `/mcp`-suffixed location only; the root
/// location, which would describe the origin, is not served.
#[tokio::test]
async fn protected_resource_metadata_is_served_for_mcp_only() {
    let h = harness().await;
    let get = |path: &str| {
        Request::get(path)
            .header("host", "localhost:8787")
            .body(Body::empty())
            .unwrap()
    };
    let reply = h
        .send(get("/.well-known/oauth-protected-resource/mcp"))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    // From the listening address, not from the request's Host.
    assert_eq!(reply.body["resource"], "http://127.0.0.1:8787/mcp");
    assert_eq!(
        reply.body["scopes_supported"],
        json!(["osfoundry:read", "osfoundry:run"])
    );
    assert_eq!(reply.body["bearer_methods_supported"], json!(["header"]));
    assert!(
        reply.body["authorization_servers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    let root = h.send(get("/.well-known/oauth-protected-resource")).await;
    assert_eq!(
        root.status,
        StatusCode::NOT_FOUND,
        "the root location would name a resource other than its own URL: {}",
        root.body
    );
}

/// A minimal HTTP/1.1 exchange over a real socket.
async fn raw_http(addr: std::net::SocketAddr, request: String) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn over_a_real_socket() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let h = harness_with(HttpConfig {
        listen_addr: Some(addr),
        ..HttpConfig::default()
    })
    .await;
    let app = router(h.state.clone());
    let server = tokio::spawn(graph_relay_transport_http::serve(
        listener,
        app,
        graph_relay_transport_http::ServeConfig::default(),
        std::future::pending(),
    ));
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}).to_string();
    let post = |host: String, token: &str, body: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let (status, text) = raw_http(addr, post(addr.to_string(), FULL, &body)).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.to_ascii_lowercase().contains("mcp-session-id:"));
    assert!(text.contains("\"protocolVersion\":\"2025-06-18\""));
    let (status, _) = raw_http(addr, post("evil.example.com".into(), FULL, &body)).await;
    assert_eq!(status, 403);
    let (status, _) = raw_http(addr, post(addr.to_string(), "wrong", &body)).await;
    assert_eq!(status, 401);
    let (status, _) = raw_http(
        addr,
        format!("GET /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(status, 405);
    server.abort();
}

/// `subscriptions/listen` streams the caller's task notifications as SSE
/// until every watched task is terminal.
#[tokio::test]
async fn task_notifications_stream_until_the_task_finishes() {
    let h = harness().await;
    let tasks_meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "run_graph_session"),
    ];
    let created = h
        .post(
            Some(FULL),
            &headers,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "run_graph_session",
                "arguments": {"graph_session_id": GS, "idempotency_key": "listen-key-1"},
                "_meta": tasks_meta,
            }})
            .to_string(),
        )
        .await;
    assert_eq!(
        created.body["result"]["resultType"], "task",
        "{}",
        created.body
    );
    let task_id = created.body["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let command = CommandId::parse(&task_id).unwrap();

    let listen_body =
        json!({"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen", "params": {
            "notifications": {"taskIds": [task_id, "67e55044-10b1-426f-9247-bb680e5fe0c8"]},
            "_meta": tasks_meta,
        }})
        .to_string();
    let request = Request::post("/mcp")
        .header("host", "127.0.0.1:8787")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {FULL}"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(Body::from(listen_body))
        .unwrap();
    let response = router(h.state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body =
        tokio::spawn(async move { response.into_body().collect().await.unwrap().to_bytes() });

    // Once the stream waits on the queue's signals, the desktop runs the task.
    let queue = h.state.mcp().queue().clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while queue.signals().waiting() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream never started waiting"
        );
        tokio::task::yield_now().await;
    }
    let device = Device::new(
        DeviceId::parse("desktop").unwrap(),
        OwnerId::parse("alice").unwrap(),
    );
    let exec = ExecutionId::parse("exec-listen").unwrap();
    queue.start(&device, &command, &exec).await.unwrap();
    let envelope = ResultEnvelope::build(
        exec,
        FinishStatus::Completed,
        EnvelopeBody {
            result: json!("done"),
            ..Default::default()
        },
    );
    queue.complete(&device, &command, &envelope).await.unwrap();

    let text = String::from_utf8(body.await.unwrap().to_vec()).unwrap();
    let messages: Vec<Value> = text
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert_eq!(
        messages[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(
        messages[0]["params"]["notifications"]["taskIds"],
        json!([task_id]),
        "another agent's or an unknown id is not watched"
    );
    let statuses: Vec<&str> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/tasks")
        .map(|m| m["params"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.first(), Some(&"working"));
    assert_eq!(statuses.last(), Some(&"completed"));
    let last_task = messages
        .iter()
        .rev()
        .find(|m| m["method"] == "notifications/tasks")
        .unwrap();
    assert_eq!(
        last_task["params"]["result"]["structuredContent"]["result"],
        "done"
    );
    let end = messages.last().unwrap();
    assert_eq!(end["id"], 7);
    assert_eq!(end["result"]["resultType"], "complete");

    // Without the extension, asking for task notifications is refused.
    let refused = h
        .modern(
            FULL,
            "subscriptions/listen",
            json!({"notifications": {"taskIds": [task_id]}}),
        )
        .await;
    assert_eq!(refused.body["error"]["code"], -32021, "{}", refused.body);
}
