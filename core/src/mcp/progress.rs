//! MCP progress notifications for a `get_graph_run` that waits.
//!
//! A request that carries `_meta.progressToken` and waits (`wait_seconds`)
//! gets one `notifications/progress` through the transport's [`Notifier`]
//! when the wait starts and again whenever the run's status or progress
//! changes, before its result:
//!
//! ```json
//! {"jsonrpc": "2.0", "method": "notifications/progress",
//!  "params": {"progressToken": "…", "progress": 40, "total": 100,
//!             "message": "Running on the owner's desktop: step 2 of 5 (40%)."}}
//! ```
//!
//! `progress` must grow with every notification (the MCP rule): it is the
//! desktop's percentage when the report carries one above the last value
//! sent (then `total` is 100), and otherwise the last value plus one, a
//! counter, without `total`. `message` is the task status message of
//! [`super::tasks`], so every surface says the same words.

use serde_json::Value;

use super::Incoming;
use super::wire::{JsonRpcNotification, ProgressParams, to_value};
use crate::queue::RunView;

/// Where a request's notifications go before its result. Streaming
/// transports write each one as it comes: Streamable HTTP as an event of
/// the SSE response, stdio as a line.
pub trait Notifier: Send + Sync {
    /// Sends one JSON-RPC notification.
    fn notify(&self, notification: Value);
}

/// A [`Notifier`] that drops everything (a transport that cannot stream).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoNotifier;

impl Notifier for NoNotifier {
    fn notify(&self, _notification: Value) {}
}

/// The progress token of a request (`_meta.progressToken`, a string or an
/// integer), if it has a usable one.
pub(super) fn token(incoming: &Incoming) -> Option<Value> {
    let token = incoming.progress_token()?;
    (token.is_string() || token.is_i64() || token.is_u64()).then(|| token.clone())
}

/// The notifications of one waiting request.
pub(super) struct ProgressNotifications<'a> {
    token: Value,
    notifier: &'a dyn Notifier,
    last: Option<f64>,
}

impl<'a> ProgressNotifications<'a> {
    pub(super) fn new(token: Value, notifier: &'a dyn Notifier) -> Self {
        Self {
            token,
            notifier,
            last: None,
        }
    }

    /// Sends the notification for the run as it now is.
    pub(super) fn observe(&mut self, view: &RunView) {
        let percent = view.command.progress.as_ref().and_then(|p| p.percent);
        let (progress, total) = next_value(percent, self.last);
        self.last = Some(progress);
        let params = ProgressParams {
            message: super::tasks::task(view).status_message,
            progress,
            progress_token: self.token.clone(),
            total,
        };
        self.notifier.notify(to_value(&JsonRpcNotification::new(
            "notifications/progress",
            params,
        )));
    }
}

/// The `progress` (and `total`) of the next notification: the percentage
/// when it is above the last value sent, else a counter (last + 1, or 0 at
/// first). Always above `last`.
fn next_value(percent: Option<f64>, last: Option<f64>) -> (f64, Option<u32>) {
    match (percent, last) {
        (Some(p), None) => (p, Some(100)),
        (Some(p), Some(last)) if p > last => (p, Some(100)),
        (_, None) => (0.0, None),
        (_, Some(last)) => (last + 1.0, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn progress_always_grows() {
        let mut last = None;
        let mut sent = Vec::new();
        for percent in [
            None,
            None,
            Some(20.0),
            Some(20.0),
            Some(10.0),
            Some(60.0),
            None,
        ] {
            let (value, total) = next_value(percent, last);
            sent.push((value, total));
            last = Some(value);
        }
        assert_eq!(
            sent,
            [
                (0.0, None),
                (1.0, None),
                (20.0, Some(100)),
                (21.0, None),
                (22.0, None),
                (60.0, Some(100)),
                (61.0, None)
            ]
        );
    }

    #[test]
    fn tokens_are_strings_or_integers() {
        let call = |meta: Value| {
            let message = json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "get_graph_run", "_meta": meta}
            });
            // Both ways in: from bytes, and from a decoded value.
            let parsed = Incoming::parse(message.to_string().as_bytes()).expect("a request");
            let decoded = Incoming::from_value(message).expect("a request");
            let token = token(&parsed);
            assert_eq!(token, super::token(&decoded));
            token
        };
        assert_eq!(call(json!({"progressToken": "t"})), Some(json!("t")));
        assert_eq!(call(json!({"progressToken": 7})), Some(json!(7)));
        assert_eq!(call(json!({"progressToken": 1.5})), None);
        assert_eq!(call(json!({"progressToken": {"a": 1}})), None);
        assert_eq!(call(json!({"other": 1})), None);
        assert_eq!(call(json!(["progressToken", "t"])), None);
        assert_eq!(call(json!(null)), None);
    }
}
