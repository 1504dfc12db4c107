//! A relay transport that calls a [`Queue`] in the same process: an
//! embedded queue with an in-process desktop, long-poll included. The held
//! sync and control requests are the queue's own holds
//! ([`Queue::sync_held`], [`Queue::control_held`]), the same ones the HTTP
//! relay API answers with, so an in-process desktop is woken exactly as a
//! remote one is. Every refusal carries the queue error's
//! [`is_retryable`](crate::queue::SyncError::is_retryable) flag, which the
//! state machine reads as the HTTP relay reads the server's `retryable`.

use std::sync::Arc;

use async_trait::async_trait;

use super::driver::RelayTransport;
use super::{ClaimOutcome, PostOutcome, Refusal, RelayCommand, SyncFailure};
use crate::ids::{CommandId, ExecutionId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::principal::Device;
use crate::queue::{ControlAnswer, Queue, SyncRequest};
use crate::relay::executor::ProgressReport;
use crate::time::Sleeper;

/// The relay API of `queue`, spoken by `device` without a network.
pub struct QueueTransport {
    queue: Arc<Queue>,
    device: Device,
    sleeper: Arc<dyn Sleeper>,
}

impl std::fmt::Debug for QueueTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueTransport")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl QueueTransport {
    /// `device`'s side of `queue`; held requests sleep on `sleeper`.
    pub fn new(queue: Arc<Queue>, device: Device, sleeper: Arc<dyn Sleeper>) -> Self {
        Self {
            queue,
            device,
            sleeper,
        }
    }
}

/// A queue refusal as the state machine reads it.
fn refusal(retryable: bool, error: impl std::fmt::Display) -> Refusal {
    Refusal::new(Some(retryable), error.to_string())
}

#[async_trait]
impl RelayTransport for QueueTransport {
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure> {
        self.queue
            .sync_held(&self.device, request, |hold| hold, &*self.sleeper)
            .await
            .map(|response| response.commands.iter().map(RelayCommand::from).collect())
            .map_err(|e| refusal(e.is_retryable(), e).into())
    }

    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome {
        match self.queue.start(&self.device, command, execution).await {
            Ok(_) => ClaimOutcome::Granted,
            Err(e) => refusal(e.is_retryable(), e).into(),
        }
    }

    async fn control(
        &self,
        command: &CommandId,
        long_poll: bool,
    ) -> Result<ControlAnswer, Refusal> {
        self.queue
            .control_held(
                &self.device,
                command,
                long_poll,
                |hold| hold,
                &*self.sleeper,
            )
            .await
            .map_err(|e| refusal(e.is_retryable(), e))
    }

    async fn post_report(&self, item: &OutboxItem) -> PostOutcome {
        let answer = match &item.report {
            RelayReport::Completion { envelope } => self
                .queue
                .complete(&self.device, &item.command, envelope)
                .await
                .map(drop)
                .map_err(|e| refusal(e.is_retryable(), e)),
            RelayReport::Declined => self
                .queue
                .decline(&self.device, &item.command)
                .await
                .map(drop)
                .map_err(|e| refusal(e.is_retryable(), e)),
        };
        match answer {
            Ok(()) => PostOutcome::Acknowledged,
            Err(refusal) => refusal.into(),
        }
    }

    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome {
        match self
            .queue
            .report_progress(
                &self.device,
                command,
                execution,
                report.message.clone(),
                report.percent,
            )
            .await
        {
            Ok(_) => PostOutcome::Acknowledged,
            Err(e) => refusal(e.is_retryable(), e).into(),
        }
    }
}
