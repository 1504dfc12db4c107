//! Sessions and listen streams bounded per agent and in bytes (issue 13,
//! item 6). An agent is its owner and its name.

mod common;

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use common::*;
use graph_relay_core::mcp::MAX_INITIALIZE_FIELD_BYTES;
use graph_relay_core::mcp::McpSessionLimits;
use graph_relay_transport_http::{HttpConfig, ListenLimits};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// Issue 13, item 6: one agent's initializes evicted every other agent's
/// live sessions from the one shared pool.
#[tokio::test]
async fn another_agents_flood_never_evicts_a_session() {
    let state = static_state(HttpConfig {
        mcp_sessions: McpSessionLimits {
            max_sessions: 150,
            max_sessions_per_agent: 100,
            ..McpSessionLimits::default()
        },
        ..HttpConfig::default()
    })
    .await;
    let alice = initialize(&state, FULL).await;
    // bob/assistant: another owner's agent with the same name.
    let mut bobs = Vec::new();
    for _ in 0..1_000 {
        bobs.push(initialize(&state, BOB).await);
    }
    assert_eq!(use_session(&state, FULL, &alice).await, StatusCode::OK);
    // Bob's own oldest sessions made room; his newest 100 live.
    assert_eq!(
        use_session(&state, BOB, &bobs[0]).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(use_session(&state, BOB, &bobs[999]).await, StatusCode::OK);
    assert_eq!(
        use_session(&state, BOB, &bobs[900]).await,
        StatusCode::OK,
        "the 100 most recent are kept"
    );
    assert_eq!(
        use_session(&state, BOB, &bobs[899]).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(state.session_count(), 101);
    // Same name, another owner: neither uses the other's session.
    assert_eq!(
        use_session(&state, BOB, &alice).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        use_session(&state, FULL, &bobs[999]).await,
        StatusCode::NOT_FOUND
    );
}

/// At the global bound an agent with sessions gives up its own oldest, and
/// an agent without any is refused clearly instead of evicting others.
#[tokio::test]
async fn the_global_bound_refuses_instead_of_evicting_others() {
    let state = static_state(HttpConfig {
        mcp_sessions: McpSessionLimits {
            max_sessions: 150,
            max_sessions_per_agent: 100,
            ..McpSessionLimits::default()
        },
        ..HttpConfig::default()
    })
    .await;
    let alice = initialize(&state, FULL).await;
    for _ in 0..100 {
        initialize(&state, BOB).await;
    }
    let mut readers = Vec::new();
    for _ in 0..100 {
        readers.push(initialize(&state, READER).await);
    }
    assert_eq!(state.session_count(), 150);
    assert_eq!(use_session(&state, FULL, &alice).await, StatusCode::OK);
    assert_eq!(
        use_session(&state, READER, &readers[99]).await,
        StatusCode::OK
    );
    // alice/nobody holds no session: refused, nobody evicted.
    let refused = send(
        &state,
        post(
            Some(NOSCOPE),
            &[],
            initialize_body(&json!({"name": "t", "version": "1"})),
        ),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["error"]["code"], -32004);
    assert_eq!(refused.body["error"]["data"]["limit"], 150);
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 150 sessions")
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert!(refused.headers.get("mcp-session-id").is_none());
    assert_eq!(state.session_count(), 150);
    assert_eq!(use_session(&state, FULL, &alice).await, StatusCode::OK);
}

/// Issue 13, item 6: a 1 MB `clientInfo` held 18.6 MB per session. Now
/// 50,000 such initializes are refused with -32602 naming the limit and
/// nothing of them is kept. Parsing 1 MB of JSON costs ~4 ms in a debug
/// build, so a debug run sends 2,000 of them; `cargo test --release`
/// sends all 50,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_huge_initializes_keeps_nothing() {
    const FLOOD: usize = if cfg!(debug_assertions) {
        2_000
    } else {
        50_000
    };
    let state = static_state(HttpConfig::default()).await;
    let app = graph_relay_transport_http::router(state.clone());
    let body = Bytes::from(initialize_body(&json!({
        "name": "x".repeat(1_000_000),
        "version": "1",
    })));
    assert!(body.len() > 1_000_000 && body.len() < 1024 * 1024);
    let started = Instant::now();
    let flood = |start: usize| {
        let app = app.clone();
        let body = body.clone();
        async move {
            for i in (start..FLOOD).step_by(2) {
                let response = app
                    .clone()
                    .oneshot(post(Some(FULL), &[], Body::from(body.clone())))
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                assert!(response.headers().get("mcp-session-id").is_none());
                let reply = response.into_body().collect().await.unwrap().to_bytes();
                if i < 2 {
                    let reply: Value = serde_json::from_slice(&reply).unwrap();
                    assert_eq!(reply["error"]["code"], -32602, "{reply}");
                    assert_eq!(reply["error"]["data"]["limit"], MAX_INITIALIZE_FIELD_BYTES);
                    assert!(
                        reply["error"]["message"]
                            .as_str()
                            .unwrap()
                            .contains("clientInfo")
                    );
                }
            }
        }
    };
    let (a, b) = tokio::join!(tokio::spawn(flood(0)), tokio::spawn(flood(1)));
    a.unwrap();
    b.unwrap();
    eprintln!("{FLOOD} refused initializes in {:?}", started.elapsed());
    assert_eq!(state.session_count(), 0);
    assert_eq!(state.session_bytes(), 0);
    // Accepted sessions keep at most the bound each, and at most 100 per agent.
    let fits = json!({"name": "y".repeat(MAX_INITIALIZE_FIELD_BYTES - 100), "version": "1"});
    for _ in 0..300 {
        let reply = send(&state, post(Some(FULL), &[], initialize_body(&fits))).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(state.session_count(), 100);
    assert!(state.session_bytes() <= 100 * MAX_INITIALIZE_FIELD_BYTES);
    assert!(state.session_bytes() >= 100 * (MAX_INITIALIZE_FIELD_BYTES - 100));
}

/// Opens a listen stream on `task` as `token` through the router; returns
/// the response (the stream stays open while it is held).
async fn open_listen(
    state: &graph_relay_transport_http::HttpState,
    token: &str,
    task: &str,
) -> axum::response::Response {
    let (body, headers) = modern(
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [task]}}),
    );
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    graph_relay_transport_http::router(state.clone())
        .oneshot(post(Some(token), &headers, body))
        .await
        .unwrap()
}

/// Issue 13, item 6: listen streams had no per-agent cap.
#[tokio::test]
async fn listen_streams_are_capped_per_agent() {
    let state = static_state(HttpConfig {
        listen: ListenLimits {
            max_streams_per_agent: 16,
            ..ListenLimits::default()
        },
        ..HttpConfig::default()
    })
    .await;
    let task = run(&state, FULL, "listen-cap-1").await;
    let mut open = Vec::new();
    for _ in 0..16 {
        let response = open_listen(&state, FULL, &task).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        open.push(response);
    }
    assert_eq!(state.listen_count(), 16);
    let refused = open_listen(&state, FULL, &task).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value =
        serde_json::from_slice(&refused.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["code"], -32004, "{body}");
    assert_eq!(body["error"]["data"]["limit"], 16);
    assert!(body["error"]["message"].as_str().unwrap().contains("16"));
    // Another agent (same name, other owner) is not affected.
    let bob_task = run(&state, BOB, "listen-cap-2").await;
    let bobs = open_listen(&state, BOB, &bob_task).await;
    assert_eq!(bobs.status(), StatusCode::OK);
    // A closed stream gives its place back.
    drop(open.pop());
    eventually(Duration::from_secs(5), "a place freed", || {
        state.listen_count() == 16
    })
    .await;
    assert_eq!(
        open_listen(&state, FULL, &task).await.status(),
        StatusCode::OK
    );
}

/// A stream ends cleanly at its maximum lifetime, with its result, while
/// its task is still working; the client listens again.
#[tokio::test]
async fn a_listen_stream_ends_at_its_maximum_lifetime() {
    let state = static_state(HttpConfig {
        listen: ListenLimits {
            max_lifetime: Duration::from_millis(300),
            ..ListenLimits::default()
        },
        ..HttpConfig::default()
    })
    .await;
    let task = run(&state, FULL, "lifetime-1").await;
    let started = Instant::now();
    let response = open_listen(&state, FULL, &task).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the stream outlived its lifetime")
        .unwrap()
        .to_bytes();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");
    let text = String::from_utf8_lossy(&text);
    let messages: Vec<Value> = text
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let last = messages.last().unwrap();
    assert_eq!(last["id"], 9, "{text}");
    assert_eq!(last["result"]["resultType"], "complete");
    assert!(text.contains("\"working\""), "{text}");
    eventually(Duration::from_secs(5), "the place freed", || {
        state.listen_count() == 0
    })
    .await;
}
