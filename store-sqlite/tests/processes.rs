//! Several OS processes on one database file, and processes killed with
//! SIGKILL in the middle of writing.
//!
//! The children are this test binary itself, re-run with `--exact <child
//! test>` and an environment variable that switches the child test from a
//! no-op into its role. Children report each acknowledged write as a line on
//! stdout; the parent checks the file against those lines. Nothing sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use futures::executor::block_on;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::{AgentId, CommandId, DeviceId, OwnerId};
use graph_relay_core::outbox::{Outbox, OutboxItem, RelayReport};
use graph_relay_core::prelude::{Agent, Device, Queue, QueueConfig, RandomIds, SystemClock};
use graph_relay_core::queue::{StartError, SyncRequest};
use graph_relay_core::store::Store;
use graph_relay_core::testkit::{completed, exec, meta, p1, run_args};
use graph_relay_store_sqlite::{SqliteOutbox, SqliteStore};
use serde_json::json;

/// Selects a child role; unset in a normal test run.
const ROLE: &str = "GRAPH_RELAY_SQLITE_CHILD";
const DB: &str = "GRAPH_RELAY_SQLITE_DB";
const OUTBOX: &str = "GRAPH_RELAY_SQLITE_OUTBOX";
const TAG: &str = "GRAPH_RELAY_SQLITE_TAG";
const COUNT: &str = "GRAPH_RELAY_SQLITE_COUNT";

fn owner() -> OwnerId {
    OwnerId::parse("alice").expect("owner")
}

fn agent(tag: &str) -> Agent {
    Agent::new(
        AgentId::parse(&format!("agent-{tag}")).expect("agent"),
        owner(),
        [p1()],
    )
}

fn device() -> Device {
    Device::new(DeviceId::parse("desktop").expect("device"), owner())
}

fn queue_over(store: Arc<dyn Store>) -> Queue {
    Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    )
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a child"))
}

/// Re-runs this binary as a child in `role`.
fn spawn_child(test: &str, vars: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Every complete line a child printed, up to EOF (a line cut by SIGKILL
/// has no newline and was never acknowledged).
fn read_lines(child: &mut Child, mut stop_after: Option<usize>) -> Vec<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line.ends_with('\n') => {
                if line.starts_with("ACK ") {
                    lines.push(line.trim_end().to_owned());
                    if stop_after == Some(lines.len()) {
                        // SIGKILL: the child dies wherever it is.
                        child.kill().expect("kill child");
                        stop_after = None;
                    }
                }
            }
            Ok(_) => break,
        }
    }
    lines
}

// ----- two processes contending --------------------------------------------

/// Child role: queue `COUNT` commands as agent `TAG` and start every queued
/// command of the shared device that it can, as fast as it can.
#[test]
fn child_contender() {
    if std::env::var(ROLE).as_deref() != Ok("contend") {
        return;
    }
    let tag = env(TAG);
    let count: usize = env(COUNT).parse().expect("count");
    let store = SqliteStore::open(env(DB)).expect("child opens the shared file");
    let queue = queue_over(Arc::new(store));
    let (me, desk) = (agent(&tag), device());
    let request = SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
        restarted: false,
        running: None,
    };
    block_on(queue.sync(&desk, &request)).expect("first sync");
    let mut queued = 0;
    loop {
        if queued < count {
            let key = format!("contend-{tag}-{queued:06}");
            let ticket = block_on(queue.run_graph_session(&me, run_args(1, &key, json!({}))))
                .expect("run_graph_session");
            println!("ACK QUEUED {}", ticket.command.id);
            queued += 1;
        }
        let commands = block_on(queue.sync(&desk, &request))
            .expect("sync")
            .commands;
        if commands.is_empty() && queued == count {
            break;
        }
        for c in commands {
            let execution = exec(&format!("{tag}-{}", c.id));
            match block_on(queue.start(&desk, &c.id, &execution)) {
                Ok(started) if started.execution_id.as_ref() == Some(&execution) => {
                    println!("ACK STARTED {} {}", c.id, execution);
                }
                Ok(other) => panic!("start returned another execution: {other:?}"),
                // The other process started it first.
                Err(StartError::Refused(_)) => {}
                Err(e) => panic!("start failed: {e}"),
            }
        }
    }
}

#[test]
fn two_processes_start_every_command_exactly_once() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("shared.sqlite");
    let db = path.to_str().expect("utf-8 path");
    let count = "250";
    // Both children create, migrate and use the file at the same time.
    let mut children: Vec<(&str, Child)> = ["a", "b"]
        .into_iter()
        .map(|tag| {
            let vars = [(ROLE, "contend"), (DB, db), (TAG, tag), (COUNT, count)];
            (tag, spawn_child("child_contender", &vars))
        })
        .collect();
    let mut queued = BTreeSet::new();
    let mut started: BTreeMap<CommandId, String> = BTreeMap::new();
    for (tag, child) in &mut children {
        for line in read_lines(child, None) {
            let words: Vec<&str> = line.split(' ').collect();
            let id = CommandId::parse(words[2]).expect("id");
            match words[1] {
                "QUEUED" => assert!(queued.insert(id), "queued twice: {id}"),
                "STARTED" => {
                    assert!(words[3].starts_with(*tag));
                    if let Some(first) = started.insert(id, words[3].to_owned()) {
                        panic!("{id} started twice: by {first} and by {}", words[3]);
                    }
                }
                other => panic!("unknown line {other}"),
            }
        }
        let status = child.wait().expect("wait");
        assert!(status.success(), "child {tag} failed: {status}");
    }
    let by_a = started.values().filter(|e| e.starts_with('a')).count();
    eprintln!("started by a: {by_a}, by b: {}", started.len() - by_a);
    assert_eq!(
        queued.len(),
        2 * 250,
        "every run_graph_session was acknowledged"
    );
    assert_eq!(
        started.keys().copied().collect::<BTreeSet<_>>(),
        queued,
        "every queued command was started, none was lost"
    );
    // The file agrees with what the children were told.
    let store = SqliteStore::open(&path).expect("reopen");
    for (id, execution) in &started {
        let c = block_on(store.command_for_device(&device().owner, &device().id, id))
            .expect("read")
            .unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(c.status, CommandStatus::Running);
        assert_eq!(
            c.execution_id.as_ref().map(|e| e.as_str()),
            Some(&execution[..])
        );
    }
    assert_eq!(block_on(store.command_count()).expect("count"), 2 * 250);
}

// ----- SIGKILL while writing ------------------------------------------------

/// Child role: write commands, transitions and outbox items until killed,
/// acknowledging each write after it returned.
#[test]
fn child_opener() {
    if std::env::var(ROLE).as_deref() != Ok("open") {
        return;
    }
    let _store = SqliteStore::open(env(DB)).expect("open store");
    let _outbox = SqliteOutbox::open(env(OUTBOX)).expect("open outbox");
    println!("ACK OPENED");
    std::thread::sleep(std::time::Duration::from_secs(30));
}

/// A kill while a process creates its files (the journal switch of a new
/// file included) never leaves a file the next open refuses.
#[test]
fn sigkill_while_creating_the_files_never_spoils_them() {
    let mut rng = Rng(std::env::var("GRAPH_RELAY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id())));
    let mut during_open = 0;
    for trial in 0..120 {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("queue.sqlite");
        let ob = dir.path().join("outbox.sqlite");
        let vars = [
            (ROLE, "open"),
            (DB, db.to_str().expect("utf-8")),
            (OUTBOX, ob.to_str().expect("utf-8")),
        ];
        let mut child = spawn_child("child_opener", &vars);
        std::thread::sleep(std::time::Duration::from_micros(rng.below(25_000)));
        child.kill().expect("kill");
        let opened = read_lines(&mut child, None);
        child.wait().expect("wait");
        if opened.is_empty() {
            during_open += 1;
        }
        SqliteStore::open(&db).unwrap_or_else(|e| panic!("trial {trial}: store: {e}"));
        SqliteOutbox::open(&ob).unwrap_or_else(|e| panic!("trial {trial}: outbox: {e}"));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".creating-"))
            .collect();
        // A temporary file may remain only from a kill in the middle of building it.
        assert!(leftovers.len() <= 8, "{leftovers:?}");
    }
    eprintln!("{during_open} of 120 kills landed before both files were open");
}

#[test]
fn child_crash_writer() {
    if std::env::var(ROLE).as_deref() != Ok("crash") {
        return;
    }
    let tag = env(TAG);
    let store = SqliteStore::open(env(DB)).expect("open store");
    let outbox = SqliteOutbox::open(env(OUTBOX)).expect("open outbox");
    let queue = queue_over(Arc::new(store));
    let (me, desk) = (agent(&tag), device());
    let request = SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
        restarted: false,
        running: None,
    };
    block_on(queue.sync(&desk, &request)).expect("sync");
    // Bounded, in case the parent dies without killing us.
    for i in 0..100_000u64 {
        let key = format!("crash-{tag}-{i:06}");
        let cmd = block_on(queue.run_graph_session(&me, run_args(1, &key, json!({"i": i}))))
            .expect("run")
            .command;
        println!("ACK QUEUED {}", cmd.id);
        let execution = format!("x-{tag}-{i}");
        block_on(queue.start(&desk, &cmd.id, &exec(&execution))).expect("start");
        println!("ACK STARTED {} {execution}", cmd.id);
        let envelope = completed(&execution, json!({"i": i}));
        block_on(queue.complete(&desk, &cmd.id, &envelope)).expect("complete");
        println!("ACK COMPLETED {} {execution} {i}", cmd.id);
        let item = OutboxItem {
            command: cmd.id,
            report: RelayReport::Completion { envelope },
            stored_at: queue.now(),
            attempts: 0,
        };
        block_on(outbox.put(&item)).expect("outbox put");
        println!("ACK OUTBOX {} {execution} {i}", cmd.id);
        if i % 3 == 0 {
            block_on(outbox.remove(&cmd.id)).expect("outbox remove");
            println!("ACK REMOVED {}", cmd.id);
        }
    }
}

/// A small deterministic generator (splitmix64) for the kill points.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

#[test]
fn sigkill_loses_no_acknowledged_write() {
    let seed = std::env::var("GRAPH_RELAY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(7)
        });
    eprintln!("kill points from GRAPH_RELAY_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("queue.sqlite");
    let ob = dir.path().join("outbox.sqlite");
    // The first kill lands while the child is still opening (and perhaps
    // creating) the files; later ones anywhere in the write stream. All
    // rounds share the files, so each round also recovers the previous crash.
    let kill_points = [
        0,
        1 + rng.below(20),
        1 + rng.below(150),
        1 + rng.below(150),
        1 + rng.below(400),
    ];
    let mut acked = Vec::new();
    for (round, kill_at) in kill_points.into_iter().enumerate() {
        let tag = format!("r{round}");
        let vars = [
            (ROLE, "crash"),
            (DB, db.to_str().expect("utf-8")),
            (OUTBOX, ob.to_str().expect("utf-8")),
            (TAG, tag.as_str()),
        ];
        let mut child = spawn_child("child_crash_writer", &vars);
        let lines = if kill_at == 0 {
            child.kill().expect("kill at once");
            read_lines(&mut child, None)
        } else {
            read_lines(&mut child, Some(kill_at as usize))
        };
        let status = child.wait().expect("wait");
        assert!(
            !status.success(),
            "round {round}: the child was killed, not finished"
        );
        eprintln!(
            "round {round}: killed after {} acknowledged writes",
            lines.len()
        );
        acked.extend(lines.into_iter().map(|l| (tag.clone(), l)));
        check_acknowledged(&db, &ob, &acked);
    }
}

/// Reopens the files and checks every acknowledged write.
fn check_acknowledged(db: &Path, ob: &Path, acked: &[(String, String)]) {
    let store = SqliteStore::open(db).expect("reopen after SIGKILL");
    let outbox = SqliteOutbox::open(ob).expect("reopen the outbox after SIGKILL");
    let pending: BTreeMap<CommandId, OutboxItem> = block_on(outbox.pending())
        .expect("pending")
        .into_iter()
        .map(|i| (i.command, i))
        .collect();
    let mut in_outbox = BTreeSet::new();
    let mut removed = BTreeSet::new();
    // The last item each round put: the child may have removed it (every
    // third one) after the parent stopped reading, before the kill.
    let mut last_put: BTreeMap<&str, (CommandId, u64)> = BTreeMap::new();
    for (tag, line) in acked {
        let words: Vec<&str> = line.split(' ').collect();
        let id = CommandId::parse(words[2]).expect("id");
        let c = block_on(store.command_for_agent(&agent(tag).owner, &agent(tag).id, &id))
            .expect("read")
            .unwrap_or_else(|| panic!("acknowledged command {id} is missing"));
        match words[1] {
            "QUEUED" => {}
            "STARTED" => {
                assert!(matches!(
                    c.status,
                    CommandStatus::Running | CommandStatus::Completed
                ));
                assert_eq!(c.execution_id.as_ref().map(|e| e.as_str()), Some(words[3]));
            }
            "COMPLETED" => {
                let i: u64 = words[4].parse().expect("i");
                assert_eq!(c.status, CommandStatus::Completed);
                assert_eq!(c.completion, Some(completed(words[3], json!({"i": i}))));
            }
            "OUTBOX" => {
                in_outbox.insert(id);
                let i: u64 = words[4].parse().expect("i");
                last_put.insert(tag.as_str(), (id, i));
            }
            "REMOVED" => {
                in_outbox.remove(&id);
                removed.insert(id);
            }
            other => panic!("unknown line {other}"),
        }
    }
    let may_be_gone: BTreeSet<CommandId> = last_put
        .values()
        .filter(|(_, i)| i % 3 == 0)
        .map(|(id, _)| *id)
        .collect();
    for id in &in_outbox {
        match pending.get(id) {
            Some(item) => assert!(matches!(item.report, RelayReport::Completion { .. })),
            None => assert!(
                may_be_gone.contains(id),
                "acknowledged outbox item {id} is missing"
            ),
        }
    }
    // Removed items stay removed. Other pending items are puts whose
    // acknowledgement the kill cut off: each must be a completion of a
    // command the store holds as completed with the same envelope.
    for (id, item) in &pending {
        assert!(!removed.contains(id), "removed outbox item {id} came back");
        if in_outbox.contains(id) {
            continue;
        }
        let RelayReport::Completion { envelope } = &item.report else {
            panic!("unexpected outbox item {id}: {item:?}");
        };
        let c = acked
            .iter()
            .map(|(tag, _)| tag)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .find_map(|tag| {
                block_on(store.command_for_agent(&agent(tag).owner, &agent(tag).id, id))
                    .expect("read")
            })
            .unwrap_or_else(|| panic!("outbox item {id} names no command"));
        assert_eq!(c.status, CommandStatus::Completed);
        assert_eq!(c.completion.as_ref(), Some(envelope));
    }
    drop((store, outbox));
    let conn = rusqlite::Connection::open(db).expect("raw open");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
}
