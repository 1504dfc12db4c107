//! The queue's housekeeping as a loop that needs no async runtime.
//!
//! A server must call [`Queue::maintain`] about once a second for the life
//! of the queue: it is what ends a run whose desktop stopped reporting
//! (its lease lapsed), writes coalesced progress and the desktops'
//! liveness, prunes old keys and runs, and notices other processes' writes
//! to a shared SQLite file. Forgetting
//! it leaves a dead desktop's runs `running` forever, so
//! [`Queue::run_maintenance`] is the loop every server runs, whatever its
//! runtime: it sleeps on the given [`Sleeper`] and ends when the shutdown
//! future resolves or the queue shuts down.
//!
//! One step has five parts, each bounded and each callable on its own:
//! writing the desktops' contacts, writing coalesced progress, closing runs
//! whose lease lapsed, pruning, and (on a store shared by several
//! processes) waking held requests when another process wrote.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;

use super::{Party, ProgressAck, ProgressError, Queue, TransitionError};
use crate::command::Progress;
use crate::ids::{CommandId, ExecutionId};
use crate::principal::Device;
use crate::store::{ExternalWrites, PruneReport, PruneRequest, StoreError};
use crate::time::Sleeper;

#[cfg(doc)]
use crate::command::CommandRecord;

/// How often [`Queue::run_maintenance`] runs a step: the precision of lease
/// lapses and of the last coalesced progress report.
pub const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);

/// What one [`Queue::maintain`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaintenanceReport {
    /// Coalesced progress reports written.
    pub progress: usize,
    /// Running commands closed (lease lapsed) or granted a lease.
    pub leases: usize,
    /// What pruning removed.
    pub pruned: PruneReport,
    /// Held requests woken because another process wrote to the store
    /// (under [`ExternalWrites::Marker`], when the marker moved).
    pub woken: usize,
}

impl Queue {
    /// The server's periodic housekeeping, meant to run about once a
    /// second: writes the desktops' gathered contacts
    /// ([`Queue::flush_contacts`]) and coalesced progress, closes lapsed
    /// runs ([`Queue::sweep_lapsed`]) and prunes ([`Queue::prune`]).
    pub async fn maintain(&self) -> Result<MaintenanceReport, StoreError> {
        self.flush_contacts().await?;
        Ok(MaintenanceReport {
            woken: self.watch_external_writes().await?,
            progress: self.flush_progress().await?,
            leases: self.sweep_lapsed().await?,
            pruned: self.prune().await?,
        })
    }

    /// Runs [`Queue::maintain`] every [`MAINTENANCE_INTERVAL`] until
    /// `shutdown` resolves or [`Queue::shut_down`] is called, handing each
    /// step's outcome to `observe` (to log it: a failing store is tried
    /// again at the next step, never given up on). When it ends it writes
    /// the desktops' gathered contacts once more
    /// ([`Queue::flush_contacts`]).
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
                () = shutdown => break,
            }
            if self.is_shutting_down() {
                break;
            }
            observe(self.maintain().await);
        }
        // The desktops' last contacts, so that a stopping server leaves
        // their liveness written (a failure is as a step's: handed on).
        if let Err(e) = self.flush_contacts().await {
            observe(Err(e));
        }
    }

    /// Writes the coalesced progress reports whose interval has passed and
    /// forgets commands that have been quiet for a while. Returns how many
    /// reports it wrote.
    pub async fn flush_progress(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let interval = self.config.progress_interval;
        let due: Vec<(CommandId, (Device, ExecutionId, Progress))> = {
            let mut states = self.progress.lock();
            states.retain(|_, s| {
                s.pending.is_some() || now < s.written_at || now.since(s.written_at) < interval * 10
            });
            states
                .iter_mut()
                .filter(|(_, s)| now < s.written_at || now.since(s.written_at) >= interval)
                .filter_map(|(id, s)| s.pending.take().map(|p| (*id, p)))
                .collect()
        };
        let mut written = 0;
        for (id, (device, execution, progress)) in due {
            match self
                .write_progress(&device, &id, &execution, progress)
                .await
            {
                Ok(ProgressAck::Recorded) => written += 1,
                Ok(_) | Err(ProgressError::NotFound | ProgressError::Refused(_)) => {}
                Err(ProgressError::Invalid(_)) => {}
                Err(ProgressError::Store(e)) => return Err(e),
            }
        }
        Ok(written)
    }

    /// One bounded sweep of running commands whose lease lapsed: each is
    /// closed as [`CommandRecord::lapse_in_place`] says, and whoever waits
    /// on it is woken. A running command written before leases existed is
    /// granted a lease from now instead. Reads close a lapsed run on their
    /// own, so the sweep is for runs nobody looks at and for waiters; a
    /// server runs it every few seconds. Returns how many commands it wrote.
    pub async fn sweep_lapsed(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let due = self
            .store
            .lapsed_commands(now, self.config.prune_batch)
            .await?;
        let mut written = 0;
        for command in due {
            let lease = self.config.lease_long_poll;
            let swept = self
                .transition(Party::Owner(&command.owner), &command.id, |record, now| {
                    Ok::<_, std::convert::Infallible>(if record.lease_expires_at.is_none() {
                        record.renew_in_place(now, lease)
                    } else {
                        record.lapse_in_place(now)
                    })
                })
                .await;
            match swept {
                Ok(record) if record.revision != command.revision => written += 1,
                Ok(_) | Err(TransitionError::NotFound) => {}
                Err(TransitionError::Store(e)) => return Err(e),
                Err(TransitionError::Refused(never)) => match never {},
            }
        }
        Ok(written)
    }

    /// Under [`ExternalWrites::Marker`]: reads the store's marker and, when
    /// it moved since the last call, wakes every held request (each looks
    /// at the store again). Returns how many were woken; the first call
    /// only records the marker. [`Queue::maintain`] calls it.
    pub async fn watch_external_writes(&self) -> Result<usize, StoreError> {
        if self.store.external_writes() != ExternalWrites::Marker {
            return Ok(0);
        }
        let now = self.store.external_write_marker().await?;
        let before = self
            .marker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(now);
        Ok(match before {
            Some(before) if before != now => self.signals.wake_all(),
            _ => 0,
        })
    }

    /// One bounded pruning step: expired keys, and terminal commands past retention.
    pub async fn prune(&self) -> Result<PruneReport, StoreError> {
        let now = self.clock.now();
        self.store
            .prune(PruneRequest {
                now,
                terminal_before: self.config.terminal_retention.map(|r| now.minus(r)),
                batch: self.config.prune_batch,
            })
            .await
    }
}
