//! A store outage over stdio: a tool call the store cannot serve is
//! answered with the same retryable JSON-RPC error as over HTTP (`data`
//! says `retryable` and when to retry), and the next call after the
//! outage works on the same connection.

use std::sync::Arc;

use graph_relay_core::catalog::{READ_SCOPE, ToolCatalog};
use graph_relay_core::mcp::{Caller, McpServer, STORE_UNAVAILABLE, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_core::testkit::Outage;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_stdio::{StdioConfig, serve};
use serde_json::{Value, json};

fn get_run(id: u32) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "get_graph_run",
        "arguments": {"command_id": "0193a2b4-0000-7000-8000-000000000001"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string()
}

/// Serves `lines` on a fresh connection; the replies.
fn exchange(server: &McpServer, caller: &Caller, lines: &[String]) -> Vec<Value> {
    let input = lines.join("\n") + "\n";
    let mut output = Vec::new();
    serve(
        server,
        caller,
        &StdioConfig::default(),
        input.as_bytes(),
        &mut output,
    )
    .expect("serve");
    String::from_utf8(output)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON reply"))
        .collect()
}

#[test]
fn a_store_outage_is_a_retryable_error_over_stdio() {
    let store = Arc::new(Outage::store(Arc::new(MemoryStore::new())));
    let queue = Queue::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "test"),
    );
    let agent = Agent::new(
        AgentId::parse("assistant").unwrap(),
        OwnerId::parse("alice").unwrap(),
        [ProjectId::parse("p1").unwrap()],
    );
    let caller = Caller::new(agent, [READ_SCOPE.to_owned()]);

    store.layer().set_down(true);
    let replies = exchange(&server, &caller, &[get_run(1)]);
    let error = &replies[0]["error"];
    assert_eq!(error["code"], -32603, "{replies:?}");
    assert_eq!(error["message"], STORE_UNAVAILABLE);
    assert_eq!(
        error["data"],
        json!({"retryable": true, "retryAfterSeconds": 1})
    );

    store.layer().set_down(false);
    let replies = exchange(&server, &caller, &[get_run(2)]);
    assert_eq!(replies[0]["result"]["isError"], true, "{replies:?}");
}
