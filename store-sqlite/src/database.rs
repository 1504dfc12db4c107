//! The threads that own the SQLite connections.
//!
//! A [`Database`] is one writer thread and a few reader threads, each with
//! its own connection. Callers hand them closures through channels and
//! await a `futures` oneshot for the answer, so no SQLite call ever runs on
//! the caller's executor.
//!
//! The writer takes every job that is waiting when it wakes up (at most
//! [`MAX_GROUP`]) and runs them in one `BEGIN IMMEDIATE` transaction, each
//! job inside its own savepoint: a job that fails is rolled back alone, the
//! others commit together (group commit). Replies are sent only after
//! `COMMIT` returned, so "the call returned" always means "the change is
//! committed".

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rusqlite::Connection;

/// Most write jobs committed together in one transaction.
const MAX_GROUP: usize = 64;
/// How long an idle worker keeps polling for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(30);

/// A failure inside the database threads, before it is mapped to the
/// error type of the trait being implemented.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum DbError {
    /// SQLite refused or failed.
    #[error("sqlite: {0}")]
    Sqlite(String),
    /// A stored value could not be decoded.
    #[error("{0}")]
    Corrupt(String),
    /// A value could not be encoded for storage.
    #[error("cannot encode a value for storage: {0}")]
    Encode(String),
    /// The worker thread is gone (it panicked, or the database was closed).
    #[error("the SQLite worker thread stopped")]
    Stopped,
    /// A job panicked; its transaction was rolled back.
    #[error("a SQLite job panicked; its changes were rolled back")]
    Panicked,
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e.to_string())
    }
}

/// One write job as the writer thread sees it.
trait WriteWork: Send {
    /// Runs the job inside the open transaction. Returns `true` on success.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Delivers the answer once the transaction is settled; `settled` is the
    /// error of `BEGIN`/`COMMIT` if the transaction did not commit.
    fn finish(self: Box<Self>, settled: Result<(), DbError>);
}

struct Work<F, R> {
    job: Option<F>,
    result: Option<Result<R, DbError>>,
    reply: oneshot::Sender<Result<R, DbError>>,
}

impl<F, R> WriteWork for Work<F, R>
where
    F: FnOnce(&Connection) -> Result<R, DbError> + Send,
    R: Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(job) = self.job.take() else {
            return false;
        };
        let result = catch_unwind(AssertUnwindSafe(|| job(conn))).unwrap_or(Err(DbError::Panicked));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, settled: Result<(), DbError>) {
        let answer = match (settled, self.result) {
            (_, Some(Err(e))) => Err(e),
            (Err(e), _) => Err(e),
            (Ok(()), Some(Ok(r))) => Ok(r),
            (Ok(()), None) => Err(DbError::Stopped),
        };
        // The caller may have stopped waiting; that is not an error here.
        let _ = self.reply.send(answer);
    }
}

type WriteJob = Box<dyn WriteWork>;
type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// The writer and reader threads of one database file.
pub(crate) struct Database {
    writer: Option<Sender<WriteJob>>,
    readers: Vec<Reader>,
    threads: Vec<JoinHandle<()>>,
}

/// One reader thread's queue and how many jobs it has not finished.
struct Reader {
    jobs: Sender<ReadJob>,
    in_flight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Starts the threads: `writer` gets the write connection, each of
    /// `readers` (at least one) a read connection.
    pub(crate) fn start(
        name: &str,
        writer: Connection,
        readers: Vec<Connection>,
        busy_timeout: Duration,
    ) -> std::io::Result<Self> {
        let (write_tx, write_rx) = std::sync::mpsc::channel::<WriteJob>();
        let mut db = Self {
            writer: Some(write_tx),
            readers: Vec::with_capacity(readers.len()),
            threads: Vec::with_capacity(1 + readers.len()),
        };
        let handle = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                BUSY_BUDGET.set(busy_timeout);
                writer_loop(writer, write_rx);
            })?;
        db.threads.push(handle);
        for (i, conn) in readers.into_iter().enumerate() {
            let (jobs, rx) = std::sync::mpsc::channel::<ReadJob>();
            let in_flight = Arc::new(AtomicUsize::new(0));
            let count = Arc::clone(&in_flight);
            let handle = std::thread::Builder::new()
                .name(format!("{name}-reader-{i}"))
                .spawn(move || {
                    BUSY_BUDGET.set(busy_timeout);
                    reader_loop(conn, rx, count);
                })?;
            db.threads.push(handle);
            db.readers.push(Reader { jobs, in_flight });
        }
        Ok(db)
    }

    /// Runs `job` on the writer thread inside an immediate transaction and
    /// returns its result once the transaction committed. If `job` fails,
    /// its changes are rolled back and its error returned.
    pub(crate) async fn write<R, F>(&self, job: F) -> Result<R, DbError>
    where
        F: FnOnce(&Connection) -> Result<R, DbError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work: WriteJob = Box::new(Work {
            job: Some(job),
            result: None,
            reply,
        });
        self.writer
            .as_ref()
            .ok_or(DbError::Stopped)?
            .send(work)
            .map_err(|_| DbError::Stopped)?;
        answer.await.map_err(|_| DbError::Stopped)?
    }

    /// Runs `job` on a reader thread (autocommit: each statement sees the
    /// latest committed state).
    pub(crate) async fn read<R, F>(&self, job: F) -> Result<R, DbError>
    where
        F: FnOnce(&Connection) -> Result<R, DbError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work: ReadJob = Box::new(move |conn| {
            let result =
                catch_unwind(AssertUnwindSafe(|| job(conn))).unwrap_or(Err(DbError::Panicked));
            let _ = reply.send(result);
        });
        // The least busy reader, the first one on a tie: a caller that reads
        // one thing after another keeps meeting the same, still-awake thread.
        let reader = self
            .readers
            .iter()
            .min_by_key(|r| r.in_flight.load(Ordering::Relaxed))
            .ok_or(DbError::Stopped)?;
        reader.in_flight.fetch_add(1, Ordering::Relaxed);
        if reader.jobs.send(work).is_err() {
            reader.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(DbError::Stopped);
        }
        answer.await.map_err(|_| DbError::Stopped)?
    }
}

impl Drop for Database {
    /// Closes the channels and waits for the threads: jobs already sent are
    /// finished and the connections closed (which checkpoints the WAL) before
    /// `drop` returns.
    fn drop(&mut self) {
        self.writer.take();
        self.readers.clear();
        for handle in self.threads.drain(..) {
            // A panicked worker has nothing left to clean up.
            let _ = handle.join();
        }
    }
}

fn writer_loop(conn: Connection, jobs: Receiver<WriteJob>) {
    let mut group: Vec<WriteJob> = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = next_job(&jobs) {
        group.push(first);
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        run_group(&conn, &mut group);
    }
}

/// Runs `group` in one immediate transaction and answers every job.
fn run_group(conn: &Connection, group: &mut Vec<WriteJob>) {
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
        let e = DbError::from(e);
        for job in group.drain(..) {
            job.finish(Err(e.clone()));
        }
        return;
    }
    let settled = if group.len() == 1 {
        // One job: no savepoint needed, its failure rolls back the transaction.
        if group.iter_mut().all(|job| job.run(conn)) {
            commit(conn)
        } else {
            rollback(conn);
            Ok(())
        }
    } else {
        run_in_savepoints(conn, group).and_then(|()| commit(conn))
    };
    if settled.is_err() {
        rollback(conn);
    }
    for job in group.drain(..) {
        job.finish(settled.clone());
    }
}

/// Runs each job of `group` in its own savepoint inside the open transaction.
fn run_in_savepoints(conn: &Connection, group: &mut [WriteJob]) -> Result<(), DbError> {
    for job in group.iter_mut() {
        exec(conn, "SAVEPOINT job")?;
        if job.run(conn) {
            exec(conn, "RELEASE job")?;
        } else {
            exec(conn, "ROLLBACK TO job")?;
            exec(conn, "RELEASE job")?;
        }
    }
    Ok(())
}

fn commit(conn: &Connection) -> Result<(), DbError> {
    exec(conn, "COMMIT").map_err(DbError::from)
}

/// Runs one transaction-control statement through the statement cache.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        // If even ROLLBACK fails SQLite has already rolled back (or the
        // connection is unusable and the next BEGIN reports it).
        let _ = exec(conn, "ROLLBACK");
    }
}

fn reader_loop(conn: Connection, jobs: Receiver<ReadJob>, in_flight: Arc<AtomicUsize>) {
    while let Some(job) = next_job(&jobs) {
        job(&conn);
        in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The next job, or `None` once the channel is closed and drained.
///
/// Right after a job the thread keeps polling for [`SPIN`] (yielding the CPU
/// between polls) before it sleeps: a caller working through a sequence of
/// calls sends the next one within microseconds, and waking a sleeping
/// thread costs far more than that on a busy machine.
fn next_job<T>(jobs: &Receiver<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if start.elapsed() < SPIN => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return jobs.recv().ok(),
        }
    }
}

thread_local! {
    /// How long this thread's connection waits for a lock held by another
    /// connection (in this or another process) before giving up.
    static BUSY_BUDGET: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    /// When the current wait for a lock began.
    static BUSY_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// SQLite's busy handler for every connection of this crate.
///
/// SQLite's own `busy_timeout` sleeps up to 100 ms between attempts, which
/// lets a process in a tight write loop starve another one. This handler
/// polls every 50 µs to 1 ms instead, so two processes that both write as fast
/// as they can take turns, and gives up only after the configured budget.
pub(crate) fn busy_handler(attempt: i32) -> bool {
    let now = Instant::now();
    let since = if attempt == 0 {
        BUSY_SINCE.set(Some(now));
        now
    } else {
        BUSY_SINCE.get().unwrap_or(now)
    };
    if now.duration_since(since) >= BUSY_BUDGET.get() {
        return false;
    }
    let step = u64::try_from(attempt.clamp(0, 20)).unwrap_or(20);
    std::thread::sleep(Duration::from_micros(50 * (step + 1)));
    true
}

/// Sets the busy budget of the calling thread (used while opening).
pub(crate) fn set_busy_budget(budget: Duration) {
    BUSY_BUDGET.set(budget);
}
