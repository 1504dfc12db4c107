//! The worker's console in a real browser: `graph-relay serve`,
//! `graph-relay worker --console 127.0.0.1:0` and Debian's chromium driven
//! by playwright-core (`tests/browser/driver.cjs`). The owner sees a
//! waiting run with its Graph, agent, project and arguments, approves it
//! and sees it start, watches its progress move, cancels it; declines
//! another, and the agent reads "Declined on the desktop". A screenshot of
//! each page goes to `<target>/tmp/browser-screenshots/`.
//!
//! Needs chromium (`/usr/bin/chromium`, or `GRAPH_RELAY_CHROMIUM`) and the
//! peers' Node with playwright-core (installed on first use, see
//! `common::peers`); without chromium the test fails saying how to install
//! it, unless `GRAPH_RELAY_SKIP` names `browser`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{Proc, Relay, peers};
use serde_json::{Value, json};

const AGENT_TOKEN: &str = "gra_browser_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_browser_device_token_0123456789abcdef";
const GS: &str = "gs_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const DEADLINE: Duration = Duration::from_secs(30);

/// A Graph that reports progress every 0.2 s until `stop.<command id>` exists.
const LONG: &str = r#"cat > /dev/null
echo ran > "ran.$GRAPH_RELAY_COMMAND_ID"
i=0
while [ ! -f "stop.$GRAPH_RELAY_COMMAND_ID" ]; do
  i=$((i + 1))
  printf '{"message": "step %s: drafting", "percent": %s}\n' "$i" "$((i % 101))" >&"$GRAPH_RELAY_PROGRESS_FD"
  sleep 0.2
done
echo '{"ran": true}'
"#;

/// The browser binary: `GRAPH_RELAY_CHROMIUM`, else Debian's chromium.
/// Panics, saying how to install it, when it is missing.
fn chromium() -> PathBuf {
    let path = std::env::var_os("GRAPH_RELAY_CHROMIUM")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "the browser test needs chromium, and {} is missing: install it with \
         `apt-get install -y chromium chromium-driver` (Debian; .ci/run does), name another \
         binary with GRAPH_RELAY_CHROMIUM, or opt out with GRAPH_RELAY_SKIP=browser",
        path.display()
    );
    path
}

/// The playwright driver script as a child: one JSON request per line.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Browser {
    fn start() -> Self {
        let chromium = chromium();
        let peers = peers();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/browser/driver.cjs");
        let mut child = Command::new(&peers.node)
            .arg(&script)
            .env("NODE_PATH", &peers.playwright)
            .env("GRAPH_RELAY_CHROMIUM", chromium)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", peers.node.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one request; returns the answer, which must be `ok`.
    fn ask(&mut self, request: Value) -> Value {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "{request}").expect("write to the driver");
            self.stdin.flush().expect("flush");
            let mut line = String::new();
            self.stdout.read_line(&mut line).expect("read the driver");
            let answer: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("the driver answered `{line}` to {request}: {e}"));
            assert_eq!(answer["ok"], true, "{request} failed: {}", answer["error"]);
            answer
        })
    }

    /// A full-page PNG into `dir/name`; returns its path.
    fn screenshot(&mut self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        self.ask(json!({"op": "screenshot", "path": path}));
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "close"}));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The console's URL from the worker's stderr.
fn console_url(worker: &Proc) -> String {
    let line = worker.wait_line("console: http://");
    line.split("console: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the console URL")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(graph_relay_skip_browser, ignore = "GRAPH_RELAY_SKIP names browser")]
#[cfg_attr(
    all(graph_relay_skip_peers, not(graph_relay_skip_browser)),
    ignore = "GRAPH_RELAY_SKIP names peers"
)]
async fn the_owner_approves_watches_cancels_and_declines_in_a_real_browser() {
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).expect("screenshot folder");
    let mut browser = Browser::start();

    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.script("drafts", LONG);
    relay.write_graphs(&[(GS, "drafts", &["p1"])], "approval = \"always\"\n");
    let (_server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);
    let worker = relay.worker(&url, "outbox.db", "2", &["--console", "127.0.0.1:0"]);
    let console = console_url(&worker);
    worker.wait_line("sync: project p1");

    let opened = browser.ask(json!({"op": "open", "url": console}));
    assert_eq!(opened["status"], 200, "{opened}");
    assert_eq!(opened["title"], "graph-relay console");
    let mut pages = vec![browser.screenshot(&shots, "01-empty.png")];

    // A waiting run, with its Graph, agent, project and arguments.
    let first = relay
        .run(
            &url,
            GS,
            "browser-key-first",
            json!({"to": "carol@example.com"}),
        )
        .await;
    let row = browser.ask(json!({"op": "row", "table": "waiting", "id": first}));
    let text = row["text"].as_str().expect("row text");
    for shown in [
        first.as_str(),
        "drafts",
        GS,
        "assistant",
        "p1",
        "carol@example.com",
    ] {
        assert!(
            text.contains(shown),
            "`{shown}` not in the waiting row: {text}"
        );
    }
    assert!(
        !relay.path(&format!("ran.{first}")).exists(),
        "nothing runs before approval"
    );
    pages.push(browser.screenshot(&shots, "02-waiting.png"));

    // Approve: it starts, and its progress moves.
    browser.ask(json!({"op": "click", "table": "waiting", "id": first, "button": "approve"}));
    browser.ask(json!({"op": "gone", "table": "waiting", "id": first}));
    browser.ask(json!({"op": "row", "table": "running", "id": first}));
    let before = browser.ask(
        json!({"op": "cell_text", "table": "running", "id": first, "cell": "progress", "contains": "drafting"}),
    );
    let before = before["text"].as_str().expect("progress text").to_owned();
    let after = browser.ask(
        json!({"op": "cell_text", "table": "running", "id": first, "cell": "progress", "contains": "drafting", "not": before}),
    );
    assert_ne!(after["text"], before.as_str(), "the progress moved");
    assert!(
        relay.path(&format!("ran.{first}")).exists(),
        "approved: it runs"
    );
    let run = relay.get(&url, &first).await;
    assert_eq!(run["status"], "running");
    pages.push(browser.screenshot(&shots, "03-running.png"));

    // Cancel it on the desktop (the confirm dialog is accepted): the agent
    // reads that the owner cancelled it.
    browser.ask(
        json!({"op": "click", "table": "running", "id": first, "button": "cancel", "dialog": ""}),
    );
    let run = relay.wait_status(&url, &first, "cancelled").await;
    assert_eq!(
        run["error"], "Cancelled on the desktop by the owner",
        "{run}"
    );
    browser.ask(json!({"op": "row", "table": "finished", "id": first}));
    let status = browser.ask(
        json!({"op": "cell_text", "table": "finished", "id": first, "cell": "status", "contains": "cancelled"}),
    );
    assert!(
        status["text"]
            .as_str()
            .is_some_and(|t| t.contains("Cancelled on the desktop by the owner")),
        "{status}"
    );
    browser.ask(json!({"op": "gone", "table": "running", "id": first}));
    pages.push(browser.screenshot(&shots, "04-cancelled.png"));

    // Decline another with a reason: the agent reads "Declined on the desktop".
    let second = relay
        .run(
            &url,
            GS,
            "browser-key-second",
            json!({"to": "dave@example.com"}),
        )
        .await;
    browser.ask(json!({"op": "row", "table": "waiting", "id": second}));
    browser.ask(json!({"op": "click", "table": "waiting", "id": second, "button": "deny", "dialog": "not this week"}));
    let run = relay.wait_status(&url, &second, "failed").await;
    assert_eq!(
        run["error"], "Declined on the desktop: not this week",
        "{run}"
    );
    assert!(
        !relay.path(&format!("ran.{second}")).exists(),
        "declined: never ran"
    );
    browser.ask(
        json!({"op": "cell_text", "table": "finished", "id": second, "cell": "status", "contains": "Declined on the desktop: not this week"}),
    );
    pages.push(browser.screenshot(&shots, "05-declined.png"));

    for page in &pages {
        let bytes = std::fs::read(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(
            bytes.len() > 1000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{} is not a PNG screenshot ({} bytes)",
            page.display(),
            bytes.len()
        );
    }
}
