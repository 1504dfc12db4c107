//! `subscriptions/listen` (2026-07-28, tasks extension): task status
//! notifications over one Server-Sent Events response.
//!
//! The stream starts with `notifications/subscriptions/acknowledged` naming
//! the tasks that will be watched (the caller's own, among those asked for),
//! then sends each task's current `notifications/tasks` once, and another
//! whenever it changes. Changes are noticed through the queue's signals (no
//! polling loop), with a store re-check every second for changes made by
//! another process on a shared store. Once every watched task is terminal the
//! stream ends with the request's result; a client that goes away ends it too.
//! A comment line (`: keep-alive`) after 15 s without an event keeps idle
//! proxies from closing it (`axum::response::Sse`'s keep-alive).
//!
//! # Bounds
//! - One agent (owner, name) holds at most
//!   [`ListenLimits::max_streams_per_agent`] streams; one more is refused
//!   with HTTP 429 and the JSON-RPC error `-32004` naming the limit.
//! - A stream lasts at most [`ListenLimits::max_lifetime`]; then it ends
//!   with its result like a finished one, and the client listens again.
//! - A stream whose token is revoked ends within about a second, without
//!   its result and without any later notification.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::Response;
use axum::response::sse::Event;
use graph_relay_core::hold::Look;
use graph_relay_core::ids::CommandId;
use graph_relay_core::mcp::{Caller, ErrorCode, Incoming, Outgoing};
use serde_json::{Value, json};

use crate::mcp_reply::{event, sse_response};
use crate::mcp_sessions::AgentKey;
use crate::{Authenticated, HttpState};

/// Default of [`ListenLimits::max_streams_per_agent`].
pub const DEFAULT_MAX_LISTEN_STREAMS_PER_AGENT: usize = 16;
/// Default of [`ListenLimits::max_lifetime`]: ten minutes.
pub const DEFAULT_MAX_LISTEN_LIFETIME: Duration = Duration::from_secs(600);

/// Bounds on `subscriptions/listen` streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenLimits {
    /// Most open streams of one agent (owner, name); default 16.
    pub max_streams_per_agent: usize,
    /// Longest life of one stream; default 10 minutes. It then ends with
    /// its result and the client listens again.
    pub max_lifetime: Duration,
}

impl Default for ListenLimits {
    fn default() -> Self {
        Self {
            max_streams_per_agent: DEFAULT_MAX_LISTEN_STREAMS_PER_AGENT,
            max_lifetime: DEFAULT_MAX_LISTEN_LIFETIME,
        }
    }
}

/// The open streams, counted per agent.
pub(crate) struct Streams {
    limits: ListenLimits,
    open: Arc<Mutex<HashMap<AgentKey, usize>>>,
}

/// One open stream; dropping it gives its place back.
struct StreamSlot {
    open: Arc<Mutex<HashMap<AgentKey, usize>>>,
    agent: AgentKey,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.open.lock()
            && let Some(n) = open.get_mut(&self.agent)
        {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.agent);
            }
        }
    }
}

impl Streams {
    pub(crate) fn new(limits: ListenLimits) -> Self {
        Self {
            limits,
            open: Arc::default(),
        }
    }

    /// All open streams.
    pub(crate) fn total(&self) -> usize {
        self.open.lock().map(|o| o.values().sum()).unwrap_or(0)
    }

    /// A place for one more stream of `agent`, unless it holds the maximum.
    fn try_open(&self, agent: AgentKey) -> Option<StreamSlot> {
        let mut open = self.open.lock().ok()?;
        let n = open.entry(agent.clone()).or_insert(0);
        if *n >= self.limits.max_streams_per_agent {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            open: self.open.clone(),
            agent,
        })
    }
}

/// Answers a `subscriptions/listen`: a JSON-RPC error, or the SSE stream.
pub(crate) async fn serve(
    state: &HttpState,
    who: Authenticated,
    caller: Caller,
    incoming: Incoming,
) -> Response {
    let server = state.mcp().clone();
    let limits = &state.inner.config.listen;
    let agent = (caller.agent.owner.clone(), caller.agent.id.clone());
    let Some(slot) = state.inner.listens.try_open(agent) else {
        let limit = limits.max_streams_per_agent;
        let reply = Outgoing::error(
            incoming.id().cloned(),
            ErrorCode::LimitExceeded,
            format!(
                "Too many listen streams: this agent already has {limit} open, the most this server allows; close one or wait for one to end"
            ),
            Some(json!({"limit": limit, "name": "max_listen_streams_per_agent"})),
        );
        return crate::mcp_reply::json_reply(&reply);
    };
    let listen = match server.listen(&caller, &incoming).await {
        Ok(listen) => listen,
        Err(reply) => return crate::mcp_reply::json_reply(&reply),
    };
    let lifetime = limits.max_lifetime;
    let watcher = state.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        let _slot = slot;
        let request_id = listen.request_id.clone();
        let stream = watch(&server, &caller, listen, lifetime, &tx);
        let done = tokio::select! {
            ended = stream => ended,
            () = watcher.revoked(&who) => {
                tracing::info!(agent = %caller.agent.id, "listen stream ended: its token was revoked");
                return;
            }
        };
        if done {
            let done = Outgoing::result(request_id, json!({"resultType": "complete"}));
            let _ = tx.send(event(done.message())).await;
        }
    });
    sse_response(rx)
}

/// Sends the acknowledgement and the notifications until every watched
/// task is terminal (true), or the client went away or the server is
/// shutting down (false). The stream is held by the queue's rule for
/// watching commands ([`Queue::watch_hold`](graph_relay_core::queue::Queue::watch_hold)):
/// each change of a watched task, and a look every second, sends what changed.
async fn watch(
    server: &graph_relay_core::mcp::McpServer,
    caller: &Caller,
    listen: graph_relay_core::mcp::TaskListen,
    lifetime: Duration,
    tx: &tokio::sync::mpsc::Sender<Event>,
) -> bool {
    if tx.send(event(&listen.acknowledged)).await.is_err() {
        return false;
    }
    let queue = server.queue();
    // Re-read without a signal at the queue's pace (see
    // `Queue::external_writes_fed`).
    let hold = queue.watch_hold(&listen.task_ids, lifetime);
    // What each task last showed, and the tasks still worth watching.
    let last: Mutex<HashMap<CommandId, Value>> = Mutex::default();
    let watching = Mutex::new(listen.task_ids.clone());
    let (last, watching) = (&last, &watching);
    let look = || async move {
        let ids = watching.lock().map(|w| w.clone()).unwrap_or_default();
        let mut changed = Vec::new();
        let mut still = Vec::with_capacity(ids.len());
        for id in ids {
            let Some((message, terminal)) = server.task_notification(caller, &id).await else {
                continue;
            };
            if let Ok(mut last) = last.lock()
                && last.get(&id) != Some(&message)
            {
                changed.push(message.clone());
                last.insert(id, message);
            }
            if !terminal {
                still.push(id);
            }
        }
        let done = still.is_empty();
        if let Ok(mut watching) = watching.lock() {
            *watching = still;
        }
        for message in changed {
            if tx.send(event(&message)).await.is_err() {
                return Ok::<_, Infallible>(Look::Ready(End::Gone));
            }
        }
        if done {
            return Ok(Look::Ready(End::Done));
        }
        Ok(Look::NotYet(End::HoldEnded))
    };
    let held = hold.run(
        queue.signals(),
        &**queue.clock(),
        &crate::TokioSleeper,
        look,
    );
    let end = tokio::select! {
        end = held => end.unwrap_or_else(|never| match never {}),
        () = tx.closed() => End::Gone,
    };
    match end {
        End::Done => true,
        End::Gone => false,
        // The stream's lifetime is over: it ends with the result and the
        // client listens again. A server shutting down ends it without one.
        End::HoldEnded => !queue.is_shutting_down(),
    }
}

/// How a listen stream's hold ended.
enum End {
    /// Every watched task is terminal.
    Done,
    /// The client went away.
    Gone,
    /// The hold ran out: the stream's lifetime, or the server's shutdown.
    HoldEnded,
}
