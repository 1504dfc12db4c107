//! What one request costs in memory while it is parsed and handled, by
//! the shape of its body: at most a small multiple of its size (SPEC §10,
//! "bounded by construction"), however many small values it is made of.
//!
//! A counting global allocator records the peak of live bytes above what
//! was live before the request (the body itself not counted), for a 1 MiB
//! body of each shape. It is this test binary's own allocator, so it
//! measures nothing else; the figures print with `--nocapture`:
//!
//! ```text
//! cargo test -p graph-relay-core --test request_memory -- --nocapture
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::executor::block_on;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_core::mcp::{Caller, Incoming, McpServer, McpSession, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;

/// Counts live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::SeqCst) + size;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters only observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller's contract for `GlobalAlloc::realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the old and the new block both live, as during a copy.
            grew(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The body size of every shape.
const SIZE: usize = 1 << 20;
/// The most one request may cost, as a multiple of its body.
const MOST: usize = 4;

const GS: &str = "gs_0000000000000000000000000000000a";

/// `item` repeated to fill about [`SIZE`] bytes, comma-separated.
fn many(item: &str) -> String {
    let count = SIZE / (item.len() + 1);
    let mut out = String::with_capacity(SIZE + item.len());
    for i in 0..count {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out
}

fn modern_call(tool: &str, arguments: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    )
    .into_bytes()
}

fn run_with(inner: &str) -> Vec<u8> {
    modern_call(
        "run_graph_session",
        &format!(
            r#"{{"graph_session_id":"{GS}","idempotency_key":"memory-key-1","arguments":{inner}}}"#
        ),
    )
}

fn initialize_with(client_info: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{client_info}}}}}"#
    )
    .into_bytes()
}

/// What a run refused for its `arguments` says: their size as compact
/// JSON, as serde_json writes the `Value` they read as.
fn too_large(inner: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(inner).unwrap();
    format!(
        "`arguments` is too large ({} bytes; the limit is 65536)",
        value.to_string().len()
    )
}

/// The bodies: (name, bytes, a text the reply must contain).
fn shapes() -> Vec<(&'static str, Vec<u8>, String)> {
    let numbers = format!("[{}]", many("7"));
    let nested = format!(
        "[{}]",
        many(&format!("{}1{}", "[".repeat(100), "]".repeat(100)))
    );
    let objects = format!("[{}]", many(r#"{"a":1,"b":2}"#));
    let escaped = format!("[{}]", many(r#"{"a":"\n"}"#));
    let long = format!("\"{}\"", "x".repeat(SIZE));
    let keys: String = (0..SIZE / 10).map(|i| format!("\"k{i}\":0,")).collect();
    let keys = format!("{{{}\"graph_session_id\":\"{GS}\"}}", keys);
    vec![
        (
            "clientInfo: an array of small numbers",
            initialize_with(&format!(r#"{{"name":"c","version":"1","junk":{numbers}}}"#)),
            "`clientInfo` is larger than".to_owned(),
        ),
        (
            "clientInfo: small objects with escapes",
            initialize_with(&format!(r#"{{"name":"c","junk":{escaped}}}"#)),
            "`clientInfo` is larger than".to_owned(),
        ),
        (
            "clientInfo: a long string",
            initialize_with(&format!(r#"{{"name":{long}}}"#)),
            "`clientInfo` is larger than".to_owned(),
        ),
        (
            "arguments: an array of small numbers",
            run_with(&format!(r#"{{"x":{numbers}}}"#)),
            too_large(&format!(r#"{{"x":{numbers}}}"#)),
        ),
        (
            "arguments: deeply nested arrays",
            run_with(&format!(r#"{{"x":{nested}}}"#)),
            too_large(&format!(r#"{{"x":{nested}}}"#)),
        ),
        (
            "arguments: many small objects",
            run_with(&format!(r#"{{"x":{objects}}}"#)),
            too_large(&format!(r#"{{"x":{objects}}}"#)),
        ),
        (
            "arguments: a long string",
            run_with(&format!(r#"{{"x":{long}}}"#)),
            too_large(&format!(r#"{{"x":{long}}}"#)),
        ),
        (
            // Read as a `Value` is, the later member wins: what is left
            // is small, and the run is judged on it (its session is not
            // shared here).
            "arguments: a long member replaced by a repeated name",
            run_with(&format!(r#"{{"x":{numbers},"x":{{"a":1}}}}"#)),
            "Graph session not found or access removed".to_owned(),
        ),
        (
            "tool arguments: an array of small numbers",
            modern_call("run_graph_session", &numbers),
            "arguments must be a JSON object".to_owned(),
        ),
        (
            "tool arguments: many unknown fields",
            modern_call("run_graph_session", &keys),
            "unknown field `k0`".to_owned(),
        ),
        (
            "params: an unread member of small objects",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"junk":{objects},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
            )
            .into_bytes(),
            "run_graph_session".to_owned(),
        ),
    ]
}

#[test]
fn a_request_costs_at_most_a_small_multiple_of_its_size_whatever_its_shape() {
    let queue = Queue::new(
        Arc::new(MemoryStore::new()),
        Arc::new(ManualClock::new(Timestamp(1_767_225_600_000))),
        Arc::new(SeededIds::new(1)),
        QueueConfig::default(),
    );
    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "0.1.0"),
    );
    let owner = OwnerId::parse("alice").unwrap();
    let agent = Agent::new(
        AgentId::parse("assistant").unwrap(),
        owner,
        [ProjectId::parse("p1").unwrap()],
    );
    let caller = Caller::new(agent, [READ_SCOPE, RUN_SCOPE]);
    let mut failures = Vec::new();
    for (name, body, expected) in shapes() {
        assert!(body.len() >= SIZE - 64, "{name}: {} bytes", body.len());
        let mut session = McpSession::new();
        let before = LIVE.load(Ordering::SeqCst);
        PEAK.store(before, Ordering::SeqCst);
        let reply = block_on(server.handle(&mut session, &caller, &body)).expect("a reply");
        let cost = PEAK.load(Ordering::SeqCst) - before;
        let text = String::from_utf8_lossy(reply.as_bytes());
        let shown: String = text.chars().take(240).collect();
        eprintln!(
            "{name}: body {} bytes, peak {cost} bytes ({:.2}x)\n    {shown}",
            body.len(),
            cost as f64 / body.len() as f64
        );
        assert!(text.contains(&expected), "{name}: {shown}");
        if cost > MOST * body.len() {
            failures.push(format!("{name}: {cost} bytes for {}", body.len()));
        }
        drop(reply);
    }
    // `subscriptions/listen` with a long list of task ids (small objects
    // among them): the stream watches the first few, as before.
    let ids = format!(
        "[{}]",
        many(r#"{"a":1},"00000000-0000-4000-8000-000000000000""#)
    );
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"l1","method":"subscriptions/listen","params":{{"notifications":{{"taskIds":{ids}}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"extensions":{{"io.modelcontextprotocol/tasks":{{}}}}}}}}}}}}"#
    )
    .into_bytes();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let incoming = Incoming::parse(&body).expect("a request");
    let listen = block_on(server.listen(&caller, &incoming)).map(|l| l.acknowledged);
    let cost = PEAK.load(Ordering::SeqCst) - before;
    eprintln!(
        "listen: many task ids: body {} bytes, peak {cost} bytes ({:.2}x)\n    {listen:?}",
        body.len(),
        cost as f64 / body.len() as f64
    );
    assert!(listen.is_ok(), "{listen:?}");
    if cost > MOST * body.len() {
        failures.push(format!("listen: {cost} bytes for {}", body.len()));
    }
    drop((listen, incoming));
    assert!(failures.is_empty(), "more than {MOST}x: {failures:#?}");
}
