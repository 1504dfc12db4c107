//! Lifecycles per second of the memory, SQLite and Postgres stores, in one run.
//!
//! `cargo bench -p graph-relay-store-postgres --bench lifecycles`
//! (Postgres from `GRAPH_RELAY_POSTGRES_URL` or the local server, in a
//! throw-away schema; left out, with a note, under `GRAPH_RELAY_SKIP=postgres`).
//! Run by `cargo test --benches` it only checks that each measurement works.
//!
//! A lifecycle is `run_graph_session → sync → start → complete →
//! get_graph_run` through the core's `Queue`, every step checked. Each store
//! is measured two ways: one lifecycle after another (latency-bound), and 16
//! desktops with one lifecycle each in flight at once (as on a server with
//! many agents). Each figure is the best of three rounds of about
//! `BENCH_SECONDS` (default 2) seconds, after a warm-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use graph_relay_core::store::Store;
use graph_relay_core::testkit::World;
use graph_relay_core::testkit::workload::{Desk, desks, lifecycle};
use graph_relay_store_memory::MemoryStore;
use graph_relay_store_postgres::testing::{TestSchema, url};
use graph_relay_store_sqlite::SqliteStore;

/// Desktops (one lifecycle each) in flight at once in the concurrent variant.
const IN_FLIGHT: u32 = 16;
/// Measured rounds per figure; the best is reported.
const ROUNDS: usize = 3;

/// Lifecycles per second over about `budget`, all `desks` in flight at once.
async fn rate(w: &World, desks: &[Desk], counter: &AtomicU64, budget: Duration) -> f64 {
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        let runs = desks
            .iter()
            .map(|desk| lifecycle(w, desk, counter.fetch_add(1, Ordering::Relaxed)));
        futures::future::join_all(runs).await;
        done += desks.len() as u64;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

/// (one at a time, 16 in flight) lifecycles per second for `store`.
async fn measure(store: Arc<dyn Store>, budget: Duration) -> (f64, f64) {
    let counter = AtomicU64::new(0);
    let w = World::new(store);
    let one = desks(&w, 1).await;
    let many = desks(&w, IN_FLIGHT).await;
    rate(&w, &one, &counter, budget / 4).await;
    rate(&w, &many, &counter, budget / 4).await;
    let mut best = (0.0f64, 0.0f64);
    for _ in 0..ROUNDS {
        best.0 = best.0.max(rate(&w, &one, &counter, budget).await);
        best.1 = best.1.max(rate(&w, &many, &counter, budget).await);
    }
    best
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // then each measurement runs only briefly, to check that it works.
    let measuring = std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_secs_f64(
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if measuring { 2.0 } else { 0.02 }),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rows: Vec<(&str, (f64, f64))> = Vec::new();
    runtime.block_on(async {
        rows.push((
            "memory",
            measure(Arc::new(MemoryStore::new()), budget).await,
        ));
        let sqlite = SqliteStore::open(dir.path().join("bench.sqlite")).expect("open SQLite");
        rows.push(("sqlite", measure(Arc::new(sqlite), budget).await));
    });
    let schema = if cfg!(graph_relay_skip_postgres) {
        eprintln!("postgres left out: GRAPH_RELAY_SKIP names postgres");
        None
    } else {
        Some(TestSchema::new(&url()))
    };
    if let Some(schema) = &schema {
        runtime.block_on(async {
            let store = schema.store().await.expect("connect to Postgres");
            rows.push(("postgres", measure(Arc::new(store), budget).await));
        });
    }
    drop(runtime);
    println!(
        "\nlifecycles/s (run → sync → start → complete → get), best of {ROUNDS} × {:.1} s",
        budget.as_secs_f64()
    );
    println!(
        "{:<10} {:>16} {:>18}",
        "store", "one at a time", "16 in flight"
    );
    for (name, (one, many)) in &rows {
        println!("{name:<10} {one:>16.0} {many:>18.0}");
    }
}
