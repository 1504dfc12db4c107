//! How long the store takes: [`TimedStore`] wraps any [`Store`] and
//! observes each call's wall time, failed or not, in the histogram
//! `graph_relay_store_operation_seconds{operation}` of the serving metrics
//! ([`Metrics::timed_store`](crate::metrics::Metrics::timed_store)).
//!
//! The `operation` label is the name of the [`Store`] method
//! ([`OPERATIONS`]): a fixed set of nineteen, whatever the requests carry.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use graph_relay_core::store::{LayeredStore, Store, StoreError, StoreLayer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// The `operation` label values: the [`Store`] methods.
pub const OPERATIONS: [&str; 19] = [
    "idempotency",
    "insert_command",
    "insert_command_if_shared",
    "command_for_agent",
    "command_for_device",
    "command_for_owner",
    "running_commands",
    "lapsed_commands",
    "update_command",
    "queued_commands",
    "replace_shared_sessions",
    "record_sync",
    "shared_projects",
    "shared_sessions",
    "find_shared_session",
    "touch_device",
    "touch_devices",
    "device",
    "prune",
];

/// Upper bounds (seconds) of the buckets: from an in-memory look-up to a
/// store that stalls.
const BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    operation: &'static str,
}

/// The histogram family of store operations, by operation.
pub(crate) type OperationHistograms = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// A new, empty family with the store buckets.
pub(crate) fn operation_histograms() -> OperationHistograms {
    Family::new_with_constructor(|| Histogram::new(BUCKETS))
}

/// A [`Store`] that times every call of the store it wraps.
pub type TimedStore = LayeredStore<Timing>;

/// The layer of a [`TimedStore`]: each call's time, into the histogram of
/// its operation.
pub struct Timing {
    histograms: OperationHistograms,
}

impl Timing {
    pub(crate) fn store(inner: Arc<dyn Store>, histograms: OperationHistograms) -> TimedStore {
        LayeredStore::new(inner, Self { histograms })
    }
}

impl StoreLayer for Timing {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let started = Instant::now();
            let out = call.await;
            self.histograms
                .get_or_create(&OperationLabels { operation })
                .observe(started.elapsed().as_secs_f64());
            out
        })
    }
}
