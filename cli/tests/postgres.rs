//! Two `graph-relay serve --postgres` processes on one database (a schema of
//! its own per test) share one queue: an agent queues through A and a
//! worker long-polling B picks the run up at once (woken over
//! LISTEN/NOTIFY, not by its 25 s hold running out); a cancel sent through B
//! reaches a run started through A; an idempotent replay through B returns
//! A's command. Skipped (with a printed reason) without
//! `GRAPH_RELAY_POSTGRES_URL`.

mod common;

use std::ops::Deref;
use std::time::{Duration, Instant};

use common::{Proc, Relay};
use graph_relay_store_postgres::testing::{TestSchema, url};
use serde_json::json;

const AGENT_TOKEN: &str = "gra_pg_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_pg_device_token_0123456789abcdef";
const GS_QUICK: &str = "gs_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const GS_SLOW: &str = "gs_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const DEADLINE: Duration = Duration::from_secs(30);
/// A pickup or cancel that arrives within this went through a wake-up, not
/// a 25 s hold running out.
const PROMPT: Duration = Duration::from_secs(4);

struct Cluster(Relay);

impl Deref for Cluster {
    type Target = Relay;

    fn deref(&self) -> &Relay {
        &self.0
    }
}

impl Cluster {
    fn new() -> Self {
        let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
        relay.write_graphs(
            &[(GS_QUICK, "quick", &["p1"]), (GS_SLOW, "slow", &["p1"])],
            "timeout_seconds = 120\n",
        );
        relay.script(
            "quick",
            "args=$(cat)\nprintf '{\"got\": %s}\\n' \"$args\"\n",
        );
        relay.script("slow", "echo $$ > slow.pid\nexec sleep 300\n");
        Self(relay)
    }

    /// `serve --postgres` on a free port; returns it and its base URL.
    fn serve(&self, url: &str, schema: &str) -> (Proc, String) {
        self.0.serve(
            "127.0.0.1:0",
            &["--postgres", url, "--postgres-schema", schema],
        )
    }

    fn worker(&self, server: &str, outbox: &str) -> Proc {
        self.0.worker(server, outbox, "1", &[])
    }
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_database_share_the_queue_and_wake_each_other() {
    let url = url();
    let schema = TestSchema::new(&url);
    let cluster = Cluster::new();
    let (_a, a) = cluster.serve(&url, schema.name());
    let (_b, b) = cluster.serve(&url, schema.name());

    // A worker long-polls B; its first (empty) pass is held there.
    let worker = cluster.worker(&b, "outbox-b.db");
    worker.wait_line("sync: project p1");
    std::thread::sleep(Duration::from_millis(300));
    let queued_at = Instant::now();
    let id = cluster
        .run(&a, GS_QUICK, "pg-key-quick-1", json!({"n": 1}))
        .await;
    worker.wait_line(&format!("started {id}"));
    let pickup = queued_at.elapsed();
    assert!(
        pickup < PROMPT,
        "queued through A, picked up through B after {pickup:?}: a wake-up, not the hold, must answer"
    );
    let done = cluster.wait_status(&b, &id, "completed").await;
    assert_eq!(done["result"], json!({"got": {"n": 1}}));

    // The agent lost A's answer and retries through B: the same command.
    let replay = cluster
        .run(&b, GS_QUICK, "pg-key-quick-1", json!({"n": 1}))
        .await;
    assert_eq!(
        replay, id,
        "an idempotent replay through B returns A's command"
    );
    worker.interrupt();

    // Now the desktop talks to A: the run starts through A, and its held
    // control request on A learns of a cancel sent through B.
    let worker = cluster.worker(&a, "outbox-a.db");
    let slow = cluster.run(&b, GS_SLOW, "pg-key-slow-1", json!({})).await;
    worker.wait_line(&format!("started {slow}"));
    cluster.wait_status(&a, &slow, "running").await;
    let asked_at = Instant::now();
    let reply = cluster
        .call(&b, "cancel_graph_run", json!({"command_id": slow}))
        .await;
    assert_eq!(reply["isError"], false, "{reply}");
    worker.wait_line(&format!("cancelling {slow}"));
    let reached = asked_at.elapsed();
    assert!(
        reached < PROMPT,
        "cancel through B reached the run on A after {reached:?}"
    );
    let run = cluster.wait_status(&a, &slow, "cancelled").await;
    assert_eq!(run["cancel_requested"], true);
}
