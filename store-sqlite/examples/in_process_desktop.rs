//! An embedded queue on SQLite with an in-process desktop in long-poll mode:
//! the desktop's held sync is woken by the agent's run, as over HTTP.
//! `cargo run -p graph-relay-store-sqlite --example in_process_desktop`
use std::{sync::Arc, time::Duration};

use futures::{FutureExt, channel::oneshot, executor::block_on, future::join};
use graph_relay_core::prelude::*;
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job, SharedSet, driver::RelayDriver};
use graph_relay_core::time::{Sleeper, ThreadSleeper};
use graph_relay_store_sqlite::{SqliteOutbox, SqliteStore};

/// The desktop's one Graph: it echoes its arguments.
struct Echo;
#[async_trait::async_trait]
impl Executor for Echo {
    async fn execute(&self, job: Job, _: CancelSignal, _: ProgressSink) -> ExecutionOutcome {
        ExecutionOutcome::completed(job.command.arguments.into())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("queue.db"))?);
    let (clock, ids) = (Arc::new(SystemClock), Arc::new(RandomIds));
    let queue = Arc::new(Queue::new(store, clock, ids, QueueConfig::default()));
    let (owner, project) = (OwnerId::parse("alice")?, ProjectId::parse("research")?);
    let projects = [project.clone()];
    let agent = Agent::new(AgentId::parse("assistant")?, owner.clone(), projects);
    let desktop = Device::new(DeviceId::parse("alice-desktop")?, owner);
    let session = GraphSessionId::parse("gs_5f0c6a8e2d3b4c1a9e7f6d5c4b3a2918")?;
    let mut shared = SharedSet::new();
    let echo = SessionMeta::new(session.clone(), "Echo", "echo");
    shared.share(project.clone(), echo);
    let outbox = Arc::new(SqliteOutbox::open(dir.path().join("outbox.db"))?);
    let (executor, sleeper) = (Arc::new(Echo), Arc::new(ThreadSleeper));
    let desk = RelayDriver::in_process(queue.clone(), desktop, shared, outbox, executor, sleeper);
    let (stop, stopped) = oneshot::channel::<()>();
    let agent_side = async {
        // The desktop's first sync shares the Graph with the project.
        let shared_now = || queue.list_graph_sessions(&agent, &project, 50);
        while shared_now().await?.sessions.is_empty() {
            ThreadSleeper.sleep(Duration::from_millis(10)).await;
        }
        let arguments = serde_json::json!({"hello": "desktop"});
        let key = IdempotencyKey::parse("in-process-demo-1")?;
        let args = RunArgs::new(session, arguments, key)?;
        let ticket = queue.run_graph_session(&agent, args).await?;
        let (id, wait) = (ticket.command.id, Duration::from_secs(10));
        let run = queue.wait_graph_run(&agent, &id, wait, &ThreadSleeper);
        let run = run.await?;
        println!("{:?}: {:?}", run.command.status, run.command.completion);
        let _ = stop.send(());
        Ok::<_, Box<dyn std::error::Error>>(run.command.status)
    };
    let (status, ()) = block_on(join(agent_side, desk.run(stopped.map(drop), |_| {})));
    assert_eq!(status?, CommandStatus::Completed, "the Graph ran");
    Ok(())
}
