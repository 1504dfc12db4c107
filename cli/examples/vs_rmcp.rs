//! `get_graph_run` of the real `graph-relay serve` (SQLite) against a
//! trivial rmcp `echo` tool (streamable HTTP, stateless, JSON responses),
//! side by side in one run: requests/s, p50/p99 latency and each server's
//! CPU per request (utime + stime from `/proc/<pid>/stat` over the window),
//! with the ratios against the README's budget (≥ 1.5× the requests/s at
//! ≤ 0.67× the CPU per request).
//!
//! Both servers are child processes (this example's siblings in the target
//! folder: the `graph-relay` binary and the `rmcp_echo` example), loaded
//! alternately by the same client: `--connections` keep-alive HTTP/1.1
//! connections on one thread, each sending its next request when the last
//! answer arrived. Every answer is checked (status, id, `isError: false`,
//! the expected content); a wrong one ends the run with a non-zero exit.
//!
//! ```text
//! cargo build --release -p graph-relay --bin graph-relay --example rmcp_echo --example vs_rmcp
//! target/release/examples/vs_rmcp [--seconds 10] [--rounds 3] [--connections 64] [--client builtin|wrk]
//! ```
//!
//! `GRAPH_RELAY_BIN` and `RMCP_ECHO_BIN` name the two executables elsewhere.
//!
//! `--client wrk` loads both servers with [wrk](https://github.com/wg/wrk)
//! instead (one thread, the same connections and requests, a Lua script
//! written per server), the way the baseline was first measured: wrk costs
//! the shared machine far less per request than this example's own client,
//! so both servers get more of the two cores. wrk does not read the
//! answers' bodies, so before every wrk window the built-in client sends
//! each connection's request once and checks the answer in full; wrk's own
//! count of non-2xx answers and socket errors must be zero.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_core::prelude::*;
use graph_relay_transport_http::auth::hash_token;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

type Error = Box<dyn std::error::Error + Send + Sync>;

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const TOKEN: &str = "vs-rmcp-bench-token";
const ECHO_TEXT: &str = "hello from the load generator";
/// `get_graph_run` must reach at least this multiple of rmcp's requests/s…
const RATE_BUDGET: f64 = 1.5;
/// …at no more than this multiple of its server CPU per request.
const CPU_BUDGET: f64 = 0.67;

/// Which load generator drives the servers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    /// This example's own client: checks every answer.
    Builtin,
    /// `wrk` from `PATH` (or `WRK_BIN`), one thread.
    Wrk,
}

/// The command line.
struct Options {
    seconds: f64,
    rounds: usize,
    connections: usize,
    client: Client,
}

impl Options {
    fn parse() -> Result<Self, Error> {
        let mut options = Self {
            seconds: 10.0,
            rounds: 3,
            connections: 64,
            client: Client::Builtin,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--seconds" => options.seconds = value.parse()?,
                "--rounds" => options.rounds = value.parse()?,
                "--connections" => options.connections = value.parse()?,
                "--client" => {
                    options.client = match value.as_str() {
                        "builtin" => Client::Builtin,
                        "wrk" => Client::Wrk,
                        other => {
                            return Err(format!("--client is builtin or wrk, not {other}").into());
                        }
                    }
                }
                other => {
                    return Err(format!(
                        "unknown flag {other}; use --seconds N, --rounds N, --connections N, --client builtin|wrk"
                    )
                    .into());
                }
            }
        }
        if options.seconds <= 0.0 || options.rounds == 0 || options.connections == 0 {
            return Err("--seconds, --rounds and --connections must be positive".into());
        }
        Ok(options)
    }
}

/// One server under load: how to ask it, and how to tell a right answer.
struct Target {
    label: &'static str,
    pid: u32,
    addr: String,
    /// The request head up to (not including) `Content-Length`.
    head: String,
    /// A body per connection (its JSON-RPC id is the connection's index).
    body: fn(usize, &str) -> String,
    /// What the body's tool argument is (the command id, or the echo text).
    argument: String,
    /// What every answer's text must contain.
    expect: String,
    child: Child,
}

/// A child process's CPU time so far (user + system), from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("unreadable /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after `)`.
    let ticks = |i: usize| -> Result<u64, Error> {
        Ok(fields.get(i).ok_or("short /proc/<pid>/stat")?.parse()?)
    };
    let total = ticks(11)? + ticks(12)?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?
        .filter(|&hz| hz > 0)
        .ok_or("CLK_TCK unknown")?;
    Ok(Duration::from_secs_f64(total as f64 / hz as f64))
}

/// The executable `name` next to this example (target/<profile>/…), unless `env` names one.
fn sibling(env: &str, relative: &[&str]) -> Result<PathBuf, Error> {
    if let Ok(path) = std::env::var(env) {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe()?;
    let examples = me.parent().ok_or("no folder for this example")?;
    let mut path = examples.to_path_buf();
    for part in relative {
        path.push(part);
    }
    if !path.exists() {
        return Err(format!(
            "{} is missing; build it first (cargo build --release -p graph-relay --bin graph-relay --example rmcp_echo --example vs_rmcp) or set {env}",
            path.display()
        )
        .into());
    }
    Ok(path)
}

/// Reads `child`'s stream line by line until one contains `marker`, and
/// returns what follows it up to the next space; the rest is drained.
async fn announced<R>(stream: R, marker: &'static str) -> Result<String, Error>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split(marker).nth(1)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                );
            } else if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("server | {line}");
            }
        }
    });
    Ok(tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .map_err(|_| format!("no `{marker}` within 30 s"))?
        .map_err(|_| format!("exited before printing `{marker}`"))?)
}

/// The address part of `http://host:port/mcp`.
fn host_port(url: &str) -> Result<String, Error> {
    Ok(url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| format!("unexpected URL {url}"))?
        .to_owned())
}

fn graph_relay_body(id: usize, command: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_graph_run","arguments":{{"command_id":"{command}"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    )
}

fn echo_body(id: usize, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
    )
}

/// Starts `graph-relay serve` on a SQLite file in `dir` with one queued run
/// of the bench agent, and returns it with that run's command id.
async fn start_graph_relay(dir: &Path) -> Result<Target, Error> {
    let db = dir.join("queue.db");
    {
        // One shared session, synced by the owner's desktop, straight into the file.
        let store = Arc::new(graph_relay_store_sqlite::SqliteStore::open(&db)?);
        let queue = Queue::new(
            store,
            Arc::new(SystemClock),
            Arc::new(RandomIds),
            QueueConfig::default(),
        );
        let device = Device::new(DeviceId::parse("desktop")?, OwnerId::parse("alice")?);
        queue
            .sync(
                &device,
                &SyncRequest {
                    project: ProjectId::parse("p1")?,
                    sessions: vec![SessionMeta {
                        graph_session_id: GraphSessionId::parse(GS)?,
                        name: "Bench".into(),
                        description: "".into(),
                        slug: "bench".into(),
                        version: "1".into(),
                        status: "ready".into(),
                    }],
                    long_poll: false,
                    restarted: false,
                    running: None,
                },
            )
            .await?;
    }
    let config = dir.join("graph-relay.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nmax_connections = 1024\n\n[[agent]]\nname = \"bench\"\nowner = \"alice\"\nprojects = [\"p1\"]\nscopes = [\"{READ_SCOPE}\", \"{RUN_SCOPE}\"]\ntoken_sha256 = \"{}\"\n",
            hash_token(TOKEN)
        ),
    )?;
    let mut child = Command::new(sibling("GRAPH_RELAY_BIN", &["..", "graph-relay"])?)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--db")
        .arg(&db)
        .env("GRAPH_RELAY_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("graph-relay exited at once")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let addr = host_port(&announced(stderr, "serving MCP at ").await?)?;
    let head = |tool: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {TOKEN}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n"
        )
    };
    // Queue the run that every `get_graph_run` reads, through MCP.
    let run = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"run_graph_session","arguments":{{"graph_session_id":"{GS}","idempotency_key":"vs-rmcp-run-1"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    );
    let mut connection = Connection::open(&addr).await?;
    let (status, body) = connection
        .exchange(&request(&head("run_graph_session"), &run))
        .await?;
    let reply: serde_json::Value = serde_json::from_slice(body)?;
    let command = reply["result"]["structuredContent"]["command_id"]
        .as_str()
        .filter(|_| status == 200)
        .ok_or_else(|| {
            format!(
                "run_graph_session failed ({status}): {}",
                String::from_utf8_lossy(body)
            )
        })?
        .to_owned();
    Ok(Target {
        label: "graph-relay get_graph_run (sqlite)",
        pid,
        head: head("get_graph_run"),
        body: graph_relay_body,
        expect: format!(r#"\"command_id\":\"{command}\""#),
        argument: command,
        addr,
        child,
    })
}

/// Starts the `rmcp_echo` example.
async fn start_rmcp() -> Result<Target, Error> {
    let mut child = Command::new(sibling("RMCP_ECHO_BIN", &["rmcp_echo"])?)
        .arg("127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("rmcp_echo exited at once")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let addr = host_port(&announced(stdout, "listening on ").await?)?;
    Ok(Target {
        label: "rmcp 3.x echo (stateless JSON)",
        pid,
        head: format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        ),
        body: echo_body,
        expect: ECHO_TEXT.to_owned(),
        argument: ECHO_TEXT.to_owned(),
        addr,
        child,
    })
}

fn request(head: &str, body: &str) -> Vec<u8> {
    format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// One keep-alive HTTP/1.1 connection.
struct Connection {
    stream: BufReader<TcpStream>,
    line: String,
    body: Vec<u8>,
}

impl Connection {
    async fn open(addr: &str) -> Result<Self, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::with_capacity(16 * 1024, stream),
            line: String::new(),
            body: Vec::with_capacity(4096),
        })
    }

    /// Sends `request` and reads the answer: its status and body
    /// (`Content-Length` or chunked).
    async fn exchange(&mut self, request: &[u8]) -> Result<(u16, &[u8]), Error> {
        self.stream.get_mut().write_all(request).await?;
        self.line.clear();
        self.stream.read_line(&mut self.line).await?;
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("not an HTTP status line: {:?}", self.line))?;
        let mut length = None;
        let mut chunked = false;
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                return Err("connection closed in the head".into());
            }
            let line = self.line.trim_end();
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
        self.body.clear();
        if chunked {
            loop {
                self.line.clear();
                self.stream.read_line(&mut self.line).await?;
                let size = usize::from_str_radix(self.line.trim_end(), 16)?;
                if size == 0 {
                    self.line.clear();
                    self.stream.read_line(&mut self.line).await?;
                    break;
                }
                let start = self.body.len();
                self.body.resize(start + size + 2, 0);
                self.stream.read_exact(&mut self.body[start..]).await?;
                self.body.truncate(start + size);
            }
        } else {
            let length = length.ok_or("an answer without Content-Length")?;
            self.body.resize(length, 0);
            self.stream.read_exact(&mut self.body).await?;
        }
        Ok((status, &self.body))
    }
}

/// What one connection measured.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
}

/// True when `body` is the right answer to request `id`: cheap substring
/// checks on every answer; `parse` adds a full JSON decode (every 256th).
fn right_answer(body: &[u8], id: usize, expect: &str, parse: bool) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    let id_ok = [",", "}"]
        .iter()
        .any(|end| text.contains(&format!("\"id\":{id}{end}")));
    if !(id_ok && text.contains("\"isError\":false") && text.contains(expect)) {
        return false;
    }
    if !parse {
        return true;
    }
    serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| {
        v["id"] == id
            && v["result"]["isError"] == false
            && v["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains(expect.replace("\\\"", "\"").as_str()))
    })
}

/// Drives `target` with `connections` connections until `until`; answers
/// arriving before `from` are warm-up and not counted.
async fn drive(
    target: &Target,
    connections: usize,
    from: Instant,
    until: Instant,
) -> Result<Vec<Tally>, Error> {
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..connections {
        let id = index + 1;
        let bytes = request(&target.head, &(target.body)(id, &target.argument));
        let expect = target.expect.clone();
        let addr = target.addr.clone();
        tasks.spawn(async move {
            let mut connection = Connection::open(&addr).await?;
            let mut tally = Tally::default();
            let mut n = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let (status, body) = connection.exchange(&bytes).await?;
                let done = Instant::now();
                n += 1;
                if status != 200 || !right_answer(body, id, &expect, n % 256 == 1) {
                    return Err::<Tally, Error>(
                        format!(
                            "wrong answer ({status}) on connection {id}: {}",
                            String::from_utf8_lossy(body)
                        )
                        .into(),
                    );
                }
                if sent >= from {
                    tally
                        .latencies_us
                        .push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX));
                }
            }
            Ok(tally)
        });
    }
    let mut tallies = Vec::with_capacity(connections);
    while let Some(joined) = tasks.join_next().await {
        tallies.push(joined.map_err(|e| format!("a connection task failed: {e}"))??);
    }
    Ok(tallies)
}

/// One measured window of one server.
#[derive(Clone, Copy)]
struct Round {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
}

async fn measure(target: &Target, options: &Options, dir: &Path) -> Result<Round, Error> {
    if options.client == Client::Wrk {
        return measure_with_wrk(target, options, dir).await;
    }
    let warm_up = Duration::from_secs(1);
    let window = Duration::from_secs_f64(options.seconds);
    let start = Instant::now();
    let from = start + warm_up;
    let until = from + window;
    let pid = target.pid;
    // The CPU window is the counted window: sampled when it opens and closes.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let before = cpu_time(pid)?;
        tokio::time::sleep_until(until.into()).await;
        Ok::<_, Error>(cpu_time(pid)? - before)
    });
    let tallies = drive(target, options.connections, from, until).await?;
    let cpu = cpu.await??;
    let mut latencies: Vec<u32> = tallies.into_iter().flat_map(|t| t.latencies_us).collect();
    if latencies.is_empty() {
        return Err(format!("{}: no answers in the window", target.label).into());
    }
    latencies.sort_unstable();
    let at = |q: f64| {
        f64::from(latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)])
    };
    let n = latencies.len() as f64;
    Ok(Round {
        rate: n / window.as_secs_f64(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / n,
    })
}

/// A wrk script that sends `target`'s request (the body of connection 1)
/// with the same headers as the built-in client.
fn wrk_script(target: &Target) -> String {
    let body = (target.body)(1, &target.argument);
    let mut script = format!("wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\n");
    // The head's lines after the request line; wrk sets `Host` itself.
    for line in target.head.lines().skip(1) {
        if let Some((name, value)) = line.split_once(':')
            && !name.eq_ignore_ascii_case("host")
        {
            script.push_str(&format!(
                "wrk.headers[\"{name}\"] = [==[{}]==]\n",
                value.trim()
            ));
        }
    }
    script
}

/// A wrk duration (`687.00us`, `2.03ms`, `1.10s`) in microseconds.
fn wrk_micros(text: &str) -> Result<f64, Error> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e6)
    } else {
        return Err(format!("not a wrk duration: {text}").into());
    };
    Ok(number.parse::<f64>()? * scale)
}

/// What wrk printed, read back: (answers, window, p50 µs, p99 µs).
fn parse_wrk(output: &str) -> Result<(f64, f64, f64, f64), Error> {
    let mut answers = None;
    let mut p50 = None;
    let mut p99 = None;
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", value] => p50 = Some(wrk_micros(value)?),
            ["99%", value] => p99 = Some(wrk_micros(value)?),
            [n, "requests", "in", window, ..] => {
                let window = wrk_micros(window.trim_end_matches(','))? / 1e6;
                answers = Some((n.parse::<f64>()?, window));
            }
            ["Non-2xx", ..] => return Err(format!("wrk saw wrong answers: {line}").into()),
            ["Socket", "errors:", ..] => {
                return Err(format!("wrk saw socket errors: {line}").into());
            }
            _ => {}
        }
    }
    let (n, window) = answers.ok_or("wrk printed no request count")?;
    Ok((
        n,
        window,
        p50.ok_or("wrk printed no p50")?,
        p99.ok_or("wrk printed no p99")?,
    ))
}

/// One window of `target` under wrk, after the built-in client checked
/// every connection's answer (0.3 s, not counted).
async fn measure_with_wrk(target: &Target, options: &Options, dir: &Path) -> Result<Round, Error> {
    let check_until = Instant::now() + Duration::from_millis(300);
    drive(target, options.connections, check_until, check_until).await?;
    let script = dir.join(format!("wrk-{}.lua", target.pid));
    std::fs::write(&script, wrk_script(target))?;
    let seconds = options.seconds.round().max(1.0);
    let before = cpu_time(target.pid)?;
    let output = Command::new(std::env::var("WRK_BIN").unwrap_or_else(|_| "wrk".into()))
        .args(["-t1", "--latency", "-c"])
        .arg(options.connections.to_string())
        .arg("-d")
        .arg(format!("{seconds}s"))
        .arg("-s")
        .arg(&script)
        .arg(format!("http://{}/mcp", target.addr))
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| {
            format!("cannot run wrk ({e}); install it (apt-get install wrk) or set WRK_BIN")
        })?;
    let cpu = cpu_time(target.pid)? - before;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "wrk failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let (n, window, p50_us, p99_us) = parse_wrk(&text)?;
    if n == 0.0 {
        return Err(format!("{}: wrk got no answers", target.label).into());
    }
    Ok(Round {
        rate: n / window,
        p50_us,
        p99_us,
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / n,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn summary(label: &str, rounds: &[Round]) -> Round {
    let pick = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let m = Round {
        rate: pick(|r| r.rate),
        p50_us: pick(|r| r.p50_us),
        p99_us: pick(|r| r.p99_us),
        cpu_us_per_request: pick(|r| r.cpu_us_per_request),
    };
    println!(
        "{label:<36} {:>8.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs  {:>6.1} µs CPU/req  (median of {})",
        m.rate,
        m.p50_us,
        m.p99_us,
        m.cpu_us_per_request,
        rounds.len()
    );
    m
}

/// Stops `child` with SIGTERM (so that a profiler wrapping it, e.g.
/// valgrind's callgrind through `GRAPH_RELAY_BIN`, writes its output), and
/// kills it if it has not exited within 60 s.
async fn stop(child: &mut Child) -> Result<(), Error> {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
    }
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}

fn main() -> Result<(), Error> {
    let options = Options::parse()?;
    // One client thread: the load generator shares the machine with both servers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&options))
}

async fn run(options: &Options) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let mut targets = [start_graph_relay(dir.path()).await?, start_rmcp().await?];
    let mut rounds: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=options.rounds {
        for (i, target) in targets.iter().enumerate() {
            let r = measure(target, options, dir.path()).await?;
            println!(
                "round {round} {:<36} {:>8.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs  {:>6.1} µs CPU/req",
                target.label, r.rate, r.p50_us, r.p99_us, r.cpu_us_per_request
            );
            rounds[i].push(r);
        }
    }
    println!();
    let ours = summary(targets[0].label, &rounds[0]);
    let theirs = summary(targets[1].label, &rounds[1]);
    let rate_ratio = ours.rate / theirs.rate;
    let cpu_ratio = ours.cpu_us_per_request / theirs.cpu_us_per_request;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "req/s ratio {rate_ratio:.2}× (budget ≥ {RATE_BUDGET}×: {}); CPU/req ratio {cpu_ratio:.2}× (budget ≤ {CPU_BUDGET}×: {})",
        verdict(rate_ratio >= RATE_BUDGET),
        verdict(cpu_ratio <= CPU_BUDGET)
    );
    for target in &mut targets {
        stop(&mut target.child).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK_OUTPUT: &str = "Running 10s test @ http://127.0.0.1:40001/mcp
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   812.33us  301.10us  12.02ms   90.12%
    Req/Sec    79.01k     2.10k   83.20k    71.00%
  Latency Distribution
     50%  765.00us
     75%  901.00us
     90%    1.05ms
     99%    2.03ms
  786123 requests in 10.00s, 401.12MB read
Requests/sec:  78612.30
Transfer/sec:     40.11MB
";

    #[test]
    fn wrk_output_is_read_back() {
        let (n, window, p50, p99) = parse_wrk(WRK_OUTPUT).unwrap();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(near(n, 786_123.0), "{n}");
        assert!(near(window, 10.0), "{window}");
        assert!(near(p50, 765.0), "{p50}");
        assert!(near(p99, 2030.0), "{p99}");
    }

    #[test]
    fn wrk_errors_end_the_run() {
        let wrong = WRK_OUTPUT.replace(
            "Requests/sec",
            "  Non-2xx or 3xx responses: 3\nRequests/sec",
        );
        assert!(
            parse_wrk(&wrong)
                .unwrap_err()
                .to_string()
                .contains("wrong answers")
        );
        let broken = WRK_OUTPUT.replace(
            "Requests/sec",
            "  Socket errors: connect 0, read 1, write 0, timeout 0\nRequests/sec",
        );
        assert!(
            parse_wrk(&broken)
                .unwrap_err()
                .to_string()
                .contains("socket errors")
        );
        assert!(parse_wrk("Running 10s test").is_err());
        assert!(wrk_micros("12parsecs").is_err());
        assert!((wrk_micros("1.50s").unwrap() - 1.5e6).abs() < 1e-3);
        assert!((wrk_micros("2.00m").unwrap() - 120e6).abs() < 1e-3);
    }
}
