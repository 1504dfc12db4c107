//! The conformance scenario of quiet desktops: an idle long-polling
//! desktop's held syncs read what is queued once, then answer from memory
//! until work may have come for it, and so do the held syncs after it took
//! and started the runs a look found. A run queued here, a notification
//! from another process and every waiter woken (a forwarder that delivers
//! again, a shared file's marker that moved) each send the next look to
//! the store.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::json;

use super::{Advancing, StoreCalls, World, completed, exec, held_sync, p1};
use crate::command::CommandRecord;
use crate::ids::CommandId;
use crate::queue::QueueConfig;
use crate::signals::Topic;
use crate::store::{LayeredStore, Store};
use crate::time::Sleeper;

/// A sleeper whose sleep never ends: a hold on it ends only when woken.
struct Waits;

impl Sleeper for Waits {
    fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

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

    // A run queued here: the next held sync hands it out at once, from
    // this queue's copy of it.
    let queued = a.run(&a.agent, 1, "quiet-run-1").await;
    let (commands, made) = sync().await;
    assert_eq!(ids(&commands), [queued.id]);
    assert_eq!(commands[0], queued, "the run as it was queued");
    idle(made, "a held sync after a run was queued here");
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
    idle(made, "a held sync after a second run was queued here");
    a.queue
        .cancel_graph_run(&a.agent, &cancelled.id)
        .await
        .expect("cancel");
    let (commands, made) = sync().await;
    assert!(commands.is_empty());
    assert!(made >= 1, "the look after a run cancelled while queued");
    let (_, made) = sync().await;
    idle(made, "quiet again");

    // A held sync waiting when a run is queued here: woken, it hands the
    // run out from this queue's copy. Two runs queued: their order is the
    // store's to tell.
    let waiting = a.queue.sync_held(&a.device, &held, |hold| hold, &Waits);
    let before = reads.count();
    let (answer, woke) = futures::join!(waiting, async { a.run(&a.agent, 1, "quiet-run-3").await });
    let answer = answer.expect("held sync");
    assert_eq!(ids(&answer.commands), [woke.id]);
    idle(reads.count() - before, "the held sync a run woke");
    let (commands, made) = sync().await;
    assert_eq!(ids(&commands), [woke.id], "still queued: handed out again");
    idle(made, "the one run still to take");
    let second = a.run(&a.agent, 1, "quiet-run-4").await;
    let (commands, made) = sync().await;
    assert_eq!(ids(&commands), [woke.id, second.id]);
    assert_eq!(made, 1, "two runs to take: the store tells their order");
    for (n, run) in [woke.id, second.id].iter().enumerate() {
        let exec_id = exec(&format!("quiet-e{}", n + 3));
        a.queue
            .start(&a.device, run, &exec_id)
            .await
            .expect("start");
        a.queue
            .complete(&a.device, run, &completed(exec_id.as_str(), json!({})))
            .await
            .expect("complete");
    }
    let (commands, made) = sync().await;
    assert!(commands.is_empty());
    idle(made, "both runs started here");

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
