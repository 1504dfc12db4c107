//! The relay API over a real socket, and the relay driver against it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::outbox::Outbox;
use graph_relay_core::prelude::*;
use graph_relay_core::relay::driver::{DriverEvent, RelayDriver, RelayTransport};
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job, Relay, RelayConfig, RelayEvent, SharedSet};
use graph_relay_core::testkit::FaultyTransport;
use graph_relay_store_sqlite::{SqliteOutbox, SqliteStore};
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, StaticTokens, TokenConfig, hash_token,
};
use graph_relay_transport_http::relay_http::{HttpRelayConfig, HttpRelayTransport};
use graph_relay_transport_http::relay_wire::{OPENAPI_PATH, RELAY_PREFIX, openapi};
use graph_relay_transport_http::{
    HttpConfig, HttpState, TokioSleeper, relay_api::RelayApiConfig, router,
};
use serde_json::{Value, json};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const AGENT: &str = "tok-agent";
const DEVICE: &str = "tok-device";
const STRANGER: &str = "tok-stranger";
/// Bob's desktop, named `desktop` like Alice's.
const TWIN: &str = "tok-twin";

struct Server {
    base: String,
    queue: Queue,
    db: PathBuf,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

fn agent() -> Agent {
    Agent::new(
        AgentId::parse("assistant").unwrap(),
        OwnerId::parse("alice").unwrap(),
        [ProjectId::parse("p1").unwrap()],
    )
}

fn device() -> Device {
    Device::new(
        DeviceId::parse("desktop").unwrap(),
        OwnerId::parse("alice").unwrap(),
    )
}

fn session() -> SessionMeta {
    SessionMeta {
        graph_session_id: GraphSessionId::parse(GS).unwrap(),
        name: "Drafts".into(),
        description: "".into(),
        slug: "drafts".into(),
        version: "1".into(),
        status: "ready".into(),
    }
}

fn queue_on(db: &std::path::Path) -> Queue {
    queue_with(db, QueueConfig::default())
}

fn queue_with(db: &std::path::Path, config: QueueConfig) -> Queue {
    Queue::new(
        Arc::new(SqliteStore::open(db).unwrap()),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        config,
    )
}

async fn server(hold: Duration) -> Server {
    server_with(hold, QueueConfig::default()).await
}

async fn server_with(hold: Duration, queue_config: QueueConfig) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("queue.db");
    let queue = queue_with(&db, queue_config);
    queue
        .sync(
            &device(),
            &SyncRequest {
                project: ProjectId::parse("p1").unwrap(),
                sessions: vec![session()],
                long_poll: false,
                restarted: false,
                running: None,
            },
        )
        .await
        .unwrap();
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "assistant".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(AGENT),
            revoked: false,
        }],
        devices: vec![
            DeviceToken {
                name: "desktop".into(),
                owner: "alice".into(),
                token_sha256: hash_token(DEVICE),
                revoked: false,
            },
            DeviceToken {
                name: "intruder".into(),
                owner: "mallory".into(),
                token_sha256: hash_token(STRANGER),
                revoked: false,
            },
            DeviceToken {
                name: "desktop".into(),
                owner: "bob".into(),
                token_sha256: hash_token(TWIN),
                revoked: false,
            },
        ],
    };
    let mcp = McpServer::new(
        queue.clone(),
        ToolCatalog::published(),
        ServerInfo::new("t", "1"),
    );
    let config = HttpConfig {
        max_body_bytes: 512 * 1024,
        relay: RelayApiConfig {
            hold: Some(hold),
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
    Server {
        base: format!("http://{addr}"),
        queue,
        db,
        _dir: dir,
        http: reqwest::Client::new(),
    }
}

impl Server {
    /// Status and the exact bytes of the answer.
    async fn post_raw(&self, token: &str, path: &str, body: &[u8]) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}{RELAY_PREFIX}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    async fn post(&self, token: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{RELAY_PREFIX}{path}", self.base))
            .json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
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

    async fn status(&self, id: &CommandId) -> CommandStatus {
        self.queue
            .get_graph_run(&agent(), id)
            .await
            .unwrap()
            .command
            .status
    }

    /// A device request held in the background; its answer comes with how long it took.
    fn held(&self, path: &str, body: Value) -> tokio::task::JoinHandle<(Value, Duration)> {
        let http = self.http.clone();
        let url = format!("{}{RELAY_PREFIX}{path}", self.base);
        tokio::spawn(async move {
            let started = Instant::now();
            let body: Value = http
                .post(url)
                .bearer_auth(DEVICE)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (body, started.elapsed())
        })
    }

    fn sync_body(long_poll: bool) -> Value {
        json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": "Drafts", "slug": "drafts", "version": "1", "status": "ready"}], "long_poll": long_poll})
    }
}

#[tokio::test]
async fn the_served_openapi_document_matches_the_committed_file() {
    let s = server(Duration::from_secs(5)).await;
    let served: Value = s
        .http
        .get(format!("{}{OPENAPI_PATH}", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/relay-api.openapi.json");
    if std::env::var_os("GRAPH_RELAY_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&openapi()).unwrap() + "\n";
        std::fs::write(path, text).unwrap();
    }
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(path)
            .expect("relay-api.openapi.json is missing; regenerate with GRAPH_RELAY_BLESS=1"),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "the relay API changed; regenerate with GRAPH_RELAY_BLESS=1 and review the diff"
    );
    assert_eq!(served["openapi"], "3.1.0");
}

#[tokio::test]
async fn tokens_other_than_a_device_token_are_refused() {
    let s = server(Duration::from_secs(5)).await;
    let (status, _) = s.post(None, "/sync", Server::sync_body(false)).await;
    assert_eq!(status, 401);
    let (status, body) = s.post(Some(AGENT), "/sync", Server::sync_body(false)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "device_token_required");
    assert_eq!(body["retryable"], false);
}

#[tokio::test]
async fn sync_hands_out_queued_commands_and_validates_sessions() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-sync-1").await;
    let (status, body) = s
        .post(Some(DEVICE), "/sync", Server::sync_body(false))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["poll_after_seconds"], 20);
    let command = &body["commands"][0];
    assert_eq!(command["command_id"], id.to_string());
    assert_eq!(command["graph_session_id"], GS);
    assert_eq!(command["project_id"], "p1");
    assert_eq!(command["arguments"], json!({"n": 1}));
    assert_eq!(command["slug"], "drafts");
    assert_eq!(command["channel"], format!("graph:external:{id}"));
    assert_eq!(
        command["agent_id"], "assistant",
        "the desktop sees who queued it"
    );

    let many: Vec<Value> = (0..101)
        .map(|i| json!({"graph_session_id": format!("gs_{i:032x}"), "name": "g", "slug": "g"}))
        .collect();
    let (status, body) = s
        .post(
            Some(DEVICE),
            "/sync",
            json!({"project_id": "p1", "sessions": many}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["retryable"], false);
    let (status, body) = s
        .post(
            Some(DEVICE),
            "/sync",
            json!({"project_id": "p1", "bogus": 1}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let big = json!({"project_id": "p1", "sessions": [], "pad": "x".repeat(600 * 1024)});
    let (status, _) = s.post(Some(DEVICE), "/sync", big).await;
    assert_eq!(status, 413);
}

#[tokio::test]
async fn another_owners_device_sees_and_touches_nothing() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-owner-1").await;
    let (status, body) = s
        .post(Some(STRANGER), "/sync", json!({"project_id": "p1"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["commands"], json!([]));
    let (status, body) = s
        .post(
            Some(STRANGER),
            &format!("/commands/{id}/start"),
            json!({"execution_id": "exec-1"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(s.status(&id).await, CommandStatus::Queued);
}

#[tokio::test]
async fn start_complete_and_the_answers_the_relay_relies_on() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-life-1").await;
    let start = format!("/commands/{id}/start");
    let (status, body) = s
        .post(Some(DEVICE), &start, json!({"execution_id": "exec-a"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "running");
    let (status, body) = s
        .post(Some(DEVICE), &start, json!({"execution_id": "exec-b"}))
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "start_refused");

    let (status, body) = s
        .post(Some(DEVICE), &format!("/commands/{id}/control"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"cancel_requested": false, "status": "running"})
    );

    let complete = format!("/commands/{id}/complete");
    let envelope = json!({"execution_id": "exec-a", "status": "completed", "result": {"ok": true}, "total_tokens": 5, "reported_cost": null});
    let (status, body) = s.post(Some(DEVICE), &complete, envelope.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"status": "completed", "duplicate": false}));
    let (status, body) = s.post(Some(DEVICE), &complete, envelope).await;
    assert_eq!(
        status, 200,
        "a duplicate completion is acknowledged: {body}"
    );
    assert_eq!(body["duplicate"], true);
    assert_eq!(body["status"], "completed");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("recorded already")),
        "{body}"
    );

    let stale = json!({"execution_id": "exec-z", "status": "failed", "result": null, "total_tokens": null, "reported_cost": null});
    let (status, body) = s.post(Some(DEVICE), &complete, stale).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["retryable"], false);
    let (status, body) = s
        .post(
            Some(DEVICE),
            &complete,
            json!({"execution_id": "exec-a", "status": "done"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "invalid_envelope");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("`status`") && m.contains("completed")),
        "the message names the field and the rule: {body}"
    );
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u128(7));
    let (status, body) = s
        .post(
            Some(DEVICE),
            &format!("/commands/{unknown}/complete"),
            json!({"execution_id": "exec-a", "status": "completed", "result_truncated": true}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = s
        .post(Some(DEVICE), "/commands/not-a-uuid/decline", json!({}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(s.status(&id).await, CommandStatus::Completed);
}

#[tokio::test]
async fn progress_is_taken_only_from_the_running_execution_and_within_its_limits() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-progress-1").await;
    let progress = format!("/commands/{id}/progress");
    let refused = |status: u16, body: &Value, code: &str| {
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["error"], code, "{body}");
        assert_eq!(body["retryable"], false, "{body}");
    };
    // Queued: nothing runs, so there is no progress to take.
    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-a", "percent": 1}),
        )
        .await;
    refused(status, &body, "progress_refused");
    let (status, _) = s
        .post(
            Some(DEVICE),
            &format!("/commands/{id}/start"),
            json!({"execution_id": "exec-a"}),
        )
        .await;
    assert_eq!(status, 200);

    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-a", "message": "step 1 of 5", "percent": 20}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"status": "running", "recorded": "recorded"}));
    let view = s.queue.get_graph_run(&agent(), &id).await.unwrap();
    let shown = view.command.progress.expect("progress");
    assert_eq!(
        (shown.message.as_deref(), shown.percent),
        (Some("step 1 of 5"), Some(20.0))
    );
    // Within the second: kept for later, not written now.
    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-a", "percent": 30}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["recorded"], "coalesced");

    // Another execution, an agent token, an unknown command.
    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-b", "percent": 40}),
        )
        .await;
    refused(status, &body, "progress_refused");
    let (status, _) = s
        .post(Some(AGENT), &progress, json!({"execution_id": "exec-a"}))
        .await;
    assert_eq!(status, 403);
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u128(7));
    let (status, body) = s
        .post(
            Some(DEVICE),
            &format!("/commands/{unknown}/progress"),
            json!({"execution_id": "exec-a"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["retryable"], false);

    // Invalid reports: 422, naming the rule, and nothing recorded.
    for (bad, needle) in [
        (
            json!({"execution_id": "exec-a", "percent": 101}),
            "0 to 100",
        ),
        (json!({"execution_id": "exec-a", "percent": -1}), "0 to 100"),
        (
            json!({"execution_id": "exec-a", "message": "x".repeat(501)}),
            "500",
        ),
        (
            json!({"execution_id": "exec-a", "percent": "half"}),
            "percent",
        ),
        (json!({"execution_id": "exec-a", "pct": 5}), "pct"),
    ] {
        let (status, body) = s.post(Some(DEVICE), &progress, bad.clone()).await;
        assert_eq!(status, 422, "{bad} -> {body}");
        assert_eq!(body["error"], "invalid_progress", "{body}");
        assert_eq!(body["retryable"], false, "{body}");
        assert!(
            body["message"].as_str().is_some_and(|m| m.contains(needle)),
            "{bad} -> {body}"
        );
    }
    // 500 characters (not bytes) are fine.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-a", "message": "日".repeat(500)}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Closed: progress cannot revive it.
    let envelope = json!({"execution_id": "exec-a", "status": "completed", "result": null, "total_tokens": null, "reported_cost": null});
    let (status, _) = s
        .post(Some(DEVICE), &format!("/commands/{id}/complete"), envelope)
        .await;
    assert_eq!(status, 200);
    let (status, body) = s
        .post(
            Some(DEVICE),
            &progress,
            json!({"execution_id": "exec-a", "percent": 99}),
        )
        .await;
    refused(status, &body, "progress_refused");
    assert_eq!(s.status(&id).await, CommandStatus::Completed);
}

#[tokio::test]
async fn the_client_reads_a_closed_run_in_the_control_answer_and_posts_progress() {
    use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    use graph_relay_core::outbox::{OutboxItem, RelayReport};
    use graph_relay_core::relay::PostOutcome;
    use graph_relay_core::relay::executor::ProgressReport;
    // Interval mode: a lease of two 100 ms control intervals.
    let s = server_with(
        Duration::from_secs(5),
        QueueConfig {
            control_interval: Duration::from_millis(100),
            lease_interval_controls: 2,
            ..QueueConfig::default()
        },
    )
    .await;
    let client = HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap();
    let id = s.run("key-closed-1").await;
    let execution = ExecutionId::parse("exec-a").unwrap();
    assert_eq!(
        client.claim(&id, &execution).await,
        graph_relay_core::relay::ClaimOutcome::Granted
    );
    let answer = client.control(&id, false).await.unwrap();
    assert_eq!(
        (answer.cancel_requested, answer.status),
        (false, CommandStatus::Running)
    );
    let report = ProgressReport {
        message: Some("half way".into()),
        percent: Some(50.0),
    };
    assert_eq!(
        client.post_progress(&id, &execution, &report).await,
        PostOutcome::Acknowledged
    );
    let other = ExecutionId::parse("exec-b").unwrap();
    assert!(matches!(
        client.post_progress(&id, &other, &report).await,
        PostOutcome::Rejected(r) if r.contains("progress_refused")
    ));
    // The desktop goes quiet past its lease: the control answer says the
    // server closed the run, and the late result is refused for good.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let answer = client.control(&id, false).await.unwrap();
    assert_eq!(answer.status, CommandStatus::Failed, "{answer:?}");
    let late = OutboxItem {
        command: id,
        report: RelayReport::Completion {
            envelope: ResultEnvelope::build(
                execution.clone(),
                FinishStatus::Completed,
                EnvelopeBody::default(),
            ),
        },
        stored_at: Timestamp(0),
        attempts: 0,
    };
    let outcome = client.post_report(&late).await;
    assert!(
        matches!(&outcome, PostOutcome::Rejected(r) if r.contains("409") && r.contains("run_closed")),
        "{outcome:?}"
    );
    assert!(matches!(
        client.post_progress(&id, &execution, &report).await,
        PostOutcome::Rejected(_)
    ));
    assert_eq!(s.status(&id).await, CommandStatus::Failed);
}

/// Bob's desktop is named `desktop` like Alice's: on Alice's commands every
/// relay request gets, byte for byte, the answer an unknown id gets, and
/// nothing changes.
#[tokio::test]
async fn a_device_of_another_owner_with_the_same_name_gets_what_an_unknown_id_gets() {
    let s = server(Duration::from_secs(5)).await;
    let queued = s.run("key-twin-1").await;
    let running = s.run("key-twin-2").await;
    let (status, _) = s
        .post(
            Some(DEVICE),
            &format!("/commands/{running}/start"),
            json!({"execution_id": "alice-exec"}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = s.post(Some(TWIN), "/sync", Server::sync_body(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["commands"],
        json!([]),
        "Alice's queued run is not Bob's"
    );
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u128(0xabc));
    let forged = br#"{"execution_id": "alice-exec", "status": "completed", "result": {"forged": true}, "total_tokens": null, "reported_cost": null}"#;
    for target in [queued, running] {
        for (action, body) in [
            ("start", &br#"{"execution_id": "alice-exec"}"#[..]),
            ("control", b"{}"),
            ("complete", forged),
            ("decline", b"{}"),
        ] {
            let theirs = s
                .post_raw(TWIN, &format!("/commands/{target}/{action}"), body)
                .await;
            let none = s
                .post_raw(TWIN, &format!("/commands/{unknown}/{action}"), body)
                .await;
            assert_eq!(theirs.0, 404, "{action}: {}", theirs.1);
            assert_eq!(theirs, none, "{action} answers as for an unknown id");
        }
    }
    assert_eq!(s.status(&queued).await, CommandStatus::Queued);
    let view = s.queue.get_graph_run(&agent(), &running).await.unwrap();
    assert_eq!(view.command.status, CommandStatus::Running);
    assert!(view.to_json().get("result").is_none());
}

/// What the relay API answers for bodies and states that cannot be
/// applied: each says what happened.
#[tokio::test]
async fn refusals_say_precisely_what_is_wrong() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-precise-1").await;
    let complete = format!("/commands/{id}/complete");
    // Larger than the body limit (512 KiB here): 413, not a parse error.
    let mut big = br#"{"execution_id": "e", "status": "completed", "result": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 10 * 1024 * 1024));
    big.extend(br#""}"#);
    let (status, text) = s.post_raw(DEVICE, &complete, &big).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("payload_too_large"), "{text}");
    // Not JSON at all.
    let (status, text) = s.post_raw(DEVICE, &complete, b"{not json").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_json"), "{text}");
    // JSON of the wrong shape: the field and the rule are named.
    for (body, field, rule) in [
        (
            json!({"status": "completed", "result": 1}),
            "execution_id",
            "missing field",
        ),
        (
            json!({"execution_id": "e", "status": "completed", "result": 1, "total_tokens": -3}),
            "total_tokens",
            "non-negative integer",
        ),
        (
            json!({"execution_id": "e", "status": "completed", "result": 1, "surprise": 1}),
            "surprise",
            "unknown field",
        ),
        (
            json!({"execution_id": "e", "status": "completed", "result_truncated": false}),
            "result_truncated",
            "may only be `true`",
        ),
    ] {
        let (status, reply) = s.post(Some(DEVICE), &complete, body.clone()).await;
        assert_eq!(status, 422, "{body}: {reply}");
        assert_eq!(reply["error"], "invalid_envelope");
        let message = reply["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(field) && message.contains(rule),
            "{body}: {message}"
        );
    }
    let (status, reply) = s
        .post(
            Some(DEVICE),
            "/sync",
            json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": 5}]}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| m.contains("sessions[0].name")),
        "{reply}"
    );

    // Completing a command that never started: a clear 409.
    let envelope = json!({"execution_id": "e", "status": "completed", "result": 1});
    let (status, reply) = s.post(Some(DEVICE), &complete, envelope.clone()).await;
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"], "not_started");
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| m.contains("has not started")),
        "{reply}"
    );
    s.queue.cancel_graph_run(&agent(), &id).await.unwrap();
    let (status, reply) = s.post(Some(DEVICE), &complete, envelope).await;
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"], "not_started");
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| m.contains("cancelled before it started")),
        "not 'another execution': {reply}"
    );
    // Declining what the agent already cancelled changes nothing, and says so.
    let (status, reply) = s
        .post(Some(DEVICE), &format!("/commands/{id}/decline"), json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["status"], "cancelled");
    assert_eq!(reply["duplicate"], true);
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| m.contains("already cancelled")),
        "{reply}"
    );
}

/// A device shares into at most `max_projects_per_device` projects (100).
#[tokio::test]
async fn a_device_shares_into_a_bounded_number_of_projects() {
    let s = server(Duration::from_secs(5)).await;
    // `p1` is shared already; 99 more fill the bound.
    for i in 0..99 {
        let (status, body) = s
            .post(
                Some(DEVICE),
                "/sync",
                json!({"project_id": format!("extra-{i:03}"), "sessions": [{"graph_session_id": GS, "name": "g", "slug": "g"}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let one_more = json!({"project_id": "one-too-many", "sessions": [{"graph_session_id": GS, "name": "g", "slug": "g"}]});
    let (status, body) = s.post(Some(DEVICE), "/sync", one_more.clone()).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "too_many_projects");
    assert_eq!(body["retryable"], false);
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 100 projects")),
        "{body}"
    );
    // Un-sharing one makes room.
    let (status, _) = s
        .post(
            Some(DEVICE),
            "/sync",
            json!({"project_id": "extra-000", "sessions": []}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = s.post(Some(DEVICE), "/sync", one_more).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn decline_closes_a_queued_command_with_the_exact_message() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-decline-1").await;
    let (status, body) = s
        .post(Some(DEVICE), &format!("/commands/{id}/decline"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    let view = s.queue.get_graph_run(&agent(), &id).await.unwrap();
    assert_eq!(
        view.to_json()["error"],
        "Graph session is no longer shared with this project"
    );
}

#[tokio::test]
async fn a_held_sync_answers_when_work_is_queued_here_or_by_another_process() {
    let s = server(Duration::from_secs(20)).await;
    // Queued through this server's queue: the signal wakes the held sync.
    let held = s.held("/sync", Server::sync_body(true));
    wait_for(|| s.queue.signals().waiting() > 0).await;
    let id = s.run("key-held-1").await;
    let (body, elapsed) = held.await.unwrap();
    assert_eq!(body["commands"][0]["command_id"], id.to_string());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");

    // Queued by another process on the same file: found by the periodic look.
    let (status, _) = s
        .post(Some(DEVICE), &format!("/commands/{id}/decline"), json!({}))
        .await;
    assert_eq!(status, 200);
    let other = queue_on(&s.db);
    let held = s.held("/sync", Server::sync_body(true));
    wait_for(|| s.queue.signals().waiting() > 0).await;
    let id2 = other
        .run_graph_session(
            &agent(),
            RunArgs {
                graph_session_id: GraphSessionId::parse(GS).unwrap(),
                arguments: Default::default(),
                idempotency_key: IdempotencyKey::parse("key-held-2").unwrap(),
            },
        )
        .await
        .unwrap()
        .command
        .id;
    let (body, elapsed) = held.await.unwrap();
    assert_eq!(body["commands"][0]["command_id"], id2.to_string());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[tokio::test]
async fn a_held_sync_ends_at_the_hold_bound_and_a_held_control_on_cancel() {
    let s = server(Duration::from_millis(300)).await;
    let (status, body) = s.post(Some(DEVICE), "/sync", Server::sync_body(true)).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"commands": [], "poll_after_seconds": 0}));

    let s = server(Duration::from_secs(20)).await;
    let id = s.run("key-control-1").await;
    s.post(
        Some(DEVICE),
        &format!("/commands/{id}/start"),
        json!({"execution_id": "exec-a"}),
    )
    .await;
    let held = s.held(
        &format!("/commands/{id}/control"),
        json!({"long_poll": true}),
    );
    wait_for(|| s.queue.signals().waiting() > 0).await;
    s.queue.cancel_graph_run(&agent(), &id).await.unwrap();
    let (body, _) = held.await.unwrap();
    assert_eq!(body, json!({"cancel_requested": true, "status": "running"}));
}

/// Polls `check` every 10 ms for up to 10 s.
async fn wait_for(mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "condition not met within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Finishes at once with the arguments as result, counting executions.
struct EchoExecutor(Mutex<Vec<CommandId>>);

#[async_trait]
impl Executor for EchoExecutor {
    async fn execute(
        &self,
        job: Job,
        _cancel: CancelSignal,
        _progress: ProgressSink,
    ) -> ExecutionOutcome {
        self.0.lock().unwrap().push(job.command.id);
        ExecutionOutcome {
            result: Value::Object(job.command.arguments),
            total_tokens: Some(3),
            ..Default::default()
        }
    }
}

#[tokio::test]
async fn the_driver_runs_a_command_and_redelivers_a_lost_completion_from_the_outbox() {
    // A short hold: a pending report waits for the next pass, which follows the held sync.
    let s = server(Duration::from_secs(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db")).unwrap());
    let http = HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap();
    // The first completion never leaves; the second is recorded but its answer is lost.
    let transport: Arc<dyn RelayTransport> = Arc::new(FaultyTransport::new(http, 1, 1));
    let executor = Arc::new(EchoExecutor(Mutex::new(Vec::new())));
    let mut shared = SharedSet::new();
    shared.share(ProjectId::parse("p1").unwrap(), session());
    let relay = Relay::new(RelayConfig::default(), shared, SystemClock.now());
    let driver = RelayDriver::new(
        relay,
        transport,
        outbox.clone(),
        executor.clone(),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        move |e| sink.lock().unwrap().push(e),
    ));

    let id = s.run("key-driver-1").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.status(&id).await != CommandStatus::Completed {
        assert!(
            Instant::now() < deadline,
            "never completed: {:?}",
            events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let view = s
        .queue
        .get_graph_run(&agent(), &id)
        .await
        .unwrap()
        .to_json();
    assert_eq!(view["result"], json!({"n": 1}));
    assert_eq!(view["total_tokens"], 3);
    // Delivered on a later pass, then removed from the outbox.
    while !outbox.pending().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "outbox not emptied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        executor.0.lock().unwrap().as_slice(),
        &[id],
        "ran exactly once"
    );
    let failures = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, DriverEvent::Relay(RelayEvent::DeliveryFailed { .. })))
        .count();
    assert_eq!(failures, 2, "{:?}", events.lock().unwrap());
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the driver stops")
        .unwrap();
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, DriverEvent::Relay(RelayEvent::Stopped { kept: 0, .. })))
    );
}

#[tokio::test]
async fn the_client_drops_what_the_server_refuses_and_retries_what_did_not_arrive() {
    use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    use graph_relay_core::outbox::{OutboxItem, RelayReport};
    use graph_relay_core::relay::PostOutcome;
    let s = server(Duration::from_secs(5)).await;
    let client = HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap();
    let item = OutboxItem {
        command: CommandId::from_uuid(uuid::Uuid::from_u128(99)),
        report: RelayReport::Completion {
            envelope: ResultEnvelope::build(
                ExecutionId::parse("exec-x").unwrap(),
                FinishStatus::Completed,
                EnvelopeBody::default(),
            ),
        },
        stored_at: Timestamp(0),
        attempts: 0,
    };
    let outcome = client.post_report(&item).await;
    assert!(
        matches!(&outcome, PostOutcome::Rejected(r) if r.contains("command_not_found")),
        "{outcome:?}"
    );
    // A token the server does not know: kept for later, not dropped.
    let wrong = HttpRelayTransport::new(HttpRelayConfig::new(&s.base, "tok-unknown")).unwrap();
    assert!(matches!(
        wrong.post_report(&item).await,
        PostOutcome::Retry(_)
    ));
    // Nobody listening: retried.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let down = HttpRelayTransport::new(HttpRelayConfig::new(dead, DEVICE)).unwrap();
    assert!(matches!(
        down.post_report(&item).await,
        PostOutcome::Retry(_)
    ));
}

/// A stand-in for the relay API that answers syncs with nothing and
/// refuses every report with 403 and the `retryable` flag of the test's
/// choosing; it records every sync body and counts the reports.
struct RefusingServer {
    base: String,
    retryable: Arc<std::sync::atomic::AtomicBool>,
    reports: Arc<std::sync::atomic::AtomicUsize>,
    syncs: Arc<Mutex<Vec<Value>>>,
}

async fn refusing_server() -> RefusingServer {
    use axum::routing::post;
    use graph_relay_transport_http::relay_wire::{ErrorReply, SyncReply};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let retryable = Arc::new(AtomicBool::new(false));
    let reports = Arc::new(AtomicUsize::new(0));
    let syncs = Arc::new(Mutex::new(Vec::new()));
    let (flag, count, bodies) = (retryable.clone(), reports.clone(), syncs.clone());
    let app = axum::Router::new()
        .route(
            &format!("{RELAY_PREFIX}/sync"),
            post(move |axum::Json(body): axum::Json<Value>| {
                bodies.lock().unwrap().push(body);
                async {
                    axum::Json(SyncReply {
                        commands: vec![],
                        poll_after_seconds: 20,
                    })
                }
            }),
        )
        .route(
            &format!("{RELAY_PREFIX}/commands/{{id}}/complete"),
            post(move || {
                count.fetch_add(1, Ordering::SeqCst);
                let retryable = flag.load(Ordering::SeqCst);
                async move {
                    (
                        axum::http::StatusCode::FORBIDDEN,
                        axum::Json(ErrorReply {
                            error: "device_token_required".into(),
                            message: "this device may not report here".into(),
                            retryable,
                        }),
                    )
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    RefusingServer {
        base: format!("http://{addr}"),
        retryable,
        reports,
        syncs,
    }
}

fn completion(n: u128) -> graph_relay_core::outbox::OutboxItem {
    use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    use graph_relay_core::outbox::{OutboxItem, RelayReport};
    OutboxItem {
        command: CommandId::from_uuid(uuid::Uuid::from_u128(n)),
        report: RelayReport::Completion {
            envelope: ResultEnvelope::build(
                ExecutionId::parse("exec-x").unwrap(),
                FinishStatus::Completed,
                EnvelopeBody::default(),
            ),
        },
        stored_at: Timestamp(0),
        attempts: 0,
    }
}

#[tokio::test]
async fn the_servers_retryable_flag_decides_not_the_status_code() {
    use graph_relay_core::relay::PostOutcome;
    use std::sync::atomic::Ordering;
    let s = refusing_server().await;
    let client = HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap();
    // A 403 the server marks final is final: not kept for another try.
    let outcome = client.post_report(&completion(1)).await;
    assert!(
        matches!(&outcome, PostOutcome::Rejected(r)
            if r.contains("403") && r.contains("this device may not report here")),
        "{outcome:?}"
    );
    // The same status marked retryable is tried again.
    s.retryable.store(true, Ordering::SeqCst);
    let outcome = client.post_report(&completion(1)).await;
    assert!(matches!(outcome, PostOutcome::Retry(_)), "{outcome:?}");
}

#[tokio::test]
async fn a_report_refused_for_good_is_dropped_from_the_outbox_with_the_servers_message() {
    let s = refusing_server().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db")).unwrap());
    let item = completion(7);
    outbox.put(&item).await.unwrap();
    let transport: Arc<dyn RelayTransport> =
        Arc::new(HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap());
    let mut shared = SharedSet::new();
    shared.share(ProjectId::parse("p1").unwrap(), session());
    let relay = Relay::new(
        RelayConfig {
            mode: graph_relay_core::relay::RelayMode::Interval,
            ..RelayConfig::default()
        },
        shared,
        SystemClock.now(),
    );
    let driver = RelayDriver::new(
        relay,
        transport,
        outbox.clone(),
        Arc::new(EchoExecutor(Mutex::new(Vec::new()))),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        move |e| sink.lock().unwrap().push(e),
    ));
    // The pass posts the report first, then syncs.
    wait_for(|| !s.syncs.lock().unwrap().is_empty()).await;
    assert!(outbox.pending().await.unwrap().is_empty(), "dropped");
    let dropped = events.lock().unwrap().iter().find_map(|e| match e {
        DriverEvent::Relay(RelayEvent::Dropped { command, reason }) => {
            Some((*command, reason.clone()))
        }
        _ => None,
    });
    let (command, reason) = dropped.expect("a Dropped event");
    assert_eq!(command, item.command);
    assert!(
        reason.contains("this device may not report here"),
        "{reason}"
    );
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the driver stops")
        .unwrap();
    assert_eq!(
        s.reports.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "posted once, never retried (not even on shutdown)"
    );
}

#[tokio::test]
async fn the_first_sync_of_a_driver_says_it_restarted_and_later_ones_do_not() {
    let s = refusing_server().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db")).unwrap());
    let transport: Arc<dyn RelayTransport> =
        Arc::new(HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap());
    let mut shared = SharedSet::new();
    shared.share(ProjectId::parse("p1").unwrap(), session());
    // Long-poll: the stand-in answers every sync at once, so passes follow
    // each other without waiting.
    let relay = Relay::new(RelayConfig::default(), shared, SystemClock.now());
    let driver = RelayDriver::new(
        relay,
        transport,
        outbox,
        Arc::new(EchoExecutor(Mutex::new(Vec::new()))),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        |_| {},
    ));
    wait_for(|| s.syncs.lock().unwrap().len() >= 2).await;
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the driver stops")
        .unwrap();
    let syncs = s.syncs.lock().unwrap().clone();
    assert_eq!(syncs[0]["restarted"], true, "{syncs:?}");
    assert!(
        syncs[0].get("running_command_id").is_none(),
        "nothing runs: {syncs:?}"
    );
    assert!(
        syncs[1..].iter().all(|b| b["restarted"] == false),
        "{syncs:?}"
    );
}

#[tokio::test]
async fn the_relay_api_takes_the_restart_announcement() {
    let s = server(Duration::from_secs(5)).await;
    let id = s.run("key-restart-1").await;
    let mut body = Server::sync_body(false);
    body["restarted"] = json!(true);
    body["running_command_id"] = json!(id.to_string());
    let (status, reply) = s.post(Some(DEVICE), "/sync", body).await;
    assert_eq!(status, 200, "{reply}");
    let mut body = Server::sync_body(false);
    body["running_command_id"] = json!("not-a-uuid");
    let (status, reply) = s.post(Some(DEVICE), "/sync", body).await;
    assert_eq!(status, 400, "{reply}");
}

#[tokio::test]
async fn a_driver_announces_its_restart_only_once_the_reports_from_before_are_delivered() {
    use std::sync::atomic::Ordering;
    let s = refusing_server().await;
    // The server cannot take the report from before the crash yet (503-like).
    s.retryable.store(true, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db")).unwrap());
    outbox.put(&completion(7)).await.unwrap();
    let transport: Arc<dyn RelayTransport> =
        Arc::new(HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap());
    let mut shared = SharedSet::new();
    shared.share(ProjectId::parse("p1").unwrap(), session());
    let relay = Relay::new(RelayConfig::default(), shared, SystemClock.now());
    let driver = RelayDriver::new(
        relay,
        transport,
        outbox.clone(),
        Arc::new(EchoExecutor(Mutex::new(Vec::new()))),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        |_| {},
    ));
    wait_for(|| s.syncs.lock().unwrap().len() >= 4).await;
    assert!(
        s.syncs
            .lock()
            .unwrap()
            .iter()
            .all(|b| b["restarted"] == false),
        "no announcement while the report waits in the outbox"
    );
    assert_eq!(outbox.pending().await.unwrap().len(), 1);
    // The server refuses it for good (say its run's lease lapsed): dropped,
    // and the next sync announces the restart.
    s.retryable.store(false, Ordering::SeqCst);
    wait_for(|| {
        s.syncs
            .lock()
            .unwrap()
            .iter()
            .any(|b| b["restarted"] == true)
    })
    .await;
    assert!(outbox.pending().await.unwrap().is_empty());
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the driver stops")
        .unwrap();
}

/// Waits for its cancel signal, recording that it came; reports progress first.
struct WaitingExecutor {
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Executor for WaitingExecutor {
    async fn execute(
        &self,
        _job: Job,
        cancel: CancelSignal,
        progress: ProgressSink,
    ) -> ExecutionOutcome {
        progress.report(graph_relay_core::relay::executor::ProgressReport {
            message: Some("working".into()),
            percent: Some(10.0),
        });
        cancel.await;
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        ExecutionOutcome {
            status: Some(graph_relay_core::envelope::FinishStatus::Cancelled),
            ..Default::default()
        }
    }
}

#[tokio::test]
async fn a_run_whose_lease_lapsed_is_stopped_by_the_driver_and_nothing_is_reported() {
    // Interval mode: a lease of five 100 ms control intervals on the server,
    // a control poll every 3 s on the desktop, so the lease lapses between
    // two polls.
    let s = server_with(
        Duration::from_secs(5),
        QueueConfig {
            control_interval: Duration::from_millis(100),
            lease_interval_controls: 5,
            ..QueueConfig::default()
        },
    )
    .await;
    let id = s.run("key-lapse-driver").await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db")).unwrap());
    let transport: Arc<dyn RelayTransport> =
        Arc::new(HttpRelayTransport::new(HttpRelayConfig::new(&s.base, DEVICE)).unwrap());
    let mut shared = SharedSet::new();
    shared.share(ProjectId::parse("p1").unwrap(), session());
    let relay = Relay::new(
        RelayConfig {
            mode: graph_relay_core::relay::RelayMode::Interval,
            ..RelayConfig::default()
        },
        shared,
        SystemClock.now(),
    );
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = RelayDriver::new(
        relay,
        transport,
        outbox.clone(),
        Arc::new(WaitingExecutor {
            stopped: stopped.clone(),
        }),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        move |e| sink.lock().unwrap().push(e),
    ));
    let abandoned = |events: &Mutex<Vec<DriverEvent>>| {
        events
            .lock()
            .unwrap()
            .contains(&DriverEvent::Relay(RelayEvent::Abandoned { command: id }))
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !abandoned(&events) {
        assert!(Instant::now() < deadline, "{:?}", events.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        stopped.load(std::sync::atomic::Ordering::SeqCst),
        "the engine was stopped"
    );
    assert!(
        events
            .lock()
            .unwrap()
            .contains(&DriverEvent::Relay(RelayEvent::ClosedByServer {
                command: id,
                status: CommandStatus::Failed
            }))
    );
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, DriverEvent::Relay(RelayEvent::Finished { .. }))),
        "nothing reported"
    );
    assert!(outbox.pending().await.unwrap().is_empty());
    let view = s.queue.get_graph_run(&agent(), &id).await.unwrap();
    assert_eq!(view.command.status, CommandStatus::Failed);
    assert!(
        view.command
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(graph_relay_core::command::LEASE_LAPSED)),
        "{:?}",
        view.command.reason
    );
    // The report the executor made before the lapse reached the server.
    assert_eq!(
        view.command.progress.and_then(|p| p.message).as_deref(),
        Some("working")
    );
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the driver stops")
        .unwrap();
}
