//! The relay's side of a run: a desktop starts a command it took from a
//! sync, polls whether to stop it, and reports how it ended (or that it
//! cannot run it).
//!
//! Every request of a desktop is also a sign of life: it touches the
//! device (at most once per [`QueueConfig::touch_interval`], see
//! `devices`). Syncs and progress reports have files of their own.

use super::{
    Announce, CompleteError, ControlError, DeclineError, Party, Queue, StartError, TransitionError,
    Unchanged,
};
use crate::command::{CommandRecord, CommandStatus};
use crate::envelope::ResultEnvelope;
use crate::ids::{CommandId, ExecutionId};
use crate::principal::Device;
use std::time::Duration;

#[cfg(doc)]
use super::QueueConfig;

/// Whether the relay should stop a running command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlAnswer {
    /// The agent asked to cancel.
    pub cancel_requested: bool,
    /// The command's status now. A terminal status (e.g. the lease lapsed)
    /// means: stop the execution, its result will not be taken.
    pub status: CommandStatus,
}

impl ControlAnswer {
    /// True when the relay has something to act on: cancellation was
    /// requested or the command ended (a held control request answers then).
    pub fn is_settled(&self) -> bool {
        self.cancel_requested || self.status.is_terminal()
    }

    /// The answer for `command` as it stands.
    pub fn of(command: &CommandRecord) -> Self {
        Self {
            cancel_requested: command.cancel_requested,
            status: command.status,
        }
    }
}

/// How `complete` went.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // returned once, by value
pub enum CompleteAck {
    /// The completion was recorded; the command is now in this state.
    Recorded(CommandRecord),
    /// The same completion had been recorded already; nothing changed. The
    /// command as it stands.
    Duplicate(CommandRecord),
}

impl CompleteAck {
    /// The command as it stands after the report.
    pub fn record(&self) -> &CommandRecord {
        match self {
            Self::Recorded(record) | Self::Duplicate(record) => record,
        }
    }
}

/// How `decline` went.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // returned once, by value
pub enum DeclineAck {
    /// The queued command was closed as `cancelled` with
    /// [`NO_LONGER_SHARED`](crate::command::NO_LONGER_SHARED).
    Recorded(CommandRecord),
    /// The command was already closed (declined before, cancelled by its
    /// agent, or finished); nothing changed. The command as it stands.
    Unchanged(CommandRecord),
}

impl DeclineAck {
    /// The command as it stands after the report.
    pub fn record(&self) -> &CommandRecord {
        match self {
            Self::Recorded(record) | Self::Unchanged(record) => record,
        }
    }
}

impl Queue {
    /// The relay starts a command under the engine's execution id. Refused if
    /// the command was cancelled meanwhile, so a cancelled command never runs.
    pub async fn start(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
    ) -> Result<CommandRecord, StartError> {
        self.touch(device).await?;
        let long_poll = self.long_polls(&device.owner, &device.id).await?;
        let lease = self.config.lease(long_poll);
        let started = self
            .transition(Party::Device(device), id, |record, now| {
                record.start_in_place(execution, now, lease)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => StartError::NotFound,
                TransitionError::Store(s) => StartError::Store(s),
                TransitionError::Refused(r) => StartError::Refused(r),
            })?;
        // No longer queued: the desktop's next held sync may know that
        // without the store (see `Queue::sync_held`).
        self.signals
            .quiet()
            .started(&device.owner, &device.id, &started.id);
        Ok(started)
    }

    /// The relay's control poll for a running command: is cancellation requested?
    pub async fn control(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<ControlAnswer, ControlError> {
        Ok(self.control_renewing(device, id).await?.0)
    }

    /// [`Queue::control`], with the lease the run holds (the one it was
    /// granted, or [`QueueConfig::lease_long_poll`] for a run without
    /// one): what a held control request's length follows
    /// ([`Queue::control_hold`]).
    pub async fn control_renewing(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<(ControlAnswer, Duration), ControlError> {
        self.touch(device).await?;
        // A control request from the executing desktop renews the lease (of
        // the length it was granted with), or closes a lapsed run.
        let lease_of =
            |record: &CommandRecord| record.lease().unwrap_or(self.config.lease_long_poll);
        let command = self
            .transition_announced(
                Party::Device(device),
                id,
                Announce::Never,
                Unchanged::FromCurrentCopy,
                |record, now| {
                    let lease = lease_of(record);
                    Ok::<_, std::convert::Infallible>(record.renew_in_place(now, lease))
                },
            )
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => ControlError::NotFound,
                TransitionError::Store(s) => ControlError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?;
        Ok((ControlAnswer::of(&command), lease_of(&command)))
    }

    /// What a control request would answer now, without renewing the lease
    /// or touching the device: for a driver holding a control request, which
    /// looks again while it waits. A run this queue saw finish is answered
    /// from memory (see `finished`): the look of a held control request
    /// that its run's completion woke reads no store.
    pub async fn peek_control(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<ControlAnswer, ControlError> {
        let now = self.clock.now();
        if let Some(finished) = self.finished.get(&Party::Device(device), id, now) {
            return Ok(ControlAnswer::of(&finished));
        }
        let command = self
            .store
            .command_for_device(&device.owner, &device.id, id)
            .await?
            .ok_or(ControlError::NotFound)?;
        self.finished.put(&command, now);
        Ok(ControlAnswer::of(&command.at(now)))
    }

    /// The relay reports the end of an execution. Fenced by execution id.
    pub async fn complete(
        &self,
        device: &Device,
        id: &CommandId,
        envelope: &ResultEnvelope,
    ) -> Result<CompleteAck, CompleteError> {
        envelope.validate()?;
        self.touch(device).await?;
        let mut duplicate = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                let changed = record.complete_in_place(envelope, now)?;
                duplicate = !changed;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => CompleteError::NotFound,
                TransitionError::Store(s) => CompleteError::Store(s),
                TransitionError::Refused(r) => CompleteError::Refused(r),
            })?;
        Ok(if duplicate {
            CompleteAck::Duplicate(record)
        } else {
            CompleteAck::Recorded(record)
        })
    }

    /// The relay's re-check just before running failed: the command is
    /// closed as `cancelled` with "Graph session is no longer shared with this project".
    /// A command that is already closed is left as it is, and the answer
    /// says so ([`DeclineAck::Unchanged`]).
    pub async fn decline(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<DeclineAck, DeclineError> {
        self.touch(device).await?;
        let mut changed = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                changed = record.decline_in_place(now)?;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => DeclineError::NotFound,
                TransitionError::Store(s) => DeclineError::Store(s),
                TransitionError::Refused(r) => DeclineError::Refused(r),
            })?;
        Ok(if changed {
            DeclineAck::Recorded(record)
        } else {
            DeclineAck::Unchanged(record)
        })
    }
}
