//! A held control request's renewal is its hold's first look: an idle hold
//! answers it from the queue's current copy of the run (no read at all), or
//! reads the command once when another process changed it, and a change
//! right after that read still wakes it, because the hold subscribed
//! before the renewal. A renewal wakes no one: nothing a waiter answers
//! with changes.

mod common;

use common::{Calls, counted_world};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::executor::block_on;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::queue::QueueConfig;
use graph_relay_core::signals::Topic;
use graph_relay_core::testkit::{World, exec, p1};
use graph_relay_core::time::{Clock, ThreadSleeper};

/// A world over a counted store, with one run started on its desktop.
fn started() -> (World, Arc<Calls>, CommandRecord) {
    let (w, reads) = counted_world("command_for_device", QueueConfig::default());
    block_on(w.sync(&w.device, p1(), &[1]));
    let queued = block_on(w.run(&w.agent, 1, "held-control-1"));
    let running = block_on(
        w.queue
            .start(&w.device, &queued.id, &exec("held-control-exec")),
    )
    .expect("start");
    assert_eq!(running.status, CommandStatus::Running);
    reads.reads.store(0, Ordering::SeqCst);
    (w, reads, running)
}

/// A held control of `id`, cut to `hold`.
fn control_held(w: &World, id: &graph_relay_core::ids::CommandId, hold: Duration) -> Duration {
    let started = Instant::now();
    let until = w.clock.now().plus(hold);
    let answer = block_on(w.queue.control_held(
        &w.device,
        id,
        true,
        |h| h.until_at_most(until),
        &ThreadSleeper,
    ))
    .expect("control");
    assert!(!answer.is_settled());
    started.elapsed()
}

#[test]
fn an_idle_held_control_answers_from_the_queues_current_copy() {
    let (w, reads, running) = started();
    control_held(&w, &running.id, Duration::from_millis(300));
    // The start's write left the queue's copy current: the renewal (not
    // due) had nothing to write and answered from it; the hold started
    // from that answer and looked no more.
    assert_eq!(reads.reads.load(Ordering::SeqCst), 0);
}

#[test]
fn an_idle_held_control_reads_the_command_once_after_another_process_changed_it() {
    let (w, reads, running) = started();
    // Another process's notification of the run: the copy may be old.
    w.queue.signals().notify_local(&Topic::Command(running.id));
    control_held(&w, &running.id, Duration::from_millis(300));
    assert_eq!(reads.reads.load(Ordering::SeqCst), 1);
    // That read made the copy current again.
    control_held(&w, &running.id, Duration::from_millis(300));
    assert_eq!(reads.reads.load(Ordering::SeqCst), 1);
}

#[test]
fn a_change_right_after_the_renewals_read_wakes_its_hold() {
    let (w, reads, running) = started();
    // The renewal reads the command (another process changed it) ...
    w.queue.signals().notify_local(&Topic::Command(running.id));
    // ... and right after that read the run changes again.
    *reads.after_first.lock().expect("lock") =
        Some((w.queue.signals().clone(), Topic::Command(running.id)));
    let held = control_held(&w, &running.id, Duration::from_secs(20));
    // Answered at the notification, long before its 20 s, after one more look.
    assert!(held < Duration::from_secs(10), "{held:?}");
    assert_eq!(reads.reads.load(Ordering::SeqCst), 2);
}

#[test]
fn a_renewal_wakes_no_one_and_its_held_control_looks_once() {
    let (w, reads, running) = started();
    let mut waiter = w.queue.signals().subscribe(Topic::Command(running.id));
    // Past half the lease: the control renews it.
    let lease = running
        .lease_expires_at
        .expect("a lease")
        .since(w.clock.now());
    w.advance(lease.as_secs() / 2 + 1);
    control_held(&w, &running.id, Duration::from_millis(300));
    let renewed = block_on(w.queue.get_graph_run(&w.agent, &running.id)).expect("read");
    assert!(renewed.command.lease_expires_at > running.lease_expires_at);
    assert!(
        (&mut waiter).now_or_never().is_none(),
        "the renewal woke a waiter"
    );
    // The renewal wrote from the queue's copy: no read at all, and its
    // hold did not look again.
    assert_eq!(reads.reads.load(Ordering::SeqCst), 0);
}
