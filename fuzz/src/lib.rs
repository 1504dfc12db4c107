//! # graph-relay-fuzz
//!
//! The bodies of graph-relay's fuzz targets, as plain functions. The
//! cargo-fuzz binaries in `fuzz_targets/` call them (feature `libfuzzer`),
//! and `tests/replay.rs` replays the committed corpora through them in the
//! normal test suite, so CI checks every target without a fuzzing campaign.
//! Each function panics when an invariant breaks; that is the finding.
//!
//! | target | input | what must hold |
//! |---|---|---|
//! | [`mcp_message`] | newline-separated raw messages | never panics; every answer is valid JSON-RPC 2.0; a refused request changes nothing |
//! | [`tool_args`] | a JSON document | decoding never panics; accepted arguments obey the schema |
//! | [`queue_ops`] | `Arbitrary` agent and relay operations | the reference model of `graph_relay_core::testkit::model` |
//! | [`envelope`] | arbitrary Unicode | never over 100,000; truncated exactly when the full form does not fit; error cuts keep whole characters |
//! | [`relay_events`] | arbitrary event orders and failures against a model server with leases, restarts and un-sharing | never two commands at once; no outbox item dropped without a 2xx or a final refusal; every claim follows a re-check that holds at that moment; a restart is announced only once the reports from before it are delivered; a run the server closed is stopped once and never reported; progress is only the running execution's latest, one post at a time and at most one per second; the server never holds shares in a project the desktop forgot; nothing that needs the owner's approval runs unless approved, and only a question still open is withdrawn |

use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use futures::executor::block_on;
use graph_relay_core::args::ToolArgs;
use graph_relay_core::catalog::{ToolCatalog, ToolKind};
use graph_relay_core::envelope::{
    EnvelopeBody, FinishStatus, ResultEnvelope, js_json_length, utf16_len,
};
use graph_relay_core::ids::ExecutionId;
use graph_relay_core::limits::{ERROR_LIMIT, RESULT_LIMIT};
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo};
use graph_relay_core::testkit::{World, model, p1};
use graph_relay_store_memory::MemoryStore;
use serde_json::{Value, json};

mod relay;

pub use self::relay::relay_events;

// ----- 1. MCP messages ------------------------------------------------------

/// Feeds each line of `data` to the core's MCP handling as one message.
pub fn mcp_message(data: &[u8]) {
    let store = Arc::new(MemoryStore::new());
    let world = World::new(store.clone());
    // One shared session, so that `run_graph_session` can succeed.
    block_on(world.sync(&world.device, p1(), &[1]));
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(5))
        .build()
        .unwrap_or_default();
    let server = McpServer::new(
        world.queue.clone(),
        catalog,
        ServerInfo::new("graph-relay-fuzz", "0"),
    );
    let caller = Caller::new(world.agent.clone(), ["osfoundry:read", "osfoundry:run"]);
    let mut session = McpSession::new();
    for line in data.split(|b| *b == b'\n').take(32) {
        let before = store.commands();
        let answer = block_on(server.handle(&mut session, &caller, line));
        let Some(answer) = answer else {
            assert_eq!(
                store.commands(),
                before,
                "a notification or response changed state"
            );
            continue;
        };
        let message: Value =
            serde_json::from_slice(&answer.to_bytes()).expect("every answer is JSON");
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        assert!(
            message.get("id").is_some(),
            "an answer always carries an id (null if unknown): {message}"
        );
        let (result, error) = (message.get("result"), message.get("error"));
        assert!(
            result.is_some() != error.is_some(),
            "exactly one of result and error: {message}"
        );
        if let Some(error) = error {
            assert!(error["code"].is_i64(), "{message}");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{message}"
            );
        }
        let refused = error.is_some() || result.is_some_and(|r| r["isError"] == json!(true));
        if refused {
            assert_eq!(
                store.commands(),
                before,
                "a refused request changed state: {message}"
            );
        }
    }
}

// ----- 2. tool arguments ----------------------------------------------------

/// Decodes `data` (when it is JSON) as the arguments of every tool.
pub fn tool_args(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for kind in ToolKind::ALL {
        for max_wait in [None, Some(60)] {
            let decoded = ToolArgs::decode(kind, Some(&value), max_wait);
            let object = value.as_object();
            match decoded {
                Ok(args) => {
                    let object = object.expect("only objects are accepted");
                    let allowed: &[&str] = match kind {
                        ToolKind::RunGraphSession => {
                            &["graph_session_id", "arguments", "idempotency_key"]
                        }
                        ToolKind::ListGraphSessions => &["project_id", "limit"],
                        ToolKind::GetGraphRun => &["command_id", "wait_seconds"],
                        ToolKind::CancelGraphRun => &["command_id"],
                    };
                    assert!(
                        object.keys().all(|k| allowed.contains(&k.as_str())),
                        "{value}"
                    );
                    match args {
                        ToolArgs::Run(a) => {
                            assert!(
                                (8..=128).contains(&a.idempotency_key.as_str().chars().count())
                            );
                        }
                        ToolArgs::List(a) => assert!((1..=50).contains(&a.limit)),
                        ToolArgs::Get(a) => assert!(a.wait_seconds <= max_wait.unwrap_or(0)),
                        ToolArgs::Cancel(_) => {}
                    }
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
}

// ----- 3. queue operations --------------------------------------------------

/// Applies arbitrary agent and relay operations to `Queue` + the memory store.
pub fn queue_ops(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(ops) = Vec::<model::Op>::arbitrary(&mut u) else {
        return;
    };
    if ops.len() > 200 {
        return;
    }
    model::check(Arc::new(MemoryStore::new()), &ops);
}

// ----- 4. result envelope ---------------------------------------------------

#[derive(Debug, Arbitrary)]
struct EnvelopeInput {
    piece: String,
    repeat: u16,
    error: String,
    error_repeat: u8,
    tokens: Option<u64>,
    cost: Option<i32>,
    status: u8,
}

/// Builds envelopes from arbitrary Unicode and checks the limits of SPEC §7.
pub fn envelope(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = EnvelopeInput::arbitrary(&mut u) else {
        return;
    };
    // Up to 150,000 bytes: past the 100,000-unit limit without slowing every run.
    let result = input
        .piece
        .repeat(usize::from(input.repeat).min(150_000 / input.piece.len().max(1)));
    let error = input.error.repeat(usize::from(input.error_repeat));
    // Oracle: for strings, serde_json escapes exactly as JSON.stringify does.
    let text = Value::String(result.clone());
    let serialized = serde_json::to_string(&text).expect("a string serializes");
    assert_eq!(js_json_length(&text), serialized.encode_utf16().count());

    let status = [
        FinishStatus::Completed,
        FinishStatus::Failed,
        FinishStatus::Cancelled,
    ][usize::from(input.status % 3)];
    let exec = ExecutionId::parse("exec-fuzz").expect("valid id");
    let body = EnvelopeBody {
        result: text,
        total_tokens: input.tokens,
        reported_cost: input.cost.map(|c| f64::from(c) / 100.0),
        error: (!error.is_empty()).then(|| error.clone()),
    };
    let built = ResultEnvelope::build(exec.clone(), status, body.clone());
    assert!(built.js_length() <= RESULT_LIMIT, "never over the limit");
    assert!(built.validate().is_ok());
    // The cut error is a prefix of whole characters, within the limit, and as long as it can be.
    let mut cut = error.clone();
    graph_relay_core::envelope::cut_utf16(&mut cut, ERROR_LIMIT);
    assert!(error.starts_with(&cut) && utf16_len(&cut) <= ERROR_LIMIT);
    if cut.len() < error.len() {
        let next = error[cut.len()..].chars().next().map_or(0, char::len_utf16);
        assert!(
            utf16_len(&cut) + next > ERROR_LIMIT,
            "cut shorter than needed"
        );
    }
    let full = ResultEnvelope {
        execution_id: exec,
        status,
        body: Some(std::sync::Arc::new(EnvelopeBody {
            error: (!error.is_empty()).then_some(cut),
            ..body
        })),
    };
    assert_eq!(
        built.is_truncated(),
        full.js_length() > RESULT_LIMIT,
        "truncated exactly when the full form does not fit"
    );
    if !built.is_truncated() {
        assert_eq!(built, full);
    }
    // The wire form reads back as it was written.
    let wire = serde_json::to_string(&built).expect("serializes");
    let back: ResultEnvelope = serde_json::from_str(&wire).expect("reads back");
    assert_eq!(back.is_truncated(), built.is_truncated());
}
