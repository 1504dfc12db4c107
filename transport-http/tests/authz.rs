//! The authorization table over HTTP: every method the server answers,
//! called with no scope, the read scope and the run scope, is refused with
//! the one `insufficient_scope` answer (403 + `WWW-Authenticate`) exactly
//! when the table says so (issue 13, item 2).

mod common;

use axum::http::StatusCode;
use common::*;
use graph_relay_core::authz::Method;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_transport_http::HttpConfig;
use serde_json::{Value, json};

const UNKNOWN: &str = "67e55044-10b1-426f-9247-bb680e5fe0c8";

/// One way of calling a method: the label names the method (and tool).
struct Call {
    label: String,
    legacy: bool,
    method: &'static str,
    params: Value,
}

fn calls_for(method: Method) -> Vec<Call> {
    let legacy = |label: &str, method: &'static str, params: Value| Call {
        label: label.to_owned(),
        legacy: true,
        method,
        params,
    };
    let modern = |label: &str, method: &'static str, params: Value| Call {
        label: label.to_owned(),
        legacy: false,
        method,
        params,
    };
    match method {
        Method::Initialize => vec![legacy("initialize", "initialize", json!({}))],
        Method::Ping => vec![legacy("ping", "ping", json!({}))],
        Method::ToolsList => vec![
            legacy("tools/list", "tools/list", json!({})),
            modern("tools/list", "tools/list", json!({})),
        ],
        Method::ServerDiscover => vec![modern("server/discover", "server/discover", json!({}))],
        Method::ToolsCall => [
            ("list_graph_sessions", json!({"project_id": "p1"})),
            ("get_graph_run", json!({"command_id": UNKNOWN})),
            (
                "run_graph_session",
                json!({"graph_session_id": GS, "idempotency_key": "walk-key-1"}),
            ),
            ("cancel_graph_run", json!({"command_id": UNKNOWN})),
        ]
        .into_iter()
        .flat_map(|(tool, arguments)| {
            let params = json!({"name": tool, "arguments": arguments});
            let label = format!("tools/call {tool}");
            [
                legacy(&label, "tools/call", params.clone()),
                modern(&label, "tools/call", params),
            ]
        })
        .collect(),
        Method::SubscriptionsListen => vec![modern(
            "subscriptions/listen",
            "subscriptions/listen",
            json!({"notifications": {"taskIds": [UNKNOWN]}}),
        )],
        Method::TasksGet | Method::TasksCancel | Method::TasksUpdate => vec![modern(
            method.name(),
            match method {
                Method::TasksGet => "tasks/get",
                Method::TasksCancel => "tasks/cancel",
                _ => "tasks/update",
            },
            json!({"taskId": UNKNOWN, "inputResponses": {}}),
        )],
        Method::Notification => Vec::new(),
    }
}

/// What SPEC §10 says each call needs, written out independently of the
/// table in core; a method answered by the server but missing here fails.
fn expected_scope(label: &str) -> Option<&'static str> {
    match label {
        "initialize" | "ping" | "tools/list" | "server/discover" => None,
        "tasks/get" | "subscriptions/listen" => Some(READ_SCOPE),
        "tasks/cancel" | "tasks/update" => Some(RUN_SCOPE),
        "tools/call list_graph_sessions" | "tools/call get_graph_run" => Some(READ_SCOPE),
        "tools/call run_graph_session" | "tools/call cancel_graph_run" => Some(RUN_SCOPE),
        other => panic!("`{other}` is answered by the server but missing from this test's table"),
    }
}

async fn perform(state: &graph_relay_transport_http::HttpState, token: &str, call: &Call) -> Reply {
    if call.method == "initialize" {
        return send(
            state,
            post(
                Some(token),
                &[],
                initialize_body(&json!({"name": "t", "version": "1"})),
            ),
        )
        .await;
    }
    if call.legacy {
        let session = initialize(state, token).await;
        return send(
            state,
            post(
                Some(token),
                &[
                    ("mcp-session-id", &session),
                    ("mcp-protocol-version", "2025-11-25"),
                ],
                json!({"jsonrpc": "2.0", "id": 9, "method": call.method, "params": call.params})
                    .to_string(),
            ),
        )
        .await;
    }
    call_modern(state, token, call.method, call.params.clone()).await
}

#[tokio::test]
async fn every_method_times_every_scope_set_follows_the_table() {
    let state = static_state(HttpConfig::default()).await;
    let mut walked = 0;
    for method in Method::ALL {
        for call in calls_for(method) {
            let needed = expected_scope(&call.label);
            for (who, token, granted) in [
                ("no scope", ASSISTANT_NONE, &[][..]),
                ("read", ASSISTANT_READ, &[READ_SCOPE][..]),
                ("run", FULL, &[READ_SCOPE, RUN_SCOPE][..]),
            ] {
                let reply = perform(&state, token, &call).await;
                let what = format!(
                    "{} ({}) as {who}: {} {}",
                    call.label,
                    if call.legacy { "legacy" } else { "modern" },
                    reply.status,
                    reply.body
                );
                let lacks = needed.is_some_and(|s| !granted.contains(&s));
                if lacks {
                    let scope = needed.unwrap();
                    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{what}");
                    assert_eq!(reply.body["error"], "insufficient_scope", "{what}");
                    assert_eq!(reply.body["scope"], scope, "{what}");
                    let challenge = reply.headers["www-authenticate"].to_str().unwrap();
                    assert!(
                        challenge.contains("error=\"insufficient_scope\"")
                            && challenge.contains(&format!("scope=\"{scope}\"")),
                        "{what}: {challenge}"
                    );
                } else {
                    assert_ne!(reply.status, StatusCode::FORBIDDEN, "{what}");
                    assert_ne!(reply.body["error"]["code"], -32003, "{what}");
                }
                walked += 1;
            }
        }
    }
    assert!(walked >= 3 * 15, "walked {walked}");
}

/// Method names of every MCP revision and some that exist nowhere: what
/// the server answers with anything but "method not found" must be in the
/// authorization table.
#[tokio::test]
async fn no_method_is_answered_without_an_entry_in_the_table() {
    let state = static_state(HttpConfig::default()).await;
    let session = initialize(&state, FULL).await;
    for name in [
        "ping",
        "tools/list",
        "server/discover",
        "tasks/list",
        "tasks/result",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "sampling/createMessage",
        "roots/list",
        "admin/cancel_all",
    ] {
        let legacy = send(
            &state,
            post(
                Some(FULL),
                &[
                    ("mcp-session-id", &session),
                    ("mcp-protocol-version", "2025-11-25"),
                ],
                json!({"jsonrpc": "2.0", "id": 9, "method": name, "params": {}}).to_string(),
            ),
        )
        .await;
        let modern = call_modern(&state, FULL, name, json!({})).await;
        for reply in [legacy, modern] {
            if reply.body["error"]["code"] != -32601 {
                assert!(
                    Method::parse(name).is_some(),
                    "`{name}` is answered ({} {}) but has no entry in the authorization table",
                    reply.status,
                    reply.body
                );
            }
        }
    }
}

/// Issue 13, item 2: with only `osfoundry:read`, `cancel_graph_run` was
/// refused but `tasks/cancel` cancelled the same run; without any osfoundry
/// scope, `tasks/get` and `tasks/cancel` were answered.
#[tokio::test]
async fn tasks_cancel_needs_the_run_scope_and_tasks_get_the_read_scope() {
    let state = static_state(HttpConfig::default()).await;
    let task = run(&state, FULL, "cancel-key-1").await;
    let cancel = json!({"taskId": task});
    for token in [ASSISTANT_READ, ASSISTANT_NONE] {
        let reply = call_modern(&state, token, "tasks/cancel", cancel.clone()).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
        assert_eq!(reply.body["scope"], RUN_SCOPE);
    }
    let reply = call_modern(&state, ASSISTANT_NONE, "tasks/get", cancel.clone()).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(reply.body["scope"], READ_SCOPE);
    // Nothing was cancelled.
    let reply = call_modern(&state, ASSISTANT_READ, "tasks/get", cancel.clone()).await;
    assert_eq!(reply.body["result"]["status"], "working", "{}", reply.body);
    let reply = call_modern(&state, FULL, "tasks/cancel", cancel.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = call_modern(&state, FULL, "tasks/get", cancel).await;
    assert_eq!(
        reply.body["result"]["status"], "cancelled",
        "{}",
        reply.body
    );
}

/// A listen stream needs the read scope.
#[tokio::test]
async fn subscriptions_listen_needs_the_read_scope() {
    let state = static_state(HttpConfig::default()).await;
    let task = run(&state, FULL, "listen-key-1").await;
    let reply = call_modern(
        &state,
        ASSISTANT_NONE,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [task]}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(reply.body["scope"], READ_SCOPE);
    assert_eq!(state.listen_count(), 0);
}
