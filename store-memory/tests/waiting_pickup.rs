//! A run queued for a desktop whose held sync waits on this queue is picked
//! up at once, and its ticket says so without reading the device's row; so
//! do the agent's first look and the start's lease right after the hold
//! handed the run out. A run queued for a desktop that waits nowhere here
//! reads the row, and answers the same for a long-polling desktop.

mod common;

use common::{Calls, counted_world};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::executor::block_on;
use futures::future::join;
use graph_relay_core::queue::{QueueConfig, RunTicket};
use graph_relay_core::testkit::{World, exec, held_sync, run_args};
use graph_relay_core::time::{Clock, ThreadSleeper};
use serde_json::json;

/// A world whose store counts its `device` reads.
fn world() -> (World, Arc<Calls>) {
    counted_world("device", QueueConfig::default())
}

fn reads(calls: &Calls) -> usize {
    calls.reads.load(Ordering::SeqCst)
}

/// Session 1 run with `key` while the desktop's held sync waits (for at
/// most 5 s): the ticket, and what the hold answered.
fn run_while_held(w: &World, key: &str) -> RunTicket {
    let until = w.clock.now().plus(Duration::from_secs(5));
    let request = held_sync(1);
    let hold = w.queue.sync_held(
        &w.device,
        &request,
        |h| h.until_at_most(until),
        &ThreadSleeper,
    );
    // `join` polls the hold first: on the memory store its sync completes
    // at once and the hold is waiting when the run is queued.
    let run = w
        .queue
        .run_graph_session(&w.agent, run_args(1, key, json!({ "q": key })));
    let (held, ticket) = block_on(join(hold, run));
    let ticket = ticket.expect("run");
    let handed = held.expect("held sync").commands;
    assert_eq!(
        handed.iter().map(|c| c.id).collect::<Vec<_>>(),
        [ticket.command.id],
        "the waiting hold hands the run out"
    );
    ticket
}

#[test]
fn a_run_for_a_desktop_waiting_here_is_picked_up_at_once_without_a_read() {
    let (w, calls) = world();
    let ticket = run_while_held(&w, "waiting-1");
    assert_eq!(ticket.poll_after_seconds, 1);
    assert_eq!(reads(&calls), 0, "the waiting hold answered the hint");
}

#[test]
fn the_agents_first_look_right_after_the_hold_handed_the_run_out_reads_no_row() {
    let (w, calls) = world();
    let ticket = run_while_held(&w, "waiting-look");
    // The hold ended as the run was queued; the look follows at once.
    let view = block_on(w.queue.get_graph_run(&w.agent, &ticket.command.id)).expect("get");
    assert_eq!(view.poll_after_seconds, Some(1));
    assert_eq!(view.device_offline_since, None);
    assert_eq!(reads(&calls), 0);
}

#[test]
fn the_start_right_after_the_hold_handed_the_run_out_takes_the_long_poll_lease_without_a_read() {
    let (w, calls) = world();
    let ticket = run_while_held(&w, "waiting-start");
    let started = block_on(
        w.queue
            .start(&w.device, &ticket.command.id, &exec("waiting-exec")),
    )
    .expect("start");
    let lease = w.queue.config().lease(true);
    assert_eq!(started.lease_expires_at, Some(w.clock.now().plus(lease)));
    assert_eq!(reads(&calls), 0);
}

#[test]
fn a_run_for_a_desktop_waiting_nowhere_here_reads_its_row() {
    let (w, calls) = world();
    // The desktop long-polled, and its hold ended (handing out the run).
    run_while_held(&w, "waiting-2");
    // Past the moment after its hold (and the queue's own copy of the
    // row): both last `touch_interval`.
    w.advance(2);
    let ticket = block_on(
        w.queue
            .run_graph_session(&w.agent, run_args(1, "waiting-3", json!({}))),
    )
    .expect("run");
    assert_eq!(reads(&calls), 1, "no hold waits: the row is read");
    assert_eq!(
        ticket.poll_after_seconds, 1,
        "the same hint as from a waiting hold"
    );
}
