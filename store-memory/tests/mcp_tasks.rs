//! The tasks extension and the server-side wait, end to end through the
//! core's MCP handling over the memory store (relay steps via `Queue`).

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{CommandId, ExecutionId};
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo, TASKS_EXTENSION};
use graph_relay_core::queue::{Queue, QueueConfig};
use graph_relay_core::testkit::{World, p1};
use graph_relay_core::time::{SeededIds, Sleeper, SystemClock};
use graph_relay_store_memory::MemoryStore;
use serde_json::{Value, json};

const GS: &str = "gs_00000000000000000000000000000001";

/// A timer on a plain thread, so the test needs no async runtime.
struct ThreadSleeper;

impl Sleeper for ThreadSleeper {
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            let _ = tx.send(());
        });
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

struct Fixture {
    world: World,
    server: McpServer,
    alice: Caller,
    other: Caller,
}

fn fixture(wait: Option<u32>) -> Fixture {
    let world = World::new(Arc::new(MemoryStore::new()));
    block_on(world.sync(&world.device, p1(), &[1]));
    let catalog = ToolCatalog::builder()
        .wait_seconds(wait)
        .build()
        .expect("catalog");
    let server = McpServer::new(
        world.queue.clone(),
        catalog,
        ServerInfo::new("graph-relay", "test"),
    )
    .with_sleeper(Arc::new(ThreadSleeper));
    let alice = Caller::new(world.agent.clone(), [READ_SCOPE, RUN_SCOPE]);
    let other = Caller::new(world.other_agent.clone(), [READ_SCOPE, RUN_SCOPE]);
    Fixture {
        world,
        server,
        alice,
        other,
    }
}

fn meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({"extensions": {TASKS_EXTENSION: {}}})
    } else {
        json!({})
    };
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": caps})
}

impl Fixture {
    fn request(&self, caller: &Caller, method: &str, mut params: Value, tasks: bool) -> Value {
        params["_meta"] = meta(tasks);
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let reply = block_on(self.server.handle(
            &mut McpSession::new(),
            caller,
            message.to_string().as_bytes(),
        ));
        reply.expect("a reply").message().clone()
    }

    fn run(&self, key: &str, tasks: bool) -> Value {
        self.request(
            &self.alice,
            "tools/call",
            json!({"name": "run_graph_session", "arguments": {"graph_session_id": GS, "idempotency_key": key}}),
            tasks,
        )
    }

    /// Queues a run without the tasks extension; returns its command id.
    fn ticket(&self, key: &str) -> String {
        let reply = self.run(key, false);
        reply["result"]["structuredContent"]["command_id"]
            .as_str()
            .expect("a ticket")
            .to_owned()
    }

    fn task(&self, caller: &Caller, method: &str, task_id: &str) -> Value {
        self.request(caller, method, json!({"taskId": task_id}), true)
    }

    fn finish(&self, id: &CommandId, status: FinishStatus, result: Value, error: Option<&str>) {
        let w = &self.world;
        let exec = ExecutionId::parse("exec-task").expect("valid");
        block_on(w.queue.start(&w.device, id, &exec)).expect("start");
        let envelope = ResultEnvelope::build(
            exec,
            status,
            EnvelopeBody {
                result,
                error: error.map(str::to_owned),
                ..EnvelopeBody::default()
            },
        );
        block_on(w.queue.complete(&w.device, id, &envelope)).expect("complete");
    }
}

fn task_id(reply: &Value) -> (String, CommandId) {
    let id = reply["result"]["taskId"]
        .as_str()
        .expect("taskId")
        .to_owned();
    let command = CommandId::parse(&id).expect("the task id is the command id");
    (id, command)
}

#[test]
fn a_declaring_client_gets_a_task_and_reads_the_result_inline() {
    let f = fixture(None);
    let created = f.run("task-key-01", true);
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    assert_eq!(result["status"], "working");
    assert!(
        result["pollIntervalMs"]
            .as_u64()
            .is_some_and(|ms| ms >= 1000),
        "{result}"
    );
    assert!(result["createdAt"].is_string() && result["lastUpdatedAt"].is_string());
    assert_eq!(result["ttlMs"], Value::Null);
    let (id, command) = task_id(&created);

    let working = f.task(&f.alice, "tasks/get", &id);
    assert_eq!(working["result"]["status"], "working");
    assert_eq!(working["result"]["resultType"], "complete");
    assert!(working["result"].get("result").is_none());

    f.finish(
        &command,
        FinishStatus::Completed,
        json!({"answer": 42}),
        None,
    );
    let done = f.task(&f.alice, "tasks/get", &id);
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let inner = &done["result"]["result"];
    assert_eq!(inner["isError"], false);
    assert_eq!(inner["structuredContent"]["result"], json!({"answer": 42}));
    assert_eq!(inner["structuredContent"]["status"], "completed");

    // The same key replays the same task.
    let again = f.run("task-key-01", true);
    assert_eq!(task_id(&again).1, command);
}

#[test]
fn a_failed_graph_is_a_completed_task_with_an_error_result() {
    let f = fixture(None);
    let (id, command) = task_id(&f.run("task-key-02", true));
    f.finish(
        &command,
        FinishStatus::Failed,
        Value::Null,
        Some("exit status 3: disk full"),
    );
    let done = f.task(&f.alice, "tasks/get", &id);
    assert_eq!(done["result"]["status"], "completed");
    assert_eq!(done["result"]["result"]["isError"], true);
    assert_eq!(
        done["result"]["result"]["structuredContent"]["error"],
        "exit status 3: disk full"
    );
}

#[test]
fn tasks_cancel_cancels_the_run() {
    let f = fixture(None);
    let (id, _) = task_id(&f.run("task-key-03", true));
    let ack = f.task(&f.alice, "tasks/cancel", &id);
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let after = f.task(&f.alice, "tasks/get", &id);
    assert_eq!(after["result"]["status"], "cancelled");
    assert!(
        after["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("Cancelled"))
    );
    let update = f.task(&f.alice, "tasks/update", &id);
    assert_eq!(update["result"]["resultType"], "complete");
}

#[test]
fn tasks_are_bound_to_their_agent_and_need_the_extension() {
    let f = fixture(None);
    let (id, _) = task_id(&f.run("task-key-04", true));
    let foreign = f.task(&f.other, "tasks/get", &id);
    let unknown = f.task(
        &f.alice,
        "tasks/get",
        "67e55044-10b1-426f-9247-bb680e5fe0c8",
    );
    let malformed = f.task(&f.alice, "tasks/get", "not-a-task");
    for reply in [&foreign, &unknown, &malformed] {
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        assert_eq!(
            reply["error"]["message"],
            "Failed to retrieve task: Task not found"
        );
    }
    assert_eq!(
        f.task(&f.other, "tasks/cancel", &id)["error"]["code"],
        -32602
    );
    assert_eq!(
        f.task(&f.alice, "tasks/get", &id)["result"]["status"],
        "working",
        "the foreign cancel changed nothing"
    );

    let undeclared = f.request(&f.alice, "tasks/get", json!({"taskId": id}), false);
    assert_eq!(undeclared["error"]["code"], -32021, "{undeclared}");
    assert_eq!(
        undeclared["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION],
        json!({})
    );
}

#[test]
fn clients_without_the_extension_keep_the_ticket() {
    let f = fixture(None);
    let reply = f.run("task-key-05", false);
    let result = &reply["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["structuredContent"]["status"], "queued");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("get_graph_run"))
    );
    let discover = f.request(&f.alice, "server/discover", json!({}), false);
    assert_eq!(
        discover["result"]["capabilities"]["extensions"][TASKS_EXTENSION],
        json!({})
    );
}

#[test]
fn wait_seconds_returns_when_the_run_finishes() {
    let f = fixture(Some(30));
    let id = f.ticket("wait-key-01");
    let command = CommandId::parse(&id).expect("uuid");
    let queue: Queue = f.world.queue.clone();
    let device = f.world.device.clone();
    // The relay finishes the run while the agent's call is waiting.
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let exec = ExecutionId::parse("exec-wait").expect("valid");
        block_on(queue.start(&device, &command, &exec)).expect("start");
        let envelope = ResultEnvelope::build(
            exec,
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!("done"),
                ..EnvelopeBody::default()
            },
        );
        block_on(queue.complete(&device, &command, &envelope)).expect("complete");
    });
    let waited = f.request(
        &f.alice,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": id, "wait_seconds": 30}}),
        false,
    );
    finisher.join().expect("finisher");
    assert_eq!(
        waited["result"]["structuredContent"]["status"], "completed",
        "{waited}"
    );
    assert_eq!(waited["result"]["structuredContent"]["result"], "done");
    assert_eq!(
        f.server.queue().signals().waiting(),
        0,
        "no waiter is left behind"
    );
}

#[test]
fn wait_seconds_gives_up_at_its_bound_and_is_refused_when_disabled() {
    let f = fixture(Some(30));
    let id = f.ticket("wait-key-02");
    let waited = f.request(
        &f.alice,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": id, "wait_seconds": 1}}),
        false,
    );
    assert_eq!(
        waited["result"]["structuredContent"]["status"], "queued",
        "{waited}"
    );
    let too_long = f.request(
        &f.alice,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": id, "wait_seconds": 31}}),
        false,
    );
    assert_eq!(too_long["result"]["isError"], true);

    let off = fixture(None);
    let id = off.ticket("wait-key-03");
    let refused = off.request(
        &off.alice,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": id, "wait_seconds": 1}}),
        false,
    );
    assert_eq!(refused["result"]["isError"], true);
    assert!(
        refused["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("wait_seconds"))
    );
}

#[test]
fn system_clock_queue_works_with_the_wait_too() {
    // The fixture above uses the testkit's manual clock; a real deployment
    // runs on the system clock, where the deadline arithmetic must also hold.
    let world = World::new(Arc::new(MemoryStore::new()));
    block_on(world.sync(&world.device, p1(), &[1]));
    let queue = Queue::new(
        world.queue.store().clone(),
        Arc::new(SystemClock),
        Arc::new(SeededIds::new(3)),
        QueueConfig::default(),
    );
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(5))
        .build()
        .expect("catalog");
    let server = McpServer::new(queue, catalog, ServerInfo::new("graph-relay", "test"))
        .with_sleeper(Arc::new(ThreadSleeper));
    let alice = Caller::new(world.agent.clone(), [READ_SCOPE, RUN_SCOPE]);
    let f = Fixture {
        world,
        server,
        alice: alice.clone(),
        other: alice,
    };
    let id = f.ticket("wait-key-04");
    let waited = f.request(
        &f.alice,
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {"command_id": id, "wait_seconds": 1}}),
        false,
    );
    assert_eq!(waited["result"]["structuredContent"]["status"], "queued");
}
