//! `Queue::run_maintenance`, the loop every server runs: it ends a run whose
//! desktop stopped reporting when the lease lapses, hands every step to its
//! observer, and stops on its shutdown future or when the queue shuts down.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::executor::block_on;
use futures::future::BoxFuture;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::queue::MAINTENANCE_INTERVAL;
use graph_relay_core::testkit::{World, exec, p1};
use graph_relay_core::time::{ManualClock, Sleeper};
use graph_relay_store_memory::MemoryStore;

/// A sleeper that moves the world's clock by the requested time and
/// returns at once; after `steps` sleeps it calls `stop`.
struct SteppingSleeper {
    clock: Arc<ManualClock>,
    slept: AtomicUsize,
    steps: usize,
    stop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Sleeper for SteppingSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.clock.advance(duration);
        if self.slept.fetch_add(1, Ordering::SeqCst) + 1 == self.steps
            && let Some(stop) = self.stop.lock().expect("lock").take()
        {
            stop();
        }
        Box::pin(async {})
    }
}

#[test]
fn a_lapsed_lease_ends_the_run_and_shutdown_ends_the_loop() {
    let w = World::new(Arc::new(MemoryStore::new()));
    block_on(w.sync(&w.device, p1(), &[1]));
    let cmd = block_on(w.run(&w.agent, 1, "maintain-01"));
    block_on(w.queue.start(&w.device, &cmd.id, &exec("e-1"))).expect("start");
    let lease = w.queue.config().lease(false);
    let steps = usize::try_from(lease.as_secs() / MAINTENANCE_INTERVAL.as_secs()).unwrap() + 2;

    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let sleeper = SteppingSleeper {
        clock: w.clock.clone(),
        slept: AtomicUsize::new(0),
        steps,
        stop: Mutex::new(Some(Box::new(move || {
            let _ = stop_tx.send(());
        }))),
    };
    let mut closed = 0;
    let mut observed = 0;
    block_on(w.queue.run_maintenance(
        &sleeper,
        async move {
            let _ = stop_rx.await;
        },
        |step| {
            observed += 1;
            closed += step.expect("maintenance step").leases;
        },
    ));
    // The loop ran a step after each sleep but the one whose shutdown won.
    assert!(observed >= steps - 1, "{observed} steps observed");
    assert_eq!(closed, 1, "the lapsed run was closed once");
    let view = block_on(w.queue.get_graph_run(&w.agent, &cmd.id)).expect("get");
    assert_eq!(view.command.status, CommandStatus::Failed);
}

#[test]
fn the_loop_ends_when_the_queue_shuts_down() {
    let w = World::new(Arc::new(MemoryStore::new()));
    let queue = w.queue.clone();
    let sleeper = SteppingSleeper {
        clock: w.clock.clone(),
        slept: AtomicUsize::new(0),
        steps: 3,
        stop: Mutex::new(Some(Box::new(move || queue.shut_down()))),
    };
    let mut observed = 0;
    block_on(
        w.queue
            .run_maintenance(&sleeper, std::future::pending(), |_| observed += 1),
    );
    assert_eq!(observed, 2, "no step after the queue shut down");
}
