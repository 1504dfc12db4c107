#![allow(missing_docs)] // criterion macros generate undocumented items
//! Full lifecycle throughput on the memory store:
//! run_graph_session → sync → start → complete → get_graph_run
//! (`graph_relay_core::testkit::workload`).
//!
//! `cargo bench -p graph-relay-store-memory --bench lifecycle`
//!
//! - `memory/lifecycle`: the steady state of a long-running server: keys
//!   expire and a pruning step runs every 100 lifecycles (included in the
//!   time), so the store holds about 10,000 commands throughout.
//! - `memory/lifecycle-growing`: nothing expires; the store grows by one
//!   command per iteration (millions by the end), so this one also pays for
//!   fresh memory pages and larger maps.

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::executor::block_on;
use graph_relay_core::testkit::workload::Workload;
use graph_relay_store_memory::MemoryStore;

fn lifecycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(1));
    let mut steady = Workload::steady(Arc::new(MemoryStore::new()));
    // Fill the store to its steady size before measuring.
    block_on(async {
        for _ in 0..20_000 {
            steady.lifecycle().await;
        }
    });
    group.bench_function("lifecycle", |b| {
        b.iter(|| block_on(steady.lifecycle()));
    });
    let mut growing = Workload::growing(Arc::new(MemoryStore::new()));
    group.bench_function("lifecycle-growing", |b| {
        b.iter(|| block_on(growing.lifecycle()));
    });
    group.finish();
}

criterion_group!(benches, lifecycle);
criterion_main!(benches);
