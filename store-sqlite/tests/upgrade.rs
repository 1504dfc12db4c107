//! A database written by an earlier build is upgraded in place and its runs
//! stay readable, with their owner.
//!
//! `fixtures/schema-v1.sqlite` was written by the schema-1 build (commit
//! a1fb19c) through the real `SqliteStore` and `Queue`: the testkit world
//! (owner `alice`, agent `assistant`, device `desktop`) on a manual clock at
//! `testkit::EPOCH`, seed 1; the device shared sessions 1 and 2 to `p1`;
//! the agent queued three runs with the keys `v1-queued-key` (session 1,
//! `{"n": 1}`), `v1-running-key` and `v1-done-key`, one second apart; the
//! second was started as `v1-exec-running`, the third started as
//! `v1-exec-done` and completed with `{"answer": "v1"}`.

use std::path::PathBuf;
use std::sync::Arc;

use futures::executor::block_on;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::{CommandId, IdempotencyKey};
use graph_relay_core::queue::{CompleteAck, GetError, Queue, QueueConfig};
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{World, completed, p1, run_args};
use graph_relay_core::time::{Clock, SeededIds};
use graph_relay_store_sqlite::{SCHEMA_VERSION, SqliteStore};
use rusqlite::Connection;
use serde_json::json;

const QUEUED: &str = "910a2dec-8902-4cc1-9758-35de1c9756ce";
const RUNNING: &str = "1d0b14e4-db01-4fed-ae73-e372e2338aca";
const DONE: &str = "63033b0c-a389-435a-bd64-a5d9adefe000";

fn fixture_copy(dir: &tempfile::TempDir) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema-v1.sqlite");
    let path = dir.path().join("upgraded.sqlite");
    std::fs::copy(&source, &path).expect("copy the fixture");
    let version: i32 = Connection::open(&path)
        .expect("open")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, 1, "the fixture is a schema-1 file");
    path
}

fn id(text: &str) -> CommandId {
    CommandId::parse(text).expect("fixture id")
}

#[test]
fn a_schema_1_database_is_upgraded_and_its_runs_stay_readable() {
    let dir = tempfile::tempdir().expect("dir");
    let path = fixture_copy(&dir);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).expect("open and upgrade"));
    let mut w = World::new(store.clone());
    // The fixture's clock stood three seconds past the epoch; another seed
    // than the fixture's so new ids do not collide with its ids.
    w.advance(3);
    w.queue = Queue::new(
        store.clone(),
        w.clock.clone(),
        Arc::new(SeededIds::new(99)),
        QueueConfig::default(),
    );
    block_on(async {
        let status = |text: &'static str| {
            let (q, a) = (&w.queue, &w.agent);
            async move {
                q.get_graph_run(a, &id(text))
                    .await
                    .expect("alice reads her run")
            }
        };
        assert_eq!(status(QUEUED).await.command.status, CommandStatus::Queued);
        assert_eq!(status(RUNNING).await.command.status, CommandStatus::Running);
        let done = status(DONE).await;
        assert_eq!(done.command.status, CommandStatus::Completed);
        assert_eq!(done.to_json()["result"], json!({"answer": "v1"}));
        for text in [QUEUED, RUNNING, DONE] {
            assert_eq!(status(text).await.command.owner, w.agent.owner);
        }

        // The keys took their command's owner: Alice's retry still replays.
        let replay = w
            .queue
            .run_graph_session(&w.agent, run_args(1, "v1-queued-key", json!({"n": 1})))
            .await
            .expect("replay");
        assert!(replay.replayed);
        assert_eq!(replay.command.id, id(QUEUED));
        let key = store
            .idempotency(
                &w.agent.owner,
                &w.agent.id,
                &IdempotencyKey::parse("v1-done-key").expect("key"),
                w.clock.now(),
            )
            .await
            .expect("read key")
            .expect("migrated key");
        assert_eq!((key.owner, key.command), (w.agent.owner.clone(), id(DONE)));

        // Bob's agent of the same name sees none of it, and his key space is his own.
        for text in [QUEUED, RUNNING, DONE] {
            assert!(matches!(
                w.queue.get_graph_run(&w.twin, &id(text)).await,
                Err(GetError::NotFound)
            ));
        }
        w.sync(&w.twin_device, p1(), &[1]).await;
        let bobs = w
            .queue
            .run_graph_session(&w.twin, run_args(1, "v1-queued-key", json!({"n": 1})))
            .await
            .expect("bob runs");
        assert!(!bobs.replayed);
        assert_ne!(bobs.command.id, id(QUEUED));

        // The desktop goes on where it left off.
        let handed = w.sync(&w.device, p1(), &[1, 2]).await;
        assert_eq!(
            handed.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![id(QUEUED)]
        );
        let ack = w
            .queue
            .complete(
                &w.device,
                &id(RUNNING),
                &completed("v1-exec-running", json!("after the upgrade")),
            )
            .await
            .expect("complete");
        assert!(
            matches!(ack, CompleteAck::Recorded(ref c) if c.status == CommandStatus::Completed)
        );
    });
    drop(w);
    drop(store);

    let conn = Connection::open(&path).expect("open");
    let version: i32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    let keys: i64 = conn
        .query_row(
            "SELECT count(*) FROM commands WHERE key_expires_at IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(keys, 4, "three migrated keys and Bob's");
    // The commands' indexes are the open, running and finished ones, the
    // held keys and their expiry (and the primary key's); the queued and
    // running-by-device ones are gone, and so is the table of keys.
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'commands' ORDER BY name")
        .expect("prepare");
    let indexes: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(
        indexes,
        [
            "commands_finished",
            "commands_key_expiry",
            "commands_keys",
            "commands_open",
            "commands_running",
            "sqlite_autoindex_commands_1"
        ]
    );
    drop(stmt);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'idempotency_keys'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(tables, 0);
    drop(conn);
    // A second open finds nothing left to migrate.
    let again = SqliteStore::open(&path).expect("reopen");
    assert_eq!(block_on(again.command_count()).expect("count"), 4);
}
