//! Helpers shared by the end-to-end tests that run `graph-relay serve` and
//! `graph-relay worker` as processes: a child whose stderr lines are
//! collected, a temporary folder with the config, token and Graph files, and
//! an agent speaking HTTP MCP with a bearer token. Every wait polls with a
//! deadline; nothing sleeps to synchronise.

#![allow(dead_code)]

pub mod loadtest;
pub mod scrape;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graph_relay_transport_http::auth::hash_token;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// A `graph-relay` child whose stderr lines are collected.
pub struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    deadline: Duration,
}

impl Proc {
    /// Spawns `graph-relay <args>` in `cwd` (log level info); its waits
    /// give up after `deadline`.
    pub fn spawn(args: &[&str], cwd: &Path, deadline: Duration) -> Self {
        Self::spawn_with(args, cwd, deadline, |command| {
            command.env("GRAPH_RELAY_LOG", "info");
        })
    }

    /// As [`Proc::spawn`], with `configure` setting the command's
    /// environment (or anything else) before it starts.
    pub fn spawn_with<S: AsRef<std::ffi::OsStr>>(
        args: &[S],
        cwd: &Path,
        deadline: Duration,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        configure(&mut command);
        let mut child = command.spawn().expect("spawn graph-relay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Self {
            child,
            lines,
            deadline,
        }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + self.deadline;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with `{needle}` within {:?}:\n{}",
                self.deadline,
                self.lines.lock().expect("lines").join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// How many stderr lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// SIGINT, then waits for the exit; returns every stderr line.
    pub fn interrupt(mut self) -> Vec<String> {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + self.deadline;
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "did not exit after SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.lines.lock().expect("lines").clone()
    }

    /// SIGTERM, then waits for the exit; returns how long the exit took and
    /// every stderr line.
    pub fn terminate(mut self) -> (Duration, Vec<String>) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let sent = Instant::now();
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = sent + self.deadline;
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        }
        (sent.elapsed(), self.lines.lock().expect("lines").clone())
    }

    /// Every stderr line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    pub fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary folder holding `graph-relay.toml` (agents on project `p1`
/// and the device `desk`) and `device.token`, and an HTTP client speaking
/// MCP as the first agent.
pub struct Relay {
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
    agent_token: &'static str,
    deadline: Duration,
}

impl Relay {
    /// `agents` are `(name, token)`; the first one is the agent `call` speaks as.
    pub fn new(agents: &[(&str, &'static str)], device_token: &str, deadline: Duration) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = String::new();
        for (name, token) in agents {
            config.push_str(&format!(
                "[[agent]]\nname = \"{name}\"\nowner = \"dev\"\nprojects = [\"p1\"]\nscopes = [\"osfoundry:read\", \"osfoundry:run\"]\ntoken_sha256 = \"{}\"\n\n",
                hash_token(token)
            ));
        }
        config.push_str(&format!(
            "[[device]]\nname = \"desk\"\nowner = \"dev\"\ntoken_sha256 = \"{}\"\n",
            hash_token(device_token)
        ));
        std::fs::write(dir.path().join("graph-relay.toml"), config).expect("config");
        std::fs::write(dir.path().join("device.token"), format!("{device_token}\n"))
            .expect("token");
        Self {
            dir,
            http: reqwest::Client::new(),
            agent_token: agents[0].1,
            deadline,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `graphs.toml` (atomically, for a worker that reloads it): each
    /// graph `(id, slug, projects)` runs `<slug>.sh`; `extra` is appended to
    /// each `[[graph]]` table.
    pub fn write_graphs(&self, graphs: &[(&str, &str, &[&str])], extra: &str) {
        let mut text = String::from("projects = [\"p1\"]\n");
        for (id, slug, projects) in graphs {
            let projects: Vec<String> = projects.iter().map(|p| format!("\"{p}\"")).collect();
            text.push_str(&format!(
                "\n[[graph]]\nid = \"{id}\"\nname = \"Graph {slug}\"\nslug = \"{slug}\"\nversion = \"1\"\nprojects = [{}]\ncommand = [\"/bin/sh\", \"{slug}.sh\"]\nworking_dir = \".\"\n{extra}",
                projects.join(", ")
            ));
        }
        let tmp = self.path("graphs.toml.tmp");
        std::fs::write(&tmp, text).expect("graphs");
        std::fs::rename(tmp, self.path("graphs.toml")).expect("graphs");
    }

    /// Writes the script `<slug>.sh`.
    pub fn script(&self, slug: &str, body: &str) {
        std::fs::write(self.path(&format!("{slug}.sh")), body).expect("script");
    }

    pub fn spawn(&self, args: &[&str]) -> Proc {
        Proc::spawn(args, self.dir.path(), self.deadline)
    }

    /// `serve --listen <listen> <store...> --config graph-relay.toml`; returns
    /// it once it serves, with its base URL.
    pub fn serve(&self, listen: &str, store: &[&str]) -> (Proc, String) {
        let mut args = vec!["serve", "--listen", listen];
        args.extend_from_slice(store);
        args.extend_from_slice(&["--config", "graph-relay.toml"]);
        let server = self.spawn(&args);
        let line = server.wait_line("serving MCP at http://");
        let url = line
            .split("serving MCP at ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("url in the serving line")
            .trim_end_matches("/mcp")
            .to_owned();
        (server, url)
    }

    /// [`Relay::serve`] on the Postgres database at `url`, in `schema`,
    /// with its metrics listener on a free loopback port.
    pub fn serve_postgres_with_metrics(&self, url: &str, schema: &str) -> (Proc, String) {
        self.serve(
            "127.0.0.1:0",
            &[
                "--postgres",
                url,
                "--postgres-schema",
                schema,
                "--metrics",
                "127.0.0.1:0",
            ],
        )
    }

    /// `worker` against `server` with `device.token` and `graphs.toml`.
    pub fn worker(&self, server: &str, outbox: &str, grace_seconds: &str, extra: &[&str]) -> Proc {
        let mut args = vec![
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
            grace_seconds,
        ];
        args.extend_from_slice(extra);
        self.spawn(&args)
    }

    /// A tools/call over HTTP MCP (2026-07-28, stateless) with the agent token.
    pub async fn call(&self, url: &str, tool: &str, arguments: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
        let reply: Value = self
            .http
            .post(format!("{url}/mcp"))
            .bearer_auth(self.agent_token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .json(&body)
            .send()
            .await
            .expect("HTTP answer")
            .json()
            .await
            .expect("JSON body");
        reply["result"].clone()
    }

    /// `run_graph_session`, which must succeed; returns the command id.
    pub async fn run(&self, url: &str, gs: &str, key: &str, arguments: Value) -> String {
        let result = self
            .call(
                url,
                "run_graph_session",
                json!({"graph_session_id": gs, "idempotency_key": key, "arguments": arguments}),
            )
            .await;
        assert_eq!(result["isError"], false, "{result}");
        result["structuredContent"]["command_id"]
            .as_str()
            .expect("command_id")
            .to_owned()
    }

    /// `get_graph_run`; returns the run.
    pub async fn get(&self, url: &str, id: &str) -> Value {
        let result = self
            .call(url, "get_graph_run", json!({"command_id": id}))
            .await;
        result["structuredContent"].clone()
    }

    pub async fn cancel(&self, url: &str, id: &str) -> Value {
        self.call(url, "cancel_graph_run", json!({"command_id": id}))
            .await
    }

    /// Polls get_graph_run until the status is `status`.
    pub async fn wait_status(&self, url: &str, id: &str, status: &str) -> Value {
        let deadline = Instant::now() + self.deadline;
        loop {
            let run = self.get(url, id).await;
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

    /// Waits until the file `name` holds a whole line; returns its text.
    pub fn wait_file(&self, name: &str) -> String {
        let deadline = Instant::now() + self.deadline;
        loop {
            if let Ok(text) = std::fs::read_to_string(self.path(name))
                && text.ends_with('\n')
            {
                return text;
            }
            assert!(Instant::now() < deadline, "{name} never written");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the file `name` exists.
    pub async fn wait_exists(&self, name: &str, what: &str) {
        let path = self.path(name);
        let deadline = Instant::now() + self.deadline;
        while !path.exists() {
            assert!(Instant::now() < deadline, "{what} never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Where the real MCP peers are: a Python with `mcp` 2.3.0, Node 22, the
/// conformance suite's `dist/index.js`, the `node_modules` folder that
/// holds the authorization server `oidc-provider`, and the one that holds
/// `playwright-core` (which drives the system's chromium).
#[derive(Debug, Clone)]
pub struct Peers {
    pub python: PathBuf,
    pub node: PathBuf,
    pub conformance: PathBuf,
    pub oidc_provider: PathBuf,
    pub playwright: PathBuf,
}

/// The real MCP peers: from `GRAPH_RELAY_PYTHON`, `GRAPH_RELAY_NODE`,
/// `GRAPH_RELAY_CONFORMANCE`, `GRAPH_RELAY_OIDC_PROVIDER` and
/// `GRAPH_RELAY_PLAYWRIGHT` when all five are set, else installed by
/// `.ci/mcp-peers.sh` into the target directory (once: test binaries take
/// turns on a lock file, and a finished install returns at once). Panics,
/// saying what is missing, when they cannot be had; a machine without
/// Python or Node opts out with `GRAPH_RELAY_SKIP=peers`.
pub fn peers() -> Peers {
    static PEERS: std::sync::OnceLock<Peers> = std::sync::OnceLock::new();
    PEERS.get_or_init(install_peers).clone()
}

fn install_peers() -> Peers {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let (Some(python), Some(node), Some(conformance), Some(oidc_provider), Some(playwright)) = (
        var("GRAPH_RELAY_PYTHON"),
        var("GRAPH_RELAY_NODE"),
        var("GRAPH_RELAY_CONFORMANCE"),
        var("GRAPH_RELAY_OIDC_PROVIDER"),
        var("GRAPH_RELAY_PLAYWRIGHT"),
    ) {
        return Peers {
            python: python.into(),
            node: node.into(),
            conformance: conformance.into(),
            oidc_provider: oidc_provider.into(),
            playwright: playwright.into(),
        };
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_owned();
    std::fs::create_dir_all(&target).expect("target directory");
    let lock = std::fs::File::create(target.join("mcp-peers.lock")).expect("lock file");
    let _turn = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock the peers install");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/mcp-peers.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--print")
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "the real MCP peers could not be installed by {} (it needs python3 with venv and pip, \
         and npm with access to the npm registry); install what is missing, set \
         GRAPH_RELAY_PYTHON, GRAPH_RELAY_NODE, GRAPH_RELAY_CONFORMANCE, \
         GRAPH_RELAY_OIDC_PROVIDER and GRAPH_RELAY_PLAYWRIGHT, or opt out with \
         GRAPH_RELAY_SKIP=peers.\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let find = |name: &str| -> PathBuf {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{} printed no {name}:\n{printed}", script.display()))
            .into()
    };
    Peers {
        python: find("GRAPH_RELAY_PYTHON"),
        node: find("GRAPH_RELAY_NODE"),
        conformance: find("GRAPH_RELAY_CONFORMANCE"),
        oidc_provider: find("GRAPH_RELAY_OIDC_PROVIDER"),
        playwright: find("GRAPH_RELAY_PLAYWRIGHT"),
    }
}
