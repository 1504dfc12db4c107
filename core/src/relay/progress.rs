//! The progress of the current run: coalesced, posted at most once per
//! interval, one post at a time, and never through the outbox.

use crate::command::InvalidProgress;
use crate::ids::{CommandId, ExecutionId};
use crate::relay::executor::ProgressReport;
use crate::time::Timestamp;

use super::*;

/// The progress of the current run on its way to the server.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct ProgressState {
    /// The latest report not posted yet.
    pub(super) pending: Option<ProgressReport>,
    /// When the last post was sent.
    pub(super) last_post: Option<Timestamp>,
    pub(super) in_flight: bool,
    /// The server refused a report for good: send no more.
    pub(super) refused: bool,
}

impl Relay {
    /// The executor reports the progress of `command`'s execution
    /// `execution`. Kept as the run's latest report and posted at once, or
    /// when [`RelayConfig::progress_interval`] has passed since the last post
    /// and that post was answered. A report of an execution that is not
    /// running (it ended, or the server closed it) is dropped. An invalid
    /// report is refused and changes nothing.
    pub fn handle_progress(
        &mut self,
        command: CommandId,
        execution: &ExecutionId,
        report: ProgressReport,
        now: Timestamp,
    ) -> Result<(), InvalidProgress> {
        report.check()?;
        if let Some(run) = self
            .awaiting
            .run_mut()
            .filter(|r| r.id() == command && r.job.execution == *execution && r.takes_progress())
        {
            run.progress.pending = Some(report);
            self.maybe_send_progress(now);
        }
        Ok(())
    }

    /// The answer to [`Action::PostProgress`]. A final refusal (the run is
    /// no longer running under this execution) stops progress for the run;
    /// any other failure only loses that report.
    pub fn handle_progress_posted(
        &mut self,
        command: CommandId,
        outcome: PostOutcome,
        now: Timestamp,
    ) {
        let Some(run) = self
            .awaiting
            .run_mut()
            .filter(|r| r.id() == command && r.progress.in_flight)
        else {
            return;
        };
        run.progress.in_flight = false;
        match outcome {
            PostOutcome::Acknowledged => {
                self.events
                    .push_back(RelayEvent::ProgressPosted { command });
            }
            PostOutcome::Rejected(reason) => {
                run.progress.refused = true;
                run.progress.pending = None;
                self.events
                    .push_back(RelayEvent::ProgressRefused { command, reason });
            }
            PostOutcome::Retry(_) => {}
        }
        self.maybe_send_progress(now);
    }

    /// Posts the current run's pending progress if its interval has passed
    /// and no post is in flight.
    pub(super) fn maybe_send_progress(&mut self, now: Timestamp) {
        if self.stopping() {
            return;
        }
        let interval = self.config.progress_interval;
        let Some(run) = self.awaiting.run_mut() else {
            return;
        };
        if !run.takes_progress()
            || run.progress.in_flight
            || run
                .progress
                .last_post
                .is_some_and(|t| now < t.plus(interval))
        {
            return;
        }
        let Some(report) = run.progress.pending.take() else {
            return;
        };
        run.progress.in_flight = true;
        run.progress.last_post = Some(now);
        let (command, execution) = (run.id(), run.job.execution.clone());
        self.actions.push_back(Action::PostProgress {
            command,
            execution,
            report,
        });
    }
}
