//! The transitions of a [`CommandRecord`]: the one place its state changes.

use super::*;

impl CommandRecord {
    // The transitions proper. Each one changes the record in place and bumps
    // the revision, or returns `Ok(false)` / an error having changed nothing,
    // so a caller that owns a fresh copy (the queue) needs no second one.

    /// [`CommandRecord::cancel`] on this record; `true` if it changed. A
    /// running command whose lease has lapsed is cancelled at once: its
    /// desktop will never stop it or report.
    pub(crate) fn cancel_in_place(&mut self, now: Timestamp) -> bool {
        if self.is_lapsed(now) {
            self.cancel_requested = true;
            self.cancel_requested_at = Some(now);
            let why = self.lapse_reason();
            self.close_unreported(now, why);
            return true;
        }
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Cancelled;
                self.cancel_requested = true;
                self.cancel_requested_at = Some(now);
                self.finished_at = Some(now);
                self.reason = Some(CANCELLED_WHILE_QUEUED.to_owned());
            }
            CommandStatus::Running if !self.cancel_requested => {
                self.cancel_requested = true;
                self.cancel_requested_at = Some(now);
            }
            _ => return false,
        }
        self.revision += 1;
        true
    }

    /// [`CommandRecord::start`] on this record with a lease of `lease`;
    /// `Ok(false)` for a retried start that needs no write.
    pub(crate) fn start_in_place(
        &mut self,
        execution: &ExecutionId,
        now: Timestamp,
        lease: std::time::Duration,
    ) -> Result<bool, StartRefused> {
        if self.is_lapsed(now) {
            self.lapse_in_place(now);
            return Err(StartRefused::Finished(self.status.as_str()));
        }
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Running;
                self.execution_id = Some(execution.clone());
                self.started_at = Some(now);
                self.lease_expires_at = Some(now.plus(lease));
                self.heard_at = Some(now);
                self.revision += 1;
                Ok(true)
            }
            CommandStatus::Running if self.execution_id.as_ref() == Some(execution) => {
                Ok(self.renew_in_place(now, lease))
            }
            CommandStatus::Running => Err(StartRefused::OtherExecution),
            terminal => Err(StartRefused::Finished(terminal.as_str())),
        }
    }

    /// [`CommandRecord::complete`] on this record; `Ok(false)` for a duplicate.
    pub(crate) fn complete_in_place(
        &mut self,
        envelope: &ResultEnvelope,
        now: Timestamp,
    ) -> Result<bool, CompleteRefused> {
        if self.is_lapsed(now) {
            let mut closed = self.clone();
            closed.lapse_in_place(now);
            return Err(CompleteRefused::Lapsed(closed.status.as_str()));
        }
        match self.status {
            CommandStatus::Queued => Err(CompleteRefused::NotStarted),
            CommandStatus::Running => {
                if self.execution_id.as_ref() != Some(&envelope.execution_id) {
                    return Err(CompleteRefused::StaleExecution);
                }
                self.status = if self.cancel_requested {
                    self.reason = Some(CANCELLED_WHILE_RUNNING.to_owned());
                    CommandStatus::Cancelled
                } else {
                    envelope.status.into()
                };
                self.finished_at = Some(now);
                self.completion = Some(envelope.clone());
                self.revision += 1;
                Ok(true)
            }
            _ if self.completion.as_ref() == Some(envelope) => Ok(false),
            terminal if self.started_at.is_none() => {
                Err(CompleteRefused::ClosedBeforeStart(terminal.as_str()))
            }
            terminal if self.closed_without_report() => {
                Err(CompleteRefused::Lapsed(terminal.as_str()))
            }
            _ if self.execution_id.as_ref() != Some(&envelope.execution_id) => {
                Err(CompleteRefused::StaleExecution)
            }
            _ => Err(CompleteRefused::Conflict),
        }
    }

    /// Renews the lease of a running command to `now + lease`. Written only
    /// when less than half of `lease` is left, so a desktop that polls often
    /// costs a write per half lease, not one per poll; `heard_at` is then up
    /// to half a lease old. `false`: nothing to write (not running, lapsed,
    /// or not yet due).
    pub(crate) fn renew_in_place(&mut self, now: Timestamp, lease: std::time::Duration) -> bool {
        if self.status != CommandStatus::Running || self.is_lapsed(now) {
            return false;
        }
        let due = match self.lease_expires_at {
            None => true,
            Some(expires) => expires.since(now) < lease / 2,
        };
        if !due {
            return false;
        }
        self.lease_expires_at = Some(now.plus(lease));
        self.heard_at = Some(now);
        self.revision += 1;
        true
    }

    /// Records `progress` of the running execution `execution`. `Ok(false)`:
    /// the same report as the one recorded, nothing to write. Fenced by
    /// execution id; refused unless running, so progress never moves a run
    /// or revives a closed one.
    pub fn progress_in_place(
        &mut self,
        execution: &ExecutionId,
        progress: Progress,
        now: Timestamp,
    ) -> Result<bool, ProgressRefused> {
        let status = self.at(now).status;
        if status != CommandStatus::Running {
            return Err(ProgressRefused::NotRunning(status.as_str()));
        }
        if self.execution_id.as_ref() != Some(execution) {
            return Err(ProgressRefused::StaleExecution);
        }
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.same_report(&progress))
        {
            return Ok(false);
        }
        self.progress = Some(progress);
        self.revision += 1;
        Ok(true)
    }

    /// Closes a running command whose lease has lapsed at `now`: `failed`
    /// with a [`LEASE_LAPSED`] reason naming the last time the desktop was
    /// heard from, or `cancelled` if the agent asked to cancel. It ends at
    /// the instant the lease lapsed, so every look at it agrees. `false`:
    /// not running, or the lease has not lapsed.
    pub fn lapse_in_place(&mut self, now: Timestamp) -> bool {
        let Some(expired) = self.lease_expires_at.filter(|_| self.is_lapsed(now)) else {
            return false;
        };
        let why = self.lapse_reason();
        self.close_unreported(expired, why);
        true
    }

    /// When the executing desktop was last heard from, as text.
    fn last_heard(&self) -> String {
        self.heard_at
            .or(self.started_at)
            .map_or_else(|| "an unknown time".to_owned(), Timestamp::to_rfc3339)
    }

    /// Why a lapsed run ended.
    fn lapse_reason(&self) -> String {
        let expired = self
            .lease_expires_at
            .map_or_else(|| "an unknown time".to_owned(), Timestamp::to_rfc3339);
        format!(
            "{LEASE_LAPSED}: it was last heard from at {} and its lease lapsed at {expired}. The run may or may not have finished on the desktop; it is not run again.",
            self.last_heard()
        )
    }

    /// Closes a running command whose desktop announced, at `now`, that it
    /// restarted and is not running it. `false`: not running.
    pub fn close_after_restart_in_place(&mut self, now: Timestamp) -> bool {
        if self.status != CommandStatus::Running {
            return false;
        }
        if self.is_lapsed(now) {
            return self.lapse_in_place(now);
        }
        let what = format!(
            "{DESKTOP_RESTARTED}: it restarted at {} and was last heard from about this run at {}. The run may or may not have finished on the desktop; it is not run again.",
            now.to_rfc3339(),
            self.last_heard()
        );
        self.close_unreported(now, what);
        true
    }

    /// A running command ends without a report: `cancelled` if the agent
    /// asked, else `failed`; `what` says why.
    fn close_unreported(&mut self, at: Timestamp, what: String) {
        if self.cancel_requested {
            self.status = CommandStatus::Cancelled;
            self.reason = Some(format!("{CANCELLED_WHILE_RUNNING}. {what}"));
        } else {
            self.status = CommandStatus::Failed;
            self.reason = Some(what);
        }
        self.finished_at = Some(at);
        self.lease_expires_at = None;
        self.revision += 1;
    }

    /// [`CommandRecord::decline`] on this record; `Ok(false)` if already terminal.
    pub(crate) fn decline_in_place(&mut self, now: Timestamp) -> Result<bool, DeclineRefused> {
        match self.status {
            CommandStatus::Queued => {
                self.status = CommandStatus::Cancelled;
                self.finished_at = Some(now);
                self.reason = Some(NO_LONGER_SHARED.to_owned());
                self.revision += 1;
                Ok(true)
            }
            CommandStatus::Running => Err(DeclineRefused),
            _ => Ok(false),
        }
    }
}
