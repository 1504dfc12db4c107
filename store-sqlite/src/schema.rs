//! Opening a database file: the checks that refuse foreign files, the
//! connection settings, and the schema migrations.
//!
//! Nothing is written to a file before it is known to be empty, missing or
//! ours: the checks read the header with plain file IO and then look inside
//! through a read-only connection. Only then is the read-write connection
//! opened, the journal switched to WAL and the migrations applied, in one
//! `BEGIN IMMEDIATE` transaction that repeats the checks (another process
//! may be opening the same file at the same moment).
//!
//! A file that does not exist yet is built beside its final name and linked
//! into place only when complete (see [`create_new`]): switching a fresh file
//! to WAL goes through a rollback journal, and a crash in that moment would
//! otherwise leave a hot journal that the read-only checks cannot recover,
//! so the next open would fail.

use std::io::Read;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::database::{Connections, Database, busy_handler, set_busy_budget};
use crate::{OpenError, SqliteOptions, Synchronous};

/// `PRAGMA application_id` of every graph-relay database: "GRly".
pub const APPLICATION_ID: i32 = 0x4752_6c79;

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i32 = 7;

/// Migration `n` (1-based) takes the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    // 1: commands, idempotency keys, shared sessions, devices, relay outbox.
    r"
    CREATE TABLE commands (
        id          TEXT    NOT NULL PRIMARY KEY,
        agent       TEXT    NOT NULL,
        owner       TEXT    NOT NULL,
        project     TEXT    NOT NULL,
        device      TEXT    NOT NULL,
        idempotency_key TEXT NOT NULL,
        status      TEXT    NOT NULL,
        created_at  INTEGER NOT NULL,
        finished_at INTEGER,
        revision    INTEGER NOT NULL,
        record      TEXT    NOT NULL
    );
    -- Entries end with the rowid, i.e. the insertion order: a sync reads
    -- queued commands oldest first, ties in the order they were queued.
    CREATE INDEX commands_queued ON commands (owner, project, device, created_at)
        WHERE status = 'queued';
    CREATE INDEX commands_finished ON commands (finished_at)
        WHERE finished_at IS NOT NULL;

    CREATE TABLE idempotency_keys (
        agent       TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        command     TEXT    NOT NULL,
        fingerprint TEXT    NOT NULL,
        expires_at  INTEGER NOT NULL,
        PRIMARY KEY (agent, key)
    ) WITHOUT ROWID;
    CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

    CREATE TABLE shared_sessions (
        owner            TEXT    NOT NULL,
        project          TEXT    NOT NULL,
        graph_session_id TEXT    NOT NULL,
        device           TEXT    NOT NULL,
        synced_at        INTEGER NOT NULL,
        meta             TEXT    NOT NULL,
        PRIMARY KEY (owner, project, graph_session_id, device)
    ) WITHOUT ROWID;
    CREATE INDEX shared_sessions_device ON shared_sessions (owner, project, device);

    CREATE TABLE devices (
        owner        TEXT    NOT NULL,
        device       TEXT    NOT NULL,
        last_sync_at INTEGER,
        last_seen_at INTEGER NOT NULL,
        long_poll    INTEGER NOT NULL,
        PRIMARY KEY (owner, device)
    ) WITHOUT ROWID;

    CREATE TABLE outbox (
        command   TEXT    NOT NULL PRIMARY KEY,
        stored_at INTEGER NOT NULL,
        attempts  INTEGER NOT NULL,
        report    TEXT    NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX outbox_order ON outbox (stored_at, command);
    ",
    // 2: identity is (owner, name). Idempotency keys are scoped per (owner,
    // agent): each existing key takes the owner of the command it points
    // at (a key whose command is gone is dropped; it cannot be replayed).
    // An index finds the projects a device shares into.
    r"
    CREATE TABLE idempotency_keys_v2 (
        owner       TEXT    NOT NULL,
        agent       TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        command     TEXT    NOT NULL,
        fingerprint TEXT    NOT NULL,
        expires_at  INTEGER NOT NULL,
        PRIMARY KEY (owner, agent, key)
    ) WITHOUT ROWID;
    INSERT INTO idempotency_keys_v2 (owner, agent, key, command, fingerprint, expires_at)
        SELECT c.owner, k.agent, k.key, k.command, k.fingerprint, k.expires_at
        FROM idempotency_keys AS k JOIN commands AS c ON c.id = k.command;
    DROP TABLE idempotency_keys;
    ALTER TABLE idempotency_keys_v2 RENAME TO idempotency_keys;
    CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

    CREATE INDEX shared_sessions_by_device ON shared_sessions (owner, device, project);
    ",
    // 3: leases on running commands. A running command of an earlier build
    // has none (NULL); the server's sweep grants it one.
    r"
    ALTER TABLE commands ADD COLUMN lease_expires_at INTEGER;
    CREATE INDEX commands_running ON commands (lease_expires_at) WHERE status = 'running';
    CREATE INDEX commands_running_by_device ON commands (owner, device) WHERE status = 'running';
    ",
    // 4: the relay's memory beside its outbox: the projects it has synced
    // (synced once with an empty list after the owner withdrew them), and the
    // Graph processes it started (killed by the next worker if the relay died
    // before they ended; the start time guards against PID reuse).
    r"
    CREATE TABLE relay_projects (
        project TEXT NOT NULL PRIMARY KEY
    ) WITHOUT ROWID;

    CREATE TABLE relay_processes (
        pgid        INTEGER NOT NULL PRIMARY KEY,
        start_time  INTEGER NOT NULL,
        boot_id     TEXT    NOT NULL,
        command     TEXT    NOT NULL,
        recorded_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    ",
    // 5: one index of the open commands. SQLite rewrites an index entry
    // only when its columns, or the columns its predicate reads, are
    // assigned: keyed by columns a command never changes and predicated on
    // `finished_at`, the open index is untouched by a start, a progress
    // report or a lease renewal, and a command writes two entries in it in
    // its life (queued, then finished) where the queued index and the
    // running one by device cost four. A device's queued and running
    // commands are its open ones, filtered on the row. The lease index
    // stays: the sweep reads running commands in lease order, and a backlog
    // of queued ones must not make it read them all.
    r"
    DROP INDEX commands_queued;
    DROP INDEX commands_running_by_device;
    CREATE INDEX commands_open ON commands (owner, device, project, created_at)
        WHERE finished_at IS NULL;
    ",
    // 6: a row's `record` holds the record's body only, its head being in
    // the columns (`CommandRecord::write_body_json`); rows written before
    // keep the whole record and read the same. Nothing to rewrite: the
    // version tells an older build, which expects whole records, to stay
    // away from this file.
    r"
    -- no change to the tables
    ",
    // 7: an idempotency key lives in the row of the command it made: its
    // fingerprint and expiry are columns, NULL once the key is released
    // (expired and pruned, or taken over by a new command). A unique index
    // over the held keys lets one statement write a command and its key,
    // where a table of keys took a second statement and two more index
    // pages per run. Keys made of several columns lead with the most
    // distinct one: SQLite compares two entries column by column and takes
    // its fast path only when the first column decides, which an owner
    // shared by every row never does. Every look-up names all the columns,
    // and the queries that list by a prefix (a device's open commands, a
    // device's shares) name the device too.
    r"
    ALTER TABLE commands ADD COLUMN key_fingerprint TEXT;
    ALTER TABLE commands ADD COLUMN key_expires_at INTEGER;
    UPDATE commands SET key_fingerprint = k.fingerprint, key_expires_at = k.expires_at
        FROM idempotency_keys AS k
        WHERE k.command = commands.id AND k.owner = commands.owner
          AND k.agent = commands.agent AND k.key = commands.idempotency_key;
    DROP TABLE idempotency_keys;
    CREATE UNIQUE INDEX commands_keys ON commands (idempotency_key, agent, owner)
        WHERE key_expires_at IS NOT NULL;
    CREATE INDEX commands_key_expiry ON commands (key_expires_at)
        WHERE key_expires_at IS NOT NULL;

    CREATE TABLE devices_v7 (
        owner        TEXT    NOT NULL,
        device       TEXT    NOT NULL,
        last_sync_at INTEGER,
        last_seen_at INTEGER NOT NULL,
        long_poll    INTEGER NOT NULL,
        PRIMARY KEY (device, owner)
    ) WITHOUT ROWID;
    INSERT INTO devices_v7 (owner, device, last_sync_at, last_seen_at, long_poll)
        SELECT owner, device, last_sync_at, last_seen_at, long_poll FROM devices;
    DROP TABLE devices;
    ALTER TABLE devices_v7 RENAME TO devices;

    DROP INDEX shared_sessions_by_device;
    CREATE INDEX shared_sessions_by_device ON shared_sessions (device, owner, project);
    DROP INDEX commands_open;
    CREATE INDEX commands_open ON commands (device, owner, project, created_at)
        WHERE finished_at IS NULL;
    ",
];

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What the read-only look inside a file found.
struct Inspection {
    application_id: i32,
    user_version: i32,
    objects: Vec<String>,
}

/// Opens `path` for graph-relay: checks, connection settings, migrations,
/// threads. `name` prefixes the thread names.
pub(crate) fn open(
    path: &Path,
    options: &SqliteOptions,
    name: &str,
) -> Result<Database, OpenError> {
    set_busy_budget(options.busy_timeout);
    if !path.exists() {
        create_new(path)?;
    }
    if file_has_content(path)? {
        check(path, &inspect(path)?)?;
    }
    let sqlite = |source| OpenError::Sqlite {
        path: path.to_owned(),
        source,
    };
    let writer = connect(path, OpenFlags::default(), MMAP_SIZE).map_err(sqlite)?;
    // WAL first, so that even the first migration is crash-safe in a way a
    // read-only connection can inspect afterwards (an interrupted WAL
    // transaction is simply ignored; a hot rollback journal would need a
    // write to recover).
    wal_and_schema(&writer, path)?;
    writer
        .pragma_update(None, "synchronous", options.synchronous.pragma())
        .map_err(sqlite)?;
    let open_reader = {
        let path = path.to_owned();
        move || {
            // No memory map: see the crate docs ("Read connections do not
            // map the file").
            let conn = connect(&path, read_write_no_create(), 0)?;
            conn.pragma_update(None, "query_only", true)?;
            conn.pragma_update(None, "cache_size", READER_CACHE_KIB)?;
            Ok(conn)
        }
    };
    // The first read connection now, so that a file readers cannot open
    // fails here rather than at the first read.
    let reader = open_reader().map_err(sqlite)?;
    let checkpointer = connect(path, read_write_no_create(), MMAP_SIZE).map_err(sqlite)?;
    let connections = Connections {
        writer,
        checkpointer,
        reader,
        open_reader: Box::new(open_reader),
        max_readers: options.readers,
        inline_writes: options.synchronous == Synchronous::Normal,
    };
    Database::start(name, connections, options.busy_timeout).map_err(OpenError::Thread)
}

/// Switches `conn` to WAL and applies the migrations; `path` names the
/// database in errors.
fn wal_and_schema(conn: &Connection, path: &Path) -> Result<(), OpenError> {
    let journal: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|source| OpenError::Sqlite {
            path: path.to_owned(),
            source,
        })?;
    if !journal.eq_ignore_ascii_case("wal") {
        return Err(OpenError::NoWal {
            path: path.to_owned(),
            journal_mode: journal,
        });
    }
    migrate(conn, path)
}

/// Creates the database at `path`, which does not exist, without a moment in
/// which a crash leaves it half made: the file is built under a temporary
/// name in the same directory (WAL, schema, application id), closed (which
/// folds the WAL back in), synced, and hard-linked to `path`. If another
/// process linked its own first, that one is used. On a file system without
/// hard links the file is created in place as before.
///
/// A crash while building leaves only the temporary file
/// (`.NAME.creating-PID`), which nothing reads.
fn create_new(path: &Path) -> Result<(), OpenError> {
    let io = |source| OpenError::Io {
        path: path.to_owned(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "graph-relay.sqlite".to_owned());
    let temporary = path.with_file_name(format!(".{name}.creating-{}", std::process::id()));
    let remove_temporary = || {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = temporary.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    };
    remove_temporary();
    let built = (|| {
        let conn =
            connect(&temporary, OpenFlags::default(), 0).map_err(|source| OpenError::Sqlite {
                path: temporary.clone(),
                source,
            })?;
        wal_and_schema(&conn, path)?;
        drop(conn);
        std::fs::File::open(&temporary)
            .and_then(|f| f.sync_all())
            .map_err(io)
    })();
    if let Err(e) = built {
        remove_temporary();
        return Err(e);
    }
    let linked = std::fs::hard_link(&temporary, path);
    remove_temporary();
    match linked {
        Ok(()) => {
            // Make the new name durable too.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
            }
            Ok(())
        }
        // Another process created it first, or links are not supported:
        // the normal open path takes it from here.
        Err(_) => Ok(()),
    }
}

/// True if `path` exists and is not empty; refuses a file that cannot be
/// SQLite by its header, without opening it with SQLite.
fn file_has_content(path: &Path) -> Result<bool, OpenError> {
    let io = |source| OpenError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(e)),
    };
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut header = [0u8; 16];
    let not_sqlite = || OpenError::NotSqlite {
        path: path.to_owned(),
    };
    // A database is at least one 512-byte page.
    if len < 512 {
        return Err(not_sqlite());
    }
    file.read_exact(&mut header).map_err(io)?;
    if &header != SQLITE_MAGIC {
        return Err(not_sqlite());
    }
    Ok(true)
}

/// Looks inside an existing file through a read-only connection, which
/// writes nothing to it.
fn inspect(path: &Path) -> Result<Inspection, OpenError> {
    let sqlite = |source: rusqlite::Error| {
        if source.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
            OpenError::NotSqlite {
                path: path.to_owned(),
            }
        } else {
            OpenError::Sqlite {
                path: path.to_owned(),
                source,
            }
        }
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite)?;
    conn.busy_handler(Some(busy_handler)).map_err(sqlite)?;
    read_inspection(&conn).map_err(sqlite)
}

fn read_inspection(conn: &Connection) -> rusqlite::Result<Inspection> {
    let application_id = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let user_version = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
    )?;
    let objects = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Inspection {
        application_id,
        user_version,
        objects,
    })
}

/// Refuses a file of another application or of a newer schema.
fn check(path: &Path, found: &Inspection) -> Result<(), OpenError> {
    let path: PathBuf = path.to_owned();
    if found.application_id == APPLICATION_ID {
        if found.user_version > SCHEMA_VERSION {
            return Err(OpenError::NewerSchema {
                path,
                found: found.user_version,
                supported: SCHEMA_VERSION,
            });
        }
        return Ok(());
    }
    if found.application_id != 0 {
        return Err(OpenError::ForeignApplication {
            path,
            application_id: found.application_id,
        });
    }
    if !found.objects.is_empty() || found.user_version != 0 {
        return Err(OpenError::UnknownContent {
            path,
            objects: found.objects.clone(),
        });
    }
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`] in one immediate transaction,
/// repeating the checks under the write lock.
fn migrate(conn: &Connection, path: &Path) -> Result<(), OpenError> {
    let sqlite = |source| OpenError::Sqlite {
        path: path.to_owned(),
        source,
    };
    conn.execute_batch("BEGIN IMMEDIATE").map_err(sqlite)?;
    let outcome = (|| {
        let found = read_inspection(conn).map_err(sqlite)?;
        check(path, &found)?;
        let from = usize::try_from(found.user_version).unwrap_or(0);
        if from >= MIGRATIONS.len() && found.application_id == APPLICATION_ID {
            return Ok(false);
        }
        for sql in MIGRATIONS.iter().skip(from) {
            conn.execute_batch(sql).map_err(sqlite)?;
        }
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(sqlite)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(sqlite)?;
        Ok(true)
    })();
    match outcome {
        Ok(true) => conn.execute_batch("COMMIT").map_err(sqlite),
        Ok(false) | Err(_) => {
            // Nothing was changed (or the change is abandoned): release the lock.
            let _ = conn.execute_batch("ROLLBACK");
            outcome.map(|_| ())
        }
    }
}

fn read_write_no_create() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
}

/// A connection with this crate's settings.
fn connect(path: &Path, flags: OpenFlags, mmap: i64) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_handler(Some(busy_handler))?;
    conn.set_prepared_statement_cache_capacity(64);
    // The writer and the checkpointer read pages through a memory map
    // instead of a read() per page.
    conn.pragma_update(None, "mmap_size", mmap)?;
    Ok(conn)
}

/// Bytes of the database file the writer and the checkpointer map (1 GiB of
/// address space).
const MMAP_SIZE: i64 = 1 << 30;

/// Page cache of each read connection, as `PRAGMA cache_size` (negative:
/// KiB): 16 MiB.
const READER_CACHE_KIB: i64 = -16 * 1024;
