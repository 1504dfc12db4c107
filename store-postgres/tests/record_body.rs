//! A command's row keeps the record's body in `record`, its head being in
//! the row's columns (schema 6), and the record reads back whole, at every
//! step of its lifecycle.
//! Rows written before schema 6, with the whole record, are read by the
//! upgrade test (`upgrade.rs`).
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists this test as ignored instead.

use std::sync::Arc;

use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::CommandId;
use graph_relay_core::principal::Agent;
use graph_relay_core::testkit::{World, completed, exec, p1};
use graph_relay_store_postgres::PostgresStore;
use graph_relay_store_postgres::testing::{TestSchema, url};
use serde_json::json;

/// The `record` column of `record`'s row is its body, as the core writes
/// it (`CommandRecord::body_json`, whose own tests say what a body leaves
/// out), and shorter than the whole record.
async fn check(store: &PostgresStore, record: &CommandRecord) {
    let client = store.pool().get().await.expect("a connection");
    let row = client
        .query_one(
            "SELECT record FROM commands WHERE id = $1",
            &[record.id.as_uuid()],
        )
        .await
        .expect("the command's row");
    let stored: &str = row.get(0);
    assert_eq!(stored, record.body_json().expect("JSON"));
    assert!(stored.len() < record.to_json().expect("JSON").len());
}

/// The run `id` as `agent` reads it through `w`'s queue.
async fn read_run(w: &World, agent: &Agent, id: &CommandId) -> CommandRecord {
    w.queue
        .get_graph_run(agent, id)
        .await
        .expect("read")
        .command
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_keeps_the_body_and_reads_back_whole() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let w = World::new(Arc::new(store.clone()));
    w.sync(&w.device, p1(), &[1]).await;

    let queued = w.run(&w.agent, 1, "body-key").await;
    let read = read_run(&w, &w.agent, &queued.id).await;
    assert_eq!(read, queued, "a queued run reads back as it was queued");
    check(&store, &read).await;

    w.queue
        .start(&w.device, &queued.id, &exec("body-exec"))
        .await
        .expect("start");
    let running = read_run(&w, &w.agent, &queued.id).await;
    assert!(running.lease_expires_at.is_some() && running.execution_id.is_some());
    check(&store, &running).await;

    w.queue
        .complete(
            &w.device,
            &queued.id,
            &completed("body-exec", json!({"answer": 42})),
        )
        .await
        .expect("complete");
    // A store of its own over the same schema: nothing comes from a copy
    // the first queue kept.
    let fresh = World::new(Arc::new(schema.store().await.expect("connect again")));
    let done = read_run(&fresh, &w.agent, &queued.id).await;
    assert_eq!(done.revision, running.revision + 1);
    assert!(done.finished_at.is_some() && done.completion.is_some());
    check(&store, &done).await;
}
