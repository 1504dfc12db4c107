//! What runs a Graph on the desktop.
//!
//! The relay state machine emits [`Action::Execute`](crate::relay::Action::Execute)
//! and, at most once, [`Action::CancelExecution`](crate::relay::Action::CancelExecution);
//! a driver turns them into a call to [`Executor::execute`] and a signal on
//! the [`CancelSignal`] it passed in. The `graph-relay` binary ships a process
//! executor (one OS process per run); the simulator uses a synthetic one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};

use crate::relay::{ExecutionOutcome, Job};

/// Runs jobs. Implementations must return once the job ended, including
/// after a cancellation (typically with status `cancelled`).
#[async_trait]
pub trait Executor: Send + Sync {
    /// Runs `job` to its end. When `cancel` resolves the executor must stop
    /// the execution (and everything it started) and return.
    async fn execute(&self, job: Job, cancel: CancelSignal) -> ExecutionOutcome;
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
    fn dropped_handle_does_not_cancel() {
        let (handle, signal) = cancel_pair();
        drop(handle);
        assert!(!signal.is_cancelled());
        assert!(signal.now_or_never().is_none());
    }
}
