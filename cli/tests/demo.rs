//! `graph-relay demo --once`: the whole system in one command runs its
//! scripted flow end to end, prints each step, exits 0, and writes nothing
//! outside its temporary folder (neither in the current directory nor in
//! `HOME`, and the temporary folder is gone afterwards).

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// Every file and folder under `dir`, as paths relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            out.push(
                path.strip_prefix(dir)
                    .expect("under dir")
                    .display()
                    .to_string(),
            );
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn demo_once_runs_the_scripted_flow_and_leaves_no_file() {
    let cwd = tempfile::tempdir().expect("cwd");
    let home = tempfile::tempdir().expect("home");
    let tmp = tempfile::tempdir().expect("tmp");
    let out = Command::new(BIN)
        .args(["demo", "--once"])
        .current_dir(cwd.path())
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("TMPDIR", tmp.path())
        .env_remove("GRAPH_RELAY_LOG")
        .output()
        .expect("run graph-relay demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo exited {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for step in [
        "[1] tools/list",
        "run_graph_session, list_graph_sessions, get_graph_run, cancel_graph_run",
        "[2] list_graph_sessions",
        "3 sessions shared by the desktop",
        "Echo: Echoes its arguments",
        "[3] run_graph_session Echo",
        "status queued",
        "Queued ticket, not a result",
        "[4] get_graph_run",
        "pickup: the desktop took it after",
        r#"result: {"command_id":"#,
        r#""echo":{"greeting":"hello"}"#,
        "(42 tokens)",
        "[5] run_graph_session Slow count",
        "running, progress: step",
        "cancel_graph_run → status running, cancel requested",
        "cancelled ",
        "[6] run_graph_session Always fails",
        "failed: fails.sh: the input folder does not exist",
        "[7] another agent",
        "tool error: \"Graph run not found or access removed\"",
        "The scripted flow is done.",
        "== Python (pip install mcp==2.3.0)",
        "== Claude Desktop (claude_desktop_config.json), over stdio",
        "== Claude Code",
        "== MCP Inspector",
        "Stopped;",
    ] {
        assert!(
            stdout.contains(step),
            "no `{step}` in the demo's output:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    // The steps come in order.
    let positions: Vec<usize> = ["[1]", "[2]", "[3]", "[4]", "[5]", "[6]", "[7]"]
        .iter()
        .map(|s| stdout.find(s).expect("step"))
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{stdout}");
    // Runs queued after the long-polling desktop delivered a result: their
    // tickets say to look after a second (it takes them up at once), not
    // after an interval-mode pass.
    for step in ["[5]", "[6]"] {
        let section = &stdout[stdout.find(step).expect("step")..];
        let ticket = section
            .lines()
            .find(|l| l.trim_start().starts_with("ticket "))
            .expect("a ticket line");
        assert!(ticket.contains("(poll after 1 s)"), "{step}: {ticket}");
    }
    // The worker's lines are shown, prefixed, and it stopped with the demo.
    assert!(stderr.contains("worker | "), "{stderr}");
    assert!(stderr.contains("worker | worker: stopped"), "{stderr}");
    // Nothing written outside the temporary folder, which is removed.
    assert_eq!(tree(cwd.path()), Vec::<String>::new(), "files in the cwd");
    assert_eq!(tree(home.path()), Vec::<String>::new(), "files in HOME");
    assert_eq!(
        tree(tmp.path()),
        Vec::<String>::new(),
        "the demo's temporary folder was left behind"
    );
}
