//! A desktop's contacts other than syncs (start, control, result, …) are
//! gathered by the queue and written together: one store write per
//! maintenance step for every desktop, not one per request. The queue's
//! own reads see them before they are written, a failed write loses none,
//! and a queue that runs no maintenance still writes them once they pile up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::executor::block_on;
use futures::future::BoxFuture;
use graph_relay_core::ids::{CommandId, DeviceId, OwnerId};
use graph_relay_core::principal::Device;
use graph_relay_core::queue::{
    CONTACTS_PER_WRITE, ControlError, MAX_PENDING_CONTACTS, QueueConfig,
};
use graph_relay_core::store::{DeviceRecord, LayeredStore, Store, StoreError, StoreLayer};
use graph_relay_core::testkit::{World, completed, exec, p1};
use graph_relay_core::time::{Clock, ThreadSleeper, Timestamp};
use graph_relay_store_memory::MemoryStore;

/// Keeps the name of every store call that writes liveness, and refuses
/// `touch_devices` while `refuse` is set.
#[derive(Default)]
struct LivenessWrites {
    calls: Mutex<Vec<&'static str>>,
    refuse: AtomicBool,
}

impl LivenessWrites {
    fn taken(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().expect("lock"))
    }
}

struct Watch(Arc<LivenessWrites>);

impl StoreLayer for Watch {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            if operation.starts_with("touch_device") {
                self.0.calls.lock().expect("lock").push(operation);
                if operation == "touch_devices" && self.0.refuse.load(Ordering::SeqCst) {
                    return Err(StoreError::Backend("refused by the test".into()));
                }
            }
            call.await
        })
    }
}

/// A world over a watched memory store; the store itself, unwatched, to
/// read what was written.
fn world() -> (World, Arc<LivenessWrites>, Arc<MemoryStore>) {
    let memory = Arc::new(MemoryStore::new());
    let writes = Arc::new(LivenessWrites::default());
    let store = LayeredStore::new(memory.clone(), Watch(writes.clone()));
    let w = World::with_config(Arc::new(store), QueueConfig::default());
    (w, writes, memory)
}

fn stored(store: &MemoryStore, device: &Device) -> Option<DeviceRecord> {
    block_on(store.device(&device.owner, &device.id)).expect("device")
}

/// A control request about a run that does not exist: the desktop is
/// seen all the same.
fn contact(w: &World, device: &Device) {
    let unknown = CommandId::parse("00000000-0000-7000-8000-000000c0ffee").expect("an id");
    let answer = block_on(w.queue.control(device, &unknown));
    assert!(matches!(answer, Err(ControlError::NotFound)), "{answer:?}");
}

#[test]
fn contacts_of_every_desktop_are_written_together_by_maintenance() {
    let (w, writes, memory) = world();
    block_on(w.sync(&w.device, p1(), &[1]));
    block_on(w.sync(&w.stranger_device, p1(), &[2]));
    let synced = w.clock.now();
    writes.taken();

    // A run's start and, 2 s later, its result; meanwhile another owner's
    // desktop is seen too.
    let queued = block_on(w.run(&w.agent, 1, "contacts-1"));
    w.advance(1);
    let execution = exec("contacts-exec");
    block_on(w.queue.start(&w.device, &queued.id, &execution)).expect("start");
    contact(&w, &w.stranger_device);
    w.advance(2);
    let finished = w.clock.now();
    block_on(w.queue.complete(
        &w.device,
        &queued.id,
        &completed("contacts-exec", serde_json::json!({"ok": true})),
    ))
    .expect("complete");
    assert_eq!(
        writes.taken(),
        Vec::<&str>::new(),
        "no request wrote liveness"
    );
    assert_eq!(
        stored(&memory, &w.device).expect("synced").last_seen_at,
        synced
    );

    block_on(w.queue.maintain()).expect("maintain");
    assert_eq!(
        writes.taken(),
        ["touch_devices"],
        "one write for both desktops"
    );
    let desktop = stored(&memory, &w.device).expect("seen");
    assert_eq!(desktop.last_seen_at, finished, "the latest contact");
    assert_eq!(
        desktop.last_sync_at,
        Some(synced),
        "a contact is not a sync"
    );
    assert_eq!(
        stored(&memory, &w.stranger_device)
            .expect("seen")
            .last_seen_at,
        synced.plus(Duration::from_secs(1))
    );

    // Nothing gathered since: the next step writes nothing.
    block_on(w.queue.maintain()).expect("maintain");
    assert_eq!(writes.taken(), Vec::<&str>::new());
}

#[test]
fn the_queue_reads_the_contacts_it_has_not_written() {
    let (w, writes, memory) = world();
    block_on(w.sync(&w.device, p1(), &[1]));
    let synced = w.clock.now();
    let queued = block_on(w.run(&w.agent, 1, "contacts-2"));
    // Silent for 100 s: the ticket's reader is told the desktop is offline.
    w.advance(100);
    let view = block_on(w.queue.get_graph_run(&w.agent, &queued.id)).expect("get");
    assert_eq!(view.device_offline_since, Some(synced));

    // The desktop is seen again; its liveness is not written yet, and the
    // queue's copy of the record it read is stale by the next second.
    contact(&w, &w.device);
    w.advance(2);
    assert_eq!(
        stored(&memory, &w.device).expect("synced").last_seen_at,
        synced
    );
    let view = block_on(w.queue.get_graph_run(&w.agent, &queued.id)).expect("get");
    assert_eq!(
        view.device_offline_since, None,
        "the unwritten contact counts"
    );
    assert_eq!(writes.taken(), Vec::<&str>::new());
}

#[test]
fn a_failed_write_keeps_the_contacts_for_the_next_step() {
    let (w, writes, memory) = world();
    block_on(w.sync(&w.device, p1(), &[1]));
    let synced = w.clock.now();
    w.advance(3);
    let seen = w.clock.now();
    contact(&w, &w.device);
    writes.refuse.store(true, Ordering::SeqCst);
    assert!(
        block_on(w.queue.maintain()).is_err(),
        "the outage is reported"
    );
    assert_eq!(
        stored(&memory, &w.device).expect("synced").last_seen_at,
        synced
    );

    // Seen again meanwhile: the next step writes the later of the two.
    w.advance(2);
    contact(&w, &w.device);
    writes.refuse.store(false, Ordering::SeqCst);
    assert_eq!(block_on(w.queue.flush_contacts()).expect("flush"), 1);
    assert_eq!(
        stored(&memory, &w.device).expect("seen").last_seen_at,
        seen.plus(Duration::from_secs(2))
    );
    assert_eq!(writes.taken(), ["touch_devices", "touch_devices"]);
}

#[test]
fn piled_up_contacts_are_written_by_the_request_that_finds_them() {
    let (w, writes, memory) = world();
    let owner = OwnerId::parse("crowd").expect("owner");
    let desktops: Vec<Device> = (0..MAX_PENDING_CONTACTS)
        .map(|i| {
            Device::new(
                DeviceId::parse(&format!("desk-{i}")).expect("id"),
                owner.clone(),
            )
        })
        .collect();
    for desktop in &desktops[..MAX_PENDING_CONTACTS - 1] {
        contact(&w, desktop);
    }
    assert_eq!(writes.taken(), Vec::<&str>::new(), "still gathering");
    contact(&w, &desktops[MAX_PENDING_CONTACTS - 1]);
    assert_eq!(
        writes.taken().len(),
        MAX_PENDING_CONTACTS.div_ceil(CONTACTS_PER_WRITE),
        "every contact, in bounded batches"
    );
    for desktop in [&desktops[0], &desktops[MAX_PENDING_CONTACTS - 1]] {
        assert_eq!(
            stored(&memory, desktop).expect("seen").last_seen_at,
            w.clock.now()
        );
    }
    assert_eq!(block_on(w.queue.flush_contacts()).expect("flush"), 0);
}

#[test]
fn maintenance_writes_the_last_contacts_when_it_ends() {
    let (w, writes, memory) = world();
    contact(&w, &w.device);
    let seen: Timestamp = w.clock.now();
    let mut steps = 0;
    // Already told to stop: no step runs, but the contacts are written.
    block_on(
        w.queue
            .run_maintenance(&ThreadSleeper, std::future::ready(()), |_| steps += 1),
    );
    assert_eq!(steps, 0);
    assert_eq!(writes.taken(), ["touch_devices"]);
    assert_eq!(stored(&memory, &w.device).expect("seen").last_seen_at, seen);
}
