//! The read connections, checked out by the calling thread for one read.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::Connection;

use super::{BUSY_BUDGET, DbError, OpenReader};

/// Read connections, checked out by the calling thread for one read.
///
/// Idle connections wait in a stack (the most recently used one is handed
/// out first: its statement cache and pages are warm). When every connection
/// is checked out another one is opened, up to `max`; beyond that a caller
/// waits for one to come back, which takes microseconds since a read never
/// waits for a writer.
pub(super) struct ReadPool {
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
    /// A pool that starts with `first` and opens more with `open`, up to
    /// `max`; its reads wait at most `busy_timeout` for a lock.
    pub(super) fn new(
        first: Connection,
        open: OpenReader,
        max: usize,
        busy_timeout: Duration,
    ) -> Self {
        Self {
            idle: Mutex::new(Idle {
                connections: vec![first],
                count: 1,
                waiting: 0,
            }),
            returned: Condvar::new(),
            open,
            max: max.max(1),
            busy_timeout,
        }
    }

    /// How long a read waits for a lock.
    pub(super) fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// Runs `job` on the calling thread with a connection checked out of
    /// the pool; a job that panics has its connection discarded.
    pub(super) fn read<R>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, DbError>,
    ) -> Result<R, DbError> {
        let conn = self.checkout()?;
        match run_read(&conn, self.busy_timeout, job) {
            Some(result) => {
                self.give_back(conn);
                result
            }
            None => {
                self.discard(conn);
                Err(DbError::Panicked)
            }
        }
    }

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

/// Runs the read `job` with `conn` on the calling thread, its busy handler
/// given `busy_timeout`; `None` if the job panicked.
pub(super) fn run_read<R>(
    conn: &Connection,
    busy_timeout: Duration,
    job: impl FnOnce(&Connection) -> Result<R, DbError>,
) -> Option<Result<R, DbError>> {
    // The busy handler runs on this thread: give it this database's
    // budget (the thread may be shared with other databases).
    BUSY_BUDGET.set(busy_timeout);
    catch_unwind(AssertUnwindSafe(|| job(conn))).ok()
}
