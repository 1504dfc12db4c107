//! # graph-relay-store-sqlite
//!
//! The durable, embedded [`Store`](graph_relay_core::store::Store) of graph-relay's
//! queue ([`SqliteStore`]) and the relay's durable outbox ([`SqliteOutbox`]),
//! on SQLite (bundled: no system library needed). In the picture of the
//! workspace it is one of the thin crates around the no-IO core: it decides
//! nothing, it persists what the core's `Queue` decided and enforces it
//! atomically. It passes the core's conformance suite unchanged.
//!
//! ```text
//!  Queue (core) ──async──► SqliteStore ──reads, on the caller's thread──► pooled read connections ─┐
//!                                     └─writes, grouped, on a caller's thread ────────────────────┼─► one .sqlite file (WAL)
//!                                         └─lock busy──► writer thread (waits for the lock) ──────┤
//!                                                            └─WAL full──► checkpoint thread ──────┘
//! ```
//!
//! # Design
//!
//! - **Runtime-agnostic, never blocking the caller on a lock.** There is no
//!   tokio dependency; any executor (or `futures::executor::block_on`)
//!   works.
//!   - *Writes* are committed in groups with the one read-write
//!     connection, on the thread of the caller that leads the group. The
//!     first caller to write while no group is forming leads the next one:
//!     it queues its job, yields to its executor once, then commits
//!     everything queued meanwhile in one transaction. The others queue
//!     their job and await its answer (the answers of a group are stored
//!     first and their callers woken together). The yield is what makes
//!     the groups: an executor polls its other ready tasks first, so the
//!     writes of requests served together share a commit, and a lone write
//!     waits for one poll. No thread hand-off is paid: with 64 lifecycles
//!     in flight a lifecycle cost 33–35 µs of CPU, against 50–55 µs when a
//!     writer thread committed every group.
//!
//!     A write never waits for a lock on the caller's thread. If the
//!     file's write lock is not free at once (another process writes, or
//!     the checkpoint thread finishes a checkpoint), the group goes to the
//!     database's **writer thread**, which waits for the lock (up to
//!     [`SqliteOptions::busy_timeout`]); that wait must never block the
//!     caller's executor. The writer thread also commits what other
//!     threads queued while a leader already committed four groups (so a
//!     leader's own request is not held up by a stream of others), the
//!     group of a leader whose future was dropped before it committed, and
//!     every write with [`Synchronous::Full`], whose commit waits for an
//!     fsync.
//!   - *Reads* run **on the calling thread**, with a connection checked out
//!     of a small pool of read-only connections (a mutex-guarded stack;
//!     another connection is opened when all are in use, up to
//!     [`SqliteOptions::readers`], 4 by default; beyond that a caller waits
//!     for one to come back, which takes microseconds). In WAL mode a read
//!     never waits for a writer: it reads the last committed snapshot from
//!     the database file and the WAL, whatever the writers (of this or
//!     another process) are doing. A read therefore costs what its query
//!     costs, a few microseconds, no more than taking a contended mutex:
//!     hopping to a thread and back cost 40–70 µs per call on a loaded
//!     machine, far more than the query. The one wait a read can meet is
//!     `SQLITE_BUSY` while another connection recovers the WAL after a
//!     crash (or a brief WAL restart race); the busy handler below retries
//!     it, bounded by `busy_timeout`. Like any file read, a read of pages
//!     the OS does not have cached touches the disk.
//! - **Group commit.** A group (up to 64 jobs) runs in one `BEGIN
//!   IMMEDIATE` transaction. The writer thread takes every job waiting
//!   when it wakes up; while many callers write at once (its last group
//!   held 8 jobs or more) it first lingers for more, as long as they keep
//!   coming (a gap of 40 µs, 400 µs at most): fewer, larger commits write
//!   fewer pages and make the read connections drop their caches less
//!   often. A job
//!   that fails is rolled back alone: the group then runs again in a new
//!   transaction with a savepoint per job (not on the first run: a savepoint
//!   copies every page its job touches, a fifth of the writer's work, and
//!   jobs practically never fail). Answers are sent only after `COMMIT`
//!   returned, so a returned write is committed. Concurrent callers
//!   therefore share the cost of a commit.
//! - **No read-then-write upgrade.** Every write runs in a `BEGIN IMMEDIATE`
//!   transaction, which takes SQLite's write lock before reading anything,
//!   so it can never fail with `SQLITE_BUSY` half-way because another
//!   process wrote in between. Each transition is one conditional statement
//!   (`UPDATE … WHERE id = ? AND revision = ?`); `insert_command` writes
//!   the command together with its idempotency key in one statement, which
//!   a unique index over the keys that rows hold turns into a no-op when
//!   the key is taken, so two processes racing with one key insert exactly
//!   one command.
//! - **Shared by processes.** Several processes (and several `SqliteStore`s)
//!   may open one file. A lock held by another connection is waited for with
//!   a short-interval busy handler (50 µs to 1 ms between attempts, so two
//!   busy writers take turns) for up to [`SqliteOptions::busy_timeout`]
//!   (5 s by default); only then does the caller see an error.
//! - **Durability.** The journal is WAL. With the default
//!   `synchronous = NORMAL` a committed write survives a crash or `SIGKILL`
//!   of the process (it is in the WAL file); the last commits before a
//!   *power loss or OS crash* may be lost. Choose [`Synchronous::Full`] to
//!   fsync the WAL on every commit. [`SqliteOutbox::open`] uses `FULL` by
//!   default: an outbox item is the relay's only copy of a result.
//! - **Schema.** Command fields that are queried are real columns (`id`,
//!   `agent`, `owner`, `project`, `device`, `idempotency_key`, `status`,
//!   `created_at`, `finished_at`, `revision`) with indexes for every
//!   look-up: a partial index over open (queued or running) commands only,
//!   keyed by device, owner and project (so a sync does not slow down as
//!   finished commands pile up; ties in `created_at` keep the insertion
//!   order through the rowid), a partial index of running commands by
//!   lease for the lease sweep, the primary key for `get_graph_run`, a
//!   partial index on `finished_at` for pruning. A start, a progress
//!   report or a lease renewal assigns no column the open index reads, so
//!   SQLite leaves it alone; only the step to a terminal state moves the
//!   command from the open index to the finished one. The columns hold
//!   the record's head (`RecordHead`); the rest of it, its body, is stored
//!   as JSON in the `record` column without the head and without the
//!   fields at their default, so a row is about half the size of the
//!   whole record's JSON (rows written by builds before schema 6 hold the
//!   whole record and read the same). A field the core adds with
//!   `#[serde(default)]` needs no migration. A command's row also holds
//!   its idempotency key's fingerprint and expiry (`key_fingerprint`,
//!   `key_expires_at`), NULL once the key is released: pruned after it
//!   expired, or taken over by a new command with the same key. Keys made
//!   of several columns lead with the one that tells rows apart (an
//!   idempotency key, a device), not with the owner that every row of a
//!   one-owner server shares: SQLite compares entries column by column and
//!   takes its fast path only when the first column decides. An update
//!   writes only what a transition can change (status, `finished_at`,
//!   revision, record, lease), and never reopens a finished command.
//!   Migrations are tracked in `PRAGMA user_version`; the file is marked
//!   with `PRAGMA application_id` = [`APPLICATION_ID`].
//! - **Decoding once.** Decoding the JSON costs more than the query. A store
//!   remembers the records it wrote or decoded last (a few thousand, a few
//!   MB) together with their exact body JSON; a read still queries the
//!   file, and takes the remembered record only when the stored body is
//!   byte for byte the same and so are the columns a transition writes
//!   (status, revision, `finished_at`, lease), so a change made by another
//!   store or process is always seen.
//!   Session metadata is remembered the same way.
//! - **Encoding before queueing.** A write's record is encoded to JSON by
//!   its caller before the job is queued, so a record that cannot be
//!   encoded fails before anything reaches the database.
//!   [`SqliteStore::statements_executed`] counts the SQL statements a store
//!   executed (13 for a lifecycle run alone, about 7 with 64 in flight,
//!   whose writes share `BEGIN` and `COMMIT`).
//! - **Reads borrow the writing connection when it is free.** Its pages
//!   stay valid across its own commits and it reads them through a memory
//!   map of up to 1 GiB, so a read on a quiet store touches no system call
//!   for its pages. While a write holds that connection, a read takes one
//!   of the pool's read connections instead; a write that finds it lent to
//!   a read waits the microseconds the read takes.
//! - **Read connections do not map the file.** After any commit SQLite
//!   drops a read connection's pages at its next read; with a memory map it
//!   also unmaps the whole file, and every unmap interrupts the other cores
//!   running this process to flush their TLBs (a fifth of the time of a
//!   lifecycle loop on a 2-core VM went there). Read connections therefore
//!   read pages with `pread` into a page cache of 16 MiB each, which also
//!   keeps hot pages of a large file decoded between writes. The writer and
//!   the checkpointer, whose pages stay valid across their own commits, map
//!   up to 1 GiB.
//! - **Waking the writer thread.** When it has committed a group, the
//!   writer thread polls its queue for 30 µs before it sleeps, so a stream
//!   of writes sent to it (while another process holds the lock, or with
//!   [`Synchronous::Full`]) does not pay for waking it every time.
//! - **Checkpoints off the commit path.** SQLite's autocheckpoint would copy
//!   the WAL back into the database file (and fsync both) inside the commit
//!   that crossed 1000 WAL pages, while every caller of that group and the
//!   next waits: milliseconds, a fifth of the writer's time under load.
//!   Instead the writing connection's WAL hook wakes a **checkpoint thread** with its
//!   own connection, once the WAL holds 2000 pages (twice SQLite's
//!   threshold: half the syncs and fewer pages copied twice). It first runs `PRAGMA wal_checkpoint(PASSIVE)`, which
//!   takes no lock that writers or readers wait for and copies the bulk of
//!   the WAL, fsyncs included, while the writer goes on committing, and
//!   repeats it (up to 4 rounds) while a round still copied 64 frames or
//!   more; then a `FULL` checkpoint, which holds the write lock only long
//!   enough to copy the few frames committed meanwhile and sync (about 1 ms
//!   under load, against 2-6 ms after a single passive round; it waits at
//!   most 50 ms for locks, else it is retried after the next commit). The writer starts the WAL
//!   over at its next transaction, so the WAL stays below about 10 MB, twice
//!   what SQLite's own autocheckpoint allows (a test checks it stays under 20 MB over
//!   5000 commits).
//! - **Refusing foreign files.** Opening a file that is not SQLite, a SQLite
//!   database of another application, or one written by a newer schema
//!   fails with an [`OpenError`] and leaves the file untouched: it is
//!   inspected with plain reads and a read-only connection before anything
//!   is written.
//! - **Retention.** [`Store::prune`](graph_relay_core::store::Store::prune) deletes
//!   releases at most `batch` expired keys and deletes at most `batch`
//!   terminal commands per call, in one short transaction, and never a
//!   command whose idempotency key is still live.
//! - **The outbox** is the table `outbox` of the same schema, with the
//!   relay's synced projects (`relay_projects`) and the Graph processes its
//!   worker started ([`GraphProcess`], `relay_processes`). A relay
//!   normally opens its own file with [`SqliteOutbox::open`]; a process that
//!   runs both halves may point both at one file.
//!
//! # Example
//! ```
//! # futures::executor::block_on(async {
//! use std::sync::Arc;
//! use graph_relay_core::prelude::*;
//! use graph_relay_store_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("queue.sqlite"))?;
//! let queue = Queue::new(Arc::new(store), Arc::new(SystemClock), Arc::new(RandomIds), QueueConfig::default());
//! let agent = Agent::new(AgentId::parse("assistant")?, OwnerId::parse("alice")?, [ProjectId::parse("research")?]);
//! let list = queue.list_graph_sessions(&agent, &ProjectId::parse("research")?, 50).await?;
//! assert!(list.sessions.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::path::PathBuf;
use std::time::Duration;

mod cache;
mod database;
mod graph_processes;
mod outbox;
mod schema;
mod shares;
pub mod stats;
mod store;

pub use crate::graph_processes::GraphProcess;
pub use crate::outbox::SqliteOutbox;
pub use crate::schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use crate::store::SqliteStore;

/// How hard SQLite pushes a commit to the disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Fsync only at checkpoints. A committed write survives a crash of the
    /// process; the last commits may be lost on power loss. The default for
    /// [`SqliteStore`].
    #[default]
    Normal,
    /// Fsync the WAL at every commit: committed writes survive power loss too.
    /// Slower per commit; the default for [`SqliteOutbox`].
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// How a database file is opened. `SqliteOptions::default()` is what
/// [`SqliteStore::open`] uses.
///
/// ```
/// use std::time::Duration;
/// use graph_relay_store_sqlite::{SqliteOptions, Synchronous};
/// let options = SqliteOptions::default()
///     .synchronous(Synchronous::Full)
///     .busy_timeout(Duration::from_secs(10))
///     .readers(4);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    synchronous: Synchronous,
    busy_timeout: Duration,
    readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            readers: 4,
        }
    }
}

impl SqliteOptions {
    /// `PRAGMA synchronous` of the writer ([`Synchronous::Normal`] by default).
    #[must_use]
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// How long a connection waits for a lock held by another connection or
    /// process before the call fails (5 s by default).
    #[must_use]
    pub fn busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }

    /// Most read connections open at once (4 by default; at least 1).
    /// Reads run on the calling thread with a pooled connection; one is
    /// opened at start-up, more when concurrent reads need them.
    #[must_use]
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }
}

/// Why a database file could not be opened. In every case except
/// [`OpenError::Sqlite`] and [`OpenError::Thread`] the file was not modified.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The file is not a SQLite database.
    #[error("{} is not a SQLite database; refusing to touch it", path.display())]
    NotSqlite {
        /// The file.
        path: PathBuf,
    },
    /// The file is the SQLite database of another application (its
    /// `application_id` is not graph-relay's).
    #[error(
        "{} belongs to another application (SQLite application_id {application_id:#010x}; graph-relay uses {:#010x}); refusing to touch it",
        path.display(),
        APPLICATION_ID
    )]
    ForeignApplication {
        /// The file.
        path: PathBuf,
        /// The `application_id` found in it.
        application_id: i32,
    },
    /// The file is a non-empty SQLite database without an application id:
    /// someone else's data.
    #[error(
        "{} is a SQLite database that graph-relay did not create (it holds {objects:?}); refusing to touch it",
        path.display()
    )]
    UnknownContent {
        /// The file.
        path: PathBuf,
        /// The tables and indexes found in it.
        objects: Vec<String>,
    },
    /// The file was written by a newer graph-relay with a schema this build
    /// does not know.
    #[error(
        "{} has schema version {found}, newer than the {supported} this build of graph-relay supports; upgrade graph-relay",
        path.display()
    )]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its `user_version`.
        found: i32,
        /// The newest version this build supports ([`SCHEMA_VERSION`]).
        supported: i32,
    },
    /// The file system does not support WAL (e.g. no shared memory).
    #[error("{} cannot use the WAL journal (SQLite kept `{journal_mode}`)", path.display())]
    NoWal {
        /// The file.
        path: PathBuf,
        /// The journal mode SQLite reported.
        journal_mode: String,
    },
    /// SQLite failed while opening or migrating the file.
    #[error("SQLite failed while opening {}: {source}", path.display())]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The writer or checkpoint thread could not be started.
    #[error("cannot start the SQLite worker threads: {0}")]
    Thread(std::io::Error),
}
