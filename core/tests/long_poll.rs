//! A long-polling desktop as the server sees it, over the memory store on
//! a manual clock: the requests a long-polling relay sends, in the order
//! its passes send them (core's `relay::Relay`), answered by the queue.
//!
//! - Its held control requests renew a short lease in time: a run longer
//!   than the lease stays `running` and ends `completed`.
//! - A desktop that just delivered a result is still a long-polling one:
//!   the next ticket's first check is the long-poll one.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use futures::future::BoxFuture;
use graph_relay_core::prelude::*;
use graph_relay_core::queue::{ControlAnswer, RunTicket};
use graph_relay_core::time::Sleeper;
use graph_relay_store_memory::MemoryStore;
use serde_json::Map;

/// A sleeper that moves the manual clock by what is slept: a held request
/// lasts as long, in clock time, as the queue holds it.
struct Advancing(Arc<ManualClock>);

impl Sleeper for Advancing {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.0.advance(duration);
        Box::pin(async {})
    }
}

/// The lease a running command was granted.
fn lease(command: &CommandRecord) -> Duration {
    let (Some(expires), Some(heard)) = (command.lease_expires_at, command.heard_at) else {
        panic!("no lease: {command:?}");
    };
    expires.since(heard)
}

struct Desk {
    queue: Queue,
    clock: Arc<ManualClock>,
    agent: Agent,
    device: Device,
    project: ProjectId,
    session: GraphSessionId,
}

impl Desk {
    fn new(config: QueueConfig) -> Self {
        let clock = Arc::new(ManualClock::new(Timestamp(1_767_225_600_000)));
        let queue = Queue::new(
            Arc::new(MemoryStore::new()),
            clock.clone(),
            Arc::new(SeededIds::new(3)),
            config,
        );
        let owner = OwnerId::parse("alice").unwrap();
        let project = ProjectId::parse("p1").unwrap();
        Self {
            queue,
            clock,
            agent: Agent::new(
                AgentId::parse("assistant").unwrap(),
                owner.clone(),
                [project.clone()],
            ),
            device: Device::new(DeviceId::parse("desktop").unwrap(), owner),
            project,
            session: GraphSessionId::parse("gs_0000000000000000000000000000000a").unwrap(),
        }
    }

    /// One sync of the relay's pass: `held` for the sync a long-polling
    /// relay waits in when its pass found nothing, not for the one per
    /// project that begins every pass.
    async fn sync(&self, held: bool) -> Vec<CommandRecord> {
        let request = SyncRequest {
            project: self.project.clone(),
            sessions: vec![SessionMeta {
                graph_session_id: self.session.clone(),
                name: "Graph".into(),
                description: "A graph".into(),
                slug: "graph".into(),
                version: "1".into(),
                status: "ready".into(),
            }],
            long_poll: held,
            restarted: false,
            running: None,
        };
        self.queue
            .sync(&self.device, &request)
            .await
            .expect("sync")
            .commands
    }

    async fn run(&self, key: &str) -> RunTicket {
        self.queue
            .run_graph_session(
                &self.agent,
                RunArgs {
                    graph_session_id: self.session.clone(),
                    arguments: Map::new(),
                    idempotency_key: IdempotencyKey::parse(key).unwrap(),
                },
            )
            .await
            .expect("run")
    }

    /// A long-poll control request, held as the queue says.
    async fn control(&self, id: &CommandId) -> ControlAnswer {
        self.queue
            .control_held(
                &self.device,
                id,
                true,
                |hold| hold,
                &Advancing(self.clock.clone()),
            )
            .await
            .expect("control")
    }

    async fn complete(&self, id: &CommandId, execution: &ExecutionId) -> CommandStatus {
        let envelope = ResultEnvelope::build(
            execution.clone(),
            FinishStatus::Completed,
            EnvelopeBody::default(),
        );
        let ack = self
            .queue
            .complete(&self.device, id, &envelope)
            .await
            .expect("complete");
        ack.record().status
    }
}

/// A 10 s lease and a 40 s run on a live desktop whose control requests
/// follow one another at once, each held as long as the queue holds it: the
/// run never lapses (a hold as long as the 25 s long-poll hold would let the
/// lease lapse 10 s into the run), and it ends `completed`.
#[test]
fn held_control_requests_renew_a_lease_shorter_than_the_long_poll_hold() {
    block_on(async {
        let desk = Desk::new(QueueConfig {
            lease_long_poll: Duration::from_secs(10),
            ..QueueConfig::default()
        });
        assert!(desk.sync(false).await.is_empty());
        let id = desk.run("lease-short-0001").await.command.id;
        // The desktop waits in a held sync, which answers with the run.
        let queued = desk.sync(true).await;
        assert_eq!(queued.iter().map(|c| c.id).collect::<Vec<_>>(), [id]);
        let execution = ExecutionId::parse("exec-long").unwrap();
        let started = desk
            .queue
            .start(&desk.device, &id, &execution)
            .await
            .expect("start");
        assert_eq!(lease(&started), Duration::from_secs(10));
        let t0 = desk.clock.now();
        let mut controls = 0;
        while desk.clock.now().since(t0) < Duration::from_secs(40) {
            let before = desk.clock.now();
            let answer = desk.control(&id).await;
            controls += 1;
            assert_eq!(
                answer.status,
                CommandStatus::Running,
                "{:?} into the run, after {controls} control requests",
                before.since(t0)
            );
            let held = desk.clock.now().since(before);
            assert!(
                held <= Duration::from_secs(10) / 3,
                "a control request held {held:?} with a 10 s lease"
            );
            // The server's sweep finds nothing lapsed either.
            assert_eq!(desk.queue.sweep_lapsed().await.expect("sweep"), 0);
        }
        assert_eq!(
            desk.complete(&id, &execution).await,
            CommandStatus::Completed
        );
    });
}

/// A long-polling desktop runs a run and delivers its result: the next
/// run's ticket says to look after a second (the desktop takes it up at
/// once), not after a whole interval-mode pass (about 21 s).
#[test]
fn a_long_polling_desktop_that_just_delivered_a_result_gets_the_long_poll_hint() {
    block_on(async {
        let desk = Desk::new(QueueConfig::default());
        // Idle: the pass finds nothing and waits in a held sync.
        assert!(desk.sync(false).await.is_empty());
        assert!(desk.sync(true).await.is_empty());
        let first = desk.run("hint-key-0001").await;
        assert_eq!(first.poll_after_seconds, 1, "long-poll hint while idle");
        // The held sync answers on the new work; the relay starts a fresh
        // pass, whose (unheld) sync hands out the run.
        desk.clock.advance(Duration::from_millis(5));
        let id = first.command.id;
        assert_eq!(desk.sync(false).await.len(), 1);
        let execution = ExecutionId::parse("exec-first").unwrap();
        desk.queue
            .start(&desk.device, &id, &execution)
            .await
            .expect("start");
        let started = desk
            .queue
            .get_graph_run(&desk.agent, &id)
            .await
            .expect("get");
        let first_lease = lease(&started.command);
        desk.clock.advance(Duration::from_millis(300));
        assert_eq!(
            desk.complete(&id, &execution).await,
            CommandStatus::Completed
        );
        // The agent reads the result and queues the next run at once.
        desk.clock.advance(Duration::from_millis(20));
        let second = desk.run("hint-key-0002").await;
        assert_eq!(second.poll_after_seconds, 1, "{}", second.message());
        let view = desk
            .queue
            .get_graph_run(&desk.agent, &second.command.id)
            .await
            .expect("get");
        assert_eq!(view.poll_after_seconds, Some(1));
        assert_eq!(view.device_offline_since, None);
        // The first run had the lease of a long-polling desktop too.
        assert_eq!(first_lease, Duration::from_secs(60));
        // The next pass begins with an unheld sync: still long-polling.
        assert_eq!(desk.sync(false).await.len(), 1);
        let third = desk.run("hint-key-0003").await;
        assert_eq!(third.poll_after_seconds, 1);
    });
}

/// A relay in interval mode stays one: its syncs are never held, and the
/// hint follows its 20 s passes.
#[test]
fn an_interval_desktop_gets_the_interval_hint() {
    block_on(async {
        let desk = Desk::new(QueueConfig::default());
        assert!(desk.sync(false).await.is_empty());
        desk.clock.advance(Duration::from_secs(5));
        let ticket = desk.run("interval-key-01").await;
        assert_eq!(ticket.poll_after_seconds, 16);
    });
}
