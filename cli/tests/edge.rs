//! The hardened HTTP edge of the real `graph-relay serve` (issue 13, items
//! 2 to 6), driven over sockets: `token revoke` ends an open listen stream,
//! hostile `Host` headers are refused and never reflected, the connection
//! cap answers 503, scopes cover `tasks/*`, and sessions are per owner.

mod common;

use std::time::{Duration, Instant};

use common::{BIN, Proc};
use graph_relay_transport_http::auth::hash_token;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ALICE: &str = "gra_edge_alice_token";
const ALICE_READ: &str = "gra_edge_alice_read_token";
const BOB: &str = "gra_edge_bob_token";
const GS: &str = "gs_0123456789abcdef0123456789abcdef";

/// A folder with `graph-relay.toml`: `[server]` settings, alice/assistant
/// (full and read-only tokens), bob/assistant (same name, other owner) and
/// alice's device.
fn folder(server: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = |owner: &str, token: &str, scopes: &str| {
        format!(
            "[[agent]]\nname = \"assistant\"\nowner = \"{owner}\"\nprojects = [\"p1\"]\nscopes = [{scopes}]\ntoken_sha256 = \"{}\"\n\n",
            hash_token(token)
        )
    };
    let config = format!(
        "[server]\n{server}\n\n{}{}{}[[device]]\nname = \"desk\"\nowner = \"alice\"\ntoken_sha256 = \"{}\"\n",
        agent("alice", ALICE, "\"osfoundry:read\", \"osfoundry:run\""),
        agent("alice", ALICE_READ, "\"osfoundry:read\""),
        agent("bob", BOB, "\"osfoundry:read\", \"osfoundry:run\""),
        hash_token("grd_edge_device_token"),
    );
    std::fs::write(dir.path().join("graph-relay.toml"), config).expect("config");
    dir
}

/// `serve --memory` in `dir`; returns it and its address once it serves.
fn serve(dir: &tempfile::TempDir) -> (Proc, String) {
    let server = Proc::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--config",
            "graph-relay.toml",
            "--max-wait-seconds",
            "20",
        ],
        dir.path(),
        Duration::from_secs(20),
    );
    let line = server.wait_line("serving MCP at http://");
    let addr = line
        .split("serving MCP at http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .expect("address")
        .to_owned();
    (server, addr)
}

/// Shares `GS` to alice's `p1` as her device.
async fn share(addr: &str) {
    let reply = reqwest::Client::new()
        .post(format!("http://{addr}/external-assistants/graph-relays/sync"))
        .bearer_auth("grd_edge_device_token")
        .json(&json!({"project_id": "p1", "sessions": [{
            "graph_session_id": GS, "name": "Drafts", "slug": "drafts", "version": "1", "status": "ready"}]}))
        .send()
        .await
        .expect("sync");
    assert_eq!(reply.status(), 200, "{:?}", reply.text().await);
}

fn modern(method: &str, params: Value) -> (String, Vec<(&'static str, String)>) {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let mut headers = vec![
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", method.to_owned()),
    ];
    if let Some(name) = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
    {
        headers.push(("mcp-name", name.to_owned()));
    }
    (
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(),
        headers,
    )
}

fn request(addr: &str, token: &str, method: &str, params: Value) -> reqwest::RequestBuilder {
    let (body, headers) = modern(method, params);
    let mut request = reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    request
}

async fn run(addr: &str, token: &str, key: &str) -> String {
    let reply: Value = request(
        addr,
        token,
        "tools/call",
        json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS, "idempotency_key": key}}),
    )
    .send()
    .await
    .expect("run")
    .json()
    .await
    .expect("json");
    reply["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned()
}

/// A raw HTTP/1.1 exchange; the whole answer as text.
async fn raw(addr: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut text)).await;
    String::from_utf8_lossy(&text).into_owned()
}

/// `graph-relay token revoke` ends an open `subscriptions/listen` stream
/// within a second, and the run's later result never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_revoke_ends_an_open_listen_stream() {
    let dir = folder("");
    let (server, addr) = serve(&dir);
    share(&addr).await;
    let task = run(&addr, ALICE, "edge-revoke-1").await;
    let mut stream = request(
        &addr,
        ALICE,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [task]}}),
    )
    .send()
    .await
    .expect("listen");
    assert_eq!(stream.status(), 200);
    let mut seen = String::new();
    while !seen.contains("notifications/tasks") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
            .await
            .expect("first notification")
            .expect("chunk")
            .expect("open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let hash = hash_token(ALICE);
    let revoke = std::process::Command::new(BIN)
        .args([
            "token",
            "revoke",
            &hash[..16],
            "--config",
            "graph-relay.toml",
        ])
        .current_dir(dir.path())
        .output()
        .expect("token revoke");
    assert!(revoke.status.success(), "{revoke:?}");
    let revoked_at = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.chunk().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(None) | Err(_) => return Instant::now(),
            }
        }
    })
    .await
    .expect("the stream outlived the revocation");
    let took = ended.duration_since(revoked_at);
    assert!(
        took <= Duration::from_secs(1),
        "ended {took:?} after the revocation"
    );
    assert!(!seen.contains("\"completed\""), "{seen}");
    let after = request(&addr, ALICE, "tasks/get", json!({"taskId": task}))
        .send()
        .await
        .expect("answer");
    assert_eq!(after.status(), 401);
    drop(server);
}

/// Hostile `Host` headers are refused, and nothing the server publishes
/// names them.
#[tokio::test]
async fn hostile_hosts_are_refused_and_never_reflected() {
    let dir = folder("");
    let (_server, addr) = serve(&dir);
    let port = addr.rsplit(':').next().expect("port");
    for host in [
        "localhost:1@evil.example".to_owned(),
        "[::1].evil.example".to_owned(),
        "localhost.evil.com".to_owned(),
        format!("localhost.evil.com:{port}"),
        "localhost:1".to_owned(),
        "garbage host".to_owned(),
    ] {
        let text = raw(
            &addr,
            &format!("GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(
            text.starts_with("HTTP/1.1 403") || text.starts_with("HTTP/1.1 400"),
            "{host}: {text}"
        );
        assert!(!text.contains("evil"), "{host}: {text}");
    }
    let text = raw(
        &addr,
        &format!("GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains(&format!("\"resource\":\"http://{addr}/mcp\"")),
        "{text}"
    );
    let text = raw(
        &addr,
        &format!("POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(
        text.contains(&format!(
            "resource_metadata=\"http://{addr}/.well-known/oauth-protected-resource/mcp\""
        )),
        "{text}"
    );
}

/// `[server] max_connections`: one more connection is answered 503.
#[tokio::test]
async fn the_configured_connection_cap_answers_503() {
    let dir = folder("max_connections = 3\nheader_read_timeout_secs = 30");
    let (_server, addr) = serve(&dir);
    let mut held = Vec::new();
    for _ in 0..3 {
        // Connected and silent: each holds a place until its header timeout.
        held.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = raw(
        &addr,
        &format!("GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: {addr}\r\n\r\n"),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");
    assert!(text.contains("Retry-After: 1"), "{text}");
}

/// The scope table end to end: a read-only token of the same agent cannot
/// `tasks/cancel`; owners reusing an agent name do not share sessions.
#[tokio::test]
async fn scopes_cover_tasks_and_sessions_are_per_owner() {
    let dir = folder("");
    let (_server, addr) = serve(&dir);
    share(&addr).await;
    let task = run(&addr, ALICE, "edge-scope-1").await;
    let refused = request(&addr, ALICE_READ, "tasks/cancel", json!({"taskId": task}))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 403);
    let challenge = refused.headers()["www-authenticate"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(challenge.contains("scope=\"osfoundry:run\""), "{challenge}");
    let read: Value = request(&addr, ALICE, "tasks/get", json!({"taskId": task}))
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(read["result"]["status"], "working", "{read}");

    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let reply = http
        .post(format!("http://{addr}/mcp"))
        .bearer_auth(ALICE)
        .header("accept", "application/json")
        .json(&init)
        .send()
        .await
        .expect("initialize");
    let session = reply.headers()["mcp-session-id"]
        .to_str()
        .expect("id")
        .to_owned();
    for (token, status) in [(BOB, 404), (ALICE, 200)] {
        let reply = http
            .post(format!("http://{addr}/mcp"))
            .bearer_auth(token)
            .header("accept", "application/json")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .send()
            .await
            .expect("answer");
        assert_eq!(reply.status(), status, "{token}");
    }
}

/// A connection cap the open-file limit cannot hold is reported at start.
#[test]
fn an_open_file_limit_below_the_cap_is_logged() {
    let dir = folder("max_connections = 100000000");
    let (server, _addr) = serve(&dir);
    let line = server.wait_line("open-file limit is below");
    assert!(line.contains("WARN"), "{line}");
}

/// `--connection-threads` outside 0 to 1024 is refused before anything
/// starts (no database is created), naming the flag and the range.
#[test]
fn connection_threads_out_of_range_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("q.db");
    for bad in ["1025", "-1", "many"] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(&db)
            // One argument, so that `-1` is read as the flag's value.
            .arg(format!("--connection-threads={bad}"))
            .output()
            .expect("run graph-relay");
        assert!(!out.status.success(), "--connection-threads {bad} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--connection-threads") && stderr.contains(bad),
            "{bad}: {stderr}"
        );
        if bad == "1025" {
            assert!(stderr.contains("0..=1024"), "{stderr}");
        }
        assert!(!db.exists(), "{bad}: a database was created");
    }
}
