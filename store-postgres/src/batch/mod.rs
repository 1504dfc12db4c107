//! Batching: the concurrent requests of one kind (the durable writes, the
//! hot reads) gathered and run together, so that many requests share a round
//! trip, a statement's execution and, for writes, a commit and its flush of
//! the WAL.
//!
//! Every request joins its kind's queue. Each kind has a few lanes
//! ([`WRITE_LANES`], [`lanes`]): at most that many of its statements run at
//! once, each on a pooled connection. A request that finds a lane free
//! takes it and leads: it lets the scheduler run once (so that the requests
//! woken with it, a burst, join the queue meanwhile), then takes everything
//! queued (up to [`BatchKind::MAX_BATCH`] requests) as one batch and runs it
//! in its own task, with no hand-over to another task on the way. A request
//! that finds every lane busy only waits: whoever holds a lane looks at the
//! queue when it lets go, and if requests are waiting, a draining task
//! takes them in batches until the queue is empty. The busier the store,
//! the larger the batches; a quiet store pays one turn of the scheduler
//! for them.
//!
//! A leader whose caller stops waiting (its future is dropped) does not
//! take the others' answers with it: its batch carries on in a task of its
//! own. The draining task runs on the Tokio runtime of the call that
//! started it. If that runtime shut down (a store kept across runtimes, as
//! tests do), a request whose batch was dropped with it is answered with
//! an error, and the requests still queued go in the batch of the next
//! request, which leads on its own runtime.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use graph_relay_core::store::StoreError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

pub(crate) mod reads;
#[cfg(test)]
mod tests;
mod write_sql;
pub(crate) mod writes;

/// One kind of batched request: how its jobs are grouped and run.
pub(crate) trait BatchKind: Send + Sync + 'static {
    /// A request and where its answer goes.
    type Job: Send + 'static;
    /// What no two jobs of one batch may share (see [`exclusive`](Self::exclusive)).
    type Exclusive: Hash + Eq;
    /// Most jobs in one batch.
    const MAX_BATCH: usize;

    /// What `job` must have to itself in its batch, if anything: a job
    /// whose value is already in the batch being gathered waits for the
    /// next batch.
    fn exclusive(job: &Self::Job) -> Option<Self::Exclusive>;

    /// Runs `batch` and answers every job in it, whatever happens.
    fn run(&self, batch: Vec<Self::Job>) -> impl Future<Output = ()> + Send;
}

/// A kind's lanes and queue, shared by a store and its clones.
pub(crate) struct Batcher<K: BatchKind> {
    shared: Arc<Shared<K>>,
}

/// What the requests of a kind share.
struct Shared<K: BatchKind> {
    kind: K,
    /// One permit per lane.
    lanes: Arc<Semaphore>,
    /// Jobs not yet taken into a batch, oldest first.
    queue: Mutex<VecDeque<K::Job>>,
}

/// Most lanes of the look-ups (and, until the writes were gathered in one
/// kind with one lane, of each kind of write).
///
/// Two. More lanes let a write wait less for a lane when the disk is slow
/// (with 16 lifecycles in flight on a heavily loaded machine, a
/// compare-and-swap took 2.0–4.0 ms with two lanes, 1.3–2.7 ms with four),
/// but make the batches smaller, and where the server's CPU is the limit
/// that costs more than it saves: alternating on a machine at load 2.4–3.6,
/// two lanes ran 1,964 / 2,022 / 3,102 lifecycles/s with 16 in flight and
/// 4,658 / 4,561 / 6,393 with 64 (1.7 and 0.5 statements per lifecycle),
/// four lanes 1,293 / 2,626 / 1,742 and 3,493 / 5,488 / 3,488 (2.9 and
/// 0.8 statements); eight sent more statements still for no shorter wait.
pub(crate) const MAX_LANES: usize = 2;

/// The lanes of the durable writes: one. Every write statement is a commit
/// that waits for its own flush of the WAL and costs the server a
/// transaction; with one lane, the writes that arrive while a batch
/// commits all go in the next batch, so there is one commit per flush.
/// Alternating on a machine at load 4–6, one lane ran 1,553 / 2,823
/// lifecycles/s with 16 / 64 in flight against two lanes' 1,087 / 2,502
/// (medians of 4 runs; one lane was ahead in 3 of the 4 runs at 16 in
/// flight), with a quarter fewer statements (0.9 against 1.2 per
/// lifecycle at 16) and a third fewer WAL flushes (0.46 against 0.70 per
/// lifecycle, from `pg_stat_wal`). One lane also means that a write held
/// up on the server (a row or key that another server's transaction
/// holds) holds up the writes queued behind it; every transaction that
/// writes commands or keys is one short statement, so that wait is about
/// one commit of another batch.
pub(crate) const WRITE_LANES: usize = 1;

/// The lanes of the look-ups for a pool of `pool_size` connections: a
/// quarter of the pool, one at least and [`MAX_LANES`] at most. With the
/// writes' one lane ([`WRITE_LANES`]) the batches then hold at most three
/// eighths of the pool, and the statements that are not batched (syncs,
/// contacts, pruning, MCP sessions) keep the rest.
pub(crate) fn lanes(pool_size: usize) -> usize {
    (pool_size / 4).clamp(1, MAX_LANES)
}

impl<K: BatchKind> Batcher<K> {
    /// Batches of `kind`, at most `lanes` at once.
    pub(crate) fn new(kind: K, lanes: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                kind,
                lanes: Arc::new(Semaphore::new(lanes.max(1))),
                queue: Mutex::new(VecDeque::new()),
            }),
        }
    }

    /// Queues `job` and, if a lane is free, leads a batch with it; either
    /// way its answer goes where the job says.
    pub(crate) async fn run(&self, job: K::Job) {
        self.shared.queue().push_back(job);
        // Paired with the fence in `Lane::drop`: either this request sees
        // the lane its holder let go, or the holder sees this job queued.
        fence(Ordering::SeqCst);
        let Ok(permit) = Arc::clone(&self.shared.lanes).try_acquire_owned() else {
            return;
        };
        let lane = Lane {
            shared: Arc::clone(&self.shared),
            permit: Some(permit),
        };
        tokio::task::yield_now().await;
        Detached::new(lead(lane)).await;
    }
}

impl<K: BatchKind> Shared<K> {
    /// The queue. A panic while the lock is held (nothing under it panics
    /// but a failed allocation) can at worst drop the jobs taken out of it
    /// at that moment, whose callers then hear an error; what is left is a
    /// whole queue, so a poisoned lock is taken as it is.
    fn queue(&self) -> MutexGuard<'_, VecDeque<K::Job>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next batch: the queued jobs in order, up to
    /// [`BatchKind::MAX_BATCH`]; a job whose exclusive value is already in
    /// the batch stays queued, in its place, for the next one.
    fn take(&self) -> Vec<K::Job> {
        let mut queue = self.queue();
        let mut batch = Vec::new();
        let mut left = VecDeque::new();
        let mut taken: HashSet<K::Exclusive> = HashSet::new();
        while let Some(job) = queue.pop_front() {
            if batch.len() == K::MAX_BATCH {
                queue.push_front(job);
                break;
            }
            if K::exclusive(&job).is_none_or(|value| taken.insert(value)) {
                batch.push(job);
            } else {
                left.push_back(job);
            }
        }
        while let Some(job) = left.pop_back() {
            queue.push_front(job);
        }
        batch
    }

    fn has_queued(&self) -> bool {
        !self.queue().is_empty()
    }
}

/// A lane held, and the duty that comes with it: whoever lets a lane go
/// while jobs are queued sees that they are run.
struct Lane<K: BatchKind> {
    shared: Arc<Shared<K>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<K: BatchKind> Drop for Lane<K> {
    fn drop(&mut self) {
        drop(self.permit.take());
        fence(Ordering::SeqCst);
        if self.shared.has_queued()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(drain(Arc::clone(&self.shared)));
        }
    }
}

/// One batch from the queue, run while holding `lane`.
async fn lead<K: BatchKind>(lane: Lane<K>) {
    let batch = lane.shared.take();
    if !batch.is_empty() {
        lane.shared.kind.run(batch).await;
    }
}

/// The draining task: batches from the queue on one lane until it finds
/// the queue empty (and then, as it lets the lane go, looks once more).
async fn drain<K: BatchKind>(shared: Arc<Shared<K>>) {
    // The semaphore is never closed.
    let Ok(permit) = Arc::clone(&shared.lanes).acquire_owned().await else {
        return;
    };
    let lane = Lane {
        shared,
        permit: Some(permit),
    };
    loop {
        let batch = lane.shared.take();
        if batch.is_empty() {
            return;
        }
        lane.shared.kind.run(batch).await;
    }
}

/// A future that, if dropped before it finished, finishes in a task of its
/// own: a leader's batch answers every job in it even when the leader's
/// caller stops waiting.
struct Detached<F: Future<Output = ()> + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future<Output = ()> + Send + 'static> Detached<F> {
    fn new(future: F) -> Self {
        Self(Some(Box::pin(future)))
    }
}

impl<F: Future<Output = ()> + Send + 'static> Future for Detached<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(future) = self.0.as_mut() else {
            return Poll::Ready(());
        };
        let done = future.as_mut().poll(cx);
        if done.is_ready() {
            self.0 = None;
        }
        done
    }
}

impl<F: Future<Output = ()> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        if let Some(future) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(future);
        }
    }
}

/// The answer to a job, once its batch answered it.
pub(crate) async fn answer<T>(
    reply: oneshot::Receiver<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    reply.await.unwrap_or_else(|_| {
        Err(StoreError::Backend(
            "the Postgres batch was dropped before answering (a write may or may not have been committed)"
                .into(),
        ))
    })
}

/// `error` again, for another job of the batch.
pub(crate) fn same_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Backend(m) => StoreError::Backend(m.clone()),
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
    }
}
