//! Experiment 3: polling strategies.

use super::*;

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
