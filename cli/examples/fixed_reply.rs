//! The ceiling of `vs_rmcp` and `loadtest`: what the HTTP stack of
//! `graph-relay serve` costs alone. The same runtime (tokio's multi-thread
//! scheduler), allocator (mimalloc) and edge (`graph_relay_transport_http::serve`
//! with its default limits, behind an axum `Router`) answer every
//! `POST /mcp` with one fixed JSON-RPC tool result of a chosen size: the
//! request's body is read whole and its `id` copied into the answer, and
//! nothing else is done. No server that does real work on this stack can
//! answer faster or for less CPU, so a figure of `graph-relay serve` over
//! this one says how much of the stack's capacity the queue leaves.
//!
//! ```text
//! cargo run --release -p graph-relay --example fixed_reply -- [ADDR] [--reply-bytes N]
//! ```
//!
//! It prints `listening on http://ADDR/mcp` once it accepts connections.
//! The load clients (`cli/src/baseline.rs`) check the size of its first
//! answer and the id and text of every one.
//! `--reply-bytes` is the answer's body size for a one-digit id (default
//! 600, about a `get_graph_run` answer); each further digit of the id adds
//! a byte, as in a real answer.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::post;
use graph_relay_transport_http::ServeConfig;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The same allocator as the `graph-relay` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What every answer's text holds, so that a client can check it.
pub const MARKER: &str = "fixed reply";

/// The answer's two halves, around the request's id.
struct Reply {
    before_id: &'static str,
    after_id: String,
}

impl Reply {
    /// An answer whose body is `bytes` long for a one-digit id (at least
    /// the shape's own length).
    fn sized(bytes: usize) -> Self {
        let before_id = r#"{"jsonrpc":"2.0","id":"#;
        let shell = |text: &str| {
            format!(
                r#","result":{{"content":[{{"type":"text","text":"{text}"}}],"isError":false}}}}"#
            )
        };
        let bare = before_id.len() + 1 + shell(MARKER).len();
        let text = format!("{MARKER}{}", ".".repeat(bytes.saturating_sub(bare)));
        Self {
            before_id,
            after_id: shell(&text),
        }
    }

    /// The answer to `request`: its `id` (a number or a string, copied as
    /// written) in the fixed shell; `null` when it has none.
    fn answer(&self, request: &[u8]) -> Vec<u8> {
        let id = json_id(request).unwrap_or(b"null");
        let mut body = Vec::with_capacity(self.before_id.len() + id.len() + self.after_id.len());
        body.extend_from_slice(self.before_id.as_bytes());
        body.extend_from_slice(id);
        body.extend_from_slice(self.after_id.as_bytes());
        body
    }
}

/// The raw value of the first `"id":` member of `body`, up to the next `,`
/// or `}`: enough for the compact requests the load clients send.
fn json_id(body: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"id\":";
    let start = body.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &body[start..];
    let end = rest.iter().position(|&b| b == b',' || b == b'}')?;
    Some(rest[..end].trim_ascii()).filter(|id| !id.is_empty())
}

async fn answer(State(reply): State<Arc<Reply>>, body: Bytes) -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], reply.answer(&body))
}

/// The command line: `[ADDR] [--reply-bytes N]`.
fn options() -> Result<(String, usize), Error> {
    let mut addr = "127.0.0.1:0".to_owned();
    let mut bytes = 600;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--reply-bytes" {
            bytes = args.next().ok_or("--reply-bytes needs a value")?.parse()?;
        } else if arg.starts_with('-') {
            return Err(
                format!("unknown flag {arg}; usage: fixed_reply [ADDR] [--reply-bytes N]").into(),
            );
        } else {
            addr = arg;
        }
    }
    Ok((addr, bytes))
}

fn main() -> Result<(), Error> {
    let (addr, bytes) = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let router = axum::Router::new()
            .route("/mcp", post(answer))
            .with_state(Arc::new(Reply::sized(bytes)));
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("listening on http://{}/mcp", listener.local_addr()?);
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        graph_relay_transport_http::serve(listener, router, ServeConfig::default(), stop).await?;
        Ok(())
    })
}
