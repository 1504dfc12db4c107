//! The store conformance suite (feature `testkit`).
//!
//! Every [`Store`] must pass these functions unchanged. They drive the real
//! [`Queue`] over the store on a [`ManualClock`], so a store is checked for
//! the behaviour users see, not only for its own methods. Nothing sleeps.
//!
//! Run the whole suite for a store with [`store_conformance_suite!`](crate::store_conformance_suite):
//!
//! ```ignore
//! graph_relay_core::store_conformance_suite!(futures::executor::block_on, async { MyStore::new() });
//! ```
//!
//! The first argument runs a future to completion (use your runtime's
//! `block_on` if the store needs one); the second is an expression whose
//! value is a future of a fresh, empty store. It is evaluated once per test.

mod counting;
mod current_copies;
mod faulty;
mod finished_runs;
mod guessed_shares;
pub mod mcp_sessions;
pub mod model;
mod outage;
mod quiet_desktops;
mod syncs;
pub mod workload;

pub use counting::{Advancing, StoreCalls};
pub use current_copies::current_copies;
pub use faulty::FaultyTransport;
pub use finished_runs::finished_runs;
pub use guessed_shares::guessed_shares;
pub use outage::Outage;
pub use quiet_desktops::quiet_desktops;
pub use syncs::record_sync;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::args::RunArgs;
use crate::command::{
    CommandRecord, CommandStatus, CompleteRefused, DESKTOP_RESTARTED, LEASE_LAPSED,
    NO_LONGER_SHARED, StartRefused,
};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::ids::{
    AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::principal::{Agent, Device};
use crate::queue::{
    CancelError, CompleteAck, CompleteError, DeclineAck, GetError, ListError, Queue, QueueConfig,
    RUN_NOT_FOUND, RunError, StartError, SyncRequest,
};
use crate::session::SessionMeta;
use crate::store::{
    BoundedSync, DeviceContact, DeviceTouch, IdempotencyRecord, InsertOutcome, PruneRequest, Store,
};
use crate::time::{Clock, ManualClock, SeededIds, Timestamp};

/// Runs every conformance function as its own `#[test]`.
///
/// Attributes after the two arguments are put on every test, e.g. to
/// ignore the suite where its backend is missing:
/// `store_conformance_suite!(block_on, make(), #[ignore = "no server"]);`.
#[macro_export]
macro_rules! store_conformance_suite {
    ($block_on:path, $make:expr $(, #[$attr:meta])* $(,)?) => {
        $crate::store_conformance_suite!(@tests [$(#[$attr])*] $block_on, $make;
            lifecycle, idempotency, racing_duplicate_starts, transitions_refused_from_wrong_state,
            compare_and_swap, ownership_is_hidden, names_are_scoped_by_owner, project_bound,
            listing, queued_order_and_limit, device_liveness, pruning, cancellation, leases,
            restart_and_unsharing, progress, store_edges, queues_sharing_a_store, finished_runs,
            record_sync, guessed_shares, quiet_desktops, current_copies);
    };
    (@tests $attrs:tt $block_on:path, $make:expr; $($name:ident),*) => {
        $( $crate::store_conformance_suite!(@one $attrs $block_on, $make, $name); )*
    };
    (@one [$($attr:tt)*] $block_on:path, $make:expr, $name:ident) => {
        #[test]
        $($attr)*
        fn $name() {
            $block_on(async {
                let store: ::std::sync::Arc<dyn $crate::store::Store> = ::std::sync::Arc::new(($make).await);
                $crate::testkit::$name(store).await;
            });
        }
    };
}

/// A queue, a clock and the parties of a small world over one store.
pub struct World {
    /// The queue under test.
    pub queue: Queue,
    /// Its clock.
    pub clock: Arc<ManualClock>,
    /// Alice's assistant, connected to `p1` and `p2`.
    pub agent: Agent,
    /// A second agent of Alice, connected to `p1`.
    pub other_agent: Agent,
    /// Mallory's agent, connected to a project also called `p1`.
    pub stranger: Agent,
    /// Alice's desktop.
    pub device: Device,
    /// Alice's laptop.
    pub other_device: Device,
    /// Mallory's desktop.
    pub stranger_device: Device,
    /// Bob's agent, named `assistant` like Alice's and connected to his own
    /// `p1` and `p2`: the same name under another owner.
    pub twin: Agent,
    /// Bob's desktop, named `desktop` like Alice's.
    pub twin_device: Device,
}

/// 2026-01-01T00:00:00Z.
pub const EPOCH: Timestamp = Timestamp(1_767_225_600_000);

fn id<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.expect("a valid literal id")
}

/// Project `p1`.
pub fn p1() -> ProjectId {
    id(ProjectId::parse("p1"))
}

/// Project `p2`.
pub fn p2() -> ProjectId {
    id(ProjectId::parse("p2"))
}

/// A graph session id made from one number.
pub fn gs(n: u32) -> GraphSessionId {
    id(GraphSessionId::parse(&format!("gs_{n:032x}")))
}

/// Session metadata for `gs(n)`.
pub fn meta(n: u32) -> SessionMeta {
    SessionMeta {
        graph_session_id: gs(n),
        name: format!("Graph {n}").into(),
        description: format!("Test graph number {n}").into(),
        slug: format!("graph-{n}").into(),
        version: "1".into(),
        status: "ready".into(),
    }
}

/// A long-polling desktop's held sync sharing session `n` to `p1`.
pub fn held_sync(n: u32) -> SyncRequest {
    SyncRequest {
        project: p1(),
        sessions: vec![meta(n)],
        long_poll: true,
        restarted: false,
        running: None,
    }
}

/// Run arguments for session `n` with `key`.
pub fn run_args(n: u32, key: &str, arguments: Value) -> RunArgs {
    let arguments: Map<String, Value> = match arguments {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    RunArgs {
        graph_session_id: gs(n),
        arguments,
        idempotency_key: id(IdempotencyKey::parse(key)),
    }
}

/// An execution id.
pub fn exec(s: &str) -> ExecutionId {
    id(ExecutionId::parse(s))
}

/// A completed envelope with `result`.
pub fn completed(execution: &str, result: Value) -> ResultEnvelope {
    ResultEnvelope::build(
        exec(execution),
        FinishStatus::Completed,
        EnvelopeBody {
            result,
            total_tokens: Some(42),
            reported_cost: Some(0.5),
            error: None,
        },
    )
}

impl World {
    /// A world over `store` with default configuration.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_config(store, QueueConfig::default())
    }

    /// A world over `store` with `config`.
    pub fn with_config(store: Arc<dyn Store>, config: QueueConfig) -> Self {
        let clock = Arc::new(ManualClock::new(EPOCH));
        let queue = Queue::new(store, clock.clone(), Arc::new(SeededIds::new(1)), config);
        let alice = id(OwnerId::parse("alice"));
        let mallory = id(OwnerId::parse("mallory"));
        let bob = id(OwnerId::parse("bob"));
        Self {
            twin: Agent::new(id(AgentId::parse("assistant")), bob.clone(), [p1(), p2()]),
            twin_device: Device::new(id(DeviceId::parse("desktop")), bob),
            queue,
            clock,
            agent: Agent::new(id(AgentId::parse("assistant")), alice.clone(), [p1(), p2()]),
            other_agent: Agent::new(id(AgentId::parse("helper")), alice.clone(), [p1()]),
            stranger: Agent::new(id(AgentId::parse("mallory-bot")), mallory.clone(), [p1()]),
            device: Device::new(id(DeviceId::parse("desktop")), alice.clone()),
            other_device: Device::new(id(DeviceId::parse("laptop")), alice),
            stranger_device: Device::new(id(DeviceId::parse("mallory-pc")), mallory),
        }
    }

    /// `device` syncs `project` sharing sessions `ns`; returns the queued commands.
    pub async fn sync(
        &self,
        device: &Device,
        project: ProjectId,
        ns: &[u32],
    ) -> Vec<CommandRecord> {
        let request = SyncRequest {
            project,
            sessions: ns.iter().map(|n| meta(*n)).collect(),
            long_poll: false,
            restarted: false,
            running: None,
        };
        self.queue
            .sync(device, &request)
            .await
            .expect("sync")
            .commands
    }

    /// The agent queues session `n` with `key`.
    pub async fn run(&self, agent: &Agent, n: u32, key: &str) -> CommandRecord {
        self.queue
            .run_graph_session(agent, run_args(n, key, json!({"q": key})))
            .await
            .expect("run")
            .command
    }

    /// Moves the clock.
    pub fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }
}

/// Queued → running → completed, and what the agent reads at each step.
pub async fn lifecycle(store: Arc<dyn Store>) {
    let w = World::new(store);
    assert!(w.sync(&w.device, p1(), &[1]).await.is_empty());
    let ticket = w
        .queue
        .run_graph_session(
            &w.agent,
            run_args(1, "lifecycle-1", json!({"topic": "rust"})),
        )
        .await
        .expect("run");
    assert!(!ticket.replayed);
    let cmd = ticket.command;
    assert_eq!(cmd.status, CommandStatus::Queued);
    assert_eq!(cmd.project, p1());
    assert_eq!(cmd.device, w.device.id);
    assert_eq!(cmd.arguments.get("topic"), Some(&json!("rust")));

    let view = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get queued");
    assert_eq!(view.command.status, CommandStatus::Queued);
    assert!(view.poll_after_seconds.is_some_and(|s| s >= 1));

    w.advance(5);
    let queued = w.sync(&w.device, p1(), &[1]).await;
    assert_eq!(
        queued.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![cmd.id]
    );
    let running = w
        .queue
        .start(&w.device, &cmd.id, &exec("exec-1"))
        .await
        .expect("start");
    assert_eq!(running.status, CommandStatus::Running);
    assert_eq!(running.started_at, Some(w.clock.now()));
    assert!(
        w.sync(&w.device, p1(), &[1]).await.is_empty(),
        "a running command is no longer queued"
    );
    // A retried start with the same execution is harmless.
    assert_eq!(
        w.queue
            .start(&w.device, &cmd.id, &exec("exec-1"))
            .await
            .expect("restart")
            .status,
        CommandStatus::Running
    );

    let control = w.queue.control(&w.device, &cmd.id).await.expect("control");
    assert!(!control.cancel_requested);

    // A long run: the desktop's control polls keep its lease.
    for _ in 0..20 {
        w.advance(3);
        w.queue.control(&w.device, &cmd.id).await.expect("control");
    }
    let envelope = completed("exec-1", json!({"answer": 42}));
    let ack = w
        .queue
        .complete(&w.device, &cmd.id, &envelope)
        .await
        .expect("complete");
    assert!(matches!(ack, CompleteAck::Recorded(ref c) if c.status == CommandStatus::Completed));
    let dup = w
        .queue
        .complete(&w.device, &cmd.id, &envelope)
        .await
        .expect("dup");
    assert!(matches!(dup, CompleteAck::Duplicate(ref c) if c.status == CommandStatus::Completed));

    let done = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get done");
    assert_eq!(done.command.status, CommandStatus::Completed);
    assert_eq!(done.poll_after_seconds, None);
    let shown = done.to_json();
    assert_eq!(shown["result"], json!({"answer": 42}));
    assert_eq!(shown["total_tokens"], json!(42));
    assert_eq!(shown["status"], json!("completed"));
    assert_eq!(shown["execution_id"], json!("exec-1"));
}

/// Same key and request → same command; other request → refused; per-agent scope; expiry.
pub async fn idempotency(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    w.sync(&w.device, p1(), &[1, 2]).await;
    let first = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "retry-key", json!({"a": 1, "b": 2})))
        .await
        .expect("run");
    // Same request, keys in another order: a replay that writes nothing.
    let again = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "retry-key", json!({"b": 2, "a": 1})))
        .await
        .expect("replay");
    assert!(again.replayed);
    assert_eq!(again.command.id, first.command.id);
    assert_eq!(
        w.sync(&w.device, p1(), &[1, 2]).await.len(),
        1,
        "a replay queues nothing"
    );

    // Same key, different arguments or session: refused, nothing written.
    for args in [
        run_args(1, "retry-key", json!({"a": 2})),
        run_args(2, "retry-key", json!({"a": 1, "b": 2})),
    ] {
        match w.queue.run_graph_session(&w.agent, args).await {
            Err(RunError::KeyReused { command }) => assert_eq!(command, first.command.id),
            other => panic!("expected KeyReused, got {other:?}"),
        }
    }
    assert_eq!(w.sync(&w.device, p1(), &[1, 2]).await.len(), 1);

    // The key is scoped per agent: another agent's same key is a new run.
    let other = w
        .queue
        .run_graph_session(
            &w.other_agent,
            run_args(1, "retry-key", json!({"a": 1, "b": 2})),
        )
        .await
        .expect("other");
    assert!(!other.replayed);
    assert_ne!(other.command.id, first.command.id);

    // A replay still works after the command finished.
    w.queue
        .start(&w.device, &first.command.id, &exec("e-1"))
        .await
        .expect("start");
    w.queue
        .complete(&w.device, &first.command.id, &completed("e-1", json!(1)))
        .await
        .expect("complete");
    let late = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "retry-key", json!({"a": 1, "b": 2})))
        .await
        .expect("late replay");
    assert!(late.replayed);
    assert_eq!(late.command.status, CommandStatus::Completed);

    // After the retention period the key is forgotten: a new run.
    w.advance(24 * 3600 + 1);
    let fresh = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "retry-key", json!({"z": 0})))
        .await
        .expect("fresh");
    assert!(!fresh.replayed);
    assert_ne!(fresh.command.id, first.command.id);
    let stored = store
        .idempotency(
            &w.agent.owner,
            &w.agent.id,
            &id(IdempotencyKey::parse("retry-key")),
            w.clock.now(),
        )
        .await
        .expect("key");
    assert_eq!(stored.map(|k| k.command), Some(fresh.command.id));
}

/// Many concurrent starts with one key create exactly one command.
pub async fn racing_duplicate_starts(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    w.sync(&w.device, p1(), &[1]).await;
    let attempts = (0..16).map(|_| {
        w.queue
            .run_graph_session(&w.agent, run_args(1, "race-key-1", json!({"x": 1})))
    });
    let results = futures::future::join_all(attempts).await;
    let ids: std::collections::BTreeSet<CommandId> = results
        .into_iter()
        .map(|r| r.expect("every racer gets the ticket").command.id)
        .collect();
    assert_eq!(ids.len(), 1, "all racers see one command");
    assert_eq!(
        w.sync(&w.device, p1(), &[1]).await.len(),
        1,
        "exactly one command was queued"
    );

    // Also at the store level: two inserts with one key, only one lands.
    let now = w.clock.now();
    let make = |n: u128| {
        let mut c = w.sync_template(n);
        c.idempotency_key = id(IdempotencyKey::parse("raw-key-01"));
        c
    };
    let (a, b) = (make(1), make(2));
    let key = |c: &CommandRecord| IdempotencyRecord {
        owner: c.owner.clone(),
        agent: c.agent.clone(),
        key: c.idempotency_key.clone(),
        command: c.id,
        fingerprint: "f".into(),
        expires_at: now.plus(Duration::from_secs(60)),
    };
    let (ka, kb) = (key(&a), key(&b));
    let (ra, rb) = futures::join!(
        store.insert_command(&a, &ka, now),
        store.insert_command(&b, &kb, now)
    );
    let outcomes = [ra.expect("insert a"), rb.expect("insert b")];
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == InsertOutcome::Inserted)
            .count(),
        1
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| matches!(o, InsertOutcome::KeyTaken(_)))
            .count(),
        1
    );
}

impl World {
    /// A queued command record of the main agent with a fixed id, for store-level tests.
    pub fn sync_template(&self, n: u128) -> CommandRecord {
        CommandRecord::queued(
            CommandId::from_uuid(uuid::Uuid::from_u128(n)),
            self.agent.id.clone(),
            self.agent.owner.clone(),
            p1(),
            self.device.id.clone(),
            gs(1),
            Map::new(),
            id(IdempotencyKey::parse(&format!("template-{n:04}"))),
            self.clock.now(),
        )
    }
}

/// Two queues on one store (two servers, or a server and a maintenance
/// task): each keeps its own copies of the commands it wrote, and a copy
/// that another queue's write made stale never decides an answer. A
/// transition that starts from a stale copy loses its compare-and-swap or
/// is judged again on a fresh read, and a copy is never used for another
/// party.
pub async fn queues_sharing_a_store(store: Arc<dyn Store>) {
    let a = World::new(store.clone());
    let b = Queue::new(
        store,
        a.clock.clone(),
        Arc::new(SeededIds::new(2)),
        QueueConfig::default(),
    );
    a.sync(&a.device, p1(), &[1]).await;

    // A queued it (its copy says queued); B cancelled it: A's desktop must
    // not start it.
    let cancelled = a.run(&a.agent, 1, "shared-store-1").await;
    b.cancel_graph_run(&a.agent, &cancelled.id)
        .await
        .expect("cancel through the other queue");
    assert!(
        matches!(
            a.queue.start(&a.device, &cancelled.id, &exec("e1")).await,
            Err(StartError::Refused(StartRefused::Finished(_)))
        ),
        "a run cancelled through another queue never starts"
    );

    // A queued it; B started it: A takes its result (its copy, still
    // queued, would refuse a result; the store's record takes it).
    let started_elsewhere = a.run(&a.agent, 1, "shared-store-2").await;
    b.start(&a.device, &started_elsewhere.id, &exec("e2"))
        .await
        .expect("start through the other queue");
    let ack = a
        .queue
        .complete(&a.device, &started_elsewhere.id, &completed("e2", json!(2)))
        .await
        .expect("a result for a run started through the other queue");
    assert!(matches!(ack, CompleteAck::Recorded(_)), "{ack:?}");
    assert_eq!(ack.record().status, CommandStatus::Completed);

    // A started it (its copy says running); B recorded the result: the
    // same result through A is a duplicate, a different one is refused.
    let finished_elsewhere = a.run(&a.agent, 1, "shared-store-3").await;
    a.queue
        .start(&a.device, &finished_elsewhere.id, &exec("e3"))
        .await
        .expect("start");
    let result = completed("e3", json!(3));
    b.complete(&a.device, &finished_elsewhere.id, &result)
        .await
        .expect("result through the other queue");
    let again = a
        .queue
        .complete(&a.device, &finished_elsewhere.id, &result)
        .await
        .expect("the same result again");
    assert!(matches!(again, CompleteAck::Duplicate(_)), "{again:?}");
    assert!(matches!(
        a.queue
            .complete(
                &a.device,
                &finished_elsewhere.id,
                &completed("e3", json!("other"))
            )
            .await,
        Err(CompleteError::Refused(_))
    ));
    let read = a
        .queue
        .get_graph_run(&a.agent, &finished_elsewhere.id)
        .await
        .expect("get")
        .command;
    assert_eq!(read.completion, Some(result));

    // A's copy of Alice's run is not Bob's: his desktop of the same name,
    // his agent of the same name, and Alice's other agent find nothing.
    let alices = a.run(&a.agent, 1, "shared-store-4").await;
    assert!(matches!(
        a.queue.start(&a.twin_device, &alices.id, &exec("e4")).await,
        Err(StartError::NotFound)
    ));
    assert!(matches!(
        a.queue.cancel_graph_run(&a.twin, &alices.id).await,
        Err(CancelError::NotFound)
    ));
    assert!(matches!(
        a.queue.cancel_graph_run(&a.other_agent, &alices.id).await,
        Err(CancelError::NotFound)
    ));
    let untouched = a
        .queue
        .get_graph_run(&a.agent, &alices.id)
        .await
        .expect("get")
        .command;
    assert_eq!(untouched.status, CommandStatus::Queued);
    assert_eq!(untouched.revision, alices.revision);

    // A started it; B's desktop-side control saw a lapsed lease and closed
    // it: A's control renews nothing and reports the closed run.
    let lapsing = a.run(&a.agent, 1, "shared-store-5").await;
    a.queue
        .start(&a.device, &lapsing.id, &exec("e5"))
        .await
        .expect("start");
    a.advance(10 * 60);
    b.control(&a.device, &lapsing.id)
        .await
        .expect("control through B");
    let closed = a
        .queue
        .get_graph_run(&a.agent, &lapsing.id)
        .await
        .expect("get")
        .command;
    assert_eq!(
        closed.status,
        CommandStatus::Failed,
        "the lapsed lease closed it"
    );
    let answer = a
        .queue
        .control(&a.device, &lapsing.id)
        .await
        .expect("control through A");
    let after = a
        .queue
        .get_graph_run(&a.agent, &lapsing.id)
        .await
        .expect("get")
        .command;
    assert_eq!(
        after.revision, closed.revision,
        "nothing renewed: {answer:?}"
    );

    // A's copy of a desktop's liveness is at most the touch interval old:
    // the desktop turned to long-poll through B, and A's next start after
    // that interval grants the long-poll lease.
    a.advance(60);
    let queued = a.run(&a.agent, 1, "shared-store-6").await;
    let long_poll = held_sync(1);
    b.sync(&a.device, &long_poll).await.expect("sync through B");
    a.advance(2);
    let started = a
        .queue
        .start(&a.device, &queued.id, &exec("e6"))
        .await
        .expect("start");
    let config = QueueConfig::default();
    assert_eq!(
        started.lease_expires_at,
        Some(a.clock.now().plus(config.lease(true))),
        "the lease of a long-polling desktop"
    );
    assert_ne!(config.lease(true), config.lease(false));
}

/// The queue refuses transitions from the wrong prior state and changes nothing.
pub async fn transitions_refused_from_wrong_state(store: Arc<dyn Store>) {
    let w = World::new(store);
    w.sync(&w.device, p1(), &[1]).await;
    let cmd = w.run(&w.agent, 1, "refuse-01").await;

    // Complete before start.
    assert!(matches!(
        w.queue
            .complete(&w.device, &cmd.id, &completed("e1", json!(1)))
            .await,
        Err(CompleteError::Refused(_))
    ));
    w.queue
        .start(&w.device, &cmd.id, &exec("e1"))
        .await
        .expect("start");
    // Start under another execution.
    assert!(matches!(
        w.queue.start(&w.device, &cmd.id, &exec("e2")).await,
        Err(StartError::Refused(StartRefused::OtherExecution))
    ));
    // Stale completion.
    assert!(matches!(
        w.queue
            .complete(&w.device, &cmd.id, &completed("e2", json!(1)))
            .await,
        Err(CompleteError::Refused(_))
    ));
    // Decline while running.
    assert!(w.queue.decline(&w.device, &cmd.id).await.is_err());
    let before = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get")
        .command;
    assert_eq!(before.status, CommandStatus::Running);

    let first = completed("e1", json!("first"));
    w.queue
        .complete(&w.device, &cmd.id, &first)
        .await
        .expect("first completion");
    // A different completion for the same execution is refused and changes nothing.
    let second = completed("e1", json!("second"));
    assert!(matches!(
        w.queue.complete(&w.device, &cmd.id, &second).await,
        Err(CompleteError::Refused(_))
    ));
    let after = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get")
        .command;
    assert_eq!(after.completion, Some(first));
    // Terminal: start refused.
    assert!(matches!(
        w.queue.start(&w.device, &cmd.id, &exec("e1")).await,
        Err(StartError::Refused(StartRefused::Finished("completed")))
    ));

    // Decline of a queued command closes it with the exact message.
    let other = w.run(&w.agent, 1, "refuse-02").await;
    let declined = match w.queue.decline(&w.device, &other.id).await {
        Ok(DeclineAck::Recorded(record)) => record,
        other => panic!("expected a recorded decline, got {other:?}"),
    };
    assert_eq!(declined.status, CommandStatus::Cancelled);
    assert_eq!(declined.reason.as_deref(), Some(NO_LONGER_SHARED));
    // Declining again, or declining what the agent already cancelled,
    // changes nothing and says so.
    assert!(matches!(
        w.queue.decline(&w.device, &other.id).await,
        Ok(DeclineAck::Unchanged(ref c)) if *c == declined
    ));
    let withdrawn = w.run(&w.agent, 1, "refuse-03").await;
    let cancelled = w
        .queue
        .cancel_graph_run(&w.agent, &withdrawn.id)
        .await
        .expect("cancel")
        .command;
    assert!(matches!(
        w.queue.decline(&w.device, &withdrawn.id).await,
        Ok(DeclineAck::Unchanged(ref c)) if *c == cancelled
    ));
    // Completing what never started is refused as such, not as a stale execution.
    assert!(matches!(
        w.queue
            .complete(&w.device, &withdrawn.id, &completed("e4", json!(1)))
            .await,
        Err(CompleteError::Refused(CompleteRefused::ClosedBeforeStart(
            "cancelled"
        )))
    ));
    let queued = w.run(&w.agent, 1, "refuse-04").await;
    assert!(matches!(
        w.queue
            .complete(&w.device, &queued.id, &completed("e5", json!(1)))
            .await,
        Err(CompleteError::Refused(CompleteRefused::NotStarted))
    ));
    let view = w
        .queue
        .get_graph_run(&w.agent, &other.id)
        .await
        .expect("get")
        .to_json();
    assert_eq!(view["error"], json!(NO_LONGER_SHARED));
    assert!(matches!(
        w.queue.start(&w.device, &other.id, &exec("e3")).await,
        Err(StartError::Refused(StartRefused::Finished("cancelled")))
    ));
}

/// `update_command` writes only on the expected revision.
pub async fn compare_and_swap(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    let cmd = w.sync_template(7);
    let key = IdempotencyRecord {
        owner: cmd.owner.clone(),
        agent: cmd.agent.clone(),
        key: cmd.idempotency_key.clone(),
        command: cmd.id,
        fingerprint: "f".into(),
        expires_at: w.clock.now().plus(Duration::from_secs(60)),
    };
    assert_eq!(
        store
            .insert_command(&cmd, &key, w.clock.now())
            .await
            .expect("insert"),
        InsertOutcome::Inserted
    );
    let mut next = cmd.clone();
    next.revision = 1;
    next.status = CommandStatus::Running;
    next.execution_id = Some(exec("x"));
    let mut rival = cmd.clone();
    rival.revision = 1;
    rival.status = CommandStatus::Cancelled;
    assert!(store.update_command(&next).await.expect("update"));
    assert!(
        !store.update_command(&rival).await.expect("stale update"),
        "a stale revision must not write"
    );
    let mut skipping = cmd.clone();
    skipping.revision = 5;
    assert!(!store.update_command(&skipping).await.expect("skip"));
    let mut same = cmd.clone();
    same.revision = 0;
    assert!(!store.update_command(&same).await.expect("rev 0"));
    let stored = store
        .command_for_agent(&w.agent.owner, &w.agent.id, &cmd.id)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(stored, next);
    let mut unknown = w.sync_template(8);
    unknown.revision = 1;
    assert!(!store.update_command(&unknown).await.expect("unknown"));
}

/// Another agent's command and an unknown one look the same; devices are fenced likewise.
pub async fn ownership_is_hidden(store: Arc<dyn Store>) {
    let w = World::new(store);
    w.sync(&w.device, p1(), &[1]).await;
    w.sync(&w.stranger_device, p1(), &[1]).await;
    let mine = w.run(&w.agent, 1, "owner-key-1").await;
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u128(0xdead_beef));
    for agent in [&w.other_agent, &w.stranger] {
        let theirs = w
            .queue
            .get_graph_run(agent, &mine.id)
            .await
            .expect_err("hidden");
        let none = w
            .queue
            .get_graph_run(agent, &unknown)
            .await
            .expect_err("unknown");
        assert!(matches!(theirs, GetError::NotFound) && matches!(none, GetError::NotFound));
        assert_eq!(theirs.to_string(), RUN_NOT_FOUND);
        assert_eq!(theirs.to_string(), none.to_string());
        let cancel = w
            .queue
            .cancel_graph_run(agent, &mine.id)
            .await
            .expect_err("hidden");
        assert!(matches!(cancel, CancelError::NotFound));
        assert_eq!(cancel.to_string(), RUN_NOT_FOUND);
    }
    // The stranger's sync of their own `p1` does not hand out Alice's command.
    assert!(w.sync(&w.stranger_device, p1(), &[1]).await.is_empty());
    // Another device cannot start, control or complete it.
    for device in [&w.other_device, &w.stranger_device] {
        assert!(matches!(
            w.queue.start(device, &mine.id, &exec("x")).await,
            Err(StartError::NotFound)
        ));
        assert!(w.queue.control(device, &mine.id).await.is_err());
        assert!(matches!(
            w.queue
                .complete(device, &mine.id, &completed("x", json!(1)))
                .await,
            Err(CompleteError::NotFound)
        ));
    }
    // The stranger cannot queue Alice's session: Alice's p1 is not theirs.
    let theirs = w
        .queue
        .run_graph_session(&w.stranger, run_args(1, "owner-key-2", json!({})))
        .await
        .expect("own");
    assert_eq!(theirs.command.device, w.stranger_device.id);
    assert_eq!(theirs.command.owner, w.stranger.owner);
    // A session shared only to p2 is out of reach of an agent connected to p1 only.
    w.sync(&w.device, p2(), &[9]).await;
    assert!(matches!(
        w.queue
            .run_graph_session(&w.other_agent, run_args(9, "owner-key-3", json!({})))
            .await,
        Err(RunError::SessionNotFound)
    ));
    assert!(matches!(
        w.queue
            .run_graph_session(&w.agent, run_args(77, "owner-key-4", json!({})))
            .await,
        Err(RunError::SessionNotFound)
    ));
    // Project listings: not connected → hidden error.
    assert!(matches!(
        w.queue.list_graph_sessions(&w.other_agent, &p2(), 50).await,
        Err(ListError::ProjectNotFound)
    ));
}

/// Two owners whose agents and desktops have the same names: neither can
/// read, cancel, replay, sync, start, control, complete or decline the
/// other's command. Every attempt gets exactly the answer an unknown id
/// gets, and changes nothing.
pub async fn names_are_scoped_by_owner(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    assert_eq!(w.twin.id, w.agent.id, "same agent name");
    assert_eq!(w.twin_device.id, w.device.id, "same device name");
    w.sync(&w.device, p1(), &[1]).await;
    w.sync(&w.twin_device, p1(), &[2]).await;
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u128(0x0dd_f00d));
    let alice_args = || run_args(1, "shared-key-01", json!({"secret": "alice"}));
    let queued = w
        .queue
        .run_graph_session(&w.agent, alice_args())
        .await
        .expect("alice runs")
        .command;
    let running = w.run(&w.agent, 1, "shared-key-02").await;
    w.queue
        .start(&w.device, &running.id, &exec("alice-exec"))
        .await
        .expect("alice's desktop starts");
    let snapshot = |id: CommandId| {
        let (q, a) = (&w.queue, &w.agent);
        async move { q.get_graph_run(a, &id).await.expect("alice reads").command }
    };
    let before = (snapshot(queued.id).await, snapshot(running.id).await);

    // Bob's assistant: reads and cancels answer as for an unknown id.
    for target in [queued.id, running.id] {
        let theirs = w.queue.get_graph_run(&w.twin, &target).await;
        let none = w.queue.get_graph_run(&w.twin, &unknown).await;
        assert!(matches!(theirs, Err(GetError::NotFound)), "{theirs:?}");
        assert_eq!(
            theirs.err().map(|e| e.to_string()),
            none.err().map(|e| e.to_string())
        );
        let theirs = w.queue.cancel_graph_run(&w.twin, &target).await;
        let none = w.queue.cancel_graph_run(&w.twin, &unknown).await;
        assert!(matches!(theirs, Err(CancelError::NotFound)), "{theirs:?}");
        assert_eq!(
            theirs.err().map(|e| e.to_string()),
            none.err().map(|e| e.to_string())
        );
    }
    // Replaying Alice's key with Alice's request: Bob cannot reach the
    // session, and Alice's ticket is not handed over.
    match w.queue.run_graph_session(&w.twin, alice_args()).await {
        Err(e @ RunError::SessionNotFound) => {
            let fresh = w
                .queue
                .run_graph_session(
                    &w.twin,
                    run_args(1, "never-used-key", json!({"secret": "alice"})),
                )
                .await
                .expect_err("unreachable session");
            assert_eq!(e.to_string(), fresh.to_string());
        }
        other => panic!("expected SessionNotFound, got {other:?}"),
    }
    // The same key for Bob's own session is Bob's own new run: no
    // "already used" error naming Alice's command.
    let bobs = w
        .queue
        .run_graph_session(&w.twin, run_args(2, "shared-key-01", json!({"x": 1})))
        .await
        .expect("bob's key space is his own");
    assert!(!bobs.replayed);
    assert_ne!(bobs.command.id, queued.id);
    assert_eq!(bobs.command.owner, w.twin.owner);
    assert_eq!(bobs.command.device, w.twin_device.id);
    // And Alice's key still replays Alice's command, for Alice.
    let replay = w
        .queue
        .run_graph_session(&w.agent, alice_args())
        .await
        .expect("alice replays");
    assert!(replay.replayed);
    assert_eq!(replay.command.id, queued.id);

    // Bob's desktop: syncs hand out only Bob's commands.
    let handed = w.sync(&w.twin_device, p1(), &[2]).await;
    assert_eq!(
        handed.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![bobs.command.id]
    );
    // Start, control, complete and decline answer as for an unknown id.
    let forged = completed("alice-exec", json!({"forged": true}));
    fn text<T, E: std::fmt::Display>(answer: Result<T, E>) -> Result<(), String> {
        answer.map(drop).map_err(|e| e.to_string())
    }
    // Each device operation on `id`, as the text of its answer.
    let (q, d) = (&w.queue, &w.twin_device);
    let answer = |op: usize, id: CommandId| {
        let forged = &forged;
        async move {
            match op {
                0 => text(q.start(d, &id, &exec("alice-exec")).await),
                1 => text(q.control(d, &id).await),
                2 => text(q.complete(d, &id, forged).await),
                _ => text(q.decline(d, &id).await),
            }
        }
    };
    for target in [queued.id, running.id] {
        for op in 0..4 {
            let (theirs, none) = (answer(op, target).await, answer(op, unknown).await);
            assert!(theirs.is_err(), "another owner's device acted: {theirs:?}");
            assert_eq!(theirs, none);
        }
    }
    assert_eq!(
        (snapshot(queued.id).await, snapshot(running.id).await),
        before,
        "nothing of Alice's changed"
    );
    // Alice's desktop still gets Alice's queued command.
    let handed = w.sync(&w.device, p1(), &[1]).await;
    assert_eq!(
        handed.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![queued.id]
    );

    // The store itself keys by owner.
    let key = id(IdempotencyKey::parse("shared-key-01"));
    let now = w.clock.now();
    let alice_key = store
        .idempotency(&w.agent.owner, &w.agent.id, &key, now)
        .await
        .expect("key")
        .expect("alice's key");
    let bob_key = store
        .idempotency(&w.twin.owner, &w.twin.id, &key, now)
        .await
        .expect("key")
        .expect("bob's key");
    assert_eq!(
        (alice_key.command, bob_key.command),
        (queued.id, bobs.command.id)
    );
    assert_eq!(bob_key.owner, w.twin.owner);
    for target in [queued.id, running.id] {
        assert!(
            store
                .command_for_agent(&w.twin.owner, &w.twin.id, &target)
                .await
                .expect("read")
                .is_none()
        );
        assert!(
            store
                .command_for_device(&w.twin_device.owner, &w.twin_device.id, &target)
                .await
                .expect("read")
                .is_none()
        );
    }
    assert!(
        store
            .command_for_device(&w.device.owner, &w.device.id, &running.id)
            .await
            .expect("read")
            .is_some()
    );
}

/// A device shares into a bounded number of projects; un-sharing frees a
/// place; the bound counts per (owner, device).
pub async fn project_bound(store: Arc<dyn Store>) {
    let config = QueueConfig {
        max_projects_per_device: 3,
        ..QueueConfig::default()
    };
    let w = World::with_config(store.clone(), config);
    let project = |name: &str| id(ProjectId::parse(name));
    for name in ["pc", "pa", "pb"] {
        w.sync(&w.device, project(name), &[1]).await;
    }
    assert_eq!(
        store
            .shared_projects(&w.device.owner, &w.device.id, 10)
            .await
            .expect("projects"),
        vec![project("pa"), project("pb"), project("pc")],
        "ascending"
    );
    assert_eq!(
        store
            .shared_projects(&w.device.owner, &w.device.id, 2)
            .await
            .expect("projects"),
        vec![project("pa"), project("pb")],
        "limited"
    );
    let one_more = SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
        restarted: false,
        running: None,
    };
    match w.queue.sync(&w.device, &one_more).await {
        Err(e @ crate::queue::SyncError::TooManyProjects { limit: 3 }) => {
            assert!(e.to_string().contains("at most 3 projects"), "{e}");
        }
        other => panic!("expected TooManyProjects, got {other:?}"),
    }
    assert!(
        w.queue
            .list_graph_sessions(&w.agent, &p1(), 50)
            .await
            .expect("list")
            .sessions
            .is_empty(),
        "nothing was shared"
    );
    // The store refuses it by itself too, and writes nothing, not even
    // the contact; the same sync within a larger bound is recorded.
    let seen = || {
        let store = store.clone();
        let (owner, device) = (w.device.owner.clone(), w.device.id.clone());
        async move {
            store
                .device(&owner, &device)
                .await
                .expect("device")
                .expect("known")
        }
    };
    let before = seen().await;
    w.advance(1);
    let p4 = project("pd");
    let refused = store
        .record_sync_within(
            &w.device.owner,
            &p4,
            &w.device.id,
            &[meta(1)],
            true,
            3,
            w.clock.now(),
        )
        .await
        .expect("record");
    assert_eq!(refused, BoundedSync::TooManyProjects);
    assert_eq!(seen().await, before, "nothing written");
    assert_eq!(
        store
            .shared_projects(&w.device.owner, &w.device.id, 10)
            .await
            .expect("projects")
            .len(),
        3
    );
    for (project, sessions, bound) in [
        (project("pa"), vec![meta(1)], 3),
        (project("pa"), vec![meta(1), meta(2)], 3),
        (p4.clone(), vec![], 3),
        (p4.clone(), vec![meta(1)], 4),
    ] {
        let recorded = store
            .record_sync_within(
                &w.device.owner,
                &project,
                &w.device.id,
                &sessions,
                true,
                bound,
                w.clock.now(),
            )
            .await
            .expect("record");
        assert_eq!(recorded, BoundedSync::Recorded, "{project:?} {bound}");
    }
    assert_ne!(seen().await, before, "the contact moved");
    store
        .record_sync(
            &w.device.owner,
            &p4,
            &w.device.id,
            &[],
            false,
            w.clock.now(),
        )
        .await
        .expect("un-share");
    store
        .record_sync(
            &w.device.owner,
            &project("pa"),
            &w.device.id,
            &[meta(1)],
            false,
            w.clock.now(),
        )
        .await
        .expect("as before");
    // Re-syncing a project it already shares into is fine, and so is an
    // empty sync of a new one (it shares nothing).
    w.advance(2);
    w.sync(&w.device, project("pb"), &[1, 2]).await;
    w.sync(&w.device, p2(), &[]).await;
    // Another device of the same owner, and Bob's device of the same name,
    // have their own bounds.
    w.sync(&w.other_device, p1(), &[3]).await;
    w.sync(&w.twin_device, p1(), &[3]).await;
    // Un-sharing frees a place.
    w.sync(&w.device, project("pc"), &[]).await;
    assert_eq!(
        store
            .shared_projects(&w.device.owner, &w.device.id, 10)
            .await
            .expect("projects"),
        vec![project("pa"), project("pb")]
    );
    w.queue
        .sync(&w.device, &one_more)
        .await
        .expect("a free place");
    assert_eq!(
        w.queue
            .list_graph_sessions(&w.agent, &p1(), 50)
            .await
            .expect("list")
            .sessions
            .len(),
        2
    );
    assert!(
        store
            .shared_projects(&w.twin_device.owner, &w.device.id, 10)
            .await
            .expect("projects")
            == vec![p1()]
    );
}

/// Listing shows what the last sync uploaded, per device, ordered, limited, per owner.
pub async fn listing(store: Arc<dyn Store>) {
    let w = World::new(store);
    let list = w
        .queue
        .list_graph_sessions(&w.agent, &p1(), 50)
        .await
        .expect("list");
    assert!(list.sessions.is_empty());
    assert_eq!(list.to_json(), json!({"project_id": "p1", "sessions": []}));

    w.sync(&w.device, p1(), &[3, 1, 2]).await;
    w.sync(&w.other_device, p1(), &[4]).await;
    w.sync(&w.stranger_device, p1(), &[5]).await;
    let ids = |l: &crate::queue::SessionList| {
        l.sessions
            .iter()
            .map(|s| s.meta.graph_session_id.clone())
            .collect::<Vec<_>>()
    };
    let list = w
        .queue
        .list_graph_sessions(&w.agent, &p1(), 50)
        .await
        .expect("list");
    assert_eq!(ids(&list), vec![gs(1), gs(2), gs(3), gs(4)]);
    assert_eq!(list.sessions[0].meta, meta(1));
    assert_eq!(list.sessions[0].device, w.device.id);
    let limited = w
        .queue
        .list_graph_sessions(&w.agent, &p1(), 2)
        .await
        .expect("list");
    assert_eq!(ids(&limited), vec![gs(1), gs(2)]);

    // A later sync replaces this device's sessions only.
    w.advance(20);
    w.sync(&w.device, p1(), &[2]).await;
    let list = w
        .queue
        .list_graph_sessions(&w.agent, &p1(), 50)
        .await
        .expect("list");
    assert_eq!(ids(&list), vec![gs(2), gs(4)]);
    assert_eq!(list.sessions[0].synced_at, w.clock.now());
    w.sync(&w.device, p1(), &[]).await;
    assert_eq!(
        ids(&w
            .queue
            .list_graph_sessions(&w.agent, &p1(), 50)
            .await
            .expect("list")),
        vec![gs(4)]
    );

    // A run of an unshared session is refused; a run of a shared one goes to its device.
    assert!(matches!(
        w.queue
            .run_graph_session(&w.agent, run_args(2, "listing-01", json!({})))
            .await,
        Err(RunError::SessionNotFound)
    ));
    let c = w.run(&w.agent, 4, "listing-02").await;
    assert_eq!(c.device, w.other_device.id);

    // Sync validation: more than 100 sessions or a duplicate is refused and changes nothing.
    let too_many = SyncRequest {
        project: p1(),
        sessions: (0..101).map(meta).collect(),
        long_poll: false,
        restarted: false,
        running: None,
    };
    assert!(w.queue.sync(&w.device, &too_many).await.is_err());
    let dup = SyncRequest {
        project: p1(),
        sessions: vec![meta(8), meta(8)],
        long_poll: false,
        restarted: false,
        running: None,
    };
    assert!(w.queue.sync(&w.device, &dup).await.is_err());
    let mut bad = meta(8);
    bad.name = "".into();
    let invalid = SyncRequest {
        project: p1(),
        sessions: vec![bad],
        long_poll: false,
        restarted: false,
        running: None,
    };
    assert!(w.queue.sync(&w.device, &invalid).await.is_err());
    assert_eq!(
        ids(&w
            .queue
            .list_graph_sessions(&w.agent, &p1(), 50)
            .await
            .expect("list")),
        vec![gs(4)]
    );
    let full = SyncRequest {
        project: p1(),
        sessions: (0..100).map(meta).collect(),
        long_poll: false,
        restarted: false,
        running: None,
    };
    w.queue
        .sync(&w.device, &full)
        .await
        .expect("100 sessions are fine");
    assert_eq!(
        w.queue
            .list_graph_sessions(&w.agent, &p1(), 50)
            .await
            .expect("list")
            .sessions
            .len(),
        50
    );
}

/// A sync returns queued commands of its project and device, oldest first, bounded.
pub async fn queued_order_and_limit(store: Arc<dyn Store>) {
    let config = QueueConfig {
        max_commands_per_sync: 3,
        ..QueueConfig::default()
    };
    let w = World::with_config(store, config);
    w.sync(&w.device, p1(), &[1]).await;
    w.sync(&w.device, p2(), &[2]).await;
    let mut expected = Vec::new();
    for i in 0..5 {
        w.advance(1);
        expected.push(w.run(&w.agent, 1, &format!("order-key-{i}")).await.id);
    }
    let in_p2 = w.run(&w.agent, 2, "order-key-p2").await;
    assert_eq!(in_p2.project, p2());
    let got: Vec<_> = w
        .sync(&w.device, p1(), &[1])
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, expected[..3]);
    w.queue
        .cancel_graph_run(&w.agent, &expected[0])
        .await
        .expect("cancel");
    w.queue
        .start(&w.device, &expected[1], &exec("o1"))
        .await
        .expect("start");
    let got: Vec<_> = w
        .sync(&w.device, p1(), &[1])
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, expected[2..5]);
    let got: Vec<_> = w
        .sync(&w.device, p2(), &[2])
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, vec![in_p2.id]);
    assert!(w.sync(&w.other_device, p1(), &[]).await.is_empty());
    // Runs queued within the same millisecond come back in the order they were queued.
    let mut all_p2 = vec![in_p2.id];
    for i in 0..4 {
        all_p2.push(w.run(&w.agent, 2, &format!("same-ms-{i:04}")).await.id);
    }
    let got: Vec<_> = w
        .sync(&w.device, p2(), &[2])
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, all_p2[..3], "insertion order within one instant");
}

/// Devices are recorded on every contact; the poll hint reflects them.
pub async fn device_liveness(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    assert!(
        store
            .device(&w.device.owner, &w.device.id)
            .await
            .expect("device")
            .is_none()
    );
    w.sync(&w.device, p1(), &[1]).await;
    let t0 = w.clock.now();
    let rec = store
        .device(&w.device.owner, &w.device.id)
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(rec.last_sync_at, Some(t0));
    assert_eq!(rec.last_seen_at, t0);
    assert!(!rec.long_poll);
    let cmd = w.run(&w.agent, 1, "liveness-1").await;
    w.advance(5);
    let view = w.queue.get_graph_run(&w.agent, &cmd.id).await.expect("get");
    assert_eq!(view.poll_after_seconds, Some(16));
    assert_eq!(view.device_offline_since, None);
    w.advance(100);
    let view = w.queue.get_graph_run(&w.agent, &cmd.id).await.expect("get");
    assert_eq!(view.device_offline_since, Some(t0));
    assert!(view.to_json()["device_offline_since"].is_string());
    store
        .touch_device(
            &w.device.owner,
            &w.device.id,
            DeviceContact::Sync { long_poll: true },
            w.clock.now(),
        )
        .await
        .expect("touch");
    let rec = store
        .device(&w.device.owner, &w.device.id)
        .await
        .expect("device")
        .expect("seen");
    assert!(rec.long_poll);
    assert_eq!(rec.last_sync_at, Some(w.clock.now()));
    // Other contacts move last_seen only.
    w.advance(1);
    store
        .touch_device(
            &w.device.owner,
            &w.device.id,
            DeviceContact::Other,
            w.clock.now(),
        )
        .await
        .expect("touch");
    let later = store
        .device(&w.device.owner, &w.device.id)
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(later.last_seen_at, w.clock.now());
    assert_eq!(later.last_sync_at, rec.last_sync_at);
    assert!(later.long_poll);
    // Devices of another owner are separate records.
    assert!(
        store
            .device(&w.stranger_device.owner, &w.device.id)
            .await
            .expect("device")
            .is_none()
    );

    // Several contacts at once: each as a single one of its kind, per
    // (owner, device); a stamp older than the stored one moves nothing,
    // and a device seen for the first time gets a record of its own.
    let seen = later.last_seen_at;
    let stranger = DeviceId::parse("batch-only").expect("id");
    store
        .touch_devices(&[
            DeviceTouch {
                owner: w.device.owner.clone(),
                device: w.device.id.clone(),
                at: seen.minus(Duration::from_secs(1)),
            },
            DeviceTouch {
                owner: w.stranger_device.owner.clone(),
                device: stranger.clone(),
                at: seen.plus(Duration::from_secs(2)),
            },
        ])
        .await
        .expect("touch several");
    let kept = store
        .device(&w.device.owner, &w.device.id)
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(kept, later, "an older contact moves nothing");
    let new = store
        .device(&w.stranger_device.owner, &stranger)
        .await
        .expect("device")
        .expect("seen by the batch");
    assert_eq!(
        (new.last_sync_at, new.last_seen_at, new.long_poll),
        (None, seen.plus(Duration::from_secs(2)), false)
    );
    assert!(
        store
            .device(&w.device.owner, &stranger)
            .await
            .expect("device")
            .is_none(),
        "the batch wrote its owner's device only"
    );
    store
        .touch_devices(&[DeviceTouch {
            owner: w.device.owner.clone(),
            device: w.device.id.clone(),
            at: seen.plus(Duration::from_secs(3)),
        }])
        .await
        .expect("touch one");
    let moved = store
        .device(&w.device.owner, &w.device.id)
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(moved.last_seen_at, seen.plus(Duration::from_secs(3)));
    assert_eq!(
        (moved.last_sync_at, moved.long_poll),
        (later.last_sync_at, later.long_poll),
        "a contact that is not a sync keeps the sync's stamp and mode"
    );
    store.touch_devices(&[]).await.expect("nothing to touch");
}

/// Expired keys and old terminal commands go, in bounded batches; live ones stay.
pub async fn pruning(store: Arc<dyn Store>) {
    let config = QueueConfig {
        idempotency_ttl: Duration::from_secs(3600),
        terminal_retention: Some(Duration::from_secs(7200)),
        prune_batch: 2,
        ..QueueConfig::default()
    };
    let w = World::with_config(store.clone(), config);
    w.sync(&w.device, p1(), &[1]).await;
    let mut done = Vec::new();
    for i in 0..3 {
        let c = w.run(&w.agent, 1, &format!("prune-key-{i}")).await;
        w.queue
            .cancel_graph_run(&w.agent, &c.id)
            .await
            .expect("cancel");
        done.push(c.id);
    }
    let open = w.run(&w.agent, 1, "prune-open").await;
    assert_eq!(
        w.queue.prune().await.expect("prune"),
        Default::default(),
        "nothing is old yet"
    );

    w.advance(3601);
    // Keys expired; commands not yet past retention.
    let r1 = w.queue.prune().await.expect("prune");
    assert_eq!((r1.keys, r1.commands), (2, 0), "bounded by the batch");
    let r2 = w.queue.prune().await.expect("prune");
    assert_eq!((r2.keys, r2.commands), (2, 0));
    assert_eq!(w.queue.prune().await.expect("prune").keys, 0);
    for c in &done {
        assert!(w.queue.get_graph_run(&w.agent, c).await.is_ok());
    }

    w.advance(3600);
    let r = w.queue.prune().await.expect("prune");
    assert_eq!(r.commands, 2);
    let r = w.queue.prune().await.expect("prune");
    assert_eq!(r.commands, 1);
    for c in &done {
        assert!(matches!(
            w.queue.get_graph_run(&w.agent, c).await,
            Err(GetError::NotFound)
        ));
    }
    // The still-queued command is never pruned.
    assert!(w.queue.get_graph_run(&w.agent, &open.id).await.is_ok());

    // A terminal command whose key is still live is kept.
    let kept = w.run(&w.agent, 1, "prune-live").await;
    w.queue
        .cancel_graph_run(&w.agent, &kept.id)
        .await
        .expect("cancel");
    let report = store
        .prune(PruneRequest {
            now: w.clock.now(),
            terminal_before: Some(w.clock.now().plus(Duration::from_secs(1))),
            batch: 10,
        })
        .await
        .expect("prune");
    assert_eq!(report.commands, 0);
    assert!(w.queue.get_graph_run(&w.agent, &kept.id).await.is_ok());
}

/// Cancel while queued (immediate), while running (flag, wins over a late finish), when terminal (no-op).
pub async fn cancellation(store: Arc<dyn Store>) {
    let w = World::new(store);
    w.sync(&w.device, p1(), &[1]).await;
    let queued = w.run(&w.agent, 1, "cancel-key-1").await;
    let view = w
        .queue
        .cancel_graph_run(&w.agent, &queued.id)
        .await
        .expect("cancel");
    assert_eq!(view.command.status, CommandStatus::Cancelled);
    assert_eq!(
        view.command.finished_at,
        Some(w.clock.now()),
        "terminal after 0 s"
    );
    assert!(
        w.sync(&w.device, p1(), &[1]).await.is_empty(),
        "the relay never sees it"
    );

    let running = w.run(&w.agent, 1, "cancel-key-2").await;
    w.queue
        .start(&w.device, &running.id, &exec("c2"))
        .await
        .expect("start");
    let view = w
        .queue
        .cancel_graph_run(&w.agent, &running.id)
        .await
        .expect("cancel");
    assert_eq!(view.command.status, CommandStatus::Running);
    assert!(view.command.cancel_requested);
    assert!(
        w.queue
            .control(&w.device, &running.id)
            .await
            .expect("control")
            .cancel_requested
    );
    // The Graph finished between the flag and the stop: still cancelled.
    w.queue
        .complete(&w.device, &running.id, &completed("c2", json!("late")))
        .await
        .expect("complete");
    let view = w
        .queue
        .get_graph_run(&w.agent, &running.id)
        .await
        .expect("get");
    assert_eq!(view.command.status, CommandStatus::Cancelled);
    assert!(
        view.to_json().get("result").is_none(),
        "a cancelled run shows no result"
    );

    // Terminal: nothing changes.
    let again = w
        .queue
        .cancel_graph_run(&w.agent, &running.id)
        .await
        .expect("cancel");
    assert_eq!(again.command, view.command);
}

/// A running command holds a lease that control requests renew; when it
/// lapses the run ends `failed` (reads, reports and the sweep all agree), a
/// cancel of a lapsed run ends it `cancelled` at once, and a late result is
/// refused.
pub async fn leases(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    // Interval mode: a lease of 10 control intervals (30 s).
    w.sync(&w.device, p1(), &[1]).await;
    let cmd = w.run(&w.agent, 1, "lease-key-01").await;
    let t0 = w.clock.now();
    let started = w
        .queue
        .start(&w.device, &cmd.id, &exec("lease-e1"))
        .await
        .expect("start");
    assert_eq!(
        started.lease_expires_at,
        Some(t0.plus(Duration::from_secs(30)))
    );
    assert_eq!(started.heard_at, Some(t0));
    // A control request renews once less than half the lease is left.
    w.advance(5);
    w.queue.control(&w.device, &cmd.id).await.expect("control");
    let read = |id: CommandId| {
        let store = store.clone();
        let owner = w.agent.owner.clone();
        let agent = w.agent.id.clone();
        async move {
            store
                .command_for_agent(&owner, &agent, &id)
                .await
                .expect("read")
                .expect("exists")
        }
    };
    assert_eq!(read(cmd.id).await.revision, started.revision, "not due yet");
    w.advance(15);
    let answer = w.queue.control(&w.device, &cmd.id).await.expect("control");
    assert_eq!(answer.status, CommandStatus::Running);
    let renewed = read(cmd.id).await;
    assert_eq!(
        renewed.lease_expires_at,
        Some(t0.plus(Duration::from_secs(50)))
    );
    assert_eq!(renewed.heard_at, Some(t0.plus(Duration::from_secs(20))));
    w.advance(29);
    assert_eq!(
        w.queue
            .get_graph_run(&w.agent, &cmd.id)
            .await
            .expect("get")
            .command
            .status,
        CommandStatus::Running
    );
    // Past the lease: the read closes it, at the instant it lapsed.
    w.advance(2);
    let view = w.queue.get_graph_run(&w.agent, &cmd.id).await.expect("get");
    assert_eq!(view.command.status, CommandStatus::Failed);
    assert_eq!(view.poll_after_seconds, None);
    assert_eq!(
        view.command.finished_at,
        Some(t0.plus(Duration::from_secs(50)))
    );
    let error = view.to_json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.starts_with(LEASE_LAPSED), "{error}");
    assert!(
        error.contains(&t0.plus(Duration::from_secs(20)).to_rfc3339()),
        "names when the desktop was last heard from: {error}"
    );
    assert_eq!(read(cmd.id).await, view.command, "the read wrote it");
    // A late result is refused and changes nothing; control says stop.
    assert!(matches!(
        w.queue
            .complete(&w.device, &cmd.id, &completed("lease-e1", json!("late")))
            .await,
        Err(CompleteError::Refused(CompleteRefused::Lapsed("failed")))
    ));
    assert_eq!(read(cmd.id).await, view.command);
    let answer = w.queue.control(&w.device, &cmd.id).await.expect("control");
    assert_eq!(answer.status, CommandStatus::Failed);
    assert!(matches!(
        w.queue.start(&w.device, &cmd.id, &exec("lease-e1")).await,
        Err(StartError::Refused(StartRefused::Finished("failed")))
    ));
    assert_eq!(
        w.queue
            .cancel_graph_run(&w.agent, &cmd.id)
            .await
            .expect("cancel")
            .command,
        view.command,
        "a closed run stays as it was closed"
    );

    // Cancelled after the lapse, before anything looked: cancelled at once.
    let second = w.run(&w.agent, 1, "lease-key-02").await;
    w.queue
        .start(&w.device, &second.id, &exec("lease-e2"))
        .await
        .expect("start");
    w.advance(31);
    let cancelled = w
        .queue
        .cancel_graph_run(&w.agent, &second.id)
        .await
        .expect("cancel")
        .command;
    assert_eq!(cancelled.status, CommandStatus::Cancelled);
    assert_eq!(cancelled.finished_at, Some(w.clock.now()));
    assert_eq!(read(second.id).await, cancelled);

    // The sweep closes what nobody looks at, once; a cancel asked before
    // the lapse ends the run cancelled.
    let third = w.run(&w.agent, 1, "lease-key-03").await;
    let fourth = w.run(&w.agent, 1, "lease-key-04").await;
    for (c, e) in [(&third, "lease-e3"), (&fourth, "lease-e4")] {
        w.queue
            .start(&w.device, &c.id, &exec(e))
            .await
            .expect("start");
    }
    w.queue
        .cancel_graph_run(&w.agent, &third.id)
        .await
        .expect("flag");
    assert_eq!(
        w.queue.sweep_lapsed().await.expect("sweep"),
        0,
        "nothing lapsed yet"
    );
    w.advance(31);
    assert_eq!(w.queue.sweep_lapsed().await.expect("sweep"), 2);
    assert_eq!(w.queue.sweep_lapsed().await.expect("sweep"), 0);
    assert_eq!(read(third.id).await.status, CommandStatus::Cancelled);
    assert_eq!(read(fourth.id).await.status, CommandStatus::Failed);

    // A long-polling desktop gets the long-poll lease (60 s).
    let request = held_sync(2);
    w.queue.sync(&w.other_device, &request).await.expect("sync");
    let fifth = w.run(&w.agent, 2, "lease-key-05").await;
    let started = w
        .queue
        .start(&w.other_device, &fifth.id, &exec("lease-e5"))
        .await
        .expect("start");
    assert_eq!(fifth.device, w.other_device.id);
    assert_eq!(
        started.lease_expires_at,
        Some(w.clock.now().plus(Duration::from_secs(60)))
    );

    // A running record written before leases existed is granted one by the sweep.
    let mut legacy = w.sync_template(0x1e9ac7);
    let key = IdempotencyRecord {
        owner: legacy.owner.clone(),
        agent: legacy.agent.clone(),
        key: legacy.idempotency_key.clone(),
        command: legacy.id,
        fingerprint: "f".into(),
        expires_at: w.clock.now().plus(Duration::from_secs(60)),
    };
    store
        .insert_command(&legacy, &key, w.clock.now())
        .await
        .expect("insert");
    legacy.status = CommandStatus::Running;
    legacy.execution_id = Some(exec("legacy"));
    legacy.started_at = Some(w.clock.now());
    legacy.revision = 1;
    assert!(store.update_command(&legacy).await.expect("update"));
    assert_eq!(w.queue.sweep_lapsed().await.expect("sweep"), 1);
    assert_eq!(
        read(legacy.id).await.lease_expires_at,
        Some(w.clock.now().plus(Duration::from_secs(60)))
    );
    w.advance(61);
    assert!(w.queue.sweep_lapsed().await.expect("sweep") >= 1);
    assert_eq!(read(legacy.id).await.status, CommandStatus::Failed);
}

/// A desktop that restarted closes its other running commands at once, and
/// a sync that no longer shares a session ends its queued runs.
pub async fn restart_and_unsharing(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    for device in [&w.device, &w.other_device, &w.twin_device] {
        w.sync(device, p1(), &[1]).await;
    }
    let mine = w.run(&w.agent, 1, "restart-key-01").await;
    let kept = w.run(&w.agent, 1, "restart-key-02").await;
    w.queue
        .start(&w.device, &mine.id, &exec("r1"))
        .await
        .expect("start");
    w.queue
        .start(&w.device, &kept.id, &exec("r2"))
        .await
        .expect("start");
    let elsewhere = w.run(&w.other_agent, 1, "restart-key-03").await;
    assert_eq!(elsewhere.device, w.device.id, "the smallest device id wins");
    let bobs = w.run(&w.twin, 1, "restart-key-04").await;
    w.queue
        .start(&w.twin_device, &bobs.id, &exec("r1"))
        .await
        .expect("bob's start");
    w.advance(3);
    let restart = |running: Option<CommandId>| SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
        restarted: true,
        running,
    };
    let handed = w
        .queue
        .sync(&w.device, &restart(Some(kept.id)))
        .await
        .expect("sync")
        .commands;
    assert_eq!(
        handed.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![elsewhere.id]
    );
    let closed = w
        .queue
        .get_graph_run(&w.agent, &mine.id)
        .await
        .expect("get")
        .command;
    assert_eq!(closed.status, CommandStatus::Failed);
    assert_eq!(
        closed.finished_at,
        Some(w.clock.now()),
        "at once, not at the lapse"
    );
    assert!(
        closed
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(DESKTOP_RESTARTED)),
        "{closed:?}"
    );
    assert_eq!(
        w.queue
            .get_graph_run(&w.agent, &kept.id)
            .await
            .expect("get")
            .command
            .status,
        CommandStatus::Running,
        "what it says it runs keeps running"
    );
    assert_eq!(
        w.queue
            .get_graph_run(&w.twin, &bobs.id)
            .await
            .expect("get")
            .command
            .status,
        CommandStatus::Running,
        "Bob's desktop of the same name is another desktop"
    );
    // A late result of the closed run is refused.
    assert!(matches!(
        w.queue
            .complete(&w.device, &mine.id, &completed("r1", json!(1)))
            .await,
        Err(CompleteError::Refused(CompleteRefused::Lapsed("failed")))
    ));

    // Un-sharing: the queued run of a session no longer shared ends now.
    let queued = w.run(&w.agent, 1, "restart-key-05").await;
    assert_eq!(queued.device, w.device.id);
    w.advance(2);
    assert!(w.sync(&w.device, p1(), &[]).await.is_empty());
    for id in [queued.id, elsewhere.id] {
        let view = w.queue.get_graph_run(&w.agent, &id).await;
        let view = match view {
            Ok(view) => view.command,
            Err(_) => {
                w.queue
                    .get_graph_run(&w.other_agent, &id)
                    .await
                    .expect("get")
                    .command
            }
        };
        assert_eq!(view.status, CommandStatus::Cancelled);
        assert_eq!(view.reason.as_deref(), Some(NO_LONGER_SHARED));
    }
    assert!(matches!(
        w.queue
            .run_graph_session(&w.agent, run_args(1, "restart-key-06", json!({})))
            .await
            .map(|t| t.command.device),
        Ok(ref d) if *d == w.other_device.id
    ));
}

/// A running Graph's progress is shown to its agent, throttled to one
/// write per interval, fenced by execution, and never moves a run.
pub async fn progress(store: Arc<dyn Store>) {
    use crate::command::ProgressRefused;
    use crate::queue::{ProgressAck, ProgressError};
    let w = World::new(store.clone());
    w.sync(&w.device, p1(), &[1]).await;
    let cmd = w.run(&w.agent, 1, "progress-key-1").await;
    let report = |id: CommandId, execution: &'static str, message: &str, percent: f64| {
        let (q, d) = (&w.queue, &w.device);
        let message = message.to_owned();
        async move {
            q.report_progress(d, &id, &exec(execution), Some(message), Some(percent))
                .await
        }
    };
    // Not running yet: refused, nothing written.
    assert!(matches!(
        report(cmd.id, "p-e1", "early", 1.0).await,
        Err(ProgressError::Refused(ProgressRefused::NotRunning(
            "queued"
        )))
    ));
    w.queue
        .start(&w.device, &cmd.id, &exec("p-e1"))
        .await
        .expect("start");
    assert!(matches!(
        report(cmd.id, "p-e1", "step 1 of 5", 20.0).await,
        Ok(ProgressAck::Recorded)
    ));
    let view = w.queue.get_graph_run(&w.agent, &cmd.id).await.expect("get");
    assert_eq!(view.command.status, CommandStatus::Running);
    let shown = view.to_json();
    assert_eq!(shown["progress"]["message"], json!("step 1 of 5"));
    assert_eq!(shown["progress"]["percent"], json!(20.0));
    assert_eq!(
        shown["progress"]["updated_at"],
        json!(w.clock.now().to_rfc3339())
    );
    // Within the interval: coalesced; the latest one is written by the next
    // report after the interval, or by maintenance.
    let before = view.command.revision;
    for step in 2..=4 {
        assert!(matches!(
            report(
                cmd.id,
                "p-e1",
                &format!("step {step} of 5"),
                f64::from(step) * 20.0
            )
            .await,
            Ok(ProgressAck::Coalesced)
        ));
    }
    let read = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get")
        .command;
    assert_eq!(read.revision, before, "one write per interval");
    w.advance(1);
    assert_eq!(w.queue.maintain().await.expect("maintain").progress, 1);
    let read = w
        .queue
        .get_graph_run(&w.agent, &cmd.id)
        .await
        .expect("get")
        .command;
    assert_eq!(
        read.progress.and_then(|p| p.message).as_deref(),
        Some("step 4 of 5"),
        "the latest report wins"
    );
    assert_eq!(w.queue.maintain().await.expect("maintain").progress, 0);
    // Fenced by execution; bad values refused; the same report writes nothing.
    assert!(matches!(
        report(cmd.id, "other-exec", "forged", 99.0).await,
        Err(ProgressError::Refused(ProgressRefused::StaleExecution))
    ));
    assert!(matches!(
        report(cmd.id, "p-e1", "too far", 101.0).await,
        Err(ProgressError::Invalid(_))
    ));
    assert!(matches!(
        report(cmd.id, "p-e1", &"x".repeat(501), 50.0).await,
        Err(ProgressError::Invalid(_))
    ));
    w.advance(1);
    assert!(matches!(
        report(cmd.id, "p-e1", "step 4 of 5", 80.0).await,
        Ok(ProgressAck::Unchanged)
    ));
    // Another owner's desktop of the same name cannot report on it.
    assert!(matches!(
        w.queue
            .report_progress(&w.twin_device, &cmd.id, &exec("p-e1"), None, Some(1.0))
            .await,
        Err(ProgressError::NotFound)
    ));
    // After the end the last report stays, and nothing revives the run.
    w.queue
        .complete(&w.device, &cmd.id, &completed("p-e1", json!("done")))
        .await
        .expect("complete");
    w.advance(1);
    assert!(matches!(
        report(cmd.id, "p-e1", "zombie", 90.0).await,
        Err(ProgressError::Refused(ProgressRefused::NotRunning(
            "completed"
        )))
    ));
    let done = w.queue.get_graph_run(&w.agent, &cmd.id).await.expect("get");
    assert_eq!(done.command.status, CommandStatus::Completed);
    assert_eq!(done.to_json()["progress"]["message"], json!("step 4 of 5"));
}

/// The store methods' edges, checked directly: which shared session wins
/// (the first project in the given order, then the smallest device id),
/// and that a key stops being live exactly at `expires_at`.
pub async fn store_edges(store: Arc<dyn Store>) {
    let w = World::new(store.clone());
    let owner = &w.agent.owner;
    let now = w.clock.now();
    // The same session shared by two devices to p1, and by one to p2.
    for (device, project) in [
        (&w.other_device, p1()),
        (&w.device, p1()),
        (&w.device, p2()),
    ] {
        store
            .replace_shared_sessions(owner, &project, &device.id, &[meta(5)], now)
            .await
            .expect("share");
    }
    let found = |projects: Vec<ProjectId>| {
        let store = store.clone();
        let owner = owner.clone();
        async move {
            store
                .find_shared_session(&owner, &projects, &gs(5))
                .await
                .expect("find")
                .map(|s| (s.project, s.device))
        }
    };
    assert_eq!(
        found(vec![p1(), p2()]).await,
        Some((p1(), w.device.id.clone())),
        "within a project, the smallest device id (`desktop` < `laptop`)"
    );
    assert_eq!(
        found(vec![p2(), p1()]).await,
        Some((p2(), w.device.id.clone())),
        "the first project in the order given wins"
    );
    assert_eq!(found(vec![]).await, None);
    assert_eq!(
        store
            .find_shared_session(&w.twin.owner, &[p1(), p2()], &gs(5))
            .await
            .expect("find"),
        None,
        "another owner's projects of the same names"
    );

    // A key is live strictly before `expires_at`.
    let mut cmd = w.sync_template(0xed9e);
    cmd.idempotency_key = id(IdempotencyKey::parse("edge-key-0001"));
    let expires_at = now.plus(Duration::from_secs(10));
    let key = IdempotencyRecord {
        owner: cmd.owner.clone(),
        agent: cmd.agent.clone(),
        key: cmd.idempotency_key.clone(),
        command: cmd.id,
        fingerprint: "f".into(),
        expires_at,
    };
    assert_eq!(
        store.insert_command(&cmd, &key, now).await.expect("insert"),
        InsertOutcome::Inserted
    );
    let live_at = |t: Timestamp| {
        let store = store.clone();
        let (owner, agent, k) = (
            cmd.owner.clone(),
            cmd.agent.clone(),
            cmd.idempotency_key.clone(),
        );
        async move {
            store
                .idempotency(&owner, &agent, &k, t)
                .await
                .expect("read key")
                .is_some()
        }
    };
    assert!(live_at(Timestamp(expires_at.as_millis() - 1)).await);
    assert!(!live_at(expires_at).await, "expired exactly at expires_at");
    assert!(!live_at(expires_at.plus(Duration::from_secs(1))).await);
    // At expires_at the key may be taken again by a new command.
    let mut again = w.sync_template(0xed9f);
    again.idempotency_key = cmd.idempotency_key.clone();
    let second = IdempotencyRecord {
        command: again.id,
        expires_at: expires_at.plus(Duration::from_secs(10)),
        ..key.clone()
    };
    assert_eq!(
        store
            .insert_command(&again, &second, expires_at)
            .await
            .expect("insert"),
        InsertOutcome::Inserted
    );
    assert_eq!(
        store
            .idempotency(
                &again.owner,
                &again.agent,
                &again.idempotency_key,
                expires_at
            )
            .await
            .expect("read key")
            .map(|k| k.command),
        Some(again.id)
    );
}

/// Runs every outbox conformance function as its own `#[test]`; arguments as
/// for [`store_conformance_suite!`](crate::store_conformance_suite), with a
/// future of a fresh, empty outbox.
#[macro_export]
macro_rules! outbox_conformance_suite {
    ($block_on:path, $make:expr) => {
        #[test]
        fn outbox_put_pending_remove() {
            $block_on(async {
                let outbox: ::std::sync::Arc<dyn $crate::outbox::Outbox> =
                    ::std::sync::Arc::new(($make).await);
                $crate::testkit::outbox_put_pending_remove(outbox).await;
            });
        }
    };
}

/// Items come back oldest first, replace per command, count attempts, and go when removed.
pub async fn outbox_put_pending_remove(outbox: Arc<dyn crate::outbox::Outbox>) {
    use crate::outbox::{OutboxItem, RelayReport};
    assert!(outbox.pending().await.expect("pending").is_empty());
    let a = CommandId::from_uuid(uuid::Uuid::from_u128(2));
    let b = CommandId::from_uuid(uuid::Uuid::from_u128(1));
    let item_a = OutboxItem {
        command: a,
        report: RelayReport::Completion {
            envelope: completed("ea", json!({"text": "日本語 😀"})),
        },
        stored_at: Timestamp(10),
        attempts: 0,
    };
    let item_b = OutboxItem {
        command: b,
        report: RelayReport::Declined,
        stored_at: Timestamp(20),
        attempts: 0,
    };
    outbox.put(&item_b).await.expect("put b");
    outbox.put(&item_a).await.expect("put a");
    assert_eq!(
        outbox.pending().await.expect("pending"),
        vec![item_a.clone(), item_b.clone()]
    );

    outbox.record_attempt(&a).await.expect("attempt");
    outbox.record_attempt(&a).await.expect("attempt");
    let pending = outbox.pending().await.expect("pending");
    assert_eq!(pending[0].attempts, 2);

    // Replacing keeps one item per command.
    let replaced = OutboxItem {
        stored_at: Timestamp(30),
        ..item_b.clone()
    };
    outbox.put(&replaced).await.expect("replace");
    let pending = outbox.pending().await.expect("pending");
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[1], replaced);

    outbox.remove(&a).await.expect("remove");
    outbox.remove(&a).await.expect("remove twice is fine");
    outbox
        .record_attempt(&a)
        .await
        .expect("attempt on absent item is a no-op");
    assert_eq!(outbox.pending().await.expect("pending"), vec![replaced]);
    outbox.remove(&b).await.expect("remove");
    assert!(outbox.pending().await.expect("pending").is_empty());
}
