//! Real MCP peers against the `graph-relay` binary: the Python `mcp` 2.3.0
//! client (stdio and HTTP, legacy and 2026-07-28) and the official
//! conformance suite. The peers come from `GRAPH_RELAY_PYTHON`,
//! `GRAPH_RELAY_NODE` and `GRAPH_RELAY_CONFORMANCE`, or are installed into
//! the target directory by `.ci/mcp-peers.sh` on first use
//! (`common::peers`). A machine that cannot have them opts out with
//! `GRAPH_RELAY_SKIP=peers`, which lists these tests as ignored.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_graph-relay")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A config with two agents on project `default` and a device sharing GS; returns agent tokens.
fn setup(dir: &Path) -> (PathBuf, PathBuf, String, String) {
    let config = dir.join("graph-relay.toml");
    let db = dir.join("graph-relay.db");
    let create = |args: &[&str]| {
        let out = Command::new(bin())
            .args(["token", "--config"])
            .arg(&config)
            .args(["create"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let agent = create(&["agent", "dev-agent", "--project", "default"]);
    let other = create(&["agent", "other-agent", "--project", "default"]);
    create(&["device", "dev-desktop"]);
    let status = Command::new(bin())
        .args(["dev-share", "--config"])
        .arg(&config)
        .arg("--db")
        .arg(&db)
        .args([
            "--device",
            "dev-desktop",
            "--project",
            "default",
            "--session",
            GS,
        ])
        .status()
        .unwrap();
    assert!(status.success());
    (config, db, agent, other)
}

struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(config: &Path, db: &Path, anonymous: bool) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--listen", &listen, "--config"])
        .arg(config)
        .arg("--db")
        .arg(db);
    if anonymous {
        cmd.args(["--insecure-anonymous-agent", "dev-agent"]);
    }
    let child = cmd.stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&listen).is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Server(child, format!("http://{listen}/mcp"))
}

#[test]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
fn python_client_over_stdio_and_http_in_both_modes() {
    let python = common::peers().python;
    let dir = tempfile::tempdir().unwrap();
    let (config, db, agent, other) = setup(dir.path());
    let script = repo().join("tests/python/client_flow.py");
    // The published tools/list, as the core's snapshot pins it.
    let golden = dir.path().join("tools-list.json");
    std::fs::write(
        &golden,
        serde_json::to_string_pretty(
            &graph_relay_core::catalog::ToolCatalog::published().tools_list(),
        )
        .unwrap(),
    )
    .unwrap();
    let server = serve(&config, &db, false);
    for mode in ["legacy", "2026-07-28"] {
        for (kind, target) in [("stdio", bin().to_owned()), ("http", server.1.clone())] {
            let out = Command::new(&python)
                .arg(&script)
                .args([kind, mode, &target])
                .arg(&config)
                .arg(&db)
                .arg(&golden)
                .args([&agent, &other])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{kind} {mode}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
fn conformance_suite_scenarios_pass() {
    let common::Peers {
        node,
        conformance: suite,
        ..
    } = common::peers();
    let dir = tempfile::tempdir().unwrap();
    let (config, db, _, _) = setup(dir.path());
    let server = serve(&config, &db, true);
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "dns-rebinding-protection",
    ] {
        let out = Command::new(&node)
            .arg(&suite)
            .args(["server", "--url", &server.1, "--scenario", scenario])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{scenario}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
