//! The core's `McpSessionStore` conformance functions, run unchanged
//! against `PostgresMcpSessionStore`, each test in a fresh schema; and what
//! only a shared table can show: servers on one schema serve each other's
//! sessions, and a look-up writes the last use only when it is stale.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`).

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use graph_relay_core::mcp::{McpSessionLimits, McpSessionStore};
use graph_relay_core::testkit::mcp_sessions::{holder, initialized};
use graph_relay_core::time::Timestamp;
use graph_relay_store_postgres::PostgresMcpSessionStore;
use graph_relay_store_postgres::testing::{TestSchema, url};

thread_local! {
    /// The schemas made by the current test (its future runs on this thread).
    static SCHEMAS: RefCell<Vec<TestSchema>> = const { RefCell::new(Vec::new()) };
}

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

/// A fresh session table in a fresh schema.
async fn fresh_table() -> PostgresMcpSessionStore {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect and migrate");
    SCHEMAS.with(|s| s.borrow_mut().push(schema));
    store.mcp_session_store()
}

graph_relay_core::mcp_session_store_suite!(
    block_on,
    fresh_table(),
    #[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
);

fn at(ms: u64) -> Timestamp {
    Timestamp(1_700_000_000_000 + ms)
}

/// Two servers (two stores, two pools) on one schema: a session made by
/// one is served, updated and ended by the other.
#[test]
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
fn servers_on_one_schema_share_sessions() {
    block_on(async {
        let url = url();
        let schema = TestSchema::new(&url);
        let a = schema.store().await.expect("server a").mcp_session_store();
        let b = schema.store().await.expect("server b").mcp_session_store();
        let l = McpSessionLimits::default();
        let alice = holder("alice", "assistant", "a");
        let id = "ab".repeat(32);
        a.create(&id, &alice, &initialized("c"), &l, at(0))
            .await
            .expect("created on a");
        assert_eq!(
            b.get(&id, &alice, &l, at(1)).await.expect("get on b"),
            Some(initialized("c"))
        );
        b.put(&id, &alice, &initialized("d"))
            .await
            .expect("put on b");
        assert_eq!(
            a.get(&id, &alice, &l, at(2)).await.expect("get on a"),
            Some(initialized("d"))
        );
        assert!(b.delete(&id, &alice).await.expect("delete on b"));
        assert_eq!(a.get(&id, &alice, &l, at(3)).await.expect("get on a"), None);
        SCHEMAS.with(|s| s.borrow_mut().push(schema));
    });
}

/// A look-up moves the stored last use only when it is older than the
/// precision (a tenth of the idle timeout): uses closer together than that
/// cost no write, so a session in use expires at most that much early.
#[test]
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
fn last_use_is_written_at_most_once_per_precision() {
    block_on(async {
        let url = url();
        let schema = TestSchema::new(&url);
        let store = schema.store().await.expect("connect");
        let table = store.mcp_session_store();
        let l = McpSessionLimits {
            idle_timeout: Duration::from_secs(100),
            ..McpSessionLimits::default()
        };
        let alice = holder("alice", "assistant", "a");
        let id = "cd".repeat(32);
        table
            .create(&id, &alice, &initialized("c"), &l, at(0))
            .await
            .expect("created");
        let used_at = || async {
            let client = store.pool().get().await.expect("client");
            let row = client
                .query_one("SELECT used_at FROM mcp_sessions WHERE id = $1", &[&id])
                .await
                .expect("row");
            u64::try_from(row.get::<_, i64>(0)).expect("positive") - 1_700_000_000_000
        };
        // Uses within 10 s of the stored last use write nothing.
        for ms in [1_000, 5_000, 9_999] {
            assert!(
                table
                    .get(&id, &alice, &l, at(ms))
                    .await
                    .expect("get")
                    .is_some()
            );
            assert_eq!(used_at().await, 0, "after a use at {ms} ms");
        }
        // The first use 10 s or more after it moves it.
        assert!(
            table
                .get(&id, &alice, &l, at(10_000))
                .await
                .expect("get")
                .is_some()
        );
        assert_eq!(used_at().await, 10_000);
        // Used every 9 s, it lives past the idle timeout of its creation.
        for ms in (19_000..=200_000).step_by(9_000) {
            assert!(
                table
                    .get(&id, &alice, &l, at(ms))
                    .await
                    .expect("get")
                    .is_some(),
                "a session in use at {ms} ms"
            );
        }
        SCHEMAS.with(|s| s.borrow_mut().push(schema));
    });
}
