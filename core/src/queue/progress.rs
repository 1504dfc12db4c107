//! A running Graph's progress reports: fenced like a completion, and
//! throttled to one write per [`QueueConfig::progress_interval`] per
//! command. A report in between is kept (coalesced) and written by the
//! next report after the interval, or by the maintenance step's flush.

use super::{Party, ProgressError, Queue, TransitionError};
use crate::command::Progress;
use crate::ids::{CommandId, ExecutionId};
use crate::principal::Device;
use crate::time::Timestamp;

#[cfg(doc)]
use super::QueueConfig;

/// How a progress report was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressAck {
    /// Written: the agent sees it now.
    Recorded,
    /// Arrived within [`QueueConfig::progress_interval`] of the last write:
    /// kept, and written with the next report or by [`Queue::maintain`]
    /// unless a newer one replaces it first.
    Coalesced,
    /// The same report as the one recorded: nothing to write.
    Unchanged,
}

/// The progress writes of one command by this queue.
pub(super) struct ProgressState {
    /// When this queue last wrote the command's progress.
    pub(super) written_at: Timestamp,
    /// The latest report not written yet.
    pub(super) pending: Option<(Device, ExecutionId, Progress)>,
}

impl Queue {
    /// The running Graph reports how far it got (`message` at most
    /// [`MAX_PROGRESS_MESSAGE`](crate::limits::MAX_PROGRESS_MESSAGE)
    /// characters, `percent` from 0 to 100). Fenced by execution id and
    /// taken only while the command runs; it never changes the status.
    /// Writes are throttled to one per [`QueueConfig::progress_interval`]
    /// per command; see [`ProgressAck`].
    pub async fn report_progress(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
        message: Option<String>,
        percent: Option<f64>,
    ) -> Result<ProgressAck, ProgressError> {
        let now = self.clock.now();
        let progress = Progress::new(message, percent, now)?;
        let throttled = {
            let states = self.progress.lock();
            states.get(id).is_some_and(|state| {
                state.written_at <= now
                    && now.since(state.written_at) < self.config.progress_interval
            })
        };
        if throttled {
            // Only a report this device may make waits for its turn.
            let mut probe = self
                .store
                .command_for_device(&device.owner, &device.id, id)
                .await?
                .ok_or(ProgressError::NotFound)?;
            probe.progress_in_place(execution, progress.clone(), now)?;
            let mut states = self.progress.lock();
            if let Some(state) = states.get_mut(id) {
                state.pending = Some((device.clone(), execution.clone(), progress));
                return Ok(ProgressAck::Coalesced);
            }
        }
        self.write_progress(device, id, execution, progress).await
    }

    pub(super) async fn write_progress(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
        progress: Progress,
    ) -> Result<ProgressAck, ProgressError> {
        let mut changed = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                changed = record.progress_in_place(execution, progress.clone(), now)?;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => ProgressError::NotFound,
                TransitionError::Store(s) => ProgressError::Store(s),
                TransitionError::Refused(r) => ProgressError::Refused(r),
            })?;
        if changed {
            self.progress.lock().insert(
                record.id,
                ProgressState {
                    written_at: self.clock.now(),
                    pending: None,
                },
            );
            Ok(ProgressAck::Recorded)
        } else {
            Ok(ProgressAck::Unchanged)
        }
    }
}
