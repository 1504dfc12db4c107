//! The control requests of a claimed run: when they are sent, and what
//! their answers do (the agent's cancel, the server closing the run).

use crate::envelope::FinishStatus;
use crate::ids::CommandId;
use crate::queue::ControlAnswer;
use crate::time::Timestamp;

use super::machine::Awaiting;
use super::run::{Cancel, Phase, Run};
use super::*;

/// The control requests of a claimed run (which also renew its lease).
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct ControlPoll {
    /// The next request is due then (none while one is in flight, or once
    /// polling stopped).
    pub(super) next_at: Option<Timestamp>,
    pub(super) in_flight: bool,
}

/// When the first control request of a run that starts now is due.
pub(super) fn first_control(config: &RelayConfig, now: Timestamp) -> ControlPoll {
    ControlPoll {
        next_at: Some(match config.mode {
            RelayMode::Interval => now.plus(config.control_interval),
            RelayMode::LongPoll => now,
        }),
        in_flight: false,
    }
}

impl Relay {
    /// The answer to [`Action::Control`]: the server's [`ControlAnswer`], or
    /// why there is none. A terminal status means the server closed the run:
    /// the execution is stopped and nothing is reported.
    pub fn handle_control_response(
        &mut self,
        command: CommandId,
        result: Result<ControlAnswer, Refusal>,
        now: Timestamp,
    ) {
        // Only the execution running now listens to control answers: a late
        // answer from an earlier attempt at the same command (say, before a
        // claim that got no answer) must not cancel a run that has not started.
        if self.awaiting.open_run(command).is_none() {
            return;
        }
        match &result {
            Ok(_) => self.server_answered(now),
            Err(refusal) => self.server_silent(&refusal.reason, now),
        }
        let (mode, interval) = (self.config.mode, self.config.control_interval);
        let Some(run) = self.awaiting.open_run(command) else {
            return;
        };
        let waiting = matches!(run.phase, Phase::AwaitingApproval { .. });
        let control = run
            .control_mut()
            .unwrap_or_else(|| unreachable!("an open run polls control"));
        control.in_flight = false;
        match result {
            Ok(answer) if answer.status.is_terminal() || answer.cancel_requested => {
                if !waiting {
                    self.control_stops_execution(command, answer);
                } else if self.control_ends_approval(command, answer, now) {
                    return;
                }
            }
            Ok(_) => {
                control.next_at = Some(match mode {
                    RelayMode::Interval => now.plus(interval),
                    RelayMode::LongPoll => now,
                });
            }
            Err(refusal) => {
                control.next_at = Some(now.plus(interval));
                self.events.push_back(RelayEvent::ControlFailed {
                    command,
                    reason: refusal.reason,
                });
            }
        }
        self.maybe_send_control(now);
        self.drive(now);
    }

    /// A control answer closed or cancelled a run that waits for approval:
    /// the prompt is withdrawn and nothing runs. True when the run was
    /// recorded (and the pass driven) already.
    fn control_ends_approval(
        &mut self,
        command: CommandId,
        answer: ControlAnswer,
        now: Timestamp,
    ) -> bool {
        self.actions.push_back(Action::WithdrawApproval { command });
        if answer.status.is_terminal() {
            // Closed while it waited for approval: nothing ran, nothing to report.
            self.events.push_back(RelayEvent::ClosedByServer {
                command,
                status: answer.status,
            });
            self.awaiting = Awaiting::Nothing;
            return false;
        }
        self.events.push_back(RelayEvent::CancelSent { command });
        self.finish_unstarted(
            FinishStatus::Cancelled,
            "Cancelled by the agent while the run waited for the owner's approval; the Graph did not run.".to_owned(),
            now,
        );
        true
    }

    /// A control answer closed or cancelled an executing run: the engine is
    /// asked to stop once, and control is polled no more.
    fn control_stops_execution(&mut self, command: CommandId, answer: ControlAnswer) {
        let Some(Run {
            progress,
            phase: Phase::Executing { control, cancel },
            ..
        }) = self.awaiting.run_mut()
        else {
            return;
        };
        control.next_at = None;
        let already_closed = matches!(cancel, Some(Cancel::ClosedByServer(_)));
        if answer.status.is_terminal() {
            if !already_closed {
                let cancel_sent = cancel.is_some();
                *cancel = Some(Cancel::ClosedByServer(answer.status));
                progress.pending = None;
                self.events.push_back(RelayEvent::ClosedByServer {
                    command,
                    status: answer.status,
                });
                if !cancel_sent {
                    self.actions.push_back(Action::CancelExecution { command });
                }
            }
        } else if cancel.is_none() {
            *cancel = Some(Cancel::ByAgent);
            self.actions.push_back(Action::CancelExecution { command });
            self.events.push_back(RelayEvent::CancelSent { command });
        }
    }

    /// Sends the control request of a run that waits for approval or
    /// executes, when it is due and none is in flight.
    pub(super) fn maybe_send_control(&mut self, now: Timestamp) {
        if self.stopping() {
            return;
        }
        let long_poll = self.config.mode == RelayMode::LongPoll;
        let Some(run) = self.awaiting.run_mut() else {
            return;
        };
        let command = run.id();
        let control = match &mut run.phase {
            Phase::AwaitingApproval { control, .. } => control,
            Phase::Executing {
                control,
                cancel: None,
            } => control,
            _ => return,
        };
        if control.in_flight {
            return;
        }
        if control.next_at.is_some_and(|t| t <= now) {
            control.in_flight = true;
            control.next_at = None;
            self.actions
                .push_back(Action::Control { command, long_poll });
        }
    }
}
