//! What `graph-relay worker` says and where it keeps its outbox: one
//! vocabulary (`long-poll`, `interval`), a warning when the graphs file
//! shares nothing, the outbox in the platform's data directory by default
//! (its path printed at start, nothing written in the current directory),
//! and `--quiet` (no server is needed: the worker starts, says what it
//! says and retries quietly; SIGINT ends it); the approval warning only
//! when nothing can answer an approval; and, against a server, the line a
//! long run gets while it runs.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// A graphs file sharing one Graph to the project `default`.
const ECHO: &str = "[[graph]]\nid = \"gs_0123456789abcdef0123456789abcdef\"\nname = \"Echo\"\nslug = \"echo\"\nprojects = [\"default\"]\ncommand = [\"/bin/cat\"]\n";

/// Runs `worker` in `cwd` with `env`, until a stderr line contains `until`
/// (or 20 s pass), then SIGINT; returns its stderr lines.
fn worker(cwd: &Path, env: &[(&str, &Path)], extra: &[&str], until: &str) -> Vec<String> {
    let mut command = Command::new(BIN);
    command
        .args(["worker", "--server", "http://127.0.0.1:9"])
        .args(["--token-file", "device.token", "--graphs", "graphs.toml"])
        .args(extra)
        .current_dir(cwd)
        .env_remove("GRAPH_RELAY_LOG")
        .env_remove("XDG_DATA_HOME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn the worker");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().expect("lines").push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lines
        .lock()
        .expect("lines")
        .iter()
        .any(|l| l.contains(until))
    {
        if Instant::now() > deadline || child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let _ = kill(pid, Signal::SIGINT);
    let status = child.wait().expect("wait");
    reader.join().expect("reader");
    let lines = lines.lock().expect("lines").clone();
    assert!(
        status.success(),
        "the worker exited {status}:\n{}",
        lines.join("\n")
    );
    lines
}

fn folder(graphs: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("device.token"), "grd_0123\n").expect("token");
    std::fs::write(dir.path().join("graphs.toml"), graphs).expect("graphs");
    dir
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_empty_graphs_file_is_warned_about_and_the_outbox_goes_to_the_data_directory() {
    let cwd = folder("");
    let data = tempfile::tempdir().expect("data home");
    let home = tempfile::tempdir().expect("home");
    let lines = worker(
        cwd.path(),
        &[("HOME", home.path()), ("XDG_DATA_HOME", data.path())],
        &[],
        "worker: relaying",
    );
    let text = lines.join("\n");
    assert!(
        text.contains("warning: graphs.toml shares no Graph: agents will see no sessions"),
        "{text}"
    );
    let start = lines
        .iter()
        .find(|l| l.starts_with("worker: relaying"))
        .unwrap_or_else(|| panic!("no start line:\n{text}"));
    assert!(start.contains("(long-poll; outbox "), "{start}");
    assert!(!text.contains("LongPoll"), "{text}");
    // The outbox is in $XDG_DATA_HOME/graph-relay, named per server and
    // token, and the start line names it.
    let dir = data.path().join("graph-relay");
    let outboxes: Vec<String> = files_in(&dir)
        .into_iter()
        .filter(|n| n.starts_with("outbox-") && n.ends_with(".db"))
        .collect();
    assert_eq!(outboxes.len(), 1, "{:?}", files_in(&dir));
    assert!(
        start.ends_with(&format!("{})", dir.join(&outboxes[0]).display())),
        "{start}"
    );
    // Nothing in the current directory but what the test wrote, nothing in HOME.
    assert_eq!(files_in(cwd.path()), vec!["device.token", "graphs.toml"]);
    assert_eq!(files_in(home.path()), Vec::<String>::new());
    // No tracing line in the server's wording among the status lines.
    assert!(!text.contains("INFO"), "{text}");
    assert!(text.contains("worker: stopped"), "{text}");

    // Without XDG_DATA_HOME: ~/.local/share/graph-relay; the same server
    // and token find the same outbox name.
    let lines = worker(
        cwd.path(),
        &[("HOME", home.path())],
        &["--mode", "interval"],
        "worker: relaying",
    );
    let text = lines.join("\n");
    let expected = home
        .path()
        .join(".local/share/graph-relay")
        .join(&outboxes[0]);
    assert!(
        text.contains(&format!("(interval; outbox {})", expected.display())),
        "{text}"
    );
    assert!(expected.exists());
}

#[test]
fn quiet_keeps_warnings_and_problems_only() {
    let cwd = folder(&format!("{ECHO}approval = \"always\"\n"));
    let data = tempfile::tempdir().expect("data home");
    let lines = worker(
        cwd.path(),
        &[("HOME", data.path()), ("XDG_DATA_HOME", data.path())],
        &["--quiet"],
        "server unreachable",
    );
    let text = lines.join("\n");
    assert!(
        text.contains("warning: graph gs_0123456789abcdef0123456789abcdef needs the owner's approval but has no approval_command"),
        "{text}"
    );
    assert!(text.contains("server unreachable"), "{text}");
    assert!(!text.contains("worker: relaying"), "{text}");
    assert!(!text.contains("pass: "), "{text}");
}

/// A Graph that needs approval gets the "cannot ask for" warning only when
/// nothing can answer: neither the console (`--console`) nor its hook
/// (`approval_command`).
#[test]
fn approval_is_warned_about_only_when_neither_console_nor_hook_can_answer() {
    const WARNING: &str = "needs the owner's approval but has no approval_command";
    let data = tempfile::tempdir().expect("data home");
    let env = [("HOME", data.path()), ("XDG_DATA_HOME", data.path())];
    let cases = [
        ("approval = \"always\"\n", &[][..], true),
        (
            "approval = \"always\"\n",
            &["--console", "127.0.0.1:0"][..],
            false,
        ),
        (
            "approval = \"always\"\napproval_command = [\"/bin/true\"]\n",
            &[][..],
            false,
        ),
    ];
    for (approval, extra, warned) in cases {
        let cwd = folder(&format!("{ECHO}{approval}"));
        let lines = worker(cwd.path(), &env, extra, "server unreachable");
        let text = lines.join("\n");
        assert!(text.contains("server unreachable"), "{text}");
        assert_eq!(
            text.contains(WARNING),
            warned,
            "{approval} with {extra:?}:\n{text}"
        );
    }
}

#[test]
fn a_graph_shared_to_a_project_gets_no_warning_and_verbose_shows_passes() {
    let cwd = folder(ECHO);
    let data = tempfile::tempdir().expect("data home");
    let lines = worker(
        cwd.path(),
        &[("HOME", data.path()), ("XDG_DATA_HOME", data.path())],
        &["--verbose"],
        "server unreachable",
    );
    let text = lines.join("\n");
    assert!(!text.contains("shares no Graph"), "{text}");
    assert!(text.contains("pass: started"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_run_gets_a_status_line_with_its_latest_progress() {
    const AGENT: &str = "gra_output_agent_token_0123456789abcdef";
    const DEVICE: &str = "grd_output_device_token_0123456789abcdef";
    const GS: &str = "gs_dddddddddddddddddddddddddddddddd";
    let relay = common::Relay::new(&[("assistant", AGENT)], DEVICE, Duration::from_secs(30));
    relay.script(
        "long",
        "cat >/dev/null\necho '{\"message\": \"step 1 of 2\", \"percent\": 50}' >&3\nsleep 2.5\necho done\n",
    );
    relay.write_graphs(&[(GS, "long", &["p1"])], "");
    let (_server, url) = relay.serve("127.0.0.1:0", &["--memory"]);
    let worker = relay.worker(&url, "outbox.db", "1", &["--progress-every", "1"]);
    worker.wait_line("sync: project p1");
    let id = relay
        .run(&url, GS, "long-run-key-0001", serde_json::json!({}))
        .await;
    let line = worker.wait_line(&format!("running {id} for "));
    assert!(line.ends_with(": step 1 of 2 (50%)"), "{line}");
    relay.wait_status(&url, &id, "completed").await;
}
