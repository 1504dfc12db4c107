//! `PostgresStore::queue_figures`, what a server's metrics show on
//! Postgres: runs queued and running, the oldest queued one, desktops known
//! and online by their mode, and the runs finished in an interval with
//! their times.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::queue::SyncRequest;
use graph_relay_core::testkit::{EPOCH, World, completed, exec, meta, p1};
use graph_relay_core::time::{Clock, Timestamp};
use graph_relay_store_postgres::figures::OnlineSince;
use graph_relay_store_postgres::testing::{TestSchema, url};
use serde_json::json;

/// Online if heard from within a minute, in either mode.
fn within_a_minute(now: Timestamp) -> OnlineSince {
    let since = now.minus(Duration::from_secs(60));
    OnlineSince {
        long_poll: since,
        interval: since,
    }
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_figures_follow_the_queue() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    let w = World::new(Arc::new(store.clone()));

    let empty = store
        .queue_figures(within_a_minute(w.clock.now()), EPOCH, w.clock.now())
        .await
        .expect("figures");
    assert_eq!(
        (empty.queued, empty.running, empty.oldest_queued_at),
        (0, 0, None)
    );
    assert_eq!((empty.desktops_known, empty.desktops_online), (0, 0));
    assert!(empty.finished.is_empty());

    // Alice's desktop syncs at an interval; her laptop long-polls.
    w.sync(&w.device, p1(), &[1]).await;
    let long_poll = SyncRequest {
        project: p1(),
        sessions: vec![meta(2)],
        long_poll: true,
        restarted: false,
        running: None,
    };
    w.queue
        .sync(&w.other_device, &long_poll)
        .await
        .expect("sync");
    let first = w.run(&w.agent, 1, "figures-0001").await;
    w.advance(5);
    let second = w.run(&w.agent, 1, "figures-0002").await;
    w.advance(5);
    w.queue
        .start(&w.device, &first.id, &exec("e1"))
        .await
        .expect("start");
    let now = w.clock.now();
    let busy = store
        .queue_figures(within_a_minute(now), EPOCH, now)
        .await
        .expect("figures");
    assert_eq!((busy.queued, busy.running), (1, 1));
    assert_eq!(busy.oldest_queued_at, Some(second.created_at));
    assert_eq!((busy.desktops_known, busy.desktops_online), (2, 2));

    // The run finishes; the other is cancelled before it starts.
    w.advance(3);
    let before_finishing = w.clock.now();
    w.queue
        .complete(&w.device, &first.id, &completed("e1", json!(1)))
        .await
        .expect("complete");
    w.queue
        .cancel_graph_run(&w.agent, &second.id)
        .await
        .expect("cancel");
    // Two minutes later only a desktop whose mode allows that long counts
    // as online: the laptop's rule reaches back three minutes here.
    w.advance(120);
    let now = w.clock.now();
    let later = store
        .queue_figures(
            OnlineSince {
                long_poll: now.minus(Duration::from_secs(180)),
                interval: now.minus(Duration::from_secs(60)),
            },
            before_finishing.minus(Duration::from_millis(1)),
            now,
        )
        .await
        .expect("figures");
    assert_eq!(
        (later.queued, later.running, later.oldest_queued_at),
        (0, 0, None)
    );
    assert_eq!((later.desktops_known, later.desktops_online), (2, 1));
    let mut finished = later.finished.clone();
    finished.sort_by(|a, b| a.status.cmp(&b.status));
    assert_eq!(finished.len(), 2, "{finished:?}");
    let (cancelled, done) = (&finished[0], &finished[1]);
    assert_eq!(cancelled.status, "cancelled");
    assert_eq!(cancelled.pickup, None, "it never started");
    assert_eq!(
        cancelled.cancel,
        Some(Duration::ZERO),
        "a queued run ends when it is cancelled"
    );
    assert_eq!(cancelled.finished_at, before_finishing);
    assert_eq!(done.status, "completed");
    assert_eq!(
        done.pickup,
        Some(Duration::from_secs(10)),
        "queued, then started 10 s later"
    );
    assert_eq!(done.cancel, None);
    assert_eq!(done.finished_at, before_finishing);

    // An interval that ends before they finished holds none of them.
    let none = store
        .queue_figures(
            within_a_minute(now),
            EPOCH,
            before_finishing.minus(Duration::from_millis(1)),
        )
        .await
        .expect("figures");
    assert!(none.finished.is_empty(), "{:?}", none.finished);
}
