//! The core's store conformance suite, run unchanged against a
//! [`TimedStore`](graph_relay_transport_http::store_timing::TimedStore)
//! over `MemoryStore`: timing a store changes nothing it does.

use std::sync::Arc;

use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::metrics::Metrics;

graph_relay_core::store_conformance_suite!(futures::executor::block_on, async {
    Metrics::new(None).timed_store(Arc::new(MemoryStore::new()))
});
