//! Two "servers" (two stores, two queues, two `Signals`) on one schema:
//! a write through one wakes a waiter on the other over LISTEN/NOTIFY, the
//! listener survives losing its connection, and migrations run once.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::signals::Topic;
use graph_relay_core::testkit::{World, p1};
use graph_relay_store_postgres::testing::{TestSchema, url};
use graph_relay_store_postgres::{ConnectError, PostgresStore, SCHEMA_VERSION, SignalBridgeHandle};

/// Well above a round trip, well below the 500 ms / 1 s polling fallbacks
/// (which are not running here: only a notification can wake these waiters).
const WAKE: Duration = Duration::from_secs(2);

struct Server {
    world: World,
    bridge: SignalBridgeHandle,
    store: PostgresStore,
}

async fn server(schema: &TestSchema) -> Server {
    let store = schema.store().await.expect("connect");
    let world = World::new(Arc::new(store.clone()));
    let bridge = store.signal_bridge(world.queue.signals().clone()).install();
    assert!(
        bridge
            .status()
            .wait_listening(Duration::from_secs(10))
            .await,
        "the listener connects"
    );
    Server {
        world,
        bridge,
        store,
    }
}

async fn woken(subscription: graph_relay_core::signals::Subscription) -> bool {
    tokio::time::timeout(WAKE, subscription).await.is_ok()
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_one_server_wakes_waiters_on_the_other() {
    let url = url();
    let schema = TestSchema::new(&url);
    let (a, b) = (server(&schema).await, server(&schema).await);
    let w = &a.world;
    w.sync(&w.device, p1(), &[1]).await;

    // A relay's held sync on B waits for work; an agent queues through A.
    let work = b.world.queue.signals().subscribe(Topic::DeviceWork(
        w.device.owner.clone(),
        w.device.id.clone(),
    ));
    let cmd = w.run(&w.agent, 1, "wake-key-01").await;
    assert!(woken(work).await, "B's sync waiter was woken by A's write");

    // A control request held on A; the agent cancels through B.
    let control = a.world.queue.signals().subscribe(Topic::Command(cmd.id));
    b.world
        .queue
        .start(&w.device, &cmd.id, &graph_relay_core::testkit::exec("e1"))
        .await
        .expect("start through B");
    assert!(
        woken(control).await,
        "A's control waiter was woken by B's start"
    );
    let control = a.world.queue.signals().subscribe(Topic::Command(cmd.id));
    let view = b
        .world
        .queue
        .cancel_graph_run(&w.agent, &cmd.id)
        .await
        .expect("cancel through B");
    assert!(view.command.cancel_requested);
    assert!(
        woken(control).await,
        "A's control waiter was woken by B's cancel"
    );

    let (sa, sb) = (a.bridge.status().stats(), b.bridge.status().stats());
    // B's start and cancel publish the same topic; when both are queued at
    // once they go out as one (deduplicated) notification.
    assert!(sa.published >= 1 && sb.published >= 1, "{sa:?} {sb:?}");
    assert!(sa.received >= 1 && sb.received >= 1, "{sa:?} {sb:?}");
    assert_eq!(sa.malformed + sb.malformed, 0);
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_notifications_are_not_applied_twice() {
    let url = url();
    let schema = TestSchema::new(&url);
    let a = server(&schema).await;
    let id = graph_relay_core::ids::CommandId::from_uuid(uuid_from(7));
    a.world.queue.signals().notify(&Topic::Command(id));
    let status = a.bridge.status().clone();
    let deadline = tokio::time::Instant::now() + WAKE;
    while status.stats().own == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "own notification never came back: {:?}",
            status.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // (`received` is not asserted to be 0: other tests' servers share the
    // database and so the channel.)
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_reconnects_after_its_connection_is_killed() {
    let url = url();
    let schema = TestSchema::new(&url);
    let (a, b) = (server(&schema).await, server(&schema).await);
    let status = b.bridge.status().clone();
    let pid = status.backend_pid().expect("listening");
    let client = a.store.pool().get().await.expect("client");
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate the listener's backend");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status.stats().connects < 2 || !status.listening() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reconnection: {:?}",
            status.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(status.backend_pid(), Some(pid));
    let id = graph_relay_core::ids::CommandId::from_uuid(uuid_from(9));
    let waiter = b.world.queue.signals().subscribe(Topic::Command(id));
    a.world.queue.signals().notify(&Topic::Command(id));
    assert!(woken(waiter).await, "woken again after the reconnection");
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    let url = url();
    let schema = TestSchema::new(&url);
    let (x, y) = tokio::join!(schema.store(), schema.store());
    let store = x.expect("first");
    y.expect("second");
    let client = store.pool().get().await.expect("client");
    let rows = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("read migrations");
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let table_schema: String = client
        .query_one(
            "SELECT table_schema::text FROM information_schema.tables WHERE table_name = 'commands' AND table_schema = $1",
            &[&schema.name()],
        )
        .await
        .expect("the tables are in the test schema")
        .get(0);
    assert_eq!(table_schema, schema.name());

    client
        .execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')",
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .expect("pretend a newer build migrated");
    match schema.store().await {
        Err(ConnectError::NewerSchema { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

fn uuid_from(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(n)
}
