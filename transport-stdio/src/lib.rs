//! # graph-relay-transport-stdio
//!
//! MCP over stdin/stdout: one JSON-RPC message per line, answered on
//! stdout, logs (through `tracing`) on stderr only. An MCP client starts
//! the server as a child process; stdio has no OAuth, so the agent
//! identity and its scopes come from configuration as a [`Caller`].
//!
//! ```text
//!  MCP client ── stdin lines ──► serve ──► core::mcp::McpServer ──► Queue
//!             ◄── stdout lines ──┘
//! ```
//!
//! Lines are bounded ([`StdioConfig::max_line_bytes`]): an over-long line
//! is skipped without being held in memory, answered with a JSON-RPC
//! `-32600` error (id `null`), and the server goes on at the next line.
//! End of input ends [`serve`] cleanly.
//!
//! The configured scopes are enforced by the core's authorization table
//! (`graph_relay_core::authz`), as on HTTP: a method or tool the scopes do
//! not cover is answered with the JSON-RPC error `-32003` whose message and
//! `data.scope` name the missing scope.
//!
//! The loop is synchronous (plain blocking IO, each message handled with
//! `futures::executor::block_on`), which suits one client on one pipe and
//! needs no async runtime.

use std::io::{BufRead, Write};

use graph_relay_core::mcp::{Caller, McpServer, McpSession, Outgoing};

/// Default bound on one input line: 1 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1024 * 1024;

/// Settings of the stdio transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioConfig {
    /// Longest accepted line in bytes, without its newline.
    pub max_line_bytes: usize,
}

impl Default for StdioConfig {
    fn default() -> Self {
        Self {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

/// What a finished [`serve`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// Non-empty lines read (including refused ones).
    pub messages: u64,
    /// Replies written.
    pub replies: u64,
    /// Lines refused for being longer than the bound.
    pub oversized: u64,
}

/// Why [`serve`] stopped before the end of its input.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Reading stdin failed.
    #[error("reading the input failed: {0}")]
    Read(#[source] std::io::Error),
    /// Writing stdout failed (the client went away).
    #[error("writing the output failed: {0}")]
    Write(#[source] std::io::Error),
}

/// One line as read by [`read_line`].
enum Line {
    /// A complete line (without the newline) in the buffer.
    Complete,
    /// A line longer than the bound; its bytes were discarded.
    TooLong(usize),
    /// End of input and nothing was pending.
    Eof,
}

/// Reads one line into `buf` (cleared first), keeping at most `max` bytes.
/// The rest of an over-long line is consumed and dropped, never stored.
fn read_line<R: BufRead>(input: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    buf.clear();
    let mut seen = 0usize;
    let mut overflow = false;
    loop {
        let available = match input.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(match (seen, overflow) {
                (0, _) => Line::Eof,
                (n, true) => Line::TooLong(n),
                _ => Line::Complete,
            });
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i)),
            None => (available, None),
        };
        seen += chunk.len();
        if !overflow {
            if buf.len() + chunk.len() > max {
                overflow = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = found.map_or(chunk.len(), |i| i + 1);
        input.consume(used);
        if found.is_some() {
            return Ok(if overflow {
                Line::TooLong(seen)
            } else {
                Line::Complete
            });
        }
    }
}

fn write_reply<W: Write>(output: &mut W, reply: &Outgoing) -> Result<(), ServeError> {
    let mut bytes = reply.to_bytes();
    bytes.push(b'\n');
    output.write_all(&bytes).map_err(ServeError::Write)?;
    output.flush().map_err(ServeError::Write)
}

/// Serves one MCP client: reads messages from `input` until end of input,
/// writes replies to `output`. Blocks the calling thread.
pub fn serve<R: BufRead, W: Write>(
    server: &McpServer,
    caller: &Caller,
    config: &StdioConfig,
    mut input: R,
    mut output: W,
) -> Result<ServeReport, ServeError> {
    let mut session = McpSession::new();
    let mut report = ServeReport::default();
    let mut buf = Vec::new();
    loop {
        match read_line(&mut input, &mut buf, config.max_line_bytes).map_err(ServeError::Read)? {
            Line::Eof => {
                tracing::debug!(?report, "end of input; stdio server stops");
                return Ok(report);
            }
            Line::TooLong(size) => {
                report.messages += 1;
                report.oversized += 1;
                tracing::warn!(
                    size,
                    limit = config.max_line_bytes,
                    "refused an over-long line"
                );
                let reply = Outgoing::line_too_long(size, config.max_line_bytes);
                write_reply(&mut output, &reply)?;
                report.replies += 1;
            }
            Line::Complete => {
                let line = trim(&buf);
                if line.is_empty() {
                    continue;
                }
                report.messages += 1;
                let reply = futures::executor::block_on(server.handle(&mut session, caller, line));
                if let Some(reply) = reply {
                    if let Some(code) = reply.error_code() {
                        tracing::debug!(code = code.code(), "answered with an error");
                    }
                    write_reply(&mut output, &reply)?;
                    report.replies += 1;
                }
            }
        }
    }
}

/// Serves on the process's stdin and stdout (see [`serve`]).
pub fn serve_stdio(
    server: &McpServer,
    caller: &Caller,
    config: &StdioConfig,
) -> Result<ServeReport, ServeError> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    serve(server, caller, config, stdin.lock(), stdout.lock())
}

/// Drops a trailing `\r` and surrounding ASCII whitespace.
fn trim(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
    use graph_relay_core::mcp::ServerInfo;
    use graph_relay_core::prelude::*;
    use graph_relay_store_memory::MemoryStore;
    use serde_json::{Value, json};

    use super::*;

    fn server() -> (McpServer, Caller) {
        let queue = Queue::new(
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
            Arc::new(RandomIds),
            QueueConfig::default(),
        );
        let agent = Agent::new(
            AgentId::parse("assistant").unwrap(),
            OwnerId::parse("alice").unwrap(),
            [ProjectId::parse("p1").unwrap()],
        );
        (
            McpServer::new(
                queue,
                ToolCatalog::published(),
                ServerInfo::new("graph-relay", "test"),
            ),
            Caller::new(agent, [READ_SCOPE, RUN_SCOPE]),
        )
    }

    fn run(input: &[u8], max: usize) -> (ServeReport, Vec<Value>) {
        let (server, caller) = server();
        let mut out = Vec::new();
        let report = serve(
            &server,
            &caller,
            &StdioConfig {
                max_line_bytes: max,
            },
            input,
            &mut out,
        )
        .unwrap();
        let replies = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        (report, replies)
    }

    #[test]
    fn a_legacy_conversation_over_lines() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\r\n",
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        );
        let (report, replies) = run(input.as_bytes(), 4096);
        assert_eq!(report.messages, 4);
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0]["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(
            replies[1]["result"]["tools"],
            ToolCatalog::published().tools_list()
        );
        assert_eq!(replies[2], json!({"jsonrpc": "2.0", "id": 3, "result": {}}));
    }

    #[test]
    fn an_over_long_line_is_refused_and_the_next_one_served() {
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
            "x".repeat(10_000)
        );
        let input = format!(
            "{long}\n{}\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#
        );
        let (report, replies) = run(input.as_bytes(), 256);
        assert_eq!(report.oversized, 1);
        assert_eq!(replies[0]["error"]["code"], -32600);
        assert_eq!(replies[0]["id"], Value::Null);
        assert!(
            replies[0]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("at most 256 bytes")
        );
        assert_eq!(replies[1]["id"], 2);
        assert_eq!(replies[1]["result"], json!({}));
    }

    #[test]
    fn the_over_long_line_reply_matches_its_snapshot() {
        let (_, replies) = run(&[b'x'; 1000], 100);
        let [reply] = replies.as_slice() else {
            panic!("one reply: {replies:?}");
        };
        insta::assert_snapshot!(
            "line_too_long",
            serde_json::to_string_pretty(reply).unwrap()
        );
        let decoded: rmcp::model::ServerJsonRpcMessage =
            serde_json::from_value(reply.clone()).expect("rmcp decodes it");
        assert!(matches!(decoded, rmcp::model::JsonRpcMessage::Error(_)));
    }

    #[test]
    fn an_over_long_last_line_without_newline_is_refused() {
        let (report, replies) = run(&[b'x'; 1000], 100);
        assert_eq!(report.oversized, 1);
        assert_eq!(replies.len(), 1);
    }

    #[test]
    fn bad_json_is_answered_and_eof_ends_cleanly() {
        let (report, replies) = run(b"{oops\n[1,2]\n", 4096);
        assert_eq!(report.messages, 2);
        assert_eq!(replies[0]["error"]["code"], -32700);
        assert_eq!(replies[1]["error"]["code"], -32600);
        let (report, replies) = run(b"", 4096);
        assert_eq!(report, ServeReport::default());
        assert!(replies.is_empty());
    }

    #[test]
    fn a_modern_request_needs_no_handshake() {
        let input = r#"{"jsonrpc":"2.0","id":"a","method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let (_, replies) = run(input.as_bytes(), 4096);
        assert_eq!(
            replies[0]["result"]["supportedVersions"],
            json!(["2026-07-28"])
        );
    }
}
