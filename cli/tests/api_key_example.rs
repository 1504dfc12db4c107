//! The API-key server example (`transport-http/examples/api_key_server.rs`)
//! as a user would run it: its server built and served on a loopback socket, the
//! desktop side played over the relay API with a device key, and the agent
//! side played by the official Python `mcp` client (legacy and 2026-07-28)
//! with `X-Api-Key`. The client lists the tools, runs a Graph, sees it
//! completed, and gets the example's own 401 challenge without a key.
//! Needs the real MCP peers (`common::peers`); `GRAPH_RELAY_SKIP=peers`
//! lists it as ignored.

mod common;

#[allow(dead_code)]
#[path = "../../transport-http/examples/api_key_server.rs"]
mod api_key_server;

use std::path::Path;
use std::process::Command;

use graph_relay_transport_http::relay_wire::RELAY_PREFIX;
use serde_json::{Value, json};

const AGENT_KEY: &str = "agent-key-0123456789";
const DEVICE_KEY: &str = "device-key-0123456789";
const GS: &str = "gs_0123456789abcdef0123456789abcdef";

/// The Python client, `phase` of `tests/python/api_key_flow.py`; its stdout.
fn python(phase: &str, mode: &str, url: &str, extra: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/api_key_flow.py");
    let out = Command::new(common::peers().python)
        .arg(script)
        .args([phase, mode, url, AGENT_KEY])
        .args(extra)
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{phase} {mode}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// POSTs `body` to a relay route with `key` in `X-Api-Key`.
async fn relay(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    key: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut request = http.post(format!("{base}{RELAY_PREFIX}{path}")).json(&body);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    request.send().await.expect("relay request")
}

#[test]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
fn python_client_runs_a_graph_on_the_api_key_server() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let keys = api_key_server::example_keys(AGENT_KEY, DEVICE_KEY).unwrap();
    let server = runtime
        .block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            api_key_server::builder(keys).build(listener).await
        })
        .unwrap();
    let addr = server.local_addr();
    runtime.spawn(server.serve(std::future::pending()));
    let base = format!("http://{addr}");
    let url = format!("{base}/mcp");
    let http = reqwest::Client::new();
    let sync = json!({"project_id": "p1", "long_poll": false, "sessions": [
        {"graph_session_id": GS, "name": "Drafts", "slug": "drafts", "version": "1", "status": "ready"}
    ]});

    runtime.block_on(async {
        // The relay routes answer with the example's challenge too, and
        // keep agents out.
        let refused = relay(&http, &base, "/sync", None, sync.clone()).await;
        assert_eq!(refused.status(), 401);
        assert_eq!(
            refused.headers()["www-authenticate"],
            api_key_server::API_KEY_CHALLENGE
        );
        let agent = relay(&http, &base, "/sync", Some(AGENT_KEY), sync.clone()).await;
        assert_eq!(agent.status(), 403);
        // The desktop shares the Graph session.
        let shared = relay(&http, &base, "/sync", Some(DEVICE_KEY), sync.clone()).await;
        assert_eq!(shared.status(), 200);
        // The example's own route takes the caller with `AgentPrincipal`.
        let me: Value = http
            .get(format!("{base}/whoami"))
            .header("x-api-key", AGENT_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(me, json!({"owner": "alice", "agent": "assistant"}));
    });

    for mode in ["legacy", "2026-07-28"] {
        let printed = python("run", mode, &url, &[]);
        let command = printed
            .lines()
            .find_map(|l| l.strip_prefix("COMMAND "))
            .unwrap_or_else(|| panic!("no command id in {printed:?}"))
            .to_owned();
        runtime.block_on(async {
            let reply: Value = relay(&http, &base, "/sync", Some(DEVICE_KEY), sync.clone())
                .await
                .json()
                .await
                .unwrap();
            assert_eq!(
                reply["commands"][0]["command_id"],
                command.as_str(),
                "{reply}"
            );
            let execution = format!("exec-{mode}");
            let started = relay(
                &http,
                &base,
                &format!("/commands/{command}/start"),
                Some(DEVICE_KEY),
                json!({"execution_id": execution}),
            )
            .await;
            assert_eq!(started.status(), 200);
            let completed = relay(
                &http,
                &base,
                &format!("/commands/{command}/complete"),
                Some(DEVICE_KEY),
                json!({"execution_id": execution, "status": "completed", "result": {"answer": 42},
                       "total_tokens": null, "reported_cost": null}),
            )
            .await;
            assert_eq!(completed.status(), 200);
        });
        let printed = python("finished", mode, &url, &[&command]);
        assert!(printed.contains(&format!("OK {mode}")), "{printed}");
    }
}
