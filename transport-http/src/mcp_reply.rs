//! How an MCP message leaves the server: as the JSON body of a response,
//! or as the `message` events of a server-sent event stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use graph_relay_core::mcp::Outgoing;
use serde_json::Value;

/// How often an idle stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `reply` as a JSON response with the status it asks for.
pub(crate) fn json_reply(reply: &Outgoing) -> Response {
    json_response(reply.http_status(), reply.to_bytes())
}

/// [`json_reply`], moving the reply's bytes into the body instead of copying them.
pub(crate) fn into_json_reply(reply: Outgoing) -> Response {
    json_response(reply.http_status(), reply.into_bytes())
}

fn json_response(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // A 503 is always a passing refusal (the queue's store could not
        // serve the request, or every session slot is taken): say when to
        // try again.
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(graph_relay_core::mcp::STORE_RETRY_AFTER_SECONDS),
        );
    }
    response
}

/// One SSE `message` event carrying a JSON-RPC message (compact JSON,
/// so one `data:` line).
pub(crate) fn event(message: &Value) -> Event {
    Event::default().event("message").data(message.to_string())
}

/// An SSE response (`text/event-stream`, `Cache-Control: no-cache`,
/// unbuffered by proxies) of the events `rx` yields, ending when every
/// sender is gone; a `: keep-alive` comment follows every
/// [`KEEP_ALIVE`] without an event.
pub(crate) fn sse_response(mut rx: tokio::sync::mpsc::Receiver<Event>) -> Response {
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|item| item.map(Ok::<_, Infallible>))
    });
    let keep_alive = KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive");
    let mut response = Sse::new(stream).keep_alive(keep_alive).into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use serde_json::json;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn events_are_framed_and_an_idle_stream_is_kept_alive() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let response = sse_response(rx);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers()["cache-control"], "no-cache");
        assert_eq!(response.headers()["x-accel-buffering"], "no");
        let mut body = response.into_body();
        tx.send(event(&json!({"jsonrpc": "2.0", "method": "x"})))
            .await
            .unwrap();
        let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            &frame[..],
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n"
        );
        // Nothing for 15 s (virtual time): a comment line.
        let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&frame[..], b": keep-alive\n\n");
        drop(tx);
        assert!(body.frame().await.is_none());
    }
}
