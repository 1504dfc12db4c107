//! The eight experiments of SPEC §8, each printing one table of our own
//! measurements, and one of ours (9, a desktop that dies mid-run). Every
//! world is seeded from the experiment seed, and the relay's phase is drawn
//! at random relative to each request.

use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::args::RunArgs;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::command::{CommandStatus, DESKTOP_RESTARTED, LEASE_LAPSED};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{CommandId, ExecutionId, GraphSessionId, IdempotencyKey};
use graph_relay_core::limits::RESULT_LIMIT;
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo, TASKS_EXTENSION};
use graph_relay_core::queue::{GetError, RUN_NOT_FOUND};
use graph_relay_core::relay::RelayMode;
use graph_relay_core::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::rng::SimRng;
use crate::stats::{Summary, Table, s1, s2};
use crate::world::{RunTime, START, World, WorldConfig};

/// The experiments by name, in order.
pub const NAMES: [&str; 9] = [
    "pickup",
    "five-at-once",
    "polling",
    "cancellation",
    "idempotency",
    "offline",
    "result-size",
    "second-agent",
    "desktop-dies",
];

/// What one experiment produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Its name (one of [`NAMES`]).
    pub name: &'static str,
    /// The printed table.
    pub table: Table,
    /// Every figure, for `--json`.
    pub figures: Value,
    /// Series for `--plot`.
    #[serde(skip)]
    pub plot: Plot,
}

/// A labelled point of a scatter chart: (x, y, label).
pub type LabelledPoint = (f64, f64, String);

/// Data for one chart.
#[derive(Debug, Clone, Default)]
pub enum Plot {
    /// No chart.
    #[default]
    None,
    /// Histograms of a quantity (label, seconds) per series.
    Histogram {
        /// x-axis label.
        x_label: String,
        /// (series name, values).
        series: Vec<(String, Vec<f64>)>,
    },
    /// Labelled points (x, y) per series.
    Points {
        /// x-axis label.
        x_label: String,
        /// y-axis label.
        y_label: String,
        /// (series name, points with labels).
        series: Vec<(String, Vec<LabelledPoint>)>,
    },
}

/// Runs the experiment `name` with `seed`.
pub fn run(name: &str, seed: u64) -> Option<Outcome> {
    Some(match name {
        "pickup" => pickup(seed, 2000),
        "five-at-once" => five_at_once(seed),
        "polling" => polling(seed, 2000),
        "cancellation" => cancellation(seed, 2000),
        "idempotency" => idempotency(seed, 200, 10),
        "offline" => offline(seed),
        "result-size" => result_size(),
        "second-agent" => second_agent(seed, 500),
        "desktop-dies" => desktop_dies(seed, 500),
        _ => return None,
    })
}

const MODES: [RelayMode; 2] = [RelayMode::Interval, RelayMode::LongPoll];

fn mode_name(mode: RelayMode) -> &'static str {
    match mode {
        RelayMode::Interval => "interval (published)",
        RelayMode::LongPoll => "long-poll",
    }
}

/// The request time in every world: 20 s after the start, so that the
/// relay's first pass (drawn in [0, 20) s) sets a random phase.
const REQUEST_AT: Duration = Duration::from_secs(20);

fn world(mode: RelayMode, rng: &mut SimRng) -> World {
    World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs_f64(rng.between(0.0, 20.0)),
        seed: rng.next_u64(),
        ..WorldConfig::default()
    })
}

fn key(n: u64) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("sim-key-{n:08}")).unwrap_or_else(|e| unreachable!("{e}"))
}

fn queue_run(w: &mut World, n: u64) -> CommandId {
    let args = RunArgs {
        graph_session_id: w.session.clone(),
        arguments: Map::new(),
        idempotency_key: key(n),
    };
    match block_on(w.queue.run_graph_session(&w.agent, args)) {
        Ok(ticket) => ticket.command.id,
        Err(e) => unreachable!("the shared session is always reachable: {e}"),
    }
}

fn secs_between(a: Timestamp, b: Timestamp) -> f64 {
    b.since(a).as_secs_f64()
}

fn summary_cells(s: &Summary) -> Vec<String> {
    vec![
        s.n.to_string(),
        s2(s.mean),
        s2(s.median),
        s2(s.p95),
        s2(s.max),
    ]
}

// ----- 1. pickup wait -------------------------------------------------------

/// Experiment 1: queued → started over `n` runs, per relay mode.
pub fn pickup(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "1. Pickup wait (queued -> started), seconds",
        &["relay", "runs", "mean", "median", "p95", "max"],
    );
    let mut figures = Map::new();
    let mut series = Vec::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut waits = Vec::with_capacity(n);
        for i in 0..n {
            let mut w = world(mode, &mut rng);
            w.run_until(START.plus(REQUEST_AT));
            let id = queue_run(&mut w, i as u64);
            let limit = w.now().plus(Duration::from_secs(120));
            w.run_while(limit, |w| {
                w.command(&w.agent, &id)
                    .is_some_and(|c| c.started_at.is_some())
            });
            if let Some(c) = w.command(&w.agent, &id)
                && let Some(started) = c.started_at
            {
                waits.push(secs_between(c.created_at, started));
            }
        }
        let s = Summary::of(&waits);
        let mut row = vec![mode_name(mode).to_string()];
        row.extend(summary_cells(&s));
        table.row(row);
        figures.insert(mode_name(mode).into(), json!(s));
        series.push((mode_name(mode).to_string(), waits));
    }
    table.note("Interval: the relay passes every 20 s at a random phase, so a run waits half an interval on average.");
    table.note("Long-poll: the held sync is answered as soon as the run is queued (25 ms one-way latency).");
    Outcome {
        name: "pickup",
        table,
        figures: Value::Object(figures),
        plot: Plot::Histogram {
            x_label: "pickup wait (s)".into(),
            series,
        },
    }
}

// ----- 2. five at once ------------------------------------------------------

/// Experiment 2: five runs queued at once start and end one after another.
pub fn five_at_once(seed: u64) -> Outcome {
    let mut table = Table::new(
        "2. Five runs queued at once: start and end, seconds after queueing",
        &[
            "run",
            "interval start",
            "interval end",
            "long-poll start",
            "long-poll end",
        ],
    );
    let mut cells: Vec<Vec<String>> = (1..=5).map(|i| vec![i.to_string()]).collect();
    let mut figures = Map::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut w = world(mode, &mut rng);
        w.run_until(START.plus(REQUEST_AT));
        let t0 = w.now();
        let ids: Vec<CommandId> = (0..5).map(|i| queue_run(&mut w, i)).collect();
        let limit = t0.plus(Duration::from_secs(3600));
        w.run_while(limit, |w| {
            ids.iter()
                .all(|id| w.status(id).is_some_and(CommandStatus::is_terminal))
        });
        let mut times = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let c = w.command(&w.agent, id);
            let start = c
                .as_ref()
                .and_then(|c| c.started_at)
                .map(|t| secs_between(t0, t));
            let end = c
                .as_ref()
                .and_then(|c| c.finished_at)
                .map(|t| secs_between(t0, t));
            cells[i].push(start.map_or("-".into(), s1));
            cells[i].push(end.map_or("-".into(), s1));
            times.push(json!({"start": start, "end": end}));
        }
        let overlaps = w
            .executions
            .windows(2)
            .filter(|p| p[0].ended.is_some_and(|e| e > p[1].started))
            .count();
        figures.insert(
            mode_name(mode).into(),
            json!({"runs": times, "overlapping_executions": overlaps}),
        );
    }
    for row in cells {
        table.row(row);
    }
    table.note("A desktop is a single worker: each run starts only after the previous one ended.");
    Outcome {
        name: "five-at-once",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

// ----- 3. polling strategies ------------------------------------------------

/// How an agent decides when to call `get_graph_run` next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// Every `n` seconds from the start.
    Fixed(f64),
    /// 1, 2, 4 … seconds, capped.
    Backoff {
        /// The cap.
        cap: f64,
    },
    /// First check after one relay interval, then every `then` seconds.
    FirstAfterInterval {
        /// The fixed period after the first check.
        then: f64,
    },
    /// Follow the server's `poll_after_seconds` hint.
    Hint,
    /// The tasks extension: `tasks/get` at the task's `pollIntervalMs`.
    Tasks,
    /// Call `get_graph_run` with `wait_seconds` of this many seconds.
    Wait(u32),
}

impl Strategy {
    fn name(self) -> String {
        match self {
            Self::Fixed(s) => format!("fixed {s} s"),
            Self::Backoff { cap } => format!("exponential backoff, cap {cap} s"),
            Self::FirstAfterInterval { then } => format!("first after 20 s, then {then} s"),
            Self::Hint => "poll_after_seconds hint".into(),
            Self::Tasks => "tasks extension (tasks/get at pollIntervalMs)".into(),
            Self::Wait(s) => format!("get_graph_run wait_seconds={s}"),
        }
    }
}

/// The strategies compared in experiment 3.
pub const STRATEGIES: [Strategy; 8] = [
    Strategy::Fixed(2.0),
    Strategy::Fixed(5.0),
    Strategy::Fixed(15.0),
    Strategy::Backoff { cap: 30.0 },
    Strategy::FirstAfterInterval { then: 5.0 },
    Strategy::Hint,
    Strategy::Tasks,
    Strategy::Wait(60),
];

/// One agent following `strategy` until it sees the run terminal: (tool
/// calls, detection delay). `tasks` is the client [`Strategy::Tasks`] polls with.
fn poll_run(
    w: &mut World,
    strategy: Strategy,
    first_hint: u64,
    id: CommandId,
    tasks: Option<&TasksClient>,
) -> Option<(f64, f64)> {
    let t0 = w.now();
    let limit = t0.plus(Duration::from_secs(3600));
    let mut calls = 0u32;
    let seen = |w: &World, calls: u32| {
        let finished = w.command(&w.agent, &id)?.finished_at?;
        Some((f64::from(calls), secs_between(finished, w.now())))
    };
    if let Strategy::Wait(secs) = strategy {
        while w.now() < limit {
            calls += 1;
            let view = w.wait_call(&id, Duration::from_secs(u64::from(secs)))?;
            if view.command.status.is_terminal() {
                return seen(w, calls);
            }
        }
        return None;
    }
    let mut next = match strategy {
        Strategy::Fixed(s) => s,
        Strategy::Backoff { .. } => 1.0,
        Strategy::FirstAfterInterval { .. } => 20.0,
        Strategy::Hint | Strategy::Tasks | Strategy::Wait(_) => first_hint as f64,
    };
    let mut backoff: f64 = 1.0;
    let tasks_get = tasks.map(|client| (client, TasksClient::get_request(&id)));
    let mut when = t0.plus(Duration::from_secs_f64(next));
    while when < limit {
        w.run_until(when);
        calls += 1;
        let hint = if strategy == Strategy::Tasks {
            let (client, request) = tasks_get.as_ref()?;
            let task = client.get(request)?;
            if task.status != "working" {
                return seen(w, calls);
            }
            task.poll_interval_ms.unwrap_or(5000) / 1000
        } else {
            let view = block_on(w.queue.get_graph_run(&w.agent, &id)).ok()?;
            if view.command.status.is_terminal() {
                return seen(w, calls);
            }
            view.poll_after_seconds.unwrap_or(5)
        };
        next = match strategy {
            Strategy::Fixed(s) => s,
            Strategy::Backoff { cap } => {
                backoff = (backoff * 2.0).min(cap);
                backoff
            }
            Strategy::FirstAfterInterval { then } => then,
            Strategy::Hint | Strategy::Tasks | Strategy::Wait(_) => hint.max(1) as f64,
        };
        when = w.now().plus(Duration::from_secs_f64(next));
    }
    None
}

/// A tasks-extension client of one world: the real MCP handling over the
/// world's queue. Made once per world and kept for every call: making the
/// server renders its `tools/list`, which costs more than a `tasks/get`.
struct TasksClient {
    server: McpServer,
    caller: Caller,
}

impl TasksClient {
    fn new(w: &World) -> Self {
        let server = McpServer::new(
            w.queue.clone(),
            ToolCatalog::published(),
            ServerInfo::new("graph-relay-sim", "0"),
        );
        let caller = Caller::new(w.agent.clone(), [READ_SCOPE, RUN_SCOPE]);
        Self { server, caller }
    }

    /// `tools/call run_graph_session` as a tasks client: (task id, first poll in seconds).
    fn run(&self, session: &GraphSessionId, n: u64) -> Option<(CommandId, u64)> {
        let body = modern_request(
            "tools/call",
            json!({"name": "run_graph_session", "arguments": {"graph_session_id": session, "idempotency_key": key(n)}}),
        );
        let reply = block_on(
            self.server
                .handle(&mut McpSession::new(), &self.caller, &body),
        )?;
        let task = reply.result_value()?;
        let id = CommandId::parse(task["taskId"].as_str()?).ok()?;
        Some((id, task["pollIntervalMs"].as_u64()? / 1000))
    }

    /// The `tasks/get` request for task `id`: the same bytes on every poll
    /// of that task, so a client writes them once.
    fn get_request(id: &CommandId) -> Vec<u8> {
        modern_request("tasks/get", json!({"taskId": id}))
    }

    /// `tasks/get` through the real MCP handling; the client reads only
    /// the two fields it acts on.
    fn get(&self, request: &[u8]) -> Option<TaskState> {
        let reply = block_on(
            self.server
                .handle(&mut McpSession::new(), &self.caller, request),
        )?;
        let reply: TaskReply = serde_json::from_slice(reply.as_bytes()).ok()?;
        Some(reply.result)
    }
}

/// A successful `tasks/get` reply, as far as the polling client reads it.
#[derive(Deserialize)]
struct TaskReply {
    result: TaskState,
}

/// What a tasks client acts on: whether the task still works, and when to ask again.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskState {
    status: String,
    poll_interval_ms: Option<u64>,
}

fn modern_request(method: &str, mut params: Value) -> Vec<u8> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
    });
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        .to_string()
        .into_bytes()
}

/// Experiment 3: tool calls per run and detection delay for each polling strategy.
pub fn polling(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "3. Polling get_graph_run: tool calls per run and detection delay (s)",
        &[
            "strategy",
            "interval calls",
            "interval delay",
            "interval p95",
            "long-poll calls",
            "long-poll delay",
            "long-poll p95",
        ],
    );
    let mut figures = Map::new();
    let mut series: Vec<(String, Vec<LabelledPoint>)> = MODES
        .iter()
        .map(|m| (mode_name(*m).to_string(), Vec::new()))
        .collect();
    for strategy in STRATEGIES {
        let mut row = vec![strategy.name()];
        let mut per_mode = Map::new();
        for (m, mode) in MODES.iter().enumerate() {
            let mut rng = SimRng::new(seed);
            let (mut calls, mut delays) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for i in 0..n {
                let mut w = world(*mode, &mut rng);
                w.run_until(START.plus(REQUEST_AT));
                let tasks = (strategy == Strategy::Tasks).then(|| TasksClient::new(&w));
                let started = if let Some(tasks) = &tasks {
                    tasks.run(&w.session, i as u64)
                } else {
                    let args = RunArgs {
                        graph_session_id: w.session.clone(),
                        arguments: Map::new(),
                        idempotency_key: key(i as u64),
                    };
                    block_on(w.queue.run_graph_session(&w.agent, args))
                        .ok()
                        .map(|t| (t.command.id, t.poll_after_seconds))
                };
                let Some((id, first_hint)) = started else {
                    continue;
                };
                if let Some((c, d)) = poll_run(&mut w, strategy, first_hint, id, tasks.as_ref()) {
                    calls.push(c);
                    delays.push(d);
                }
            }
            let (c, d) = (Summary::of(&calls), Summary::of(&delays));
            row.extend([s1(c.mean), s1(d.mean), s1(d.p95)]);
            per_mode.insert(
                mode_name(*mode).into(),
                json!({"tool_calls": c, "detection_delay": d}),
            );
            series[m].1.push((c.mean, d.mean, strategy.name()));
        }
        table.row(row);
        figures.insert(strategy.name(), Value::Object(per_mode));
    }
    table.note("Runs last a lognormal time (median 60 s, minimum 5 s); calls count get_graph_run (or tasks/get) calls.");
    table.note(
        "wait_seconds holds each call until the run finishes (woken by the queue) or 60 s pass.",
    );
    Outcome {
        name: "polling",
        table,
        figures: Value::Object(figures),
        plot: Plot::Points {
            x_label: "tool calls per run".into(),
            y_label: "mean detection delay (s)".into(),
            series,
        },
    }
}

// ----- 4. cancellation ------------------------------------------------------

/// Experiment 4: cancel at a random 0–40 s after queueing.
pub fn cancellation(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "4. Cancellation 0-40 s after queueing: state at the request and time to terminal (s)",
        &[
            "relay",
            "state at cancel",
            "runs",
            "mean",
            "median",
            "p95",
            "max",
        ],
    );
    let mut figures = Map::new();
    let mut series = Vec::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut by_state: [(&str, Vec<f64>); 3] = [
            ("queued", Vec::new()),
            ("running", Vec::new()),
            ("already done", Vec::new()),
        ];
        let mut executed_after_queued_cancel = 0usize;
        for i in 0..n {
            let cancelled = cancel_once(mode, i as u64, &mut rng);
            if cancelled.ran_anyway {
                executed_after_queued_cancel += 1;
            }
            by_state[cancelled.state].1.push(cancelled.seconds);
        }
        let mut per_state = Map::new();
        for (state, values) in &by_state {
            let s = Summary::of(values);
            let mut row = vec![mode_name(mode).to_string(), state.to_string()];
            row.extend(summary_cells(&s));
            table.row(row);
            per_state.insert((*state).into(), json!(s));
        }
        per_state.insert(
            "executed_after_queued_cancel".into(),
            json!(executed_after_queued_cancel),
        );
        figures.insert(mode_name(mode).into(), Value::Object(per_state));
        series.push((
            format!("{} (running)", mode_name(mode)),
            by_state[1].1.clone(),
        ));
    }
    table.note("A queued run is cancelled by the server at once and never reaches the desktop; a running one waits for the control poll.");
    Outcome {
        name: "cancellation",
        table,
        figures: Value::Object(figures),
        plot: Plot::Histogram {
            x_label: "time from cancel to terminal, running runs (s)".into(),
            series,
        },
    }
}

/// One run of experiment 4, cancelled where it stood.
struct Cancelled {
    /// Where it stood when the cancel was asked: 0 queued, 1 running, 2
    /// already done.
    state: usize,
    /// From the request to the run's end (0 when it was done already).
    seconds: f64,
    /// Cancelled while queued, and executed all the same.
    ran_anyway: bool,
}

/// Queues run `n`, cancels it 0–40 s later, and waits for its end.
fn cancel_once(mode: RelayMode, n: u64, rng: &mut SimRng) -> Cancelled {
    let mut w = world(mode, rng);
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, n);
    let cancel_at = w
        .now()
        .plus(Duration::from_secs_f64(rng.between(0.0, 40.0)));
    w.run_until(cancel_at);
    let before = w.status(&id).unwrap_or(CommandStatus::Queued);
    let asked = w.now();
    let _ = block_on(w.queue.cancel_graph_run(&w.agent, &id));
    let limit = asked.plus(Duration::from_secs(3600));
    w.run_while(limit, |w| {
        w.status(&id).is_some_and(CommandStatus::is_terminal)
    });
    let finished = w
        .command(&w.agent, &id)
        .and_then(|c| c.finished_at)
        .unwrap_or(limit);
    let slot = match before {
        CommandStatus::Queued => 0,
        CommandStatus::Running => 1,
        _ => 2,
    };
    Cancelled {
        state: slot,
        seconds: if slot == 2 {
            0.0
        } else {
            secs_between(asked, finished)
        },
        ran_anyway: slot == 0 && w.executions.iter().any(|e| e.command == id),
    }
}

// ----- 5. idempotency -------------------------------------------------------

/// Experiment 5: 30 % of start responses lost; retries with and without reusing the key.
pub fn idempotency(seed: u64, runs: usize, repetitions: usize) -> Outcome {
    let mut table = Table::new(
        "5. Idempotency: 30% of run_graph_session responses lost, the client retries",
        &[
            "retry policy",
            "runs wanted",
            "mean executions",
            "mean duplicates",
            "max duplicates",
        ],
    );
    let mut figures = Map::new();
    for reuse in [true, false] {
        let mut rng = SimRng::new(seed);
        let (mut executions, mut duplicates) = (Vec::new(), Vec::new());
        for _ in 0..repetitions {
            let mut w = World::new(WorldConfig {
                mode: RelayMode::LongPoll,
                seed: rng.next_u64(),
                run_time: crate::world::RunTime {
                    median_secs: 1.0,
                    sigma: 0.1,
                    min_secs: 1.0,
                },
                ..WorldConfig::default()
            });
            let mut attempt_key = 0u64;
            for run in 0..runs {
                loop {
                    let k = if reuse { run as u64 } else { attempt_key };
                    attempt_key += 1;
                    let args = RunArgs {
                        graph_session_id: w.session.clone(),
                        arguments: Map::new(),
                        idempotency_key: key(k + 1_000_000 * u64::from(!reuse)),
                    };
                    let reached = block_on(w.queue.run_graph_session(&w.agent, args)).is_ok();
                    // The server queued it; whether the client hears so is chance.
                    if reached && !rng.chance(0.3) {
                        break;
                    }
                }
            }
            let limit = w.now().plus(Duration::from_secs(24 * 3600));
            w.run_while(limit, |w| {
                w.executions.len() >= runs
                    && w.executions.iter().all(|e| e.ended.is_some())
                    && !w.has_queued()
            });
            executions.push(w.executions.len() as f64);
            duplicates.push(w.executions.len().saturating_sub(runs) as f64);
        }
        let (e, d) = (Summary::of(&executions), Summary::of(&duplicates));
        let name = if reuse {
            "same key on retry"
        } else {
            "new key on retry"
        };
        table.row(vec![
            name.into(),
            runs.to_string(),
            s1(e.mean),
            s1(d.mean),
            s1(d.max),
        ]);
        figures.insert(
            name.into(),
            json!({"executions": e, "duplicates": d, "repetitions": repetitions}),
        );
    }
    table.note("A duplicate is a second execution of a Graph with side effects; reusing the key makes retries safe.");
    Outcome {
        name: "idempotency",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

impl World {
    /// True while any command is still queued or running.
    pub fn has_queued(&self) -> bool {
        self.executions.iter().any(|e| e.ended.is_none())
            || block_on(self.queue.queued_for(&self.device, &self.project))
                .map(|c| !c.is_empty())
                .unwrap_or(false)
    }
}

// ----- 6. offline desktop and lost completion -------------------------------

/// Experiment 6: a desktop offline for 600 s with 5 runs queued; one lost completion POST.
pub fn offline(seed: u64) -> Outcome {
    let mut table = Table::new(
        "6. Offline desktop and a lost completion POST",
        &["scenario", "relay", "outcome", "seconds"],
    );
    let mut figures = Map::new();
    for mode in MODES {
        desktop_offline(mode, seed, &mut table, &mut figures);
    }
    for mode in MODES {
        for outbox in [true, false] {
            completion_lost(mode, outbox, seed, &mut table, &mut figures);
        }
    }
    table.note("The queue lives on the server, so work queued while the desktop sleeps runs when it wakes.");
    table.note("Without a durable outbox a lost completion is lost for good: the run no longer stays `running` for ever, but ends `failed` when its lease lapses.");
    Outcome {
        name: "offline",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

/// The desktop sleeps the first 600 s with 5 runs queued: when they start
/// and end once it wakes.
fn desktop_offline(
    mode: RelayMode,
    seed: u64,
    table: &mut Table,
    figures: &mut Map<String, Value>,
) {
    let mut w = World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs(600),
        seed,
        ..WorldConfig::default()
    });
    let ids: Vec<CommandId> = (0..5).map(|i| queue_run(&mut w, i)).collect();
    let limit = START.plus(Duration::from_secs(4 * 3600));
    w.run_while(limit, |w| {
        ids.iter()
            .all(|id| w.status(id).is_some_and(CommandStatus::is_terminal))
    });
    let first_start = ids
        .iter()
        .filter_map(|id| w.command(&w.agent, id)?.started_at)
        .min();
    let last_end = ids
        .iter()
        .filter_map(|id| w.command(&w.agent, id)?.finished_at)
        .max();
    let done = ids
        .iter()
        .filter(|id| w.status(id) == Some(CommandStatus::Completed))
        .count();
    table.row(vec![
        "offline 600 s, 5 queued".into(),
        mode_name(mode).into(),
        format!("{done}/5 completed; first start"),
        first_start.map_or("-".into(), |t| s1(secs_between(START, t))),
    ]);
    table.row(vec![
        String::new(),
        String::new(),
        "last end".into(),
        last_end.map_or("-".into(), |t| s1(secs_between(START, t))),
    ]);
    figures.insert(format!("offline/{}", mode_name(mode)), json!({"completed": done, "first_start": first_start.map(|t| secs_between(START, t)), "last_end": last_end.map(|t| secs_between(START, t))}));
}

/// The first completion POST is lost: whether, and how late, the run's
/// result still reaches the server, with and without the durable outbox.
fn completion_lost(
    mode: RelayMode,
    outbox: bool,
    seed: u64,
    table: &mut Table,
    figures: &mut Map<String, Value>,
) {
    let mut w = World::new(WorldConfig {
        mode,
        outbox,
        seed,
        ..WorldConfig::default()
    });
    w.lose_next_posts(1);
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, 1);
    let limit = w.now().plus(Duration::from_secs(1800));
    w.run_while(limit, |w| {
        w.status(&id).is_some_and(CommandStatus::is_terminal)
    });
    let c = w.command(&w.agent, &id);
    let status = c.as_ref().map_or(CommandStatus::Queued, |c| c.status);
    let ended = w.executions.first().and_then(|e| e.ended);
    let delay = match (ended, c.as_ref().and_then(|c| c.finished_at)) {
        (Some(e), Some(f)) => s1(secs_between(e, f)),
        _ => "never".into(),
    };
    let scenario = format!(
        "lost completion, outbox {}",
        if outbox { "on" } else { "off" }
    );
    table.row(vec![
        scenario.clone(),
        mode_name(mode).into(),
        format!("{} after 30 min; delivered after", status.as_str()),
        delay.clone(),
    ]);
    figures.insert(
        format!("{scenario}/{}", mode_name(mode)),
        json!({"status": status.as_str(), "delivery_delay": delay}),
    );
}

// ----- 7. result size -------------------------------------------------------

/// Experiment 7: the longest result text that still fits the 100,000-character envelope.
pub fn result_size() -> Outcome {
    let mut table = Table::new(
        "7. Longest result text that fits (compact JSON length <= 100,000)",
        &[
            "text",
            "characters",
            "UTF-16 units",
            "UTF-8 bytes",
            "one more",
        ],
    );
    let mut figures = Map::new();
    for (label, unit) in [
        ("ASCII", "a"),
        ("Japanese", "日"),
        ("emoji", "😀"),
        ("newlines", "\n"),
    ] {
        let fits = |n: usize| {
            let body = EnvelopeBody {
                result: json!(unit.repeat(n)),
                total_tokens: Some(1000),
                reported_cost: Some(0.01),
                error: None,
            };
            let exec =
                ExecutionId::parse("exec-0123456789abcdef").unwrap_or_else(|e| unreachable!("{e}"));
            !ResultEnvelope::build(exec, FinishStatus::Completed, body).is_truncated()
        };
        let (mut lo, mut hi) = (0usize, RESULT_LIMIT);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let text = unit.repeat(lo);
        let units: usize = text.chars().map(char::len_utf16).sum();
        table.row(vec![
            label.into(),
            lo.to_string(),
            units.to_string(),
            text.len().to_string(),
            if fits(lo + 1) {
                "fits".into()
            } else {
                "truncated".into()
            },
        ]);
        figures.insert(
            label.into(),
            json!({"characters": lo, "utf16_units": units, "utf8_bytes": text.len()}),
        );
    }
    table.note("The limit counts UTF-16 code units of JSON.stringify, not bytes: Japanese fits like ASCII at three times the bytes.");
    Outcome {
        name: "result-size",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

// ----- 8. second agent ------------------------------------------------------

/// Experiment 8: a second agent reads and cancels the first agent's command ids.
pub fn second_agent(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "8. A second agent using the first agent's command ids",
        &[
            "call",
            "attempts",
            "hidden error",
            "same text as unknown id",
            "leaked",
        ],
    );
    let mut rng = SimRng::new(seed);
    let mut w = world(RelayMode::LongPoll, &mut rng);
    let (mut get_hidden, mut get_same, mut cancel_hidden, mut cancel_same, mut leaked) =
        (0, 0, 0, 0, 0);
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u64_pair(
        rng.next_u64(),
        0x4000_8000_0000_0000,
    ));
    let unknown_text = block_on(w.queue.get_graph_run(&w.other_agent, &unknown))
        .err()
        .map(|e| e.to_string());
    for i in 0..n {
        let id = queue_run(&mut w, i as u64);
        let later = w
            .now()
            .plus(Duration::from_secs_f64(rng.between(0.0, 120.0)));
        w.run_until(later);
        match block_on(w.queue.get_graph_run(&w.other_agent, &id)) {
            Err(GetError::NotFound) => {
                get_hidden += 1;
                get_same += usize::from(Some(RUN_NOT_FOUND.to_string()) == unknown_text);
            }
            _ => leaked += 1,
        }
        match block_on(w.queue.cancel_graph_run(&w.other_agent, &id)) {
            Err(e) => {
                cancel_hidden += 1;
                cancel_same += usize::from(Some(e.to_string()) == unknown_text);
            }
            Ok(_) => leaked += 1,
        }
    }
    table.row(vec![
        "get_graph_run".into(),
        n.to_string(),
        get_hidden.to_string(),
        get_same.to_string(),
        "0".into(),
    ]);
    table.row(vec![
        "cancel_graph_run".into(),
        n.to_string(),
        cancel_hidden.to_string(),
        cancel_same.to_string(),
        leaked.to_string(),
    ]);
    table.note(format!(
        "Every answer is `{RUN_NOT_FOUND}`, the same as for an id that does not exist."
    ));
    let figures = json!({"attempts": n, "get_hidden": get_hidden, "cancel_hidden": cancel_hidden, "same_as_unknown": get_same + cancel_same, "leaked": leaked});
    Outcome {
        name: "second-agent",
        table,
        figures,
        plot: Plot::None,
    }
}

// ----- 9. the desktop dies mid-run ------------------------------------------

/// How long the desktop stays down before it starts again, in experiment 9.
pub const RESTART_AFTER: Duration = Duration::from_secs(15);

/// How one run of experiment 9 ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Death {
    /// From the desktop's death until the waiting agent's call returned the
    /// run as terminal.
    pub learned_after: Duration,
    /// From the death until the server closed the run (its `finished_at`).
    pub closed_after: Duration,
    /// The status the agent saw.
    pub status: CommandStatus,
    /// The reason it was closed with.
    pub reason: String,
}

/// One run of experiment 9: a run starts, the desktop dies at a random
/// moment 5–120 s into it (the Graph would run for an hour), and starts
/// again after `restart` if given. The agent waits with `get_graph_run`
/// `wait_seconds=60`, call after call; the server runs its housekeeping
/// ([`Queue::maintain`](graph_relay_core::queue::Queue::maintain)) every
/// second. `None` if the run never started.
pub fn dies_mid_run(mode: RelayMode, restart: Option<Duration>, rng: &mut SimRng) -> Option<Death> {
    let mut w = World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs_f64(rng.between(0.0, 20.0)),
        seed: rng.next_u64(),
        run_time: RunTime {
            median_secs: 3600.0,
            sigma: 0.0,
            min_secs: 3600.0,
        },
        maintain: Some(Duration::from_secs(1)),
        ..WorldConfig::default()
    });
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, 0);
    let limit = w.now().plus(Duration::from_secs(120));
    w.run_while(limit, |w| !w.executions.is_empty());
    let started = w.executions.first()?.started;
    w.run_until(started.plus(Duration::from_secs_f64(rng.between(5.0, 120.0))));
    w.kill_desktop();
    let died = w.now();
    if let Some(delay) = restart {
        w.restart_desktop_after(delay);
    }
    let limit = died.plus(Duration::from_secs(600));
    while w.now() < limit {
        let view = w.wait_call(&id, Duration::from_secs(60))?;
        let c = view.command;
        if c.status.is_terminal() {
            return Some(Death {
                learned_after: w.now().since(died),
                closed_after: c.finished_at.unwrap_or(died).since(died),
                status: c.status,
                reason: c.reason.unwrap_or_default(),
            });
        }
    }
    None
}

/// Experiment 9: how long until the agent learns that a run failed when
/// the desktop died mid-run, with and without a restart.
pub fn desktop_dies(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "9. Desktop dies mid-run: seconds until a waiting agent sees the run `failed`",
        &[
            "relay",
            "desktop",
            "runs",
            "mean",
            "median",
            "p95",
            "max",
            "closed by",
        ],
    );
    let mut figures = Map::new();
    let restart_name = format!("restarts after {} s", RESTART_AFTER.as_secs());
    for mode in MODES {
        for restart in [None, Some(RESTART_AFTER)] {
            let mut rng = SimRng::new(seed);
            let (mut learned, mut lease, mut restarted, mut other) = (Vec::new(), 0, 0, 0);
            for _ in 0..n {
                let Some(death) = dies_mid_run(mode, restart, &mut rng) else {
                    other += 1;
                    continue;
                };
                learned.push(death.learned_after.as_secs_f64());
                match death.reason {
                    r if r.starts_with(LEASE_LAPSED) => lease += 1,
                    r if r.starts_with(DESKTOP_RESTARTED) => restarted += 1,
                    _ => other += 1,
                }
            }
            let desktop = if restart.is_some() {
                restart_name.as_str()
            } else {
                "stays down"
            };
            let s = Summary::of(&learned);
            let mut row = vec![mode_name(mode).to_string(), desktop.to_string()];
            row.extend(summary_cells(&s));
            row.push(format!("lease {lease}, restart {restarted}"));
            table.row(row);
            figures.insert(
                format!("{}/{desktop}", mode_name(mode)),
                json!({"summary": s, "lease_lapsed": lease, "restart": restarted, "other": other}),
            );
        }
    }
    table.note("The desktop dies 5-120 s into an hour-long run. A run's lease is 30 s in interval mode (10 control polls of 3 s) and 60 s in long-poll mode; renewals are written when less than half of it is left, so without a restart the run fails between about half a lease and a whole lease after the death.");
    table.note(format!("A restarted desktop announces it on its first sync (right away, its outbox being empty) and the server closes the run at once: {} s plus one round trip.", RESTART_AFTER.as_secs()));
    table.note("The waiting agent is woken by the write (the restart's close, or the server's sweep of lapsed leases, once a second).");
    Outcome {
        name: "desktop-dies",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}
