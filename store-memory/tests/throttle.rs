//! The queue writes a device's liveness and shared sessions at most once per
//! `touch_interval` when nothing changed, and at once when something did.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{EPOCH, World, meta, p1};
use graph_relay_core::time::Timestamp;
use graph_relay_store_memory::MemoryStore;

fn world() -> (World, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (World::new(store.clone()), store)
}

fn last_sync(w: &World, store: &MemoryStore) -> Option<Timestamp> {
    block_on(store.device(&w.device.owner, &w.device.id))
        .expect("device")
        .and_then(|d| d.last_sync_at)
}

fn synced_at(w: &World) -> Vec<Timestamp> {
    block_on(w.queue.list_graph_sessions(&w.agent, &p1(), 50))
        .expect("list")
        .sessions
        .iter()
        .map(|s| s.synced_at)
        .collect()
}

fn sync(w: &World, sessions: &[u32], long_poll: bool) {
    let request = SyncRequest {
        project: p1(),
        sessions: sessions.iter().map(|n| meta(*n)).collect(),
        long_poll,
        restarted: false,
        running: None,
    };
    block_on(w.queue.sync(&w.device, &request)).expect("sync");
}

#[test]
fn an_unchanged_sync_within_the_interval_is_not_rewritten() {
    let (w, store) = world();
    sync(&w, &[1], false);
    assert_eq!(last_sync(&w, &store), Some(EPOCH));
    w.clock.advance(Duration::from_millis(400));
    sync(&w, &[1], false);
    assert_eq!(
        last_sync(&w, &store),
        Some(EPOCH),
        "repeat within 1 s skipped"
    );
    assert_eq!(synced_at(&w), vec![EPOCH]);
    w.clock.advance(Duration::from_millis(600));
    sync(&w, &[1], false);
    let later = EPOCH.plus(Duration::from_secs(1));
    assert_eq!(
        last_sync(&w, &store),
        Some(later),
        "written once the interval passed"
    );
    assert_eq!(synced_at(&w), vec![later]);
}

#[test]
fn a_changed_sync_is_written_at_once() {
    let (w, store) = world();
    sync(&w, &[1], false);
    w.clock.advance(Duration::from_millis(10));
    sync(&w, &[1, 2], false);
    let t1 = EPOCH.plus(Duration::from_millis(10));
    assert_eq!(last_sync(&w, &store), Some(t1));
    assert_eq!(synced_at(&w), vec![t1, t1]);
    // Un-sharing shows at once too.
    w.clock.advance(Duration::from_millis(10));
    sync(&w, &[2], false);
    assert_eq!(synced_at(&w).len(), 1);
    // So does a change of mode.
    w.clock.advance(Duration::from_millis(10));
    sync(&w, &[2], true);
    let device = block_on(store.device(&w.device.owner, &w.device.id))
        .expect("device")
        .expect("seen");
    assert!(device.long_poll);
    assert_eq!(
        device.last_sync_at,
        Some(EPOCH.plus(Duration::from_millis(30)))
    );
}

#[test]
fn a_clock_that_moves_back_writes_again() {
    let (w, store) = world();
    w.clock.advance(Duration::from_secs(5));
    sync(&w, &[1], false);
    w.clock.set(EPOCH);
    sync(&w, &[1], false);
    // The store keeps the latest stamp it saw; the sync was not skipped as
    // "recent", so the device was touched (max of both stamps).
    assert_eq!(
        last_sync(&w, &store),
        Some(EPOCH.plus(Duration::from_secs(5)))
    );
    assert_eq!(synced_at(&w), vec![EPOCH]);
}

#[test]
fn the_same_device_id_of_another_owner_is_not_confused() {
    use graph_relay_core::ids::OwnerId;
    use graph_relay_core::principal::Device;
    let (w, store) = world();
    let twin = Device::new(
        w.device.id.clone(),
        OwnerId::parse("mallory").expect("owner"),
    );
    sync(&w, &[1], false);
    block_on(w.queue.sync(
        &twin,
        &SyncRequest {
            project: p1(),
            sessions: vec![meta(1)],
            long_poll: false,
            restarted: false,
            running: None,
        },
    ))
    .expect("sync");
    let seen = block_on(store.device(&twin.owner, &twin.id)).expect("device");
    assert_eq!(
        seen.and_then(|d| d.last_sync_at),
        Some(EPOCH),
        "written, not skipped"
    );
    // Alice's next repeat is still recognised as recent.
    w.clock.advance(Duration::from_millis(100));
    sync(&w, &[1], false);
    assert_eq!(last_sync(&w, &store), Some(EPOCH));
}

/// A held sync (an idle long-polling desktop's wait) that repeats what was
/// written is written again only once a hold has passed, and its stamps
/// never lag enough for the desktop to look offline.
#[test]
fn a_repeated_held_sync_is_written_once_per_hold() {
    let (w, store) = world();
    let hold = w.queue.config().long_poll_hold;
    sync(&w, &[1], true);
    assert_eq!(last_sync(&w, &store), Some(EPOCH));
    // The next held sync, a hold less its jitter later, is not written.
    w.clock.advance(hold - Duration::from_secs(3));
    sync(&w, &[1], true);
    assert_eq!(last_sync(&w, &store), Some(EPOCH), "repeat within a hold");
    assert_eq!(synced_at(&w), vec![EPOCH]);
    // The one after is.
    w.clock.advance(hold - Duration::from_secs(3));
    sync(&w, &[1], true);
    let later = EPOCH.plus((hold - Duration::from_secs(3)) * 2);
    assert_eq!(last_sync(&w, &store), Some(later), "written after a hold");
    assert_eq!(synced_at(&w), vec![later]);
    // A held sync that changes the sessions is written at once.
    w.clock.advance(Duration::from_secs(1));
    sync(&w, &[1, 2], true);
    let changed = later.plus(Duration::from_secs(1));
    assert_eq!(last_sync(&w, &store), Some(changed));
    assert_eq!(synced_at(&w), vec![changed, changed]);
    // An unheld sync keeps the short interval: two seconds on, it is
    // written although a held one would not be.
    w.clock.advance(Duration::from_secs(2));
    sync(&w, &[1, 2], false);
    assert_eq!(
        last_sync(&w, &store),
        Some(changed.plus(Duration::from_secs(2)))
    );
}

#[test]
fn a_desktop_held_all_day_never_looks_offline() {
    let (w, _store) = world();
    let hold = w.queue.config().long_poll_hold;
    sync(&w, &[1], true);
    let queued = block_on(w.run(&w.agent, 1, "offline-check-key"));
    // Held syncs a full hold apart (no jitter: the longest gap between
    // two). The run stays queued (nothing claims it), so every read of it
    // asks whether its desktop looks offline.
    for _ in 0..20 {
        w.clock.advance(hold);
        sync(&w, &[1], true);
        let view = block_on(w.queue.get_graph_run(&w.agent, &queued.id)).expect("get");
        assert_eq!(view.device_offline_since, None);
    }
}
