//! The invariants every action of the relay must keep.

use super::*;

impl RelayFuzz {
    /// Checks one action of the relay against what it may do now, and
    /// records it as in flight.
    pub(super) fn check_action(&mut self, action: Action) {
        let Self {
            relay,
            desktop,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        match action {
            Action::LoadOutbox => flight.load = true,
            Action::Sync(SyncRequest {
                project,
                sessions,
                restarted,
                running,
                ..
            }) => self.check_sync(project, sessions, restarted, running),
            Action::RememberProject(project) => {
                assert!(
                    relay.shared().is_enabled(&project),
                    "only an enabled project is remembered"
                );
                desktop.remembered.insert(project);
            }
            Action::ForgetProject(project) => self.check_forget_project(project),
            Action::AbortHeldSync => {
                if flight.sync.take().is_some() {
                    relay.handle_sync_response(Err(SyncFailure::Aborted), now);
                }
            }
            Action::Claim { command, execution } => self.check_claim(command, execution),
            Action::AskApproval { job, .. } => self.check_ask_approval(job),
            Action::WithdrawApproval { command } => {
                assert_eq!(
                    seen.asking.take().map(|(c, _)| c),
                    Some(command),
                    "only an open question is withdrawn"
                );
            }
            Action::Execute(job) => self.check_execute(job),
            Action::Control { command, .. } => {
                assert!(
                    !seen.told_closed.contains(&command),
                    "no control request for a run the server closed"
                );
                flight.controls.push(command);
            }
            Action::CancelExecution { command } => {
                assert_eq!(seen.running.as_ref().map(|(c, _)| *c), Some(command));
                assert!(seen.cancels.insert(command), "the engine is stopped once");
            }
            Action::PostProgress {
                command,
                execution,
                report,
            } => self.check_progress_post(command, execution, report),
            Action::StoreReport(item) => self.check_store_report(item),
            Action::PostReport(item) => self.check_post_report(item),
            Action::RemoveReport(command) => {
                assert_eq!(
                    seen.may_remove.remove(&command),
                    Some(true),
                    "an outbox item was dropped without a 2xx or a final refusal"
                );
                desktop.outbox.remove(&command);
            }
            Action::RecordAttempt(_) => {}
        }
    }

    /// A forgotten project: no longer enabled, and no share of it left on
    /// the server.
    fn check_forget_project(&mut self, project: ProjectId) {
        assert!(
            !self.relay.shared().is_enabled(&project),
            "only a project no longer enabled is forgotten"
        );
        assert!(
            !self.server.shares.contains(&project),
            "a project is forgotten only once the server holds no shares there"
        );
        self.desktop.remembered.remove(&project);
    }

    /// A claim: one run at a time, of a command still shared as offered.
    fn check_claim(&mut self, command: CommandId, execution: ExecutionId) {
        assert!(
            self.seen.running.is_none(),
            "never claims while a command runs"
        );
        assert!(self.seen.asking.is_none(), "never claims while a run waits");
        // A claim starts a new attempt at the run: the answers to
        // the progress posts of an earlier one are lost.
        self.flight.progress.retain(|(c, _)| *c != command);
        self.seen.last_progress_post.remove(&command);
        let c = &self.server.offered[&command];
        assert!(
            self.relay
                .shared()
                .still_shared(&c.project, &c.graph_session_id, &c.slug),
            "a claim always follows a re-check that holds now"
        );
        self.flight.claim = Some((command, execution));
    }

    /// An approval asked: for a Graph that needs it, of a run claimed and
    /// nothing else running or waiting.
    fn check_ask_approval(&mut self, job: Job) {
        assert!(
            self.shared
                .approval(&job.command.graph_session_id)
                .is_some(),
            "approval is asked only for a Graph that needs it"
        );
        assert!(self.seen.running.is_none() && self.seen.asking.is_none());
        assert!(
            matches!(
                self.server.state(&job.command.id, self.now),
                Some(ServerState::Running { execution, .. }) if execution == job.execution
            ),
            "a run waits for approval once claimed"
        );
        self.seen.asking = Some((job.command.id, job.execution));
    }

    /// A report posted: never one the server refused for good.
    fn check_post_report(&mut self, item: OutboxItem) {
        assert!(
            !self
                .seen
                .refused
                .iter()
                .any(|r| r.command == item.command && r.report == item.report),
            "a report refused for good is never posted again"
        );
        self.flight.posts.push(item);
    }

    /// A sync the relay sends: one at a time, naming what runs, sharing only remembered projects.
    fn check_sync(
        &mut self,
        project: ProjectId,
        sessions: Vec<SessionMeta>,
        restarted: bool,
        running: Option<CommandId>,
    ) {
        let Self {
            relay,
            desktop,
            flight,
            seen,
            epoch,
            ..
        } = self;
        let epoch = *epoch;
        assert!(flight.sync.is_none(), "one sync at a time");
        assert!(sessions.len() <= 100);
        assert!(
            relay.shared().is_enabled(&project) || sessions.is_empty(),
            "a project no longer enabled is synced with an empty list"
        );
        assert_eq!(
            running,
            seen.running
                .as_ref()
                .or(seen.asking.as_ref())
                .map(|(c, _)| *c),
            "a sync names the command the relay executes or asks about"
        );
        if restarted {
            assert!(
                desktop.outbox.values().all(|(e, _)| *e == epoch),
                "a restart is announced only once the reports from before it are delivered"
            );
        }
        if !sessions.is_empty() {
            assert!(
                desktop.remembered.contains(&project),
                "a project is remembered before a sync shares into it"
            );
        }
        flight.sync = Some((project, sessions, restarted, running));
    }

    /// An execution the relay starts: one at a time, approved when it must be, claimed and still shared.
    fn check_execute(&mut self, job: Job) {
        let Self {
            relay,
            server,
            seen,
            shared,
            now,
            ..
        } = self;
        let now = *now;
        assert!(seen.running.is_none(), "never two commands at once");
        assert!(seen.asking.is_none(), "nothing runs while a run waits");
        if shared.approval(&job.command.graph_session_id).is_some() {
            assert!(
                seen.approved.remove(&job.command.id),
                "nothing that needs approval runs unless approved"
            );
        }
        assert!(
            matches!(
                server.state(&job.command.id, now),
                Some(ServerState::Running { execution, .. }) if execution == job.execution
            ),
            "only a command running on the server under this execution runs"
        );
        assert!(
            relay.shared().still_shared(
                &job.command.project,
                &job.command.graph_session_id,
                &job.command.slug
            ),
            "the re-check held when it was claimed"
        );
        seen.running = Some((job.command.id, job.execution));
    }

    /// A progress post: of the claimed execution, one at a time, at most one per interval, the latest report.
    fn check_progress_post(
        &mut self,
        command: CommandId,
        execution: ExecutionId,
        report: ProgressReport,
    ) {
        let Self {
            flight,
            seen,
            now,
            config,
            ..
        } = self;
        let now = *now;
        let own = Some(&(command, execution.clone()));
        assert!(
            seen.running.as_ref() == own || seen.asking.as_ref() == own,
            "progress only of the claimed execution"
        );
        assert!(
            !seen.told_closed.contains(&command),
            "no progress for a run the server closed"
        );
        assert!(
            flight.progress.iter().all(|(c, _)| *c != command),
            "one progress post of a run at a time"
        );
        if let Some(last) = seen.last_progress_post.get(&command) {
            assert!(
                now.since(*last) >= config.progress_interval,
                "at most one progress post per interval"
            );
        }
        let relays_own = matches!(
            report.message.as_deref(),
            Some(WAITING_FOR_APPROVAL | APPROVED_ON_THE_DESKTOP)
        );
        if !relays_own {
            assert_eq!(
                seen.latest_progress.get(&command),
                Some(&report),
                "the latest report is posted"
            );
        }
        seen.last_progress_post.insert(command, now);
        flight.progress.push((command, execution));
    }

    /// A report the relay stores before posting it.
    fn check_store_report(&mut self, item: OutboxItem) {
        let Self {
            desktop,
            flight,
            seen,
            epoch,
            ..
        } = self;
        let epoch = *epoch;
        assert!(
            !seen.told_closed.contains(&item.command),
            "nothing is reported of a run the server closed"
        );
        if seen.owner_cancelled.contains(&item.command)
            && let RelayReport::Completion { envelope } = &item.report
        {
            assert_eq!(envelope.status, FinishStatus::Cancelled);
            assert!(
                envelope
                    .body
                    .as_ref()
                    .and_then(|b| b.error.as_deref())
                    .is_some_and(|e| e.starts_with(CANCELLED_ON_THE_DESKTOP)),
                "a run the owner cancelled says so: {envelope:?}"
            );
        }
        if seen
            .asking
            .as_ref()
            .is_some_and(|(c, _)| *c == item.command)
        {
            // Denied: the question is answered, nothing ran.
            seen.asking = None;
        }
        desktop.outbox.insert(item.command, (epoch, item.clone()));
        flight.store = Some(item.command);
    }
}
