//! The relay's side of the queue: a desktop syncs the sessions it shares
//! and takes the commands queued for it, starts one, polls whether to stop
//! it, and reports how it ended (or that it cannot run it).
//!
//! Every request of a desktop is also a sign of life: it touches the
//! device (at most once per [`QueueConfig::touch_interval`], see
//! `devices`). Progress reports have their own file, `progress`.

use super::{
    CompleteError, ControlError, DeclineError, Party, Queue, StartError, SyncError, TransitionError,
};
use crate::command::{CommandRecord, CommandStatus};
use crate::envelope::ResultEnvelope;
use crate::ids::{CommandId, ExecutionId, ProjectId};
use crate::limits::MAX_SESSIONS_PER_SYNC;
use crate::principal::Device;
use crate::session::SessionMeta;
use crate::store::{DeviceContact, StoreError};
use std::time::Duration;

#[cfg(doc)]
use super::QueueConfig;

/// Most running commands one restart announcement closes.
const MAX_RESTART_CLOSES: usize = 100;

/// A relay's sync for one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    /// The project the owner enabled on the desktop.
    pub project: ProjectId,
    /// The sessions shared to it (at most 100).
    pub sessions: Vec<SessionMeta>,
    /// The relay holds this request open (long-poll mode).
    pub long_poll: bool,
    /// True on the first sync a relay process sends after it started: the
    /// server then ends this device's running commands other than `running`.
    pub restarted: bool,
    /// The command the relay is executing right now, if any.
    pub running: Option<CommandId>,
}

/// What a sync hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResponse {
    /// Queued commands of this project for this device, oldest first.
    pub commands: Vec<CommandRecord>,
    /// When the relay should sync again if nothing changes.
    pub poll_after: Duration,
}

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

/// The rules of a sync's sessions: at most [`MAX_SESSIONS_PER_SYNC`],
/// each valid, none listed twice.
fn validate_sessions(sessions: &[SessionMeta]) -> Result<(), SyncError> {
    if sessions.len() > MAX_SESSIONS_PER_SYNC {
        return Err(SyncError::TooManySessions(sessions.len()));
    }
    for (index, session) in sessions.iter().enumerate() {
        session.validate(index)?;
        // At most 100 sessions: a scan is cheaper than hashing.
        if sessions[..index]
            .iter()
            .any(|s| s.graph_session_id == session.graph_session_id)
        {
            return Err(SyncError::DuplicateSession(
                session.graph_session_id.clone(),
            ));
        }
    }
    Ok(())
}

impl Queue {
    /// A relay uploads the sessions shared to one project and receives the
    /// commands queued there for it. Replaces what `list_graph_sessions`
    /// shows for this device and records when the device last synced, and
    /// whether it long-polls (an unheld sync of a long-polling relay keeps
    /// that mode; see `long_polls_after`).
    pub async fn sync(
        &self,
        device: &Device,
        request: &SyncRequest,
    ) -> Result<SyncResponse, SyncError> {
        validate_sessions(&request.sessions)?;
        let now = self.clock.now();
        if !self.sync_written_recently(device, request, now) {
            if !request.sessions.is_empty() {
                self.check_project_bound(device, &request.project).await?;
            }
            let long_poll = self.long_polls_after(device, request).await?;
            self.store
                .record_sync(
                    &device.owner,
                    &request.project,
                    &device.id,
                    &request.sessions,
                    long_poll,
                    now,
                )
                .await?;
            self.device_contacted(device, DeviceContact::Sync { long_poll }, now);
            self.remember_sync(device, request, now);
        }
        if request.restarted {
            self.close_after_restart(device, request.running.as_ref())
                .await?;
        }
        let queued = self.queued_for(device, &request.project).await?;
        let commands = self.decline_unshared(device, request, queued).await?;
        let poll_after = if request.long_poll {
            Duration::ZERO
        } else {
            self.config.sync_interval
        };
        Ok(SyncResponse {
            commands,
            poll_after,
        })
    }

    /// `queued` less the runs whose session `request` no longer shares to
    /// the project (or shares under another slug): such a run can never
    /// run here, so it ends now with the re-check's error instead of
    /// waiting for a claim.
    async fn decline_unshared(
        &self,
        device: &Device,
        request: &SyncRequest,
        mut queued: Vec<CommandRecord>,
    ) -> Result<Vec<CommandRecord>, SyncError> {
        let mut kept = Vec::with_capacity(queued.len());
        for command in queued.drain(..) {
            let shared = request.sessions.iter().any(|s| {
                s.graph_session_id == command.graph_session_id
                    && (command.slug.is_empty() || s.slug == command.slug)
            });
            if shared {
                kept.push(command);
                continue;
            }
            match self.decline(device, &command.id).await {
                Ok(_) | Err(DeclineError::NotFound | DeclineError::Refused(_)) => {}
                Err(DeclineError::Store(e)) => return Err(e.into()),
            }
        }
        Ok(kept)
    }

    /// Whether `device` long-polls once `request` is recorded: the mode
    /// the ticket's pickup hint, the lease of the next start and the
    /// desktop's liveness follow. A held sync says it does. A long-polling
    /// relay also sends syncs that are not held: one per project at the
    /// start of every pass, before it waits in a held one, and only those
    /// when the pass finds work (it then runs it and delivers the result
    /// before its next held sync). Such a sync keeps the mode recorded, so
    /// a desktop that just delivered a result is not taken for one that
    /// polls every [`QueueConfig::sync_interval`]. The first sync of a
    /// restarted relay sets the mode afresh: a relay keeps its mode for
    /// its whole life, so only a restart can change it.
    async fn long_polls_after(
        &self,
        device: &Device,
        request: &SyncRequest,
    ) -> Result<bool, StoreError> {
        if request.long_poll || request.restarted {
            return Ok(request.long_poll);
        }
        Ok(self
            .device_record(&device.owner, &device.id)
            .await?
            .is_some_and(|d| d.long_poll))
    }

    /// A relay process started: its device's running commands other than
    /// `running` can no longer be running (their process went with the old
    /// one) and end at once ([`CommandRecord::close_after_restart_in_place`]).
    async fn close_after_restart(
        &self,
        device: &Device,
        running: Option<&CommandId>,
    ) -> Result<(), StoreError> {
        let stale = self
            .store
            .running_commands(&device.owner, &device.id, MAX_RESTART_CLOSES)
            .await?;
        for command in stale.iter().filter(|c| Some(&c.id) != running) {
            let closed = self
                .transition(Party::Device(device), &command.id, |record, now| {
                    Ok::<_, std::convert::Infallible>(record.close_after_restart_in_place(now))
                })
                .await;
            match closed {
                Ok(_) | Err(TransitionError::NotFound) => {}
                Err(TransitionError::Store(e)) => return Err(e),
                Err(TransitionError::Refused(never)) => match never {},
            }
        }
        Ok(())
    }

    /// Queued commands of `project` for `device`, without writing anything
    /// (a long-poll driver calls this while holding a sync).
    pub async fn queued_for(
        &self,
        device: &Device,
        project: &ProjectId,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let queued = self
            .store
            .queued_commands(
                &device.owner,
                project,
                &device.id,
                self.config.max_commands_per_sync,
            )
            .await?;
        // The desktop starts them next: that transition can begin from
        // these copies.
        for command in &queued {
            self.live.put(command);
        }
        Ok(queued)
    }

    /// The relay starts a command under the engine's execution id. Refused if
    /// the command was cancelled meanwhile, so a cancelled command never runs.
    pub async fn start(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
    ) -> Result<CommandRecord, StartError> {
        self.touch(device).await?;
        let long_poll = self
            .device_record(&device.owner, &device.id)
            .await?
            .is_some_and(|d| d.long_poll);
        let lease = self.config.lease(long_poll);
        self.transition(Party::Device(device), id, |record, now| {
            record.start_in_place(execution, now, lease)
        })
        .await
        .map_err(|e| match e {
            TransitionError::NotFound => StartError::NotFound,
            TransitionError::Store(s) => StartError::Store(s),
            TransitionError::Refused(r) => StartError::Refused(r),
        })
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
            .transition(Party::Device(device), id, |record, now| {
                let lease = lease_of(record);
                Ok::<_, std::convert::Infallible>(record.renew_in_place(now, lease))
            })
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
    /// looks again while it waits.
    pub async fn peek_control(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<ControlAnswer, ControlError> {
        let command = self
            .store
            .command_for_device(&device.owner, &device.id, id)
            .await?
            .ok_or(ControlError::NotFound)?;
        Ok(ControlAnswer::of(&command.at(self.clock.now())))
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

    /// Refuses a share into one project more than
    /// [`QueueConfig::max_projects_per_device`]; a project the device
    /// already shares into is always fine.
    async fn check_project_bound(
        &self,
        device: &Device,
        project: &ProjectId,
    ) -> Result<(), SyncError> {
        let limit = self.config.max_projects_per_device;
        let shared = self
            .store
            .shared_projects(&device.owner, &device.id, limit.saturating_add(1))
            .await?;
        if shared.len() < limit || shared.contains(project) {
            Ok(())
        } else {
            Err(SyncError::TooManyProjects { limit })
        }
    }
}
