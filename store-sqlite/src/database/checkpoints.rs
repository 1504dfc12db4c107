//! The checkpoint thread: keeps the WAL small without stalling the writer.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::Connection;

use super::BUSY_BUDGET;

/// WAL size (in pages) from which a checkpoint is requested: twice
/// SQLite's own autocheckpoint threshold (about 8 MB). Every checkpoint
/// syncs the WAL and the database file and copies the pages written again
/// since the last one (indexes, interior pages, the page being filled) once
/// more; at 1000 pages the checkpoint thread took 3.0-3.3 µs per lifecycle
/// with 64 in flight, at 2000 pages 2.6-2.8.
const CHECKPOINT_PAGES: i32 = 2000;

/// Longest wait of the checkpoint thread for a lock.
const CHECKPOINT_BUSY: Duration = Duration::from_millis(50);

/// Requests from the writer to the checkpoint thread.
#[derive(Default)]
pub(super) struct Checkpoints {
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

    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
    }
}

thread_local! {
    /// The checkpoint thread of the writer running on this thread.
    pub(super) static CHECKPOINTS: RefCell<Option<Arc<Checkpoints>>> = const { RefCell::new(None) };
}

/// Runs `commit` on this thread with `checkpoints` as the thread that
/// [`wal_hook`] asks (a caller that borrows the writing connection commits
/// on its own thread, see `super::groups`).
pub(super) fn asking<T>(checkpoints: &Arc<Checkpoints>, commit: impl FnOnce() -> T) -> T {
    let before = CHECKPOINTS.replace(Some(Arc::clone(checkpoints)));
    let done = commit();
    CHECKPOINTS.set(before);
    done
}

/// Called by SQLite on the writing thread after each commit with the number
/// of pages in the WAL: past [`CHECKPOINT_PAGES`] it asks the checkpoint
/// thread for a checkpoint instead of running one inside the commit.
///
/// Past [`WRITER_CHECKPOINT_PAGES`] the checkpoint thread has fallen behind
/// (a loaded machine did not schedule it): the writer then copies the WAL
/// itself with a passive checkpoint, before it takes the next job. Writes
/// slow down instead of the WAL growing without bound.
pub(super) fn wal_hook(wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    if pages >= CHECKPOINT_PAGES {
        CHECKPOINTS.with_borrow(|c| {
            if let Some(c) = c {
                c.request();
            }
        });
    }
    if pages >= WRITER_CHECKPOINT_PAGES {
        // The checkpoint thread may hold the checkpoint lock while it is not
        // scheduled; then the writer's checkpoint is refused at once. The
        // writer waits for it a little, a pause at a time, so that the
        // thread gets the CPU and the WAL does not grow meanwhile. Any
        // other failure (e.g. another process checkpoints) leaves it to the
        // checkpoint thread, as before.
        for _ in 0..WRITER_CHECKPOINT_TRIES {
            match wal.checkpoint_v2(rusqlite::hooks::CheckpointMode::PASSIVE) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy =>
                {
                    std::thread::sleep(WRITER_CHECKPOINT_PAUSE);
                }
                _ => break,
            }
        }
    }
    Ok(())
}

/// WAL size (in pages) at which the writer stops leaving the checkpoint to
/// the checkpoint thread: twice [`CHECKPOINT_PAGES`] (about 16 MB).
const WRITER_CHECKPOINT_PAGES: i32 = 4000;

/// How often the writer tries its own checkpoint while the checkpoint
/// thread holds the lock, and the pause in between (at most 100 ms of
/// writer stall per commit, only once the WAL is past
/// [`WRITER_CHECKPOINT_PAGES`]).
const WRITER_CHECKPOINT_TRIES: usize = 50;
const WRITER_CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

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
pub(super) fn checkpoint_loop(conn: &Connection, checkpoints: &Checkpoints) {
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
