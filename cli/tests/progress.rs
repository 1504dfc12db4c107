//! Progress end to end over real sockets: `graph-relay serve` and
//! `graph-relay worker` as processes, Graphs as shell scripts writing JSON
//! lines to `GRAPH_RELAY_PROGRESS_FD`, an agent reading `get_graph_run` and
//! `tasks/get` over HTTP MCP.
//!
//! `a_thousand_progress_lines_a_second_cost_at_most_one_write_a_second` is
//! also the measurement of what progress costs the server; it prints the
//! figure:
//!
//! ```text
//! cargo test --release -p graph-relay --test progress -- --nocapture thousand
//! ```

mod common;

use std::time::{Duration, Instant};

use common::Relay;
use graph_relay_core::ids::{CommandId, DeviceId, OwnerId};
use graph_relay_core::store::Store;
use graph_relay_store_sqlite::SqliteStore;
use serde_json::{Value, json};

const AGENT_TOKEN: &str = "gra_progress_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_progress_device_token_0123456789abcdef";
const GS: &str = "gs_cccccccccccccccccccccccccccccccc";
const DEADLINE: Duration = Duration::from_secs(60);

fn env() -> Relay {
    let env = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    env.write_graphs(&[(GS, "p", &["p1"])], "timeout_seconds = 120\n");
    env
}

/// `tasks/get` for `id` (the tasks extension declared); returns the task.
async fn tasks_get(env: &Relay, url: &str, id: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {
    "taskId": id,
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }}});
    let reply: Value = env
        .http
        .post(format!("{url}/mcp"))
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tasks/get")
        .header("mcp-name", id)
        .json(&body)
        .send()
        .await
        .expect("HTTP answer")
        .json()
        .await
        .expect("JSON body");
    reply["result"].clone()
}

/// Appends `text` to `seen` unless it repeats the last entry.
fn note(seen: &mut Vec<String>, text: Option<&str>) {
    if let Some(text) = text
        && seen.last().map(String::as_str) != Some(text)
    {
        seen.push(text.to_owned());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_script_reports_five_steps_and_the_agent_sees_them_in_order() {
    let env = env();
    // Steps 1.5 s apart: each is posted and written (at most one a second).
    env.script(
        "p",
        r#"cat > /dev/null
for i in 1 2 3 4 5; do
  printf '{"message": "step %s of 5", "percent": %s}\n' "$i" "$((i * 20))" >&"$GRAPH_RELAY_PROGRESS_FD"
  sleep 1.5
done
echo '{"done": true}'
"#,
    );
    let (_server, url) = env.serve("127.0.0.1:0", &["--db", "queue.db"]);
    let worker = env.worker(&url, "outbox.db", "2", &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS, "progress-key-five", json!({})).await;

    let (mut messages, mut percents, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    let deadline = Instant::now() + DEADLINE;
    let run = loop {
        let run = env.get(&url, &id).await;
        note(&mut messages, run["progress"]["message"].as_str());
        if let Some(p) = run["progress"]["percent"].as_f64() {
            note(&mut percents, Some(&p.to_string()));
        }
        let task = tasks_get(&env, &url, &id).await;
        if task["status"] == "working" {
            note(&mut statuses, task["statusMessage"].as_str());
        }
        if run["status"] == "completed" {
            break run;
        }
        assert!(Instant::now() < deadline, "never completed: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let expected: Vec<String> = (1..=5).map(|i| format!("step {i} of 5")).collect();
    assert_eq!(messages, expected, "get_graph_run, in order");
    assert_eq!(percents, ["20", "40", "60", "80", "100"]);
    let with_progress: Vec<&String> = statuses.iter().filter(|s| s.contains("step")).collect();
    let expected_status: Vec<String> = (1..=5)
        .map(|i| {
            format!(
                "Running on the owner's desktop: step {i} of 5 ({}%).",
                i * 20
            )
        })
        .collect();
    assert_eq!(
        with_progress,
        expected_status.iter().collect::<Vec<_>>(),
        "tasks/get statusMessage, in order: {statuses:?}"
    );
    // The last report stays after the end; the result is the script's.
    assert_eq!(run["progress"]["message"], "step 5 of 5");
    assert_eq!(run["result"], json!({"done": true}));
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_lines_are_ignored_and_logged_once_and_a_script_may_close_the_descriptor() {
    let env = env();
    env.script(
        "p",
        r#"cat > /dev/null
fd="$GRAPH_RELAY_PROGRESS_FD"
echo 'not json' >&"$fd"
echo '{"percent": 250}' >&"$fd"
echo '{"message": "half way", "percent": 50}' >&"$fd"
echo '{"pct": 3}' >&"$fd"
while [ ! -e go ]; do sleep 0.05; done
exec 3>&-
echo '{"closed": true}'
"#,
    );
    let (_server, url) = env.serve("127.0.0.1:0", &["--db", "queue.db"]);
    let worker = env.worker(&url, "outbox.db", "2", &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS, "progress-key-invalid", json!({})).await;
    // The valid line reaches the agent while the run runs; only then does
    // the script go on (a report still in flight when the run ends may be
    // overtaken by the result, and is then refused: progress is the
    // latest report of a running run).
    let deadline = Instant::now() + DEADLINE;
    loop {
        let run = env.get(&url, &id).await;
        if run["progress"]["message"] == "half way" {
            assert_eq!(run["status"], "running", "{run}");
            break;
        }
        assert!(Instant::now() < deadline, "no progress seen: {run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(env.path("go"), b"").expect("the go file");
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"], json!({"closed": true}));
    assert_eq!(run["progress"]["message"], "half way", "{run}");
    worker.wait_line(&format!("finished {id}: completed"));
    assert_eq!(
        worker.count("ignoring an invalid progress line"),
        1,
        "logged once per run"
    );

    // A script that never touches the descriptor runs as before.
    env.script("p", "cat > /dev/null\necho plain\n");
    let id = env.run(&url, GS, "progress-key-plain", json!({})).await;
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"], "plain");
    assert!(run.get("progress").is_none(), "{run}");
}

/// The measurement of issue 16: a Graph writing 1,000 progress lines a
/// second for five seconds. The worker posts at most one report a second,
/// and the server writes the command at most once a second for them.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_progress_lines_a_second_cost_at_most_one_write_a_second() {
    let env = env();
    // 50 bursts of 100 lines, 0.1 s apart: about 1,000 lines a second.
    env.script(
        "p",
        r#"cat > /dev/null
exec 3>&"$GRAPH_RELAY_PROGRESS_FD"
start=$(date +%s.%N)
b=0
while [ "$b" -lt 50 ]; do
  l=0
  while [ "$l" -lt 100 ]; do
    printf '{"message": "burst %s line %s", "percent": %s}\n' "$b" "$l" "$((b * 2))" >&3
    l=$((l + 1))
  done
  b=$((b + 1))
  sleep 0.1
done
end=$(date +%s.%N)
printf '{"lines": 5000, "start": %s, "end": %s}\n' "$start" "$end"
"#,
    );
    let (server, url) = env.serve("127.0.0.1:0", &["--db", "queue.db"]);
    let worker = env.worker(&url, "outbox.db", "2", &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS, "progress-key-thousand", json!({})).await;
    let run = env.wait_status(&url, &id, "completed").await;
    let seconds = run["result"]["end"].as_f64().expect("end")
        - run["result"]["start"].as_f64().expect("start");
    let lines = run["result"]["lines"].as_u64().expect("lines");
    worker.interrupt();
    server.interrupt();

    // Every write of the command bumps its revision: the start, the
    // completion, lease renewals (none: the lease is 60 s) and progress.
    let store = SqliteStore::open(env.path("queue.db")).expect("queue.db");
    let command = store
        .command_for_device(
            &OwnerId::parse("dev").expect("owner"),
            &DeviceId::parse("desk").expect("device"),
            &CommandId::parse(&id).expect("id"),
        )
        .await
        .expect("read")
        .expect("the command");
    let progress_writes = command.revision - 2;
    println!(
        "progress: {lines} lines in {seconds:.2} s ({:.0} lines/s) -> {} writes of the command \
         (revision {}: start + completion + {progress_writes} progress)",
        lines as f64 / seconds,
        command.revision,
        command.revision,
    );
    assert!(seconds >= 4.5, "the script wrote for {seconds} s");
    assert!(
        progress_writes >= 2,
        "progress was written: {progress_writes}"
    );
    assert!(
        (progress_writes as f64) <= seconds.ceil() + 1.0,
        "{progress_writes} progress writes in {seconds:.2} s: more than one a second"
    );
}
