//! Opening files: foreign files and newer schemas are refused without being
//! touched; our own files reopen with their data; the outbox survives a
//! reopen.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use futures::executor::block_on;
use graph_relay_core::outbox::{Outbox, OutboxItem, RelayReport};
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{World, completed, p1};
use graph_relay_core::time::Timestamp;
use graph_relay_store_sqlite::{
    APPLICATION_ID, OpenError, SCHEMA_VERSION, SqliteOptions, SqliteOutbox, SqliteStore,
    Synchronous,
};
use rusqlite::Connection;
use serde_json::json;

/// Bytes and modification time of a file.
fn fingerprint(path: &Path) -> (Vec<u8>, SystemTime) {
    let bytes = std::fs::read(path).expect("read file");
    let mtime = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("mtime");
    (bytes, mtime)
}

/// Opening `path` as a store and as an outbox fails with `expected`, and
/// leaves the file byte for byte (and mtime) as it was.
fn assert_refused(path: &Path, expected: impl Fn(&OpenError) -> bool) {
    let before = fingerprint(path);
    let store = SqliteStore::open(path);
    let err = store.expect_err("a foreign file must be refused");
    assert!(expected(&err), "unexpected error: {err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error names the file: {err}"
    );
    let outbox = SqliteOutbox::open(path).expect_err("refused as an outbox too");
    assert!(expected(&outbox), "unexpected error: {outbox:?}");
    assert_eq!(fingerprint(path), before, "the file was modified");
}

#[test]
fn a_text_file_is_not_sqlite_and_is_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let long = dir.path().join("notes.txt");
    std::fs::write(&long, "not a database\n".repeat(200)).expect("write");
    assert_refused(&long, |e| matches!(e, OpenError::NotSqlite { .. }));
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "hi").expect("write");
    assert_refused(&short, |e| matches!(e, OpenError::NotSqlite { .. }));
    // A file that starts like SQLite but is garbage after the header.
    let fake = dir.path().join("fake.sqlite");
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(std::iter::repeat_n(0xA5u8, 8192));
    std::fs::write(&fake, bytes).expect("write");
    assert_refused(&fake, |e| matches!(e, OpenError::NotSqlite { .. }));
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("other.sqlite");
    {
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch(
            "PRAGMA application_id = 305419896;
             CREATE TABLE users (name TEXT);
             INSERT INTO users VALUES ('alice');",
        )
        .expect("fill");
    }
    assert_refused(
        &path,
        |e| matches!(e, OpenError::ForeignApplication { application_id, .. } if *application_id == 0x1234_5678),
    );
}

#[test]
fn another_applications_wal_database_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("other-wal.sqlite");
    {
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA application_id = 7;
             CREATE TABLE t (x);",
        )
        .expect("fill");
    }
    assert_refused(&path, |e| {
        matches!(
            e,
            OpenError::ForeignApplication {
                application_id: 7,
                ..
            }
        )
    });
}

#[test]
fn a_database_with_unknown_tables_and_no_application_id_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("plain.sqlite");
    {
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch("CREATE TABLE commands (id TEXT); INSERT INTO commands VALUES ('x');")
            .expect("fill");
    }
    assert_refused(&path, |e| match e {
        OpenError::UnknownContent { objects, .. } => objects == &["commands".to_owned()],
        _ => false,
    });
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("queue.sqlite");
    {
        let store = SqliteStore::open(&path).expect("create");
        let w = World::new(Arc::new(store));
        block_on(w.sync(&w.device, p1(), &[1]));
        block_on(w.run(&w.agent, 1, "newer-schema-1"));
    }
    {
        // What a future version of graph-relay would leave behind.
        let conn = Connection::open(&path).expect("raw open");
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("bump");
        conn.execute_batch("CREATE TABLE future_things (x)")
            .expect("future table");
    }
    assert_refused(&path, |e| {
        matches!(e, OpenError::NewerSchema { found, supported, .. }
            if *found == SCHEMA_VERSION + 1 && *supported == SCHEMA_VERSION)
    });
}

#[test]
fn an_empty_or_missing_file_becomes_a_marked_database() {
    let dir = tempfile::tempdir().expect("dir");
    let empty = dir.path().join("empty.sqlite");
    std::fs::write(&empty, b"").expect("touch");
    drop(SqliteStore::open(&empty).expect("an empty file is fine"));
    let missing = dir.path().join("missing.sqlite");
    drop(SqliteOutbox::open(&missing).expect("a missing file is created"));
    for path in [&empty, &missing] {
        let conn = Connection::open(path).expect("raw open");
        let app: i32 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .expect("application_id");
        let version: i32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("user_version");
        let journal: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .expect("journal_mode");
        assert_eq!(
            (app, version, journal.as_str()),
            (APPLICATION_ID, SCHEMA_VERSION, "wal")
        );
    }
}

#[test]
fn commands_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("queue.sqlite");
    let (agent, id, envelope) = {
        let store = SqliteStore::open_with(
            &path,
            &SqliteOptions::default().synchronous(Synchronous::Full),
        )
        .expect("open");
        let w = World::new(Arc::new(store));
        w.sync(&w.device, p1(), &[1]).await_now();
        let cmd = w.run(&w.agent, 1, "reopen-key-1").await_now();
        block_on(
            w.queue
                .start(&w.device, &cmd.id, &graph_relay_core::testkit::exec("e1")),
        )
        .expect("start");
        let envelope = completed("e1", json!({"text": "日本語", "n": 0.1}));
        block_on(w.queue.complete(&w.device, &cmd.id, &envelope)).expect("complete");
        (w.agent.clone(), cmd.id, envelope)
    };
    let store = SqliteStore::open(&path).expect("reopen");
    let back = block_on(store.command_for_agent(&agent.owner, &agent.id, &id))
        .expect("read")
        .expect("still there");
    assert_eq!(back.completion, Some(envelope));
    assert_eq!(block_on(store.command_count()).expect("count"), 1);
}

#[test]
fn the_outbox_survives_a_reopen_and_shares_a_file_with_a_store() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("relay.sqlite");
    let item = |n: u128, at: u64| OutboxItem {
        command: graph_relay_core::ids::CommandId::from_uuid(uuid::Uuid::from_u128(n)),
        report: if n.is_multiple_of(2) {
            RelayReport::Declined
        } else {
            RelayReport::Completion {
                envelope: completed(&format!("exec-{n}"), json!({"n": n as u64})),
            }
        },
        stored_at: Timestamp(at),
        attempts: 0,
    };
    let (a, b, c) = (item(1, 10), item(2, 20), item(3, 30));
    {
        let outbox = SqliteOutbox::open(&path).expect("open");
        for i in [&a, &b, &c] {
            block_on(outbox.put(i)).expect("put");
        }
        block_on(outbox.record_attempt(&a.command)).expect("attempt");
    }
    let outbox = SqliteOutbox::open(&path).expect("reopen");
    let mut a_after = a.clone();
    a_after.attempts = 1;
    assert_eq!(
        block_on(outbox.pending()).expect("pending"),
        vec![a_after, b.clone(), c.clone()]
    );
    block_on(outbox.remove(&b.command)).expect("remove");
    drop(outbox);
    // The same file also opens as a store: one schema holds both.
    let store = SqliteStore::open(&path).expect("a store on the outbox file");
    assert_eq!(block_on(store.command_count()).expect("count"), 0);
    let outbox = SqliteOutbox::open(&path).expect("reopen while the store is open");
    let pending = block_on(outbox.pending()).expect("pending");
    assert_eq!(
        pending.iter().map(|i| i.command).collect::<Vec<_>>(),
        vec![a.command, c.command]
    );
}

/// `block_on` as a method, to keep the tests above readable.
trait AwaitNow: std::future::Future + Sized {
    fn await_now(self) -> Self::Output {
        block_on(self)
    }
}

impl<F: std::future::Future> AwaitNow for F {}

/// Many writes one after another: the checkpoint thread keeps the WAL within
/// a few times what SQLite's own autocheckpoint would (1000 pages), and reads on
/// several threads at once, with fewer pooled connections than threads,
/// all see every write.
#[test]
fn wal_stays_bounded_and_pooled_reads_see_every_write() {
    use graph_relay_store_sqlite::SqliteOptions;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wal.sqlite");
    let store = SqliteStore::open_with(&path, &SqliteOptions::default().readers(2)).expect("open");
    let w = World::new(Arc::new(graph_relay_store_memory::MemoryStore::new()));
    let ids = graph_relay_core::time::SeededIds::new(7);
    let mut max_wal = 0u64;
    for i in 0..5000u64 {
        let mut c = w.sync_template(0);
        c.id = graph_relay_core::time::IdSource::new_command_id(&ids);
        c.idempotency_key =
            graph_relay_core::ids::IdempotencyKey::parse(&format!("wal-key-{i:06}")).expect("key");
        c.slug = "x".repeat(2000).into();
        block_on(store.import_commands(vec![c])).expect("write");
        let wal = std::fs::metadata(path.with_extension("sqlite-wal")).map_or(0, |m| m.len());
        max_wal = max_wal.max(wal);
    }
    // 5000 commits of 3 or more pages each would be over 60 MB of WAL
    // unchecked; SQLite's own autocheckpoint keeps it near 4 MB.
    assert!(max_wal < 20 << 20, "the WAL grew to {max_wal} bytes");
    let store = Arc::new(store);
    std::thread::scope(|scope| {
        for _ in 0..6 {
            let store = Arc::clone(&store);
            scope.spawn(move || {
                for _ in 0..50 {
                    assert_eq!(block_on(store.command_count()).expect("count"), 5000);
                }
            });
        }
    });
}

/// Two stores on one file: each remembers the records it wrote or decoded,
/// and still reads what the other one wrote since, at every step.
#[test]
fn a_record_changed_through_another_store_is_read_as_it_now_is() {
    use graph_relay_core::command::CommandStatus;
    use graph_relay_core::testkit::exec;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("shared.sqlite");
    let a = World::new(Arc::new(SqliteStore::open(&path).expect("open a")));
    let b = World::new(Arc::new(SqliteStore::open(&path).expect("open b")));
    a.sync(&a.device, p1(), &[1]).await_now();
    // Queued through `a`, which remembers the record it wrote.
    let cmd = a.run(&a.agent, 1, "shared-key-1").await_now();
    let read = |w: &World| {
        block_on(w.queue.get_graph_run(&w.agent, &cmd.id))
            .expect("get")
            .command
    };
    assert_eq!(read(&a).status, CommandStatus::Queued);
    // Started through `b`; `a` still remembers the queued record.
    block_on(b.queue.start(&b.device, &cmd.id, &exec("e1"))).expect("start through b");
    let running = read(&a);
    assert_eq!(running.status, CommandStatus::Running);
    assert_eq!(running.execution_id, Some(exec("e1")));
    assert_eq!(running, read(&b));
    // Completed through `a` (which read the running record from the file).
    let envelope = completed("e1", json!({"n": 1}));
    block_on(a.queue.complete(&a.device, &cmd.id, &envelope)).expect("complete through a");
    let done = read(&b);
    assert_eq!(done.status, CommandStatus::Completed);
    assert_eq!(done.completion, Some(envelope));
    assert_eq!(done, read(&a));
    assert_eq!(done.revision, 2);
}
