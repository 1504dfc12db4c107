use super::*;
use graph_relay_core::testkit::World;

fn record() -> CommandRecord {
    World::new(Arc::new(graph_relay_store_memory::MemoryStore::new())).sync_template(0)
}

#[test]
fn a_row_holds_the_record_and_its_body() {
    let record = record();
    let row = CommandRow::encode(record.clone()).expect("encodes");
    assert_eq!(row.entry.record, record);
    assert_eq!(row.entry.json, record.body_json().expect("encodes"));
    let decoded = CommandRecord::from_parts(record.head(), &row.entry.json).expect("valid JSON");
    assert_eq!(decoded, record);
}

#[test]
fn a_record_that_cannot_be_encoded_is_refused_before_any_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("encode.sqlite")).expect("open");
    let mut record = record();
    record.created_at = Timestamp(u64::MAX);
    match CommandRow::encode(record.clone()) {
        Err(DbError::Encode(message)) => assert!(message.contains("out of range")),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a timestamp past i64 milliseconds encoded"),
    }
    let before = store.statements_executed();
    record.revision = 1;
    assert!(futures::executor::block_on(store.update_command(&record)).is_err());
    assert_eq!(
        store.statements_executed(),
        before,
        "nothing reached the writer"
    );
}

/// A finished command is never reopened: a swap to an open state from its
/// revision changes nothing, as does one from a stale revision.
#[test]
fn a_finished_command_is_never_written_open_again() {
    use futures::executor::block_on;
    use graph_relay_core::command::CommandStatus;

    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("reopen.sqlite")).expect("open");
    let queued = record();
    block_on(store.import_commands(vec![queued.clone()])).expect("import");

    let mut finished = queued.clone();
    finished.revision += 1;
    finished.status = CommandStatus::Cancelled;
    finished.finished_at = Some(Timestamp(queued.created_at.0 + 5));
    assert!(block_on(store.update_command(&finished)).expect("cancel"));

    let mut reopened = finished.clone();
    reopened.revision += 1;
    reopened.status = CommandStatus::Running;
    reopened.finished_at = None;
    assert!(!block_on(store.update_command(&reopened)).expect("refused"));

    let stored = block_on(store.command_for_owner(&queued.owner, &queued.id))
        .expect("read")
        .expect("kept");
    assert_eq!(stored, finished);
}

/// The cache serves a record only while its row is as the store last saw
/// it: another connection that moves the columns a transition writes
/// (here without touching the body), or deletes the row, is seen at once.
#[test]
fn a_row_changed_by_another_connection_is_never_served_from_the_cache() {
    use futures::executor::block_on;
    use graph_relay_core::command::CommandStatus;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("changed.sqlite");
    let store = SqliteStore::open(&path).expect("open");
    let queued = record();
    block_on(store.import_commands(vec![queued.clone()])).expect("import");
    let read = || block_on(store.command_for_owner(&queued.owner, &queued.id)).expect("read");
    assert_eq!(read(), Some(queued.clone()), "read, and now cached");

    let other = rusqlite::Connection::open(&path).expect("a second connection");
    let id = id_text(&queued.id);
    for (sql, status, revision, finished_at, lease) in [
        (
            "UPDATE commands SET revision = revision + 1 WHERE id = ?1",
            CommandStatus::Queued,
            1,
            None,
            None,
        ),
        (
            "UPDATE commands SET status = 'cancelled', revision = 2, finished_at = 5 WHERE id = ?1",
            CommandStatus::Cancelled,
            2,
            Some(Timestamp(5)),
            None,
        ),
        (
            "UPDATE commands SET revision = 3, lease_expires_at = 9 WHERE id = ?1",
            CommandStatus::Cancelled,
            3,
            Some(Timestamp(5)),
            Some(Timestamp(9)),
        ),
    ] {
        other.execute(sql, [&id]).expect("update");
        let seen = read().expect("still there");
        assert_eq!(
            (
                seen.status,
                seen.revision,
                seen.finished_at,
                seen.lease_expires_at
            ),
            (status, revision, finished_at, lease),
            "{sql}"
        );
        assert_eq!(seen.arguments, queued.arguments, "the body is the same");
    }
    other
        .execute("DELETE FROM commands WHERE id = ?1", [&id])
        .expect("prune");
    assert_eq!(read(), None, "pruned elsewhere, gone here");
}
