//! The tasks extension of 2026-07-28 (`io.modelcontextprotocol/tasks`, SEP-2663).
//!
//! When a `tools/call` of `run_graph_session` declares the extension in its
//! per-request client capabilities, the answer is a `CreateTaskResult`
//! (`resultType: "task"`) instead of a ticket: the task id **is** the
//! command id, and `pollIntervalMs` comes from the desktop's cadence (the
//! same figure as `poll_after_seconds`). `tasks/get`, `tasks/cancel` and
//! `tasks/update` then act on the run. Tasks are bound to the agent that
//! created them: another agent's task and an unknown id get the same
//! `-32602` "Failed to retrieve task: Task not found". Clients that do not
//! declare the extension keep getting the ticket exactly as before, and their
//! `tasks/*` calls are refused with `-32021`.
//!
//! # Status mapping
//! | command | task | what `tasks/get` carries |
//! |---|---|---|
//! | `queued`, `running` | `working` | `statusMessage`, `pollIntervalMs` |
//! | `running`, waiting for approval | `working` | `statusMessage` saying the Graph has not started |
//! | `completed` | `completed` | `result`: the run as a `CallToolResult` |
//! | `failed` | `completed` | `result` with `isError: true` and the run's error |
//! | `cancelled` | `cancelled` | `statusMessage` with the reason |
//!
//! A Graph that fails is a *tool* error, and the revision says a tool error
//! is a `completed` task whose result has `isError: true`; the task status
//! `failed` is kept for JSON-RPC errors, which a run never produces once
//! queued. Terminal runs stay readable until pruned (30 days after they
//! finish by default), so `ttlMs` is `null`.

use serde_json::Value;

use super::wire::{
    CallToolResult, EmptyResult, GraphRun, JsonRpcNotification, ListenAcknowledged,
    ListenNotifications, MissingCapabilityData, Task, ToolOutput, to_value,
};
use super::{Caller, ErrorCode, Incoming, McpServer, Outgoing, RequestId};
use crate::command::CommandStatus;
use crate::ids::CommandId;
use crate::queue::{CancelError, GetError, RunView};

/// The extension's identifier in capabilities.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// What the agent reads about a run that waits for the owner's approval
/// ([`CommandRecord::awaits_approval`](crate::command::CommandRecord::awaits_approval)):
/// the task's `statusMessage` and `get_graph_run`'s `status_message`. The
/// run is `running` on the server, but its Graph has not started, and
/// "Running on the owner's desktop" would say it had.
pub(super) const AWAITING_APPROVAL: &str =
    "Waiting for the owner's approval on the desktop; the Graph has not started yet.";

/// True when the request declares the tasks extension in its per-request
/// client capabilities (`_meta[...clientCapabilities].extensions[TASKS_EXTENSION]`).
pub(super) fn declared(incoming: &Incoming) -> bool {
    incoming
        .client_capabilities()
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// The task fields of a run, without a result.
pub(super) fn task(view: &RunView) -> Task {
    let c = &view.command;
    let (status, message) = match c.status {
        CommandStatus::Queued => (
            "working",
            match view.device_offline_since {
                Some(t) => format!("Queued; the owner's desktop looks offline since {t}."),
                None => "Queued; waiting for the owner's desktop to pick it up.".to_owned(),
            },
        ),
        CommandStatus::Running if c.cancel_requested => {
            ("working", "Running; cancellation was requested.".to_owned())
        }
        CommandStatus::Running => (
            "working",
            match &c.progress {
                _ if c.awaits_approval() => AWAITING_APPROVAL.to_owned(),
                Some(p) => format!("Running on the owner's desktop: {}.", progress_text(p)),
                None => "Running on the owner's desktop.".to_owned(),
            },
        ),
        CommandStatus::Completed => ("completed", "The Graph run completed.".to_owned()),
        CommandStatus::Failed => (
            "completed",
            "The Graph run failed; the result says why.".to_owned(),
        ),
        CommandStatus::Cancelled => (
            "cancelled",
            c.reason
                .clone()
                .unwrap_or_else(|| "The Graph run was cancelled.".to_owned()),
        ),
    };
    let updated = [
        Some(c.created_at),
        c.started_at,
        c.cancel_requested_at,
        c.finished_at,
        c.progress.as_ref().map(|p| p.updated_at),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(c.created_at);
    Task {
        created_at: c.created_at.to_rfc3339(),
        last_updated_at: updated.to_rfc3339(),
        poll_interval_ms: view.poll_after_seconds.map(|s| s.saturating_mul(1000)),
        result: None,
        result_type: None,
        status: status.to_owned(),
        status_message: message,
        task_id: c.id,
        ttl_ms: None,
    }
}

/// A progress report as one phrase: the message, then the percentage.
pub(super) fn progress_text(p: &crate::command::Progress) -> String {
    match (&p.message, p.percent) {
        (Some(m), Some(percent)) => format!("{m} ({percent}%)"),
        (Some(m), None) => m.clone(),
        (None, Some(percent)) => format!("{percent}% done"),
        (None, None) => "working".to_owned(),
    }
}

/// The `CreateTaskResult` for a freshly queued (or replayed) run.
pub(super) fn created(view: &RunView) -> Value {
    let mut task = task(view);
    task.result_type = Some("task".to_owned());
    to_value(&task)
}

/// The `notifications/tasks` message for one task as `caller` sees it:
/// the full `DetailedTask`, identical to what `tasks/get` returns. `None`
/// when the task is unknown or not the caller's. The flag is true once the
/// task is terminal (no further notification will follow).
pub(super) async fn notification(
    server: &McpServer,
    caller: &Caller,
    id: &CommandId,
) -> Option<(Value, bool)> {
    let view = server.queue().get_graph_run(&caller.agent, id).await.ok()?;
    let terminal = view.command.status.is_terminal();
    let notification = JsonRpcNotification::new("notifications/tasks", detailed(&view));
    Some((to_value(&notification), terminal))
}

/// A task with its status-specific payload (`result` once it has one).
fn detailed(view: &RunView) -> Task {
    let mut task = task(view);
    if matches!(
        view.command.status,
        CommandStatus::Completed | CommandStatus::Failed
    ) {
        let is_error = view.command.status == CommandStatus::Failed;
        task.result = Some(CallToolResult::of_output(
            ToolOutput::Run(Box::new(GraphRun::from(view))),
            is_error,
            true,
        ));
    }
    task
}

/// A `subscriptions/listen` for task notifications, accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskListen {
    /// The id of the `subscriptions/listen` request.
    pub request_id: RequestId,
    /// The tasks notifications will be sent for: those asked for that are the caller's.
    pub task_ids: Vec<CommandId>,
    /// The `notifications/subscriptions/acknowledged` message to send first.
    pub acknowledged: Value,
}

/// Validates a `subscriptions/listen` and picks the tasks to watch.
pub(super) async fn listen(
    server: &McpServer,
    caller: &Caller,
    incoming: &Incoming,
    id: &RequestId,
) -> Result<TaskListen, Outgoing> {
    let requested = incoming.notifications().and_then(|n| n.get("taskIds"));
    let asked: Vec<&str> = match requested {
        None => Vec::new(),
        Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            return Err(Outgoing::error(
                Some(id.clone()),
                ErrorCode::InvalidParams,
                "Invalid params: `notifications.taskIds` must be an array of strings".to_owned(),
                None,
            ));
        }
    };
    if requested.is_some() && !declared(incoming) {
        return Err(Outgoing::error(
            Some(id.clone()),
            ErrorCode::MissingRequiredCapability,
            format!(
                "Missing required client capability: declare the `{TASKS_EXTENSION}` extension to listen for task notifications"
            ),
            Some(to_value(&MissingCapabilityData::extension(TASKS_EXTENSION))),
        ));
    }
    let mut task_ids = Vec::new();
    // Bounded: one listen stream watches at most this many tasks.
    for text in asked.into_iter().take(MAX_LISTEN_TASKS) {
        let Ok(command) = CommandId::parse(text) else {
            continue;
        };
        if task_ids.contains(&command) {
            continue;
        }
        // Only the caller's own tasks are accepted; others are silently left out.
        if server
            .queue()
            .get_graph_run(&caller.agent, &command)
            .await
            .is_ok()
        {
            task_ids.push(command);
        }
    }
    let acknowledged = to_value(&JsonRpcNotification::new(
        "notifications/subscriptions/acknowledged",
        ListenAcknowledged {
            notifications: ListenNotifications {
                task_ids: task_ids.clone(),
            },
        },
    ));
    Ok(TaskListen {
        request_id: id.clone(),
        task_ids,
        acknowledged,
    })
}

/// Most tasks one `subscriptions/listen` stream watches.
pub const MAX_LISTEN_TASKS: usize = 100;

/// `tasks/get`, `tasks/cancel` and `tasks/update` (2026-07-28 only).
pub(super) async fn handle(
    server: &McpServer,
    caller: &Caller,
    incoming: &Incoming,
    id: &RequestId,
) -> Result<Value, Outgoing> {
    if !declared(incoming) {
        return Err(Outgoing::error(
            Some(id.clone()),
            ErrorCode::MissingRequiredCapability,
            format!(
                "Missing required client capability: declare the `{TASKS_EXTENSION}` extension to use tasks"
            ),
            Some(to_value(&MissingCapabilityData::extension(TASKS_EXTENSION))),
        ));
    }
    let not_found = || {
        Outgoing::error(
            Some(id.clone()),
            ErrorCode::InvalidParams,
            "Failed to retrieve task: Task not found".to_owned(),
            None,
        )
    };
    let internal = || Outgoing::store_unavailable(Some(id.clone()));
    let Some(task_id) = incoming.task_id().and_then(Value::as_str) else {
        return Err(Outgoing::error(
            Some(id.clone()),
            ErrorCode::InvalidParams,
            "Invalid params: `taskId` (a string) is required".to_owned(),
            None,
        ));
    };
    // A malformed id is as unknown as a foreign one.
    let command = CommandId::parse(task_id).map_err(|_| not_found())?;
    let queue = server.queue();
    let agent = &caller.agent;
    let read = async {
        queue
            .get_graph_run(agent, &command)
            .await
            .map_err(|e| match e {
                GetError::NotFound => not_found(),
                GetError::Store(_) => internal(),
            })
    };
    match incoming.method().unwrap_or_default() {
        "tasks/get" => read.await.map(|view| to_value(&detailed(&view))),
        "tasks/cancel" => {
            queue
                .cancel_graph_run(agent, &command)
                .await
                .map_err(|e| match e {
                    CancelError::NotFound => not_found(),
                    CancelError::Store(_) => internal(),
                })?;
            Ok(to_value(&EmptyResult {}))
        }
        // No run ever asks for input; the acknowledgement is all there is.
        _ => read.await.map(|_| to_value(&EmptyResult {})),
    }
}
