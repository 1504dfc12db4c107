//! Revocation reaches everything (issue 13, item 4): when the token file
//! changes, an open `subscriptions/listen` stream, a held `wait_seconds`
//! call and an initialize-era session of the revoked token end within a
//! second, over a real socket.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::*;
use graph_relay_core::prelude::*;
use graph_relay_transport_http::auth::TokenConfig;
use graph_relay_transport_http::token_file::TokenFile;
use graph_relay_transport_http::{HttpConfig, HttpState, ServeConfig};
use serde_json::{Value, json};

/// How soon a revocation must reach what is open.
const WITHIN: Duration = Duration::from_secs(1);
/// A second token of alice/assistant, created when `FULL` is revoked.
const NEW_FULL: &str = "tok-full-new";

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    state: HttpState,
    url: String,
    http: reqwest::Client,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("graph-relay.toml");
    write_tokens(&path, &tokens());
    let auth = Arc::new(TokenFile::open(&path).unwrap());
    let (state, addr) = serve_on_socket(
        |addr| async move {
            common::state(
                HttpConfig {
                    listen_addr: Some(addr),
                    allowed_ports: vec![8787],
                    ..HttpConfig::default()
                },
                auth,
            )
            .await
        },
        ServeConfig::default(),
    )
    .await;
    Fixture {
        _dir: dir,
        path,
        state,
        url: format!("http://{addr}/mcp"),
        http: reqwest::Client::new(),
    }
}

/// Writes the token file as `graph-relay token` does (a new file renamed into place).
fn write_tokens(path: &Path, tokens: &TokenConfig) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, token_file(tokens)).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

impl Fixture {
    /// Revokes `FULL` and gives alice/assistant a new token; returns when
    /// the file was written.
    fn revoke_full(&self) -> Instant {
        let mut tokens = tokens();
        for agent in &mut tokens.agents {
            if agent.token_sha256 == graph_relay_transport_http::auth::hash_token(FULL) {
                agent.revoked = true;
            }
        }
        tokens.agents.push(agent_token(
            "alice",
            "assistant",
            NEW_FULL,
            &["osfoundry:read", "osfoundry:run"],
        ));
        write_tokens(&self.path, &tokens);
        Instant::now()
    }

    fn request(&self, token: &str, method: &str, params: Value) -> reqwest::RequestBuilder {
        let (body, headers) = modern(method, params);
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        for (k, v) in headers {
            request = request.header(k, v);
        }
        request
    }

    async fn complete(&self, task: &str) {
        let queue = self.state.mcp().queue();
        let command = CommandId::parse(task).unwrap();
        let exec = ExecutionId::parse("exec-1").unwrap();
        queue.start(&desktop(), &command, &exec).await.unwrap();
        let envelope = ResultEnvelope::build(
            exec,
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!("the secret result"),
                ..Default::default()
            },
        );
        queue
            .complete(&desktop(), &command, &envelope)
            .await
            .unwrap();
    }
}

/// Issue 13, item 4: a listen stream opened before `token revoke` still
/// received the run's result afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_ends_when_its_token_is_revoked() {
    let f = fixture().await;
    let task = run(&f.state, FULL, "revoke-listen-1").await;
    let mut response = f
        .request(
            FULL,
            "subscriptions/listen",
            json!({"notifications": {"taskIds": [task]}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    // The acknowledgement and the first status arrive.
    while !seen.contains("notifications/tasks") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), response.chunk())
            .await
            .expect("the stream started")
            .unwrap()
            .expect("a chunk");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(f.state.listen_count(), 1);
    let revoked_at = f.revoke_full();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(None) | Err(_) => return Instant::now(),
            }
        }
    })
    .await
    .expect("the stream never ended after the revocation");
    let took = ended.duration_since(revoked_at);
    assert!(
        took <= WITHIN,
        "the stream ended {took:?} after the revocation"
    );
    eventually(WITHIN, "the stream's place freed", || {
        f.state.listen_count() == 0
    })
    .await;
    // The run finishes later: nothing of it reached the stream.
    f.complete(&task).await;
    assert!(!seen.contains("the secret result"), "{seen}");
    assert!(!seen.contains("\"completed\""), "{seen}");
    // The revoked token cannot listen again; the new one can read the result.
    let again = f
        .request(FULL, "tasks/get", json!({"taskId": task}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 401);
    let read: Value = f
        .request(NEW_FULL, "tasks/get", json!({"taskId": task}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["result"]["status"], "completed", "{read}");
}

/// A `get_graph_run` held by `wait_seconds` ends with 401 when its token
/// is revoked, instead of answering with the run later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_wait_ends_when_its_token_is_revoked() {
    let f = fixture().await;
    let task = run(&f.state, FULL, "revoke-wait-1").await;
    let held = f
        .request(
            FULL,
            "tools/call",
            json!({"name": "get_graph_run", "arguments": {"command_id": task, "wait_seconds": 20}}),
        )
        .send();
    let held = tokio::spawn(async move {
        let response = held.await.unwrap();
        (
            Instant::now(),
            response.status(),
            response.text().await.unwrap(),
        )
    });
    // Once the call waits on the queue, revoke.
    let queue = f.state.mcp().queue().clone();
    eventually(Duration::from_secs(5), "the call waiting", || {
        queue.signals().waiting() > 0
    })
    .await;
    let revoked_at = f.revoke_full();
    let (ended, status, body) = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("the held call never ended after the revocation")
        .unwrap();
    let took = ended.duration_since(revoked_at);
    assert!(
        took <= WITHIN,
        "the call ended {took:?} after the revocation"
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED.as_u16(), "{body}");
    assert!(body.contains("invalid_token"), "{body}");
}

/// An initialize-era session of a revoked token ends: the old token gets
/// 401, and even a new token of the same agent gets 404 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_its_token_is_revoked() {
    let f = fixture().await;
    let session = initialize(&f.state, FULL).await;
    let other = initialize(&f.state, READER).await;
    assert_eq!(f.state.session_count(), 2);
    let revoked_at = f.revoke_full();
    eventually(WITHIN, "the revoked token's session ended", || {
        f.state.session_count() == 1
    })
    .await;
    assert!(revoked_at.elapsed() <= WITHIN + Duration::from_millis(100));
    let old = f
        .http
        .post(&f.url)
        .bearer_auth(FULL)
        .header("content-type", "application/json")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(old.status(), 401);
    assert_eq!(
        use_session(&f.state, NEW_FULL, &session).await,
        StatusCode::NOT_FOUND
    );
    // The other agent's session lives on.
    assert_eq!(use_session(&f.state, READER, &other).await, StatusCode::OK);
}

/// Sessions are bound to the token that created them, not only the agent.
#[tokio::test]
async fn a_session_belongs_to_its_token() {
    let state = static_state(HttpConfig::default()).await;
    let session = initialize(&state, FULL).await;
    assert_eq!(use_session(&state, FULL, &session).await, StatusCode::OK);
    // Same agent (alice/assistant), another token.
    assert_eq!(
        use_session(&state, ASSISTANT_READ, &session).await,
        StatusCode::NOT_FOUND
    );
}
