//! Runs full lifecycles (run → sync → start → complete → get) on a SQLite
//! store in a temporary directory, `in_flight` at a time on one executor
//! thread as the bench does, and prints the rate and the CPU time of each
//! thread per lifecycle. Under `valgrind --tool=callgrind` it gives a
//! load-independent instruction count per lifecycle:
//!
//! ```text
//! cargo build --release -p graph-relay-store-sqlite --example sqlite_lifecycle_loop
//! target/release/examples/sqlite_lifecycle_loop [lifecycles] [in_flight] [full]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use graph_relay_core::queue::{Queue, QueueConfig};
use graph_relay_core::testkit::World;
use graph_relay_core::testkit::workload::{desks, lifecycle};
use graph_relay_core::time::RandomIds;
use graph_relay_store_sqlite::{SqliteOptions, SqliteStore, Synchronous};

/// The same allocator as the `graph-relay` binary, whose store this is.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// CPU time of every thread of this process so far (Linux), by name.
fn thread_times() -> Vec<(String, Duration)> {
    let mut times = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return times;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let run_ns = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let tid = task.file_name().to_string_lossy().into_owned();
        times.push((
            format!("{} ({tid})", name.trim()),
            Duration::from_nanos(run_ns),
        ));
    }
    times.sort();
    times
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let in_flight: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let full = args.next().is_some_and(|a| a == "full");
    let dir = tempfile::tempdir().expect("temp dir");
    let options = SqliteOptions::default().synchronous(if full {
        Synchronous::Full
    } else {
        Synchronous::Normal
    });
    // `LOOP_DB=path` keeps the database for inspection.
    let path =
        std::env::var_os("LOOP_DB").map_or_else(|| dir.path().join("loop.sqlite"), Into::into);
    let store = SqliteStore::open_with(path, &options).expect("open the store");
    let store = Arc::new(store);
    let mut w = World::new(store.clone());
    // Command ids as a server makes them (time-ordered UUIDv7).
    w.queue = Queue::new(
        store.clone(),
        w.clock.clone(),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let desks = block_on(desks(&w, in_flight));
    let rounds = n.div_ceil(u64::from(in_flight));
    let before = thread_times();
    let statements_before = store.statements_executed();
    let started = Instant::now();
    let mut counter = 0u64;
    // Keys are numbered from here, so a kept database (`LOOP_DB`) gets new keys.
    let first_key = u64::from(std::process::id()) * 1_000_000_000;
    let mut report = String::new();
    // The rate of every 20,000 lifecycles, to see it change as the file grows.
    let (mut stage_start, mut stage_count) = (Instant::now(), 0u64);
    for _ in 0..rounds {
        let runs = desks.iter().map(|desk| {
            counter += 1;
            lifecycle(&w, desk, first_key + counter)
        });
        block_on(futures::future::join_all(runs));
        if counter - stage_count >= 20_000 {
            let rate = (counter - stage_count) as f64 / stage_start.elapsed().as_secs_f64();
            report += &format!("  up to {counter:>8}: {rate:>7.0} lifecycles/s\n");
            (stage_start, stage_count) = (Instant::now(), counter);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let after = thread_times();
    println!(
        "{counter} lifecycles, {in_flight} in flight, in {secs:.3} s: {:.0} lifecycles/s",
        counter as f64 / secs
    );
    print!("{report}");
    println!(
        "  {:.2} SQL statements per lifecycle",
        (store.statements_executed() - statements_before) as f64 / counter as f64
    );
    let mut total = Duration::ZERO;
    for (name, t) in &after {
        let t0 = before
            .iter()
            .find(|(n0, _)| n0 == name)
            .map_or(Duration::ZERO, |(_, t0)| *t0);
        let used = t.saturating_sub(t0);
        total += used;
        println!(
            "  {name:32} {:>8.3} s CPU  {:>7.1} µs/lifecycle",
            used.as_secs_f64(),
            used.as_secs_f64() * 1e6 / counter as f64
        );
    }
    println!(
        "  {:32} {:>8.3} s CPU  {:>7.1} µs/lifecycle",
        "total",
        total.as_secs_f64(),
        total.as_secs_f64() * 1e6 / counter as f64
    );
}
