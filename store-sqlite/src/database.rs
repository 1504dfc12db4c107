//! The connections of one database file and the threads that own some.
//!
//! A [`Database`] is one writer thread (the only connection that writes),
//! one checkpoint thread, and a pool of read-only connections. A write is a
//! closure sent through a channel to the writer; the caller awaits a
//! `futures` oneshot for the answer, so a write, which may wait for another
//! process's lock, never blocks the caller's executor. A read runs on the
//! calling thread with a connection checked out of the pool: in WAL mode a
//! read never waits for a lock held by a writer (see the crate docs).
//!
//! The writer takes every job that is waiting when it wakes up (at most
//! [`MAX_GROUP`]; under load it lingers for more, see [`linger`]) and runs
//! them in one `BEGIN IMMEDIATE` transaction (group commit); a job that fails is rolled back alone and the others commit
//! (see [`run_group`]). Replies are sent only after `COMMIT` returned, so
//! "the call returned" always means "the change is committed".

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rusqlite::Connection;

/// Most write jobs committed together in one transaction.
const MAX_GROUP: usize = 64;
/// How long an idle writer keeps polling for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(30);
/// A group that follows one of at least this many jobs waits for more
/// (see [`linger`]).
const LINGER_AFTER: usize = 8;
/// Lingering ends once no job came for this long...
const LINGER_GAP: Duration = Duration::from_micros(40);
/// ... or after this long in all.
const LINGER_MAX: Duration = Duration::from_micros(400);

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
    /// A job may run more than once (see [`run_group`]): only the result of
    /// its last run counts.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Delivers the answer once the transaction is settled; `settled` is the
    /// error of `BEGIN`/`COMMIT` if the transaction did not commit.
    fn finish(self: Box<Self>, settled: Result<(), DbError>);
}

struct Work<F, R> {
    job: F,
    result: Option<Result<R, DbError>>,
    reply: oneshot::Sender<Result<R, DbError>>,
}

impl<F, R> WriteWork for Work<F, R>
where
    F: FnMut(&Connection) -> Result<R, DbError> + Send,
    R: Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let job = &mut self.job;
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

/// The writer thread, the checkpoint thread and the read connections of
/// one database file.
pub(crate) struct Database {
    writer: Option<Sender<WriteJob>>,
    writer_thread: Option<JoinHandle<()>>,
    checkpoints: Arc<Checkpoints>,
    checkpoint_thread: Option<JoinHandle<()>>,
    readers: ReadPool,
}

/// The connections a [`Database`] starts with.
pub(crate) struct Connections {
    /// The one read-write connection that writes.
    pub(crate) writer: Connection,
    /// A read-write connection that only checkpoints the WAL.
    pub(crate) checkpointer: Connection,
    /// The first read connection.
    pub(crate) reader: Connection,
    /// Opens more read connections.
    pub(crate) open_reader: OpenReader,
    /// Most read connections open at once.
    pub(crate) max_readers: usize,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("readers", &self.readers)
            .finish_non_exhaustive()
    }
}

/// Opens one more read connection for the pool.
pub(crate) type OpenReader = Box<dyn Fn() -> rusqlite::Result<Connection> + Send + Sync>;

/// Read connections, checked out by the calling thread for one read.
///
/// Idle connections wait in a stack (the most recently used one is handed
/// out first: its statement cache and pages are warm). When every connection
/// is checked out another one is opened, up to `max`; beyond that a caller
/// waits for one to come back, which takes microseconds since a read never
/// waits for a writer.
struct ReadPool {
    idle: Mutex<Idle>,
    returned: Condvar,
    open: OpenReader,
    max: usize,
    busy_timeout: Duration,
}

struct Idle {
    connections: Vec<Connection>,
    /// Connections that exist: idle ones and checked-out ones.
    count: usize,
    /// Callers waiting for a connection to come back.
    waiting: usize,
}

impl std::fmt::Debug for ReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPool")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl ReadPool {
    fn lock(&self) -> MutexGuard<'_, Idle> {
        // The pool's state is consistent between statements: a panic while
        // it was locked left nothing half-done.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection, a new one if all are busy and the bound allows,
    /// or the next one given back.
    fn checkout(&self) -> Result<Connection, DbError> {
        let mut idle = self.lock();
        loop {
            if let Some(conn) = idle.connections.pop() {
                return Ok(conn);
            }
            if idle.count < self.max {
                idle.count += 1;
                drop(idle);
                return (self.open)().map_err(|e| {
                    self.lock().count -= 1;
                    DbError::from(e)
                });
            }
            idle.waiting += 1;
            idle = self
                .returned
                .wait(idle)
                .unwrap_or_else(PoisonError::into_inner);
            idle.waiting -= 1;
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.lock();
        idle.connections.push(conn);
        // Waking nobody would still cost a system call.
        if idle.waiting > 0 {
            self.returned.notify_one();
        }
    }

    /// A connection that must not be reused (a job panicked with it).
    fn discard(&self, conn: Connection) {
        drop(conn);
        let mut idle = self.lock();
        idle.count -= 1;
        if idle.waiting > 0 {
            self.returned.notify_one();
        }
    }
}

impl Database {
    /// Starts the writer thread with `writer`; `reader` is the first read
    /// connection, `open_reader` opens more, up to `max_readers`.
    pub(crate) fn start(
        name: &str,
        connections: Connections,
        busy_timeout: Duration,
    ) -> std::io::Result<Self> {
        let Connections {
            writer,
            checkpointer,
            reader,
            open_reader,
            max_readers,
        } = connections;
        let checkpoints = Arc::new(Checkpoints::default());
        let signal = Arc::clone(&checkpoints);
        let checkpoint_thread = std::thread::Builder::new()
            .name(format!("{name}-checkpoint"))
            .spawn(move || checkpoint_loop(&checkpointer, &signal))?;
        let (write_tx, write_rx) = std::sync::mpsc::channel::<WriteJob>();
        let signal = Arc::clone(&checkpoints);
        let writer_thread = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                BUSY_BUDGET.set(busy_timeout);
                CHECKPOINTS.set(Some(signal));
                // Replaces SQLite's autocheckpoint, which would run the
                // checkpoint inside the commit on this thread.
                writer.wal_hook(Some(wal_hook));
                writer_loop(writer, write_rx);
            });
        let writer_thread = match writer_thread {
            Ok(handle) => handle,
            Err(e) => {
                checkpoints.stop();
                let _ = checkpoint_thread.join();
                return Err(e);
            }
        };
        Ok(Self {
            writer: Some(write_tx),
            writer_thread: Some(writer_thread),
            checkpoints,
            checkpoint_thread: Some(checkpoint_thread),
            readers: ReadPool {
                idle: Mutex::new(Idle {
                    connections: vec![reader],
                    count: 1,
                    waiting: 0,
                }),
                returned: Condvar::new(),
                open: open_reader,
                max: max_readers.max(1),
                busy_timeout,
            },
        })
    }

    /// Runs `job` on the writer thread inside an immediate transaction and
    /// returns its result once the transaction committed. If `job` fails,
    /// its changes are rolled back and its error returned.
    ///
    /// `job` must depend only on what it captured and on the database: it
    /// may be run a second time, in a fresh transaction, when another job of
    /// its group failed (see [`run_group`]); only the last run counts.
    pub(crate) async fn write<R, F>(&self, job: F) -> Result<R, DbError>
    where
        F: FnMut(&Connection) -> Result<R, DbError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work: WriteJob = Box::new(Work {
            job,
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

    /// Runs `job` right here, on the calling thread, with a read connection
    /// from the pool (autocommit: each statement sees the latest committed
    /// state). In WAL mode a read never waits for a writer, so this takes
    /// as long as the query itself; see the crate docs.
    pub(crate) fn read<R>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, DbError>,
    ) -> Result<R, DbError> {
        let conn = self.readers.checkout()?;
        // The busy handler runs on this thread: give it this database's
        // budget (the thread may be shared with other databases).
        BUSY_BUDGET.set(self.readers.busy_timeout);
        match catch_unwind(AssertUnwindSafe(|| job(&conn))) {
            Ok(result) => {
                self.readers.give_back(conn);
                result
            }
            Err(_) => {
                self.readers.discard(conn);
                Err(DbError::Panicked)
            }
        }
    }
}

impl Drop for Database {
    /// Closes the channel and waits for the writer: jobs already sent are
    /// finished and the connections closed (which checkpoints the WAL) before
    /// `drop` returns.
    fn drop(&mut self) {
        self.writer.take();
        // A panicked thread has nothing left to clean up.
        if let Some(handle) = self.writer_thread.take() {
            let _ = handle.join();
        }
        self.checkpoints.stop();
        if let Some(handle) = self.checkpoint_thread.take() {
            let _ = handle.join();
        }
    }
}

fn writer_loop(conn: Connection, jobs: Receiver<WriteJob>) {
    let mut group: Vec<WriteJob> = Vec::with_capacity(MAX_GROUP);
    let mut previous = 0;
    while let Some(first) = next_job(&jobs) {
        group.push(first);
        take_waiting(&jobs, &mut group);
        if previous >= LINGER_AFTER {
            linger(&jobs, &mut group);
        }
        previous = group.len();
        run_group(&conn, &mut group);
    }
}

/// Moves the jobs waiting in `jobs` into `group`, up to [`MAX_GROUP`].
fn take_waiting(jobs: &Receiver<WriteJob>, group: &mut Vec<WriteJob>) {
    while group.len() < MAX_GROUP {
        match jobs.try_recv() {
            Ok(job) => group.push(job),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
        }
    }
}

/// Waits for more jobs while they keep coming: until none came for
/// [`LINGER_GAP`], [`LINGER_MAX`] passed, or the group is full.
///
/// Called only when the previous group held [`LINGER_AFTER`] jobs or more,
/// i.e. while many callers write at once. Without it the writer, being
/// faster than a caller's executor at producing writes, commits nearly every
/// write alone as it arrives (4-5 jobs per commit with 64 lifecycles in
/// flight); every commit writes its pages to the WAL again and makes every
/// read connection drop its cache. Lingering a little gathers 15-30 jobs
/// per commit: 64 lifecycles in flight ran 10-20% faster, 16 in flight
/// 5-10%, 4 in flight (below the threshold) and one at a time unchanged.
fn linger(jobs: &Receiver<WriteJob>, group: &mut Vec<WriteJob>) {
    let start = Instant::now();
    let mut last_arrival = start;
    while group.len() < MAX_GROUP {
        let before = group.len();
        take_waiting(jobs, group);
        let now = Instant::now();
        if group.len() > before {
            last_arrival = now;
        } else if now.duration_since(last_arrival) >= LINGER_GAP
            || now.duration_since(start) >= LINGER_MAX
        {
            return;
        } else {
            std::thread::yield_now();
        }
    }
}

/// Runs `group` in one immediate transaction and answers every job.
///
/// Jobs almost never fail (a refused compare-and-swap or a taken key is an
/// answer, not a failure), so the group first runs without savepoints: a
/// savepoint per job would copy every page a job touches into the statement
/// journal, a fifth of the writer's work. If a job does fail, that
/// transaction is rolled back and the whole group runs again in a new one,
/// each job in its own savepoint, so that the failed job is rolled back
/// alone and the others commit. Every job sees the database as the jobs
/// before it in the group left it, in both runs.
fn run_group(conn: &Connection, group: &mut Vec<WriteJob>) {
    let settled = match begin(conn) {
        Err(e) => Err(e),
        Ok(()) if group.iter_mut().all(|job| job.run(conn)) => commit(conn),
        Ok(()) if group.len() == 1 => {
            // Its failure rolls back the transaction: nothing to retry.
            rollback(conn);
            Ok(())
        }
        Ok(()) => {
            rollback(conn);
            begin(conn)
                .and_then(|()| run_in_savepoints(conn, group))
                .and_then(|()| commit(conn))
        }
    };
    if settled.is_err() {
        rollback(conn);
    }
    for job in group.drain(..) {
        job.finish(settled.clone());
    }
}

fn begin(conn: &Connection) -> Result<(), DbError> {
    exec(conn, "BEGIN IMMEDIATE").map_err(DbError::from)
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

/// WAL size (in pages) from which a checkpoint is requested: SQLite's own
/// autocheckpoint threshold.
const CHECKPOINT_PAGES: i32 = 1000;

/// Longest wait of the checkpoint thread for a lock.
const CHECKPOINT_BUSY: Duration = Duration::from_millis(50);

/// Requests from the writer to the checkpoint thread.
#[derive(Default)]
struct Checkpoints {
    state: Mutex<CheckpointState>,
    wake: Condvar,
}

#[derive(Default)]
struct CheckpointState {
    requested: bool,
    stop: bool,
}

impl Checkpoints {
    fn lock(&self) -> MutexGuard<'_, CheckpointState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request(&self) {
        let mut state = self.lock();
        if !state.requested {
            state.requested = true;
            self.wake.notify_one();
        }
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
    }
}

thread_local! {
    /// The checkpoint thread of the writer running on this thread.
    static CHECKPOINTS: RefCell<Option<Arc<Checkpoints>>> = const { RefCell::new(None) };
}

/// Called by SQLite on the writer thread after each commit with the number
/// of pages in the WAL: past [`CHECKPOINT_PAGES`] it asks the checkpoint
/// thread for a checkpoint instead of running one inside the commit.
///
/// Past [`WRITER_CHECKPOINT_PAGES`] the checkpoint thread has fallen behind
/// (a loaded machine did not schedule it): the writer then copies the WAL
/// itself with a passive checkpoint, before it takes the next job. Writes
/// slow down instead of the WAL growing without bound.
fn wal_hook(wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    if pages >= CHECKPOINT_PAGES {
        CHECKPOINTS.with_borrow(|c| {
            if let Some(c) = c {
                c.request();
            }
        });
    }
    if pages >= WRITER_CHECKPOINT_PAGES {
        // A failure (e.g. another process checkpoints) leaves it to the
        // checkpoint thread, as before.
        let _ = wal.checkpoint_v2(rusqlite::hooks::CheckpointMode::PASSIVE);
    }
    Ok(())
}

/// WAL size (in pages) at which the writer stops leaving the checkpoint to
/// the checkpoint thread: four times [`CHECKPOINT_PAGES`] (about 16 MB).
const WRITER_CHECKPOINT_PAGES: i32 = 4 * CHECKPOINT_PAGES;

/// Passive checkpoints in a row, at most, before the `FULL` one.
const PASSIVE_ROUNDS: usize = 4;

/// A passive round that copied fewer WAL frames than this is the last one.
const FULL_REMAINDER: i64 = 64;

/// Runs a checkpoint whenever the writer asks for one, until stopped.
///
/// First passive checkpoints: they take neither the write lock nor readers'
/// locks and copy the WAL (with its fsyncs) while the writer goes on
/// committing. The first one copies the bulk; each further one copies what
/// was committed during the one before, a fraction of it, until a round
/// copies fewer than [`FULL_REMAINDER`] frames (or [`PASSIVE_ROUNDS`] ran). Under a
/// steady stream of commits a passive checkpoint can never catch up with
/// the last few frames, and the WAL is only started over once everything
/// was copied; so a `FULL` checkpoint follows, which holds the write lock
/// (the writer waits meanwhile) just long enough to copy those last frames
/// and sync. Copying the remainder of the first round in it instead took
/// 2-6 ms of writer stall per checkpoint under load. It waits for the write
/// lock and for old readers at most [`CHECKPOINT_BUSY`]; if it gives up,
/// the next request tries again. The writer starts the WAL over at its next
/// transaction.
fn checkpoint_loop(conn: &Connection, checkpoints: &Checkpoints) {
    BUSY_BUDGET.set(CHECKPOINT_BUSY);
    loop {
        {
            let mut state = checkpoints.lock();
            while !state.requested && !state.stop {
                state = checkpoints
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
            state.requested = false;
        }
        // A failed checkpoint (e.g. another process is checkpointing) is
        // simply tried again after the writer's next commit.
        // Each round copies what the WAL held when it began: go on while a
        // round still had much to copy (what came meanwhile is less).
        let mut copied_before = 0;
        for _ in 0..PASSIVE_ROUNDS {
            match checkpoint(conn, "PRAGMA wal_checkpoint(PASSIVE)") {
                Some((_, copied)) if copied - copied_before >= FULL_REMAINDER => {
                    copied_before = copied;
                }
                _ => break,
            }
        }
        let _ = checkpoint(conn, "PRAGMA wal_checkpoint(FULL)");
        // Commits during these rounds asked again; what they asked for is
        // done (and if the checkpoint failed, the next commit asks again).
        checkpoints.lock().requested = false;
    }
}

/// Runs one checkpoint pragma; the frames in the WAL and those copied, if
/// it ran.
fn checkpoint(conn: &Connection, pragma: &str) -> Option<(i64, i64)> {
    conn.query_row(pragma, [], |r| Ok((r.get(1)?, r.get(2)?)))
        .ok()
}

/// The next job, or `None` once the channel is closed and drained.
///
/// Right after a group the writer keeps polling for [`SPIN`] (yielding the
/// CPU between polls) before it sleeps: a caller working through a sequence
/// of calls sends the next write within microseconds, and waking a sleeping
/// thread costs far more than that on a busy machine (measured: a 30 µs
/// yielding spin beats both no spin and a busy spin).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job<F>(f: F) -> (WriteJob, oneshot::Receiver<Result<(), DbError>>)
    where
        F: FnMut(&Connection) -> Result<(), DbError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work: WriteJob = Box::new(Work {
            job: f,
            result: None,
            reply,
        });
        (work, answer)
    }

    fn insert(conn: &Connection, id: i64) -> Result<(), DbError> {
        conn.execute("INSERT INTO t (id) VALUES (?1)", [id])?;
        Ok(())
    }

    fn ids(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT id FROM t ORDER BY id").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn a_failed_job_is_rolled_back_alone_and_the_others_commit() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            .unwrap();
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let (first, first_answer) = job(move |conn| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            insert(conn, 1)
        });
        // Writes 2, then fails on 1 (written by the job before it).
        let (failing, failing_answer) = job(|conn| {
            insert(conn, 2)?;
            insert(conn, 1)
        });
        let (last, last_answer) = job(|conn| insert(conn, 3));
        let mut group = vec![first, failing, last];
        run_group(&conn, &mut group);
        assert!(group.is_empty());
        assert!(conn.is_autocommit(), "the transaction is settled");
        assert_eq!(ids(&conn), [1, 3]);
        let answer = |a: oneshot::Receiver<Result<(), DbError>>| {
            futures::executor::block_on(a).expect("answered")
        };
        assert!(answer(first_answer).is_ok());
        assert!(answer(failing_answer).is_err());
        assert!(answer(last_answer).is_ok());
        // Without savepoints first, then again in savepoints.
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn a_group_without_failures_runs_each_job_once() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            .unwrap();
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut group = Vec::new();
        let mut answers = Vec::new();
        for id in 1..=3 {
            let counted = Arc::clone(&runs);
            let (work, answer) = job(move |conn| {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                insert(conn, id)
            });
            group.push(work);
            answers.push(answer);
        }
        run_group(&conn, &mut group);
        assert_eq!(ids(&conn), [1, 2, 3]);
        for answer in answers {
            assert!(
                futures::executor::block_on(answer)
                    .expect("answered")
                    .is_ok()
            );
        }
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn a_lone_failed_job_leaves_nothing_behind() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1)")
            .unwrap();
        let (failing, answer) = job(|conn| {
            insert(conn, 2)?;
            insert(conn, 1)
        });
        let mut group = vec![failing];
        run_group(&conn, &mut group);
        assert!(conn.is_autocommit());
        assert_eq!(ids(&conn), [1]);
        assert!(
            futures::executor::block_on(answer)
                .expect("answered")
                .is_err()
        );
    }
}
