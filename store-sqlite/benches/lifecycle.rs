//! Lifecycles per second for the memory store and the SQLite store, and
//! `sync` / `get_graph_run` latency on an empty SQLite database against one
//! holding 1,000,000 commands.
//!
//! Run with `cargo bench -p graph-relay-store-sqlite`. A lifecycle is
//! `run_graph_session → sync → start → complete → get_graph_run` through the
//! core's `Queue`. The 1,000,000-command database is built once (in chunks of
//! one transaction each) and cached under the target directory
//! (`target/tmp/graph-relay-store-sqlite-bench/`); delete it to rebuild.
//! Each run works on a copy, so the cached file stays pristine.
//!
//! After criterion's own report, a summary prints lifecycles/s of both
//! stores and their ratio, the latency ratio 1M / empty (means over
//! every measured iteration), and lifecycles/s at 64 in flight against the
//! number of commands already stored: 10,000, 100,000 and 1,000,000 (each
//! database built once and cached like the big one, each run on a copy), so
//! that a rate which drops as the backlog grows shows.
//!
//! New command ids come from the core's production source (`RandomIds`,
//! time-ordered UUIDv7), as on a server; the stored commands of the cached
//! databases have seeded random (version-4) ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use futures::executor::block_on;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::ids::{DeviceId, IdempotencyKey, ProjectId};
use graph_relay_core::queue::{Queue, QueueConfig, SyncRequest};
use graph_relay_core::store::Store;
use graph_relay_core::testkit::workload::{Desk, desks, lifecycle};
use graph_relay_core::testkit::{World, completed, exec, meta, p1};
use graph_relay_core::time::{IdSource, RandomIds, SeededIds};
use graph_relay_store_memory::MemoryStore;
use graph_relay_store_sqlite::{SCHEMA_VERSION, SqliteStore};
use serde_json::json;

/// Commands in the big database.
const MILLION: u64 = 1_000_000;
/// Commands stored before the backlog variants run (see [`backlog_count`]).
const BACKLOGS: [u64; 3] = [10_000, 100_000, MILLION];
/// Lifecycles in flight at once in the concurrent variants.
const IN_FLIGHT: u64 = 64;
const IN_FLIGHT_FEW: u64 = 16;
/// Commands written per transaction while building it.
const CHUNK: u64 = 50_000;

/// Total time and iterations per measured function, for the summary.
static TOTALS: Mutex<BTreeMap<&'static str, (Duration, u64)>> = Mutex::new(BTreeMap::new());
/// CPU time of the whole process (every thread) per measured function.
static CPU: Mutex<BTreeMap<&'static str, Duration>> = Mutex::new(BTreeMap::new());

fn record(name: &'static str, elapsed: Duration, iterations: u64) {
    let mut totals = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
    let entry = totals.entry(name).or_default();
    entry.0 += elapsed;
    entry.1 += iterations;
}

fn record_cpu(name: &'static str, cpu: Duration) {
    *CPU.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(name)
        .or_default() += cpu;
}

/// CPU time used so far by the threads of this process that are alive
/// (the caller's, and the writer and checkpoint threads of open stores),
/// from `/proc/self/task/*/schedstat`; zero where that does not exist.
/// On a machine shared with other work the rate depends on how much CPU
/// the bench gets; the CPU time per lifecycle much less.
fn process_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
}

fn world(store: Arc<dyn Store>) -> World {
    let w = World::new(store);
    block_on(w.sync(&w.device, p1(), &[1]));
    w
}

/// A world over `store` whose queue makes its command ids as a server does
/// ([`RandomIds`]: time-ordered UUIDv7), not from the testkit's seed.
fn server_world(store: Arc<dyn Store>) -> World {
    let mut w = World::new(Arc::clone(&store));
    w.queue = Queue::new(
        store,
        w.clock.clone(),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    w
}

/// Measures `desks.len()` lifecycles at a time on `w` (1 = one after
/// another), all on the calling thread's `block_on`.
fn measure(w: &World, desks: &[Desk], counter: &AtomicU64, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let runs = desks
            .iter()
            .map(|desk| lifecycle(w, desk, counter.fetch_add(1, Ordering::Relaxed)));
        block_on(futures::future::join_all(runs));
    }
    start.elapsed()
}

fn bench_lifecycles(c: &mut Criterion, scratch: &Path) {
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("lifecycle");
    let memory = server_world(Arc::new(MemoryStore::new()));
    let sqlite = server_world(Arc::new(
        SqliteStore::open(scratch.join("lifecycle.sqlite")).expect("open"),
    ));
    for (name, w) in [("memory", &memory), ("sqlite", &sqlite)] {
        let one = block_on(desks(w, 1));
        group.throughput(Throughput::Elements(1));
        let label: &'static str = if name == "memory" {
            "lifecycle/memory"
        } else {
            "lifecycle/sqlite"
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let elapsed = measure(w, &one, &counter, iters);
                record(label, elapsed, iters);
                elapsed
            });
        });
    }
    // Many lifecycles in flight at once on one executor thread, as on a
    // server with many agents and desktops: reads run inline, and the
    // writes of concurrent lifecycles are committed together.
    for (in_flight, name, label) in [
        (
            IN_FLIGHT_FEW,
            "sqlite_16_in_flight",
            "lifecycle/sqlite_16_in_flight",
        ),
        (
            IN_FLIGHT,
            "sqlite_64_in_flight",
            "lifecycle/sqlite_64_in_flight",
        ),
    ] {
        let many = block_on(desks(&sqlite, in_flight as u32));
        group.throughput(Throughput::Elements(in_flight));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let cpu = process_cpu();
                let elapsed = measure(&sqlite, &many, &counter, iters);
                record_cpu(label, process_cpu().saturating_sub(cpu));
                record(label, elapsed, iters * in_flight);
                elapsed
            });
        });
    }
    group.finish();
}

/// Lifecycles per second at 64 in flight on a copy of a database already
/// holding each of [`BACKLOGS`] commands (1% of them queued for other
/// devices, the rest completed).
fn bench_backlogs(c: &mut Criterion, scratch: &Path) {
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("lifecycle");
    group.throughput(Throughput::Elements(IN_FLIGHT));
    for (backlog, name, label) in [
        (BACKLOGS[0], "sqlite_64_in_flight/10k_stored", "backlog/10k"),
        (
            BACKLOGS[1],
            "sqlite_64_in_flight/100k_stored",
            "backlog/100k",
        ),
        (BACKLOGS[2], "sqlite_64_in_flight/1m_stored", "backlog/1m"),
    ] {
        let copy = scratch.join(format!("backlog-{backlog}.sqlite"));
        copy_synced(&stored_database(backlog_count(backlog)), &copy);
        let store = SqliteStore::open(&copy).expect("open the backlog copy");
        let w = server_world(Arc::new(store));
        let many = block_on(desks(&w, IN_FLIGHT as u32));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let cpu = process_cpu();
                let elapsed = measure(&w, &many, &counter, iters);
                record_cpu(label, process_cpu().saturating_sub(cpu));
                record(label, elapsed, iters * IN_FLIGHT);
                elapsed
            });
        });
        drop(w);
        // Missing is fine: only frees the disk early.
        let _ = std::fs::remove_file(&copy);
    }
    group.finish();
}

/// Copies `from` to `to` and writes the copy to disk now: otherwise the
/// first checkpoint's fsync pays for flushing the whole fresh copy inside
/// the measurement.
fn copy_synced(from: &Path, to: &Path) {
    std::fs::copy(from, to).expect("copy a cached database");
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .expect("sync the copy");
}

/// Whether this is a real benchmark run, not `cargo test --benches`
/// checking that the bench works.
fn benchmarking() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// How many commands the big database holds: 1,000,000 under `cargo bench`;
/// a thousand when `cargo test --benches` only checks that the bench works.
fn big_count() -> u64 {
    backlog_count(MILLION)
}

/// `n` stored commands under `cargo bench`; a thousandth of it (at least
/// 10) under `cargo test --benches`.
fn backlog_count(n: u64) -> u64 {
    if benchmarking() {
        n
    } else {
        (n / 1000).max(10)
    }
}

/// The pristine big database (see [`big_count`]), built if missing.
fn million_database() -> PathBuf {
    stored_database(big_count())
}

/// The pristine database of `count` stored commands, built if missing and
/// cached under the target directory.
// The `into` below converts to `arguments` whether it is a map or a shared map.
#[allow(clippy::useless_conversion)]
fn stored_database(count: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("graph-relay-store-sqlite-bench");
    std::fs::create_dir_all(&dir).expect("bench cache dir");
    let path = dir.join(format!("commands-{count}-v{SCHEMA_VERSION}.sqlite"));
    let done = path.with_extension("done");
    if done.exists() && path.exists() {
        return path;
    }
    for stale in [&path, &done] {
        // Missing files are fine: this only clears a half-built cache.
        let _ = std::fs::remove_file(stale);
    }
    eprintln!("building {} ({count} commands) ...", path.display());
    let started = Instant::now();
    let store = SqliteStore::open(&path).expect("open the big database");
    let w = World::new(Arc::new(MemoryStore::new()));
    let ids = SeededIds::new(0x5eed);
    let devices: Vec<DeviceId> = (0..100)
        .map(|d| DeviceId::parse(&format!("desktop-{d}")).expect("device id"))
        .collect();
    let projects: Vec<ProjectId> = (0..10)
        .map(|p| ProjectId::parse(&format!("project-{p}")).expect("project id"))
        .collect();
    let mut n = 0u64;
    while n < count {
        let chunk: Vec<CommandRecord> = (n..(n + CHUNK).min(count))
            .map(|i| {
                let mut c = w.sync_template(0);
                c.id = ids.new_command_id();
                c.idempotency_key = IdempotencyKey::parse(&format!("big-key-{i:08}")).expect("key");
                c.device = devices[(i % 100) as usize].clone();
                c.project = projects[(i % 10) as usize].clone();
                // `into`: the field is a map, or a shared map (`Arc`).
                c.arguments = json!({"n": i})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
                    .into();
                c.created_at = c.created_at.plus(Duration::from_millis(i));
                if i % 100 == 0 {
                    // 1% still queued (for other devices than the one measured).
                    return c;
                }
                c.status = CommandStatus::Completed;
                c.execution_id = Some(exec(&format!("exec-{i}")));
                c.started_at = Some(c.created_at.plus(Duration::from_secs(5)));
                c.finished_at = Some(c.created_at.plus(Duration::from_secs(65)));
                c.completion = Some(completed(&format!("exec-{i}"), json!({"answer": i})));
                c.revision = 2;
                c
            })
            .collect();
        n += chunk.len() as u64;
        block_on(store.import_commands(chunk)).expect("import a chunk");
    }
    assert_eq!(block_on(store.command_count()).expect("count"), count);
    drop(store);
    std::fs::write(&done, b"complete\n").expect("marker");
    eprintln!("built in {:.1} s", started.elapsed().as_secs_f64());
    path
}

/// A world whose device has 5 queued commands and one completed command.
fn latency_world(store: SqliteStore) -> (World, graph_relay_core::ids::CommandId) {
    let w = world(Arc::new(store));
    for i in 0..5 {
        block_on(w.run(&w.agent, 1, &format!("latency-queued-{i}")));
    }
    let done = block_on(w.run(&w.agent, 1, "latency-done-0"));
    block_on(w.queue.start(&w.device, &done.id, &exec("latency-exec"))).expect("start");
    block_on(w.queue.complete(
        &w.device,
        &done.id,
        &completed("latency-exec", json!({"answer": 1})),
    ))
    .expect("complete");
    (w, done.id)
}

fn bench_latency(c: &mut Criterion, scratch: &Path) {
    let empty = SqliteStore::open(scratch.join("empty.sqlite")).expect("open empty");
    let big_copy = scratch.join("million.sqlite");
    copy_synced(&million_database(), &big_copy);
    let big = SqliteStore::open(&big_copy).expect("open big");
    // Some of the million, spread over the key space, for get_graph_run.
    let ids = SeededIds::new(0x5eed);
    let sample: Vec<_> = (0..big_count())
        .map(|_| ids.new_command_id())
        .step_by(997)
        .collect();

    let mut group = c.benchmark_group("latency");
    for (label, store) in [("empty", empty), ("1m", big)] {
        let (w, done) = latency_world(store);
        let request = SyncRequest {
            project: p1(),
            sessions: vec![meta(1)],
            long_poll: false,
            restarted: false,
            running: None,
        };
        let sync_name: &'static str = if label == "empty" {
            "sync/empty"
        } else {
            "sync/1m"
        };
        group.bench_function(sync_name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let r = block_on(w.queue.sync(&w.device, &request)).expect("sync");
                    assert_eq!(r.commands.len(), 5);
                }
                let elapsed = start.elapsed();
                record(sync_name, elapsed, iters);
                elapsed
            });
        });
        let get_name: &'static str = if label == "empty" {
            "get_graph_run/empty"
        } else {
            "get_graph_run/1m"
        };
        let mut next = 0usize;
        group.bench_function(get_name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    // In the big database, a different one of the million each time.
                    let id = if label == "empty" {
                        done
                    } else {
                        next = (next + 1) % sample.len();
                        sample[next]
                    };
                    let view = block_on(w.queue.get_graph_run(&w.agent, &id)).expect("get");
                    assert!(view.command.status.is_terminal() || label == "1m");
                }
                let elapsed = start.elapsed();
                record(get_name, elapsed, iters);
                elapsed
            });
        });
    }
    group.finish();
}

fn summary() {
    let totals = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
    let per_op = |name: &str| {
        totals
            .get(name)
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| t.as_secs_f64() / *n as f64)
    };
    let cpu = CPU.lock().unwrap_or_else(|p| p.into_inner());
    // CPU µs per lifecycle, all threads, where it was measured.
    let cpu_per_op = |name: &str| {
        let (_, n) = totals.get(name).filter(|(_, n)| *n > 0)?;
        let used = cpu.get(name).filter(|c| !c.is_zero())?;
        Some(used.as_secs_f64() * 1e6 / *n as f64)
    };
    let cpu_note = |name: &str| {
        cpu_per_op(name).map_or_else(String::new, |us| {
            format!("   {us:>6.1} µs CPU per lifecycle (all threads)")
        })
    };
    println!("\n== summary (means over every measured iteration)");
    for name in [
        "lifecycle/memory",
        "lifecycle/sqlite",
        "lifecycle/sqlite_16_in_flight",
        "lifecycle/sqlite_64_in_flight",
    ] {
        if let Some(s) = per_op(name) {
            println!("{name:32} {:>10.0} lifecycles/s{}", 1.0 / s, cpu_note(name));
        }
    }
    if let (Some(m), Some(s)) = (per_op("lifecycle/memory"), per_op("lifecycle/sqlite")) {
        println!(
            "{:32} {:>10.1}x slower than memory",
            "sqlite / memory",
            s / m
        );
    }
    for op in ["sync", "get_graph_run"] {
        let empty = per_op(&format!("{op}/empty"));
        let big = per_op(&format!("{op}/1m"));
        if let (Some(e), Some(b)) = (empty, big) {
            println!(
                "{op:14} empty {:>8.1} µs   1M {:>8.1} µs   ratio {:.2}",
                e * 1e6,
                b * 1e6,
                b / e
            );
        }
    }
    println!("lifecycles/s at {IN_FLIGHT} in flight against commands already stored:");
    let mut first = None;
    for (label, stored) in [
        ("backlog/10k", BACKLOGS[0]),
        ("backlog/100k", BACKLOGS[1]),
        ("backlog/1m", BACKLOGS[2]),
    ] {
        if let Some(s) = per_op(label) {
            let rate = 1.0 / s;
            let base = *first.get_or_insert(rate);
            println!(
                "  {:>9} stored {:>10.0} lifecycles/s   {:>5.2} of the first{}",
                backlog_count(stored),
                rate,
                rate / base,
                cpu_note(label)
            );
        }
    }
}

fn main() {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir");
    let mut c = Criterion::default().configure_from_args();
    bench_lifecycles(&mut c, scratch.path());
    bench_backlogs(&mut c, scratch.path());
    bench_latency(&mut c, scratch.path());
    c.final_summary();
    summary();
}
