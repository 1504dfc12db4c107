//! `serve --metrics`: a Prometheus endpoint on a listener of its own. A
//! scrape after a run shows the figures moved (finished runs, the pickup
//! histogram, desktops online, HTTP requests by route, held requests, the
//! store's operation latency);
//! the MCP port does not serve them, and a foreign `Host` is refused.

mod common;

use std::time::Duration;

use common::Relay;
use common::scrape::{metrics_url, sample, scrape, scrape_until};
use serde_json::json;

const AGENT_TOKEN: &str = "gra_metrics_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_metrics_device_token_0123456789abcdef";
const GS: &str = "gs_cccccccccccccccccccccccccccccccc";
const GS_SLOW: &str = "gs_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const DEADLINE: Duration = Duration::from_secs(30);

/// The queue's gauges once one desktop ran one run to its end: one desktop
/// known and online, nothing queued or running.
fn assert_gauges_after_one_finished_run(text: &str) {
    assert_eq!(
        sample(text, "graph_relay_desktops_online"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(text, "graph_relay_desktops_known"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(text, "graph_relay_queue_depth"), Some(0.0), "{text}");
    assert_eq!(
        sample(text, r#"graph_relay_runs{status="running"}"#),
        Some(0.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scrape_after_a_run_shows_the_figures_moved() {
    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.script("echo", "cat\n");
    relay.script(
        "slow",
        "cat >/dev/null\necho started > slow.started\nsleep 30\n",
    );
    relay.write_graphs(&[(GS, "echo", &["p1"]), (GS_SLOW, "slow", &["p1"])], "");
    let (server, url) = relay.serve(
        "127.0.0.1:0",
        &["--db", "queue.db", "--metrics", "127.0.0.1:0"],
    );
    let metrics = metrics_url(&server);
    let http = &relay.http;

    let before = scrape(http, &metrics).await;
    assert_eq!(
        sample(
            &before,
            r#"graph_relay_runs_finished_total{status="completed"}"#
        ),
        Some(0.0),
        "{before}"
    );
    assert_eq!(
        sample(&before, "graph_relay_pickup_latency_seconds_count"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(sample(&before, "graph_relay_desktops_known"), Some(0.0));
    // Every metric is documented with HELP.
    for name in [
        "graph_relay_runs",
        "graph_relay_queue_depth",
        "graph_relay_queue_oldest_seconds",
        "graph_relay_runs_finished",
        "graph_relay_pickup_latency_seconds",
        "graph_relay_cancel_latency_seconds",
        "graph_relay_desktops_online",
        "graph_relay_desktops_known",
        "graph_relay_held_requests",
        "graph_relay_notifications",
        "graph_relay_wakeups",
        "graph_relay_wakeups_all",
        "graph_relay_mcp_sessions",
        "graph_relay_listen_streams",
        "graph_relay_http_requests",
        "graph_relay_metrics_store_errors",
        "graph_relay_store_operation_seconds",
    ] {
        assert!(
            before.contains(&format!("# HELP {name} ")),
            "{name}:\n{before}"
        );
    }

    // Not on the MCP port: its figures are every owner's.
    let on_mcp = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("GET");
    assert_ne!(on_mcp.status(), 200);
    // A page that rebinds a name to loopback is refused.
    let rebound = http
        .get(&metrics)
        .header("host", "evil.example:80")
        .send()
        .await
        .expect("GET");
    assert_eq!(rebound.status(), 403);

    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = relay
        .run(&url, GS, "metrics-key-0001", json!({"n": 1}))
        .await;
    relay.wait_status(&url, &id, "completed").await;
    let text = scrape_until(http, &metrics, "the finished run", DEADLINE, |t| {
        sample(t, r#"graph_relay_runs_finished_total{status="completed"}"#) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(&text, "graph_relay_pickup_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    // The store's calls were timed, by Store method: the run was inserted
    // once (on the share the worker's sync uploaded, checked by the
    // insert), its claim and its completion updated it.
    let store_count = |text: &str, operation: &str| {
        sample(
            text,
            &format!(r#"graph_relay_store_operation_seconds_count{{operation="{operation}"}}"#),
        )
    };
    let inserts = store_count(&before, "insert_command_if_shared").unwrap_or(0.0);
    assert_eq!(
        store_count(&text, "insert_command_if_shared"),
        Some(inserts + 1.0),
        "{text}"
    );
    assert_eq!(
        store_count(&text, "find_shared_session"),
        store_count(&before, "find_shared_session"),
        "no look-up of the session: {text}"
    );
    assert!(
        store_count(&text, "update_command").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    // The worker's syncs recorded its contact (which also serves as the
    // touch of the run's start).
    assert!(
        store_count(&text, "record_sync").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"graph_relay_store_operation_seconds_sum{operation="update_command"}"#
        )
        .is_some_and(|s| s > 0.0),
        "{text}"
    );
    // Only Store method names label it.
    for line in text
        .lines()
        .filter(|l| l.starts_with("graph_relay_store_operation_seconds"))
    {
        let operation = line
            .split("operation=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("an operation label");
        assert!(
            graph_relay_transport_http::store_timing::OPERATIONS.contains(&operation),
            "{line}"
        );
    }
    assert!(
        sample(&text, "graph_relay_pickup_latency_seconds_sum").is_some_and(|s| s < 5.0),
        "{text}"
    );
    assert_gauges_after_one_finished_run(&text);
    assert!(
        sample(
            &text,
            r#"graph_relay_http_requests_total{route="/mcp",method="POST",status="200"}"#
        )
        .is_some_and(|n| n >= 2.0),
        "{text}"
    );
    for route in [
        "sync",
        "commands/{command_id}/start",
        "commands/{command_id}/complete",
    ] {
        let series = format!(
            r#"graph_relay_http_requests_total{{route="/external-assistants/graph-relays/{route}",method="POST",status="200"}}"#
        );
        assert!(
            sample(&text, &series).is_some_and(|n| n >= 1.0),
            "{series}:\n{text}"
        );
    }
    // A run cancelled while it runs: the cancel latency moves.
    let slow = relay
        .run(&url, GS_SLOW, "metrics-key-0002", json!({}))
        .await;
    relay.wait_exists("slow.started", "the slow run").await;
    relay.cancel(&url, &slow).await;
    relay.wait_status(&url, &slow, "cancelled").await;
    let text = scrape_until(http, &metrics, "the cancelled run", DEADLINE, |t| {
        sample(t, r#"graph_relay_runs_finished_total{status="cancelled"}"#) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(&text, "graph_relay_cancel_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "graph_relay_pickup_latency_seconds_count"),
        Some(2.0),
        "{text}"
    );
    // The unknown path counts under one label, not its own.
    let _ = http.get(format!("{url}/no-such-path")).send().await;
    // The idle long-polling worker holds a sync.
    let text = scrape_until(http, &metrics, "a held request", DEADLINE, |t| {
        sample(t, "graph_relay_held_requests").is_some_and(|n| n >= 1.0)
    })
    .await;
    assert!(
        text.lines()
            .any(|l| l.starts_with(r#"graph_relay_http_requests_total{route="unmatched""#)),
        "{text}"
    );
    assert!(!text.contains("no-such-path"), "{text}");
    // The runs' writes notified their topics, and woke the held requests
    // (the worker's sync and control, the agent's wait) that waited on them.
    let notified = sample(&text, "graph_relay_notifications_total").unwrap_or(0.0);
    let woken = sample(&text, "graph_relay_wakeups_total").unwrap_or(0.0);
    assert!(notified >= 2.0 && woken >= 1.0, "{text}");
    assert!(woken <= notified, "{text}");
}

/// A server on Postgres shows the queue's figures too, read from the
/// database at each scrape: a desktop known and online, a run finished with
/// its pickup latency, nothing left queued or running.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread")]
async fn a_server_on_postgres_scrapes_the_queue_figures_from_the_database() {
    let url = graph_relay_store_postgres::testing::url();
    let schema = graph_relay_store_postgres::testing::TestSchema::new(&url);
    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.script("echo", "cat\n");
    relay.write_graphs(&[(GS, "echo", &["p1"])], "");
    let (server, mcp) = relay.serve_postgres_with_metrics(&url, schema.name());
    let metrics = metrics_url(&server);
    let http = &relay.http;

    let before = scrape(http, &metrics).await;
    assert_eq!(
        sample(&before, "graph_relay_desktops_known"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(
        sample(&before, "graph_relay_queue_depth"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(
        sample(&before, "graph_relay_metrics_store_errors_total"),
        Some(0.0),
        "{before}"
    );

    let worker = relay.worker(&mcp, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = relay
        .run(&mcp, GS, "pg-metrics-key-1", json!({"n": 1}))
        .await;
    relay.wait_status(&mcp, &id, "completed").await;
    let text = scrape_until(http, &metrics, "the finished run", DEADLINE, |t| {
        sample(t, r#"graph_relay_runs_finished_total{status="completed"}"#) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(&text, "graph_relay_pickup_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert_gauges_after_one_finished_run(&text);
    assert_eq!(
        sample(&text, "graph_relay_metrics_store_errors_total"),
        Some(0.0),
        "{text}"
    );
}
