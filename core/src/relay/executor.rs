//! What runs a Graph on the desktop.
//!
//! The relay state machine emits [`Action::Execute`](crate::relay::Action::Execute)
//! and, at most once, [`Action::CancelExecution`](crate::relay::Action::CancelExecution);
//! a driver turns them into a call to [`Executor::execute`] and a signal on
//! the [`CancelSignal`] it passed in. The `graph-relay` binary ships a process
//! executor (one OS process per run); the simulator uses a synthetic one.
//!
//! While it runs, an execution may say how far it got through the
//! [`ProgressSink`] it was handed; the driver feeds each [`ProgressReport`]
//! to [`Relay::handle_progress`](crate::relay::Relay::handle_progress),
//! which posts the latest one at most once a second.
//!
//! An [`Approver`] asks the owner whether a run may start, for Graphs that
//! need local approval ([`Action::AskApproval`](crate::relay::Action::AskApproval)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};

use crate::command::{InvalidProgress, Progress};
use crate::relay::{ApprovalDecision, ExecutionOutcome, Job};
use crate::time::Timestamp;

/// Runs jobs. Implementations must return once the job ended, including
/// after a cancellation (typically with status `cancelled`).
///
/// An executor that works in steps, reports progress after each, and stops
/// between steps when cancelled:
///
/// ```
/// use futures::FutureExt;
/// use graph_relay_core::envelope::FinishStatus;
/// use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressReport, ProgressSink};
/// use graph_relay_core::relay::{ExecutionOutcome, Job};
///
/// struct Steps(u32);
///
/// #[async_trait::async_trait]
/// impl Executor for Steps {
///     async fn execute(&self, job: Job, cancel: CancelSignal, progress: ProgressSink) -> ExecutionOutcome {
///         let mut cancel = cancel.fuse();
///         for step in 1..=self.0 {
///             if (&mut cancel).now_or_never().is_some() {
///                 return ExecutionOutcome { status: Some(FinishStatus::Cancelled), ..Default::default() };
///             }
///             // … one step of real work on job.command.arguments …
///             progress.report(ProgressReport {
///                 message: Some(format!("step {step} of {}", self.0)),
///                 percent: Some(f64::from(step) * 100.0 / f64::from(self.0)),
///             });
///         }
///         ExecutionOutcome::completed(serde_json::json!({"steps": self.0, "slug": job.command.slug}))
///     }
/// }
/// ```
#[async_trait]
pub trait Executor: Send + Sync {
    /// Runs `job` to its end. When `cancel` resolves the executor must stop
    /// the execution (and everything it started) and return. Progress goes
    /// to `progress` (reporting none is fine).
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        progress: ProgressSink,
    ) -> ExecutionOutcome;
}

/// Asks the owner whether a run may start: a prompt, a hook, a console.
#[async_trait]
pub trait Approver: Send + Sync {
    /// Asks about `job` and returns the owner's decision. The relay stops
    /// waiting at `until`, or earlier when the run is cancelled; the driver
    /// then drops this future, and an implementation must withdraw its
    /// question (close the prompt, stop the hook) when dropped.
    async fn ask(&self, job: Job, until: Timestamp) -> ApprovalDecision;
}

/// An approver that never answers: a run that needs approval waits until
/// its wait ends, and fails then. For a desktop with no way to ask.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoApprover;

#[async_trait]
impl Approver for NoApprover {
    async fn ask(&self, _job: Job, _until: Timestamp) -> ApprovalDecision {
        std::future::pending().await
    }
}

/// What a running Graph says about how far it got. Both parts are optional.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgressReport {
    /// A short text for people, at most
    /// [`MAX_PROGRESS_MESSAGE`](crate::limits::MAX_PROGRESS_MESSAGE) characters.
    pub message: Option<String>,
    /// How far, from 0 to 100.
    pub percent: Option<f64>,
}

impl ProgressReport {
    /// Checks the rules the server applies (message length, percentage in
    /// 0–100), so that a report the server would refuse is never sent.
    pub fn check(&self) -> Result<(), InvalidProgress> {
        Progress::new(self.message.clone(), self.percent, Timestamp(0)).map(drop)
    }
}

/// Where an execution reports progress. Cheap to clone; reporting never
/// blocks and never fails (a report nobody reads is dropped).
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(ProgressReport) + Send + Sync>);

impl ProgressSink {
    /// A sink that hands every report to `deliver`, which must not block.
    pub fn new(deliver: impl Fn(ProgressReport) + Send + Sync + 'static) -> Self {
        Self(Arc::new(deliver))
    }

    /// A sink that drops every report.
    pub fn discard() -> Self {
        Self::new(|_| {})
    }

    /// Reports `report`.
    pub fn report(&self, report: ProgressReport) {
        (self.0)(report);
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// Resolves when the relay asked to stop the execution. Cloneable.
#[derive(Clone, Debug)]
pub struct CancelSignal(Shared<oneshot::Receiver<()>>);

/// The sending side of a [`CancelSignal`].
#[derive(Debug)]
pub struct CancelHandle(Option<oneshot::Sender<()>>);

/// A connected handle and signal.
pub fn cancel_pair() -> (CancelHandle, CancelSignal) {
    let (tx, rx) = oneshot::channel();
    (CancelHandle(Some(tx)), CancelSignal(rx.shared()))
}

impl CancelHandle {
    /// Signals cancellation (idempotent).
    pub fn cancel(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl CancelSignal {
    /// True once cancellation was signalled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.0.clone().now_or_never(), Some(Ok(())))
    }
}

impl Future for CancelSignal {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut self.0).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            // The handle was dropped without cancelling: never resolves.
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_resolves_only_after_cancel() {
        let (mut handle, signal) = cancel_pair();
        let mut s2 = signal.clone();
        assert!(!signal.is_cancelled());
        assert!((&mut s2).now_or_never().is_none());
        handle.cancel();
        handle.cancel();
        assert!(signal.is_cancelled());
        assert!(s2.now_or_never().is_some());
    }

    #[test]
    fn a_progress_report_keeps_the_servers_rules() {
        let ok = ProgressReport {
            message: Some("step 2 of 5".into()),
            percent: Some(40.0),
        };
        assert_eq!(ok.check(), Ok(()));
        let long = ProgressReport {
            message: Some("x".repeat(crate::limits::MAX_PROGRESS_MESSAGE + 1)),
            percent: None,
        };
        assert!(matches!(
            long.check(),
            Err(InvalidProgress::MessageTooLong(_))
        ));
        for bad in [-1.0, 100.5, f64::NAN] {
            let report = ProgressReport {
                message: None,
                percent: Some(bad),
            };
            assert!(matches!(report.check(), Err(InvalidProgress::Percent(_))));
        }
    }

    #[test]
    fn a_sink_hands_every_report_on() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen.clone();
        let sink = ProgressSink::new(move |r| into.lock().unwrap().push(r));
        sink.clone().report(ProgressReport {
            percent: Some(1.0),
            ..Default::default()
        });
        ProgressSink::discard().report(ProgressReport::default());
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn dropped_handle_does_not_cancel() {
        let (handle, signal) = cancel_pair();
        drop(handle);
        assert!(!signal.is_cancelled());
        assert!(signal.now_or_never().is_none());
    }
}
