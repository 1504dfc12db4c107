//! The conformance scenario of the queue's cache of finished runs: a
//! finished run is read from the store once, and the cache is never
//! believed over the store about a run another queue changed or pruned.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{StoreCalls, World, completed, exec, p1};
use crate::command::CommandStatus;
use crate::ids::CommandId;
use crate::principal::Agent;
use crate::queue::{ControlError, GetError, Queue, QueueConfig, RunView};
use crate::store::{LayeredStore, Store};
use crate::time::SeededIds;

/// The longest a queue serves a finished run without the store, after it
/// finished, whatever its retention: the bound that makes the cache safe
/// next to a pruner keeping finished runs for as little as an hour.
const HORIZON: Duration = Duration::from_secs(3600);

/// `agent`'s read of run `id` through `queue`, and how many calls reached
/// the store meanwhile.
async fn read(
    queue: &Queue,
    calls: &StoreCalls,
    agent: &Agent,
    id: &CommandId,
) -> (Result<RunView, GetError>, u64) {
    let before = calls.count();
    let answer = queue.get_graph_run(agent, id).await;
    (answer, calls.count() - before)
}

/// A finished run is read from the store at most once by its agent's
/// queue, while another queue on the same store (another server, another
/// process on the same file) completes and prunes runs.
pub async fn finished_runs(store: Arc<dyn Store>) {
    // Keys expire long before any run may be pruned (a live key keeps its
    // run). This queue keeps finished runs forever; the other one prunes
    // them after an hour.
    let ttl = Duration::from_secs(60);
    let counted = Arc::new(LayeredStore::new(store.clone(), StoreCalls::all()));
    let a = World::with_config(
        counted.clone(),
        QueueConfig {
            idempotency_ttl: ttl,
            terminal_retention: None,
            ..QueueConfig::default()
        },
    );
    let b = Queue::new(
        store,
        a.clock.clone(),
        Arc::new(SeededIds::new(2)),
        QueueConfig {
            idempotency_ttl: ttl,
            terminal_retention: Some(HORIZON),
            ..QueueConfig::default()
        },
    );
    let calls = counted.layer();
    a.sync(&a.device, p1(), &[1]).await;

    // Finished through this queue: every read is answered without the store.
    let here = a.run(&a.agent, 1, "finished-here").await;
    a.queue
        .start(&a.device, &here.id, &exec("e1"))
        .await
        .expect("start");
    let result = completed("e1", json!({"n": 1}));
    a.queue
        .complete(&a.device, &here.id, &result)
        .await
        .expect("complete");
    for which in ["the first read", "the second read"] {
        let (view, made) = read(&a.queue, calls, &a.agent, &here.id).await;
        let view = view.expect("get");
        assert_eq!(view.command.completion.as_ref(), Some(&result));
        assert_eq!(view.poll_after_seconds, None);
        assert_eq!(made, 0, "store calls of {which}");
    }

    // The desktop it ran on looks at it too (a held control request that
    // the run's end woke): answered without the store. Its owner's other
    // desktop, and the same desktop name under another owner, are told
    // "not found" by the store.
    let before = calls.count();
    let control = a.queue.peek_control(&a.device, &here.id).await;
    assert_eq!(
        control.expect("peek").status,
        CommandStatus::Completed,
        "the desktop's look"
    );
    assert_eq!(calls.count() - before, 0, "its store calls");
    for other in [&a.other_device, &a.twin_device] {
        let before = calls.count();
        let answer = a.queue.peek_control(other, &here.id).await;
        assert!(matches!(answer, Err(ControlError::NotFound)), "{answer:?}");
        assert_eq!(calls.count() - before, 1, "another desktop's look");
    }

    // Only its own agent is answered from the cache: the same agent name
    // under another owner, another agent of the owner and a stranger are
    // told "not found" by the store, as for a run that does not exist.
    for other in [&a.twin, &a.other_agent, &a.stranger] {
        let (answer, made) = read(&a.queue, calls, other, &here.id).await;
        assert!(matches!(answer, Err(GetError::NotFound)), "{answer:?}");
        assert_eq!(made, 1, "another party's read");
    }

    // Running as this queue last saw it; completed by the other queue: the
    // next read is the finished run, from the store, and the one after it
    // comes from the cache.
    let there = a.run(&a.agent, 1, "finished-there").await;
    a.queue
        .start(&a.device, &there.id, &exec("e2"))
        .await
        .expect("start");
    let (running, _) = read(&a.queue, calls, &a.agent, &there.id).await;
    assert_eq!(running.expect("get").command.status, CommandStatus::Running);
    let elsewhere = completed("e2", json!({"n": 2}));
    b.complete(&a.device, &there.id, &elsewhere)
        .await
        .expect("complete through the other queue");
    let (view, made) = read(&a.queue, calls, &a.agent, &there.id).await;
    let view = view.expect("get");
    assert_eq!(view.command.status, CommandStatus::Completed);
    assert_eq!(view.command.completion.as_ref(), Some(&elsewhere));
    assert_eq!(made, 1, "the first read after another queue finished it");
    let (again, made) = read(&a.queue, calls, &a.agent, &there.id).await;
    assert_eq!(again.expect("get").command, view.command);
    assert_eq!(made, 0, "the next read");

    // The same, looked at first by the desktop it ran on (a held control
    // request woken by the other queue's write): the store once, then the
    // cache, for the desktop and for the agent.
    let seen = a.run(&a.agent, 1, "finished-there-seen-by-desktop").await;
    a.queue
        .start(&a.device, &seen.id, &exec("e3"))
        .await
        .expect("start");
    b.complete(&a.device, &seen.id, &completed("e3", json!({"n": 3})))
        .await
        .expect("complete through the other queue");
    for (which, expected) in [("first", 1), ("second", 0)] {
        let before = calls.count();
        let control = a.queue.peek_control(&a.device, &seen.id).await;
        assert_eq!(control.expect("peek").status, CommandStatus::Completed);
        let made = calls.count() - before;
        assert_eq!(made, expected, "the desktop's {which} look");
    }
    let (view, made) = read(&a.queue, calls, &a.agent, &seen.id).await;
    assert_eq!(view.expect("get").command.status, CommandStatus::Completed);
    assert_eq!(made, 0, "the agent's read after the desktop's look");

    // The other queue prunes them an hour after they finished. Until then
    // the cache answers; from then on only the store does, and it has
    // nothing.
    a.clock.advance(HORIZON - Duration::from_millis(1));
    let pruned = b.prune().await.expect("prune");
    assert_eq!(pruned.commands, 0, "not yet past retention");
    for id in [here.id, there.id, seen.id] {
        let (view, made) = read(&a.queue, calls, &a.agent, &id).await;
        assert!(view.expect("get").command.status.is_terminal());
        assert_eq!(made, 0, "a read just before the runs may be pruned");
    }
    a.clock.advance(Duration::from_millis(1));
    let pruned = b.prune().await.expect("prune");
    assert_eq!(pruned.commands, 3, "every run pruned");
    for id in [here.id, there.id, seen.id] {
        let (answer, made) = read(&a.queue, calls, &a.agent, &id).await;
        assert!(
            matches!(answer, Err(GetError::NotFound)),
            "a pruned run is never served: {answer:?}"
        );
        assert_eq!(made, 1, "a read of a pruned run");
        let before = calls.count();
        let control = a.queue.peek_control(&a.device, &id).await;
        assert!(
            matches!(control, Err(ControlError::NotFound)),
            "{control:?}"
        );
        assert_eq!(calls.count() - before, 1, "a look at a pruned run");
    }
}
