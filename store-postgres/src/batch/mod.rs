//! Batching: the concurrent requests of one kind (the durable writes, the
//! hot reads) gathered and run together, so that many requests share a round
//! trip, a statement's execution and, for writes, a commit and its flush of
//! the WAL.
//!
//! Each kind has a few lanes ([`WRITE_LANES`], [`lanes`]): at most that many of its
//! statements run at once, each on a pooled connection. A request that
//! finds a lane free and no other request of its kind waiting runs at
//! once, alone, in the caller's own task (as a direct query would). A
//! request that finds every lane busy is queued for the kind's gathering
//! task instead, which waits for a lane and then takes everything queued
//! meanwhile (up to [`BatchKind::MAX_BATCH`] requests) as one batch. The
//! busier the store, the larger the batches; a quiet store pays nothing for
//! them.
//!
//! The gathering task is started by the first queued request, on the Tokio
//! runtime of that call, and ends once every handle is dropped; each batch
//! runs in a task of its own. If the runtime shut down (a store kept across
//! runtimes, as tests do), the next queued request starts a new gathering
//! task on the runtime of its call; a request whose batch was dropped with
//! its runtime is answered with an error.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use graph_relay_core::store::StoreError;
use tokio::sync::{Semaphore, mpsc, oneshot};

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
    /// The queue of the gathering task, once one was started.
    jobs: Mutex<Option<mpsc::UnboundedSender<K::Job>>>,
}

/// What the callers and the gathering task share.
struct Shared<K> {
    kind: K,
    /// One permit per lane.
    lanes: Arc<Semaphore>,
    /// Jobs queued and not yet taken into a batch.
    queued: AtomicUsize,
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
                queued: AtomicUsize::new(0),
            }),
            jobs: Mutex::new(None),
        }
    }

    /// Runs `job` now if a lane is free and nothing else waits, else queues
    /// it for the next batch; either way its answer goes where the job says.
    pub(crate) async fn run(&self, job: K::Job) -> Result<(), StoreError> {
        if self.shared.queued.load(Ordering::Acquire) == 0
            && let Ok(_lane) = self.shared.lanes.try_acquire()
        {
            self.shared.kind.run(vec![job]).await;
            return Ok(());
        }
        self.submit(job)
    }

    /// Queues `job` for the gathering task, starting the task if none runs.
    fn submit(&self, job: K::Job) -> Result<(), StoreError> {
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| StoreError::Backend("a Postgres batch queue was poisoned".into()))?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let job = match jobs.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                // The task was dropped with its runtime.
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::Backend(
                "the Postgres store must be used inside a Tokio runtime".into(),
            ));
        };
        // Whatever the previous task had queued went with it (answered
        // with an error): only this job waits now, so lone requests may go
        // straight out again once it is taken.
        self.shared.queued.store(1, Ordering::Release);
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(gathering(Arc::clone(&self.shared), rx));
        let sent = tx.send(job).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            StoreError::Backend("a Postgres batch task stopped as it started".into())
        });
        *jobs = Some(tx);
        sent
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

/// The gathering task: waits for a job, then for a lane, then takes what
/// is queued as one batch and runs it in a task of its own.
async fn gathering<K: BatchKind>(
    shared: Arc<Shared<K>>,
    mut jobs: mpsc::UnboundedReceiver<K::Job>,
) {
    // Jobs that could not join the last batch: they open the next.
    let mut held: Vec<K::Job> = Vec::new();
    loop {
        let first = if held.is_empty() {
            match jobs.recv().await {
                Some(job) => Some(job),
                // Every handle is gone and nothing is held.
                None => return,
            }
        } else {
            None
        };
        // The semaphore is never closed.
        let Ok(lane) = Arc::clone(&shared.lanes).acquire_owned().await else {
            return;
        };
        let batch = gather::<K>(&mut jobs, &mut held, first);
        shared.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            shared.kind.run(batch).await;
            drop(lane);
        });
    }
}

/// A batch: the held jobs, then `first`, then the jobs waiting in `jobs`,
/// up to [`BatchKind::MAX_BATCH`]; a job whose exclusive value is already
/// in the batch is held for the next one.
fn gather<K: BatchKind>(
    jobs: &mut mpsc::UnboundedReceiver<K::Job>,
    held: &mut Vec<K::Job>,
    first: Option<K::Job>,
) -> Vec<K::Job> {
    let mut batch = Vec::new();
    let mut taken: HashSet<K::Exclusive> = HashSet::new();
    let mut admit = |job: K::Job, batch: &mut Vec<K::Job>, held: &mut Vec<K::Job>| {
        let first_of_its_value = K::exclusive(&job).is_none_or(|value| taken.insert(value));
        if first_of_its_value && batch.len() < K::MAX_BATCH {
            batch.push(job);
        } else {
            held.push(job);
        }
    };
    for job in std::mem::take(held).into_iter().chain(first) {
        admit(job, &mut batch, held);
    }
    while batch.len() < K::MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => admit(job, &mut batch, held),
            Err(_) => break,
        }
    }
    batch
}
