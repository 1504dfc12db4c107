//! The cluster keeps its promises under faults, at CI scale: `graph-relay
//! loadtest --cluster` starts a Postgres of its own, three `serve
//! --postgres` servers and HAProxy (checking `/readyz`), loads them through
//! HAProxy with long-polling desktops and agents, and injects every fault
//! in turn while the runs go on: a server SIGKILLed and started again, one
//! SIGSTOPped and continued, every database connection terminated, the
//! database crashed (`pg_ctl stop -m immediate`) and started again, its
//! disk full. For each fault: no acknowledged run lost, none executed
//! twice, none stuck, none ended otherwise, and no server exited on its
//! own. The figures (pickup, recovery) are printed, never asserted.
//!
//! Needs HAProxy at `/usr/sbin/haproxy` (`apt-get install -y haproxy`),
//! PostgreSQL's server programs (`apt-get install -y postgresql`: initdb,
//! pg_ctl, postgres; the shared test database is not used), util-linux
//! (`unshare`, `nsenter`, `setpriv`) and root, for the full disk (a tmpfs
//! in a private mount namespace). Without them the test fails and says
//! what is missing; `GRAPH_RELAY_SKIP=postgres` lists it as ignored.

mod common;

use std::path::Path;

use common::loadtest::{run, text};
use serde_json::Value;

const HAPROXY: &str = "/usr/sbin/haproxy";
const FAULTS: [&str; 5] = [
    "kill-server",
    "stop-server",
    "terminate-backends",
    "crash-postgres",
    "disk-full",
];

/// PostgreSQL's `initdb`, where the harness looks for it.
fn has_initdb() -> bool {
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|e| e.path().join("bin/initdb").is_file());
    debian
        || std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .any(|dir| dir.join("initdb").is_file())
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn every_fault_loses_no_run_and_runs_none_twice() {
    assert!(
        Path::new(HAPROXY).is_file(),
        "this test needs HAProxy at {HAPROXY}: `apt-get install -y haproxy`"
    );
    assert!(
        has_initdb(),
        "this test needs PostgreSQL's server programs (initdb, pg_ctl, postgres): \
         `apt-get install -y postgresql`, or GRAPH_RELAY_SKIP=postgres"
    );
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: the disk-full fault puts the database on a tmpfs in a \
         private mount namespace (or GRAPH_RELAY_SKIP=postgres)"
    );
    let faults = FAULTS.join(",");
    let out = run([
        "--cluster",
        "--desktops",
        "6",
        "--agents",
        "3",
        "--rate",
        "10",
        "--run-seconds",
        "0.1",
        "--wait",
        "--cancel-fraction",
        "0.1",
        "--idle-seconds",
        "0",
        "--faults",
        &faults,
        "--fault-hold",
        "4",
        "--fault-gap",
        "4",
        // Short, so that a run left running is seen failing well within
        // the agents' patience.
        "--lease-seconds",
        "10",
        "--report-every",
        "10",
        "--json",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout}\nstderr: {stderr}"));
    // The figures, for whoever reads the test's output.
    println!("{report:#}");
    assert!(
        out.status.success(),
        "loadtest failed ({}): errors {}\nstderr: {stderr}",
        out.status,
        report["errors"]
    );
    assert_eq!(report["errors"], serde_json::json!({}), "{stderr}");
    let cluster = &report["cluster"];
    assert_eq!(
        cluster["unplanned_exits"],
        serde_json::json!([]),
        "a server exited on its own"
    );

    let windows = cluster["faults"].as_array().expect("faults");
    let names: Vec<&str> = windows.iter().filter_map(|f| f["fault"].as_str()).collect();
    let mut expected = vec!["baseline"];
    expected.extend(FAULTS);
    assert_eq!(names, expected, "the baseline, then each fault in order");
    let mut acknowledged = 0;
    for window in windows {
        let name = &window["fault"];
        let count = |k: &str| {
            window[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: no {k}: {window}"))
        };
        assert_eq!(window["error"], Value::Null, "{name}: {window}");
        assert!(count("issued") > 0, "{name}: no run in the window");
        assert_eq!(count("acknowledged"), count("issued"), "{name}: {window}");
        for zero in ["lost", "executed_twice", "stuck"] {
            assert_eq!(count(zero), 0, "{name}: {zero}: {window}");
        }
        assert_eq!(
            count("ended_as_asked"),
            count("acknowledged"),
            "{name}: every run ends as asked: {window}"
        );
        acknowledged += count("acknowledged");
    }
    // Every run is in exactly one window, and was executed exactly once.
    assert_eq!(report["runs"]["issued"].as_u64(), Some(acknowledged));
    assert_eq!(report["runs"]["executed_once"].as_u64(), Some(acknowledged));

    let window = |name: &str| {
        windows
            .iter()
            .find(|w| w["fault"] == name)
            .unwrap_or_else(|| panic!("no window {name}"))
    };
    // The balancer's checks took the killed server out, and every server
    // out of the ready set while the database was down (`/readyz`).
    let balancer = |name: &str| window(name)["balancer"].to_string();
    assert!(
        balancer("kill-server").contains("graph_relay/s1 is DOWN"),
        "{}",
        balancer("kill-server")
    );
    assert!(
        balancer("crash-postgres").contains("Server graph_relay/s")
            && balancer("crash-postgres")
                .contains("is DOWN, reason: Layer7 wrong status, code: 503"),
        "{}",
        balancer("crash-postgres")
    );
    // While the database was down, agents were told to retry: the
    // servers' own 503 with Retry-After and a retryable JSON-RPC error.
    let agents = window("crash-postgres")["agents_saw"].to_string();
    assert!(
        agents.contains("HTTP 503, Retry-After 1, JSON-RPC -32603 retryable"),
        "{agents}"
    );
}

/// The fault options are checked before anything starts.
#[test]
fn fault_options_are_checked_before_anything_starts() {
    for (args, says) in [
        (vec!["--faults", "kill-server"], "--cluster"),
        (
            vec!["--cluster", "--faults", "kill-server", "--duration", "5"],
            "too short for 1 faults",
        ),
        (
            vec!["--cluster", "--faults", "unplug-the-cable"],
            "invalid value 'unplug-the-cable'",
        ),
        (
            vec!["--cluster", "--fault-hold", "0"],
            "--fault-hold must be above 0",
        ),
        (
            vec!["--cluster", "--server", "http://127.0.0.1:1"],
            "cannot be used with",
        ),
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
