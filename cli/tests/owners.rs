//! Two owners that reuse one agent name and one device name, against a real
//! `graph-relay serve` over real sockets: neither reaches the other's runs
//! through MCP (tools and the tasks extension) or the relay API. Every
//! attempt is answered, byte for byte, as for an id that does not exist,
//! and changes nothing.

mod common;

use std::time::Duration;

use common::Proc;
use graph_relay_transport_http::auth::hash_token;
use serde_json::{Value, json};

const GS: &str = "gs_00000000000000000000000000000abc";
const ALICE_AGENT: &str = "gra_alice_assistant_token";
const BOB_AGENT: &str = "gra_bob_assistant_token";
const ALICE_DESK: &str = "grd_alice_desktop_token";
const BOB_DESK: &str = "grd_bob_desktop_token";
const UNKNOWN: &str = "00000000-0000-4000-8000-000000000abc";
const MODERN: &str = "2026-07-28";

struct Server {
    _proc: Proc,
    _dir: tempfile::TempDir,
    url: String,
    http: reqwest::Client,
}

fn config() -> String {
    let mut text = String::new();
    for (owner, token) in [("alice", ALICE_AGENT), ("bob", BOB_AGENT)] {
        text.push_str(&format!(
            "[[agent]]\nname = \"assistant\"\nowner = \"{owner}\"\nprojects = [\"p1\"]\nscopes = [\"osfoundry:read\", \"osfoundry:run\"]\ntoken_sha256 = \"{}\"\n\n",
            hash_token(token)
        ));
    }
    for (owner, token) in [("alice", ALICE_DESK), ("bob", BOB_DESK)] {
        text.push_str(&format!(
            "[[device]]\nname = \"desktop\"\nowner = \"{owner}\"\ntoken_sha256 = \"{}\"\n\n",
            hash_token(token)
        ));
    }
    text
}

fn serve() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("graph-relay.toml"), config()).expect("config");
    let proc = Proc::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--config",
            "graph-relay.toml",
        ],
        dir.path(),
        Duration::from_secs(30),
    );
    let line = proc.wait_line("serving MCP at http://");
    let url = line
        .split("serving MCP at ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("url")
        .trim_end_matches("/mcp")
        .to_owned();
    Server {
        _proc: proc,
        _dir: dir,
        url,
        http: reqwest::Client::new(),
    }
}

impl Server {
    /// A 2026-07-28 request; the status and the exact bytes of the answer.
    async fn mcp(&self, token: &str, method: &str, params: Value) -> (u16, String) {
        let mut params = params;
        // The tasks extension is declared for `tasks/*` only, so tools answer with tickets.
        let capabilities = if method.starts_with("tasks/") {
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        } else {
            json!({})
        };
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        });
        let mut request = self
            .http
            .post(format!("{}/mcp", self.url))
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", method);
        if let Some(name) = ["name", "taskId"]
            .iter()
            .find_map(|k| params.get(*k).and_then(Value::as_str))
        {
            request = request.header("mcp-name", name);
        }
        let response = request
            .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
            .send()
            .await
            .expect("answer");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    async fn tool(&self, token: &str, name: &str, arguments: Value) -> (u16, String) {
        self.mcp(
            token,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        )
        .await
    }

    /// A relay API request; the status and the exact bytes of the answer.
    async fn relay(&self, token: &str, path: &str, body: Value) -> (u16, String) {
        let response = self
            .http
            .post(format!(
                "{}/external-assistants/graph-relays{path}",
                self.url
            ))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("answer");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    async fn share(&self, token: &str) {
        let (status, body) = self
            .relay(
                token,
                "/sync",
                json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": "Drafts", "slug": "drafts"}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_with_the_same_agent_and_device_names_never_reach_each_other() {
    let s = serve();
    // Both desktops share a session with the same id into a project called `p1`.
    s.share(ALICE_DESK).await;
    s.share(BOB_DESK).await;
    let arguments = json!({"secret": "alice's"});
    let (status, text) = s
        .tool(
            ALICE_AGENT,
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "shared-key-0001", "arguments": arguments}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let alice_run = json_of(&text)["result"]["structuredContent"]["command_id"]
        .as_str()
        .expect("a ticket")
        .to_owned();
    // A task as well, to check the tasks extension.
    let before = s
        .tool(
            ALICE_AGENT,
            "get_graph_run",
            json!({"command_id": alice_run}),
        )
        .await;

    // Bob's assistant: every read and cancel answers as for an unknown id.
    for (name, field) in [
        ("get_graph_run", "command_id"),
        ("cancel_graph_run", "command_id"),
    ] {
        let theirs = s.tool(BOB_AGENT, name, json!({field: alice_run})).await;
        let none = s.tool(BOB_AGENT, name, json!({field: UNKNOWN})).await;
        assert_eq!(theirs, none, "{name}");
        assert!(
            theirs.1.contains("Graph run not found or access removed"),
            "{}",
            theirs.1
        );
    }
    let (status, text) = s
        .mcp(ALICE_AGENT, "tasks/get", json!({"taskId": alice_run}))
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        json_of(&text)["result"]["taskId"],
        alice_run,
        "Alice reads her task"
    );
    for method in ["tasks/get", "tasks/cancel"] {
        let theirs = s.mcp(BOB_AGENT, method, json!({"taskId": alice_run})).await;
        let none = s.mcp(BOB_AGENT, method, json!({"taskId": UNKNOWN})).await;
        assert_eq!(theirs, none, "{method}");
        assert!(
            theirs.1.contains("Task not found"),
            "{method}: {}",
            theirs.1
        );
    }
    // Bob reusing Alice's key: his own new run, never Alice's ticket or id.
    let (status, text) = s
        .tool(
            BOB_AGENT,
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "shared-key-0001", "arguments": arguments}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let bob = json_of(&text)["result"]["structuredContent"].clone();
    assert_eq!(bob["replayed"], false, "{bob}");
    let bob_run = bob["command_id"].as_str().expect("bob's ticket").to_owned();
    assert_ne!(bob_run, alice_run);
    let (_, text) = s
        .tool(
            BOB_AGENT,
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "shared-key-0001", "arguments": {"other": 1}}),
        )
        .await;
    assert!(text.contains("already used"), "{text}");
    assert!(text.contains(&bob_run), "names Bob's own command: {text}");
    assert!(!text.contains(&alice_run), "leaks Alice's command: {text}");

    // Bob's desktop: sync hands out only Bob's run; the rest is 404 as for an unknown id.
    let (status, text) = s
        .relay(BOB_DESK, "/sync", json!({"project_id": "p1", "sessions": [{"graph_session_id": GS, "name": "Drafts", "slug": "drafts"}]}))
        .await;
    assert_eq!(status, 200, "{text}");
    let handed: Vec<String> = json_of(&text)["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .map(|c| c["command_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(handed, vec![bob_run.clone()]);
    let forged = json!({"execution_id": "x1", "status": "completed", "result": {"forged": true}, "total_tokens": null, "reported_cost": null});
    for (action, body) in [
        ("start", json!({"execution_id": "x1"})),
        ("control", json!({})),
        ("complete", forged.clone()),
        ("decline", json!({})),
    ] {
        let theirs = s
            .relay(
                BOB_DESK,
                &format!("/commands/{alice_run}/{action}"),
                body.clone(),
            )
            .await;
        let none = s
            .relay(BOB_DESK, &format!("/commands/{UNKNOWN}/{action}"), body)
            .await;
        assert_eq!(theirs.0, 404, "{action}: {}", theirs.1);
        assert_eq!(theirs, none, "{action}");
    }
    // Once Alice's own desktop started it, Bob's desktop still cannot complete it.
    let (status, text) = s
        .relay(
            ALICE_DESK,
            &format!("/commands/{alice_run}/start"),
            json!({"execution_id": "x1"}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let (status, _) = s
        .relay(BOB_DESK, &format!("/commands/{alice_run}/complete"), forged)
        .await;
    assert_eq!(status, 404);
    let (_, text) = s
        .tool(
            ALICE_AGENT,
            "get_graph_run",
            json!({"command_id": alice_run}),
        )
        .await;
    let run = json_of(&text)["result"]["structuredContent"].clone();
    assert_eq!(run["status"], "running", "{run}");
    assert!(run.get("result").is_none(), "no forged result: {run}");
    // Nothing Bob did touched Alice's run before it started.
    assert_eq!(
        json_of(&before.1)["result"]["structuredContent"]["status"],
        "queued"
    );
}

/// `graph-relay <args>` in `dir`: exit success, stdout, stderr.
fn cli(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(common::BIN)
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run graph-relay");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command line names principals by (owner, name) too: a name two
/// owners use is refused until the owner is given as `OWNER/NAME`.
#[test]
fn the_token_commands_never_take_a_name_for_an_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ["--config", "graph-relay.toml"];
    for owner in ["alice", "bob"] {
        let mut args = vec!["token", "create", "agent", "assistant", "--owner", owner];
        args.extend_from_slice(&config);
        let (ok, token, err) = cli(dir.path(), &args);
        assert!(ok, "{err}");
        assert!(token.starts_with("gra_"), "{token}");
    }
    let mut revoke = vec!["token", "revoke", "assistant"];
    revoke.extend_from_slice(&config);
    let (ok, _, err) = cli(dir.path(), &revoke);
    assert!(!ok, "an ambiguous name must not revoke both owners' tokens");
    assert!(
        err.contains("alice/assistant") && err.contains("bob/assistant"),
        "{err}"
    );
    let (ok, _, err) = cli(
        dir.path(),
        &[
            "stdio",
            "--memory",
            "--agent",
            "assistant",
            "--config",
            "graph-relay.toml",
        ],
    );
    assert!(!ok);
    assert!(err.contains("several owners"), "{err}");

    let mut revoke = vec!["token", "revoke", "bob/assistant"];
    revoke.extend_from_slice(&config);
    let (ok, _, err) = cli(dir.path(), &revoke);
    assert!(ok, "{err}");
    assert!(err.contains("Revoked 1 token"), "{err}");
    let mut list = vec!["token", "list"];
    list.extend_from_slice(&config);
    let (ok, listing, err) = cli(dir.path(), &list);
    assert!(ok, "{err}");
    let state = |owner: &str| {
        listing
            .lines()
            .find(|l| l.contains("assistant") && l.contains(owner))
            .map(|l| l.contains("revoked"))
    };
    assert_eq!(state("alice"), Some(false), "{listing}");
    assert_eq!(state("bob"), Some(true), "{listing}");
    // Now only Alice's is active: the bare name is no longer ambiguous.
    let (ok, _, err) = cli(dir.path(), &revoke);
    assert!(!ok, "bob's token is already revoked: {err}");
}
