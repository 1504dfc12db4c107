//! `graph-relay loadtest` against two `serve --postgres` processes sharing
//! one database (a schema of its own): desktops and agents are spread over
//! both, so every run is queued on the server its desktop does not wait on
//! and is picked up through the servers' LISTEN/NOTIFY wake-ups. Every run
//! must be executed exactly once and end as asked, with no error, and both
//! servers' figures must be there. No wall-clock budget is asserted.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists it as ignored instead.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::loadtest::{check_latency, check_runs, check_server_process, run, succeeded};
use graph_relay_store_postgres::testing::{TestSchema, url};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// A `serve --postgres` child, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(dir: &std::path::Path, database: &str, schema: &str) -> Self {
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(dir.join("graph-relay.toml"))
            .args(["--postgres", database, "--postgres-schema", schema])
            .args(["--postgres-pool", "4"])
            .args(["--max-wait-seconds", "20"])
            .env("GRAPH_RELAY_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("serving MCP at ").nth(1) {
                    let url = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(url.trim_end_matches("/mcp").to_owned());
                }
                if line.contains(" WARN ") || line.contains(" ERROR ") {
                    eprintln!("serve | {line}");
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server serves");
        Self { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn two_postgres_servers_share_forty_desktops_and_every_run_completes_once() {
    let database = url();
    let schema = TestSchema::new(&database);
    let dir = tempfile::tempdir().expect("tempdir");
    // The token file both servers read; the harness adds its tokens to it.
    std::fs::write(dir.path().join("graph-relay.toml"), "").expect("config");
    let a = Server::start(dir.path(), &database, schema.name());
    let b = Server::start(dir.path(), &database, schema.name());
    let (pid_a, pid_b) = (a.child.id().to_string(), b.child.id().to_string());
    let config = dir.path().join("graph-relay.toml");
    let config_arg = config.to_str().expect("utf-8 path");
    let out = run([
        "--server",
        &a.url,
        "--server",
        &b.url,
        "--config",
        config_arg,
        "--server-pid",
        &pid_a,
        "--server-pid",
        &pid_b,
        "--desktops",
        "40",
        "--agents",
        "10",
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
    assert_eq!(report["connect"]["desktops_connected"], 40, "{report}");
    // 10 runs/s for 3 s; one in five cancelled.
    check_runs(&report, 30, 6);
    for (name, n) in [("pickup", 30), ("cancel", 6), ("result", 24)] {
        check_latency(&report, name, n);
    }

    // Both servers' processes, in the order given.
    let servers = report["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2, "{report}");
    for (server, (url, pid)) in servers.iter().zip([(&a.url, &pid_a), (&b.url, &pid_b)]) {
        assert_eq!(server["url"].as_str(), Some(url.as_str()), "{report}");
        assert_eq!(
            server["pid"].as_u64().map(|p| p.to_string()).as_ref(),
            Some(pid)
        );
        check_server_process(server);
    }
    assert_eq!(report["server"], servers[0], "`server` is the first one");

    // The harness took its tokens out of the shared file again.
    let left = std::fs::read_to_string(&config).expect("config");
    assert!(!left.contains("loadtest-"), "{left}");
}

/// `--postgres-pool` is checked before anything connects: out of range or
/// not a number, `serve` exits with a message naming the option and the range.
#[test]
fn serve_refuses_a_postgres_pool_out_of_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["0", "1001", "many"] {
        let out = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(dir.path().join("graph-relay.toml"))
            // Nothing listens there: a pool that passed the check would fail later, on connecting.
            .args(["--postgres", "postgres://nobody@127.0.0.1:1/none"])
            .args(["--postgres-pool", bad])
            .stdin(Stdio::null())
            .output()
            .expect("run serve");
        assert!(!out.status.success(), "--postgres-pool {bad} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--postgres-pool")
                && stderr.contains("from 1 to 1000")
                && !stderr.contains("cannot connect"),
            "--postgres-pool {bad}: {stderr}"
        );
    }
}
