//! What the held-request tests share: a store layer that counts the calls
//! of one operation and can notify a topic right after the first one, as a
//! change written at that moment would.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use graph_relay_core::signals::{Signals, Topic};
use graph_relay_core::store::{StoreError, StoreLayer};

/// The counts a test reads, and what to notify after the first call.
#[derive(Default)]
pub struct Calls {
    /// Calls of the operation so far.
    pub reads: AtomicUsize,
    /// Notified (once) right after the first call answered.
    pub after_first: Mutex<Option<(Arc<Signals>, Topic)>>,
}

/// The layer: counts `operation` into its [`Calls`].
pub struct Counted {
    pub operation: &'static str,
    pub calls: Arc<Calls>,
}

impl StoreLayer for Counted {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let answer = call.await;
            if operation == self.operation && self.calls.reads.fetch_add(1, Ordering::SeqCst) == 0 {
                let armed = self.calls.after_first.lock().expect("lock").take();
                if let Some((signals, topic)) = armed {
                    signals.notify(&topic);
                }
            }
            answer
        })
    }
}
