//! The core's store conformance suite, run unchanged against
//! `PostgresStore`, each test in a fresh schema that is dropped afterwards.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::cell::RefCell;
use std::future::Future;

use graph_relay_store_postgres::PostgresStore;
use graph_relay_store_postgres::testing::{TestSchema, url};

thread_local! {
    /// The schemas made by the current test (its future runs on this thread).
    static SCHEMAS: RefCell<Vec<TestSchema>> = const { RefCell::new(Vec::new()) };
}

/// Runs a conformance test on a Tokio runtime with two worker threads (so
/// the suite's racing inserts really run at once on the pool), then drops
/// the test's schemas.
fn block_on<F: Future<Output = ()>>(test: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(test);
    drop(runtime);
    SCHEMAS.with(|s| s.borrow_mut().clear());
}

/// A fresh store in a fresh schema.
async fn fresh_store() -> PostgresStore {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect and migrate");
    SCHEMAS.with(|s| s.borrow_mut().push(schema));
    store
}

graph_relay_core::store_conformance_suite!(
    block_on,
    fresh_store(),
    #[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
);
