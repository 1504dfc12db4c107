//! Two helpers for scenarios that count what reaches the store on a manual
//! clock: a store layer that counts calls, and a sleeper that moves the
//! clock instead of waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::store::{StoreError, StoreLayer};
use crate::time::{ManualClock, Sleeper};

/// A [`StoreLayer`] that counts the calls reaching the store: every call,
/// or only those of one operation (as named to [`StoreLayer::around`]).
#[derive(Debug, Default)]
pub struct StoreCalls {
    only: Option<&'static str>,
    calls: AtomicU64,
}

impl StoreCalls {
    /// Counts every call.
    pub fn all() -> Self {
        Self::default()
    }

    /// Counts the calls of `operation` only, e.g. `"queued_commands"`.
    pub fn of(operation: &'static str) -> Self {
        Self {
            only: Some(operation),
            calls: AtomicU64::new(0),
        }
    }

    /// The calls counted so far.
    pub fn count(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl StoreLayer for StoreCalls {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        if self.only.is_none_or(|only| only == operation) {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
        call
    }
}

/// A [`Sleeper`] that moves the manual clock by what is slept and returns
/// at once: a held request times out immediately, having lasted as long in
/// clock time as the queue held it.
#[derive(Debug, Clone)]
pub struct Advancing(pub Arc<ManualClock>);

impl Sleeper for Advancing {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.0.advance(duration);
        Box::pin(async {})
    }
}
