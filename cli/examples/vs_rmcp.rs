//! `get_graph_run` of the real `graph-relay serve` (SQLite) beside two
//! baselines measured in the same run: a trivial rmcp `echo` tool
//! (streamable HTTP, stateless, JSON responses) and the `fixed_reply`
//! example (serve's own HTTP stack answering a fixed result of the same
//! size as ours: the ceiling of that stack). For each: requests/s, p50/p99
//! latency and the server's CPU per request (utime + stime from
//! `/proc/<pid>/stat` over the window); then the ratios against the
//! README's budgets: ≥ 1.5× rmcp's requests/s at ≤ 0.67× its CPU per
//! request, and ≥ 0.5× the ceiling's requests/s.
//!
//! The run read is finished by default (`--run finished`): completed in
//! the SQLite file before the server starts, so that after the first read
//! the server answers from its queue's copy of finished runs, with no store
//! read, as it does for an agent polling a run that has ended. `--run
//! queued` reads a run queued through MCP instead, which costs a SQLite
//! read every time (a run still waiting for its desktop).
//!
//! Each round also runs `--lifecycles` whole Graph runs (run → sync →
//! start → complete → get) on a SQLite store, 64 in flight, with the
//! `sqlite_lifecycle_loop` example of graph-relay-store-sqlite, and sets
//! its CPU per lifecycle (every thread of that process) beside the rmcp
//! echo's CPU per request of the same round: the budget is ≤ 0.8×.
//!
//! The servers are child processes (this example's siblings in the target
//! folder: the `graph-relay` binary and the `rmcp_echo` and `fixed_reply`
//! examples), loaded in turn by the same client: `--connections` keep-alive HTTP/1.1
//! connections on one thread, each sending its next request when the last
//! answer arrived. Every answer is checked (status, id, `isError: false`,
//! the expected content); a wrong one ends the run with a non-zero exit.
//!
//! ```text
//! cargo build --release -p graph-relay --bin graph-relay --example rmcp_echo --example fixed_reply --example vs_rmcp
//! cargo build --release -p graph-relay-store-sqlite --example sqlite_lifecycle_loop
//! target/release/examples/vs_rmcp [--seconds 10] [--rounds 3] [--connections 64] [--client builtin|wrk] [--lifecycles 20000] [--run finished|queued]
//! ```
//!
//! `GRAPH_RELAY_BIN`, `RMCP_ECHO_BIN`, `FIXED_REPLY_BIN` and
//! `SQLITE_LIFECYCLE_BIN` name the executables elsewhere; `--lifecycles 0`
//! leaves the lifecycles out.
//!
//! `--client wrk` loads both servers with [wrk](https://github.com/wg/wrk)
//! instead (one thread, the same connections and requests, a Lua script
//! written per server): wrk costs
//! the shared machine far less per request than this example's own client,
//! so both servers get more of the two cores. wrk does not read the
//! answers' bodies, so before every wrk window the built-in client sends
//! each connection's request once and checks the answer in full; wrk's own
//! count of non-2xx answers and socket errors must be zero.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_core::prelude::*;
use graph_relay_transport_http::auth::hash_token;
use tokio::process::Command;

// The baselines and the client, shared with `graph-relay loadtest`, which
// uses all of the module where this example uses most of it.
#[allow(dead_code)]
#[path = "../src/baseline.rs"]
mod baseline;

use baseline::{
    Connection, Error, Round, Target, announced, cpu_time, example_binary, host_port, mcp_head,
    request,
};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const TOKEN: &str = "vs-rmcp-bench-token";
/// `get_graph_run` must reach at least this multiple of rmcp's requests/s…
const RATE_BUDGET: f64 = 1.5;
/// …at no more than this multiple of its server CPU per request…
const CPU_BUDGET: f64 = 0.67;
/// …and at least this share of the fixed reply's requests/s (the ceiling
/// of serve's HTTP stack).
const CEILING_BUDGET: f64 = 0.5;
/// A SQLite lifecycle at 64 in flight costs at most this multiple of the
/// rmcp echo's CPU per request.
const LIFECYCLE_BUDGET: f64 = 0.8;
/// Lifecycles in flight in the SQLite loop.
const LIFECYCLES_IN_FLIGHT: u32 = 64;

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
    /// Lifecycles per round of the SQLite loop (0: none).
    lifecycles: u64,
    /// The state of the run every `get_graph_run` reads.
    run: RunState,
}

/// The run that `get_graph_run` reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RunState {
    /// Completed before the server starts: after the first read the queue
    /// answers from its copy of finished runs, with no store read.
    Finished,
    /// Queued through MCP: every read is a SQLite read.
    Queued,
}

impl Options {
    fn parse() -> Result<Self, Error> {
        let mut options = Self {
            seconds: 10.0,
            rounds: 3,
            connections: 64,
            client: Client::Builtin,
            lifecycles: 20_000,
            run: RunState::Finished,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--seconds" => options.seconds = value.parse()?,
                "--rounds" => options.rounds = value.parse()?,
                "--connections" => options.connections = value.parse()?,
                "--lifecycles" => options.lifecycles = value.parse()?,
                "--run" => {
                    options.run = match value.as_str() {
                        "finished" => RunState::Finished,
                        "queued" => RunState::Queued,
                        other => {
                            return Err(format!("--run is finished or queued, not {other}").into());
                        }
                    }
                }
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
                        "unknown flag {other}; use --seconds N, --rounds N, --connections N, --client builtin|wrk, --lifecycles N, --run finished|queued"
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

fn graph_relay_body(id: usize, command: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_graph_run","arguments":{{"command_id":"{command}"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    )
}

/// The `graph-relay` binary: `GRAPH_RELAY_BIN`, else the one built beside
/// this example (target/<profile>/graph-relay).
fn graph_relay_binary() -> Result<std::path::PathBuf, Error> {
    if let Ok(path) = std::env::var("GRAPH_RELAY_BIN") {
        return Ok(path.into());
    }
    let me = std::env::current_exe()?;
    let path = me
        .parent()
        .and_then(Path::parent)
        .ok_or("no folder for this example")?
        .join("graph-relay");
    if !path.is_file() {
        return Err(format!(
            "{} is missing; build it first (cargo build --release -p graph-relay --bin graph-relay) or set GRAPH_RELAY_BIN",
            path.display()
        )
        .into());
    }
    Ok(path)
}

/// Starts `graph-relay serve` on a SQLite file in `dir` with one run of
/// the bench agent in state `run`, and returns it with that run's command id.
async fn start_graph_relay(dir: &Path, run: RunState) -> Result<Target, Error> {
    let db = dir.join("queue.db");
    let finished = match run {
        RunState::Finished => Some(finished_run(&db).await?),
        RunState::Queued => {
            share_session(&db).await?;
            None
        }
    };
    let config = dir.join("graph-relay.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nmax_connections = 1024\n\n[[agent]]\nname = \"bench\"\nowner = \"alice\"\nprojects = [\"p1\"]\nscopes = [\"{READ_SCOPE}\", \"{RUN_SCOPE}\"]\ntoken_sha256 = \"{}\"\n",
            hash_token(TOKEN)
        ),
    )?;
    let mut child = Command::new(graph_relay_binary()?)
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
        let extra = format!(
            "Authorization: Bearer {TOKEN}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n"
        );
        mcp_head(&addr, &extra)
    };
    let (label, command) = match finished {
        Some(command) => ("graph-relay get_graph_run (finished)", command),
        None => (
            "graph-relay get_graph_run (queued)",
            queue_over_mcp(&addr, &head("run_graph_session")).await?,
        ),
    };
    Ok(Target {
        label,
        pid,
        head: head("get_graph_run"),
        body: graph_relay_body,
        expect: format!(r#"\"command_id\":\"{command}\""#),
        argument: command,
        addr,
        child,
    })
}

/// The bench's queue on the SQLite file at `db`, as the server will open it.
fn bench_queue(db: &Path) -> Result<Queue, Error> {
    let store = Arc::new(graph_relay_store_sqlite::SqliteStore::open(db)?);
    Ok(Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    ))
}

/// The owner's desktop and its sync sharing the bench session.
fn bench_desktop() -> Result<(Device, SyncRequest), Error> {
    let device = Device::new(DeviceId::parse("desktop")?, OwnerId::parse("alice")?);
    let sync = SyncRequest {
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
    };
    Ok((device, sync))
}

/// Shares the bench session from the owner's desktop, straight into the file.
async fn share_session(db: &Path) -> Result<(), Error> {
    let (device, sync) = bench_desktop()?;
    bench_queue(db)?.sync(&device, &sync).await?;
    Ok(())
}

/// Shares the bench session, then queues, hands out, starts and completes
/// one run of the bench agent, straight into the file; returns its id.
async fn finished_run(db: &Path) -> Result<String, Error> {
    let queue = bench_queue(db)?;
    let (device, sync) = bench_desktop()?;
    queue.sync(&device, &sync).await?;
    let agent = bench_agent()?;
    let ticket = queue
        .run_graph_session(
            &agent,
            RunArgs {
                graph_session_id: GraphSessionId::parse(GS)?,
                arguments: serde_json::Map::new(),
                idempotency_key: IdempotencyKey::parse("vs-rmcp-run-1")?,
            },
        )
        .await?;
    let id = ticket.command.id;
    queue.sync(&device, &sync).await?;
    let execution = ExecutionId::parse("vs-rmcp-execution-1")?;
    queue.start(&device, &id, &execution).await?;
    let result = ResultEnvelope::build(
        execution,
        FinishStatus::Completed,
        EnvelopeBody {
            result: serde_json::json!({ "summary": "the bench graph ran", "rows": 3 }),
            total_tokens: Some(42),
            reported_cost: Some(0.5),
            error: None,
        },
    );
    queue.complete(&device, &id, &result).await?;
    Ok(id.to_string())
}

/// The agent the server's configuration names (`bench` of `alice`).
fn bench_agent() -> Result<Agent, Error> {
    Ok(Agent::new(
        AgentId::parse("bench")?,
        OwnerId::parse("alice")?,
        [ProjectId::parse("p1")?],
    ))
}

/// Queues a run of the bench session through MCP at `addr` (`head` is
/// `run_graph_session`'s request head); returns its command id.
async fn queue_over_mcp(addr: &str, head: &str) -> Result<String, Error> {
    let run = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"run_graph_session","arguments":{{"graph_session_id":"{GS}","idempotency_key":"vs-rmcp-run-1"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    );
    let mut connection = Connection::open(addr).await?;
    let (status, body) = connection.exchange(&request(head, &run)).await?;
    let reply: serde_json::Value = serde_json::from_slice(body)?;
    Ok(reply["result"]["structuredContent"]["command_id"]
        .as_str()
        .filter(|_| status == 200)
        .ok_or_else(|| {
            format!(
                "run_graph_session failed ({status}): {}",
                String::from_utf8_lossy(body)
            )
        })?
        .to_owned())
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
    baseline::drive(target, options.connections, check_until, check_until).await?;
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

fn main() -> Result<(), Error> {
    let options = Options::parse()?;
    // One client thread: the load generator shares the machine with the servers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&options))
}

/// One window of `target` with the chosen client.
async fn measure(target: &Target, options: &Options, dir: &Path) -> Result<Round, Error> {
    match options.client {
        Client::Builtin => baseline::measure(target, options.connections, options.seconds).await,
        Client::Wrk => measure_with_wrk(target, options, dir).await,
    }
}

/// The size of `target`'s answer to connection 1's request.
async fn answer_size(target: &Target) -> Result<usize, Error> {
    let mut connection = Connection::open(&target.addr).await?;
    let bytes = request(&target.head, &(target.body)(1, &target.argument));
    let (status, body) = connection.exchange(&bytes).await?;
    if status != 200 {
        return Err(format!("{} answered {status}", target.label).into());
    }
    Ok(body.len())
}

/// Prints the medians of `rounds` for `label`, and returns them.
fn summary(label: &str, rounds: &[Round]) -> Round {
    let m = baseline::median_round(rounds);
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

async fn run(options: &Options) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let ours = start_graph_relay(dir.path(), options.run).await?;
    let reply_bytes = answer_size(&ours).await?;
    let echo = baseline::start_rmcp_echo(&example_binary("RMCP_ECHO_BIN", "rmcp_echo")?).await?;
    let fixed = example_binary("FIXED_REPLY_BIN", "fixed_reply")?;
    let ceiling = baseline::start_fixed_reply(&fixed, reply_bytes).await?;
    let lifecycle_loop = (options.lifecycles > 0)
        .then(|| example_binary("SQLITE_LIFECYCLE_BIN", "sqlite_lifecycle_loop"))
        .transpose()?;
    let mut targets = [ours, echo, ceiling];
    let mut rounds: [Vec<Round>; 3] = Default::default();
    let mut lifecycles = Vec::new();
    for round in 1..=options.rounds {
        for (target, measured) in targets.iter().zip(&mut rounds) {
            let r = measure(target, options, dir.path()).await?;
            println!(
                "round {round} {:<36} {:>8.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs  {:>6.1} µs CPU/req",
                target.label, r.rate, r.p50_us, r.p99_us, r.cpu_us_per_request
            );
            measured.push(r);
        }
        if let Some(exe) = &lifecycle_loop {
            let l = lifecycle_round(exe, options.lifecycles).await?;
            println!(
                "round {round} {:<36} {:>8.0} lifecycles/s  {:>6.1} µs CPU/lifecycle",
                "SQLite lifecycles, 64 in flight", l.rate, l.cpu_us
            );
            lifecycles.push(l);
        }
    }
    println!("\n(answers of {reply_bytes} bytes from graph-relay and the fixed reply)");
    let [ours, echo, ceiling] = [0, 1, 2].map(|i| summary(targets[i].label, &rounds[i]));
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let rate_ratio = ours.rate / echo.rate;
    let cpu_ratio = ours.cpu_us_per_request / echo.cpu_us_per_request;
    println!(
        "vs rmcp echo: req/s {rate_ratio:.2}× (budget ≥ {RATE_BUDGET}×: {}); CPU/req {cpu_ratio:.2}× (budget ≤ {CPU_BUDGET}×: {})",
        verdict(rate_ratio >= RATE_BUDGET),
        verdict(cpu_ratio <= CPU_BUDGET)
    );
    let share = ours.rate / ceiling.rate;
    println!(
        "vs the fixed reply (the ceiling): req/s {share:.2}× (budget ≥ {CEILING_BUDGET}×: {}); CPU/req {:.2}×",
        verdict(share >= CEILING_BUDGET),
        ours.cpu_us_per_request / ceiling.cpu_us_per_request
    );
    if !lifecycles.is_empty() {
        let median = |f: fn(&Lifecycles) -> f64| {
            let mut v: Vec<f64> = lifecycles.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (rate, cpu_us) = (median(|l| l.rate), median(|l| l.cpu_us));
        let ratio = cpu_us / echo.cpu_us_per_request;
        println!(
            "SQLite lifecycles, {LIFECYCLES_IN_FLIGHT} in flight: {rate:.0}/s, {cpu_us:.1} µs CPU each (medians of {}): {ratio:.2}× the rmcp echo's CPU/req (budget ≤ {LIFECYCLE_BUDGET}×: {})",
            lifecycles.len(),
            verdict(ratio <= LIFECYCLE_BUDGET)
        );
    }
    for target in &mut targets {
        baseline::stop(&mut target.child).await?;
    }
    Ok(())
}

/// One round of the SQLite lifecycle loop.
struct Lifecycles {
    /// Lifecycles a second.
    rate: f64,
    /// CPU of every thread of the loop's process per lifecycle, µs.
    cpu_us: f64,
}

/// Runs `lifecycles` SQLite lifecycles with the loop at `exe` and reads
/// its figures.
async fn lifecycle_round(exe: &Path, lifecycles: u64) -> Result<Lifecycles, Error> {
    let output = Command::new(exe)
        .arg(lifecycles.to_string())
        .arg(LIFECYCLES_IN_FLIGHT.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!("{} ended with {}", exe.display(), output.status).into());
    }
    parse_lifecycles(&String::from_utf8_lossy(&output.stdout))
}

/// The rate (first line, `… : N lifecycles/s`) and the total CPU per
/// lifecycle (the `total … µs/lifecycle` line) the loop prints.
fn parse_lifecycles(output: &str) -> Result<Lifecycles, Error> {
    let unreadable = || format!("the lifecycle loop printed no figures:\n{output}");
    let rate = output
        .lines()
        .next()
        .and_then(|l| {
            l.rsplit_once(": ")?
                .1
                .strip_suffix(" lifecycles/s")?
                .parse()
                .ok()
        })
        .ok_or_else(unreadable)?;
    let cpu_us = output
        .lines()
        .find_map(|l| {
            let rest = l.trim_start().strip_prefix("total ")?;
            let (_, per) = rest.rsplit_once("s CPU")?;
            per.trim().strip_suffix("µs/lifecycle")?.trim().parse().ok()
        })
        .ok_or_else(unreadable)?;
    Ok(Lifecycles { rate, cpu_us })
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
    fn the_finished_run_is_in_the_file_for_the_bench_agent() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("queue.db");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let id = finished_run(&db).await.expect("a finished run");
            // Read back by a fresh queue over the same file, as the server does.
            let id = CommandId::parse(&id).expect("a command id");
            let view = bench_queue(&db)
                .expect("open")
                .get_graph_run(&bench_agent().expect("agent"), &id)
                .await
                .expect("the bench agent reads its run");
            assert_eq!(view.command.status, CommandStatus::Completed);
            assert_eq!(view.poll_after_seconds, None, "terminal: nothing to poll");
        });
    }

    #[test]
    fn the_lifecycle_loop_is_read_back() {
        let output = "20032 lifecycles, 64 in flight, in 1.903 s: 10526 lifecycles/s
  up to    20032:   10526 lifecycles/s
  4.21 SQL statements per lifecycle
  loop (1234)                         1.500 s CPU     74.9 µs/lifecycle
  sqlite-writer (1240)                0.400 s CPU     20.0 µs/lifecycle
  total                               1.900 s CPU     94.8 µs/lifecycle
";
        let l = parse_lifecycles(output).expect("read");
        assert_eq!(l.rate, 10526.0);
        assert_eq!(l.cpu_us, 94.8);
        assert!(parse_lifecycles("nothing here").is_err());
        assert!(parse_lifecycles(&output.replace("total", "sum")).is_err());
    }

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
