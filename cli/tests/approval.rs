//! Local approval end to end over real sockets: `graph-relay serve` and
//! `graph-relay worker` as processes, a Graph with `approval = "always"`
//! whose `approval_command` is a shell script waiting for a decision file
//! the test writes, and an agent reading `get_graph_run` over HTTP MCP.
//! Every wait polls with a deadline; nothing sleeps to synchronise.

mod common;

use std::time::{Duration, Instant};

use common::{Proc, Relay};
use serde_json::{Value, json};

const AGENT_TOKEN: &str = "gra_approval_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_approval_device_token_0123456789abcdef";
const GS: &str = "gs_dddddddddddddddddddddddddddddddd";
const DEADLINE: Duration = Duration::from_secs(30);

/// The Graph: records that it ran.
const GRAPH: &str =
    "cat > /dev/null\necho ran > \"ran.$GRAPH_RELAY_COMMAND_ID\"\necho '{\"ran\": true}'\n";

/// The hook: says it was asked (with its pid), then waits for
/// `decision.<command id>`: `approve` approves, any other text declines
/// with that text as the reason.
const HOOK: &str = r#"cat > /dev/null
id="$GRAPH_RELAY_COMMAND_ID"
echo $$ > "asked.$id.tmp" && mv "asked.$id.tmp" "asked.$id"
while [ ! -f "decision.$id" ]; do sleep 0.05; done
d=$(cat "decision.$id")
[ "$d" = approve ] && exit 0
echo "$d"
exit 1
"#;

struct Env {
    relay: Relay,
    url: String,
    _server: Proc,
    worker: Proc,
}

impl Env {
    /// serve + worker, the Graph needing approval for at most `timeout` s.
    fn new(timeout: u64) -> Self {
        let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
        relay.script("g", GRAPH);
        std::fs::write(relay.path("ask.sh"), HOOK).expect("hook");
        write_graphs(&relay, timeout, true);
        let (server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);
        let worker = relay.worker(&url, "outbox.db", "2", &[]);
        worker.wait_line("sync: project p1");
        Self {
            relay,
            url,
            _server: server,
            worker,
        }
    }

    async fn run(&self, key: &str) -> String {
        self.relay.run(&self.url, GS, key, json!({"n": 1})).await
    }

    /// Waits until the hook was asked about `id`; returns its pid.
    fn asked(&self, id: &str) -> i32 {
        self.relay
            .wait_file(&format!("asked.{id}"))
            .trim()
            .parse()
            .expect("pid")
    }

    fn decide(&self, id: &str, decision: &str) {
        let tmp = self.relay.path(&format!("decision.{id}.tmp"));
        std::fs::write(&tmp, decision).expect("decision");
        std::fs::rename(tmp, self.relay.path(&format!("decision.{id}"))).expect("decision");
    }

    fn ran(&self, id: &str) -> bool {
        self.relay.path(&format!("ran.{id}")).exists()
    }

    async fn wait(&self, id: &str, status: &str) -> Value {
        self.relay.wait_status(&self.url, id, status).await
    }
}

/// `graphs.toml` with the one Graph, shared to `p1` or not (`p1` stays enabled).
fn write_graphs(relay: &Relay, timeout: u64, shared: bool) {
    let projects: &[&str] = if shared { &["p1"] } else { &[] };
    relay.write_graphs(
        &[(GS, "g", projects)],
        &format!(
            "approval = \"always\"\napproval_timeout_seconds = {timeout}\napproval_command = [\"/bin/sh\", \"ask.sh\"]\n"
        ),
    );
}

/// Gone, or a zombie nobody reaped yet.
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !gone(pid) {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_waits_for_approval_then_runs_and_a_declined_one_never_runs() {
    let env = Env::new(60);
    let id = env.run("approval-key-yes").await;
    env.asked(&id);
    // Waiting: running on the server, with the progress saying why; nothing ran.
    let deadline = Instant::now() + DEADLINE;
    let waiting = loop {
        let run = env.relay.get(&env.url, &id).await;
        if run["progress"]["message"] == "Waiting for the owner's approval on the desktop" {
            break run;
        }
        assert!(Instant::now() < deadline, "{run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(waiting["status"], "running", "{waiting}");
    assert!(!env.ran(&id));
    env.decide(&id, "approve");
    let run = env.wait(&id, "completed").await;
    assert_eq!(run["result"], json!({"ran": true}));
    assert!(env.ran(&id));
    env.worker
        .wait_line(&format!("approved {id} on the desktop"));

    let id = env.run("approval-key-no").await;
    let hook = env.asked(&id);
    env.decide(&id, "too expensive today");
    let run = env.wait(&id, "failed").await;
    assert_eq!(
        run["error"], "Declined on the desktop: too expensive today",
        "{run}"
    );
    wait_gone(hook, "the hook");
    assert!(!env.ran(&id), "nothing runs that was not approved");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_nobody_approves_in_time_fails_and_its_prompt_is_withdrawn() {
    let env = Env::new(2);
    let id = env.run("approval-key-late").await;
    let hook = env.asked(&id);
    let run = env.wait(&id, "failed").await;
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("Not approved on the desktop in time") && error.contains("2 s"),
        "{run}"
    );
    wait_gone(hook, "the withdrawn hook");
    // An answer after the end changes nothing.
    env.decide(&id, "approve");
    env.worker.wait_line(&format!("not approved in time: {id}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!env.ran(&id));
    assert_eq!(env.relay.get(&env.url, &id).await["status"], "failed");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_cancelling_a_waiting_run_cancels_it_and_withdraws_the_prompt() {
    let env = Env::new(60);
    let id = env.run("approval-key-cancel").await;
    let hook = env.asked(&id);
    let reply = env.relay.cancel(&env.url, &id).await;
    assert_eq!(reply["isError"], false, "{reply}");
    env.wait(&id, "cancelled").await;
    wait_gone(hook, "the withdrawn hook");
    assert!(!env.ran(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graph_unshared_while_its_run_waits_is_not_run_even_when_approved() {
    let env = Env::new(60);
    let id = env.run("approval-key-unshare").await;
    env.asked(&id);
    write_graphs(&env.relay, 60, false);
    env.worker.wait_line("graphs: reloaded");
    env.decide(&id, "approve");
    let run = env.wait(&id, "cancelled").await;
    assert_eq!(
        run["error"], "Graph session is no longer shared with this project",
        "{run}"
    );
    assert!(
        !env.ran(&id),
        "the consent re-check runs right before the start"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_stopped_while_a_run_waits_gives_it_up_and_ends_its_prompt() {
    let Env {
        relay,
        url,
        _server,
        worker,
    } = Env::new(60);
    let id = relay.run(&url, GS, "approval-key-stop", json!({})).await;
    let hook = relay
        .wait_file(&format!("asked.{id}"))
        .trim()
        .parse()
        .expect("pid");
    let lines = worker.interrupt();
    assert!(
        lines.iter().any(|l| *l == format!("delivered {id}")),
        "reported before the worker exits: {lines:?}"
    );
    let run = relay.wait_status(&url, &id, "failed").await;
    assert!(
        run["error"].as_str().is_some_and(
            |e| e.starts_with("The desktop's worker stopped before the owner approved the run")
        ),
        "{run}"
    );
    wait_gone(hook, "the hook of a stopped worker");
    assert!(!relay.path(&format!("ran.{id}")).exists());
}
