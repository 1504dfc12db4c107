//! Embed the queue in your own program: an agent queues a run, a scripted
//! relay picks it up and completes it, and the agent reads the result.
//!
//! `cargo run -p graph-relay-store-memory --example embed`

use std::sync::Arc;

use futures::executor::block_on;
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    block_on(async {
        let queue = Queue::new(
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
            Arc::new(RandomIds),
            QueueConfig::default(),
        );
        let owner = OwnerId::parse("alice")?;
        let project = ProjectId::parse("research")?;
        let agent = Agent::new(
            AgentId::parse("assistant")?,
            owner.clone(),
            [project.clone()],
        );
        let desktop = Device::new(DeviceId::parse("alice-desktop")?, owner);

        // The desktop shares one saved Graph with the project on its first pass.
        let session = GraphSessionId::parse("gs_5f0c6a8e2d3b4c1a9e7f6d5c4b3a2918")?;
        let share = SyncRequest {
            project: project.clone(),
            sessions: vec![SessionMeta {
                graph_session_id: session.clone(),
                name: "Summarise a folder".into(),
                description: "Reads a local folder and writes a summary".into(),
                slug: "summarise-folder".into(),
                version: "3".into(),
                status: "ready".into(),
            }],
            long_poll: false,
            restarted: false,
            running: None,
        };
        queue.sync(&desktop, &share).await?;
        let listed = queue.list_graph_sessions(&agent, &project, 50).await?;
        println!("agent sees {} shared session(s)", listed.sessions.len());

        // The agent queues a run and gets a ticket at once.
        let ticket = queue
            .run_graph_session(
                &agent,
                RunArgs {
                    graph_session_id: session,
                    arguments: json!({"folder": "~/notes"})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                    idempotency_key: IdempotencyKey::parse("summarise-2026-11-30")?,
                },
            )
            .await?;
        println!("ticket {} ({})", ticket.command.id, ticket.message());

        // The desktop's next pass picks it up, runs it and posts the result.
        let work = queue.sync(&desktop, &share).await?;
        for command in work.commands {
            let execution = ExecutionId::parse("exec-0001")?;
            queue.start(&desktop, &command.id, &execution).await?;
            println!(
                "desktop runs {} on channel {}",
                command.id,
                command.id.channel()
            );
            let envelope = ResultEnvelope::build(
                execution,
                FinishStatus::Completed,
                EnvelopeBody {
                    result: json!({"summary": "3 files, all about Rust"}),
                    total_tokens: Some(1234),
                    reported_cost: Some(0.01),
                    error: None,
                },
            );
            queue.complete(&desktop, &command.id, &envelope).await?;
        }

        // The agent reads the result with its ticket.
        let view = queue.get_graph_run(&agent, &ticket.command.id).await?;
        println!("{}", serde_json::to_string_pretty(&view.to_json())?);
        assert_eq!(view.command.status, CommandStatus::Completed);
        Ok(())
    })
}
