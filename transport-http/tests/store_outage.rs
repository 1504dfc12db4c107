//! What everyone sees while the queue's store is down, on a whole server
//! (the builder) over real sockets: agents get a retryable 503 with
//! `Retry-After` in both protocol eras, the desktop's relay API agrees,
//! the readiness probe turns unready (and ready again when the store is
//! back) while the liveness probe stays up, and a server that shuts down
//! is unready at once.

use std::sync::Arc;

use graph_relay_core::store::LayeredStore;
use graph_relay_core::testkit::Outage;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::Server;
use graph_relay_transport_http::auth::hash_token;
use graph_relay_transport_http::config::ConfigFile;
use graph_relay_transport_http::relay_wire::RELAY_PREFIX;
use serde_json::{Value, json};

const AGENT: &str = "agent-token-outage";
const DEVICE: &str = "device-token-outage";
const COMMAND: &str = "0193a2b4-0000-7000-8000-000000000001";

struct Running {
    base: String,
    store: Arc<LayeredStore<Outage>>,
    server_queue: graph_relay_core::queue::Queue,
    http: reqwest::Client,
}

async fn running() -> Running {
    let file = ConfigFile::parse(&format!(
        r#"
        [[agent]]
        name = "assistant"
        owner = "alice"
        projects = ["p1"]
        scopes = ["osfoundry:read", "osfoundry:run"]
        token_sha256 = "{}"

        [[device]]
        name = "desktop"
        owner = "alice"
        token_sha256 = "{}"
        "#,
        hash_token(AGENT),
        hash_token(DEVICE)
    ))
    .expect("config");
    let store = Arc::new(Outage::store(Arc::new(MemoryStore::new())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = Server::builder(store.clone())
        .config(&file)
        .expect("settings")
        .build(listener)
        .await
        .expect("build");
    let base = format!("http://{}", server.local_addr());
    let server_queue = server.queue().clone();
    tokio::spawn(server.serve(std::future::pending()));
    Running {
        base,
        store,
        server_queue,
        http: reqwest::Client::new(),
    }
}

impl Running {
    fn down(&self, down: bool) {
        self.store.layer().set_down(down);
    }

    /// `GET path`: status, `Retry-After`, body.
    async fn probe(&self, path: &str) -> (u16, Option<String>, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            // A load balancer names the backend's address, not a served host.
            .header("host", "10.1.2.3:8787")
            .send()
            .await
            .expect("probe");
        answer(response).await
    }

    async fn mcp(&self, headers: &[(&str, &str)], body: Value) -> (u16, Option<String>, Value) {
        let mut request = self
            .http
            .post(format!("{}/mcp", self.base))
            .bearer_auth(AGENT)
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        answer(request.json(&body).send().await.expect("mcp")).await
    }

    /// A 2026-07-28 `get_graph_run`.
    async fn modern_get(&self) -> (u16, Option<String>, Value) {
        let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}});
        self.mcp(
            &[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_graph_run"),
            ],
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "get_graph_run", "arguments": {"command_id": COMMAND}, "_meta": meta}}),
        )
        .await
    }

    /// An initialize-era session, made while the store is up.
    async fn legacy_session(&self) -> String {
        let response = self
            .http
            .post(format!("{}/mcp", self.base))
            .bearer_auth(AGENT)
            .header("accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "outage-test", "version": "1"}}}),
            )
            .send()
            .await
            .expect("initialize");
        assert_eq!(response.status(), 200);
        response.headers()["mcp-session-id"]
            .to_str()
            .expect("session id")
            .to_owned()
    }

    async fn legacy_get(&self, session: &str) -> (u16, Option<String>, Value) {
        self.mcp(
            &[
                ("mcp-session-id", session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {
                "name": "get_graph_run", "arguments": {"command_id": COMMAND}}}),
        )
        .await
    }

    async fn sync(&self) -> (u16, Option<String>, Value) {
        let response = self
            .http
            .post(format!("{}{RELAY_PREFIX}/sync", self.base))
            .bearer_auth(DEVICE)
            .json(&json!({"project_id": "p1", "sessions": []}))
            .send()
            .await
            .expect("sync");
        answer(response).await
    }
}

async fn answer(response: reqwest::Response) -> (u16, Option<String>, Value) {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, body)
}

/// A store failure as an agent must see it: 503, `Retry-After`, and a
/// JSON-RPC error whose data says it is retryable.
fn assert_retryable(what: &str, (status, retry_after, body): &(u16, Option<String>, Value)) {
    assert_eq!(*status, 503, "{what}: {body}");
    assert_eq!(retry_after.as_deref(), Some("1"), "{what}");
    assert_eq!(body["error"]["code"], -32603, "{what}: {body}");
    assert_eq!(body["error"]["data"]["retryable"], true, "{what}: {body}");
    assert_eq!(
        body["error"]["data"]["retryAfterSeconds"], 1,
        "{what}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_retryable_for_everyone_and_makes_the_server_unready() {
    let r = running().await;
    let session = r.legacy_session().await;
    // Up: ready, and a lookup of an unknown run is the ordinary tool error.
    assert_eq!(r.probe("/healthz").await.0, 200);
    let ready = r.probe("/readyz").await;
    assert_eq!(ready.0, 200, "{ready:?}");
    assert_eq!(ready.2["status"], "ready");
    let (status, _, body) = r.modern_get().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["isError"], true, "{body}");

    r.down(true);
    assert_retryable("2026-07-28 tools/call", &r.modern_get().await);
    assert_retryable("2025-11-25 tools/call", &r.legacy_get(&session).await);
    let (status, retry_after, body) = r.sync().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(body["error"], "store_unavailable");
    assert_eq!(body["retryable"], true);
    // The load balancer takes the server out; the process is still live.
    let (status, retry_after, body) = r.probe("/readyz").await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("1")), "{body}");
    assert_eq!(
        body,
        json!({"status": "unready", "reason": "store unreachable"})
    );
    assert_eq!(r.probe("/healthz").await.0, 200);
    assert!(r.store.layer().refused() > 0);

    // The store is back: so is everything, with no restart.
    r.down(false);
    assert_eq!(r.probe("/readyz").await.0, 200);
    assert_eq!(r.modern_get().await.0, 200);
    assert_eq!(r.legacy_get(&session).await.0, 200);
    assert_eq!(r.sync().await.0, 200);

    // Shutting down: unready at once, before anything stops.
    r.server_queue.shut_down();
    let (status, _, body) = r.probe("/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(
        body,
        json!({"status": "unready", "reason": "shutting down"})
    );
    assert_eq!(r.probe("/healthz").await.0, 200);
}
