//! What the held-request tests share: a store layer that counts the calls
//! of one operation and can notify a topic right after the first one, as a
//! change written at that moment would, and a world over a memory store
//! wrapped in it.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use graph_relay_core::queue::QueueConfig;
use graph_relay_core::signals::{Signals, Topic};
use graph_relay_core::store::{LayeredStore, StoreError, StoreLayer};
use graph_relay_core::testkit::World;
use graph_relay_store_memory::MemoryStore;

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

/// A world with `config` over a memory store whose `operation` calls are
/// counted.
pub fn counted_world(operation: &'static str, config: QueueConfig) -> (World, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let store = LayeredStore::new(
        Arc::new(MemoryStore::new()),
        Counted {
            operation,
            calls: calls.clone(),
        },
    );
    (World::with_config(Arc::new(store), config), calls)
}
