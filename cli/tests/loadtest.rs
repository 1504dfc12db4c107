//! `graph-relay loadtest` at a small scale: 50 desktops and 20 agents
//! against the server it starts itself. Every run must complete (or be
//! cancelled) exactly once, with no error, and the figures must be there
//! and consistent. No wall-clock budget is asserted: the figures are the
//! harness's output, not a test's.

mod common;

use std::time::Duration;

use common::loadtest::{
    check_latency, check_runs, check_server_process, run as loadtest, succeeded, text,
};
use serde_json::Value;

#[test]
fn fifty_desktops_and_twenty_agents_complete_every_run_exactly_once() {
    let out = loadtest([
        "--desktops",
        "50",
        "--agents",
        "20",
        "--rate",
        "10",
        "--duration",
        "3",
        "--run-seconds",
        "0.1",
        "--wait",
        "--cancel-fraction",
        "0.2",
        "--idle-seconds",
        "1",
        "--json",
    ]);
    let stdout = succeeded(&out);
    let report: Value = serde_json::from_str(&stdout).expect("--json prints one JSON document");

    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    assert_eq!(report["connect"]["desktops_connected"], 50, "{report}");
    assert_eq!(report["config"]["mode"], "wait");
    // 10 runs/s for 3 s; one in five cancelled.
    check_runs(&report, 30, 6);

    check_latency(&report, "pickup", 30);
    check_latency(&report, "cancel", 6);
    check_latency(&report, "result", 24);

    let server = &report["server"];
    assert!(server["pid"].as_u64().is_some(), "{report}");
    check_server_process(server);
    // Its own CPU over the 30 runs; the baselines were not asked for.
    let per_run = report["server_cpu_ms_per_run"].as_f64();
    assert!(per_run.is_some_and(|ms| ms > 0.0), "{report}");
    assert_eq!(report["baselines"], "not_asked", "{report}");
}

#[test]
fn the_table_prints_every_figure_when_agents_poll() {
    let out = loadtest([
        "--desktops",
        "50",
        "--agents",
        "20",
        "--rate",
        "10",
        "--duration",
        "2",
        "--poll-ms",
        "100",
        "--cancel-fraction",
        "0.25",
        "--idle-seconds",
        "0",
    ]);
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("executed once 20  twice 0  never 0"),
        "{stdout}"
    );
    for row in ["pickup ", "cancel ", "result "] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row}row: {stdout}"));
        let figures: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().expect("a number"))
            .collect();
        assert_eq!(figures.len(), 4, "{line}");
        assert!(
            figures[1] <= figures[2] && figures[2] <= figures[3],
            "{line}"
        );
    }
    assert!(stdout.contains("server CPU idle"), "{stdout}");
    assert!(stdout.contains("RSS "), "{stdout}");
    assert!(stdout.contains("errors none"), "{stdout}");
}

#[test]
fn a_running_server_gets_the_harness_tokens_for_the_run_only() {
    let relay = common::Relay::new(
        &[("a1", "gra_loadtest_a1")],
        "grd_loadtest_desk",
        Duration::from_secs(30),
    );
    let (server, url) = relay.serve("127.0.0.1:0", &["--memory", "--max-wait-seconds", "20"]);
    let config = relay.path("graph-relay.toml");
    let before = std::fs::read_to_string(&config).expect("config");
    let out = loadtest([
        "--server",
        &url,
        "--config",
        config.to_str().expect("utf-8 path"),
        "--desktops",
        "20",
        "--agents",
        "5",
        "--rate",
        "10",
        "--duration",
        "1",
        "--wait",
        "--idle-seconds",
        "0",
        "--json",
    ]);
    let stdout = succeeded(&out);
    let report: Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    assert_eq!(report["runs"]["executed_once"], 10, "{report}");
    assert_eq!(report["runs"]["completed"], 10, "{report}");
    check_latency(&report, "pickup", 10);
    check_latency(&report, "result", 10);
    assert_eq!(report["server"]["url"], url.as_str());
    // No --server-pid: the server's process figures are unknown, not made up.
    assert!(report["server"]["rss_mib"].is_null(), "{report}");
    // Its own tokens are gone again; the operator's are untouched.
    let after = std::fs::read_to_string(&config).expect("config");
    assert!(!after.contains("loadtest-"), "{after}");
    assert!(
        after.contains(&graph_relay_transport_http::auth::hash_token(
            "gra_loadtest_a1"
        ))
    );
    assert_eq!(
        before.matches("[[agent]]").count(),
        after.matches("[[agent]]").count()
    );
    server.terminate();
}

#[test]
fn bounds_and_remote_servers_are_refused_before_anything_starts() {
    let out = loadtest(["--desktops", "20001"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--desktops must be 1 to 20000"),
        "{}",
        text(&out.stderr)
    );
    let out = loadtest(["--baseline-seconds", "61"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--baseline-seconds must be 0 to 60"),
        "{}",
        text(&out.stderr)
    );
    let out = loadtest(["--rate", "5000"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--rate must be"),
        "{}",
        text(&out.stderr)
    );
    let out = loadtest([
        "--server",
        "http://192.0.2.1:8787",
        "--config",
        "graph-relay.toml",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not a loopback address"),
        "{}",
        text(&out.stderr)
    );
}
