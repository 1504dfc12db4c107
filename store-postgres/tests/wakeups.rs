//! The wake-up bridge when things go wrong, and how many waiters a
//! notification wakes when several servers share one database.
//!
//! Each test has a database of its own ([`TestDatabase`]): `NOTIFY` channels
//! are per database, so no other test's notifications reach these servers
//! and every count below is exact. Nothing here asserts a duration: the
//! deadlines only bound how long a test waits for something that must
//! happen.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::CommandId;
use graph_relay_core::queue::{FED_RECHECK, Queue, QueueConfig, SyncRequest};
use graph_relay_core::signals::{Forwarder, SignalCounts, Topic};
use graph_relay_core::testkit::workload::{Desk, desks};
use graph_relay_core::testkit::{World, completed, exec};
use graph_relay_core::time::{RandomIds, Sleeper};
use graph_relay_store_postgres::testing::{TestDatabase, url};
use graph_relay_store_postgres::{PostgresStore, SignalBridgeHandle, SignalStatus};

/// Longest wait for something that must happen (a reconnection, a
/// notification crossing the database).
const DEADLINE: Duration = Duration::from_secs(20);
/// A run's lease, for the control holds whose re-look pace is checked.
const LEASE: Duration = Duration::from_secs(60);
/// Hints a bridge queues before it drops them (`QUEUE` in the bridge).
const QUEUE: usize = 4096;

/// Sleeps on Tokio's timer.
struct TokioSleep;

impl Sleeper for TokioSleep {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Sleeps on Tokio's timer and counts the naps. A hold naps only once it
/// has looked at the store and parked, so the count tells a test when every
/// held request's first look is over: a subscription alone does not (a
/// change made during that look answers it with no wake-up).
#[derive(Clone, Default)]
struct Parked(Arc<std::sync::atomic::AtomicUsize>);

impl Parked {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Sleeper for Parked {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        TokioSleep.sleep(duration)
    }
}

/// One "server": a store of its own (its own pool), a queue with random
/// command ids, and its wake-up bridge.
struct Server {
    world: Arc<World>,
    store: PostgresStore,
}

impl Server {
    async fn new(db: &TestDatabase) -> Self {
        let store = db.store().await.expect("connect");
        let mut world = World::new(Arc::new(store.clone()));
        world.queue = Queue::new(
            Arc::new(store.clone()),
            world.clock.clone(),
            Arc::new(RandomIds),
            QueueConfig::default(),
        );
        Self {
            world: Arc::new(world),
            store,
        }
    }

    /// A server whose bridge listens.
    async fn listening(db: &TestDatabase) -> (Self, SignalBridgeHandle) {
        let server = Self::new(db).await;
        let bridge = server
            .store
            .signal_bridge(server.queue().signals().clone())
            .install();
        assert!(
            bridge.status().wait_listening(DEADLINE).await,
            "the listener connects"
        );
        (server, bridge)
    }

    fn queue(&self) -> &Queue {
        &self.world.queue
    }

    fn counts(&self) -> SignalCounts {
        self.queue().signals().counts()
    }
}

/// Waits until `done` holds, failing with `what` after [`DEADLINE`].
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn command_topic(n: u128) -> Topic {
    Topic::Command(CommandId::from_uuid(uuid::Uuid::from_u128(n)))
}

/// Whether a subscription is ready now.
fn ready(subscription: &mut (impl Future<Output = ()> + Unpin)) -> bool {
    subscription.now_or_never().is_some()
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_reconnects_and_wakes_every_held_waiter_once() {
    let db = TestDatabase::create(&url()).await.expect("a test database");
    let (a, _a_bridge) = Server::listening(&db).await;
    let (b, b_bridge) = Server::listening(&db).await;
    let status = b_bridge.status().clone();
    let pid = status.backend_pid().expect("listening");

    // Waiters on B on topics nobody notifies.
    let mut waiters: Vec<_> = (0..25)
        .map(|n| b.queue().signals().subscribe(command_topic(1000 + n)))
        .collect();
    assert!(!waiters.iter_mut().any(ready));

    let client = a.store.pool().get().await.expect("client");
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate the listener's backend");
    until("B's listener reconnects and wakes everything", || {
        status.stats().wake_alls == 1
    })
    .await;
    let stats = status.stats();
    assert_eq!(stats.connects, 2, "{stats:?}");
    assert_ne!(status.backend_pid(), Some(pid));
    assert!(status.listening());
    assert!(waiters.iter_mut().all(ready), "every held waiter woke");
    assert_eq!(
        b.counts(),
        SignalCounts {
            notified: 0,
            woken: 0,
            woken_all: 25
        },
        "each waiter was woken once, by the reconnection"
    );
    // A's listener never lost anything: it asked nobody to wake everything.
    assert_eq!(a.counts().woken_all, 0);
    assert_eq!(status.stats().wake_alls_sent, 0);

    // Listening again: a notification from A reaches a new waiter on B.
    let mut again = b.queue().signals().subscribe(command_topic(2000));
    a.queue().signals().notify(&command_topic(2000));
    until("the notification crosses after the reconnection", || {
        ready(&mut again)
    })
    .await;
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lost_hints_asks_the_others_to_wake_everything() {
    let db = TestDatabase::create(&url()).await.expect("a test database");
    let (b, b_bridge) = Server::listening(&db).await;
    // A's forwarder is installed but its listener does not run yet: its
    // queue fills, and the hint after that is lost.
    let a = Server::new(&db).await;
    let (forwarder, listener, a_status) = a
        .store
        .signal_bridge(a.queue().signals().clone())
        .into_parts();
    a.queue().signals().set_forwarder(forwarder);
    let hints = QUEUE as u128 + 1;
    for n in 0..hints {
        a.queue().signals().notify(&command_topic(10_000 + n));
    }
    assert_eq!(a_status.stats().dropped, 1, "{:?}", a_status.stats());

    // Waiters on B on topics A never notified.
    let mut waiters: Vec<_> = (0..40)
        .map(|n| b.queue().signals().subscribe(command_topic(1 + n)))
        .collect();
    let listener = tokio::spawn(listener.run());
    until("B receives A's request to wake everything", || {
        b_bridge.status().stats().wake_alls == 1
    })
    .await;
    assert!(waiters.iter_mut().all(ready), "B's unrelated waiters woke");
    // A counts its request once Postgres has answered it, which may be
    // after B has already received it.
    until("A counts the request it sent", || {
        a_status.stats().wake_alls_sent == 1
    })
    .await;
    assert_eq!(b.counts().woken_all, 40);
    // The queued hints follow; they concern none of B's waiters.
    let published = u64::try_from(QUEUE).expect("small");
    until("A's queued hints reach B", || {
        b_bridge.status().stats().received == published
    })
    .await;
    assert_eq!(a_status.stats().published, published);
    assert_eq!(
        b.counts().woken,
        0,
        "no hint woke a waiter of another topic"
    );
    assert_eq!(b.counts().notified, published);
    assert_eq!(a.counts().woken_all, 0, "A's own waiters are not woken");
    listener.abort();
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_wait_on_notifications_only_while_the_listener_listens() {
    let db = TestDatabase::create(&url()).await.expect("a test database");
    let server = Server::new(&db).await;
    let queue = server.queue();
    let device = &server.world.device;
    let id = CommandId::from_uuid(uuid::Uuid::from_u128(7));
    let short = queue.config().hold_recheck;
    assert!(short < FED_RECHECK);

    // No bridge: another server's writes show only by reading the store.
    assert!(!queue.external_writes_fed());
    assert_eq!(queue.sync_hold(device).recheck, short);

    // A bridge whose listener is not running does not deliver.
    let (forwarder, listener, status) = server
        .store
        .signal_bridge(queue.signals().clone())
        .into_parts();
    let forwarder_handle: Arc<dyn Forwarder> = forwarder.clone();
    queue.signals().set_forwarder(forwarder_handle);
    assert!(!forwarder.delivers());
    assert!(!queue.external_writes_fed());
    assert_eq!(queue.sync_hold(device).recheck, short);
    assert_eq!(queue.control_hold(&id, LEASE).recheck, short);

    // Listening: held requests rely on notifications.
    let running = tokio::spawn(listener.run());
    assert!(status.wait_listening(DEADLINE).await);
    assert!(forwarder.delivers());
    assert!(queue.external_writes_fed());
    assert_eq!(queue.sync_hold(device).recheck, FED_RECHECK);
    assert_eq!(queue.control_hold(&id, LEASE).recheck, FED_RECHECK);
    // A listener task that ends (here: aborted) no longer delivers.
    running.abort();
    let _ = running.await;
    assert!(!status.listening());
    assert!(!forwarder.delivers());
    assert_eq!(queue.sync_hold(device).recheck, short);

    // An installed bridge, then stopped: back to the short recheck.
    let bridge = server
        .store
        .signal_bridge(queue.signals().clone())
        .install();
    assert!(bridge.status().wait_listening(DEADLINE).await);
    assert!(queue.signals().forwarder_delivers());
    assert_eq!(queue.sync_hold(device).recheck, FED_RECHECK);
    let status = bridge.status().clone();
    bridge.stop();
    assert!(!status.listening());
    assert!(!queue.signals().forwarder_delivers());
    assert!(!queue.external_writes_fed());
    assert_eq!(queue.sync_hold(device).recheck, short);
    assert_eq!(queue.control_hold(&id, LEASE).recheck, short);
}

/// Servers, desks per server, and the desks' long-poll syncs.
const SERVERS: usize = 3;
const DESKS: usize = 240;

/// Waits until every server's listener received `expected[s]` topics.
async fn received(statuses: &[SignalStatus], expected: &[u64]) {
    until("every server received the others' notifications", || {
        statuses
            .iter()
            .zip(expected)
            .all(|(s, e)| s.stats().received == *e)
    })
    .await;
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_only_the_waiter_it_concerns_across_three_servers() {
    let db = TestDatabase::create(&url()).await.expect("a test database");
    let mut servers = Vec::new();
    let mut bridges = Vec::new();
    for _ in 0..SERVERS {
        let (server, bridge) = Server::listening(&db).await;
        servers.push(server);
        bridges.push(bridge);
    }
    let statuses: Vec<SignalStatus> = bridges.iter().map(|b| b.status().clone()).collect();
    let world = servers[0].world.clone();
    let all: Vec<Desk> = desks(&world, u32::try_from(DESKS).expect("small")).await;
    // Desk i long-polls server i % 3, its runs are queued through server
    // (i + 1) % 3, and their agent waits on server (i + 2) % 3.
    let on = |i: usize, shift: usize| &servers[(i + shift) % SERVERS];
    let per_server = (DESKS / SERVERS) as u64;
    let from_others = (DESKS - DESKS / SERVERS) as u64;
    let start_counts: Vec<SignalCounts> = servers.iter().map(Server::counts).collect();
    assert!(start_counts.iter().all(|c| *c == SignalCounts::default()));

    // 1. Every desk's long-poll sync is held; then a run is queued for each.
    let mut syncs = tokio::task::JoinSet::new();
    let parked = Parked::default();
    for (i, desk) in all.iter().enumerate() {
        let world = on(i, 0).world.clone();
        let parked = parked.clone();
        let device = desk.device.clone();
        let request = SyncRequest {
            long_poll: true,
            ..desk.sync.clone()
        };
        syncs.spawn(async move {
            world
                .queue
                .sync_held(&device, &request, |hold| hold, &parked)
                .await
                .expect("held sync")
        });
    }
    until("every desk's sync is held", || {
        parked.count() >= DESKS
            && servers
                .iter()
                .all(|s| s.queue().signals().waiting() == per_server as usize)
    })
    .await;
    let mut ids = Vec::with_capacity(DESKS);
    for (i, desk) in all.iter().enumerate() {
        let args = graph_relay_core::args::RunArgs {
            graph_session_id: desk.sync.sessions[0].graph_session_id.clone(),
            arguments: serde_json::Map::new(),
            idempotency_key: graph_relay_core::ids::IdempotencyKey::parse(&format!("wake-key-{i}"))
                .expect("key"),
        };
        let ticket = on(i, 1)
            .queue()
            .run_graph_session(&world.agent, args)
            .await
            .expect("run");
        ids.push(ticket.command.id);
    }
    let mut handed_out = 0;
    while let Some(answer) = syncs.join_next().await {
        let answer = answer.expect("sync task");
        assert_eq!(
            answer.commands.len(),
            1,
            "the held sync answers with its run"
        );
        handed_out += 1;
    }
    assert_eq!(handed_out, DESKS);
    received(&statuses, &[from_others; SERVERS]).await;

    // 2. Every run is started by its desk (nobody waits on it yet).
    for (i, (desk, id)) in all.iter().zip(&ids).enumerate() {
        on(i, 0)
            .queue()
            .start(&desk.device, id, &exec(&format!("exec-{i}")))
            .await
            .expect("start");
    }
    received(&statuses, &[2 * from_others; SERVERS]).await;

    // 3. Every run's agent waits for it; then the desks complete them.
    let mut waits = tokio::task::JoinSet::new();
    let parked = Parked::default();
    for (i, id) in ids.iter().enumerate() {
        let world = on(i, 2).world.clone();
        let id = *id;
        let parked = parked.clone();
        waits.spawn(async move {
            world
                .queue
                .wait_graph_run(&world.agent, &id, Duration::from_secs(120), &parked)
                .await
                .expect("wait")
        });
    }
    until("every agent's wait is held", || {
        parked.count() >= DESKS
            && servers
                .iter()
                .all(|s| s.queue().signals().waiting() == per_server as usize)
    })
    .await;
    for (i, (desk, id)) in all.iter().zip(&ids).enumerate() {
        let execution = format!("exec-{i}");
        on(i, 0)
            .queue()
            .complete(
                &desk.device,
                id,
                &completed(&execution, serde_json::json!({ "i": i })),
            )
            .await
            .expect("complete");
    }
    while let Some(view) = waits.join_next().await {
        assert_eq!(
            view.expect("wait task").command.status,
            CommandStatus::Completed
        );
    }
    received(&statuses, &[3 * from_others; SERVERS]).await;

    // Every server heard every notification (3 per run: queued, started,
    // completed), its own and the others', and woke exactly its own held
    // requests once each: a sync per desk it serves, a wait per run its
    // agents wait on. Nothing was lost, so nothing woke everything.
    let runs = DESKS as u64;
    let mut woken = 0;
    let mut notified = 0;
    for (s, server) in servers.iter().enumerate() {
        let counts = server.counts();
        assert_eq!(
            counts,
            SignalCounts {
                notified: 3 * runs,
                woken: 2 * per_server,
                woken_all: 0,
            },
            "server {s}"
        );
        let stats = statuses[s].stats();
        assert_eq!(
            (stats.dropped, stats.wake_alls, stats.wake_alls_sent),
            (0, 0, 0)
        );
        woken += counts.woken;
        notified += counts.notified - stats.received;
    }
    let held = 2 * runs;
    assert_eq!(woken, held, "one wake-up per held request");
    println!(
        "wake-ups per notification: {:.2} ({woken} woken / {notified} notified, {SERVERS} servers, {held} held); \
         per notification with a waiter: {:.2}; per notification delivered to a server: {:.2}",
        woken as f64 / notified as f64,
        woken as f64 / (2 * runs) as f64,
        woken as f64 / (SERVERS as u64 * notified) as f64,
    );
}
