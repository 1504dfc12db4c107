//! What a lifecycle costs in SQL statements ([`SqliteStore::statements_executed`]):
//! a change that adds a statement to a hot path fails here.

use std::sync::Arc;

use futures::executor::block_on;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::IdempotencyKey;
use graph_relay_core::testkit::workload::{desks, lifecycle};
use graph_relay_core::testkit::{World, completed, exec};
use graph_relay_store_sqlite::SqliteStore;
use serde_json::json;

/// A world over a fresh store, with one desk that has synced and run one
/// lifecycle (its first `start` writes the device's contact; later ones
/// within the touch interval do not).
fn setup(
    dir: &tempfile::TempDir,
) -> (
    Arc<SqliteStore>,
    World,
    graph_relay_core::testkit::workload::Desk,
) {
    let store = Arc::new(SqliteStore::open(dir.path().join("statements.sqlite")).expect("open"));
    let w = World::new(store.clone());
    let desk = block_on(desks(&w, 1)).remove(0);
    block_on(lifecycle(&w, &desk, 0));
    (store, w, desk)
}

#[test]
fn each_step_of_a_lifecycle_executes_exactly_its_statements() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, w, desk) = setup(&dir);
    let mut last = store.statements_executed();
    let mut step = |name: &str, expected: u64| {
        let now = store.statements_executed();
        assert_eq!(now - last, expected, "statements of {name}");
        last = now;
    };
    let args = graph_relay_core::args::RunArgs {
        graph_session_id: desk.sync.sessions[0].graph_session_id.clone(),
        arguments: serde_json::Map::new(),
        idempotency_key: IdempotencyKey::parse("statements-key-1").expect("key"),
    };
    let ticket = block_on(w.queue.run_graph_session(&w.agent, args)).expect("run");
    // The session look-up; BEGIN, the command with its key, COMMIT. The device's
    // liveness for the ticket's hint was read by the last lifecycle, less
    // than the touch interval ago: the queue's copy serves.
    step("run_graph_session", 4);
    let id = ticket.command.id;
    let synced = block_on(w.queue.sync(&desk.device, &desk.sync)).expect("sync");
    assert_eq!(synced.commands.len(), 1);
    // The queued commands (the sessions were written by the last sync).
    step("sync", 1);
    block_on(w.queue.start(&desk.device, &id, &exec("statements-exec"))).expect("start");
    // BEGIN, UPDATE, COMMIT. Neither the device's liveness (for the lease)
    // nor the command is read: the queue's copies serve, the command's
    // being the one the sync handed out.
    step("start", 3);
    block_on(w.queue.complete(
        &desk.device,
        &id,
        &completed("statements-exec", json!({"ok": true})),
    ))
    .expect("complete");
    // BEGIN, UPDATE, COMMIT (from the copy `start` wrote).
    step("complete", 3);
    let view = block_on(w.queue.get_graph_run(&w.agent, &id)).expect("get");
    assert_eq!(view.command.status, CommandStatus::Completed);
    // None: the queue keeps the finished run it just wrote.
    step("get_graph_run", 0);
    let again = block_on(w.queue.get_graph_run(&w.agent, &id)).expect("get");
    assert_eq!(again.command, view.command);
    step("get_graph_run again", 0);
}

#[test]
fn a_lifecycle_one_at_a_time_executes_eleven_statements_or_seventeen_after_a_quiet_spell() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, w, desk) = setup(&dir);
    for n in 1..=5 {
        let before = store.statements_executed();
        block_on(lifecycle(&w, &desk, n));
        assert_eq!(store.statements_executed() - before, 11, "lifecycle {n}");
    }
    // A desk that ran nothing for longer than the touch interval: the run
    // reads the device's liveness again (5); the sync, in one transaction,
    // compares the shared sessions with the stored ones, finds them the
    // same (so the project bound needs no look) and moves their stamps,
    // and records the contact (BEGIN, SELECT, UPDATE, UPSERT, COMMIT),
    // then reads the queue (6); `start` writes the command (3: the sync's contact counts
    // as this interval's touch, and the lease comes from the copy of the
    // liveness the sync just updated), then `complete` (3); the read of the
    // finished run is answered by the queue's copy. Before the queue kept
    // copies this was 28; before a repeated sync only moved stamps, 24;
    // before a command's row held its idempotency key, 19; before the
    // project bound was checked in the sync's transaction, 18.
    w.advance(2);
    let before = store.statements_executed();
    block_on(lifecycle(&w, &desk, 6));
    assert_eq!(
        store.statements_executed() - before,
        17,
        "after a quiet spell"
    );
}

#[test]
fn a_long_polling_pass_writes_its_sync_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, w, desk) = setup(&dir);
    // The held sync records long-poll; a quiet spell follows.
    let held = graph_relay_core::queue::SyncRequest {
        long_poll: true,
        ..desk.sync.clone()
    };
    block_on(w.queue.sync(&desk.device, &held)).expect("held sync");
    w.advance(30);
    // A pass: the unheld sync of every project, then the held one.
    let unheld = graph_relay_core::queue::SyncRequest {
        long_poll: false,
        ..desk.sync.clone()
    };
    let before = store.statements_executed();
    block_on(w.queue.sync(&desk.device, &unheld)).expect("unheld sync");
    // The recorded mode (which the unheld sync keeps), BEGIN, SELECT,
    // UPDATE, UPSERT, COMMIT, and the queued commands: the project it
    // already shares into needs no bound check.
    assert_eq!(store.statements_executed() - before, 7, "unheld sync");
    let before = store.statements_executed();
    block_on(w.queue.sync(&desk.device, &held)).expect("held sync");
    // The same sessions and mode, written a moment ago: only the queued
    // commands are read.
    assert_eq!(store.statements_executed() - before, 1, "held sync");
    let device = block_on(w.queue.store().device(&desk.device.owner, &desk.device.id));
    assert!(device.expect("device").expect("known").long_poll);
}

#[test]
fn concurrent_writes_share_their_begin_and_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path().join("statements.sqlite")).expect("open"));
    let w = World::new(store.clone());
    let many = block_on(desks(&w, 64));
    // Warm up: every desk's first start writes its contact.
    block_on(futures::future::join_all(
        many.iter()
            .enumerate()
            .map(|(k, d)| lifecycle(&w, d, k as u64)),
    ));
    let before = store.statements_executed();
    block_on(futures::future::join_all(
        many.iter()
            .enumerate()
            .map(|(k, d)| lifecycle(&w, d, 1000 + k as u64)),
    ));
    let per_lifecycle = (store.statements_executed() - before) as f64 / 64.0;
    // 5 statements of the calls themselves, plus BEGIN and COMMIT for
    // each of the 3 writes, shared by the writes committed together.
    assert!(
        (5.0..11.0).contains(&per_lifecycle),
        "{per_lifecycle} statements per lifecycle"
    );
}
