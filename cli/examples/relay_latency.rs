//! Pickup and cancel latency of the long-poll relay over loopback HTTP.
//!
//! ```text
//! cargo run --release -p graph-relay --example relay_latency [-- RUNS]
//! ```
//!
//! One process: the server (SQLite store in a temporary folder, the real
//! router on 127.0.0.1:0) and the relay driver (HTTP transport, SQLite
//! outbox) with an in-process executor that records when a job starts and
//! returns when told to stop. The agent side calls the queue directly.
//!
//! - pickup: `run_graph_session` returned (queued) → the executor received
//!   the job (the claim to `running` succeeded), RUNS runs;
//! - cancel: `cancel_graph_run` called on a running command → the command
//!   is `cancelled` on the server (held control answered, engine stopped,
//!   completion stored in the outbox and posted), RUNS runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::envelope::FinishStatus;
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_core::relay::driver::RelayDriver;
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job, Relay, RelayConfig, SharedSet};
use graph_relay_core::signals::Topic;
use graph_relay_store_sqlite::{SqliteOutbox, SqliteStore};
use graph_relay_transport_http::auth::{
    AgentToken, DeviceToken, StaticTokens, TokenConfig, hash_token,
};
use graph_relay_transport_http::relay_http::{HttpRelayConfig, HttpRelayTransport};
use graph_relay_transport_http::{HttpConfig, HttpState, TokioSleeper, router};
use tokio::sync::mpsc;

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_latency_device";

/// Tells the bench when a job started; finishes at once or when cancelled.
struct ProbeExecutor {
    started: mpsc::UnboundedSender<(CommandId, Instant)>,
}

#[async_trait]
impl Executor for ProbeExecutor {
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        _progress: ProgressSink,
    ) -> ExecutionOutcome {
        let _ = self.started.send((job.command.id, Instant::now()));
        if job.command.arguments.get("wait").is_some() {
            cancel.await;
            return ExecutionOutcome {
                status: Some(FinishStatus::Cancelled),
                ..Default::default()
            };
        }
        ExecutionOutcome::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<8} runs {:>4}  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        ms(percentile(&samples, 100.0)),
    );
}

async fn wait_status(queue: &Queue, agent: &Agent, id: &CommandId, want: CommandStatus) {
    loop {
        let subscription = queue.signals().subscribe(Topic::Command(*id));
        let status = queue
            .get_graph_run(agent, id)
            .await
            .expect("the run exists")
            .command
            .status;
        if status == want {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), subscription).await;
    }
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().expect("temporary folder");
    let store = Arc::new(SqliteStore::open(dir.path().join("queue.db")).expect("store"));
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "bench".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token("gra_unused"),
            revoked: false,
        }],
        devices: vec![DeviceToken {
            name: "desktop".into(),
            owner: "alice".into(),
            token_sha256: hash_token(DEVICE_TOKEN),
            revoked: false,
        }],
    };
    let state = HttpState::new(
        McpServer::new(
            queue.clone(),
            ToolCatalog::published(),
            ServerInfo::new("bench", "1"),
        ),
        Arc::new(StaticTokens::new(&tokens).expect("tokens")),
        HttpConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });

    let project = ProjectId::parse("p1").expect("project");
    let mut shared = SharedSet::new();
    shared.share(
        project,
        SessionMeta {
            graph_session_id: GraphSessionId::parse(GS).expect("session"),
            name: "Bench".into(),
            description: "".into(),
            slug: "bench".into(),
            version: "1".into(),
            status: "ready".into(),
        },
    );
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let transport =
        HttpRelayTransport::new(HttpRelayConfig::new(format!("http://{addr}"), DEVICE_TOKEN))
            .expect("client");
    let outbox = SqliteOutbox::open(dir.path().join("outbox.db")).expect("outbox");
    let driver = RelayDriver::new(
        Relay::new(RelayConfig::default(), shared, SystemClock.now()),
        Arc::new(transport),
        Arc::new(outbox),
        Arc::new(ProbeExecutor {
            started: started_tx,
        }),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(driver.run(
        async move {
            let _ = stop_rx.await;
        },
        |_| {},
    ));

    let agent = Agent::new(
        AgentId::parse("bench").expect("agent"),
        OwnerId::parse("alice").expect("owner"),
        [ProjectId::parse("p1").expect("project")],
    );
    // Wait until the relay's first sync shared the session.
    while queue
        .list_graph_sessions(&agent, &ProjectId::parse("p1").expect("project"), 50)
        .await
        .map(|l| l.sessions.is_empty())
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queue_run = |i: usize, wait: bool| {
        let queue = queue.clone();
        let agent = agent.clone();
        async move {
            let mut arguments = serde_json::Map::new();
            if wait {
                arguments.insert("wait".into(), true.into());
            }
            let ticket = queue
                .run_graph_session(
                    &agent,
                    RunArgs {
                        graph_session_id: GraphSessionId::parse(GS).expect("session"),
                        arguments,
                        idempotency_key: IdempotencyKey::parse(&format!("bench-key-{wait}-{i}"))
                            .expect("key"),
                    },
                )
                .await
                .expect("queued");
            (ticket.command.id, Instant::now())
        }
    };

    let mut pickup = Vec::with_capacity(runs);
    for i in 0..runs {
        let (id, queued) = queue_run(i, false).await;
        let (got, at) = started.recv().await.expect("executor alive");
        assert_eq!(got, id);
        pickup.push(at.saturating_duration_since(queued));
        wait_status(&queue, &agent, &id, CommandStatus::Completed).await;
    }
    let mut cancel = Vec::with_capacity(runs);
    for i in 0..runs {
        let (id, _) = queue_run(i, true).await;
        let (got, _) = started.recv().await.expect("executor alive");
        assert_eq!(got, id);
        let asked = Instant::now();
        queue
            .cancel_graph_run(&agent, &id)
            .await
            .expect("cancel accepted");
        wait_status(&queue, &agent, &id, CommandStatus::Cancelled).await;
        cancel.push(asked.elapsed());
    }
    println!("relay latency over loopback HTTP, long-poll mode, SQLite store and outbox");
    report("pickup", pickup);
    report("cancel", cancel);
    let _ = stop_tx.send(());
    let _ = relay.await;
}
