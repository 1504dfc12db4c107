//! Two `graph-relay serve --postgres` processes on one database (a schema of
//! its own per test) share one queue: an agent queues through A and a
//! worker long-polling B picks the run up at once (woken over
//! LISTEN/NOTIFY, not by its 25 s hold running out); a cancel sent through B
//! reaches a run started through A; an idempotent replay through B returns
//! A's command. Skipped (with a printed reason) without
//! `GRAPH_RELAY_POSTGRES_URL`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graph_relay_store_postgres::testing::{TestSchema, url_or_skip};
use graph_relay_transport_http::auth::hash_token;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");
const AGENT_TOKEN: &str = "gra_pg_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_pg_device_token_0123456789abcdef";
const GS_QUICK: &str = "gs_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const GS_SLOW: &str = "gs_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const DEADLINE: Duration = Duration::from_secs(30);
/// A pickup or cancel that arrives within this went through a wake-up, not
/// a 25 s hold running out.
const PROMPT: Duration = Duration::from_secs(4);

/// A `graph-relay` child whose stderr lines are collected.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(args: &[&str], cwd: &Path) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .current_dir(cwd)
            .env("GRAPH_RELAY_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn graph-relay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with `{needle}` within {DEADLINE:?}:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn interrupt(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + DEADLINE;
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "did not exit after SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Cluster {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[[agent]]\nname = \"assistant\"\nowner = \"dev\"\nprojects = [\"p1\"]\nscopes = [\"osfoundry:read\", \"osfoundry:run\"]\ntoken_sha256 = \"{}\"\n\n[[device]]\nname = \"desk\"\nowner = \"dev\"\ntoken_sha256 = \"{}\"\n",
            hash_token(AGENT_TOKEN),
            hash_token(DEVICE_TOKEN)
        );
        std::fs::write(dir.path().join("graph-relay.toml"), config).unwrap();
        std::fs::write(dir.path().join("device.token"), format!("{DEVICE_TOKEN}\n")).unwrap();
        let mut graphs = String::from("projects = [\"p1\"]\n");
        for (id, slug) in [(GS_QUICK, "quick"), (GS_SLOW, "slow")] {
            graphs.push_str(&format!(
                "\n[[graph]]\nid = \"{id}\"\nname = \"Graph {slug}\"\nslug = \"{slug}\"\nversion = \"1\"\nprojects = [\"p1\"]\ncommand = [\"/bin/sh\", \"{slug}.sh\"]\nworking_dir = \".\"\ntimeout_seconds = 120\n"
            ));
        }
        std::fs::write(dir.path().join("graphs.toml"), graphs).unwrap();
        std::fs::write(
            dir.path().join("quick.sh"),
            "args=$(cat)\nprintf '{\"got\": %s}\\n' \"$args\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("slow.sh"),
            "echo $$ > slow.pid\nexec sleep 300\n",
        )
        .unwrap();
        Self {
            dir,
            http: reqwest::Client::new(),
        }
    }

    /// `serve --postgres` on a free port; returns it and its base URL.
    fn serve(&self, url: &str, schema: &str) -> (Proc, String) {
        let server = Proc::spawn(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--postgres",
                url,
                "--postgres-schema",
                schema,
                "--config",
                "graph-relay.toml",
            ],
            self.dir.path(),
        );
        let line = server.wait_line("serving MCP at http://");
        let base = line
            .split("serving MCP at ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .trim_end_matches("/mcp")
            .to_owned();
        (server, base)
    }

    fn worker(&self, server: &str, outbox: &str) -> Proc {
        Proc::spawn(
            &[
                "worker",
                "--server",
                server,
                "--token-file",
                "device.token",
                "--graphs",
                "graphs.toml",
                "--outbox",
                outbox,
                "--grace-seconds",
                "1",
            ],
            self.dir.path(),
        )
    }

    async fn call(&self, server: &str, tool: &str, arguments: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
        let reply: Value = self
            .http
            .post(format!("{server}/mcp"))
            .bearer_auth(AGENT_TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        reply["result"].clone()
    }

    async fn run(&self, server: &str, gs: &str, key: &str, arguments: Value) -> String {
        let result = self
            .call(
                server,
                "run_graph_session",
                json!({"graph_session_id": gs, "idempotency_key": key, "arguments": arguments}),
            )
            .await;
        assert_eq!(result["isError"], false, "{result}");
        result["structuredContent"]["command_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn wait_status(&self, server: &str, id: &str, status: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let run = self
                .call(server, "get_graph_run", json!({"command_id": id}))
                .await["structuredContent"]
                .clone();
            if run["status"] == status {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "{id} never became {status}: {run}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_database_share_the_queue_and_wake_each_other() {
    let Some(url) = url_or_skip("two servers on Postgres") else {
        return;
    };
    let schema = TestSchema::new(&url);
    let cluster = Cluster::new();
    let (_a, a) = cluster.serve(&url, schema.name());
    let (_b, b) = cluster.serve(&url, schema.name());

    // A worker long-polls B; its first (empty) pass is held there.
    let worker = cluster.worker(&b, "outbox-b.db");
    worker.wait_line("sync: project p1");
    std::thread::sleep(Duration::from_millis(300));
    let queued_at = Instant::now();
    let id = cluster
        .run(&a, GS_QUICK, "pg-key-quick-1", json!({"n": 1}))
        .await;
    worker.wait_line(&format!("started {id}"));
    let pickup = queued_at.elapsed();
    assert!(
        pickup < PROMPT,
        "queued through A, picked up through B after {pickup:?}: a wake-up, not the hold, must answer"
    );
    let done = cluster.wait_status(&b, &id, "completed").await;
    assert_eq!(done["result"], json!({"got": {"n": 1}}));

    // The agent lost A's answer and retries through B: the same command.
    let replay = cluster
        .run(&b, GS_QUICK, "pg-key-quick-1", json!({"n": 1}))
        .await;
    assert_eq!(
        replay, id,
        "an idempotent replay through B returns A's command"
    );
    worker.interrupt();

    // Now the desktop talks to A: the run starts through A, and its held
    // control request on A learns of a cancel sent through B.
    let worker = cluster.worker(&a, "outbox-a.db");
    let slow = cluster.run(&b, GS_SLOW, "pg-key-slow-1", json!({})).await;
    worker.wait_line(&format!("started {slow}"));
    cluster.wait_status(&a, &slow, "running").await;
    let asked_at = Instant::now();
    let reply = cluster
        .call(&b, "cancel_graph_run", json!({"command_id": slow}))
        .await;
    assert_eq!(reply["isError"], false, "{reply}");
    worker.wait_line(&format!("cancelling {slow}"));
    let reached = asked_at.elapsed();
    assert!(
        reached < PROMPT,
        "cancel through B reached the run on A after {reached:?}"
    );
    let run = cluster.wait_status(&a, &slow, "cancelled").await;
    assert_eq!(run["cancel_requested"], true);
}
