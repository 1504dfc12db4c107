//! The connections of one database file and the threads that own some.
//!
//! A [`Database`] is one writing connection with its writer thread, one
//! checkpoint thread, and a pool of read-only connections. A write is a
//! closure committed in a group with the writes that come with it: on the
//! caller's own thread when the file's write lock is free at once (see
//! `groups`), else by the writer thread, which waits for the lock, so that
//! a write held up by another process never blocks the caller's executor.
//! When every commit waits for an fsync, every write goes to the writer
//! thread. The caller awaits its answer (`reply`: the answers of a group
//! are woken together). A read runs on the calling thread: with the
//! writing connection when nobody holds it, else with a connection checked
//! out of the pool. In WAL mode a read never waits for a lock held by a
//! writer (see the crate docs).
//!
//! A group (at most `writer::MAX_GROUP` jobs) runs in one `BEGIN IMMEDIATE`
//! transaction; a job that fails is rolled back alone and the others commit
//! (see `writer::run_group`). Answers are stored only after `COMMIT`
//! returned, so "the call returned" always means "the change is committed".
//!
//! The callers' groups are in `groups`, the writer thread's in `writer`,
//! the pool of read connections in `read_pool`, and the checkpoint thread
//! in `checkpoints`.

mod checkpoints;
mod groups;
mod read_pool;
mod reply;
mod writer;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use self::checkpoints::{CHECKPOINTS, Checkpoints, asking, checkpoint_loop, wal_hook};
use self::groups::{Forming, LEADER_GROUPS, YieldOnce};
use self::read_pool::{ReadPool, run_read};
use self::writer::{Work, WriteJob, try_group_here, writer_loop};

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
    /// The one connection that writes: held by whoever runs a group, a
    /// caller leading one or the writer thread.
    writing: Arc<Mutex<Connection>>,
    /// Reads that hold `writing`, or released it a moment ago (see
    /// [`Database::read`]).
    lent_to_reads: AtomicUsize,
    /// Whether callers may commit their groups themselves (not when every
    /// commit waits for an fsync, which would hold up the caller's executor).
    inline_writes: bool,
    /// The callers' group being formed (see `groups`).
    forming: Forming,
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
        let writing = Arc::new(Mutex::new(writer));
        let lent = Arc::clone(&writing);
        let writer_thread = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                BUSY_BUDGET.set(busy_timeout);
                CHECKPOINTS.set(Some(signal));
                writer_loop(&lent, write_rx, &counted);
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
            lent_to_reads: AtomicUsize::new(0),
            inline_writes,
            forming: Forming::default(),
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
    /// The job is committed in a group with the writes made meanwhile: the
    /// first caller of a group yields once, then commits the group on its
    /// own thread if the file's write lock is free at once; otherwise, or
    /// when every commit waits for an fsync, the writer thread commits it
    /// (see `groups`).
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
        if !self.inline_writes {
            self.send_to_writer(vec![work]);
        } else if self.forming.join(work) {
            let leader = Leader {
                db: self,
                ran: false,
            };
            YieldOnce::default().await;
            leader.lead();
        }
        answer.await
    }

    /// Commits the groups of a leading caller (see `groups`).
    fn lead(&self) {
        for _ in 0..LEADER_GROUPS {
            let Some(mut group) = self.forming.next_group() else {
                return;
            };
            // `None` while the writer thread runs a group.
            let committed = self
                .free_writing()
                .and_then(|conn| self.commit_here(&conn, &mut group));
            // The callers are woken once the connection is free again.
            match committed {
                Some(wakers) => wakers.wake_all(),
                None => self.send_to_writer(group),
            }
        }
        self.send_to_writer(self.forming.resign());
    }

    /// The writing connection unless the writer thread holds it. A read
    /// that borrowed it is waited for: it takes microseconds, where
    /// handing the group to the writer thread costs two thread switches.
    /// The wait yields the core, so a read whose thread was preempted on
    /// this core gets to finish.
    fn free_writing(&self) -> Option<MutexGuard<'_, Connection>> {
        loop {
            // Looked at before the lock: a read that lets go in between is
            // then still counted, and the lock is tried again.
            let reads = self.lent_to_reads.load(Ordering::Acquire);
            match self.writing.try_lock() {
                Ok(conn) => return Some(conn),
                // A job that panicked was caught inside its transaction,
                // which was then rolled back: the connection is as it was.
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if reads > 0 => std::thread::yield_now(),
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// Commits `group` on this thread if the write lock is free at once;
    /// the wakers of its callers, or `None` if it did not run.
    fn commit_here(
        &self,
        conn: &Connection,
        group: &mut Vec<WriteJob>,
    ) -> Option<Arc<reply::GroupWakers>> {
        asking(&self.checkpoints, || {
            try_group_here(conn, group, &self.statements)
        })
    }

    /// Hands `jobs` to the writer thread; a job it cannot take (the thread
    /// stopped) is dropped, which answers [`DbError::Stopped`].
    fn send_to_writer(&self, jobs: Vec<WriteJob>) {
        if let Some(writer) = &self.writer {
            for job in jobs {
                // A job refused comes back in the error and is dropped.
                let _ = writer.send(job);
            }
        }
    }

    /// Runs `job` right here, on the calling thread (autocommit: each
    /// statement sees the latest committed state). In WAL mode a read never
    /// waits for a writer, so this takes as long as the query itself; see
    /// the crate docs.
    ///
    /// The job runs with the writing connection when nobody holds it, else
    /// with a connection of the pool. The writing connection's pages stay
    /// valid across its own commits and are read through its memory map,
    /// where a pool connection drops its pages after every commit and reads
    /// them again with a system call each. `job` must only read: the
    /// writing connection is not `query_only`, so a transaction it left
    /// open is rolled back and reported as a failure.
    pub(crate) fn read<R>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, DbError>,
    ) -> Result<R, DbError> {
        let conn = match self.writing.try_lock() {
            Ok(conn) => conn,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return self.readers.read(job),
        };
        // Counted while the read holds the connection and until just after
        // it let go, so a leader that finds the connection taken by a read
        // waits for it. (One that comes in the instant between the lock
        // and the count hands its group to the writer thread: slower, and
        // as correct.)
        self.lent_to_reads.fetch_add(1, Ordering::AcqRel);
        let result = read_on(&conn, self.readers.busy_timeout(), job);
        drop(conn);
        self.lent_to_reads.fetch_sub(1, Ordering::AcqRel);
        result
    }
}

/// Runs the read `job` with `conn`, the writing connection; see
/// [`Database::read`].
fn read_on<R>(
    conn: &Connection,
    busy_timeout: Duration,
    job: impl FnOnce(&Connection) -> Result<R, DbError>,
) -> Result<R, DbError> {
    let result = run_read(conn, busy_timeout, job).unwrap_or(Err(DbError::Panicked));
    if conn.is_autocommit() {
        return result;
    }
    // A job that began a transaction must not leave the next write inside it.
    let _ = conn.execute_batch("ROLLBACK");
    Err(DbError::Sqlite(
        "a read left a transaction open; it was rolled back".into(),
    ))
}

/// The caller leading the group being formed.
struct Leader<'a> {
    db: &'a Database,
    /// Whether it ran its groups.
    ran: bool,
}

impl Leader<'_> {
    fn lead(mut self) {
        self.ran = true;
        self.db.lead();
    }
}

impl Drop for Leader<'_> {
    /// A leader dropped before it ran its group (its request was
    /// cancelled) hands the group to the writer thread, so that nobody
    /// waits for it; so does one whose `lead` unwound half-way.
    fn drop(&mut self) {
        if !self.ran || std::thread::panicking() {
            self.db.send_to_writer(self.db.forming.resign());
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
        db
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
    fn a_lone_write_commits_on_the_callers_thread() {
        assert!(first_write_runs_here(&SqliteOptions::default()));
    }

    #[test]
    fn writes_made_together_commit_together_on_the_callers_thread() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let before = db.statements().get();
        let threads = block_on(futures::future::join_all(
            (1..=10).map(|id| db.write(insert(id))),
        ));
        assert!(
            threads
                .into_iter()
                .all(|ran_on| ran_on.unwrap() == thread::current().id())
        );
        assert_eq!(ids(&db), (1..=10).collect::<Vec<_>>());
        // One BEGIN and one COMMIT for the ten (the jobs count nothing).
        assert_eq!(db.statements().get() - before, 2);
    }

    #[test]
    fn a_group_whose_leader_is_dropped_goes_to_the_writer_thread() {
        use std::future::Future;
        use std::task::Context;

        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut leader = Box::pin(db.write(insert(1)));
        assert!(leader.as_mut().poll(&mut cx).is_pending(), "it yields");
        let mut follower = Box::pin(db.write(insert(2)));
        assert!(follower.as_mut().poll(&mut cx).is_pending(), "it queues");
        drop(leader);
        // Both jobs were queued: the writer thread commits them.
        let ran_on = block_on(follower).unwrap();
        assert_ne!(ran_on, thread::current().id());
        assert_eq!(ids(&db), [1, 2]);
        // Nobody leads any more: the next write leads its own group.
        assert_eq!(
            block_on(db.write(insert(3))).unwrap(),
            thread::current().id()
        );
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

    /// Whether `read` ran on the writing connection (the pool's are
    /// `query_only`).
    fn read_on_writer(db: &Database) -> bool {
        !db.read(|c| Ok(c.query_row("PRAGMA query_only", [], |r| r.get::<_, bool>(0))?))
            .unwrap()
    }

    #[test]
    fn a_read_borrows_the_writing_connection_only_when_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        assert!(read_on_writer(&db));
        let held = db.writing.lock().unwrap();
        assert!(!read_on_writer(&db), "taken: a pool connection reads");
        drop(held);
        block_on(db.write(insert(1))).unwrap();
        assert!(read_on_writer(&db));
        assert_eq!(ids(&db), [1]);
    }

    #[test]
    fn a_read_that_fails_panics_or_leaves_a_transaction_open_leaves_the_writer_clean() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let opened = db.read(|c| Ok(c.execute_batch("BEGIN")?));
        assert!(matches!(opened, Err(DbError::Sqlite(m)) if m.contains("rolled back")));
        let panicked = db.read(|_| -> Result<(), DbError> { panic!("a read that panics") });
        assert!(matches!(panicked, Err(DbError::Panicked)));
        let failed = db.read(|c| Ok(c.execute_batch("SELECT * FROM no_such_table")?));
        assert!(matches!(failed, Err(DbError::Sqlite(_))));
        // Still the writing connection, outside any transaction: a write
        // commits on the caller's thread and is seen.
        assert!(read_on_writer(&db));
        assert_eq!(
            block_on(db.write(insert(1))).unwrap(),
            thread::current().id()
        );
        assert_eq!(ids(&db), [1]);
    }

    #[test]
    fn a_leader_waits_for_a_read_that_borrowed_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir, &SqliteOptions::default());
        let (started, reading) = std::sync::mpsc::channel();
        thread::scope(|scope| {
            scope.spawn(|| {
                db.read(|_| {
                    started.send(()).unwrap();
                    thread::sleep(Duration::from_millis(50));
                    Ok(())
                })
                .unwrap();
            });
            reading.recv().unwrap();
            // The read holds the writing connection: the write waits for it
            // and commits here, not on the writer thread.
            assert_eq!(
                block_on(db.write(insert(1))).unwrap(),
                thread::current().id()
            );
        });
        assert_eq!(ids(&db), [1]);
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
        let panicked = block_on(db.write(|c| -> Result<(), DbError> {
            c.execute("INSERT INTO t (id) VALUES (2)", [])?;
            panic!("a job that panics")
        }));
        assert!(matches!(panicked, Err(DbError::Panicked)));
        assert_eq!(
            block_on(db.write(insert(3))).unwrap(),
            thread::current().id()
        );
        assert_eq!(ids(&db), [3]);
    }
}
