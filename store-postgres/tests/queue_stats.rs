//! `PostgresStore::queue_stats`, the operator's status on Postgres: one
//! scenario (desktops in both modes and of several owners, shares, runs
//! queued, running, finished inside and outside the window) checked field
//! by field, and compared with what the SQLite store's `QueueStats::read`
//! answers for the same scenario: the two stores give the same document.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{DeviceId, OwnerId};
use graph_relay_core::principal::Device;
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::stats::QueueStats;
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{EPOCH, World, completed, exec, meta, p1};
use graph_relay_core::time::{Clock, Timestamp};
use graph_relay_store_postgres::testing::{TestSchema, url};
use graph_relay_store_sqlite::SqliteStore;
use graph_relay_store_sqlite::stats::ReadQueueStats;
use serde_json::json;

const HOUR: Duration = Duration::from_secs(3600);

/// What the scenario left, to check the snapshot against.
struct Scenario {
    now: Timestamp,
    /// The queued runs, oldest first.
    queued: Vec<String>,
}

fn failed(execution: &str) -> ResultEnvelope {
    ResultEnvelope::build(
        exec(execution),
        FinishStatus::Failed,
        EnvelopeBody {
            result: json!(null),
            total_tokens: None,
            reported_cost: None,
            error: Some("boom".into()),
        },
    )
}

/// Alice's third desktop, whose name sorts before `desktop` bytewise (and
/// after `laptop` in a dictionary order).
fn zed() -> Device {
    Device::new(
        DeviceId::parse("Zed").expect("id"),
        OwnerId::parse("alice").expect("id"),
    )
}

/// The same steps over any store; ids and times come from the world's
/// seeded ids and manual clock, so two stores hold the same queue.
async fn scenario(w: &World) -> Scenario {
    // Two hours ago: Mallory's desktop synced once; a run of Alice's was
    // picked up after 2 s and finished; another started and lapsed.
    w.sync(&w.stranger_device, p1(), &[9]).await;
    w.sync(&w.device, p1(), &[1]).await;
    let old = w.run(&w.agent, 1, "stats-old-1").await;
    let long = w.run(&w.agent, 1, "stats-old-2").await;
    w.advance(2);
    for (run, e) in [(&old, "e-old"), (&long, "e-long")] {
        w.queue
            .start(&w.device, &run.id, &exec(e))
            .await
            .expect("start");
    }
    w.advance(1);
    w.queue
        .complete(&w.device, &old.id, &completed("e-old", json!(1)))
        .await
        .expect("complete");
    w.advance(2 * 3600);

    // Inside the window. Bob's desktop syncs first (it will be offline by
    // the end); Alice's desktop at an interval, her laptop long-polling.
    w.sync(&w.twin_device, p1(), &[1, 3]).await;
    w.advance(100);
    w.sync(&w.device, p1(), &[1]).await;
    w.sync(&zed(), p1(), &[4]).await;
    let long_poll = SyncRequest {
        project: p1(),
        sessions: vec![meta(2), meta(4)],
        long_poll: true,
        restarted: false,
        running: None,
    };
    w.queue
        .sync(&w.other_device, &long_poll)
        .await
        .expect("sync");
    // The run started two hours ago has lapsed (its lease ran out): the
    // sweep fails it, as of when its lease ran out (outside the window).
    assert_eq!(w.queue.sweep_lapsed().await.expect("sweep"), 1);

    // Picked up after 4 s, completed.
    let done = w.run(&w.agent, 1, "stats-done").await;
    w.advance(4);
    w.queue
        .start(&w.device, &done.id, &exec("e-done"))
        .await
        .expect("start");
    w.advance(1);
    w.queue
        .complete(&w.device, &done.id, &completed("e-done", json!(3)))
        .await
        .expect("complete");
    // Picked up after 7 s, failed.
    let bad = w.run(&w.agent, 1, "stats-bad").await;
    w.advance(7);
    w.queue
        .start(&w.device, &bad.id, &exec("e-bad"))
        .await
        .expect("start");
    w.queue
        .complete(&w.device, &bad.id, &failed("e-bad"))
        .await
        .expect("fail");
    // Cancelled while queued.
    let cancelled = w.run(&w.agent, 1, "stats-cancelled").await;
    w.queue
        .cancel_graph_run(&w.agent, &cancelled.id)
        .await
        .expect("cancel");
    // Running: one on the laptop (picked up after 3 s), one on the desktop
    // (after 10 s).
    let on_laptop = w.run(&w.agent, 2, "stats-laptop").await;
    let on_desktop = w.run(&w.agent, 1, "stats-desktop").await;
    w.advance(3);
    w.queue
        .start(&w.other_device, &on_laptop.id, &exec("e-laptop"))
        .await
        .expect("start");
    w.advance(7);
    w.queue
        .start(&w.device, &on_desktop.id, &exec("e-desktop"))
        .await
        .expect("start");
    // Queued: two in the same millisecond (Bob's first), then one later.
    let bobs = w.run(&w.twin, 3, "stats-bob").await;
    let alices = w.run(&w.agent, 1, "stats-queued-1").await;
    w.advance(1);
    let last = w.run(&w.agent, 1, "stats-queued-2").await;
    w.advance(5);
    // What a server's maintenance writes each second: the desktops' contacts.
    w.queue.flush_contacts().await.expect("contacts written");
    Scenario {
        now: w.clock.now(),
        queued: [bobs, alices, last]
            .iter()
            .map(|r| r.id.to_string())
            .collect(),
    }
}

fn pairs(stats: &QueueStats) -> Vec<(&str, &str)> {
    stats
        .desktops
        .iter()
        .map(|d| (d.owner.as_str(), d.device.as_str()))
        .collect()
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_on_postgres_is_the_status_on_sqlite() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let postgres = World::new(Arc::new(store.clone()) as Arc<dyn Store>);

    let empty = store
        .queue_stats(postgres.clock.now(), HOUR, 20)
        .await
        .expect("stats");
    assert!(empty.desktops.is_empty() && empty.shares.is_empty() && empty.queue.is_empty());
    assert_eq!((empty.queued, empty.running), (0, 0));
    assert_eq!(
        empty.recent_by_status,
        BTreeMap::from([("queued".to_owned(), 0), ("running".to_owned(), 0)])
    );
    assert!(empty.pickups.is_empty());

    let s = scenario(&postgres).await;
    let stats = store.queue_stats(s.now, HOUR, 20).await.expect("stats");
    assert_eq!(stats.now, s.now);

    // Desktops in bytewise order, with their mode, contacts and runs.
    assert_eq!(
        pairs(&stats),
        [
            ("alice", "Zed"),
            ("alice", "desktop"),
            ("alice", "laptop"),
            ("bob", "desktop"),
            ("mallory", "mallory-pc"),
        ]
    );
    let modes: Vec<bool> = stats.desktops.iter().map(|d| d.long_poll).collect();
    assert_eq!(modes, [false, false, true, false, false]);
    let running: Vec<u64> = stats.desktops.iter().map(|d| d.running).collect();
    assert_eq!(running, [0, 1, 1, 0, 0]);
    let online: Vec<bool> = stats.desktops.iter().map(|d| d.is_online(s.now)).collect();
    assert_eq!(online, [true, true, true, false, false]);
    let desktop = &stats.desktops[1];
    assert_eq!(desktop.last_seen_at, s.now.minus(Duration::from_secs(6)));
    assert!(
        desktop
            .last_sync_at
            .is_some_and(|t| t < desktop.last_seen_at)
    );
    let mallory = &stats.desktops[4];
    assert_eq!(mallory.last_sync_at, Some(EPOCH));
    assert_eq!(mallory.last_seen_at, EPOCH);

    // Shares per (owner, project): sessions and desktops distinct.
    let shares: Vec<(&str, &str, u64, u64)> = stats
        .shares
        .iter()
        .map(|p| (p.owner.as_str(), p.project.as_str(), p.sessions, p.desktops))
        .collect();
    assert_eq!(
        shares,
        [
            ("alice", "p1", 3, 3),
            ("bob", "p1", 2, 1),
            ("mallory", "p1", 1, 1)
        ]
    );

    // The queue: oldest first, ties in the order queued.
    let queue: Vec<&str> = stats.queue.iter().map(|q| q.command_id.as_str()).collect();
    assert_eq!(queue, s.queued);
    assert_eq!(
        (
            stats.queue[0].owner.as_str(),
            stats.queue[0].project.as_str(),
            stats.queue[0].device.as_str()
        ),
        ("bob", "p1", "desktop")
    );
    assert_eq!(stats.queue[0].created_at, stats.queue[1].created_at);
    assert_eq!(
        stats.queue[2].created_at,
        s.now.minus(Duration::from_secs(5))
    );
    assert_eq!((stats.queued, stats.running), (3, 2));

    // The window: the runs finished two hours ago and their pickups are
    // left out.
    assert_eq!(
        stats.recent_by_status,
        BTreeMap::from([
            ("cancelled".to_owned(), 1),
            ("completed".to_owned(), 1),
            ("failed".to_owned(), 1),
            ("queued".to_owned(), 3),
            ("running".to_owned(), 2),
        ])
    );
    let pickups: Vec<u64> = stats.pickups.iter().map(|d| d.as_secs()).collect();
    assert_eq!(pickups, [3, 4, 7, 10], "ascending, within the window");
    assert_eq!(stats.pickup_quantile(0.5), Some(Duration::from_secs(4)));

    // The limit lists the oldest and keeps the counts.
    let limited = store.queue_stats(s.now, HOUR, 2).await.expect("stats");
    assert_eq!(limited.queue, stats.queue[..2]);
    assert_eq!(limited.queued, 3);
    let unbounded = store
        .queue_stats(s.now, HOUR, usize::MAX)
        .await
        .expect("stats");
    assert_eq!(unbounded.queue, stats.queue);
    // A window of three hours reaches the old runs and their pickups.
    let wide = store.queue_stats(s.now, 3 * HOUR, 20).await.expect("stats");
    assert_eq!(wide.recent_by_status.get("completed"), Some(&2));
    assert_eq!(wide.recent_by_status.get("failed"), Some(&2));
    assert_eq!(wide.pickups.len(), 6);

    // The same scenario on SQLite gives the same snapshots.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("queue.sqlite");
    let sqlite = World::new(Arc::new(SqliteStore::open(&path).expect("open")) as Arc<dyn Store>);
    let on_sqlite = scenario(&sqlite).await;
    assert_eq!(on_sqlite.now, s.now);
    assert_eq!(on_sqlite.queued, s.queued, "the same ids");
    for (window, limit, postgres) in [
        (HOUR, 20, &stats),
        (HOUR, 2, &limited),
        (3 * HOUR, 20, &wide),
    ] {
        let read = QueueStats::read(&path, s.now, window, limit).expect("read");
        assert_eq!(&read, postgres, "window {window:?}, limit {limit}");
    }
}
