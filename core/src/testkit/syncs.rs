//! The conformance scenario of [`Store::record_sync`]: whatever shortcut a
//! store takes for a sync that repeats what is stored, afterwards the store
//! is as if the sessions had been replaced and the contact recorded, also
//! when another writer (another server, another process on the file)
//! changed the device's sessions in between.

use std::sync::Arc;

use super::{meta, p1, p2};
use crate::ids::{DeviceId, OwnerId};
use crate::session::SessionMeta;
use crate::store::Store;
use crate::time::Timestamp;

fn owner() -> OwnerId {
    OwnerId::parse("alice").expect("owner")
}

fn desk() -> DeviceId {
    DeviceId::parse("desk-sync").expect("device")
}

/// The device's shares to project 1, as (session name, synced at), sorted.
async fn shares(store: &dyn Store) -> Vec<(String, Timestamp)> {
    let mut found: Vec<(String, Timestamp)> = store
        .shared_sessions(&owner(), &p1(), 100)
        .await
        .expect("shared sessions")
        .into_iter()
        .filter(|s| s.device == desk())
        .map(|s| (s.meta.name.to_string(), s.synced_at))
        .collect();
    found.sort();
    found
}

/// Records a sync of `sessions` at `at` seconds, long-polling.
async fn sync(store: &dyn Store, sessions: &[SessionMeta], at: u64) {
    store
        .record_sync(
            &owner(),
            &p1(),
            &desk(),
            sessions,
            true,
            Timestamp(at * 1000),
        )
        .await
        .expect("record_sync");
}

/// A repeated sync moves the stamps; a changed one (by this writer or by
/// another) replaces the rows; the contact follows every sync; other
/// projects are left alone.
pub async fn record_sync(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let t = |s: u64| Timestamp(s * 1000);
    // Another project's share of the same device stays as it is throughout.
    store
        .replace_shared_sessions(&owner(), &p2(), &desk(), &[meta(9)], t(1))
        .await
        .expect("replace");

    sync(store, &[meta(1), meta(2)], 10).await;
    let named = |pairs: &[(u32, u64)]| -> Vec<(String, Timestamp)> {
        pairs
            .iter()
            .map(|&(n, at)| (meta(n).name.to_string(), t(at)))
            .collect()
    };
    assert_eq!(shares(store).await, named(&[(1, 10), (2, 10)]));

    // The same sessions, in another order: the stamps move.
    sync(store, &[meta(2), meta(1)], 40).await;
    assert_eq!(shares(store).await, named(&[(1, 40), (2, 40)]));
    let device = store.device(&owner(), &desk()).await.expect("device");
    let device = device.expect("the sync recorded the device");
    assert_eq!(
        (device.last_sync_at, device.last_seen_at, device.long_poll),
        (Some(t(40)), t(40), true)
    );

    // Another writer shares only session 3; a sync of 1 and 2 restores
    // them, although this writer wrote exactly that before.
    store
        .replace_shared_sessions(&owner(), &p1(), &desk(), &[meta(3)], t(50))
        .await
        .expect("replace");
    sync(store, &[meta(1), meta(2)], 60).await;
    assert_eq!(shares(store).await, named(&[(1, 60), (2, 60)]));

    // The same session with other metadata replaces it.
    let mut renamed = meta(2);
    renamed.name = "Graph 2, renamed".into();
    sync(store, &[meta(1), renamed.clone()], 70).await;
    let mut want = vec![
        (meta(1).name.to_string(), t(70)),
        (renamed.name.to_string(), t(70)),
    ];
    want.sort();
    assert_eq!(shares(store).await, want);

    // Fewer sessions, then none.
    sync(store, &[meta(1)], 80).await;
    assert_eq!(shares(store).await, named(&[(1, 80)]));
    sync(store, &[], 90).await;
    assert_eq!(shares(store).await, Vec::new());
    let device = store.device(&owner(), &desk()).await.expect("device");
    assert_eq!(device.map(|d| d.last_sync_at), Some(Some(t(90))));

    let other = store
        .shared_sessions(&owner(), &p2(), 100)
        .await
        .expect("shared sessions");
    assert_eq!(other.len(), 1);
    assert_eq!(
        (other[0].meta.name.as_ref(), other[0].synced_at),
        (meta(9).name.as_ref(), t(1))
    );
}
