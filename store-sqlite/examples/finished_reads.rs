//! Times `get_graph_run` of a finished run on a SQLite store: through the
//! queue, which answers it from its cache of finished runs, against the
//! store read that every such call made before (`command_for_agent`, the
//! rest of the call costs nothing for a finished run). Once with a small
//! result, once with a result near the envelope limit.
//!
//! ```text
//! cargo run --release -p graph-relay-store-sqlite --example finished_reads [reads]
//! ```

use std::sync::Arc;
use std::time::Instant;

use futures::executor::block_on;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::CommandId;
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{World, completed, exec, p1};
use graph_relay_store_sqlite::SqliteStore;
use serde_json::{Value, json};

/// A run of `w`'s agent, finished through `w`'s queue with `result`.
fn finished_run(w: &World, key: &str, result: Value) -> CommandId {
    let run = block_on(w.run(&w.agent, 1, key));
    let execution = format!("exec-{key}");
    block_on(w.queue.start(&w.device, &run.id, &exec(&execution))).expect("start");
    block_on(
        w.queue
            .complete(&w.device, &run.id, &completed(&execution, result)),
    )
    .expect("complete");
    run.id
}

/// Microseconds per call of `read`, `n` calls.
fn per_call(n: u32, mut read: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        read();
    }
    started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path().join("reads.sqlite")).expect("open"));
    let w = World::new(store.clone());
    block_on(w.sync(&w.device, p1(), &[1]));
    let large = Value::String("x".repeat(90_000));
    for (what, result) in [
        ("small result", json!({"ok": true})),
        ("90 KB result", large),
    ] {
        let id = finished_run(&w, &what.replace(' ', "-"), result);
        let statements = store.statements_executed();
        let cached = per_call(n, || {
            let view = block_on(w.queue.get_graph_run(&w.agent, &id)).expect("get");
            assert_eq!(view.command.status, CommandStatus::Completed);
        });
        let sent = store.statements_executed() - statements;
        let stored = per_call(n, || {
            let record = block_on(store.command_for_agent(&w.agent.owner, &w.agent.id, &id))
                .expect("read")
                .expect("found");
            assert_eq!(record.status, CommandStatus::Completed);
        });
        println!(
            "{what}: get_graph_run {cached:.2} µs ({sent} statements in {n} calls); \
             the store read it replaced {stored:.2} µs"
        );
    }
}
