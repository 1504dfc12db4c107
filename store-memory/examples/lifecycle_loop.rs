//! Runs N full lifecycles (run → sync → start → complete → get) on the memory
//! store and prints the rate; under `valgrind --tool=callgrind` it gives a
//! load-independent instruction count per lifecycle:
//! `cargo build --release -p graph-relay-store-memory --example lifecycle_loop &&
//!  valgrind --tool=callgrind target/release/examples/lifecycle_loop 20000`

use std::sync::Arc;
use std::time::Instant;

use futures::executor::block_on;
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::testkit::{World, completed, exec, meta, p1, run_args};
use graph_relay_store_memory::MemoryStore;
use serde_json::json;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let w = World::new(Arc::new(MemoryStore::new()));
    let sync = SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
    };
    block_on(w.queue.sync(&w.device, &sync)).expect("sync");
    let started = Instant::now();
    block_on(async {
        for i in 0..n {
            let key = format!("loop-key-{i}");
            let ticket = w
                .queue
                .run_graph_session(&w.agent, run_args(1, &key, json!({"n": i})))
                .await
                .expect("run");
            w.queue.sync(&w.device, &sync).await.expect("sync");
            let execution = exec(&format!("exec-{i}"));
            w.queue
                .start(&w.device, &ticket.command.id, &execution)
                .await
                .expect("start");
            w.queue
                .complete(
                    &w.device,
                    &ticket.command.id,
                    &completed(execution.as_str(), json!({"ok": i})),
                )
                .await
                .expect("complete");
            let view = w
                .queue
                .get_graph_run(&w.agent, &ticket.command.id)
                .await
                .expect("get");
            assert!(view.command.status.is_terminal());
        }
    });
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} lifecycles in {secs:.3} s: {:.0} lifecycles/s",
        n as f64 / secs
    );
}
