//! Handles the same `tools/call get_graph_run` request many times, on the
//! path the HTTP transport takes (parse, authorization, header inputs,
//! handling, reply bytes), over the memory store. For instruction counts
//! per request:
//!
//! ```text
//! cargo build --release -p graph-relay-core --example get_graph_run
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     target/release/examples/get_graph_run 10000 [completed]
//! callgrind_annotate --inclusive=yes /tmp/cg.out | head -60
//! ```
//!
//! The first argument is the number of requests (default 10,000); with
//! `completed` the run has finished with a small result, else it is queued.
//! It prints the reply of the last request.

use std::sync::Arc;

use futures::executor::block_on;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::ExecutionId;
use graph_relay_core::mcp::{Caller, Incoming, McpServer, McpSession, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_core::time::{ManualClock, SeededIds, Timestamp};
use graph_relay_store_memory::MemoryStore;
use serde_json::{Map, json};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args.next().map_or(Ok(10_000), |n| n.parse())?;
    let completed = args.next().as_deref() == Some("completed");

    let clock = Arc::new(ManualClock::new(Timestamp(1_767_225_600_000)));
    let queue = Queue::new(
        Arc::new(MemoryStore::new()),
        clock,
        Arc::new(SeededIds::new(1)),
        QueueConfig::default(),
    );
    let owner = OwnerId::parse("alice")?;
    let project = ProjectId::parse("p1")?;
    let agent = Agent::new(
        AgentId::parse("assistant")?,
        owner.clone(),
        [project.clone()],
    );
    let device = Device::new(DeviceId::parse("desktop")?, owner);
    let session = GraphSessionId::parse("gs_0000000000000000000000000000000a")?;
    let sync = SyncRequest {
        project,
        sessions: vec![SessionMeta {
            graph_session_id: session.clone(),
            name: "Graph".into(),
            description: "A graph".into(),
            slug: "graph".into(),
            version: "1".into(),
            status: "ready".into(),
        }],
        long_poll: false,
        restarted: false,
        running: None,
    };
    let command_id = block_on(async {
        queue.sync(&device, &sync).await?;
        let mut arguments = Map::new();
        arguments.insert("q".to_owned(), json!("what is new?"));
        let ticket = queue
            .run_graph_session(
                &agent,
                RunArgs {
                    graph_session_id: session,
                    arguments,
                    idempotency_key: IdempotencyKey::parse("example-key-1")?,
                },
            )
            .await?;
        let id = ticket.command.id;
        if completed {
            queue.sync(&device, &sync).await?;
            let execution = ExecutionId::parse("exec-1")?;
            queue.start(&device, &id, &execution).await?;
            let envelope = ResultEnvelope::build(
                execution,
                FinishStatus::Completed,
                EnvelopeBody {
                    result: json!({"answer": "Nothing \"new\" today.", "n": 3}),
                    total_tokens: Some(42),
                    reported_cost: Some(0.5),
                    error: None,
                },
            );
            queue.complete(&device, &id, &envelope).await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(id)
    })?;

    let server = McpServer::new(
        queue,
        ToolCatalog::published(),
        ServerInfo::new("graph-relay", "0.1.0"),
    );
    let caller = Caller::new(agent, [READ_SCOPE, RUN_SCOPE]);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"get_graph_run","arguments":{{"command_id":"{command_id}"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    );
    let mut last = Vec::new();
    let mut total = 0usize;
    for _ in 0..requests {
        let Ok(incoming) = Incoming::parse(body.as_bytes()) else {
            return Err("the request did not parse".into());
        };
        // What transport-http reads before handling.
        if server.authorize(&incoming, &caller).is_err() {
            return Err("refused".into());
        }
        let header_inputs = (
            incoming.meta_protocol_version().map(str::len),
            incoming.name_param().map(str::len),
            server.may_notify(&incoming),
        );
        std::hint::black_box(header_inputs);
        let reply = block_on(server.handle_incoming(&mut McpSession::new(), &caller, incoming))
            .ok_or("no reply")?;
        last = reply.into_bytes();
        total += last.len();
    }
    println!("{}", String::from_utf8_lossy(&last));
    println!("{requests} requests, {total} reply bytes");
    Ok(())
}
