//! `graph-relay status` on a live SQLite database: a desktop online and
//! running a run, one that went quiet ten minutes ago, and a run queued for
//! the quiet one; as `--json` and as tables. The database is filled through
//! the real queue (with a clock set back for the quiet desktop) and stays
//! open, as a running server would keep it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use graph_relay_core::prelude::*;
use serde_json::{Map, Value};

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");
const GS_OLD: &str = "gs_00000000000000000000000000000001";
const GS_NEW: &str = "gs_00000000000000000000000000000002";

fn meta(id: &str, name: &str) -> SessionMeta {
    SessionMeta {
        graph_session_id: GraphSessionId::parse(id).expect("id"),
        name: name.into(),
        description: "".into(),
        slug: name.to_lowercase().into(),
        version: "1".into(),
        status: "ready".into(),
    }
}

fn sync(project: &ProjectId, session: SessionMeta, long_poll: bool) -> SyncRequest {
    SyncRequest {
        project: project.clone(),
        sessions: vec![session],
        long_poll,
        restarted: false,
        running: None,
    }
}

fn status(db: &std::path::Path, json: bool) -> String {
    let mut command = Command::new(BIN);
    command.args(["status", "--db"]).arg(db);
    if json {
        command.arg("--json");
    }
    let out = command.output().expect("run graph-relay status");
    assert!(
        out.status.success(),
        "status exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn status_shows_an_online_desktop_an_offline_one_and_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("graph-relay.db");
    let store = Arc::new(graph_relay_store_sqlite::SqliteStore::open(&db).expect("open"));
    let now = SystemClock.now();
    let clock = Arc::new(ManualClock::new(now.minus(Duration::from_secs(600))));
    let queue = Queue::new(
        store.clone(),
        clock.clone(),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let owner = OwnerId::parse("dev").expect("owner");
    let p1 = ProjectId::parse("p1").expect("project");
    let quiet = Device::new(DeviceId::parse("old-desk").expect("id"), owner.clone());
    let desk = Device::new(DeviceId::parse("desk").expect("id"), owner.clone());
    let agent = Agent::new(
        AgentId::parse("assistant").expect("id"),
        owner.clone(),
        [p1.clone()],
    );
    let run = |gs: &str, key: &str| RunArgs {
        graph_session_id: GraphSessionId::parse(gs).expect("gs"),
        arguments: Map::new(),
        idempotency_key: IdempotencyKey::parse(key).expect("key"),
    };
    futures::executor::block_on(async {
        // Ten minutes ago: the old desktop shares a Graph, in interval mode.
        queue
            .sync(&quiet, &sync(&p1, meta(GS_OLD, "Old"), false))
            .await
            .expect("sync");
        // Now: the other desktop long-polls and runs a run.
        clock.set(now);
        queue
            .sync(&desk, &sync(&p1, meta(GS_NEW, "New"), true))
            .await
            .expect("sync");
        let queued = queue
            .run_graph_session(&agent, run(GS_OLD, "status-key-old"))
            .await
            .expect("run");
        let ticket = queue
            .run_graph_session(&agent, run(GS_NEW, "status-key-new"))
            .await
            .expect("run");
        clock.advance(Duration::from_millis(1500));
        let synced = queue
            .sync(&desk, &sync(&p1, meta(GS_NEW, "New"), true))
            .await
            .expect("sync");
        assert_eq!(synced.commands.len(), 1);
        queue
            .start(
                &desk,
                &ticket.command.id,
                &ExecutionId::parse("exec-1").expect("execution"),
            )
            .await
            .expect("start");
        let queued_id = queued.command.id.to_string();

        let json: Value = serde_json::from_str(&status(&db, true)).expect("JSON");
        let desktops = json["desktops"].as_array().expect("desktops");
        assert_eq!(desktops.len(), 2, "{json}");
        let find = |name: &str| {
            desktops
                .iter()
                .find(|d| d["desktop"] == name)
                .unwrap_or_else(|| panic!("no {name}: {json}"))
        };
        let online = find("desk");
        assert_eq!(online["owner"], "dev");
        assert_eq!(online["online"], true, "{json}");
        assert_eq!(online["mode"], "long-poll");
        assert_eq!(online["running"], 1);
        let offline = find("old-desk");
        assert_eq!(offline["online"], false, "{json}");
        assert_eq!(offline["mode"], "interval");
        assert_eq!(offline["running"], 0);
        assert!(offline["last_seen_ms_ago"].as_u64().expect("ms") >= 590_000);

        assert_eq!(json["shared"][0]["project"], "p1");
        assert_eq!(json["shared"][0]["sessions"], 2);
        assert_eq!(json["shared"][0]["desktops"], 2);

        assert_eq!(json["queue"]["depth"], 1);
        let oldest = &json["queue"]["oldest_first"][0];
        assert_eq!(oldest["command_id"], queued_id.as_str(), "{json}");
        assert_eq!(oldest["desktop"], "old-desk");
        assert!(oldest["age_ms"].as_u64().expect("age") < 60_000);

        assert_eq!(json["last_hour"]["runs_by_status"]["queued"], 1, "{json}");
        assert_eq!(json["last_hour"]["runs_by_status"]["running"], 1, "{json}");
        assert_eq!(json["last_hour"]["pickups"], 1);
        let p50 = json["last_hour"]["pickup_p50_ms"].as_u64().expect("p50");
        assert!((1500..3000).contains(&p50), "{json}");

        let text = status(&db, false);
        for needle in [
            "Desktops (2)",
            "online, running 1",
            "offline",
            "dev/p1: 2 session(s) from 2 desktop(s)",
            "Queue (1 queued, oldest first)",
            &queued_id,
            "queued 1, running 1",
            "p50 1.",
        ] {
            assert!(text.contains(needle), "no `{needle}` in:\n{text}");
        }
    });
}

#[test]
fn status_refuses_a_missing_database_without_creating_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("none.db");
    let out = Command::new(BIN)
        .args(["status", "--db"])
        .arg(&db)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot open"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!db.exists());
}
