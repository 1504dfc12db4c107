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
//! | run: [find the session], insert key and command, (read the device) | [1] + 1 + (1) | 1 + (BEGIN, key, command, COMMIT) + (1), the 1 inside the write's transaction after the session's first run |
//! | sync (written recently): queued commands | 1 | 1 |
//! | start: (touch), compare-and-swap | (1) + 1 | (3) + 3 |
//! | complete (touched recently): compare-and-swap | 1 | 3 |
//! | get: none (the finished run `complete` wrote is the queue's) | 0 | 0 |
//!
//! `start` and `complete` do not read the command: the queue's
//! compare-and-swap starts from the copy it handed out or wrote last. The
//! run looks its session up (the bracketed statement) only when the queue
//! has no guess of its share: none from a sync it wrote, which uploaded
//! the session, nor from an earlier run of it; or after the store refused
//! the guess. Otherwise the queue builds the command on the guessed share,
//! and on Postgres the insert checks that share in its own statement
//! (`Store::insert_command_if_shared`; SQLite runs the same look-up inside
//! the insert's write transaction, so its count stays the same). The
//! device's liveness (the ticket's pickup hint, the lease of `start`) is
//! read once per touch interval: the queue keeps what it read and what it
//! wrote. The parenthesized statements run on a desk's first lifecycle
//! (6 against 14; 7 with the look-up) and not on the next ones within the
//! touch interval (4 against 12). A desk quiet for longer also has its
//! sync write (8 against 24): the project bound, then on Postgres one statement that
//! finds the sessions unchanged, moves their stamps and records the
//! device's contact (`record_sync`); on SQLite the sessions in a
//! transaction of 4 statements and the contact in one of 3. A sync whose
//! sessions changed adds the replacement, a transaction of 5 statements,
//! on Postgres.
//!
//! Requests in flight together share statements (see the crate docs): the
//! durable writes (inserts and compare-and-swaps together) and the
//! look-ups of concurrent requests are gathered in two kinds, and a batch
//! is counted as one statement however many requests it answers;
//! lifecycles at different steps share a write statement (one run's
//! insert, another's start, a third's result), which the batching tests
//! pin. A request that finds a lane of its kind free (the writes have
//! one, the look-ups two) lets the requests woken with it queue, then runs
//! them all as one statement; requests that arrive while every lane is
//! busy go together as the next. Sixteen lifecycles run step by step
//! together (every desk's run, then every desk's sync, and so on)
//! therefore send 4 statements instead of 64: the run's inserts (the
//! sessions were queued before, so no run looks its session up), the
//! sync's look-ups of the queued commands, and the compare-and-swaps of
//! `start` and of `complete`, one batch each; the last step,
//! `get_graph_run`, sends none (the queue
//! answers it with the finished run its `complete` wrote). The
//! `lifecycles` bench prints the statements per lifecycle it measured:
//! about 0.3 with 16 lifecycles in flight and about 0.07 with 64, each
//! running at its own pace.
//!
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::sync::Arc;

use futures::future::join_all;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::testkit::workload::{desks, lifecycle};
use graph_relay_core::testkit::{World, completed, exec, run_args};
use graph_relay_store_postgres::PostgresStore;
use graph_relay_store_postgres::testing::{TestSchema, url};
use serde_json::json;

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

    // The desk's first lifecycle: its sync (by `desks`) recorded the
    // contact, which counts as the touch interval's, so `start` does not
    // record it again.
    // The run's insert checks the share the desk's sync uploaded instead
    // of looking the session up first, and reads the device.
    assert_eq!(counted(&store, lifecycle(&w, &desk, 0)).await, 5);
    // Within the touch interval nothing records it again.
    assert_eq!(counted(&store, lifecycle(&w, &desk, 1)).await, 4);
    // Later, the sync writes again, after checking the project bound: the
    // sessions are those stored, so one statement moves their stamps and
    // records the contact (`record_sync`; a changed sync adds the locked
    // replacement, a transaction of 5). The run reads the device again;
    // `start` has no contact to add to the sync's.
    w.advance(2);
    assert_eq!(counted(&store, lifecycle(&w, &desk, 2)).await, 7);
}

/// Sixteen lifecycles in step, on a current-thread runtime, where the
/// requests of one step are all queued before any of them runs.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "current_thread")]
async fn lifecycles_in_flight_together_share_statements() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let w = World::new(Arc::new(store.clone()));
    let desks = desks(&w, 16).await;
    // Each desk's first lifecycle records its contact; the counted round
    // is the second, within the touch interval, 6 statements one by one.
    for (n, desk) in (0..).zip(&desks) {
        lifecycle(&w, desk, n).await;
    }

    let before = store.statements_executed();
    // Desk k alone shares session k + 1.
    let tickets = join_all((1..=16u32).map(|session| {
        let key = format!("in-step-{session:04}");
        w.queue
            .run_graph_session(&w.agent, run_args(session, &key, json!({ "n": session })))
    }))
    .await;
    let ids: Vec<_> = tickets
        .into_iter()
        .zip(&desks)
        .map(|(ticket, desk)| {
            let command = ticket.expect("run").command;
            assert_eq!(command.device, desk.device.id);
            command.id
        })
        .collect();
    let synced = join_all(desks.iter().map(|d| w.queue.sync(&d.device, &d.sync))).await;
    for (synced, id) in synced.into_iter().zip(&ids) {
        let commands = synced.expect("sync").commands;
        assert_eq!(commands.iter().map(|c| c.id).collect::<Vec<_>>(), [*id]);
    }
    let executions: Vec<_> = (0..ids.len()).map(|n| exec(&format!("step-{n}"))).collect();
    for started in join_all(
        desks
            .iter()
            .zip(&ids)
            .zip(&executions)
            .map(|((d, id), e)| w.queue.start(&d.device, id, e)),
    )
    .await
    {
        started.expect("start");
    }
    let results: Vec<_> = executions
        .iter()
        .map(|e| completed(e.as_str(), json!(1)))
        .collect();
    for done in join_all(
        desks
            .iter()
            .zip(&ids)
            .zip(&results)
            .map(|((d, id), r)| w.queue.complete(&d.device, id, r)),
    )
    .await
    {
        done.expect("complete");
    }
    for view in join_all(ids.iter().map(|id| w.queue.get_graph_run(&w.agent, id))).await {
        assert_eq!(view.expect("get").command.status, CommandStatus::Completed);
    }
    let sent = store.statements_executed() - before;
    // Four steps reach the store, one batch each: the look-ups of the
    // sync and the writes of the run, the start and the result. The reads
    // of the finished runs do not, nor the look-ups of the sessions (each
    // was queued before).
    assert_eq!(sent, 4, "16 lifecycles in step: statements sent");
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
