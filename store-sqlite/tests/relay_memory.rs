//! What a relay keeps in its outbox file beside the reports: the projects it
//! has synced and the Graph processes its worker started. Both survive a
//! reopen (a restarted worker reads them), and both go when told to.

use futures::executor::block_on;
use graph_relay_core::ids::{CommandId, ProjectId};
use graph_relay_core::outbox::Outbox;
use graph_relay_core::time::Timestamp;
use graph_relay_store_sqlite::{GraphProcess, SCHEMA_VERSION, SqliteOutbox, SqliteStore};

fn project(name: &str) -> ProjectId {
    ProjectId::parse(name).expect("project id")
}

fn process(pgid: i32, start_time: u64, n: u128) -> GraphProcess {
    GraphProcess {
        pgid,
        start_time,
        boot_id: "0b2c6f1e-boot".into(),
        command: CommandId::from_uuid(uuid::Uuid::from_u128(n)),
        recorded_at: Timestamp(1_000 + u64::try_from(n).expect("small")),
    }
}

#[test]
fn synced_projects_are_remembered_across_a_reopen_until_forgotten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    {
        let outbox = SqliteOutbox::open(&path).expect("open");
        assert!(block_on(outbox.synced_projects()).expect("read").is_empty());
        block_on(outbox.remember_project(&project("p2"))).expect("remember");
        block_on(outbox.remember_project(&project("p1"))).expect("remember");
        block_on(outbox.remember_project(&project("p2"))).expect("twice is fine");
    }
    let outbox = SqliteOutbox::open(&path).expect("reopen");
    assert_eq!(
        block_on(outbox.synced_projects()).expect("read"),
        vec![project("p1"), project("p2")]
    );
    block_on(outbox.forget_project(&project("p2"))).expect("forget");
    block_on(outbox.forget_project(&project("unknown"))).expect("forgetting nothing is fine");
    assert_eq!(
        block_on(outbox.synced_projects()).expect("read"),
        vec![project("p1")]
    );
}

#[test]
fn process_records_survive_a_reopen_and_go_only_with_their_start_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    {
        let outbox = SqliteOutbox::open(&path).expect("open");
        block_on(outbox.record_process(&process(4242, 9_000_000, 2))).expect("record");
        block_on(outbox.record_process(&process(77, 5, 1))).expect("record");
    }
    let outbox = SqliteOutbox::open(&path).expect("reopen");
    assert_eq!(
        block_on(outbox.processes()).expect("read"),
        vec![process(77, 5, 1), process(4242, 9_000_000, 2)],
        "oldest record first"
    );
    // A record of the same group id with another start time is another
    // process (the id was reused): removing the old one leaves it.
    block_on(outbox.record_process(&process(77, 6, 3))).expect("replace");
    block_on(outbox.remove_process(77, 5)).expect("remove");
    assert_eq!(
        block_on(outbox.processes()).expect("read"),
        vec![process(4242, 9_000_000, 2), process(77, 6, 3)]
    );
    block_on(outbox.remove_process(77, 6)).expect("remove");
    block_on(outbox.remove_process(4242, 9_000_000)).expect("remove");
    block_on(outbox.remove_process(4242, 9_000_000)).expect("removing nothing is fine");
    assert!(block_on(outbox.processes()).expect("read").is_empty());
}

#[test]
fn a_store_file_of_the_previous_schema_gains_the_relay_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shared.db");
    // Version 3 as a store wrote it (the relay's tables come with
    // migration 4): the upgrade adds them.
    {
        let _store = SqliteStore::open(&path).expect("store");
    }
    {
        let conn = rusqlite::Connection::open(&path).expect("sqlite");
        conn.execute_batch("DROP TABLE relay_projects; DROP TABLE relay_processes;")
            .expect("back to the previous version");
        conn.execute_batch(
            "DROP INDEX commands_keys;
             DROP INDEX commands_key_expiry;
             ALTER TABLE commands DROP COLUMN key_fingerprint;
             ALTER TABLE commands DROP COLUMN key_expires_at;
             CREATE TABLE idempotency_keys (
                owner TEXT NOT NULL, agent TEXT NOT NULL, key TEXT NOT NULL,
                command TEXT NOT NULL, fingerprint TEXT NOT NULL, expires_at INTEGER NOT NULL,
                PRIMARY KEY (owner, agent, key)
             ) WITHOUT ROWID;
             DROP INDEX commands_open;
             CREATE INDEX commands_queued ON commands (owner, project, device, created_at)
                WHERE status = 'queued';
             CREATE INDEX commands_running_by_device ON commands (owner, device)
                WHERE status = 'running';",
        )
        .expect("version 3's keys and indexes");
        conn.pragma_update(None, "user_version", 3)
            .expect("user_version");
    }
    let outbox = SqliteOutbox::open(&path).expect("upgraded");
    let version: i32 = rusqlite::Connection::open(&path)
        .expect("sqlite")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    block_on(outbox.remember_project(&project("p1"))).expect("remember");
    block_on(outbox.record_process(&process(1, 1, 1))).expect("record");
    assert_eq!(
        block_on(outbox.synced_projects()).expect("read"),
        vec![project("p1")]
    );
}
