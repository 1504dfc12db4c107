//! A schema written at version 1 (before identity was (owner, name)) is
//! upgraded by `connect`, and its runs stay readable with their owner.
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`);
//! `GRAPH_RELAY_SKIP=postgres` lists these tests as ignored instead.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::command::{CommandRecord, CommandStatus, request_fingerprint};
use graph_relay_core::queue::{GetError, Queue, QueueConfig};
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{World, completed, exec, p1, run_args};
use graph_relay_core::time::{Clock, SeededIds};
use graph_relay_store_memory::MemoryStore;
use graph_relay_store_postgres::testing::{TestSchema, url};
use graph_relay_store_postgres::{MIGRATIONS, PostgresStore, SCHEMA_VERSION};
use serde_json::json;

/// Three runs of Alice's assistant as the previous build wrote them: one
/// queued, one running, one completed. Made by the real queue (on a memory
/// store), so the records are exactly what a store is handed.
async fn alice_runs() -> (World, Vec<CommandRecord>) {
    let w = World::new(Arc::new(MemoryStore::new()));
    w.sync(&w.device, p1(), &[1, 2]).await;
    let queued = w.run(&w.agent, 1, "v1-queued-key").await;
    let running = w.run(&w.agent, 2, "v1-running-key").await;
    w.queue
        .start(&w.device, &running.id, &exec("v1-exec-running"))
        .await
        .expect("start");
    let done = w.run(&w.agent, 1, "v1-done-key").await;
    w.queue
        .start(&w.device, &done.id, &exec("v1-exec-done"))
        .await
        .expect("start");
    w.queue
        .complete(
            &w.device,
            &done.id,
            &completed("v1-exec-done", json!({"answer": "v1"})),
        )
        .await
        .expect("complete");
    let mut records = Vec::new();
    for c in [queued, running, done] {
        let mut record = w
            .queue
            .get_graph_run(&w.agent, &c.id)
            .await
            .expect("read")
            .command;
        // Schema 1 knew no leases.
        record.lease_expires_at = None;
        record.heard_at = None;
        records.push(record);
    }
    (w, records)
}

/// Milliseconds, as the tables store times.
fn millis(t: graph_relay_core::time::Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap()
}

/// A plain connection to `url` and the task driving it.
async fn plain_client(url: &str) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let config = tokio_postgres::Config::from_str(url).expect("url");
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driver)
}

/// Schema `name` as the build of schema `version` left it, written with
/// plain SQL on `client` (whose `search_path` it then names): migrations
/// 1 to `version` applied and recorded.
async fn earlier_schema(client: &tokio_postgres::Client, name: &str, version: usize) {
    client
        .batch_execute(&format!(
            "CREATE SCHEMA \"{name}\"; SET search_path TO \"{name}\";
             CREATE TABLE schema_migrations (
                version    INTEGER     NOT NULL PRIMARY KEY,
                name       TEXT        NOT NULL,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now());"
        ))
        .await
        .expect("schema");
    for m in &MIGRATIONS[..version] {
        client.batch_execute(m.sql).await.expect("migration");
        client
            .execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                &[&m.version, &m.name],
            )
            .await
            .expect("record the migration");
    }
}

/// `c` as a row of schema 1's `commands` (later schemas add columns with
/// defaults).
async fn insert_command(client: &tokio_postgres::Client, c: &CommandRecord) {
    client
        .execute(
            "INSERT INTO commands (id, agent, owner, project, device, idempotency_key,
                status, created_at, finished_at, revision, record)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            &[
                c.id.as_uuid(),
                &c.agent.as_str(),
                &c.owner.as_str(),
                &c.project.as_str(),
                &c.device.as_str(),
                &c.idempotency_key.as_str(),
                &c.status.as_str(),
                &millis(c.created_at),
                &c.finished_at.map(millis),
                &i64::try_from(c.revision).unwrap(),
                &serde_json::to_string(c).unwrap(),
            ],
        )
        .await
        .expect("command row");
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_1_database_is_upgraded_and_its_runs_stay_readable() {
    let url = url();
    let schema = TestSchema::new(&url);
    let (old, records) = alice_runs().await;

    // Write schema 1 and its rows with plain SQL, as the previous build did.
    let (client, driver) = plain_client(&url).await;
    assert_eq!(MIGRATIONS[0].version, 1);
    earlier_schema(&client, schema.name(), 1).await;
    for c in &records {
        insert_command(&client, c).await;
        client
            .execute(
                "INSERT INTO idempotency_keys (agent, key, command, fingerprint, expires_at)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &c.agent.as_str(),
                    &c.idempotency_key.as_str(),
                    c.id.as_uuid(),
                    &request_fingerprint(&c.graph_session_id, &c.arguments),
                    &millis(c.created_at.plus(Duration::from_secs(24 * 3600))),
                ],
            )
            .await
            .expect("v1 key row");
    }
    drop(client);
    let _ = driver.await;

    // The current build connects: migration 2 runs, the runs read back.
    let store = schema.store().await.expect("connect and upgrade");
    let store: Arc<dyn Store> = Arc::new(store);
    let mut w = World::new(store.clone());
    w.clock.set(old.clock.now());
    w.queue = Queue::new(
        store.clone(),
        w.clock.clone(),
        Arc::new(SeededIds::new(99)),
        QueueConfig::default(),
    );
    for c in &records {
        let read = w
            .queue
            .get_graph_run(&w.agent, &c.id)
            .await
            .expect("alice reads her run");
        assert_eq!(&read.command, c);
        assert!(matches!(
            w.queue.get_graph_run(&w.twin, &c.id).await,
            Err(GetError::NotFound)
        ));
    }
    assert_eq!(records[2].status, CommandStatus::Completed);
    w.sync(&w.device, p1(), &[1, 2]).await;
    let replay = w
        .queue
        .run_graph_session(
            &w.agent,
            run_args(1, "v1-queued-key", json!({"q": "v1-queued-key"})),
        )
        .await
        .expect("alice's retry replays");
    assert!(replay.replayed);
    assert_eq!(replay.command.id, records[0].id);
    w.sync(&w.twin_device, p1(), &[1]).await;
    let bobs = w
        .queue
        .run_graph_session(
            &w.twin,
            run_args(1, "v1-queued-key", json!({"q": "v1-queued-key"})),
        )
        .await
        .expect("bob runs");
    assert!(!bobs.replayed, "Bob's key space is his own");

    let versions: Vec<i32> = PostgresStore::connect(&url, &schema.options())
        .await
        .expect("reconnect")
        .pool()
        .get()
        .await
        .expect("client")
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

/// The names of the indexes on `commands` and its storage options.
async fn commands_layout(client: &tokio_postgres::Client) -> (Vec<String>, Vec<String>) {
    let indexes = client
        .query(
            "SELECT indexrelid::regclass::text FROM pg_index
             WHERE indrelid = 'commands'::regclass ORDER BY 1",
            &[],
        )
        .await
        .expect("indexes")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let options: Option<Vec<String>> = client
        .query_one(
            "SELECT reloptions FROM pg_class WHERE oid = 'commands'::regclass",
            &[],
        )
        .await
        .expect("options")
        .get(0);
    (indexes, options.unwrap_or_default())
}

/// A schema 4 database, where every transition of a command wrote index
/// entries, gets migration 5 at `connect`: one index of the open commands
/// instead of the three that read `status`, room on each page, and a
/// start (status, lease, revision and record changed) is then a HOT
/// update. Its queued and running runs are still found.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_4_database_gets_hot_starts_and_keeps_its_runs() {
    let url = url();
    let schema = TestSchema::new(&url);
    let (old, records) = alice_runs().await;
    let (client, driver) = plain_client(&url).await;
    earlier_schema(&client, schema.name(), 4).await;
    for c in &records {
        insert_command(&client, c).await;
    }
    let (indexes, _) = commands_layout(&client).await;
    assert!(
        indexes.contains(&"commands_queued".to_owned()),
        "{indexes:?}"
    );

    let store = schema.store().await.expect("connect and upgrade");
    let (indexes, options) = commands_layout(&client).await;
    assert_eq!(
        indexes,
        ["commands_finished", "commands_open", "commands_pkey"],
        "the indexes that read `status` are gone"
    );
    assert_eq!(options, ["fillfactor=50"]);

    // The queued run is handed out, the running one found by its device
    // and by the lease sweep (it has no lease yet), the finished one by
    // neither.
    let (queued, running) = (&records[0], &records[1]);
    let handed = store
        .queued_commands(&queued.owner, &queued.project, &queued.device, 10)
        .await
        .expect("queued");
    assert_eq!(handed.iter().map(|c| c.id).collect::<Vec<_>>(), [queued.id]);
    let on_device = store
        .running_commands(&running.owner, &running.device, 10)
        .await
        .expect("running");
    assert_eq!(
        on_device.iter().map(|c| c.id).collect::<Vec<_>>(),
        [running.id]
    );
    let lapsed = store
        .lapsed_commands(old.clock.now(), 10)
        .await
        .expect("lapsed");
    assert_eq!(
        lapsed.iter().map(|c| c.id).collect::<Vec<_>>(),
        [running.id]
    );

    // A start changes only columns that no index reads: a HOT update.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .execute(
            "UPDATE commands SET status = 'running', lease_expires_at = 1,
                revision = revision + 1, record = record WHERE id = $1",
            &[queued.id.as_uuid()],
        )
        .await
        .expect("start");
    let hot: i64 = client
        .query_one(
            "SELECT pg_stat_get_xact_tuples_hot_updated('commands'::regclass)",
            &[],
        )
        .await
        .expect("hot")
        .get(0);
    client.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(hot, 1, "the start is a HOT update");
    drop(client);
    let _ = driver.await;
}
