//! The conformance scenario of quiet desktops: an idle long-polling
//! desktop's held syncs read what is queued once, then answer from memory
//! until work may have come for it, and so do the held syncs after it took
//! and started the runs a look found. A run queued here, a notification
//! from another process and every waiter woken (a forwarder that delivers
//! again, a shared file's marker that moved) each send the next look to
//! the store.

use std::sync::Arc;

use serde_json::json;

use super::{Advancing, StoreCalls, World, completed, exec, held_sync, p1};
use crate::command::CommandRecord;
use crate::ids::CommandId;
use crate::queue::QueueConfig;
use crate::signals::Topic;
use crate::store::{LayeredStore, Store};

fn ids(commands: &[CommandRecord]) -> Vec<CommandId> {
    commands.iter().map(|c| c.id).collect()
}

/// See the module docs. Where other processes' writes reach the queue only
/// by reading the store ([`Queue::external_writes_fed`](crate::queue::Queue::external_writes_fed) is false), every
/// held sync reads it.
pub async fn quiet_desktops(store: Arc<dyn Store>) {
    let counted = Arc::new(LayeredStore::new(store, StoreCalls::of("queued_commands")));
    let a = World::with_config(counted.clone(), QueueConfig::default());
    let reads = counted.layer();
    let fed = a.queue.external_writes_fed();
    let sleeper = Advancing(a.clock.clone());
    let held = held_sync(1);
    // A held sync of the desktop: what it answered, and the store's reads
    // of what is queued meanwhile.
    let sync = || async {
        let before = reads.count();
        let answer = a
            .queue
            .sync_held(&a.device, &held, |hold| hold, &sleeper)
            .await
            .expect("held sync");
        (answer.commands, reads.count() - before)
    };
    let idle = |made: u64, which: &str| {
        if fed {
            assert_eq!(made, 0, "{which}: from memory");
        } else {
            assert!(made >= 1, "{which}: from the store");
        }
    };

    let (commands, made) = sync().await;
    assert!(commands.is_empty());
    assert!(made >= 1, "the first held sync reads the store");
    for _ in 0..3 {
        let (commands, made) = sync().await;
        assert!(commands.is_empty());
        idle(made, "an idle desktop's next held sync");
    }

    // A run queued here: the next held sync reads it at once.
    let queued = a.run(&a.agent, 1, "quiet-run-1").await;
    let (commands, made) = sync().await;
    assert_eq!(ids(&commands), [queued.id]);
    assert_eq!(made, 1, "a held sync after a run was queued");
    a.queue
        .start(&a.device, &queued.id, &exec("quiet-e1"))
        .await
        .expect("start");
    a.queue
        .complete(&a.device, &queued.id, &completed("quiet-e1", json!({})))
        .await
        .expect("complete");
    // The look found that run, and this queue started it since: nothing
    // is queued.
    let (commands, made) = sync().await;
    assert!(commands.is_empty());
    idle(made, "the look after a run this queue started");

    // A run that ended otherwise (cancelled while queued) leaves the next
    // look to the store.
    let cancelled = a.run(&a.agent, 1, "quiet-run-2").await;
    let (commands, made) = sync().await;
    assert_eq!(ids(&commands), [cancelled.id]);
    assert_eq!(made, 1, "a held sync after a second run was queued");
    a.queue
        .cancel_graph_run(&a.agent, &cancelled.id)
        .await
        .expect("cancel");
    let (commands, made) = sync().await;
    assert!(commands.is_empty());
    assert!(made >= 1, "the look after a run cancelled while queued");
    let (_, made) = sync().await;
    idle(made, "quiet again");

    // Work for another desktop leaves this one quiet; work for this one
    // notified by another process, or every waiter woken (a forwarder that
    // delivers again, a shared file's marker that moved), does not.
    let signals = a.queue.signals();
    let other = Topic::DeviceWork(a.other_device.owner.clone(), a.other_device.id.clone());
    signals.notify_local(&other);
    let (_, made) = sync().await;
    idle(made, "after another desktop's work");
    let own = Topic::DeviceWork(a.device.owner.clone(), a.device.id.clone());
    signals.notify_local(&own);
    let (_, made) = sync().await;
    assert!(made >= 1, "after a notification of its work");
    let (_, made) = sync().await;
    idle(made, "quiet again");
    signals.wake_all();
    let (_, made) = sync().await;
    assert!(made >= 1, "after every waiter was woken");

    // A sync that is not held always reads the store.
    let before = reads.count();
    a.sync(&a.device, p1(), &[1]).await;
    assert_eq!(reads.count() - before, 1, "an unheld sync");
}
