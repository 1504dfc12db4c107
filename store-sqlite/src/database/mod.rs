//! The connections of one database file and the threads that own some.
//!
//! A [`Database`] is one writer thread (the only connection that writes),
//! one checkpoint thread, and a pool of read-only connections. A write is a
//! closure sent through a channel to the writer; the caller awaits its
//! answer (`reply`: the answers of a group are woken together), so a write, which may wait for another
//! process's lock, never blocks the caller's executor. A read runs on the
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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use self::checkpoints::{CHECKPOINTS, Checkpoints, checkpoint_loop, wal_hook};
use self::read_pool::ReadPool;
use self::writer::{Work, WriteJob, writer_loop};

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
        let statements = Arc::new(Statements::default());
        let counted = Arc::clone(&statements);
        let writer_thread = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                BUSY_BUDGET.set(busy_timeout);
                CHECKPOINTS.set(Some(signal));
                // Replaces SQLite's autocheckpoint, which would run the
                // checkpoint inside the commit on this thread.
                writer.wal_hook(Some(wal_hook));
                writer_loop(writer, write_rx, &counted);
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

    /// Runs `job` on the writer thread inside an immediate transaction and
    /// returns its result once the transaction committed. If `job` fails,
    /// its changes are rolled back and its error returned.
    ///
    /// `job` must depend only on what it captured and on the database: it
    /// may be run a second time, in a fresh transaction, when another job of
    /// its group failed (see `writer::run_group`); only the last run counts.
    pub(crate) async fn write<R, F>(&self, job: F) -> Result<R, DbError>
    where
        F: FnMut(&Connection) -> Result<R, DbError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = reply::channel();
        let work: WriteJob = Box::new(Work::new(job, reply));
        self.writer
            .as_ref()
            .ok_or(DbError::Stopped)?
            .send(work)
            .map_err(|_| DbError::Stopped)?;
        answer.await
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
