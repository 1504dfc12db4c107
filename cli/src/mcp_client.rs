//! A small MCP client over Streamable HTTP (the stateless revision) with a
//! bearer token: what the scripted agent of `graph-relay demo` and the
//! agents of `graph-relay loadtest` use to talk real MCP to a server.
//!
//! One JSON-RPC request per POST to `/mcp`; a JSON reply (not an event
//! stream). Tool errors (`isError`) are answers, not failures: [`McpClient::call`]
//! returns them, [`McpClient::call_ok`] turns them into [`McpClientError::Tool`].

use std::time::Duration;

use serde_json::{Value, json};

/// MCP revision the client speaks (stateless HTTP).
pub const PROTOCOL: &str = "2026-07-28";

/// Why an MCP request did not give the answer asked for.
#[derive(Debug, thiserror::Error)]
pub enum McpClientError {
    /// The request failed on the wire (connect, timeout, body).
    #[error("MCP request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// The server answered something that is not a JSON-RPC reply.
    #[error("{method} answered {status} with a body that is not JSON ({reason}): {body}")]
    NotJson {
        /// The JSON-RPC method.
        method: String,
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// Its `Retry-After` in seconds, when it gave one.
        retry_after: Option<u64>,
        /// The parse error.
        reason: String,
        /// The body (at most 500 characters of it).
        body: String,
    },
    /// The server answered a JSON-RPC error.
    #[error("{method} answered an error: {error}")]
    Rpc {
        /// The JSON-RPC method.
        method: String,
        /// The HTTP status it came with.
        status: reqwest::StatusCode,
        /// Its `Retry-After` in seconds, when it gave one.
        retry_after: Option<u64>,
        /// The `error` member.
        error: Value,
    },
    /// The tool answered a tool error (`isError`).
    #[error("{tool}: {text}")]
    Tool {
        /// The tool.
        tool: String,
        /// The error text the model would read.
        text: String,
    },
}

/// The longest `Retry-After` a client waits; a longer one is taken as this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);
/// The back-off of a failure that named no delay: doubled from this …
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// … up to this.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

impl McpClientError {
    /// How long to wait before sending the request again, when sending it
    /// again is what a careful client does (`attempt` counts from 0): no
    /// answer at all, a 5xx or 429 that is not a JSON-RPC reply (a load
    /// balancer's or proxy's page), or a JSON-RPC error whose `data` says
    /// `retryable`. `Retry-After` (or the error's `retryAfterSeconds`) is
    /// honoured up to 5 s; otherwise the wait doubles from 100 ms to 1 s.
    /// `None`: the answer is final.
    pub fn retry_delay(&self, attempt: u32) -> Option<Duration> {
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << attempt.min(10))
            .min(MAX_BACKOFF);
        let told = |seconds: Option<u64>| {
            seconds.map_or(backoff, |s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
        };
        match self {
            McpClientError::Http(_) => Some(backoff),
            McpClientError::NotJson {
                status,
                retry_after,
                ..
            } if status.is_server_error() || *status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                Some(told(*retry_after))
            }
            McpClientError::Rpc {
                error, retry_after, ..
            } if error["data"]["retryable"] == Value::Bool(true) => Some(told(
                retry_after.or_else(|| error["data"]["retryAfterSeconds"].as_u64()),
            )),
            _ => None,
        }
    }

    /// A short description of the failure for counting by kind: what came
    /// back (status, `Retry-After`, JSON-RPC code, `retryable`) or that
    /// nothing did.
    pub fn kind(&self) -> String {
        let after =
            |seconds: &Option<u64>| seconds.map_or(String::new(), |s| format!(", Retry-After {s}"));
        match self {
            McpClientError::Http(e) if e.is_timeout() => "no answer in time".into(),
            McpClientError::Http(e) if e.is_connect() => "cannot connect".into(),
            McpClientError::Http(_) => "connection lost".into(),
            McpClientError::NotJson {
                status,
                retry_after,
                ..
            } => format!("HTTP {}{} (not JSON)", status.as_u16(), after(retry_after)),
            McpClientError::Rpc {
                status,
                retry_after,
                error,
                ..
            } => format!(
                "HTTP {}{}, JSON-RPC {}{}",
                status.as_u16(),
                after(retry_after),
                error["code"],
                if error["data"]["retryable"] == Value::Bool(true) {
                    " retryable"
                } else {
                    ""
                }
            ),
            McpClientError::Tool { .. } => "tool error".into(),
        }
    }
}

/// What a `tools/call` answered.
#[derive(Debug, Clone)]
pub struct ToolAnswer {
    /// The tool reported an error.
    pub is_error: bool,
    /// The first text content.
    pub text: String,
    /// `structuredContent` (`Null` when absent).
    pub structured: Value,
}

/// An MCP client over Streamable HTTP with a bearer token.
#[derive(Debug, Clone)]
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl McpClient {
    /// A client of the server at `base` (`http://host:port`, no `/mcp`),
    /// whose requests time out after `timeout`.
    pub fn new(base: &str, token: &str, timeout: Duration) -> Result<Self, McpClientError> {
        Ok(Self {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            url: format!("{}/mcp", base.trim_end_matches('/')),
            token: token.into(),
        })
    }

    /// One JSON-RPC request; returns its `result`.
    pub async fn request(
        &self,
        method: &str,
        name: Option<&str>,
        params: Value,
    ) -> Result<Value, McpClientError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-method", method);
        if let Some(name) = name {
            request = request.header("mcp-name", name);
        }
        let response = request.json(&body).send().await?;
        let status = response.status();
        // Only the delay-seconds form: the servers and the load balancers
        // in front of them send no HTTP dates.
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let text = response.text().await?;
        let mut reply: Value =
            serde_json::from_str(&text).map_err(|e| McpClientError::NotJson {
                method: method.into(),
                status,
                retry_after,
                reason: e.to_string(),
                body: text.chars().take(500).collect(),
            })?;
        if let Some(error) = reply.get_mut("error") {
            return Err(McpClientError::Rpc {
                method: method.into(),
                status,
                retry_after,
                error: error.take(),
            });
        }
        Ok(reply
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null))
    }

    /// The `_meta` of a stateless request.
    fn meta() -> Value {
        json!({"io.modelcontextprotocol/protocolVersion": PROTOCOL,
               "io.modelcontextprotocol/clientCapabilities": {}})
    }

    /// `tools/list`: the names of the tools.
    pub async fn list_tools(&self) -> Result<Vec<String>, McpClientError> {
        let result = self
            .request("tools/list", None, json!({"_meta": Self::meta()}))
            .await?;
        Ok(result["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `tools/call` of `tool`; a tool error is an answer.
    pub async fn call(&self, tool: &str, arguments: Value) -> Result<ToolAnswer, McpClientError> {
        let mut result = self
            .request(
                "tools/call",
                Some(tool),
                json!({"name": tool, "arguments": arguments, "_meta": Self::meta()}),
            )
            .await?;
        Ok(ToolAnswer {
            is_error: result["isError"].as_bool().unwrap_or(false),
            text: result["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            structured: result
                .get_mut("structuredContent")
                .map(Value::take)
                .unwrap_or(Value::Null),
        })
    }

    /// A tool call that must not be a tool error; returns its structured content.
    pub async fn call_ok(&self, tool: &str, arguments: Value) -> Result<Value, McpClientError> {
        let answer = self.call(tool, arguments).await?;
        if answer.is_error {
            return Err(McpClientError::Tool {
                tool: tool.into(),
                text: answer.text,
            });
        }
        Ok(answer.structured)
    }

    /// `get_graph_run` of `id`, with `wait_seconds` when it is not 0.
    pub async fn get_graph_run(
        &self,
        id: &str,
        wait_seconds: u32,
    ) -> Result<Value, McpClientError> {
        let mut arguments = json!({"command_id": id});
        if wait_seconds > 0 {
            arguments["wait_seconds"] = json!(wait_seconds);
        }
        self.call_ok("get_graph_run", arguments).await
    }
}

/// Whether a run's status (as `get_graph_run` shows it) is terminal.
pub fn is_terminal(run: &Value) -> bool {
    matches!(
        run["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(status: u16, retry_after: Option<u64>, error: Value) -> McpClientError {
        McpClientError::Rpc {
            method: "tools/call".into(),
            status: reqwest::StatusCode::from_u16(status).expect("a status"),
            retry_after,
            error,
        }
    }

    fn page(status: u16, retry_after: Option<u64>) -> McpClientError {
        McpClientError::NotJson {
            method: "tools/call".into(),
            status: reqwest::StatusCode::from_u16(status).expect("a status"),
            retry_after,
            reason: "expected value".into(),
            body: "<html>".into(),
        }
    }

    #[test]
    fn a_retryable_store_error_waits_retry_after() {
        let e = rpc(
            503,
            Some(1),
            json!({"code": -32603, "message": "store unavailable",
                   "data": {"retryable": true, "retryAfterSeconds": 1}}),
        );
        assert_eq!(e.retry_delay(0), Some(Duration::from_secs(1)));
        assert_eq!(
            e.kind(),
            "HTTP 503, Retry-After 1, JSON-RPC -32603 retryable"
        );
        // Without the header, the error's own delay; a long one is capped.
        let e = rpc(
            200,
            None,
            json!({"code": -32603, "data": {"retryable": true, "retryAfterSeconds": 60}}),
        );
        assert_eq!(e.retry_delay(0), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn a_final_error_is_not_retried() {
        let e = rpc(400, None, json!({"code": -32602, "message": "bad params"}));
        assert_eq!(e.retry_delay(0), None);
        assert_eq!(e.kind(), "HTTP 400, JSON-RPC -32602");
        assert_eq!(page(404, None).retry_delay(0), None);
        let tool = McpClientError::Tool {
            tool: "get_graph_run".into(),
            text: "Graph run not found or access removed".into(),
        };
        assert_eq!(tool.retry_delay(0), None);
    }

    #[test]
    fn a_balancer_page_is_retried_with_a_growing_backoff() {
        let e = page(502, None);
        assert_eq!(e.kind(), "HTTP 502 (not JSON)");
        assert_eq!(e.retry_delay(0), Some(Duration::from_millis(100)));
        assert_eq!(e.retry_delay(2), Some(Duration::from_millis(400)));
        assert_eq!(e.retry_delay(30), Some(MAX_BACKOFF));
        assert_eq!(
            page(503, Some(2)).retry_delay(0),
            Some(Duration::from_secs(2))
        );
        assert_eq!(page(429, None).retry_delay(0), Some(FIRST_BACKOFF));
    }
}
