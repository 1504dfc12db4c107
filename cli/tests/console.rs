//! The worker's local console over real sockets: `graph-relay serve`,
//! `graph-relay worker --console 127.0.0.1:0`, a Graph that needs approval
//! (without a hook), `graph-relay approve`/`deny` as processes, and the
//! console's checks (secret, Host, Origin, anti-CSRF, limits).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, Proc, Relay};
use serde_json::{Value, json};

const AGENT_TOKEN: &str = "gra_console_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_console_device_token_0123456789abcdef";
const GS: &str = "gs_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const DEADLINE: Duration = Duration::from_secs(30);

struct Env {
    relay: Relay,
    url: String,
    console: String,
    _server: Proc,
    worker: Proc,
    http: reqwest::Client,
}

/// A Graph that reports progress every 0.1 s until `stop.<command id>` exists.
const LONG: &str = r#"cat > /dev/null
echo ran > "ran.$GRAPH_RELAY_COMMAND_ID"
i=0
while [ ! -f "stop.$GRAPH_RELAY_COMMAND_ID" ]; do
  i=$((i + 1))
  printf '{"message": "step %s", "percent": %s}\n' "$i" "$((i % 101))" >&"$GRAPH_RELAY_PROGRESS_FD"
  sleep 0.1
done
echo '{"ran": true}'
"#;

impl Env {
    fn new() -> Self {
        Self::with_script(
            "cat > /dev/null\necho ran > \"ran.$GRAPH_RELAY_COMMAND_ID\"\necho '{\"ran\": true}'\n",
        )
    }

    /// As [`Env::new`], the Graph running `script`.
    fn with_script(script: &str) -> Self {
        let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
        relay.script("g", script);
        relay.write_graphs(&[(GS, "g", &["p1"])], "approval = \"always\"\n");
        let (server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);
        let worker = relay.worker(&url, "outbox.db", "2", &["--console", "127.0.0.1:0"]);
        let line = worker.wait_line("console: http://");
        let console = line
            .split("console: ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("the console URL")
            .to_owned();
        worker.wait_line("sync: project p1");
        Self {
            relay,
            url,
            console,
            _server: server,
            worker,
            http: reqwest::Client::new(),
        }
    }

    /// Waits until `id` is listed as waiting; returns its entry.
    async fn listed(&self, id: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let list: Value = self
                .http
                .get(format!("{}api/waiting", self.console))
                .send()
                .await
                .expect("answer")
                .json()
                .await
                .expect("JSON");
            if let Some(entry) = list["waiting"]
                .as_array()
                .and_then(|w| w.iter().find(|e| e["command_id"] == id))
            {
                return entry.clone();
            }
            assert!(Instant::now() < deadline, "{id} never listed: {list}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `GET api/runs`.
    async fn runs(&self) -> Value {
        self.http
            .get(format!("{}api/runs", self.console))
            .send()
            .await
            .expect("answer")
            .json()
            .await
            .expect("JSON")
    }

    /// Polls `api/runs` until `pick` finds something in it; returns that.
    async fn until(&self, what: &str, pick: impl Fn(&Value) -> Option<Value>) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let runs = self.runs().await;
            if let Some(found) = pick(&runs) {
                return found;
            }
            assert!(Instant::now() < deadline, "{what} never shown: {runs}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The anti-CSRF token.
    async fn csrf(&self) -> String {
        let session: Value = self
            .http
            .get(format!("{}api/session", self.console))
            .send()
            .await
            .expect("session")
            .json()
            .await
            .expect("JSON");
        session["csrf"].as_str().expect("token").to_owned()
    }

    /// `POST api/runs/{id}/{verb}` with the token; returns the status.
    async fn press(&self, id: &str, verb: &str, body: Value) -> u16 {
        self.http
            .post(format!("{}api/runs/{id}/{verb}", self.console))
            .header("x-graph-relay-csrf", self.csrf().await)
            .json(&body)
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16()
    }

    async fn waiting_count(&self) -> usize {
        let list: Value = self
            .http
            .get(format!("{}api/waiting", self.console))
            .send()
            .await
            .expect("answer")
            .json()
            .await
            .expect("JSON");
        list["waiting"].as_array().map_or(0, Vec::len)
    }

    /// `graph-relay <verb> --console URL ID [extra]`: (success, stdout + stderr).
    fn terminal(&self, verb: &str, id: &str, extra: &[&str]) -> (bool, String) {
        let out = Command::new(BIN)
            .args([verb, "--console", &self.console, id])
            .args(extra)
            .output()
            .expect("run graph-relay");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_lists_a_waiting_run_and_the_terminal_approves_or_declines_it() {
    let env = Env::new();
    // The console answers approvals: no warning that nothing can.
    assert_eq!(env.worker.count("needs the owner's approval"), 0);
    let page = env.http.get(&env.console).send().await.expect("page");
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .expect("html")
            .contains("Runs waiting for your approval")
    );

    let id = env
        .relay
        .run(&env.url, GS, "console-key-yes", json!({"to": "bob"}))
        .await;
    let entry = env.listed(&id).await;
    assert_eq!(entry["graph_session_id"], GS);
    assert_eq!(entry["project_id"], "p1");
    assert_eq!(entry["arguments"], json!({"to": "bob"}));
    assert!(!env.relay.path(&format!("ran.{id}")).exists());
    let (ok, out) = env.terminal("approve", &id, &[]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), format!("approved {id}"));
    let run = env.relay.wait_status(&env.url, &id, "completed").await;
    assert_eq!(run["result"], json!({"ran": true}));
    assert_eq!(env.waiting_count().await, 0, "answered: off the board");
    // Answering again: nothing waits under that id.
    let (ok, out) = env.terminal("approve", &id, &[]);
    assert!(!ok && out.contains("404"), "{out}");

    let id = env
        .relay
        .run(&env.url, GS, "console-key-no", json!({}))
        .await;
    env.listed(&id).await;
    let (ok, out) = env.terminal("deny", &id, &["--reason", "not this week"]);
    assert!(ok, "{out}");
    let run = env.relay.wait_status(&env.url, &id, "failed").await;
    assert_eq!(run["error"], "Declined on the desktop: not this week");
    assert!(!env.relay.path(&format!("ran.{id}")).exists());

    // A cancel from the agent takes the run off the board.
    let id = env
        .relay
        .run(&env.url, GS, "console-key-cancel", json!({}))
        .await;
    env.listed(&id).await;
    env.relay.cancel(&env.url, &id).await;
    env.relay.wait_status(&env.url, &id, "cancelled").await;
    let deadline = Instant::now() + DEADLINE;
    while env.waiting_count().await != 0 {
        assert!(Instant::now() < deadline, "the prompt never disappeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_refuses_other_paths_hosts_origins_and_posts_without_the_token() {
    let env = Env::new();
    let id = env
        .relay
        .run(&env.url, GS, "console-key-guard", json!({}))
        .await;
    env.listed(&id).await;
    let base = env.console.trim_end_matches('/');
    let (root, _secret) = base.rsplit_once('/').expect("a secret in the URL");
    let port = root.rsplit_once(':').expect("a port").1;
    let csrf: Value = env
        .http
        .get(format!("{base}/api/session"))
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("JSON");
    let csrf = csrf["csrf"].as_str().expect("token").to_owned();
    let status = |r: reqwest::Response| r.status().as_u16();

    // Another secret: as if nothing were there.
    let wrong = format!("{root}/{}/api/waiting", "0".repeat(64));
    assert_eq!(status(env.http.get(&wrong).send().await.unwrap()), 404);
    // Another Host (DNS rebinding) or Origin (another site's page).
    let waiting = format!("{base}/api/waiting");
    let r = env
        .http
        .get(&waiting)
        .header("host", format!("evil.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    let r = env
        .http
        .get(&waiting)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    let r = env
        .http
        .get(&waiting)
        .header("origin", format!("http://127.0.0.1:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 200, "its own page's origin is fine");

    let approve = format!("{base}/api/runs/{id}/approve");
    let deny = format!("{base}/api/runs/{id}/deny");
    // No token, a wrong token, a right token from another origin.
    assert_eq!(status(env.http.post(&approve).send().await.unwrap()), 403);
    let r = env
        .http
        .post(&approve)
        .header("x-graph-relay-csrf", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    let r = env
        .http
        .post(&approve)
        .header("x-graph-relay-csrf", &csrf)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 403);
    // Limits: a reason over 500 characters, a body over 4 KiB.
    let r = env
        .http
        .post(&deny)
        .header("x-graph-relay-csrf", &csrf)
        .json(&json!({"reason": "x".repeat(501)}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 422);
    let r = env
        .http
        .post(&deny)
        .header("x-graph-relay-csrf", &csrf)
        .header("content-type", "application/json")
        .body(format!("{{\"reason\": \"{}\"}}", "x".repeat(5000)))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 413);
    // Nothing of that answered the question.
    assert_eq!(env.relay.get(&env.url, &id).await["status"], "running");
    assert!(!env.relay.path(&format!("ran.{id}")).exists());
    let r = env
        .http
        .post(&approve)
        .header("x-graph-relay-csrf", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 200);
    env.relay.wait_status(&env.url, &id, "completed").await;
}

/// The entry of `id` in the list `list` of an `api/runs` answer.
fn entry(runs: &Value, list: &str, id: &str) -> Option<Value> {
    runs[list]
        .as_array()?
        .iter()
        .find(|e| e["command_id"] == id)
        .cloned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_shows_progress_cancels_on_the_desktop_and_keeps_the_finished_runs() {
    let env = Env::with_script(LONG);
    let id = env
        .relay
        .run(&env.url, GS, "console-key-live", json!({"to": "carol"}))
        .await;
    let waiting = env
        .until("the waiting run", |r| entry(r, "waiting", &id))
        .await;
    assert_eq!(waiting["agent_id"], "assistant", "{waiting}");
    assert_eq!(waiting["graph"], "g");
    assert_eq!(env.press(&id, "approve", json!({})).await, 200);

    // Running, with progress that moves.
    let first = env
        .until("progress", |r| {
            entry(r, "running", &id).filter(|e| e["progress"]["percent"].is_number())
        })
        .await;
    assert_eq!(first["agent_id"], "assistant");
    assert_eq!(first["project_id"], "p1");
    assert_eq!(first["arguments"], json!({"to": "carol"}));
    assert_eq!(first["cancelling"], false);
    let message = first["progress"]["message"].clone();
    assert!(
        message.as_str().is_some_and(|m| m.starts_with("step ")),
        "{first}"
    );
    env.until("progress moving on", |r| {
        entry(r, "running", &id).filter(|e| e["progress"]["message"] != message)
    })
    .await;

    // The cancel button: refused without the token, then the run stops and
    // the agent reads who cancelled it.
    let r = env
        .http
        .post(format!("{}api/runs/{id}/cancel", env.console))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 403);
    assert_eq!(env.press(&id, "cancel", json!({})).await, 200);
    let run = env.relay.wait_status(&env.url, &id, "cancelled").await;
    assert_eq!(
        run["error"], "Cancelled on the desktop by the owner",
        "{run}"
    );
    env.worker
        .wait_line("the owner cancelled it on the desktop");
    let finished = env
        .until("the finished run", |r| entry(r, "finished", &id))
        .await;
    assert_eq!(finished["status"], "cancelled");
    assert_eq!(finished["note"], "Cancelled on the desktop by the owner");
    assert_eq!(finished["agent_id"], "assistant");
    assert_eq!(entry(&env.runs().await, "running", &id), None);
    assert_eq!(
        env.press(&id, "cancel", json!({})).await,
        404,
        "ended: nothing to cancel"
    );
    let unknown = "67e55044-10b1-426f-9247-bb680e5fe0c8";
    assert_eq!(env.press(unknown, "cancel", json!({})).await, 404);

    // A declined run is listed with its status and the owner's reason, newest first.
    let id2 = env
        .relay
        .run(&env.url, GS, "console-key-live-2", json!({}))
        .await;
    env.until("the second waiting run", |r| entry(r, "waiting", &id2))
        .await;
    assert_eq!(
        env.press(&id2, "deny", json!({"reason": "not now"})).await,
        200
    );
    let runs = env
        .until("the declined run", |r| {
            entry(r, "finished", &id2).map(|_| r.clone())
        })
        .await;
    assert_eq!(runs["finished"][0]["command_id"], id2.as_str());
    assert_eq!(runs["finished"][0]["status"], "failed");
    assert_eq!(
        runs["finished"][0]["note"],
        "Declined on the desktop: not now"
    );
    assert_eq!(runs["finished"][1]["command_id"], id.as_str());
    assert!(!env.relay.path(&format!("ran.{id2}")).exists());
}

#[test]
fn the_console_listens_on_loopback_only() {
    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.write_graphs(&[(GS, "g", &["p1"])], "");
    let out = Command::new(BIN)
        .current_dir(relay.dir.path())
        .args([
            "worker",
            "--server",
            "http://127.0.0.1:9",
            "--token-file",
            "device.token",
            "--graphs",
            "graphs.toml",
            "--outbox",
            "outbox.db",
            "--console",
            "0.0.0.0:0",
        ])
        .output()
        .expect("run the worker");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("loopback"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
