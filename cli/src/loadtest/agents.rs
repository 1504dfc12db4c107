//! The agents of `graph-relay loadtest`: MCP clients over HTTP, one task
//! per run (`run_graph_session`, then the start, the cancel or the
//! result), each request retried the way a careful client retries it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tally::{Party, Tally};
use super::{WAIT_SECONDS, session_id};
use crate::mcp_client::{McpClient, McpClientError, is_terminal};

/// One run as the scheduler planned it.
#[derive(Debug)]
pub(super) struct RunPlan {
    pub(super) index: usize,
    pub(super) desktop: usize,
    /// The desktop is a worker process.
    pub(super) worker: bool,
    pub(super) cancel: bool,
    pub(super) key: String,
    pub(super) wait: bool,
    pub(super) poll: Duration,
    /// How long the agent keeps at the run.
    pub(super) deadline: Duration,
}

/// What one run measured, or why it went wrong.
#[derive(Debug, Default)]
pub(super) struct RunRecord {
    /// The run's number.
    pub(super) run: usize,
    /// When the agent first sent `run_graph_session`.
    pub(super) sent: Option<Instant>,
    /// The same, by the wall clock (a worker's Graph writes its start so).
    pub(super) sent_wall: Option<std::time::SystemTime>,
    /// It went to a worker process.
    pub(super) worker: bool,
    /// A worker run's pickup: sent → its Graph started (from the ledger).
    pub(super) worker_pickup: Option<Duration>,
    pub(super) command: Option<String>,
    pub(super) cancel: bool,
    pub(super) pickup: Option<Duration>,
    pub(super) cancel_latency: Option<Duration>,
    pub(super) result_latency: Option<Duration>,
    /// The status the agent last read.
    pub(super) status: Option<String>,
    /// The run's error, when it ended otherwise than asked.
    pub(super) reason: Option<String>,
    /// Acknowledged, and not ended when the agent gave up.
    pub(super) stuck: bool,
    pub(super) error: Option<&'static str>,
}

/// An agent's side of one run: run, wait for the start, cancel or wait
/// for the result; each request retried while that makes sense.
pub(super) async fn one_run(client: McpClient, tally: Arc<Tally>, plan: RunPlan) -> RunRecord {
    let sent = Instant::now();
    let give_up = sent + plan.deadline;
    let mut record = RunRecord {
        run: plan.index,
        sent: Some(sent),
        sent_wall: Some(std::time::SystemTime::now()),
        worker: plan.worker,
        cancel: plan.cancel,
        ..RunRecord::default()
    };
    let id = match ticket(&client, &tally, &plan, give_up).await {
        Ok(id) => id,
        Err(kind) => return record.failed(&tally, kind),
    };
    record.command = Some(id.clone());
    // A worker's start is in its ledger, read at the end.
    if !plan.worker
        && let Err(kind) = record
            .wait_for_start(&client, &tally, &id, sent, give_up)
            .await
    {
        return record.failed(&tally, kind);
    }
    if plan.cancel {
        record.cancel(&client, &tally, &id, &plan, give_up).await
    } else {
        record
            .wait_for_result(&client, &tally, &id, &plan, give_up)
            .await
    }
}

/// Queues the run; its command id, or the error's kind.
async fn ticket(
    client: &McpClient,
    tally: &Tally,
    plan: &RunPlan,
    give_up: Instant,
) -> Result<String, &'static str> {
    let arguments = json!({
        "graph_session_id": session_id(plan.desktop),
        "idempotency_key": plan.key,
        "arguments": {"hold": plan.cancel, "run": plan.index},
    });
    // A retry reuses the idempotency key: a start whose answer was lost
    // returns the same ticket and queues nothing more.
    let ticket = retrying(tally, give_up, "run_graph_session", || {
        client.call("run_graph_session", arguments.clone())
    })
    .await;
    let ticket = match ticket {
        Ok(answer) if answer.is_error => return Err("run_refused"),
        Ok(answer) => answer.structured,
        Err(e) => return Err(error_kind("run_graph_session", &e)),
    };
    ticket["command_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or("ticket_without_command_id")
}

impl RunRecord {
    /// Waits for the simulated desktop to start run `id`, and keeps its
    /// pickup; when it never starts, reads where the run stands.
    async fn wait_for_start(
        &mut self,
        client: &McpClient,
        tally: &Tally,
        id: &str,
        sent: Instant,
        give_up: Instant,
    ) -> Result<(), &'static str> {
        let started = tally.started(id);
        let left = give_up.saturating_duration_since(Instant::now());
        if let Ok(Ok(at)) = tokio::time::timeout(left, started).await {
            let pickup = at.saturating_duration_since(sent);
            self.pickup = Some(pickup);
            tally.picked_up(sent, pickup);
            return Ok(());
        }
        // Never started: read where it stands, for the report.
        let last = client.get_graph_run(id, 0).await.ok();
        self.stuck = !last.as_ref().is_some_and(is_terminal);
        self.read(last.as_ref());
        Err("not_picked_up")
    }

    /// Cancels run `id` and waits until it reads `cancelled`.
    async fn cancel(
        mut self,
        client: &McpClient,
        tally: &Tally,
        id: &str,
        plan: &RunPlan,
        give_up: Instant,
    ) -> Self {
        let asked = Instant::now();
        let cancelled = retrying(tally, give_up, "cancel_graph_run", || {
            client.call_ok("cancel_graph_run", json!({"command_id": id}))
        })
        .await;
        if let Err(e) = cancelled {
            return self.failed(tally, error_kind("cancel_graph_run", &e));
        }
        let run = until_terminal(client, tally, id, plan, give_up).await;
        if run.is_ok() {
            self.cancel_latency = Some(asked.elapsed());
        }
        self.ended(tally, run, "cancelled", "cancelled_run_ended_otherwise")
    }

    /// Waits until run `id` ends, which must be `completed`.
    async fn wait_for_result(
        mut self,
        client: &McpClient,
        tally: &Tally,
        id: &str,
        plan: &RunPlan,
        give_up: Instant,
    ) -> Self {
        let run = until_terminal(client, tally, id, plan, give_up).await;
        if run.is_ok() {
            let have = Instant::now();
            self.result_latency = tally
                .finished(id)
                .map(|done| have.saturating_duration_since(done));
        }
        self.ended(tally, run, "completed", "run_ended_otherwise")
    }

    /// Keeps how run `id` ended (`run`, as the agent last read it): an end
    /// other than `asked` is the error `otherwise`; no end is giving up.
    fn ended(
        mut self,
        tally: &Tally,
        run: Result<Value, &'static str>,
        asked: &str,
        otherwise: &'static str,
    ) -> Self {
        match run {
            Ok(run) => self.read(Some(&run)),
            Err(kind) => return self.gave_up(tally, kind),
        }
        if self.status.as_deref() != Some(asked) {
            return self.failed(tally, otherwise);
        }
        self
    }

    fn failed(mut self, tally: &Tally, kind: &'static str) -> Self {
        tally.error(kind);
        self.error = Some(kind);
        self
    }

    /// The agent gave up on an acknowledged run before it ended.
    fn gave_up(mut self, tally: &Tally, kind: &'static str) -> Self {
        self.stuck = true;
        self.failed(tally, kind)
    }

    /// Keeps the status and error of a run as `get_graph_run` shows it.
    fn read(&mut self, run: Option<&Value>) {
        let Some(run) = run else { return };
        self.status = run["status"].as_str().map(str::to_owned);
        self.reason = run["error"].as_str().map(|e| e.chars().take(120).collect());
    }
}

/// Calls `call` until it answers, retrying the failures a careful client
/// retries (no answer, a 5xx without a JSON-RPC reply, a JSON-RPC error
/// marked retryable) after `Retry-After` or a short back-off, until
/// `give_up`. Each retried failure is counted by kind.
async fn retrying<T, F, Fut>(
    tally: &Tally,
    give_up: Instant,
    tool: &str,
    mut call: F,
) -> Result<T, McpClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, McpClientError>>,
{
    let mut attempt = 0_u32;
    loop {
        let error = match call().await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let Some(wait) = error.retry_delay(attempt) else {
            return Err(error);
        };
        tally.observe(Party::Agent, format!("{tool}: {}", error.kind()));
        if Instant::now() + wait > give_up {
            return Err(error);
        }
        tokio::time::sleep(wait).await;
        attempt = attempt.saturating_add(1);
    }
}

/// The error kind of a failed MCP request.
fn error_kind(tool: &str, error: &McpClientError) -> &'static str {
    match (tool, error) {
        (_, McpClientError::Http(e)) if e.is_timeout() => "agent_http_timeout",
        (_, McpClientError::Http(e)) if e.is_connect() => "agent_http_connect",
        (_, McpClientError::Http(_)) => "agent_http_other",
        (_, McpClientError::NotJson { .. }) => "agent_reply_not_json",
        (_, McpClientError::Rpc { .. }) => "agent_jsonrpc_error",
        ("cancel_graph_run", McpClientError::Tool { .. }) => "cancel_refused",
        ("get_graph_run", McpClientError::Tool { .. }) => "get_refused",
        (_, McpClientError::Tool { .. }) => "tool_error",
    }
}

/// `get_graph_run` (waiting or polling) until the run is terminal.
async fn until_terminal(
    client: &McpClient,
    tally: &Tally,
    id: &str,
    plan: &RunPlan,
    give_up: Instant,
) -> Result<Value, &'static str> {
    loop {
        let wait = if plan.wait { WAIT_SECONDS } else { 0 };
        let run = retrying(tally, give_up, "get_graph_run", || {
            client.get_graph_run(id, wait)
        })
        .await
        .map_err(|e| error_kind("get_graph_run", &e))?;
        if is_terminal(&run) {
            return Ok(run);
        }
        if Instant::now() > give_up {
            return Err("not_finished");
        }
        if !plan.wait {
            tokio::time::sleep(plan.poll).await;
        }
    }
}
