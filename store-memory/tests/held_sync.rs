//! A held sync's own read of what is queued is its hold's first look: an
//! idle hold reads the queue once, and work queued right after that read
//! still wakes it, because the hold subscribed before the sync read. Work
//! this queue queued is handed out from its copy, without a read.

mod common;

use common::{Calls, counted_world};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use graph_relay_core::queue::QueueConfig;
use graph_relay_core::signals::Topic;
use graph_relay_core::testkit::{World, held_sync, p1};
use graph_relay_core::time::ThreadSleeper;

/// A world whose queue holds syncs for `hold`, exactly, over a counted store.
fn world(hold: Duration) -> (World, Arc<Calls>) {
    let config = QueueConfig {
        long_poll_hold: hold,
        long_poll_jitter: Duration::ZERO,
        ..QueueConfig::default()
    };
    counted_world("queued_commands", config)
}

#[test]
fn an_idle_held_sync_reads_the_queue_once() {
    let (w, reads) = world(Duration::from_millis(300));
    let answer = block_on(
        w.queue
            .sync_held(&w.device, &held_sync(1), |hold| hold, &ThreadSleeper),
    )
    .expect("sync");
    assert!(answer.commands.is_empty());
    assert_eq!(reads.reads.load(Ordering::SeqCst), 1);
}

#[test]
fn work_queued_right_after_the_syncs_read_wakes_its_hold() {
    let (w, reads) = world(Duration::from_secs(20));
    let topic = Topic::DeviceWork(w.device.owner.clone(), w.device.id.clone());
    *reads.after_first.lock().expect("lock") = Some((w.queue.signals().clone(), topic));
    let started = Instant::now();
    let answer = block_on(
        w.queue
            .sync_held(&w.device, &held_sync(1), |hold| hold, &ThreadSleeper),
    )
    .expect("sync");
    // The notification answered the hold (with what the look after it
    // saw), long before its 20 s.
    assert!(answer.commands.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reads.reads.load(Ordering::SeqCst), 2);
}

#[test]
fn a_held_sync_that_finds_work_answers_at_once_with_one_read_at_most() {
    let (w, reads) = world(Duration::from_secs(20));
    block_on(w.sync(&w.device, p1(), &[1]));
    let held = |w: &World| {
        let started = Instant::now();
        let answer =
            block_on(
                w.queue
                    .sync_held(&w.device, &held_sync(1), |hold| hold, &ThreadSleeper),
            )
            .expect("sync");
        assert!(started.elapsed() < Duration::from_secs(10));
        answer.commands.iter().map(|c| c.id).collect::<Vec<_>>()
    };
    // Queued here, after a look that found nothing: this queue's copy.
    let queued = block_on(w.run(&w.agent, 1, "held-sync-1"));
    let before = reads.reads.load(Ordering::SeqCst);
    assert_eq!(held(&w), vec![queued.id]);
    assert_eq!(reads.reads.load(Ordering::SeqCst) - before, 0);
    // Work another process notified: one read.
    let topic = Topic::DeviceWork(w.device.owner.clone(), w.device.id.clone());
    w.queue.signals().notify_local(&topic);
    let before = reads.reads.load(Ordering::SeqCst);
    assert_eq!(held(&w), vec![queued.id]);
    assert_eq!(reads.reads.load(Ordering::SeqCst) - before, 1);
}
