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
//! A comment line every 15 s keeps idle proxies from closing it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use graph_relay_core::ids::CommandId;
use graph_relay_core::mcp::{Caller, Incoming, Outgoing};
use graph_relay_core::signals::Topic;
use serde_json::{Value, json};

use crate::HttpState;

/// How often an idle stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How often the watched tasks are re-read without a signal.
const RECHECK: Duration = Duration::from_secs(1);

/// Answers a `subscriptions/listen`: a JSON-RPC error, or the SSE stream.
pub(crate) async fn serve(state: &HttpState, caller: Caller, incoming: Incoming) -> Response {
    let server = state.mcp().clone();
    let listen = match server.listen(&caller, &incoming).await {
        Ok(listen) => listen,
        Err(reply) => return crate::mcp_endpoint::json_reply(&reply),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        if tx.send(Ok(event(&listen.acknowledged))).await.is_err() {
            return;
        }
        let mut last: HashMap<CommandId, Value> = HashMap::new();
        let mut watching = listen.task_ids.clone();
        let mut idle = tokio::time::Instant::now();
        while !watching.is_empty() {
            // Subscribe first, then read: a change in between is not lost.
            let changed: Vec<_> = watching
                .iter()
                .map(|id| server.queue().signals().subscribe(Topic::Command(*id)))
                .collect();
            let mut still = Vec::with_capacity(watching.len());
            for id in &watching {
                let Some((message, terminal)) = server.task_notification(&caller, id).await else {
                    continue;
                };
                if last.get(id) != Some(&message) {
                    if tx.send(Ok(event(&message))).await.is_err() {
                        return;
                    }
                    idle = tokio::time::Instant::now();
                    last.insert(*id, message);
                }
                if !terminal {
                    still.push(*id);
                }
            }
            watching = still;
            if watching.is_empty() {
                break;
            }
            let wake = futures::future::select_all(changed);
            tokio::select! {
                _ = wake => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = tx.closed() => return,
            }
            if idle.elapsed() >= KEEP_ALIVE {
                if tx
                    .send(Ok(Bytes::from_static(b": keep-alive\n\n")))
                    .await
                    .is_err()
                {
                    return;
                }
                idle = tokio::time::Instant::now();
            }
        }
        let done = Outgoing::result(listen.request_id, json!({"resultType": "complete"}));
        let _ = tx.send(Ok(event(done.message()))).await;
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut response = (StatusCode::OK, Body::from_stream(stream)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One SSE `message` event carrying a JSON-RPC message.
fn event(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}
