//! Many agents waiting on `get_graph_run {wait_seconds}` at once: the CPU
//! they cost while they wait, and how soon each returns once its run ends.
//!
//! ```text
//! cargo run --release -p graph-relay --example waiters [-- N]     (N = 1000 by default)
//! ```
//!
//! One process, set up as `graph-relay serve --max-wait-seconds 25` sets
//! itself up: a SQLite store in a temporary folder, the catalog offering
//! `wait_seconds` up to 25 s, the tokio timer ([`TokioSleeper`]) and the real
//! router on 127.0.0.1:0 behind a bearer token.
//!
//! 1. A device shares a session; the agent queues N runs and the relay side
//!    starts them (`running`), all through the [`Queue`].
//! 2. N concurrent `tools/call get_graph_run {command_id, wait_seconds: 25}`
//!    requests over loopback HTTP/1.1 (one connection each).
//! 3. Once all N are parked on the queue's signals, the process's CPU time
//!    (user + system, `/proc/self/stat`) is read across a 3 s window in which
//!    nothing happens: the figure is what N waiting calls cost, beside the
//!    same window measured before any call was opened (the floor). On SQLite
//!    a waiter does not re-read the store on its own (the queue watches the
//!    file for other processes' writes, see
//!    [`Queue::external_writes_fed`](graph_relay_core::queue::Queue::external_writes_fed));
//!    nothing else runs.
//! 4. The relay side completes the N runs one after another, as fast as the
//!    store allows. For each call: the delay from the moment its run's
//!    completion was submitted to the queue to the moment the HTTP response
//!    was in the client's hands (p50, p99, max; the budget is 50 ms each).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_sqlite::SqliteStore;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::{HttpConfig, HttpState, TokioSleeper, router};
use serde_json::{Value, json};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const AGENT_TOKEN: &str = "gra_waiters_bench_token";
/// The `--max-wait-seconds` of the server, and what every call asks for.
const WAIT_SECONDS: u32 = 25;
/// How long the process is watched while every call waits.
const IDLE_WINDOW: Duration = Duration::from_secs(3);
/// Each call must return within this of its run's completion.
const BUDGET: Duration = Duration::from_millis(50);
/// Linux reports process times in ticks of 1/100 s (`USER_HZ`).
const TICKS_PER_SECOND: u64 = 100;

/// User + system CPU time of this process so far.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start at
    // field 3 (state); utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / TICKS_PER_SECOND,
    ))
}

/// CPU time this process spends across [`IDLE_WINDOW`], and the window's length.
async fn idle_cpu() -> Result<(Duration, Duration), &'static str> {
    let before = cpu_time().ok_or("cannot read /proc/self/stat")?;
    let start = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = cpu_time().ok_or("cannot read /proc/self/stat")?;
    Ok((after.saturating_sub(before), start.elapsed()))
}

fn cpu_percent(cpu: Duration, window: Duration) -> f64 {
    100.0 * cpu.as_secs_f64() / window.as_secs_f64()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One waiting call's outcome: when it returned and the run's status in it.
struct Returned {
    at: Instant,
    status: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("N must be a positive number, not `{arg}`"))?,
        None => 1000,
    };
    if n == 0 {
        return Err("N must be at least 1".into());
    }

    // The server, as `serve --max-wait-seconds 25` builds it.
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("queue.db"))?);
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(WAIT_SECONDS))
        .build()?;
    let server = McpServer::new(
        queue.clone(),
        catalog,
        ServerInfo::new("graph-relay", env!("CARGO_PKG_VERSION")),
    )
    .with_sleeper(Arc::new(TokioSleeper));
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "bench".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(AGENT_TOKEN),
            revoked: false,
        }],
        devices: vec![],
    };
    let state = HttpState::new(
        server,
        Arc::new(StaticTokens::new(&tokens)?),
        HttpConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });

    // A shared session, N queued runs, started by the relay side.
    let owner = OwnerId::parse("alice")?;
    let project = ProjectId::parse("p1")?;
    let device = Device::new(DeviceId::parse("desktop")?, owner.clone());
    queue
        .sync(
            &device,
            &SyncRequest {
                project: project.clone(),
                sessions: vec![SessionMeta {
                    graph_session_id: GraphSessionId::parse(GS)?,
                    name: "Bench".into(),
                    description: "".into(),
                    slug: "bench".into(),
                    version: "1".into(),
                    status: "ready".into(),
                }],
                long_poll: true,
                restarted: false,
                running: None,
            },
        )
        .await?;
    let agent = Agent::new(AgentId::parse("bench")?, owner, [project]);
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let ticket = queue
            .run_graph_session(
                &agent,
                RunArgs {
                    graph_session_id: GraphSessionId::parse(GS)?,
                    arguments: serde_json::Map::new(),
                    idempotency_key: IdempotencyKey::parse(&format!("waiters-key-{i:06}"))?,
                },
            )
            .await?;
        let id = ticket.command.id;
        let execution = ExecutionId::parse(&format!("exec-{i:06}"))?;
        queue.start(&device, &id, &execution).await?;
        runs.push((id, execution));
    }

    // The floor: the same process with nothing waiting.
    let (floor_cpu, floor_window) = idle_cpu().await?;

    // N concurrent waiting calls, one connection each.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .timeout(Duration::from_secs(u64::from(WAIT_SECONDS) + 10))
        .build()?;
    let returned_early = Arc::new(AtomicUsize::new(0));
    let opened = Instant::now();
    let mut calls = Vec::with_capacity(n);
    for (i, (id, _)) in runs.iter().enumerate() {
        let client = client.clone();
        let url = url.clone();
        let returned_early = returned_early.clone();
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "get_graph_run",
            "arguments": {"command_id": id.to_string(), "wait_seconds": WAIT_SECONDS},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        calls.push(tokio::spawn(async move {
            let reply: Value = client
                .post(&url)
                .bearer_auth(AGENT_TOKEN)
                .header("accept", "application/json")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "get_graph_run")
                .json(&body)
                .send()
                .await?
                .json()
                .await?;
            let at = Instant::now();
            returned_early.fetch_add(1, Ordering::Relaxed);
            let status = reply["result"]["structuredContent"]["status"]
                .as_str()
                .unwrap_or("(no status)")
                .to_owned();
            Ok::<_, reqwest::Error>(Returned { at, status })
        }));
    }
    let park_deadline = Instant::now() + Duration::from_secs(60);
    while queue.signals().waiting() < n {
        if Instant::now() > park_deadline {
            return Err(format!(
                "only {} of {n} calls parked within 60 s",
                queue.signals().waiting()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let parked_after = opened.elapsed();

    // The idle window: everything waits.
    let (cpu, window) = idle_cpu().await?;
    let early = returned_early.load(Ordering::Relaxed);
    let still_waiting = queue.signals().waiting();

    // Complete every run through the relay side, recording when.
    let mut completed_at = Vec::with_capacity(n);
    let completing = Instant::now();
    for (id, execution) in &runs {
        let envelope = ResultEnvelope::build(
            execution.clone(),
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!({"ok": true}),
                ..EnvelopeBody::default()
            },
        );
        completed_at.push(Instant::now());
        queue.complete(&device, id, &envelope).await?;
    }
    let completion_span = completing.elapsed();

    let mut delays = Vec::with_capacity(n);
    let mut not_completed = 0;
    for (call, done) in calls.into_iter().zip(completed_at) {
        let returned = call.await??;
        if returned.status != "completed" {
            not_completed += 1;
        }
        delays.push(returned.at.saturating_duration_since(done));
    }
    delays.sort_unstable();
    let over_budget = delays.iter().filter(|d| **d > BUDGET).count();

    println!(
        "waiters: {n} concurrent get_graph_run {{wait_seconds: {WAIT_SECONDS}}} over loopback HTTP/1.1, SQLite store, tokio timer"
    );
    println!("parked:  all {n} waiting after {:.0} ms", ms(parked_after));
    println!(
        "floor:   CPU {:.0} ms in {:.2} s = {:.2} % of one core with nothing waiting (user+sys, whole process)",
        ms(floor_cpu),
        floor_window.as_secs_f64(),
        cpu_percent(floor_cpu, floor_window)
    );
    println!(
        "idle:    CPU {:.0} ms in {:.2} s = {:.2} % of one core with {n} waiting ({still_waiting} parked at the end, {early} returned early; each re-reads the store once a second)",
        ms(cpu),
        window.as_secs_f64(),
        cpu_percent(cpu, window)
    );
    println!(
        "wake:    {n} runs completed in {:.0} ms; completion -> call returned: p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        ms(completion_span),
        ms(percentile(&delays, 50.0)),
        ms(percentile(&delays, 99.0)),
        ms(percentile(&delays, 100.0)),
    );
    println!(
        "budget:  {} of {n} within {} ms; {not_completed} returned a status other than completed",
        n - over_budget,
        BUDGET.as_millis()
    );
    Ok(())
}
