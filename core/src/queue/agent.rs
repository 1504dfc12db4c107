//! The agent's side of the queue: queue a run, read it (at once or after a
//! wait), cancel it, list the sessions it may run.
//!
//! A queued run's answer carries a pickup hint: when its desktop will
//! probably take it up, from the cadence the desktop syncs at, and since
//! when the desktop looks offline if it does.

use super::session_guess::Share;
use super::{
    CancelError, GetError, ListError, Party, Queue, QueueConfig, RunError, TransitionError,
};
use crate::args::RunArgs;
use crate::command::{CommandRecord, CommandStatus, Progress, request_fingerprint};
use crate::hold::Look;
use crate::ids::{CommandId, GraphSessionId, IdempotencyKey, ProjectId};
use crate::principal::Agent;
use crate::session::SharedSession;
use crate::store::{DeviceRecord, GuardedInsert, IdempotencyRecord, InsertOutcome, StoreError};
use crate::time::{Sleeper, Timestamp};
use std::time::Duration;

#[cfg(doc)]
use crate::signals::Signals;

/// The ticket `run_graph_session` returns.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTicket {
    /// The command (new, or the first one for a replayed key).
    pub command: CommandRecord,
    /// True when the key had been used already and no run was queued.
    pub replayed: bool,
    /// When to call `get_graph_run` first.
    pub poll_after_seconds: u64,
}

impl RunTicket {
    /// A sentence for the model: this is a ticket, not a result.
    pub fn message(&self) -> String {
        let what = if self.replayed {
            "This idempotency_key was already used for the same request, so no second run was queued; this is the original ticket."
        } else {
            "The Graph run is queued; it has not started yet."
        };
        format!(
            "{what} The owner's desktop picks it up on its next pass. Call get_graph_run with command_id {} to read its progress and result (first check in about {} s).",
            self.command.id, self.poll_after_seconds
        )
    }
}

/// A run as its agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    /// The command.
    pub command: CommandRecord,
    /// When to look again; `None` once terminal.
    pub poll_after_seconds: Option<u64>,
    /// Set when a queued run's desktop looks offline: since when.
    pub device_offline_since: Option<Timestamp>,
}

/// The sessions of one project as `list_graph_sessions` shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    /// The project.
    pub project: ProjectId,
    /// What the relays' last syncs uploaded.
    pub sessions: Vec<SharedSession>,
}

impl Queue {
    /// Queues a run and returns its ticket at once (or the first ticket for a
    /// retried key). See the module docs for idempotency and project lookup.
    pub async fn run_graph_session(
        &self,
        agent: &Agent,
        args: RunArgs,
    ) -> Result<RunTicket, RunError> {
        let now = self.clock.now();
        let fingerprint = request_fingerprint(&args.graph_session_id, &args.arguments);
        let RunArgs {
            graph_session_id: session,
            arguments,
            idempotency_key,
        } = args;
        let projects: Vec<ProjectId> = agent.projects.iter().cloned().collect();
        let since = self.copy_since();
        // The share this session resolved to last time, checked by the
        // insert itself (see `session_guess`); else looked up first.
        let guess = self.session_guesses.get(&agent.owner, &session, &projects);
        let guessed = guess.is_some();
        let share = match guess {
            Some(share) => share,
            None => match self.look_up_share(agent, &projects, &session).await? {
                Some(share) => share,
                None => {
                    return self
                        .unshared(agent, &idempotency_key, &fingerprint, now)
                        .await;
                }
            },
        };
        // A reused key is found by the insert itself (`KeyTaken`), atomically.
        let mut command = CommandRecord::queued(
            self.ids.new_command_id(),
            agent.id.clone(),
            agent.owner.clone(),
            share.project,
            share.device,
            session,
            arguments,
            idempotency_key,
            now,
        );
        command.slug = share.slug;
        let key = IdempotencyRecord {
            owner: agent.owner.clone(),
            agent: agent.id.clone(),
            key: command.idempotency_key.clone(),
            command: command.id,
            fingerprint: fingerprint.clone(),
            expires_at: now.plus(self.config.idempotency_ttl),
        };
        let outcome = if guessed {
            match self
                .store
                .insert_command_if_shared(&command, &key, &projects, now)
                .await?
            {
                GuardedInsert::Checked(outcome) => outcome,
                GuardedInsert::SessionChanged => {
                    // Nothing was written: the same command, pointed at
                    // the share as it is now.
                    let session = &command.graph_session_id;
                    self.session_guesses.forget(&agent.owner, session);
                    let Some(share) = self.look_up_share(agent, &projects, session).await? else {
                        return self.unshared(agent, &key.key, &fingerprint, now).await;
                    };
                    command.project = share.project;
                    command.device = share.device;
                    command.slug = share.slug;
                    self.store.insert_command(&command, &key, now).await?
                }
            }
        } else {
            self.store.insert_command(&command, &key, now).await?
        };
        match outcome {
            InsertOutcome::Inserted => {
                self.last_seen.put(&command, since);
                self.signals.notify_queued(
                    &command.owner,
                    &command.device,
                    &command.project,
                    command.id,
                );
                let poll_after_seconds = self.pickup_hint(&command, now).await?.0;
                Ok(RunTicket {
                    command,
                    replayed: false,
                    poll_after_seconds,
                })
            }
            InsertOutcome::KeyTaken(existing) => {
                self.replay(agent, existing, &fingerprint, now).await
            }
        }
    }

    /// The share of `session` among `projects` (remembered as the next
    /// run's guess), or `None` when no project of the agent has it.
    async fn look_up_share(
        &self,
        agent: &Agent,
        projects: &[ProjectId],
        session: &GraphSessionId,
    ) -> Result<Option<Share>, StoreError> {
        let share = self
            .store
            .find_shared_session(&agent.owner, projects, session)
            .await?
            .map(Share::from);
        if let Some(share) = &share {
            self.session_guesses
                .put(&agent.owner, session, projects, share);
        }
        Ok(share)
    }

    /// The answer to a run of a session no project of the agent has: a
    /// retry still gets its ticket (the session may have been un-shared
    /// since its first request); anything else is not found.
    async fn unshared(
        &self,
        agent: &Agent,
        key: &IdempotencyKey,
        fingerprint: &str,
        now: Timestamp,
    ) -> Result<RunTicket, RunError> {
        match self
            .store
            .idempotency(&agent.owner, &agent.id, key, now)
            .await?
        {
            Some(existing) => self.replay(agent, existing, fingerprint, now).await,
            None => Err(RunError::SessionNotFound),
        }
    }

    async fn replay(
        &self,
        agent: &Agent,
        existing: IdempotencyRecord,
        fingerprint: &str,
        now: Timestamp,
    ) -> Result<RunTicket, RunError> {
        if existing.fingerprint != fingerprint {
            return Err(RunError::KeyReused {
                command: existing.command,
            });
        }
        let command = self
            .store
            .command_for_agent(&agent.owner, &agent.id, &existing.command)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "idempotency key points at missing command {}",
                    existing.command
                ))
            })?;
        let poll_after_seconds = self
            .view(command.clone(), now)
            .await?
            .poll_after_seconds
            .unwrap_or(0);
        Ok(RunTicket {
            command,
            replayed: true,
            poll_after_seconds,
        })
    }

    /// Reads a run of this agent.
    pub async fn get_graph_run(&self, agent: &Agent, id: &CommandId) -> Result<RunView, GetError> {
        self.read_graph_run(agent, id, Source::Store).await
    }

    /// [`Queue::get_graph_run`], an open run read from where `source` says.
    async fn read_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
        source: Source,
    ) -> Result<RunView, GetError> {
        let now = self.clock.now();
        if let Some(finished) = self.finished.get(&Party::Agent(agent), id, now) {
            return Ok(self.view(finished, now).await?);
        }
        if source == Source::CurrentCopy {
            // A copy that looks lapsed is read again: another server may
            // have renewed the lease without a notification.
            let copy = self.current_copy(Party::Agent(agent), id);
            if let Some(copy) = copy.filter(|copy| !copy.is_lapsed(now)) {
                return Ok(self.view(copy, now).await?);
            }
        }
        let command = self
            .store
            .command_for_agent(&agent.owner, &agent.id, id)
            .await?
            .ok_or(GetError::NotFound)?;
        self.finished.put(&command, now);
        let command = if command.is_lapsed(now) {
            // The lease lapsed and nothing closed the run yet: close it now,
            // so this read and every later one agree.
            self.transition(Party::Agent(agent), id, |record, now| {
                Ok::<_, std::convert::Infallible>(record.lapse_in_place(now))
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => GetError::NotFound,
                TransitionError::Store(s) => GetError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?
        } else {
            command
        };
        Ok(self.view(command, now).await?)
    }

    /// Reads a run of this agent, waiting up to `wait` for it to reach a
    /// terminal state. It returns as soon as the run is terminal (woken by the
    /// queue's [`Signals`], not by polling), or when `wait` has passed. While
    /// waiting it re-reads the store every [`QueueConfig::wait_recheck`] so
    /// that a change made by another process on a shared store is seen too
    /// (unless every such change reaches this process as a notification:
    /// [`Queue::external_writes_fed`]).
    ///
    /// A look of an open run answers from this queue's copy of it while the
    /// copy is current: every other process's write reaches this one as a
    /// notification and none of the run came since the copy was made (see
    /// `last_seen`). Most waits follow a run this queue queued or started
    /// itself, and then read no store until the run ends.
    pub async fn wait_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
        wait: Duration,
        sleeper: &dyn Sleeper,
    ) -> Result<RunView, GetError> {
        self.watch_graph_run(agent, id, wait, sleeper, &mut |_| {})
            .await
    }

    /// [`Queue::wait_graph_run`], calling `observe` with the run as it is
    /// first read and again whenever its status or its progress changes
    /// while the call waits (each progress report the desktop makes, as
    /// far as the throttle of [`QueueConfig::progress_interval`] lets them
    /// through). The run returned at the end is not passed to `observe`.
    /// This is what MCP progress notifications are made from.
    pub async fn watch_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
        wait: Duration,
        sleeper: &dyn Sleeper,
        observe: &mut (dyn FnMut(&RunView) + Send),
    ) -> Result<RunView, GetError> {
        let hold = self.run_hold(id, wait);
        // The last status and progress passed to `observe`.
        let seen: std::sync::Mutex<Option<(CommandStatus, Option<Progress>)>> =
            std::sync::Mutex::new(None);
        let observe = std::sync::Mutex::new(observe);
        let (seen, observe) = (&seen, &observe);
        hold.run(&self.signals, &*self.clock, sleeper, || async move {
            let view = self.read_graph_run(agent, id, Source::CurrentCopy).await?;
            if view.command.status.is_terminal() {
                return Ok(Look::Ready(view));
            }
            let state = (view.command.status, view.command.progress.clone());
            let mut last = seen.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_ref() != Some(&state) {
                (observe.lock().unwrap_or_else(|p| p.into_inner()))(&view);
                *last = Some(state);
            }
            Ok(Look::NotYet(view))
        })
        .await
    }

    /// Cancels a run of this agent and returns it as it now is: a queued run
    /// ends `cancelled` at once, a running one is flagged for its desktop (or
    /// ends `cancelled` at once if its lease lapsed), a closed one is left as
    /// it is (see [`command`](crate::command)).
    pub async fn cancel_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
    ) -> Result<RunView, CancelError> {
        let record = self
            .transition(Party::Agent(agent), id, |record, now| {
                Ok::<_, std::convert::Infallible>(record.cancel_in_place(now))
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => CancelError::NotFound,
                TransitionError::Store(s) => CancelError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?;
        let now = self.clock.now();
        Ok(self.view(record, now).await?)
    }

    /// The sessions shared to one of the agent's projects (at most `limit`).
    pub async fn list_graph_sessions(
        &self,
        agent: &Agent,
        project: &ProjectId,
        limit: u32,
    ) -> Result<SessionList, ListError> {
        if !agent.reaches(project) {
            return Err(ListError::ProjectNotFound);
        }
        let sessions = self
            .store
            .shared_sessions(
                &agent.owner,
                project,
                limit.clamp(crate::limits::MIN_LIST_LIMIT, crate::limits::MAX_LIST_LIMIT) as usize,
            )
            .await?;
        Ok(SessionList {
            project: project.clone(),
            sessions,
        })
    }

    async fn view(&self, command: CommandRecord, now: Timestamp) -> Result<RunView, StoreError> {
        // What a read shows is the run as it is now (a lapsed lease closes it).
        let command = match command.at(now) {
            std::borrow::Cow::Borrowed(_) => command,
            std::borrow::Cow::Owned(closed) => closed,
        };
        let (poll_after_seconds, device_offline_since) = match command.status {
            CommandStatus::Queued => {
                let (secs, offline) = self.pickup_hint(&command, now).await?;
                (Some(secs), offline)
            }
            CommandStatus::Running => (Some(self.config.running_poll_hint.as_secs().max(1)), None),
            _ => (None, None),
        };
        Ok(RunView {
            command,
            poll_after_seconds,
            device_offline_since,
        })
    }

    /// When a queued command will probably be picked up, from the device's
    /// cadence; and since when the device looks offline, if it does. A
    /// device whose held sync waits here, or did a moment ago, picks it up
    /// at once: nothing to read (see [`waiting`](super::waiting)).
    async fn pickup_hint(
        &self,
        command: &CommandRecord,
        now: Timestamp,
    ) -> Result<(u64, Option<Timestamp>), StoreError> {
        if self.waiting.contains(&command.owner, &command.device) {
            return Ok(AT_ONCE);
        }
        let device = self.device_record(&command.owner, &command.device).await?;
        Ok(pickup_hint(
            &self.config,
            device.as_ref(),
            command.created_at,
            now,
        ))
    }
}

/// Where a read of an open run comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The store.
    Store,
    /// This queue's copy when it is current (see `last_seen`), else the store.
    CurrentCopy,
}

/// The pickup hint of an online long-polling desktop: in about a second,
/// not offline.
const AT_ONCE: (u64, Option<Timestamp>) = (1, None);

/// Pure part of [`Queue::pickup_hint`].
fn pickup_hint(
    config: &QueueConfig,
    device: Option<&DeviceRecord>,
    created_at: Timestamp,
    now: Timestamp,
) -> (u64, Option<Timestamp>) {
    let interval_secs = config.sync_interval.as_secs().max(1);
    let Some(device) = device else {
        return (interval_secs, Some(created_at));
    };
    let Some(last_sync) = device.last_sync_at else {
        return (interval_secs, Some(device.last_seen_at));
    };
    let expected_gap = if device.long_poll {
        config.long_poll_hold
    } else {
        config.sync_interval
    };
    let offline_after = expected_gap * config.offline_after_missed_syncs.max(1);
    let last_contact = last_sync.max(device.last_seen_at);
    if now.since(last_contact) > offline_after {
        return (interval_secs, Some(last_contact));
    }
    if device.long_poll {
        return AT_ONCE;
    }
    let next_due = last_sync.plus(config.sync_interval);
    let wait_ms = next_due.as_millis().saturating_sub(now.as_millis());
    (wait_ms.div_ceil(1000).clamp(1, interval_secs) + 1, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{DeviceId, OwnerId};

    fn device(last_sync: Option<u64>, last_seen: u64, long_poll: bool) -> DeviceRecord {
        DeviceRecord {
            device: DeviceId::parse("d").unwrap(),
            owner: OwnerId::parse("o").unwrap(),
            last_sync_at: last_sync.map(Timestamp),
            last_seen_at: Timestamp(last_seen),
            long_poll,
        }
    }

    #[test]
    fn pickup_hint_follows_the_relay_cadence() {
        let c = QueueConfig::default();
        // Interval mode: synced 5 s ago, next pass due in 15 s.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(0), 0, false)),
                Timestamp(0),
                Timestamp(5_000)
            ),
            (16, None)
        );
        // Long-poll: picked up at once.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(0), 0, true)),
                Timestamp(0),
                Timestamp(5_000)
            ),
            (1, None)
        );
        // Missed three passes: offline since the last contact.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(1_000), 1_000, false)),
                Timestamp(0),
                Timestamp(62_000)
            ),
            (20, Some(Timestamp(1_000)))
        );
        // Never seen.
        assert_eq!(
            pickup_hint(&c, None, Timestamp(7), Timestamp(9)),
            (20, Some(Timestamp(7)))
        );
    }
}
