//! Batching: a task that gathers the concurrent requests of one kind (the
//! writes, the hot reads) and runs each gathered batch as one statement,
//! so that many requests share a round trip, a statement's execution and,
//! for writes, a commit and its flush of the WAL.
//!
//! A caller hands its job (its request and where the answer goes) to the
//! task of its kind and awaits the answer. The task runs at most
//! [`BatchKind::LANES`] batches at once, each on a pooled connection. A
//! job that finds a lane free starts a batch at once, alone if nothing else
//! waits, so a lone request costs no more than a direct query but for one
//! hop to the task; jobs that arrive while every lane is busy wait
//! together and form the next batch, up to [`BatchKind::MAX_BATCH`] jobs.
//! The busier the store, the larger the batches.
//!
//! The task is started by the first job, on the Tokio runtime of that
//! call, and ends once every handle is dropped and every batch answered.
//! If its runtime shut down (a store kept across runtimes, as tests do),
//! the next job starts a new task on the runtime of its call; a job that
//! was in flight when its task was dropped is answered with an error.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use graph_relay_core::store::StoreError;
use tokio::sync::{mpsc, oneshot};

/// One kind of batched request: how its jobs are grouped and run.
pub(crate) trait BatchKind: Send + Sync + 'static {
    /// A request and where its answer goes.
    type Job: Send + 'static;
    /// What no two jobs of one batch may share (see [`exclusive`](Self::exclusive)).
    type Exclusive: Hash + Eq;
    /// Most jobs in one batch.
    const MAX_BATCH: usize;
    /// Most batches running at once.
    const LANES: usize;

    /// What `job` must have to itself in its batch, if anything: a job
    /// whose value is already in the batch being gathered waits for the
    /// next batch.
    fn exclusive(job: &Self::Job) -> Option<Self::Exclusive>;

    /// Runs `batch` and answers every job in it, whatever happens.
    fn run(&self, batch: Vec<Self::Job>) -> impl Future<Output = ()> + Send;
}

/// The handle of a kind's task, shared by a store and its clones.
pub(crate) struct Batcher<K: BatchKind> {
    kind: Arc<K>,
    jobs: Mutex<Option<mpsc::UnboundedSender<K::Job>>>,
}

impl<K: BatchKind> Batcher<K> {
    pub(crate) fn new(kind: K) -> Self {
        Self {
            kind: Arc::new(kind),
            jobs: Mutex::new(None),
        }
    }

    /// Queues `job` for the task, starting the task if none is running.
    pub(crate) fn submit(&self, job: K::Job) -> Result<(), StoreError> {
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| StoreError::Backend("a Postgres batch queue was poisoned".into()))?;
        let job = match jobs.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                // The task was dropped with its runtime.
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::Backend("the Postgres store must be used inside a Tokio runtime".into())
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(Arc::clone(&self.kind), rx));
        let sent = tx
            .send(job)
            .map_err(|_| StoreError::Backend("a Postgres batch task stopped as it started".into()));
        *jobs = Some(tx);
        sent
    }
}

/// The answer to a submitted job.
pub(crate) async fn answer<T>(reply: oneshot::Receiver<Result<T, StoreError>>) -> Result<T, StoreError> {
    reply.await.unwrap_or_else(|_| {
        Err(StoreError::Backend(
            "the Postgres batch task stopped before answering (a write may or may not have been committed)"
                .into(),
        ))
    })
}

/// The task: gathers batches and runs up to [`BatchKind::LANES`] at once.
async fn run<K: BatchKind>(kind: Arc<K>, mut jobs: mpsc::UnboundedReceiver<K::Job>) {
    let mut running = FuturesUnordered::new();
    // Jobs that could not join the last batch gathered: they open the next.
    let mut held: Vec<K::Job> = Vec::new();
    // Whether a handle may still send jobs.
    let mut open = true;
    loop {
        let room = running.len() < K::LANES;
        if room && !held.is_empty() {
            let batch = gather::<K>(&mut jobs, &mut held, None);
            running.push(kind.run(batch));
        } else if room && open {
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => {
                        let batch = gather::<K>(&mut jobs, &mut held, Some(job));
                        running.push(kind.run(batch));
                    }
                    None => open = false,
                },
                Some(()) = running.next(), if !running.is_empty() => {}
            }
        } else if running.next().await.is_none() {
            // Nothing runs, nothing is held, and nothing more can come.
            return;
        }
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
        if first_of_its_value {
            batch.push(job);
        } else {
            held.push(job);
        }
    };
    for job in std::mem::take(held).into_iter().chain(first) {
        if batch.len() == K::MAX_BATCH {
            held.push(job);
        } else {
            admit(job, &mut batch, held);
        }
    }
    while batch.len() < K::MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => admit(job, &mut batch, held),
            Err(_) => break,
        }
    }
    batch
}

/// `error` again, for another job of the batch.
pub(crate) fn same_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Backend(m) => StoreError::Backend(m.clone()),
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
    }
}
