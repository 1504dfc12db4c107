//! A relay's sync: the desktop uploads the sessions it shares to one
//! project and takes the commands queued there for it.
//!
//! A sync is the desktop's main sign of life, so it is written unless it
//! repeats what this queue wrote for the same device and project a moment
//! ago (see `devices`). It also ends what can no longer run: the running
//! commands of a relay that restarted, and the queued runs of sessions the
//! desktop stopped sharing.

use super::{DeclineError, Party, Queue, SyncError, TransitionError};
use crate::command::{CommandRecord, CommandStatus};
use crate::ids::{CommandId, ProjectId};
use crate::limits::MAX_SESSIONS_PER_SYNC;
use crate::principal::Device;
use crate::session::SessionMeta;
use crate::store::{BoundedSync, DeviceContact, StoreError};
use std::time::Duration;

#[cfg(doc)]
use super::QueueConfig;

/// Most running commands one restart announcement closes.
const MAX_RESTART_CLOSES: usize = 100;

/// Where a sync's look at what is queued comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    /// The store.
    Store,
    /// Memory, when it tells what is queued there (nothing, or one run
    /// this queue queued; see [`Queue::queued_from_memory`]); else the
    /// store. Only the first look of a held sync, subscribed before it: a
    /// run queued just before, whose notification was still on its way,
    /// wakes the hold, and that look reads the store or memory that knows
    /// the run.
    QuietFromMemory,
}

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
        self.sync_looking(device, request, Look::Store).await
    }

    /// [`Queue::sync`], whose look at what is queued is `look`.
    pub(super) async fn sync_looking(
        &self,
        device: &Device,
        request: &SyncRequest,
        look: Look,
    ) -> Result<SyncResponse, SyncError> {
        validate_sessions(&request.sessions)?;
        let now = self.clock.now();
        if !self.sync_written_recently(device, request, now) {
            let long_poll = self.long_polls_after(device, request).await?;
            // A share into one project more than allowed is refused; a
            // project the device already shares into is always fine.
            let limit = self.config.max_projects_per_device;
            let recorded = self
                .store
                .record_sync_within(
                    &device.owner,
                    &request.project,
                    &device.id,
                    &request.sessions,
                    long_poll,
                    limit,
                    now,
                )
                .await?;
            if recorded == BoundedSync::TooManyProjects {
                return Err(SyncError::TooManyProjects { limit });
            }
            self.device_contacted(device, DeviceContact::Sync { long_poll }, now);
            self.remember_sync(device, request, long_poll, now);
            // The next run of one of these sessions is guessed onto this share.
            self.session_guesses.put_synced(
                &device.owner,
                &device.id,
                &request.project,
                &request.sessions,
            );
        }
        if request.restarted {
            self.close_after_restart(device, request.running.as_ref())
                .await?;
        }
        let queued = match look {
            Look::QuietFromMemory => {
                self.queued_remembered(device, &request.project, true)
                    .await?
            }
            Look::Store => self.queued_for(device, &request.project).await?,
        };
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
    /// relay also sends syncs that are not held: every sync of its first
    /// pass, of every pass after a failure and of every project but the
    /// last, before it waits in a held one (the last project's sync is the
    /// wait), and only unheld ones when the pass finds work (it then runs
    /// it and delivers the result before its next held sync), or when it
    /// runs a build older than that. Such a sync keeps the mode recorded, so
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
        self.long_polls(&device.owner, &device.id).await
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
    /// (a long-poll driver calls this while holding a sync). What it found
    /// is remembered until a notification says work may have come for the
    /// device: finding none, or finding runs that this queue then started,
    /// lets the first look of the device's next held sync answer without
    /// the store ([`Queue::sync_held`]).
    pub async fn queued_for(
        &self,
        device: &Device,
        project: &ProjectId,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let quiet = self.signals.quiet();
        let look = quiet.look();
        let since = self.copy_since();
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
            self.last_seen.put(command, since);
        }
        // A look cut at the limit may have missed some: not kept.
        if queued.len() < self.config.max_commands_per_sync && self.external_writes_fed() {
            let ids: Vec<CommandId> = queued.iter().map(|c| c.id).collect();
            quiet.found(look, &device.owner, &device.id, project, &ids);
        }
        Ok(queued)
    }

    /// What is queued for `device` in `project`: from memory when it tells
    /// ([`Queue::queued_from_memory`] with `quiet_too`), else from the store.
    pub(super) async fn queued_remembered(
        &self,
        device: &Device,
        project: &ProjectId,
        quiet_too: bool,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        match self.queued_from_memory(device, project, quiet_too) {
            Some(queued) => Ok(queued),
            None => self.queued_for(device, project).await,
        }
    }

    /// What is queued for `device` in `project`, told without reading the
    /// store, or `None` (read it). Only while every write of another
    /// process reaches this one as a notification:
    ///
    /// - nothing, when `quiet_too` and its last look found nothing, or only
    ///   runs this queue started since, and no notification of work for it
    ///   came since;
    /// - the one run this queue queued for it since (and nothing else came),
    ///   when this queue's copy of that run is current and still queued.
    ///   So the held sync that run wakes hands it out without a read.
    ///
    /// A hold's later looks pass `quiet_too = false`: they come after a
    /// wake-up, or after its re-look interval, the safety net that reads
    /// the store.
    fn queued_from_memory(
        &self,
        device: &Device,
        project: &ProjectId,
        quiet_too: bool,
    ) -> Option<Vec<CommandRecord>> {
        if !self.external_writes_fed() {
            return None;
        }
        let quiet = self.signals.quiet();
        if quiet_too && quiet.is_quiet(&device.owner, &device.id, project) {
            return Some(Vec::new());
        }
        let id = quiet.only_run(&device.owner, &device.id, project)?;
        let copy = self.current_copy(Party::Device(device), &id)?;
        (copy.status == CommandStatus::Queued && copy.project == *project).then(|| vec![copy])
    }
}
