#![allow(missing_docs)] // criterion macros generate undocumented items
//! Full lifecycle throughput on the memory store:
//! run_graph_session → sync → start → complete → get_graph_run.
//!
//! `cargo bench -p graph-relay-store-memory --bench lifecycle`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::executor::block_on;
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::testkit::{World, completed, exec, meta, p1, run_args};
use graph_relay_store_memory::MemoryStore;
use serde_json::json;

fn lifecycle(c: &mut Criterion) {
    let w = World::new(Arc::new(MemoryStore::new()));
    let sync = SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
    };
    block_on(w.queue.sync(&w.device, &sync)).expect("sync");
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(1));
    group.bench_function("lifecycle", |b| {
        b.iter(|| {
            block_on(async {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let key = format!("bench-key-{n}");
                let ticket = w
                    .queue
                    .run_graph_session(&w.agent, run_args(1, &key, json!({"n": n})))
                    .await
                    .expect("run");
                let queued = w.queue.sync(&w.device, &sync).await.expect("sync");
                assert_eq!(queued.commands.len(), 1);
                let id = ticket.command.id;
                let execution = exec(&format!("exec-{n}"));
                w.queue
                    .start(&w.device, &id, &execution)
                    .await
                    .expect("start");
                w.queue
                    .complete(
                        &w.device,
                        &id,
                        &completed(execution.as_str(), json!({"ok": n})),
                    )
                    .await
                    .expect("complete");
                let view = w.queue.get_graph_run(&w.agent, &id).await.expect("get");
                assert!(view.command.status.is_terminal());
            })
        })
    });
    group.finish();
}

criterion_group!(benches, lifecycle);
criterion_main!(benches);
