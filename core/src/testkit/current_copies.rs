//! The conformance scenario of the queue's current copies of open runs: a
//! run this queue queued and started is looked at by its agent's wait and
//! renewed by its desktop's control request without reading the store,
//! while every other process's write reaches the queue as a notification.
//! A notification of the run from another process, or every waiter woken
//! (a forwarder that delivers again, a shared file's marker that moved),
//! sends the next look to the store, which then shows what the other
//! process wrote.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{Advancing, StoreCalls, World, completed, exec, p1};
use crate::command::CommandStatus;
use crate::ids::CommandId;
use crate::queue::{ControlAnswer, Queue, QueueConfig, RunView};
use crate::signals::Topic;
use crate::store::{LayeredStore, Store};
use crate::time::SeededIds;

/// The queue under test, its counts of the agent's and the desktop's reads
/// of a command, and another process on the same store.
struct Copies {
    a: World,
    agent_reads: Arc<LayeredStore<StoreCalls>>,
    device_reads: Arc<LayeredStore<StoreCalls>>,
    other: Queue,
    fed: bool,
}

impl Copies {
    fn reads(&self) -> u64 {
        self.agent_reads.layer().count() + self.device_reads.layer().count()
    }

    /// A wait of the agent on `id` (one second, on the manual clock), and
    /// the reads it made.
    async fn wait(&self, id: &CommandId) -> (RunView, u64) {
        let before = self.reads();
        let view = self
            .a
            .queue
            .wait_graph_run(
                &self.a.agent,
                id,
                Duration::from_secs(1),
                &Advancing(self.a.clock.clone()),
            )
            .await
            .expect("wait");
        (view, self.reads() - before)
    }

    /// A control request of the desktop for `id`, and the reads it made.
    async fn control(&self, id: &CommandId) -> (ControlAnswer, u64) {
        let before = self.reads();
        let answer = self
            .a
            .queue
            .control(&self.a.device, id)
            .await
            .expect("control");
        (answer, self.reads() - before)
    }

    /// A look that may answer from the queue's copy: none where it is
    /// current, else at least one.
    fn answered_by_copy(&self, made: u64, which: &str) {
        if self.fed {
            assert_eq!(made, 0, "{which}: from the current copy");
        } else {
            assert!(made >= 1, "{which}: from the store");
        }
    }
}

/// See the module docs. Where other processes' writes reach the queue only
/// by reading the store ([`Queue::external_writes_fed`] is false), every
/// look reads it.
pub async fn current_copies(store: Arc<dyn Store>) {
    let agent_reads = Arc::new(LayeredStore::new(
        store.clone(),
        StoreCalls::of("command_for_agent"),
    ));
    let device_reads = Arc::new(LayeredStore::new(
        agent_reads.clone() as Arc<dyn Store>,
        StoreCalls::of("command_for_device"),
    ));
    let a = World::with_config(device_reads.clone(), QueueConfig::default());
    let other = Queue::new(
        store,
        a.clock.clone(),
        Arc::new(SeededIds::new(3)),
        QueueConfig::default(),
    );
    let fed = a.queue.external_writes_fed();
    let t = Copies {
        a,
        agent_reads,
        device_reads,
        other,
        fed,
    };
    let a = &t.a;
    a.sync(&a.device, p1(), &[1]).await;

    // Queued and started here: the copy this queue wrote answers.
    let run = a.run(&a.agent, 1, "copies-1").await;
    let (view, made) = t.wait(&run.id).await;
    assert_eq!(view.command.status, CommandStatus::Queued);
    t.answered_by_copy(made, "the wait on a run queued here");
    a.queue
        .start(&a.device, &run.id, &exec("copies-e1"))
        .await
        .expect("start");
    let (answer, made) = t.control(&run.id).await;
    assert_eq!(answer.status, CommandStatus::Running);
    assert!(!answer.cancel_requested);
    t.answered_by_copy(made, "a renewal with nothing to write");
    let (view, made) = t.wait(&run.id).await;
    assert_eq!(view.command.status, CommandStatus::Running);
    t.answered_by_copy(made, "the wait on a run started here");

    // Another process asks to cancel, and its notification arrives: the
    // next looks read the store and see the request.
    t.other
        .cancel_graph_run(&a.agent, &run.id)
        .await
        .expect("cancel elsewhere");
    a.queue.signals().notify_local(&Topic::Command(run.id));
    let (answer, made) = t.control(&run.id).await;
    assert!(answer.cancel_requested, "the cancel written elsewhere");
    assert!(made >= 1, "a control after another process's change");
    // That read made the copy current again.
    let (view, made) = t.wait(&run.id).await;
    assert!(view.command.cancel_requested);
    t.answered_by_copy(made, "the wait after the copy was read again");
    let (answer, made) = t.control(&run.id).await;
    assert!(answer.cancel_requested);
    t.answered_by_copy(made, "a renewal after the copy was read again");

    // Another process records the result, and every waiter is woken (as
    // a shared file's marker that moved does): the wait sees the end.
    let result = completed("copies-e1", json!({"n": 1}));
    let ended = t
        .other
        .complete(&a.device, &run.id, &result)
        .await
        .expect("complete elsewhere");
    assert!(ended.record().status.is_terminal());
    a.queue.signals().wake_all();
    let (view, made) = t.wait(&run.id).await;
    assert_eq!(view.command.status, ended.record().status);
    assert_eq!(view.command.revision, ended.record().revision);
    assert!(made >= 1, "the wait after every waiter was woken");

    // A read that is not a wait always asks the store about an open run.
    let second = a.run(&a.agent, 1, "copies-2").await;
    let before = t.reads();
    let view = a
        .queue
        .get_graph_run(&a.agent, &second.id)
        .await
        .expect("get");
    assert_eq!(view.command.status, CommandStatus::Queued);
    assert_eq!(t.reads() - before, 1, "a plain read of an open run");
}
