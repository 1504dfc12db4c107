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

pub mod model;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::args::RunArgs;
use crate::command::{
    CommandRecord, CommandStatus, CompleteRefused, NO_LONGER_SHARED, StartRefused,
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
use crate::store::{DeviceContact, IdempotencyRecord, InsertOutcome, PruneRequest, Store};
use crate::time::{Clock, ManualClock, SeededIds, Timestamp};

/// Runs every conformance function as its own `#[test]`.
#[macro_export]
macro_rules! store_conformance_suite {
    ($block_on:path, $make:expr) => {
        $crate::store_conformance_suite!(@tests $block_on, $make;
            lifecycle, idempotency, racing_duplicate_starts, transitions_refused_from_wrong_state,
            compare_and_swap, ownership_is_hidden, names_are_scoped_by_owner, project_bound,
            listing, queued_order_and_limit, device_liveness, pruning, cancellation);
    };
    (@tests $block_on:path, $make:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $block_on(async {
                    let store: ::std::sync::Arc<dyn $crate::store::Store> = ::std::sync::Arc::new(($make).await);
                    $crate::testkit::$name(store).await;
                });
            }
        )*
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

    w.advance(60);
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
    for target in [queued.id, running.id] {
        let pairs = [
            (
                w.queue
                    .start(&w.twin_device, &target, &exec("alice-exec"))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                w.queue
                    .start(&w.twin_device, &unknown, &exec("alice-exec"))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            ),
            (
                w.queue
                    .control(&w.twin_device, &target)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                w.queue
                    .control(&w.twin_device, &unknown)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            ),
            (
                w.queue
                    .complete(&w.twin_device, &target, &forged)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                w.queue
                    .complete(&w.twin_device, &unknown, &forged)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            ),
            (
                w.queue
                    .decline(&w.twin_device, &target)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                w.queue
                    .decline(&w.twin_device, &unknown)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            ),
        ];
        for (theirs, none) in pairs {
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
