//! The connections of one database file and the threads that own some.
//!
//! A [`Database`] is one writing connection with its writer thread, one
//! checkpoint thread, and a pool of read-only connections. A write is a
//! closure sent through a channel to the writer; the caller awaits its
//! answer (`reply`: the answers of a group are woken together), so a write
//! that waits for another process's lock never blocks the caller's
//! executor. When the writer has nothing to do, the caller runs its write
//! itself instead, with the writing connection, if the file's write lock is
//! free at once (see [`Database::write`]). A read runs on the
//! calling thread with a connection checked out of the pool: in WAL mode a
//! read never waits for a lock held by a writer (see the crate docs).
//!
//! The writer takes every job that is waiting when it wakes up (at most
//! `writer::MAX_GROUP`; under load it lingers for more, see `writer::linger`) and runs
//! them in one `BEGIN IMMEDIATE` transaction (group commit); a job that fails is rolled back alone and the others commit
//! (see `writer::run_group`). Replies are sent only after `COMMIT` returned, so
//! "the call returned" always means "the change is committed".
//!
//! The writer's group commit is in `writer`, the pool of read connections
//! in `read_pool`, and the checkpoint thread in `checkpoints`.

mod checkpoints;
mod read_pool;
mod reply;
mod writer;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use self::checkpoints::{CHECKPOINTS, Checkpoints, asking, checkpoint_loop, wal_hook};
use self::read_pool::ReadPool;
use self::writer::{Work, WriteJob, WriterState, Writing, try_inline, writer_loop};

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

/// How many SQL statements were executed against one [`Database`]: every
/// execution of a (cached) statement by a read or a write job, and every
/// transaction-control statement of the writer (`BEGIN`, `COMMIT`,
/// savepoints, `ROLLBACK`). The checkpoint thread's pragmas, run when the
/// WAL is full rather than for any call, and the statements of opening and
/// migrating a file are not counted. Code that executes a statement adds
/// it here right before executing it.
#[derive(Debug, Default)]
pub(crate) struct Statements(AtomicU64);

impl Statements {
    /// Counts `n` statements about to be executed.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Statements executed so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The writer thread, the checkpoint thread and the read connections of
/// one database file.
pub(crate) struct Database {
    statements: Arc<Statements>,
    /// The one connection that writes: the writer thread's while it runs a
    /// group, else free for a caller to run its write on (see [`Database::write`]).
    writing: Arc<Mutex<Writing>>,
    /// Whether callers may run their writes themselves (not when every
    /// commit waits for an fsync, which would hold up the caller's executor).
    inline_writes: bool,
    /// Whether the writer thread sleeps and nothing waits for it.
    writer_state: Arc<WriterState>,
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
    /// Whether a caller may commit on its own thread: only when a commit
    /// does not wait for an fsync (see [`Database::write`]).
    pub(crate) inline_writes: bool,
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
            inline_writes,
        } = connections;
        let checkpoints = Arc::new(Checkpoints::default());
        let signal = Arc::clone(&checkpoints);
        let checkpoint_thread = std::thread::Builder::new()
            .name(format!("{name}-checkpoint"))
            .spawn(move || checkpoint_loop(&checkpointer, &signal))?;
        let (write_tx, write_rx) = std::sync::mpsc::channel::<WriteJob>();
        let signal = Arc::clone(&checkpoints);
        let statements = Arc::new(Statements::default());
        let counted = Arc::clone(&statements);
        // Replaces SQLite's autocheckpoint, which would run the checkpoint
        // inside the commit on the committing thread.
        writer.wal_hook(Some(wal_hook));
        let writing = Arc::new(Mutex::new(Writing::new(writer)));
        let writer_state = Arc::new(WriterState::default());
        let (lent, told) = (Arc::clone(&writing), Arc::clone(&writer_state));
        let writer_thread = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                BUSY_BUDGET.set(busy_timeout);
                CHECKPOINTS.set(Some(signal));
                writer_loop(&lent, write_rx, &told, &counted);
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
            statements,
            writing,
            inline_writes,
            writer_state,
            writer: Some(write_tx),
            writer_thread: Some(writer_thread),
            checkpoints,
            checkpoint_thread: Some(checkpoint_thread),
            readers: ReadPool::new(reader, open_reader, max_readers, busy_timeout),
        })
    }

    /// The statement counter of this database (see [`Statements`]).
    pub(crate) fn statements(&self) -> &Arc<Statements> {
        &self.statements
    }

    /// Runs `job` inside an immediate transaction and returns its result
    /// once the transaction committed. If `job` fails, its changes are
    /// rolled back and its error returned.
    ///
    /// When the writer thread sleeps (no write came for a while, see
    /// `writer::next_job`), nothing waits for it and the writing connection
    /// is free, the job runs right here, alone: that saves waking the
    /// writer thread and then the caller, two thread switches that cost far
    /// more than a small write on a lightly loaded server. It does so only
    /// if the file's write lock is free at once. A lock held by another
    /// process, or a writer that is awake (writes keep coming: they are
    /// committed in groups, one commit for many), sends the job to the
    /// writer thread.
    ///
    /// `job` must depend only on what it captured and on the database: it
    /// may be run a second time, in a fresh transaction, when another job of
    /// its group failed (see `writer::run_group`); only the last run counts.
    pub(crate) async fn write<R, F>(&self, job: F) -> Result<R, DbError>
    where
        F: FnMut(&Connection) -> Result<R, DbError> + Send + 'static,
        R: Send + 'static,
    {
        let job = match self.write_here(job) {
            Ok(answer) => return answer,
            Err(job) => job,
        };
        let (reply, answer) = reply::channel();
        let work: WriteJob = Box::new(Work::new(job, reply));
        let writer = self.writer.as_ref().ok_or(DbError::Stopped)?;
        let queued = &self.writer_state.queued;
        queued.fetch_add(1, Ordering::AcqRel);
        if writer.send(work).is_err() {
            queued.fetch_sub(1, Ordering::AcqRel);
            return Err(DbError::Stopped);
        }
        answer.await
    }

    /// Runs `job` on this thread if the writer is idle and the write lock
    /// free (see [`Database::write`]); else gives it back.
    fn write_here<R, F>(&self, job: F) -> Result<Result<R, DbError>, F>
    where
        F: FnMut(&Connection) -> Result<R, DbError>,
    {
        let state = &self.writer_state;
        if !self.inline_writes
            || !state.asleep.load(Ordering::Acquire)
            || state.queued.load(Ordering::Acquire) > 0
        {
            return Err(job);
        }
        let mut writing = match self.writing.try_lock() {
            Ok(writing) => writing,
            // A job that panicked was caught inside its transaction, which
            // was then rolled back: the connection is as it was.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(job),
        };
        asking(&self.checkpoints, || {
            try_inline(&mut writing, job, &self.statements)
        })
    }

    /// Runs `job` right here, on the calling thread, with a read connection
    /// from the pool (autocommit: each statement sees the latest committed
    /// state). In WAL mode a read never waits for a writer, so this takes
    /// as long as the query itself; see the crate docs.
    pub(crate) fn read<R>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, DbError>,
    ) -> Result<R, DbError> {
        self.readers.read(job)
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
    use std::thread::{self, ThreadId};

    use futures::executor::block_on;

    use super::*;
    use crate::{SqliteOptions, Synchronous};

    fn open(dir: &tempfile::TempDir, options: &SqliteOptions) -> Database {
        let db = crate::schema::open(&dir.path().join("db.sqlite"), options, "test").unwrap();
        block_on(db.write(|c| Ok(c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)")?)))
            .unwrap();
        wait_for_sleep(&db);
        db
    }

    /// Waits until the writer thread sleeps (right after a write it stays
    /// awake for a moment, expecting more) and the last write is no longer
    /// recent (see `writer::try_inline`).
    fn wait_for_sleep(db: &Database) {
        let start = Instant::now();
        while !db.writer_state.asleep.load(Ordering::Acquire) || db.writing.lock().unwrap().recent()
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the writer never slept"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Inserts `id` and says on which thread it ran.
    fn insert(id: i64) -> impl FnMut(&Connection) -> Result<ThreadId, DbError> + Send + 'static {
        move |c| {
            c.execute("INSERT INTO t (id) VALUES (?1)", [id])?;
            Ok(thread::current().id())
        }
    }

    fn ids(db: &Database) -> Vec<i64> {
        db.read(|c| {
            let mut stmt = c.prepare("SELECT id FROM t ORDER BY id")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
    }

    /// Whether the first write to a fresh database opened with `options`
    /// ran on the caller's thread (it is committed either way).
    fn first_write_runs_here(options: &SqliteOptions) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, options);
        let ran_on = block_on(db.write(insert(1))).unwrap();
        assert_eq!(ids(&db), [1]);
        ran_on == thread::current().id()
    }

    #[test]
    fn an_idle_writer_lets_the_caller_commit_on_its_own_thread() {
        assert!(first_write_runs_here(&SqliteOptions::default()));
    }

    #[test]
    fn a_write_lock_held_by_another_connection_sends_the_write_to_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let other = Connection::open(dir.path().join("db.sqlite")).unwrap();
        other
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO t (id) VALUES (1)")
            .unwrap();
        let holder = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            other.execute_batch("COMMIT").unwrap();
        });
        // Waits for the lock on the writer thread instead of failing here.
        let ran_on = block_on(db.write(insert(2))).unwrap();
        holder.join().unwrap();
        assert_ne!(ran_on, thread::current().id());
        assert_eq!(ids(&db), [1, 2]);
    }

    #[test]
    fn with_an_fsync_per_commit_every_write_goes_to_the_writer_thread() {
        let full = SqliteOptions::default().synchronous(Synchronous::Full);
        assert!(!first_write_runs_here(&full));
    }

    #[test]
    fn a_write_that_fails_or_panics_on_the_callers_thread_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let failed = block_on(db.write(|c| {
            c.execute("INSERT INTO t (id) VALUES (1)", [])?;
            Err::<(), _>(DbError::Corrupt("refused".into()))
        }));
        assert!(matches!(failed, Err(DbError::Corrupt(_))));
        wait_for_sleep(&db);
        let panicked = block_on(db.write(|c| -> Result<(), DbError> {
            c.execute("INSERT INTO t (id) VALUES (2)", [])?;
            panic!("a job that panics")
        }));
        assert!(matches!(panicked, Err(DbError::Panicked)));
        wait_for_sleep(&db);
        assert_eq!(
            block_on(db.write(insert(3))).unwrap(),
            thread::current().id()
        );
        assert_eq!(ids(&db), [3]);
    }
}
