//! A store outage on demand: [`Outage`] wraps a store so that every call
//! fails with a backend error while it is down, the way a stopped database
//! or a dropped connection looks to the queue. For tests of what agents,
//! desktops and load balancers see during an outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::BoxFuture;

use crate::store::{LayeredStore, Store, StoreError, StoreLayer};

/// The layer of an outage: up (calls pass) until [`Outage::set_down`].
#[derive(Debug, Default)]
pub struct Outage {
    down: AtomicBool,
    refused: AtomicU64,
}

impl Outage {
    /// `inner`, up.
    pub fn store(inner: Arc<dyn Store>) -> LayeredStore<Outage> {
        LayeredStore::new(inner, Self::default())
    }

    /// Starts (`true`) or ends the outage.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// How many calls failed because of the outage.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl StoreLayer for Outage {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async move {
                Err(StoreError::Backend(format!(
                    "{operation}: the store is down (a test outage)"
                )))
            });
        }
        call
    }
}
