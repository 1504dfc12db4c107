//! Lifecycles per second of the memory, SQLite and Postgres stores, in one run.
//!
//! `cargo bench -p graph-relay-store-postgres --bench lifecycles`
//! (Postgres from `GRAPH_RELAY_POSTGRES_URL` or the local server, in a
//! throw-away schema; left out, with a note, under `GRAPH_RELAY_SKIP=postgres`).
//! Run by `cargo test --benches` it only checks that each measurement works.
//!
//! A lifecycle is `run_graph_session → sync → start → complete →
//! get_graph_run` through the core's `Queue`, every step checked. Each store
//! is measured three ways: one lifecycle after another (latency-bound), and
//! 16 and 64 desktops with one lifecycle each in flight at once (as on a
//! server with many agents). Each figure is the best of three rounds of
//! about `BENCH_SECONDS` (default 2) seconds, after a warm-up.
//!
//! `BENCH_STORES` (comma-separated, default `memory,sqlite,postgres`)
//! picks the stores, e.g. `BENCH_STORES=postgres` to compare two builds of
//! the Postgres store run after one another. The Postgres store has the
//! default pool size (16), or `BENCH_PG_POOL` connections, and its
//! connections are named `graph-relay-bench` (`application_name`), so its
//! server processes can be told from others'. Below the table, the
//! Postgres store's statements per lifecycle in each variant (over all
//! measured rounds): requests in flight together share statements.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use graph_relay_core::store::Store;
use graph_relay_core::testkit::World;
use graph_relay_core::testkit::workload::{Desk, desks, lifecycle};
use graph_relay_store_memory::MemoryStore;
use graph_relay_store_postgres::testing::{TestSchema, url};
use graph_relay_store_postgres::{PostgresOptions, PostgresStore};
use graph_relay_store_sqlite::SqliteStore;

/// Desktops (one lifecycle each) in flight at once in the concurrent variants.
const IN_FLIGHT: [u32; 2] = [16, 64];
/// Measured rounds per figure; the best is reported.
const ROUNDS: usize = 3;

/// (lifecycles per second, lifecycles run) over about `budget`, all
/// `desks` in flight at once.
async fn rate(w: &World, desks: &[Desk], counter: &AtomicU64, budget: Duration) -> (f64, u64) {
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        let runs = desks
            .iter()
            .map(|desk| lifecycle(w, desk, counter.fetch_add(1, Ordering::Relaxed)));
        futures::future::join_all(runs).await;
        done += desks.len() as u64;
    }
    (done as f64 / start.elapsed().as_secs_f64(), done)
}

/// One store's figures, one per variant (one at a time, then each of [`IN_FLIGHT`]).
struct Figures {
    /// The best round's lifecycles per second.
    rate: [f64; 3],
    /// Statements per lifecycle over all measured rounds, where counted.
    statements: Option<[f64; 3]>,
}

/// Measures `store`; `statements` reads its statement count, if it keeps one.
async fn measure(
    store: Arc<dyn Store>,
    budget: Duration,
    statements: Option<&dyn Fn() -> u64>,
) -> Figures {
    let counter = AtomicU64::new(0);
    let w = World::new(store);
    // Desk k of every variant is the same desktop: each variant's desks
    // are the first n of the largest set.
    let all = desks(&w, IN_FLIGHT[1]).await;
    let variants = [&all[..1], &all[..IN_FLIGHT[0] as usize], &all[..]];
    for desks in variants {
        rate(&w, desks, &counter, budget / 4).await;
    }
    let mut best = [0.0f64; 3];
    let mut sent = [0u64; 3];
    let mut done = [0u64; 3];
    for _ in 0..ROUNDS {
        for (i, desks) in variants.iter().enumerate() {
            let before = statements.map_or(0, |count| count());
            let (rate, lifecycles) = rate(&w, desks, &counter, budget).await;
            best[i] = best[i].max(rate);
            sent[i] += statements.map_or(0, |count| count()) - before;
            done[i] += lifecycles;
        }
    }
    Figures {
        rate: best,
        statements: statements.map(|_| std::array::from_fn(|i| sent[i] as f64 / done[i] as f64)),
    }
}

/// Whether `BENCH_STORES` (all stores when unset) names `store`.
fn selected(store: &str) -> bool {
    match std::env::var("BENCH_STORES") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|s| s.trim() == store),
        _ => true,
    }
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
    let mut rows: Vec<(&str, Figures)> = Vec::new();
    runtime.block_on(async {
        if selected("memory") {
            rows.push((
                "memory",
                measure(Arc::new(MemoryStore::new()), budget, None).await,
            ));
        }
        if selected("sqlite") {
            let sqlite = SqliteStore::open(dir.path().join("bench.sqlite")).expect("open SQLite");
            rows.push(("sqlite", measure(Arc::new(sqlite), budget, None).await));
        }
    });
    let schema = if !selected("postgres") {
        None
    } else if cfg!(graph_relay_skip_postgres) {
        eprintln!("postgres left out: GRAPH_RELAY_SKIP names postgres");
        None
    } else {
        Some(TestSchema::new(&url()))
    };
    if let Some(schema) = &schema {
        runtime.block_on(async {
            // The store's default pool size (not the tests' smaller pool),
            // unless `BENCH_PG_POOL` says otherwise.
            let options = PostgresOptions {
                pool_size: std::env::var("BENCH_PG_POOL")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(PostgresOptions::default().pool_size),
                application_name: "graph-relay-bench".into(),
                ..schema.options()
            };
            let store = PostgresStore::connect(schema.url(), &options)
                .await
                .expect("connect to Postgres");
            let count = || store.statements_executed();
            let figures = measure(Arc::new(store.clone()), budget, Some(&count)).await;
            rows.push(("postgres", figures));
        });
    }
    drop(runtime);
    println!(
        "\nlifecycles/s (run → sync → start → complete → get), best of {ROUNDS} × {:.1} s",
        budget.as_secs_f64()
    );
    println!(
        "{:<10} {:>16} {:>18} {:>18}",
        "store", "one at a time", "16 in flight", "64 in flight"
    );
    for (name, figures) in &rows {
        let [one, sixteen, sixty_four] = figures.rate;
        println!("{name:<10} {one:>16.0} {sixteen:>18.0} {sixty_four:>18.0}");
    }
    let counted: Vec<_> = rows
        .iter()
        .filter_map(|(name, figures)| Some((name, figures.statements?)))
        .collect();
    if !counted.is_empty() {
        println!("\nstatements per lifecycle (requests in flight together share them)");
        for (name, [one, sixteen, sixty_four]) in counted {
            println!("{name:<10} {one:>16.2} {sixteen:>18.2} {sixty_four:>18.2}");
        }
    }
}
