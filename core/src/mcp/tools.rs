//! `tools/call`: from params to a queue operation to a `CallToolResult`.

use super::progress::{ProgressNotifications, token as progress_token};
use super::wire::{CallToolResult, GraphRun, GraphRunTicket, SessionList, ToolOutput, to_json};
use super::{
    Answer, Caller, ErrorCode, Incoming, McpServer, Notifier, Outgoing, ProtocolVersion, RequestId,
};
use crate::args::{ArgError, GetArgs, ToolArgs};
use crate::queue::{CancelError, GetError, ListError, RunError, RunTicket, RunView};

/// Why a `tools/call` got no result: a JSON-RPC error.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// `params.name` is missing or not a string (`-32602`).
    #[error("Invalid params: `tools/call` needs `name` (a string)")]
    NoName,
    /// No tool has that name (`-32602`).
    #[error("Unknown tool: {0}")]
    UnknownTool(String),
    /// The store failed: retryable ([`Outgoing::store_unavailable`]); the
    /// details stay on the server.
    #[error("{}", super::jsonrpc::STORE_UNAVAILABLE)]
    Unavailable,
}

impl Refusal {
    /// The JSON-RPC error answering request `id`.
    pub(super) fn into_outgoing(self, id: &RequestId) -> Outgoing {
        match self {
            Self::NoName | Self::UnknownTool(_) => Outgoing::error(
                Some(id.clone()),
                ErrorCode::InvalidParams,
                self.to_string(),
                None,
            ),
            Self::Unavailable => Outgoing::store_unavailable(Some(id.clone())),
        }
    }
}

/// Why a tool produced no success: a refusal, or a tool execution error
/// whose text goes to the model (`isError: true`).
enum CallError {
    Refused(Refusal),
    Tool(String),
}

impl From<Refusal> for CallError {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

/// The queue's refusals as tools see them: a passing failure (the
/// store's, by the error's own `is_retryable()`) is a retryable JSON-RPC
/// error; anything else is final and goes to the model as the tool's
/// error, in the queue's words.
macro_rules! tool_errors_of {
    ($($error:ty),* $(,)?) => {
        $(
            impl From<$error> for CallError {
                fn from(e: $error) -> Self {
                    if e.is_retryable() {
                        Self::Refused(Refusal::Unavailable)
                    } else {
                        Self::Tool(e.to_string())
                    }
                }
            }
        )*
    };
}

tool_errors_of!(RunError, GetError, CancelError, ListError);

/// A success whose text is the compact JSON of its structured content.
/// The success carrying `structured`, as [`CallToolResult::of_output`]
/// writes it, rendered without serializing the content twice.
fn tool_result(structured: ToolOutput, version: ProtocolVersion) -> Answer {
    Answer::Output {
        json: super::wire::to_json_bytes(&structured),
        with_structured: version.has_structured_content(),
    }
}

fn tool_result_with_text(text: String, structured: ToolOutput, version: ProtocolVersion) -> Answer {
    let structured = version.has_structured_content().then_some(structured);
    Answer::Tool(CallToolResult::success(text, structured))
}

/// Runs one `tools/call`. Tool execution errors come back as `Ok` results
/// with `isError: true`; protocol and store failures as `Err`.
pub(super) async fn call(
    server: &McpServer,
    caller: &Caller,
    incoming: &Incoming,
    version: ProtocolVersion,
    tasks: bool,
    notifier: &dyn Notifier,
) -> Result<Answer, Refusal> {
    match run(server, caller, incoming, version, tasks, notifier).await {
        Ok(answer) => Ok(answer),
        Err(CallError::Tool(message)) => Ok(Answer::Tool(CallToolResult::error(message))),
        Err(CallError::Refused(refusal)) => Err(refusal),
    }
}

async fn run(
    server: &McpServer,
    caller: &Caller,
    incoming: &Incoming,
    version: ProtocolVersion,
    tasks: bool,
    notifier: &dyn Notifier,
) -> Result<Answer, CallError> {
    let name = incoming.tool_name().ok_or(Refusal::NoName)?;
    let catalog = server.catalog();
    let spec = catalog
        .find(name)
        .ok_or_else(|| Refusal::UnknownTool(name.to_owned()))?;
    // Scopes were checked against the authorization table before dispatch.
    let args = ToolArgs::decode_measured(
        spec.kind,
        incoming.arguments(),
        catalog.max_wait_seconds(),
        incoming.arguments_too_large(),
    )
    .map_err(|e: ArgError| CallError::Tool(format!("Invalid arguments for {}: {e}", spec.name)))?;
    let queue = server.queue();
    let agent = &caller.agent;
    match args {
        ToolArgs::Run(args) => {
            let ticket = queue.run_graph_session(agent, args).await?;
            Ok(ticket_answer(&ticket, version, tasks))
        }
        ToolArgs::List(args) => {
            let list = queue
                .list_graph_sessions(agent, &args.project_id, args.limit)
                .await?;
            Ok(tool_result(
                ToolOutput::Sessions(SessionList::from(&list)),
                version,
            ))
        }
        ToolArgs::Get(args) => {
            let view = read_run(server, caller, incoming, &args, notifier).await?;
            Ok(tool_result(
                ToolOutput::Run(Box::new(GraphRun::from(&view))),
                version,
            ))
        }
        ToolArgs::Cancel(args) => {
            let view = queue.cancel_graph_run(agent, &args.command_id).await?;
            Ok(tool_result(
                ToolOutput::Run(Box::new(GraphRun::from(&view))),
                version,
            ))
        }
    }
}

/// The answer to `run_graph_session`: the ticket, or with the tasks
/// extension a task whose id is the command id.
fn ticket_answer(ticket: &RunTicket, version: ProtocolVersion, tasks: bool) -> Answer {
    if tasks {
        let view = crate::queue::RunView {
            command: ticket.command.clone(),
            poll_after_seconds: Some(ticket.poll_after_seconds),
            device_offline_since: None,
        };
        return Answer::Value(super::tasks::created(&view));
    }
    let structured = GraphRunTicket::from(ticket);
    let text = format!(
        "Queued ticket, not a result. {} Ticket: {}",
        structured.message,
        to_json(&structured)
    );
    tool_result_with_text(text, ToolOutput::Ticket(structured), version)
}

/// `get_graph_run`: the run now, or once it finished within
/// `wait_seconds` (waiting on the queue's signals with the transport's
/// timer). With a progress token, each change while it waits is a
/// `notifications/progress` before the result.
async fn read_run(
    server: &McpServer,
    caller: &Caller,
    incoming: &Incoming,
    args: &GetArgs,
    notifier: &dyn Notifier,
) -> Result<RunView, GetError> {
    let (queue, agent) = (server.queue(), &caller.agent);
    let wait = std::time::Duration::from_secs(u64::from(args.wait_seconds));
    // The waiting futures are boxed: they are large, and inline they would
    // make every call's future (moved as a whole by the transports) as
    // large as theirs.
    match (server.sleeper(), progress_token(incoming)) {
        (Some(sleeper), Some(token)) if args.wait_seconds > 0 => {
            let mut progress = ProgressNotifications::new(token, notifier);
            Box::pin(queue.watch_graph_run(
                agent,
                &args.command_id,
                wait,
                sleeper.as_ref(),
                &mut |view| progress.observe(view),
            ))
            .await
        }
        (Some(sleeper), None) if args.wait_seconds > 0 => {
            Box::pin(queue.wait_graph_run(agent, &args.command_id, wait, sleeper.as_ref())).await
        }
        _ => queue.get_graph_run(agent, &args.command_id).await,
    }
}
