//! Runs N full lifecycles (run → sync → start → complete → get) on the memory
//! store in the steady workload of `graph_relay_core::testkit::workload`
//! (after a warm-up that fills the store to its steady size) and prints the
//! rate. Under `valgrind --tool=callgrind` it gives a load-independent
//! instruction count per lifecycle:
//!
//! ```text
//! cargo build --release -p graph-relay-store-memory --example memory_lifecycle_loop
//! target/release/examples/memory_lifecycle_loop 200000
//! valgrind --tool=callgrind --toggle-collect='*memory_lifecycle_loop*measured*' \
//!     target/release/examples/memory_lifecycle_loop 20000
//! ```
//! (`--toggle-collect` counts only the measured loop, not the warm-up.)

use std::sync::Arc;
use std::time::Instant;

use futures::executor::block_on;
use graph_relay_core::testkit::workload::Workload;
use graph_relay_store_memory::MemoryStore;

const WARM_UP: u64 = 20_000;

#[inline(never)]
fn measured(w: &mut Workload, n: u64) {
    block_on(async {
        for _ in 0..n {
            w.lifecycle().await;
        }
    });
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let store = Arc::new(MemoryStore::new());
    let mut w = Workload::steady(store.clone());
    block_on(async {
        for _ in 0..WARM_UP {
            w.lifecycle().await;
        }
    });
    let started = Instant::now();
    measured(&mut w, n);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} lifecycles in {secs:.3} s: {:.0} lifecycles/s ({} commands held)",
        n as f64 / secs,
        store.command_count()
    );
}
