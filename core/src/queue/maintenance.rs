//! The queue's housekeeping as a loop that needs no async runtime.
//!
//! A server must call [`Queue::maintain`] about once a second for the life
//! of the queue: it is what ends a run whose desktop stopped reporting
//! (its lease lapsed), writes coalesced progress, prunes old keys and runs,
//! and notices other processes' writes to a shared SQLite file. Forgetting
//! it leaves a dead desktop's runs `running` forever, so
//! [`Queue::run_maintenance`] is the loop every server runs, whatever its
//! runtime: it sleeps on the given [`Sleeper`] and ends when the shutdown
//! future resolves or the queue shuts down.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;

use super::{MaintenanceReport, Queue};
use crate::store::StoreError;
use crate::time::Sleeper;

/// How often [`Queue::run_maintenance`] runs a step: the precision of lease
/// lapses and of the last coalesced progress report.
pub const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);

impl Queue {
    /// Runs [`Queue::maintain`] every [`MAINTENANCE_INTERVAL`] until
    /// `shutdown` resolves or [`Queue::shut_down`] is called, handing each
    /// step's outcome to `observe` (to log it: a failing store is tried
    /// again at the next step, never given up on).
    ///
    /// Steps do not overlap: the next sleep starts when a step ends, so a
    /// slow store delays maintenance instead of piling it up.
    ///
    /// ```
    /// use graph_relay_core::queue::Queue;
    /// use graph_relay_core::time::ThreadSleeper;
    ///
    /// async fn housekeeping(queue: Queue, stop: futures::channel::oneshot::Receiver<()>) {
    ///     let stopped = async move {
    ///         let _ = stop.await;
    ///     };
    ///     queue
    ///         .run_maintenance(&ThreadSleeper, stopped, |step| {
    ///             if let Err(e) = step {
    ///                 eprintln!("queue maintenance failed, trying again: {e}");
    ///             }
    ///         })
    ///         .await;
    /// }
    /// ```
    pub async fn run_maintenance<F>(
        &self,
        sleeper: &dyn Sleeper,
        shutdown: F,
        mut observe: impl FnMut(Result<MaintenanceReport, StoreError>),
    ) where
        F: Future<Output = ()>,
    {
        let shutdown = shutdown.fuse();
        futures::pin_mut!(shutdown);
        loop {
            let mut tick = sleeper.sleep(MAINTENANCE_INTERVAL).fuse();
            futures::select! {
                () = tick => {}
                () = shutdown => return,
            }
            if self.is_shutting_down() {
                return;
            }
            observe(self.maintain().await);
        }
    }
}
