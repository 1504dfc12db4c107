//! SQL statements per lifecycle, pinned: `run_graph_session → sync → start
//! → complete → get_graph_run` through the core's `Queue` (the lifecycle of
//! `core::testkit::workload` and of the `lifecycles` benchmark), counted by
//! [`PostgresStore::statements_executed`].
//!
//! For comparison, the SQLite store runs, by the same rule (each statement
//! executed, a write transaction's `BEGIN` and `COMMIT` one each; one write
//! is one group of the writer when nothing else writes):
//!
//! | step | Postgres | SQLite |
//! |---|---|---|
//! | run: find the session, insert key and command, (read the device) | 1 + 1 + (1) | 1 + (BEGIN, key, command, COMMIT) + (1) |
//! | sync (written recently): queued commands | 1 | 1 |
//! | start: (touch), compare-and-swap | (1) + 1 | (3) + 3 |
//! | complete (touched recently): compare-and-swap | 1 | 3 |
//! | get: none (the finished run `complete` wrote is the queue's) | 0 | 0 |
//!
//! `start` and `complete` do not read the command: the queue's
//! compare-and-swap starts from the copy it handed out or wrote last. The
//! device's liveness (the ticket's pickup hint, the lease of `start`) is
//! read once per touch interval: the queue keeps what it read and what it
//! wrote. The parenthesized statements run on a desk's first lifecycle
//! (7 against 14) and not on the next ones within the touch interval
//! (5 against 12). A desk quiet for longer also has its sync write (9
//! against 24): the project bound, then on Postgres one statement that
//! finds the sessions unchanged, moves their stamps and records the
//! device's contact (`record_sync`); on SQLite the sessions in a
//! transaction of 4 statements and the contact in one of 3. A sync whose
//! sessions changed adds the replacement, a transaction of 5 statements,
//! on Postgres.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::sync::Arc;

use graph_relay_core::testkit::World;
use graph_relay_core::testkit::workload::{desks, lifecycle};
use graph_relay_store_postgres::PostgresStore;
use graph_relay_store_postgres::testing::{TestSchema, url};

/// Statements `store` sent while `step` ran.
async fn counted(store: &PostgresStore, step: impl std::future::Future<Output = ()>) -> u64 {
    let before = store.statements_executed();
    step.await;
    store.statements_executed() - before
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_sends_a_pinned_number_of_statements() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let w = World::new(Arc::new(store.clone()));
    let desk = desks(&w, 1).await.remove(0);

    // The desk's first lifecycle: `start` records the contact (touch).
    assert_eq!(counted(&store, lifecycle(&w, &desk, 0)).await, 7);
    // Within the touch interval nothing records it again.
    assert_eq!(counted(&store, lifecycle(&w, &desk, 1)).await, 5);
    // Later, the sync writes again, after checking the project bound: the
    // sessions are those stored, so one statement moves their stamps and
    // records the contact (`record_sync`; a changed sync adds the locked
    // replacement, a transaction of 5). The run reads the device again.
    w.advance(2);
    assert_eq!(counted(&store, lifecycle(&w, &desk, 2)).await, 9);
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_the_count_and_failed_statements_count_too() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let clone = store.clone();
    assert_eq!(store.statements_executed(), 0, "migrations are not counted");
    assert_eq!(clone.command_count().await.expect("count"), 0);
    assert_eq!(store.statements_executed(), 1);

    // A statement the server refuses was still sent.
    let client = store.pool().get().await.expect("client");
    client
        .batch_execute("DROP TABLE commands CASCADE")
        .await
        .expect("drop the table behind the store's back");
    drop(client);
    assert!(store.command_count().await.is_err());
    assert_eq!(
        clone.statements_executed(),
        2,
        "admin queries are not counted"
    );
}
