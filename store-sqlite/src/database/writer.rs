//! The writer thread: every write of the file, committed in groups.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::reply::{GroupWakers, Reply};
use super::{BUSY_BUDGET, DbError, Statements};

/// Most write jobs committed together in one transaction.
pub(super) const MAX_GROUP: usize = 64;
/// How long an idle writer keeps polling for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(30);
/// A group that follows one of at least this many jobs waits for more
/// (see [`linger`]).
const LINGER_AFTER: usize = 8;
/// Lingering ends once no job came for this long...
const LINGER_GAP: Duration = Duration::from_micros(40);
/// ... or after this long in all.
const LINGER_MAX: Duration = Duration::from_micros(400);

/// One write job as the writer thread sees it.
pub(super) trait WriteWork: Send {
    /// Runs the job inside the open transaction. Returns `true` on success.
    /// A job may run more than once (see [`run_group`]): only the result of
    /// its last run counts.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Stores the answer once the transaction is settled (`settled` is the
    /// error of `BEGIN`/`COMMIT` if the transaction did not commit); the
    /// caller is woken through `wakers` (see [`super::reply`]).
    fn settle(self: Box<Self>, settled: &Result<(), DbError>, wakers: &Arc<GroupWakers>);
}

pub(super) struct Work<F, R> {
    job: F,
    result: Option<Result<R, DbError>>,
    reply: Reply<R>,
}

impl<F, R> Work<F, R> {
    /// `job`, whose result goes to `reply` once its group committed.
    pub(super) fn new(job: F, reply: Reply<R>) -> Self {
        Self {
            job,
            result: None,
            reply,
        }
    }
}

impl<F, R> WriteWork for Work<F, R>
where
    F: FnMut(&Connection) -> Result<R, DbError> + Send,
    R: Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let result = run_caught(&mut self.job, conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn settle(self: Box<Self>, settled: &Result<(), DbError>, wakers: &Arc<GroupWakers>) {
        let Self { job, result, reply } = *self;
        // What the job captured goes before any caller is woken.
        drop(job);
        let answer = match (settled, result) {
            (_, Some(Err(e))) => Err(e),
            (Err(e), _) => Err(e.clone()),
            (Ok(()), Some(Ok(r))) => Ok(r),
            (Ok(()), None) => Err(DbError::Stopped),
        };
        reply.store(answer, wakers);
    }
}

pub(super) type WriteJob = Box<dyn WriteWork>;

/// Runs `job` once; a panic inside it is [`DbError::Panicked`] (the caller
/// then rolls its transaction back).
fn run_caught<R>(
    job: &mut impl FnMut(&Connection) -> Result<R, DbError>,
    conn: &Connection,
) -> Result<R, DbError> {
    catch_unwind(AssertUnwindSafe(|| job(conn))).unwrap_or(Err(DbError::Panicked))
}

/// The writer thread's loop: takes the jobs sent to it in groups and runs
/// each group with the writing connection (locked for the group; between
/// groups the callers commit theirs with it, see `super::groups`).
pub(super) fn writer_loop(
    writing: &Mutex<Connection>,
    jobs: Receiver<WriteJob>,
    statements: &Statements,
) {
    let mut group: Vec<WriteJob> = Vec::with_capacity(MAX_GROUP);
    let mut previous = 0;
    while let Some(first) = next_job(&jobs) {
        group.push(first);
        take_waiting(&jobs, &mut group);
        if previous >= LINGER_AFTER {
            linger(&jobs, &mut group);
        }
        previous = group.len();
        let wakers = {
            let conn = writing.lock().unwrap_or_else(PoisonError::into_inner);
            run_group(&conn, &mut group, statements)
        };
        // Woken once the connection is free again: a caller that writes
        // at once then leads its own group instead of finding it taken.
        wakers.wake_all();
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
///
/// Every transaction-control statement is counted in `statements` (the
/// jobs count their own).
///
/// Returns the wakers of the group's callers, every answer stored, for
/// the caller to wake once it let go of the connection.
fn run_group(
    conn: &Connection,
    group: &mut Vec<WriteJob>,
    statements: &Statements,
) -> Arc<GroupWakers> {
    let begun = Control { conn, statements }.begin();
    settle_group(conn, group, statements, begun)
}

/// Runs `group` as [`run_group`] does, on the calling thread, if its `BEGIN
/// IMMEDIATE` gets the file's write lock at once; `None`, with nothing run
/// or answered, if it does not (another process, or the checkpoint thread,
/// holds the lock).
pub(super) fn try_group_here(
    conn: &Connection,
    group: &mut Vec<WriteJob>,
    statements: &Statements,
) -> Option<Arc<GroupWakers>> {
    let patience = BUSY_BUDGET.replace(Duration::ZERO);
    let begun = Control { conn, statements }.begin();
    BUSY_BUDGET.set(patience);
    begun.ok()?;
    Some(settle_group(conn, group, statements, Ok(())))
}

/// The rest of [`run_group`] once `BEGIN` ran (`begun` is its result).
fn settle_group(
    conn: &Connection,
    group: &mut Vec<WriteJob>,
    statements: &Statements,
    begun: Result<(), DbError>,
) -> Arc<GroupWakers> {
    let tx = Control { conn, statements };
    let settled = match begun {
        Err(e) => Err(e),
        Ok(()) if group.iter_mut().all(|job| job.run(conn)) => tx.commit(),
        Ok(()) if group.len() == 1 => {
            // Its failure rolls back the transaction: nothing to retry.
            tx.rollback();
            Ok(())
        }
        Ok(()) => {
            tx.rollback();
            tx.begin()
                .and_then(|()| tx.run_in_savepoints(group))
                .and_then(|()| tx.commit())
        }
    };
    if settled.is_err() {
        tx.rollback();
    }
    // Every answer is stored before the first caller is woken (see
    // `super::reply`).
    let wakers = Arc::new(GroupWakers::with_capacity(group.len()));
    for job in group.drain(..) {
        job.settle(&settled, &wakers);
    }
    wakers
}

/// The writer's transaction-control statements, counted.
struct Control<'a> {
    conn: &'a Connection,
    statements: &'a Statements,
}

impl Control<'_> {
    fn begin(&self) -> Result<(), DbError> {
        self.exec("BEGIN IMMEDIATE").map_err(DbError::from)
    }

    /// Runs each job of `group` in its own savepoint inside the open transaction.
    fn run_in_savepoints(&self, group: &mut [WriteJob]) -> Result<(), DbError> {
        for job in group.iter_mut() {
            self.exec("SAVEPOINT job")?;
            if job.run(self.conn) {
                self.exec("RELEASE job")?;
            } else {
                self.exec("ROLLBACK TO job")?;
                self.exec("RELEASE job")?;
            }
        }
        Ok(())
    }

    fn commit(&self) -> Result<(), DbError> {
        self.exec("COMMIT").map_err(DbError::from)
    }

    /// Runs one transaction-control statement through the statement cache.
    fn exec(&self, sql: &str) -> rusqlite::Result<()> {
        self.statements.add(1);
        self.conn.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    fn rollback(&self) {
        if !self.conn.is_autocommit() {
            // If even ROLLBACK fails SQLite has already rolled back (or the
            // connection is unusable and the next BEGIN reports it).
            let _ = self.exec("ROLLBACK");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::super::reply::{Answer, channel};
    use super::*;

    fn job<F>(f: F) -> (WriteJob, Answer<()>)
    where
        F: FnMut(&Connection) -> Result<(), DbError> + Send + 'static,
    {
        let (reply, answer) = channel();
        let work: WriteJob = Box::new(Work::new(f, reply));
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
        run_group(&conn, &mut group, &Statements::default());
        assert!(group.is_empty());
        assert!(conn.is_autocommit(), "the transaction is settled");
        assert_eq!(ids(&conn), [1, 3]);
        let answer = futures::executor::block_on;
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
        run_group(&conn, &mut group, &Statements::default());
        assert_eq!(ids(&conn), [1, 2, 3]);
        for answer in answers {
            assert!(futures::executor::block_on(answer).is_ok());
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
        run_group(&conn, &mut group, &Statements::default());
        assert!(conn.is_autocommit());
        assert_eq!(ids(&conn), [1]);
        assert!(futures::executor::block_on(answer).is_err());
    }
}
