//! The pass: when one starts, what it does in which order (outbox, a lost
//! claim, the synced commands, the next project's sync, the held sync), and
//! when the next one is due.

use std::collections::VecDeque;
use std::time::Duration;

use crate::ids::{CommandId, ExecutionId, ProjectId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::queue::SyncRequest;
use crate::time::{Timestamp, splitmix64};

use super::machine::Awaiting;
use super::run::Run;
use super::*;

/// When the next pass is due.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Schedule {
    /// Interval mode: the next tick (ticks keep the first pass's phase).
    pub(super) next_tick: Timestamp,
    /// Long-poll mode: the next pass starts then.
    pub(super) wake_at: Option<Timestamp>,
    /// Interval mode: the shared set changed while idle, a pass runs now.
    pub(super) requested: bool,
}

/// The pass in progress, if [`Pass::active`].
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Pass {
    pub(super) active: bool,
    /// Projects still to sync in this pass.
    pub(super) projects: VecDeque<ProjectId>,
    /// Commands the last sync handed out, not yet claimed.
    pub(super) commands: VecDeque<RelayCommand>,
    /// How many commands this pass's syncs handed out.
    pub(super) work: usize,
    /// The held sync of this pass was sent (or is not to be sent).
    pub(super) held_done: bool,
}

/// What the outbox still holds from before this pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct OutboxState {
    /// Loaded at the start of the pass, re-sent one at a time.
    pub(super) retry: VecDeque<OutboxItem>,
    /// The outbox re-send of this pass left nothing behind (the restart
    /// announcement waits for it).
    pub(super) clear: bool,
}

/// A claim without an answer, claimed again first on the next pass.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct UnconfirmedClaim {
    pub(super) command: RelayCommand,
    pub(super) execution: ExecutionId,
    /// The owner had approved the run already.
    pub(super) approved: bool,
}

impl Relay {
    pub(super) fn should_start_pass(&self, now: Timestamp) -> bool {
        match self.config.mode {
            RelayMode::Interval => self.schedule.requested || now >= self.schedule.next_tick,
            RelayMode::LongPoll => self.schedule.wake_at.is_some_and(|t| now >= t),
        }
    }

    fn start_pass(&mut self, now: Timestamp) {
        self.pass.active = true;
        self.schedule.requested = false;
        self.schedule.wake_at = None;
        if self.config.mode == RelayMode::Interval {
            // Ticks keep their phase; ticks missed while busy are skipped.
            let interval = self.config.pass_interval.as_millis().max(1) as u64;
            while self.schedule.next_tick <= now {
                self.schedule.next_tick = Timestamp(self.schedule.next_tick.as_millis() + interval);
            }
        }
        self.pass.work = 0;
        self.pass.held_done = false;
        // The enabled projects, then the remembered ones no longer enabled
        // (synced with an empty list, which ends their shares on the server).
        self.pass.projects = self.shared.projects().cloned().collect();
        let retired: Vec<ProjectId> = self
            .synced
            .iter()
            .filter(|p| !self.is_enabled(p))
            .cloned()
            .collect();
        self.pass.projects.extend(retired);
        self.events.push_back(RelayEvent::PassStarted);
        self.awaiting = Awaiting::OutboxLoad;
        self.actions.push_back(Action::LoadOutbox);
    }

    pub(super) fn end_pass(&mut self, now: Timestamp) {
        self.pass.active = false;
        if self.config.mode == RelayMode::Interval {
            // Ticks that fell while the pass was busy were skipped.
            let interval = self.config.pass_interval.as_millis().max(1) as u64;
            while self.schedule.next_tick < now {
                self.schedule.next_tick = Timestamp(self.schedule.next_tick.as_millis() + interval);
            }
        }
        let next = match self.config.mode {
            RelayMode::Interval => Some(self.schedule.next_tick),
            RelayMode::LongPoll => {
                if self.link.failures > 0 {
                    Some(now.plus(self.backoff()))
                } else if self.shared.projects().next().is_none() && !self.has_retired() {
                    // Nothing enabled: wait for a change, but look again now and then.
                    Some(now.plus(self.config.pass_interval))
                } else {
                    Some(now)
                }
            }
        };
        if self.config.mode == RelayMode::LongPoll {
            self.schedule.wake_at = next;
        }
        self.events.push_back(RelayEvent::PassFinished { next });
    }

    /// Moves the pass forward until it must wait for an answer.
    pub(super) fn drive(&mut self, now: Timestamp) {
        if self.stopping() {
            self.drive_stop();
            return;
        }
        loop {
            if !matches!(self.awaiting, Awaiting::Nothing) {
                return;
            }
            if !self.pass.active {
                if self.should_start_pass(now) {
                    self.start_pass(now);
                    continue;
                }
                return;
            }
            if self.next_step(now) {
                return;
            }
            self.end_pass(now);
        }
    }

    /// Sends the pass's next request; false when the pass has nothing left.
    fn next_step(&mut self, now: Timestamp) -> bool {
        // 1. Re-send what the outbox still holds.
        if let Some(item) = self.outbox.retry.pop_front() {
            self.awaiting = Awaiting::OutboxPost(item.command);
            self.actions.push_back(Action::PostReport(item));
            return true;
        }
        // 2. A claim whose answer was lost, first and under the same execution id.
        if let Some(claim) = self.unconfirmed.take() {
            self.claim_again(claim, now);
            return true;
        }
        // 3. The commands of the last sync, one at a time, re-checked first.
        if let Some(command) = self.pass.commands.pop_front() {
            self.claim(command, now);
            return true;
        }
        // 4. The next project's sync. In long-poll mode, when it is the
        // pass's last and the pass found nothing, it is also the pass's
        // wait: held, it answers at once if work is queued and else when
        // work arrives, so one request does what an unheld sync and then a
        // held one would. Not before the relay's start is announced: the
        // first syncs of a process are answered at once, which is how the
        // server ends what the previous process left running and how the
        // owner sees the desktop connect.
        if let Some(project) = self.pass.projects.pop_front() {
            let held = self.pass.projects.is_empty()
                && !self.restarted
                && self.is_enabled(&project)
                && self.wait_here();
            self.pass.held_done |= held;
            self.send_sync(project, held);
            return true;
        }
        // 5. Long-poll: a pass that found nothing and has not waited yet
        // (its last sync emptied a project no longer enabled) waits in one
        // held sync.
        let first_project = self.shared.projects().next().cloned();
        if let (true, Some(project)) = (self.wait_here(), first_project) {
            self.pass.held_done = true;
            self.send_sync(project, true);
            return true;
        }
        false
    }

    /// Whether this pass should wait in a held sync: long-poll mode, no
    /// work found, not waited yet, and the server answering.
    fn wait_here(&self) -> bool {
        self.config.mode == RelayMode::LongPoll
            && self.pass.work == 0
            && !self.pass.held_done
            && self.link.failures == 0
    }

    /// Claims again a command whose claim got no answer.
    fn claim_again(&mut self, claim: UnconfirmedClaim, now: Timestamp) {
        let UnconfirmedClaim {
            command,
            execution,
            approved,
        } = claim;
        let id = command.id;
        let run = Run::claiming(command, execution.clone(), approved);
        let c = &run.job.command;
        if self
            .shared
            .still_shared(&c.project, &c.graph_session_id, &c.slug)
        {
            self.awaiting = Awaiting::Run(Box::new(run));
            self.actions.push_back(Action::Claim {
                command: id,
                execution,
            });
        } else {
            // Consent was withdrawn meanwhile. If the lost claim did reach
            // the server, that execution is closed as cancelled; if it did
            // not, the server refuses this report and the command comes back
            // queued on a sync, where the re-check declines it.
            self.close_withdrawn(run, now);
        }
    }

    /// Claims a command a sync handed out, or declines it if the re-check fails.
    fn claim(&mut self, command: RelayCommand, now: Timestamp) {
        let id = command.id;
        if !self
            .shared
            .still_shared(&command.project, &command.graph_session_id, &command.slug)
        {
            self.events.push_back(RelayEvent::Declined { command: id });
            self.awaiting = Awaiting::StoreDeclined(id);
            self.actions
                .push_back(Action::StoreReport(declined_item(id, now)));
            return;
        }
        let execution = self.new_execution_id(&id);
        let run = Run::claiming(command, execution.clone(), false);
        self.awaiting = Awaiting::Run(Box::new(run));
        self.actions.push_back(Action::Claim {
            command: id,
            execution,
        });
    }

    /// Syncs `project` with its shared sessions (none if it is no longer
    /// enabled); `held` asks the server to hold the request until work
    /// arrives. An enabled project is remembered before its first sync.
    pub(super) fn send_sync(&mut self, project: ProjectId, held: bool) {
        if self.is_enabled(&project) && self.synced.insert(project.clone()) {
            self.actions
                .push_back(Action::RememberProject(project.clone()));
        }
        let sessions = self.shared.sessions(&project);
        let running = self.executing();
        // A restart is announced only once the outbox is empty, so that a
        // result recorded before the crash reaches the server first.
        let announced = self.restarted && self.outbox.clear;
        self.awaiting = Awaiting::Sync {
            project: project.clone(),
            held,
            announced,
            empty: sessions.is_empty(),
        };
        self.actions.push_back(Action::Sync(SyncRequest {
            project,
            sessions,
            long_poll: held,
            restarted: announced,
            running,
        }));
    }

    /// The command claimed and not finished: waiting for approval, or executing.
    pub(super) fn executing(&self) -> Option<CommandId> {
        self.awaiting
            .run()
            .filter(|r| r.claimed_and_open())
            .map(Run::id)
    }

    pub(super) fn is_enabled(&self, project: &ProjectId) -> bool {
        self.shared.is_enabled(project)
    }

    /// True when a remembered project is no longer enabled (its shares on
    /// the server still need to be emptied).
    fn has_retired(&self) -> bool {
        self.synced.iter().any(|p| !self.is_enabled(p))
    }

    fn next_random(&mut self) -> u64 {
        self.rng = splitmix64(self.rng);
        self.rng
    }

    fn backoff(&mut self) -> Duration {
        let exp = self.link.failures.saturating_sub(1).min(16);
        let base = self
            .config
            .backoff_min
            .saturating_mul(1u32 << exp)
            .min(self.config.backoff_max);
        // Equal jitter: between half and the whole back-off, so that
        // desktops that lost the same server come back spread over half of
        // it, and none of them retries sooner than half of it.
        let half = base / 2;
        let span = u64::try_from(half.as_millis()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_millis(self.next_random() % span)
    }

    fn new_execution_id(&mut self, command: &CommandId) -> ExecutionId {
        let salt = self.next_random();
        let text = format!("exec-{}-{:08x}", command.as_uuid().simple(), salt as u32);
        ExecutionId::parse(&text)
            .unwrap_or_else(|_| unreachable!("hex and dashes form a valid execution id"))
    }
}

/// The report of a command the re-check declined (no execution: it never ran).
pub(super) fn declined_item(command: CommandId, now: Timestamp) -> OutboxItem {
    OutboxItem {
        command,
        report: RelayReport::Declined,
        stored_at: now,
        attempts: 0,
    }
}
