//! Another process writing to the same SQLite file: the store's
//! external-write marker (`PRAGMA data_version` of its writer) moves for
//! that write and never for the store's own, and `Queue::maintain` then
//! wakes the requests this process holds, which otherwise wait on
//! notifications alone (no periodic re-read per held request), and whose
//! first look answers from memory when the desktop's last look found
//! nothing and no notification came since. A finished
//! run this process read is not read again, and never served once the
//! other process pruned it.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::queue::{FED_RECHECK, GetError, QueueConfig};
use graph_relay_core::store::{ExternalWrites, LayeredStore, Store};
use graph_relay_core::testkit::{Advancing, StoreCalls, World, completed, exec, held_sync, p1};
use graph_relay_core::time::ThreadSleeper;
use graph_relay_store_sqlite::SqliteStore;

/// Two stores on one file, as two processes would open it.
fn two_stores() -> (tempfile::TempDir, Arc<SqliteStore>, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shared.sqlite");
    let a = Arc::new(SqliteStore::open(&path).expect("open a"));
    let b = Arc::new(SqliteStore::open(&path).expect("open b"));
    (dir, a, b)
}

#[test]
fn the_marker_moves_for_another_connections_write_only() {
    let (_dir, a, b) = two_stores();
    assert_eq!(a.external_writes(), ExternalWrites::Marker);
    let wa = World::new(a.clone());
    let wb = World::new(b.clone());
    let first = block_on(a.external_write_marker()).expect("marker");
    // Its own writes: a share, and another share after time passed.
    block_on(wa.sync(&wa.device, p1(), &[1]));
    wa.advance(5);
    block_on(wa.sync(&wa.device, p1(), &[1, 2]));
    assert_eq!(block_on(a.external_write_marker()).expect("marker"), first);
    // A write by the other store.
    block_on(wb.run(&wb.agent, 1, "their-run-key"));
    let moved = block_on(a.external_write_marker()).expect("marker");
    assert_ne!(moved, first);
    assert_eq!(block_on(a.external_write_marker()).expect("marker"), moved);
}

#[test]
fn maintain_wakes_a_held_sync_when_another_process_queued_work() {
    let (_dir, a, b) = two_stores();
    let wa = World::new(a);
    let wb = World::new(b);
    block_on(wa.sync(&wa.device, p1(), &[1]));
    assert!(wa.queue.external_writes_fed());
    // The hold waits on notifications alone.
    assert_eq!(wa.queue.sync_hold(&wa.device).recheck, FED_RECHECK);
    // The first maintenance only records the marker.
    assert_eq!(block_on(wa.queue.maintain()).expect("maintain").woken, 0);

    let (tx, rx) = mpsc::channel();
    let queue = wa.queue.clone();
    let device = wa.device.clone();
    let held = std::thread::spawn(move || {
        let answer = block_on(queue.sync_held(&device, &held_sync(1), |h| h, &ThreadSleeper));
        let _ = tx.send(answer.map(|r| r.commands.len()));
    });
    while wa.queue.signals().waiting() == 0 {
        std::thread::sleep(Duration::from_millis(2));
    }
    // Nothing of this process wakes it: the other store queues the run.
    let queued = block_on(wb.run(&wb.agent, 1, "from-elsewhere"));
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the held sync answered before maintenance looked"
    );
    let report = block_on(wa.queue.maintain()).expect("maintain");
    assert_eq!(report.woken, 1);
    // Woken, it looks and answers with the run (a hold left alone would
    // wait out its 25 s bound: a generous limit still tells them apart).
    let answer = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the held sync answered after maintenance");
    assert_eq!(answer.expect("sync"), 1, "hands out {}", queued.id);
    held.join().expect("thread");
    // Nothing new since: the next maintenance wakes nobody.
    assert_eq!(block_on(wa.queue.maintain()).expect("maintain").woken, 0);
}

#[test]
fn a_finished_run_is_read_once_and_never_served_after_another_process_pruned_it() {
    let (_dir, a, b) = two_stores();
    // Both processes keep keys for a minute and finished runs for ten.
    let config = QueueConfig {
        idempotency_ttl: Duration::from_secs(60),
        terminal_retention: Some(Duration::from_secs(600)),
        ..QueueConfig::default()
    };
    let wa = World::with_config(a.clone(), config.clone());
    let wb = World::with_config(b, config);
    let statements = |step: &dyn Fn()| {
        let before = a.statements_executed();
        step();
        a.statements_executed() - before
    };
    block_on(wa.sync(&wa.device, p1(), &[1]));
    let run = block_on(wa.run(&wa.agent, 1, "finished-elsewhere"));
    block_on(wa.queue.start(&wa.device, &run.id, &exec("e1"))).expect("start");

    // The other process records the result: this one reads it from the
    // file once, then from memory.
    let result = completed("e1", serde_json::json!({"done": true}));
    block_on(wb.queue.complete(&wb.device, &run.id, &result)).expect("complete");
    let read = || {
        let view = block_on(wa.queue.get_graph_run(&wa.agent, &run.id)).expect("get");
        assert_eq!(view.command.status, CommandStatus::Completed);
        assert_eq!(view.command.completion.as_ref(), Some(&result));
    };
    assert_eq!(statements(&read), 1, "the first read after the result");
    assert_eq!(statements(&read), 0, "the next read: no statement, no lock");

    // Ten minutes later the other process prunes it: this one's next read
    // asks the file, which has nothing.
    wa.advance(600);
    wb.advance(600);
    assert_eq!(block_on(wb.queue.prune()).expect("prune").commands, 1);
    let gone = || {
        assert!(matches!(
            block_on(wa.queue.get_graph_run(&wa.agent, &run.id)),
            Err(GetError::NotFound)
        ));
    };
    assert_eq!(statements(&gone), 1, "a pruned run is read from the file");
}

#[test]
fn an_idle_held_sync_answers_from_memory_until_maintenance_sees_another_process_queue_work() {
    let (_dir, a, b) = two_stores();
    let counted = Arc::new(LayeredStore::new(
        a as Arc<dyn Store>,
        StoreCalls::of("queued_commands"),
    ));
    let wa = World::new(counted.clone());
    let wb = World::new(b);
    let reads = || counted.layer().count();
    let sleeper = Advancing(wa.clock.clone());
    let request = held_sync(1);
    let held = || {
        let before = reads();
        let answer = block_on(wa.queue.sync_held(&wa.device, &request, |h| h, &sleeper));
        (answer.expect("held sync").commands.len(), reads() - before)
    };
    // The first maintenance only records the marker.
    assert_eq!(block_on(wa.queue.maintain()).expect("maintain").woken, 0);
    assert_eq!(held(), (0, 1), "the first held sync reads the file");
    assert_eq!(held(), (0, 0), "the next one answers from memory");

    // The other process queues a run: until this one's maintenance sees
    // the marker move, nothing tells it (its hold would not wake either).
    block_on(wb.run(&wb.agent, 1, "from-elsewhere"));
    assert_eq!(held(), (0, 0), "before maintenance");
    block_on(wa.queue.maintain()).expect("maintain");
    assert_eq!(held(), (1, 1), "after maintenance: the file, and the run");
}
