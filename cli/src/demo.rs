//! `graph-relay demo`: the whole system in one command.
//!
//! Everything lives in one temporary folder, removed on exit: the
//! configuration (a development agent, a second agent and a device, with
//! tokens drawn for this run), a SQLite queue, three sample Graphs (an echo,
//! a slow one that reports progress on fd 3, one that fails), the worker's
//! outbox. The server runs in this process on a loopback port; the worker is
//! this binary's `worker` command as a child process, its status lines shown
//! with a `worker |` prefix. A scripted agent then talks real MCP over HTTP
//! to the server and prints each step; afterwards the demo prints snippets
//! that connect real clients to it and stays up until SIGINT/SIGTERM (or
//! exits at once with `--once`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_transport_http::Server;
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, TokenConfigError, TokenKind, hash_token, new_token,
};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::children::Watched;
use crate::mcp_client::{McpClient, McpClientError, ToolAnswer, is_terminal};

/// Options of `graph-relay demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address of the demo server (port 0: any free port). Loopback only.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Exit after the scripted flow instead of staying up for real clients.
    #[arg(long)]
    pub once: bool,
}

/// Why the demo stopped early.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A file or socket could not be used.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The demo's configuration could not be written.
    #[error(transparent)]
    Config(#[from] graph_relay_transport_http::config::ConfigError),
    /// The demo's tokens are unusable.
    #[error(transparent)]
    Tokens(#[from] TokenConfigError),
    /// The server could not be set up.
    #[error("cannot start the demo server: {0}")]
    Server(String),
    /// An MCP request of the scripted agent failed.
    #[error(transparent)]
    Mcp(#[from] McpClientError),
    /// The system did not do what the scripted flow expects.
    #[error("the scripted flow went wrong: {0}")]
    Flow(String),
    /// The worker process stopped or could not start.
    #[error("the worker: {0}")]
    Worker(String),
    /// Only loopback addresses are allowed.
    #[error("the demo listens on loopback addresses only, not {0}")]
    NotLoopback(SocketAddr),
}

/// The project the demo's Graphs are shared to.
const PROJECT: &str = "default";
/// Graph session ids of the three sample Graphs.
const ECHO: &str = "gs_00000000000000000000000000000ec0";
const SLOW: &str = "gs_000000000000000000000000000005e0";
const FAILS: &str = "gs_00000000000000000000000000000fa1";
/// How long the scripted agent waits for anything (pickup, a state).
const FLOW_DEADLINE: Duration = Duration::from_secs(30);
/// `wait_seconds` offered by the demo server (below the 30 s request timeout).
const MAX_WAIT_SECONDS: u32 = 20;

const ECHO_SH: &str = r#"#!/bin/sh
# echo.sh: returns its arguments and reports made-up usage.
args=$(cat)
printf '{"echo": %s, "command_id": "%s"}\n' "$args" "$GRAPH_RELAY_COMMAND_ID"
echo '{"graph_relay": {"total_tokens": 42}}'
"#;

const SLOW_SH: &str = r#"#!/bin/sh
# slow.sh: ten steps of half a second, each reported on the progress fd.
cat >/dev/null
i=1
while [ "$i" -le 10 ]; do
  echo "{\"message\": \"step $i of 10\", \"percent\": $((i * 10))}" >&"$GRAPH_RELAY_PROGRESS_FD"
  sleep 0.5
  i=$((i + 1))
done
echo '{"steps": 10}'
"#;

const FAILS_SH: &str = r#"#!/bin/sh
# fails.sh: reads its input, complains on stderr and exits 3.
cat >/dev/null
echo "fails.sh: the input folder does not exist (this Graph always fails)" >&2
exit 3
"#;

/// The files of one demo run, in its temporary folder.
struct DemoFiles {
    dir: PathBuf,
    config: PathBuf,
    db: PathBuf,
    agent_token: String,
    other_token: String,
}

impl DemoFiles {
    /// Writes the configuration, the device token, `graphs.toml` and the scripts.
    fn write(dir: &Path) -> Result<Self, DemoError> {
        let agent_token = new_token(TokenKind::Agent);
        let other_token = new_token(TokenKind::Agent);
        let device_token = new_token(TokenKind::Device);
        let agent = |name: &str, token: &str| AgentToken {
            name: name.into(),
            owner: "dev".into(),
            projects: vec![PROJECT.into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(token),
            revoked: false,
        };
        let file = ConfigFile {
            server: ServerSection::default(),
            oauth: None,
            agents: vec![
                agent("dev-agent", &agent_token),
                agent("other-agent", &other_token),
            ],
            devices: vec![DeviceToken {
                name: "dev-desktop".into(),
                owner: "dev".into(),
                token_sha256: hash_token(&device_token),
                revoked: false,
            }],
        };
        let config = dir.join("graph-relay.toml");
        file.save(&config)?;
        std::fs::write(dir.join("device.token"), format!("{device_token}\n"))?;
        for (name, body) in [
            ("echo.sh", ECHO_SH),
            ("slow.sh", SLOW_SH),
            ("fails.sh", FAILS_SH),
        ] {
            std::fs::write(dir.join(name), body)?;
        }
        let graph = |id: &str, name: &str, description: &str, slug: &str| {
            format!(
                "[[graph]]\nid = \"{id}\"\nname = \"{name}\"\ndescription = \"{description}\"\nslug = \"{slug}\"\nversion = \"1\"\nprojects = [\"{PROJECT}\"]\ncommand = [\"/bin/sh\", \"./{slug}.sh\"]\nworking_dir = \".\"\ntimeout_seconds = 60\n\n"
            )
        };
        let graphs = [
            graph(ECHO, "Echo", "Echoes its arguments", "echo"),
            graph(
                SLOW,
                "Slow count",
                "Counts to ten in five seconds, reporting progress",
                "slow",
            ),
            graph(FAILS, "Always fails", "Exits 3 with an error", "fails"),
        ]
        .concat();
        std::fs::write(dir.join("graphs.toml"), graphs)?;
        Ok(Self {
            dir: dir.to_owned(),
            config,
            db: dir.join("demo.db"),
            agent_token,
            other_token,
        })
    }
}

/// Runs the demo until the flow ends (`--once`) or SIGINT/SIGTERM.
pub fn run(args: DemoArgs) -> Result<(), DemoError> {
    if !args.listen.ip().is_loopback() {
        return Err(DemoError::NotLoopback(args.listen));
    }
    let dir = tempfile::Builder::new()
        .prefix("graph-relay-demo-")
        .tempdir()?;
    let files = DemoFiles::write(dir.path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(demo(&args, &files));
    runtime.shutdown_timeout(Duration::from_secs(5));
    // `dir` is removed here, after the worker has exited.
    drop(dir);
    outcome
}

async fn demo(args: &DemoArgs, files: &DemoFiles) -> Result<(), DemoError> {
    let server = build_server(args, files).await?;
    let local = server.local_addr();
    let queue = server.queue().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async move {
        let _ = stop_rx.await;
    }));
    let base = format!("http://{local}");
    println!("graph-relay demo: a server, a desktop worker and two agents on this machine");
    println!("  files   {} (removed on exit)", files.dir.display());
    println!("  MCP     {base}/mcp");

    let mut worker = start_worker(&base, files)?;
    println!(
        "  worker  pid {} (long-poll; outbox {})",
        worker.id().unwrap_or_default(),
        files.dir.join("outbox.db").display()
    );
    println!();

    let agent = Agent::new(&base, &files.agent_token)?;
    let other = Agent::new(&base, &files.other_token)?;
    let flow = tokio::select! {
        r = scripted_flow(&agent, &other) => Some(r),
        status = worker.wait() => {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            Some(Err(DemoError::Worker(format!("exited during the flow ({status})"))))
        }
        () = graph_relay_transport_http::shutdown_signal() => None,
    };
    let mut outcome = match flow {
        Some(Ok(())) => {
            print_snippets(&base, files);
            if args.once {
                Ok(())
            } else {
                println!("\nThe demo stays up for these clients; Ctrl-C ends it.");
                tokio::select! {
                    () = graph_relay_transport_http::shutdown_signal() => Ok(()),
                    status = worker.wait() => {
                        let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                        Err(DemoError::Worker(format!("exited ({status})")))
                    }
                }
            }
        }
        Some(Err(e)) => Err(e),
        None => Ok(()),
    };
    println!("\nStopping: the worker, then the server.");
    if let Err(e) = stop_worker(&mut worker).await
        && outcome.is_ok()
    {
        outcome = Err(e);
    }
    queue.shut_down();
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(10), serving).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => outcome = outcome.and(Err(DemoError::Io(e))),
        Ok(Err(e)) => outcome = outcome.and(Err(DemoError::Server(e.to_string()))),
        Err(_) => outcome = outcome.and(Err(DemoError::Server("did not stop within 10 s".into()))),
    }
    if outcome.is_ok() {
        println!("Stopped; {} removed.", files.dir.display());
    }
    outcome
}

/// The demo's server on `args.listen`: its SQLite queue and configuration
/// file in the demo folder, and `wait_seconds` offered.
async fn build_server(args: &DemoArgs, files: &DemoFiles) -> Result<Server, DemoError> {
    let store = graph_relay_store_sqlite::SqliteStore::open(&files.db)
        .map_err(|e| DemoError::Server(format!("{}: {e}", files.db.display())))?;
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(MAX_WAIT_SECONDS))
        .build()
        .map_err(|e| DemoError::Server(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let server_error =
        |e: graph_relay_transport_http::ServerError| DemoError::Server(e.to_string());
    Server::builder(Arc::new(store))
        .config_file(&files.config)
        .map_err(server_error)?
        .catalog(catalog)
        .build(listener)
        .await
        .map_err(server_error)
}

/// This binary's `worker` command, in the demo folder, its stderr shown
/// line by line with a prefix.
fn start_worker(base: &str, files: &DemoFiles) -> Result<tokio::process::Child, DemoError> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(["worker", "--server", base, "--token-file", "device.token"])
        .args(["--graphs", "graphs.toml", "--outbox", "outbox.db"])
        .args(["--grace-seconds", "1", "--mode", "long-poll"])
        .current_dir(&files.dir)
        .env("GRAPH_RELAY_LOG", "warn")
        .watched()
        .spawn()
        .map_err(|e| DemoError::Worker(format!("cannot start it: {e}")))?;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("  worker | {line}");
            }
        });
    }
    Ok(child)
}

/// SIGTERM to the worker (it cancels what runs and flushes its outbox),
/// then waits for it; SIGKILL if it takes longer than 15 s.
async fn stop_worker(worker: &mut tokio::process::Child) -> Result<(), DemoError> {
    if let Ok(Some(_)) = worker.try_wait() {
        return Ok(());
    }
    if let Some(pid) = worker.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(Duration::from_secs(15), worker.wait()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(DemoError::Worker(e.to_string())),
        Err(_) => {
            let _ = worker.kill().await;
            Err(DemoError::Worker("did not stop within 15 s; killed".into()))
        }
    }
}

/// The scripted agent: the shared MCP client plus the demo's printed steps.
struct Agent {
    client: McpClient,
}

impl Agent {
    fn new(base: &str, token: &str) -> Result<Self, DemoError> {
        Ok(Self {
            client: McpClient::new(base, token, Duration::from_secs(60))?,
        })
    }

    async fn list_tools(&self) -> Result<Vec<String>, DemoError> {
        Ok(self.client.list_tools().await?)
    }

    async fn call(&self, tool: &str, arguments: Value) -> Result<ToolAnswer, DemoError> {
        Ok(self.client.call(tool, arguments).await?)
    }

    /// A tool call that must not be a tool error; returns its structured content.
    async fn call_ok(&self, tool: &str, arguments: Value) -> Result<Value, DemoError> {
        Ok(self.client.call_ok(tool, arguments).await?)
    }

    async fn run(&self, gs: &str, key: &str, arguments: Value) -> Result<String, DemoError> {
        let answer = self
            .call(
                "run_graph_session",
                json!({"graph_session_id": gs, "idempotency_key": key, "arguments": arguments}),
            )
            .await?;
        if answer.is_error {
            return Err(DemoError::Flow(format!(
                "run_graph_session: {}",
                answer.text
            )));
        }
        let ticket = answer.structured;
        let id = ticket["command_id"]
            .as_str()
            .ok_or_else(|| DemoError::Flow(format!("a ticket without command_id: {ticket}")))?
            .to_owned();
        println!(
            "    ticket {id}, status {} (poll after {} s)",
            ticket["status"].as_str().unwrap_or("?"),
            ticket["poll_after_seconds"]
        );
        // What the model reads: the text up to the ticket's JSON.
        let text = answer.text.split(" Ticket: ").next().unwrap_or_default();
        println!("    the model reads: \"{text}\"");
        Ok(id)
    }

    async fn get(&self, id: &str, wait_seconds: u32) -> Result<Value, DemoError> {
        Ok(self.client.get_graph_run(id, wait_seconds).await?)
    }

    /// Polls `get_graph_run` every 20 ms until `done` holds for the run.
    async fn poll_until(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<(Value, Duration), DemoError> {
        let start = Instant::now();
        loop {
            let run = self.get(id, 0).await?;
            if done(&run) {
                return Ok((run, start.elapsed()));
            }
            if start.elapsed() > FLOW_DEADLINE {
                return Err(DemoError::Flow(format!(
                    "{id} was not {what} within {} s: {run}",
                    FLOW_DEADLINE.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `get_graph_run` with `wait_seconds` until the run is terminal.
    async fn wait_terminal(&self, id: &str) -> Result<Value, DemoError> {
        let start = Instant::now();
        loop {
            let run = self.get(id, MAX_WAIT_SECONDS).await?;
            if is_terminal(&run) {
                return Ok(run);
            }
            if start.elapsed() > FLOW_DEADLINE {
                return Err(DemoError::Flow(format!("{id} did not finish: {run}")));
            }
        }
    }
}

fn status_of(run: &Value) -> &str {
    run["status"].as_str().unwrap_or("?")
}

fn millis(d: Duration) -> u128 {
    d.as_millis()
}

/// The scripted agent: every step printed as it happens.
async fn scripted_flow(agent: &Agent, other: &Agent) -> Result<(), DemoError> {
    let tag = uuid::Uuid::new_v4().simple().to_string();

    println!("[1] tools/list (agent dev/dev-agent)");
    let tools = agent.list_tools().await?;
    println!("    {}", tools.join(", "));

    list_shared_sessions(agent).await?;
    let echo = run_echo(agent, &tag).await?;
    cancel_slow_run(agent, &tag).await?;
    run_failing(agent, &tag).await?;
    read_as_another_agent(other, &echo).await?;
    println!("\nThe scripted flow is done.");
    Ok(())
}

/// Step 2: the sessions the desktop shares, once the worker has shared
/// them all.
async fn list_shared_sessions(agent: &Agent) -> Result<(), DemoError> {
    println!("[2] list_graph_sessions {{\"project_id\": \"{PROJECT}\"}}");
    let start = Instant::now();
    let sessions = loop {
        let list = agent
            .call_ok("list_graph_sessions", json!({"project_id": PROJECT}))
            .await?;
        let sessions = list["sessions"].as_array().cloned().unwrap_or_default();
        if sessions.len() >= 3 {
            break sessions;
        }
        if start.elapsed() > FLOW_DEADLINE {
            return Err(DemoError::Flow(format!(
                "the worker shared no Graphs within {} s: {list}",
                FLOW_DEADLINE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "    {} sessions shared by the desktop (after {} ms):",
        sessions.len(),
        millis(start.elapsed())
    );
    for s in &sessions {
        println!(
            "    - {} {}: {}",
            s["graph_session_id"].as_str().unwrap_or("?"),
            s["name"].as_str().unwrap_or("?"),
            s["description"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// Steps 3 and 4: an echo run, its pickup and its result; returns its id.
async fn run_echo(agent: &Agent, tag: &str) -> Result<String, DemoError> {
    println!("[3] run_graph_session Echo {{\"greeting\": \"hello\"}}");
    let echo = agent
        .run(
            ECHO,
            &format!("demo-echo-{tag}"),
            json!({"greeting": "hello"}),
        )
        .await?;

    println!(
        "[4] get_graph_run until the desktop picks it up, then with wait_seconds {MAX_WAIT_SECONDS}"
    );
    let (run, waited) = agent
        .poll_until(&echo, "picked up", |r| status_of(r) != "queued")
        .await?;
    println!(
        "    pickup: the desktop took it after {} ms (status {})",
        millis(waited),
        status_of(&run)
    );
    let run = agent.wait_terminal(&echo).await?;
    if status_of(&run) != "completed" {
        return Err(DemoError::Flow(format!("the echo run ended {run}")));
    }
    println!(
        "    result: {} ({} tokens)",
        run["result"], run["total_tokens"]
    );
    Ok(echo)
}

/// Step 5: a slow run, cancelled while it reports progress.
async fn cancel_slow_run(agent: &Agent, tag: &str) -> Result<(), DemoError> {
    println!("[5] run_graph_session Slow count, then cancel_graph_run while it runs");
    let slow = agent
        .run(SLOW, &format!("demo-slow-{tag}"), json!({}))
        .await?;
    let (run, _) = agent
        .poll_until(&slow, "reporting progress", |r| {
            r["progress"]["percent"].as_f64().is_some_and(|p| p >= 10.0)
        })
        .await?;
    println!(
        "    running, progress: {} ({}%)",
        run["progress"]["message"].as_str().unwrap_or(""),
        run["progress"]["percent"]
            .as_f64()
            .unwrap_or_default()
            .round()
    );
    let sent = Instant::now();
    let cancel = agent
        .call_ok("cancel_graph_run", json!({"command_id": slow}))
        .await?;
    println!(
        "    cancel_graph_run → status {}{}",
        status_of(&cancel),
        if cancel["cancel_requested"] == true {
            ", cancel requested"
        } else {
            ""
        }
    );
    let run = agent.wait_terminal(&slow).await?;
    if status_of(&run) != "cancelled" {
        return Err(DemoError::Flow(format!("the slow run ended {run}")));
    }
    println!(
        "    cancelled {} ms after the request: {}",
        millis(sent.elapsed()),
        run["error"].as_str().unwrap_or("")
    );
    Ok(())
}

/// Step 6: a run whose Graph fails.
async fn run_failing(agent: &Agent, tag: &str) -> Result<(), DemoError> {
    println!("[6] run_graph_session Always fails");
    let fails = agent
        .run(FAILS, &format!("demo-fails-{tag}"), json!({}))
        .await?;
    let run = agent.wait_terminal(&fails).await?;
    if status_of(&run) != "failed" {
        return Err(DemoError::Flow(format!("the failing run ended {run}")));
    }
    println!(
        "    failed: {}",
        run["error"].as_str().unwrap_or("").trim_end()
    );
    Ok(())
}

/// Step 7: another agent asks for the echo run and gets the answer an
/// unknown id gets.
async fn read_as_another_agent(other: &Agent, echo: &str) -> Result<(), DemoError> {
    println!("[7] another agent (dev/other-agent) reads the first agent's ticket");
    let hidden = other
        .call("get_graph_run", json!({"command_id": echo}))
        .await?;
    let unknown = other
        .call(
            "get_graph_run",
            json!({"command_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await?;
    if !hidden.is_error || hidden.text != unknown.text {
        return Err(DemoError::Flow(format!(
            "another agent's run was not hidden: {} / {}",
            hidden.text, unknown.text
        )));
    }
    println!("    tool error: \"{}\"", hidden.text);
    println!(
        "    the same answer as for an id that does not exist: a leaked ticket confirms nothing"
    );
    Ok(())
}

/// Copy-paste snippets for real clients against this demo.
fn print_snippets(base: &str, files: &DemoFiles) {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "graph-relay".into());
    let url = format!("{base}/mcp");
    let token = &files.agent_token;
    let config = files.config.display();
    let db = files.db.display();
    println!(
        r#"
Connect a real client (the tokens are valid while the demo runs):

== Python (pip install mcp==2.3.0)
import asyncio, httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    http = httpx2.AsyncClient(headers={{"Authorization": "Bearer {token}"}})
    async with Client(streamable_http_client("{url}", http_client=http), mode="2026-07-28") as c:
        shared = await c.call_tool("list_graph_sessions", {{"project_id": "{PROJECT}"}})
        print(shared.structured_content)
        ticket = await c.call_tool("run_graph_session", {{"graph_session_id": "{ECHO}",
            "arguments": {{"from": "python"}}, "idempotency_key": "python-demo-0001"}})
        run = await c.call_tool("get_graph_run", {{"command_id": ticket.structured_content["command_id"], "wait_seconds": 10}})
        print(run.structured_content)

asyncio.run(main())

== Claude Desktop (claude_desktop_config.json), over stdio (same queue, same worker)
{{"mcpServers": {{"graph-relay-demo": {{"command": "{exe}",
  "args": ["stdio", "--config", "{config}", "--db", "{db}", "--agent", "dev-agent"]}}}}}}

== Claude Desktop over HTTP with a header (through mcp-remote)
{{"mcpServers": {{"graph-relay-demo": {{"command": "npx",
  "args": ["-y", "mcp-remote", "{url}", "--header", "Authorization:Bearer {token}"]}}}}}}

== Claude Code
claude mcp add --transport http graph-relay-demo {url} --header "Authorization: Bearer {token}"
claude mcp add graph-relay-demo -- {exe} stdio --config {config} --db {db} --agent dev-agent

== MCP Inspector
npx @modelcontextprotocol/inspector {exe} stdio --config {config} --db {db} --agent dev-agent
  or, over HTTP: npx @modelcontextprotocol/inspector, then Transport "Streamable HTTP",
  URL {url}, header "Authorization" = "Bearer {token}""#
    );
}
