//! `worker --metrics`: the worker's Prometheus endpoint on a loopback
//! listener of its own. Scrapes during and after runs show the figures
//! moved (the running run, progress posted, runs by outcome, reports
//! delivered, the server reachable); with the server gone, a finished run's
//! report waits in the outbox and the failures and reachability say so. A
//! foreign `Host` is refused, and a non-loopback address is refused at start.

mod common;

use std::time::Duration;

use common::Relay;
use common::scrape::{sample, scrape, scrape_until};
use serde_json::json;

const AGENT_TOKEN: &str = "gra_wmetrics_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_wmetrics_device_token_0123456789abcdef";
const GS_PROGRESS: &str = "gs_cccccccccccccccccccccccccccccccc";
const GS_FAIL: &str = "gs_dddddddddddddddddddddddddddddddd";
const GS_WAIT: &str = "gs_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const DEADLINE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_metrics_follow_its_runs_and_its_outbox() {
    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.script(
        "progress",
        r#"cat > /dev/null
echo started > progress.started
printf '{"message": "half way", "percent": 50}\n' >&"$GRAPH_RELAY_PROGRESS_FD"
while [ ! -e progress.go ]; do sleep 0.1; done
echo '{"done": true}'
"#,
    );
    relay.script("fail", "cat > /dev/null\necho boom >&2\nexit 3\n");
    relay.script(
        "wait",
        "cat > /dev/null\necho started > wait.started\nwhile [ ! -e wait.go ]; do sleep 0.1; done\necho '{}'\n",
    );
    relay.write_graphs(
        &[
            (GS_PROGRESS, "progress", &["p1"]),
            (GS_FAIL, "fail", &["p1"]),
            (GS_WAIT, "wait", &["p1"]),
        ],
        "",
    );
    let (server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);

    // Loopback only.
    let refused = relay.worker(&url, "other.db", "1", &["--metrics", "0.0.0.0:0"]);
    refused.wait_line("loopback address only");

    let worker = relay.worker(&url, "outbox.db", "1", &["--metrics", "127.0.0.1:0"]);
    let line = worker.wait_line("metrics: http://");
    let metrics = line
        .split("metrics: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("metrics URL")
        .to_owned();
    let http = &relay.http;
    worker.wait_line("sync: project p1");

    let before = scrape_until(http, &metrics, "the first sync", DEADLINE, |t| {
        sample(t, "graph_relay_worker_server_reachable") == Some(1.0)
    })
    .await;
    for (series, value) in [
        (r#"graph_relay_worker_runs_total{outcome="completed"}"#, 0.0),
        (r#"graph_relay_worker_runs_total{outcome="failed"}"#, 0.0),
        (r#"graph_relay_worker_failures_total{kind="delivery"}"#, 0.0),
        ("graph_relay_worker_running", 0.0),
        ("graph_relay_worker_progress_posted_total", 0.0),
        ("graph_relay_worker_outbox_pending", 0.0),
        ("graph_relay_worker_outbox_oldest_seconds", 0.0),
    ] {
        assert_eq!(sample(&before, series), Some(value), "{series}:\n{before}");
    }
    for name in [
        "graph_relay_worker_outbox_pending",
        "graph_relay_worker_outbox_oldest_seconds",
        "graph_relay_worker_runs",
        "graph_relay_worker_running",
        "graph_relay_worker_progress_posted",
        "graph_relay_worker_reports_delivered",
        "graph_relay_worker_failures",
        "graph_relay_worker_server_reachable",
        "graph_relay_worker_outbox_errors",
    ] {
        assert!(
            before.contains(&format!("# HELP {name} ")),
            "{name}:\n{before}"
        );
    }
    // A page that rebinds a name to loopback is refused.
    let rebound = http
        .get(&metrics)
        .header("host", "evil.example:80")
        .send()
        .await
        .expect("GET");
    assert_eq!(rebound.status(), 403);

    // A run that reports progress: running, then completed.
    let id = relay
        .run(&url, GS_PROGRESS, "wmetrics-key-0001", json!({}))
        .await;
    relay
        .wait_exists("progress.started", "the progress run")
        .await;
    scrape_until(
        http,
        &metrics,
        "the running run and its progress",
        DEADLINE,
        |t| {
            sample(t, "graph_relay_worker_running") == Some(1.0)
                && sample(t, "graph_relay_worker_progress_posted_total").is_some_and(|n| n >= 1.0)
        },
    )
    .await;
    std::fs::write(relay.path("progress.go"), "").expect("go");
    relay.wait_status(&url, &id, "completed").await;
    // A failing run.
    let failing = relay
        .run(&url, GS_FAIL, "wmetrics-key-0002", json!({}))
        .await;
    relay.wait_status(&url, &failing, "failed").await;
    let text = scrape_until(http, &metrics, "both runs delivered", DEADLINE, |t| {
        sample(t, "graph_relay_worker_reports_delivered_total").is_some_and(|n| n >= 2.0)
    })
    .await;
    for (series, value) in [
        (r#"graph_relay_worker_runs_total{outcome="completed"}"#, 1.0),
        (r#"graph_relay_worker_runs_total{outcome="failed"}"#, 1.0),
        ("graph_relay_worker_running", 0.0),
        ("graph_relay_worker_outbox_pending", 0.0),
        ("graph_relay_worker_server_reachable", 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series}:\n{text}");
    }

    // The server goes away during a run: its report waits in the outbox.
    let _waiting = relay
        .run(&url, GS_WAIT, "wmetrics-key-0003", json!({}))
        .await;
    relay.wait_exists("wait.started", "the waiting run").await;
    server.sigkill();
    std::fs::write(relay.path("wait.go"), "").expect("go");
    let text = scrape_until(
        http,
        &metrics,
        "the report kept in the outbox",
        DEADLINE,
        |t| {
            sample(t, "graph_relay_worker_outbox_pending") == Some(1.0)
                && sample(t, "graph_relay_worker_server_reachable") == Some(0.0)
        },
    )
    .await;
    assert_eq!(
        sample(
            &text,
            r#"graph_relay_worker_runs_total{outcome="completed"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"graph_relay_worker_failures_total{kind="delivery"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"graph_relay_worker_failures_total{kind="sync_unreachable"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    let oldest_then =
        sample(&text, "graph_relay_worker_outbox_oldest_seconds").expect("oldest age");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = scrape(http, &metrics).await;
    assert!(
        sample(&later, "graph_relay_worker_outbox_oldest_seconds")
            .is_some_and(|age| age >= oldest_then + 1.0),
        "{later}"
    );
}
