//! The core's store conformance suite, run unchanged against `MemoryStore`.

use graph_relay_store_memory::MemoryStore;

graph_relay_core::store_conformance_suite!(futures::executor::block_on, async {
    MemoryStore::new()
});

mod outbox {
    use graph_relay_store_memory::MemoryOutbox;

    graph_relay_core::outbox_conformance_suite!(futures::executor::block_on, async {
        MemoryOutbox::new()
    });
}
