//! `PostgresStore::record_sync`, the write of every sync: a sync that
//! repeats the stored sessions is one statement (stamps moved, contact
//! recorded); one that differs replaces the sessions, judged against the
//! database, so also when the stored ones were written through another
//! store (another server) since.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use graph_relay_core::ids::{DeviceId, OwnerId, ProjectId};
use graph_relay_core::session::SessionMeta;
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{gs, meta, p1, p2};
use graph_relay_core::time::Timestamp;
use graph_relay_store_postgres::PostgresStore;
use graph_relay_store_postgres::testing::{TestSchema, url};

fn owner() -> OwnerId {
    OwnerId::parse("owner").expect("owner")
}

fn desk(name: &str) -> DeviceId {
    DeviceId::parse(name).expect("device")
}

/// What (owner, project) shows: (session, device, stamp) in the store's order.
async fn shared(store: &PostgresStore, project: &ProjectId) -> Vec<(String, String, u64)> {
    store
        .shared_sessions(&owner(), project, 100)
        .await
        .expect("shared sessions")
        .into_iter()
        .map(|s| {
            (
                s.meta.graph_session_id.as_str().to_owned(),
                s.device.as_str().to_owned(),
                s.synced_at.0,
            )
        })
        .collect()
}

/// `record_sync` of `device` into `project` at `at`; the statements it sent.
async fn sync(
    store: &PostgresStore,
    project: &ProjectId,
    device: &str,
    sessions: &[SessionMeta],
    long_poll: bool,
    at: u64,
) -> u64 {
    let before = store.statements_executed();
    store
        .record_sync(
            &owner(),
            project,
            &desk(device),
            sessions,
            long_poll,
            Timestamp(at),
        )
        .await
        .expect("record_sync");
    store.statements_executed() - before
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_sync_is_one_statement_that_moves_the_stamps_and_records_the_contact() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");

    // First sync: nothing stored, so the sessions are written (the
    // comparing statement, then the locked replacement: 1 + 5).
    assert_eq!(
        sync(&store, &p1(), "d1", &[meta(1), meta(2)], true, 1_000).await,
        6
    );
    assert_eq!(
        shared(&store, &p1()).await,
        vec![
            (gs(1).as_str().to_owned(), "d1".to_owned(), 1_000),
            (gs(2).as_str().to_owned(), "d1".to_owned(), 1_000),
        ]
    );

    // The same sessions again (in another order): one statement.
    assert_eq!(
        sync(&store, &p1(), "d1", &[meta(2), meta(1)], false, 5_000).await,
        1
    );
    assert_eq!(
        shared(&store, &p1()).await,
        vec![
            (gs(1).as_str().to_owned(), "d1".to_owned(), 5_000),
            (gs(2).as_str().to_owned(), "d1".to_owned(), 5_000),
        ],
        "the stamps moved"
    );
    let device = store
        .device(&owner(), &desk("d1"))
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(device.last_sync_at, Some(Timestamp(5_000)));
    assert_eq!(device.last_seen_at, Timestamp(5_000));
    assert!(!device.long_poll, "the mode of the last sync");

    // An older sync arriving late moves no stamp back.
    assert_eq!(
        sync(&store, &p1(), "d1", &[meta(1), meta(2)], true, 3_000).await,
        1
    );
    assert_eq!(shared(&store, &p1()).await[0].2, 5_000);
    let device = store
        .device(&owner(), &desk("d1"))
        .await
        .expect("device")
        .expect("seen");
    assert_eq!(device.last_sync_at, Some(Timestamp(5_000)));

    // Sharing nothing, again and again, is one statement too.
    assert_eq!(sync(&store, &p2(), "d1", &[], true, 6_000).await, 1);
    assert!(shared(&store, &p2()).await.is_empty());
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_sync_replaces_the_sessions_of_that_device_only() {
    let url = url();
    let schema = TestSchema::new(&url);
    let store = schema.store().await.expect("connect");
    sync(&store, &p1(), "d1", &[meta(1), meta(2)], true, 1_000).await;
    sync(&store, &p1(), "d2", &[meta(3)], true, 1_000).await;

    // One session fewer.
    assert_eq!(sync(&store, &p1(), "d1", &[meta(1)], true, 2_000).await, 6);
    // The same id with other metadata is a change too.
    let mut renamed = meta(1);
    renamed.name = "Renamed".into();
    assert_eq!(
        sync(
            &store,
            &p1(),
            "d1",
            std::slice::from_ref(&renamed),
            true,
            3_000
        )
        .await,
        6
    );
    let sessions = store
        .shared_sessions(&owner(), &p1(), 100)
        .await
        .expect("shared");
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert_eq!(sessions[0].meta, renamed);
    assert_eq!(sessions[0].synced_at, Timestamp(3_000));
    assert_eq!(sessions[1].meta, meta(3), "another device's share is kept");
    assert_eq!(sessions[1].synced_at, Timestamp(1_000));

    // Sharing nothing removes them.
    assert_eq!(sync(&store, &p1(), "d1", &[], true, 4_000).await, 6);
    assert_eq!(
        shared(&store, &p1()).await,
        vec![(gs(3).as_str().to_owned(), "d2".to_owned(), 1_000)]
    );
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_written_through_another_store_is_seen_and_replaced() {
    let url = url();
    let schema = TestSchema::new(&url);
    // Two servers on one database.
    let a = schema.store().await.expect("connect a");
    let b = schema.store().await.expect("connect b");

    assert_eq!(sync(&a, &p1(), "d1", &[meta(1)], true, 1_000).await, 6);
    // The desktop moved to server b and shared another session there.
    assert_eq!(sync(&b, &p1(), "d1", &[meta(2)], true, 2_000).await, 6);
    // Back on a with what a wrote last: a must not take it as unchanged.
    assert_eq!(sync(&a, &p1(), "d1", &[meta(1)], true, 3_000).await, 6);
    assert_eq!(
        shared(&b, &p1()).await,
        vec![(gs(1).as_str().to_owned(), "d1".to_owned(), 3_000)]
    );
    // b un-shares; a's repeat of its last write shares again.
    assert_eq!(sync(&b, &p1(), "d1", &[], true, 4_000).await, 6);
    assert_eq!(sync(&a, &p1(), "d1", &[meta(1)], true, 5_000).await, 6);
    assert_eq!(
        shared(&b, &p1()).await,
        vec![(gs(1).as_str().to_owned(), "d1".to_owned(), 5_000)]
    );
    // And what b now repeats is unchanged for b.
    assert_eq!(sync(&b, &p1(), "d1", &[meta(1)], true, 6_000).await, 1);
}
