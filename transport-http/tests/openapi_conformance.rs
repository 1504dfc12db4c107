//! Real relay API responses, validated against the OpenAPI document the
//! server serves (`GET …/openapi.json`, the same as
//! `transport-http/relay-api.openapi.json`) with the `jsonschema` crate.
//!
//! Every answer of every path is checked: its status must be one the
//! document lists for that operation, and its body must match the schema of
//! that status, with `$ref`s resolved to the document's components. The
//! check is strict: an object schema that names its properties gets
//! `additionalProperties: false` here, so a field the server sends but the
//! document does not describe fails too.

use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, StaticTokens, TokenConfig, hash_token,
};
use graph_relay_transport_http::relay_wire::{OPENAPI_PATH, RELAY_PREFIX};
use graph_relay_transport_http::{HttpConfig, HttpState, relay_api::RelayApiConfig, router};
use serde_json::{Value, json};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const AGENT: &str = "tok-agent";
const DEVICE: &str = "tok-device";
const UNKNOWN: &str = "00000000-0000-4000-8000-000000000000";

struct Server {
    base: String,
    queue: Queue,
    http: reqwest::Client,
    document: Value,
    checked: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

fn agent() -> Agent {
    Agent::new(
        AgentId::parse("assistant").unwrap(),
        OwnerId::parse("alice").unwrap(),
        [ProjectId::parse("p1").unwrap()],
    )
}

async fn server() -> Server {
    let queue = Queue::new(
        Arc::new(MemoryStore::new()),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "assistant".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(AGENT),
            revoked: false,
        }],
        devices: vec![DeviceToken {
            name: "desktop".into(),
            owner: "alice".into(),
            token_sha256: hash_token(DEVICE),
            revoked: false,
        }],
    };
    let mcp = McpServer::new(
        queue.clone(),
        ToolCatalog::published(),
        ServerInfo::new("t", "1"),
    );
    let config = HttpConfig {
        max_body_bytes: 64 * 1024,
        relay: RelayApiConfig {
            hold: Some(Duration::from_millis(300)),
            recheck: Some(Duration::from_millis(100)),
        },
        ..HttpConfig::default()
    };
    let state = HttpState::new(mcp, Arc::new(StaticTokens::new(&tokens).unwrap()), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router(state)).await.unwrap();
    });
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let response = http
        .get(format!("{base}{OPENAPI_PATH}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let document: Value = response.json().await.unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    Server {
        base,
        queue,
        http,
        document,
        checked: std::sync::Mutex::new(std::collections::BTreeSet::new()),
    }
}

/// `additionalProperties: false` on every object schema that lists its
/// properties and says nothing about others.
fn strict(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("properties").is_some_and(Value::is_object)
                && !map.contains_key("additionalProperties")
            {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for value in map.values_mut() {
                strict(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

impl Server {
    /// The document's template for a concrete relay path.
    fn template(path: &str) -> String {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            ["commands", _, action] => format!("{RELAY_PREFIX}/commands/{{command_id}}/{action}"),
            _ => format!("{RELAY_PREFIX}{path}"),
        }
    }

    /// Validates one answer to `POST path` against the document.
    fn check(&self, path: &str, status: u16, body: &Value) {
        let template = Self::template(path);
        let operation = &self.document["paths"][&template]["post"];
        assert!(
            operation.is_object(),
            "{template}: no such operation in the document"
        );
        let response = &operation["responses"][status.to_string()];
        assert!(
            response.is_object(),
            "{template}: status {status} is not documented (body {body})"
        );
        let schema = &response["content"]["application/json"]["schema"];
        assert!(
            schema.is_object(),
            "{template} {status}: the document gives no JSON schema"
        );
        let mut components = self.document["components"].clone();
        strict(&mut components);
        let mut root = schema.clone();
        root["components"] = components;
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("{template} {status}: the schema does not compile: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{template} {status}: the body does not match the document:\n{}\n{body:#}",
            errors.join("\n")
        );
        self.checked
            .lock()
            .unwrap()
            .insert(format!("{template} {status}"));
    }

    /// `POST` to the relay API; the answer is validated before it is returned.
    async fn post(&self, token: Option<&str>, path: &str, body: &[u8]) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{RELAY_PREFIX}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_vec());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("POST {path} {status}: not JSON ({e}): {text}"));
        self.check(path, status, &body);
        (status, body)
    }

    async fn device(&self, path: &str, body: Value) -> (u16, Value) {
        self.post(Some(DEVICE), path, body.to_string().as_bytes())
            .await
    }

    async fn run(&self, key: &str) -> CommandId {
        self.queue
            .run_graph_session(
                &agent(),
                RunArgs {
                    graph_session_id: GraphSessionId::parse(GS).unwrap(),
                    arguments: json!({"n": 1}).as_object().unwrap().clone(),
                    idempotency_key: IdempotencyKey::parse(key).unwrap(),
                },
            )
            .await
            .unwrap()
            .command
            .id
    }
}

fn sync_body() -> Value {
    json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": "Drafts",
        "description": "", "slug": "drafts", "version": "1", "status": "ready"}]})
}

#[tokio::test]
async fn every_relay_api_answer_matches_the_openapi_document() {
    let s = server().await;

    // sync: empty, then with a queued command; refused bodies and tokens.
    let (status, body) = s.device("/sync", sync_body()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["commands"], json!([]));
    let id = s.run("key-openapi-1").await;
    let (status, body) = s.device("/sync", sync_body()).await;
    assert_eq!(status, 200);
    assert_eq!(body["commands"][0]["command_id"], id.to_string());
    let mut long_poll = sync_body();
    long_poll["long_poll"] = json!(true);
    long_poll["restarted"] = json!(true);
    assert_eq!(s.device("/sync", long_poll).await.0, 200);
    let bad_session = json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": "", "slug": "drafts"}]});
    assert_eq!(s.device("/sync", bad_session).await.0, 422);
    assert_eq!(s.post(Some(DEVICE), "/sync", b"{not json").await.0, 400);
    assert_eq!(
        s.device("/sync", json!({"project_id": "p1", "surprise": 1}))
            .await
            .0,
        400
    );
    let sync = sync_body().to_string();
    assert_eq!(s.post(None, "/sync", sync.as_bytes()).await.0, 401);
    assert_eq!(s.post(Some(AGENT), "/sync", sync.as_bytes()).await.0, 403);
    let huge = vec![b' '; 65 * 1024];
    assert_eq!(s.post(Some(DEVICE), "/sync", &huge).await.0, 413);

    // start: claimed, retried, another execution, unknown, malformed id.
    let start = |c: &CommandId| format!("/commands/{c}/start");
    let (status, body) = s
        .device(&start(&id), json!({"execution_id": "exec-1"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        s.device(&start(&id), json!({"execution_id": "exec-1"}))
            .await
            .0,
        200
    );
    assert_eq!(
        s.device(&start(&id), json!({"execution_id": "exec-2"}))
            .await
            .0,
        409
    );
    assert_eq!(
        s.device(
            &format!("/commands/{UNKNOWN}/start"),
            json!({"execution_id": "exec-1"})
        )
        .await
        .0,
        404
    );
    assert_eq!(
        s.device(
            "/commands/not-a-uuid/start",
            json!({"execution_id": "exec-1"})
        )
        .await
        .0,
        400
    );

    // progress: recorded, unchanged, invalid, another execution.
    let progress = format!("/commands/{id}/progress");
    let report = json!({"execution_id": "exec-1", "message": "step 1", "percent": 10});
    assert_eq!(s.device(&progress, report.clone()).await.0, 200);
    assert_eq!(s.device(&progress, report).await.0, 200);
    assert_eq!(
        s.device(&progress, json!({"execution_id": "exec-1", "percent": 101}))
            .await
            .0,
        422
    );
    assert_eq!(
        s.device(&progress, json!({"execution_id": "exec-2", "percent": 20}))
            .await
            .0,
        409
    );

    // control: plain and held, unknown.
    let control = format!("/commands/{id}/control");
    let (status, body) = s.device(&control, json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(body["cancel_requested"], false);
    assert_eq!(s.device(&control, json!({"long_poll": true})).await.0, 200);
    assert_eq!(
        s.device(&format!("/commands/{UNKNOWN}/control"), json!({}))
            .await
            .0,
        404
    );

    // complete: invalid envelope, another execution, recorded, duplicate.
    let complete = format!("/commands/{id}/complete");
    let done = json!({"execution_id": "exec-1", "status": "completed", "result": {"ok": true},
        "total_tokens": 12, "reported_cost": null});
    assert_eq!(
        s.device(
            &complete,
            json!({"execution_id": "exec-1", "status": "completed", "result": 1, "total_tokens": -3})
        )
        .await
        .0,
        422
    );
    let mut other = done.clone();
    other["execution_id"] = json!("exec-2");
    assert_eq!(s.device(&complete, other).await.0, 409);
    let (status, body) = s.device(&complete, done.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duplicate"], false);
    let (status, body) = s.device(&complete, done).await;
    assert_eq!(status, 200);
    assert_eq!(body["duplicate"], true);
    assert_eq!(
        s.device(&progress, json!({"execution_id": "exec-1", "percent": 50}))
            .await
            .0,
        409
    );

    // A truncated completion, and completing a command that never started.
    let big = s.run("key-openapi-2").await;
    assert_eq!(
        s.device(
            &format!("/commands/{big}/complete"),
            json!({"execution_id": "exec-3", "status": "completed", "result_truncated": true})
        )
        .await
        .0,
        409
    );
    assert_eq!(
        s.device(&start(&big), json!({"execution_id": "exec-3"}))
            .await
            .0,
        200
    );
    assert_eq!(
        s.device(
            &format!("/commands/{big}/complete"),
            json!({"execution_id": "exec-3", "status": "completed", "result_truncated": true})
        )
        .await
        .0,
        200
    );

    // decline: a queued command closes, a second decline is a duplicate, a running one is refused.
    let declined = s.run("key-openapi-3").await;
    let decline = format!("/commands/{declined}/decline");
    assert_eq!(s.device(&decline, json!({})).await.0, 200);
    let (status, body) = s.device(&decline, json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(body["duplicate"], true);
    let running = s.run("key-openapi-4").await;
    assert_eq!(
        s.device(&start(&running), json!({"execution_id": "exec-4"}))
            .await
            .0,
        200
    );
    assert_eq!(
        s.device(&format!("/commands/{running}/decline"), json!({}))
            .await
            .0,
        409
    );

    // Cancelled by the agent: control says so, the completion is recorded cancelled.
    s.queue.cancel_graph_run(&agent(), &running).await.unwrap();
    let (status, body) = s
        .device(&format!("/commands/{running}/control"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["cancel_requested"], true);
    let (status, body) = s
        .device(
            &format!("/commands/{running}/complete"),
            json!({"execution_id": "exec-4", "status": "cancelled", "result": null,
                   "total_tokens": null, "reported_cost": null}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");

    // Refused before any work, on every command path: malformed, no token,
    // not a device token, too large.
    for action in ["start", "control", "complete", "decline", "progress"] {
        let path = format!("/commands/{running}/{action}");
        assert_eq!(s.post(Some(DEVICE), &path, b"{").await.0, 400, "{action}");
        assert_eq!(s.post(None, &path, b"{}").await.0, 401, "{action}");
        assert_eq!(s.post(Some(AGENT), &path, b"{}").await.0, 403, "{action}");
        assert_eq!(s.post(Some(DEVICE), &path, &huge).await.0, 413, "{action}");
    }

    // Unknown commands, on every command path.
    for (action, body) in [
        ("start", json!({"execution_id": "exec-9"})),
        ("control", json!({})),
        (
            "complete",
            json!({"execution_id": "exec-9", "status": "completed", "result_truncated": true}),
        ),
        ("decline", json!({})),
        ("progress", json!({"execution_id": "exec-9", "percent": 5})),
    ] {
        let path = format!("/commands/{UNKNOWN}/{action}");
        assert_eq!(s.device(&path, body).await.0, 404, "{action}");
    }

    // Every operation and every status the document lists for it was seen,
    // except 503, which needs a failing store.
    let checked = s.checked.lock().unwrap().clone();
    let paths = s.document["paths"].as_object().unwrap();
    for (path, item) in paths {
        let Some(operation) = item.get("post") else {
            continue;
        };
        for status in operation["responses"].as_object().unwrap().keys() {
            if status == "503" {
                continue;
            }
            assert!(
                checked.contains(&format!("{path} {status}")),
                "{path} {status} was never validated; seen: {checked:#?}"
            );
        }
    }
}
