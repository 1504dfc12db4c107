//! A relay transport that loses completion POSTs on purpose, for tests of
//! the outbox: a completion lost before it is sent must be sent again,
//! and one whose answer was lost must be acknowledged as a duplicate.

use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;

use crate::ids::{CommandId, ExecutionId};
use crate::outbox::{OutboxItem, RelayReport};
use crate::queue::{ControlAnswer, SyncRequest};
use crate::relay::driver::RelayTransport;
use crate::relay::executor::ProgressReport;
use crate::relay::{ClaimOutcome, PostOutcome, Refusal, RelayCommand, SyncFailure};

/// Wraps a transport and loses completion POSTs.
///
/// `lose_before_send` completions are never sent (as if the connection
/// dropped); `lose_after_send` are sent but their answer is discarded (the
/// server recorded them; the resend is a duplicate and must get a 2xx).
/// Declines and every other request pass through.
#[derive(Debug)]
pub struct FaultyTransport<T> {
    inner: T,
    lose_before_send: AtomicU32,
    lose_after_send: AtomicU32,
}

impl<T> FaultyTransport<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, lose_before_send: u32, lose_after_send: u32) -> Self {
        Self {
            inner,
            lose_before_send: AtomicU32::new(lose_before_send),
            lose_after_send: AtomicU32::new(lose_after_send),
        }
    }
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl<T: RelayTransport> RelayTransport for FaultyTransport<T> {
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure> {
        self.inner.sync(request).await
    }

    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome {
        self.inner.claim(command, execution).await
    }

    async fn control(
        &self,
        command: &CommandId,
        long_poll: bool,
    ) -> Result<ControlAnswer, Refusal> {
        self.inner.control(command, long_poll).await
    }

    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome {
        self.inner.post_progress(command, execution, report).await
    }

    async fn post_report(&self, item: &OutboxItem) -> PostOutcome {
        let completion = matches!(item.report, RelayReport::Completion { .. });
        if completion && take_one(&self.lose_before_send) {
            return PostOutcome::Retry(
                "fault injection: completion POST lost before sending".into(),
            );
        }
        let outcome = self.inner.post_report(item).await;
        if completion && take_one(&self.lose_after_send) {
            return PostOutcome::Retry(
                "fault injection: answer to the completion POST lost".into(),
            );
        }
        outcome
    }
}
