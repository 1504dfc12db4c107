//! End to end over real sockets: `graph-relay serve` and `graph-relay worker`
//! as processes, an agent speaking HTTP MCP with a bearer token, Graphs as
//! shell scripts. Every wait polls with a deadline; nothing sleeps to synchronise.

mod common;

use std::ops::Deref;
use std::time::{Duration, Instant};

use common::{Proc, Relay};
use serde_json::json;

const AGENT_TOKEN: &str = "gra_e2e_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_e2e_device_token_0123456789abcdef";
const GS_A: &str = "gs_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const GS_B: &str = "gs_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const DEADLINE: Duration = Duration::from_secs(30);

/// One server + worker set-up in a temporary folder.
struct Env(Relay);

impl Deref for Env {
    type Target = Relay;

    fn deref(&self) -> &Relay {
        &self.0
    }
}

impl Env {
    fn new() -> Self {
        let env = Self(Relay::new(
            &[("assistant", AGENT_TOKEN)],
            DEVICE_TOKEN,
            DEADLINE,
        ));
        env.write_graphs(&[(GS_A, "a", &["p1"]), (GS_B, "b", &["p1"])]);
        env
    }

    /// Writes `graphs.toml`: each graph runs `<slug>.sh`, shared to the given projects.
    fn write_graphs(&self, graphs: &[(&str, &str, &[&str])]) {
        self.0.write_graphs(
            graphs,
            "timeout_seconds = 60\nenv = { GREETING = \"hello\" }\n",
        );
    }

    fn serve(&self, listen: &str) -> (Proc, String) {
        self.0.serve(listen, &["--db", "queue.db"])
    }

    fn worker(&self, url: &str, extra: &[&str]) -> Proc {
        self.0.worker(url, "outbox.db", "2", extra)
    }

    /// Runs a worker until its first pass synced the shared sessions, then stops it.
    fn share_once(&self, url: &str) {
        let worker = self.worker(url, &[]);
        worker.wait_line("sync: project p1");
        worker.interrupt();
    }
}

/// Gone, or a zombie nobody reaped yet: either way not running.
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

const ECHO: &str = r#"args=$(cat)
echo started > "$GRAPH_RELAY_COMMAND_ID.started"
printf '{"got": %s, "greeting": "%s"}\n' "$args" "$GREETING"
echo '{"graph_relay": {"total_tokens": 42, "reported_cost": 0.25}}'
"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_queues_a_run_the_worker_runs_the_script_and_the_agent_reads_the_result() {
    let env = Env::new();
    env.script("a", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-basic", json!({"x": 1})).await;
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"], json!({"got": {"x": 1}, "greeting": "hello"}));
    assert_eq!(run["total_tokens"], 42);
    assert_eq!(run["reported_cost"], 0.25);
    worker.wait_line(&format!("started {id}"));
    worker.wait_line(&format!("finished {id}: completed"));

    // A failing script: failed with the tail of stderr.
    env.script("b", "echo partial\necho 'something broke' >&2\nexit 3\n");
    let id = env.run(&url, GS_B, "e2e-key-failing", json!({})).await;
    let run = env.wait_status(&url, &id, "failed").await;
    assert_eq!(run["error"], "something broke\n");
    assert_eq!(run["result"], "partial");
    let lines = worker.interrupt();
    assert!(
        lines.iter().any(|l| l.contains("outbox flushed")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_while_queued_means_the_script_never_starts() {
    let env = Env::new();
    env.script("a", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    env.share_once(&url);
    let cancelled = env.run(&url, GS_A, "e2e-key-cancel-q", json!({})).await;
    let reply = env.cancel(&url, &cancelled).await;
    assert_eq!(reply["isError"], false, "{reply}");
    assert_eq!(env.get(&url, &cancelled).await["status"], "cancelled");
    let worker = env.worker(&url, &[]);
    // A later run goes through, so the worker has passed over the cancelled one.
    let later = env.run(&url, GS_A, "e2e-key-cancel-q2", json!({})).await;
    env.wait_status(&url, &later, "completed").await;
    assert!(env.path(&format!("{later}.started")).exists());
    assert!(!env.path(&format!("{cancelled}.started")).exists());
    assert_eq!(worker.count(&format!("started {cancelled}")), 0);
    assert_eq!(env.get(&url, &cancelled).await["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_while_running_kills_the_process_tree() {
    let env = Env::new();
    // The script starts a child and waits; both write their pids.
    env.script(
        "a",
        "sleep 300 &\necho $! > child.pid\necho $$ > main.pid\nwait\n",
    );
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-cancel-r", json!({})).await;
    let child: i32 = env.wait_file("child.pid").trim().parse().unwrap();
    let main: i32 = env.wait_file("main.pid").trim().parse().unwrap();
    assert!(!process_gone(child) && !process_gone(main));
    env.wait_status(&url, &id, "running").await;
    let reply = env.cancel(&url, &id).await;
    assert_eq!(reply["isError"], false, "{reply}");
    let run = env.wait_status(&url, &id, "cancelled").await;
    assert_eq!(run["cancel_requested"], true);
    let deadline = Instant::now() + DEADLINE;
    while !(process_gone(child) && process_gone(main)) {
        assert!(
            Instant::now() < deadline,
            "the process tree survived the cancel"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.wait_line(&format!("cancelling {id}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_unshared_between_queueing_and_starting_is_cancelled_with_the_message() {
    let env = Env::new();
    // `a` blocks until released, so `b` waits in the queue behind it.
    env.script(
        "a",
        "while [ ! -f release ]; do sleep 0.02; done\necho done\n",
    );
    env.script("b", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let first = env.run(&url, GS_A, "e2e-key-unshare-a", json!({})).await;
    worker.wait_line(&format!("started {first}"));
    let second = env.run(&url, GS_B, "e2e-key-unshare-b", json!({})).await;
    // The owner un-shares `b` (the project stays enabled).
    env.write_graphs(&[(GS_A, "a", &["p1"]), (GS_B, "b", &[])]);
    worker.wait_line("graphs: reloaded");
    std::fs::write(env.path("release"), "go").unwrap();
    env.wait_status(&url, &first, "completed").await;
    let run = env.wait_status(&url, &second, "cancelled").await;
    assert_eq!(
        run["error"],
        "Graph session is no longer shared with this project"
    );
    assert!(!env.path(&format!("{second}.started")).exists());
    // The server ended it on the first sync without `b` (the worker never
    // received it); a worker whose sync raced the change declines it itself.
    assert_eq!(worker.count(&format!("started {second}")), 0);
}

/// A reverse proxy in front of `upstream` that answers the first `lose`
/// completion POSTs itself with 502, without passing them on, as a load
/// balancer does when its backend is gone; every other request passes
/// through. Returns its URL.
async fn completion_dropping_proxy(upstream: &str, lose: u32) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::response::IntoResponse;

    let lose = std::sync::Arc::new(AtomicU32::new(lose));
    let client = reqwest::Client::new();
    let upstream = upstream.trim_end_matches('/').to_owned();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (lose, client, upstream) = (lose.clone(), client.clone(), upstream.clone());
        async move {
            let completion = request.uri().path().ends_with("/complete");
            if completion
                && lose
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return (
                    axum::http::StatusCode::BAD_GATEWAY,
                    "lost by the test's proxy",
                )
                    .into_response();
            }
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut forward = client.request(parts.method, format!("{upstream}{target}"));
            for (name, value) in &parts.headers {
                if name != axum::http::header::HOST {
                    forward = forward.header(name, value);
                }
            }
            match forward.body(body).send().await {
                Ok(answer) => {
                    let status = answer.status();
                    let headers = answer.headers().clone();
                    let bytes = answer.bytes().await.unwrap_or_default();
                    let mut response = (status, bytes).into_response();
                    *response.headers_mut() = headers;
                    response
                }
                Err(e) => (axum::http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_completion_post_is_delivered_on_a_later_pass() {
    let env = Env::new();
    env.script("a", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    let proxy = completion_dropping_proxy(&url, 1).await;
    let worker = env.worker(&proxy, &[]);
    worker.wait_line("sync: project p1");
    let id = env
        .run(&url, GS_A, "e2e-key-lost-post", json!({"y": 2}))
        .await;
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"]["got"], json!({"y": 2}));
    let failed = worker.wait_line(&format!("delivery of {id} failed"));
    assert!(failed.contains("502"), "{failed}");
    worker.wait_line(&format!("delivered {id}"));
    assert_eq!(worker.count(&format!("started {id}")), 1, "ran once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_before_its_post_delivers_the_result_after_restart() {
    let env = Env::new();
    env.script("a", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    // Every completion POST is lost: the result stays in the outbox only.
    let proxy = completion_dropping_proxy(&url, u32::MAX).await;
    let worker = env.worker(&proxy, &[]);
    worker.wait_line("sync: project p1");
    let id = env
        .run(&url, GS_A, "e2e-key-sigkill", json!({"z": 3}))
        .await;
    worker.wait_line(&format!("delivery of {id} failed"));
    worker.sigkill();
    assert_eq!(env.get(&url, &id).await["status"], "running");
    let worker = env.worker(&url, &[]);
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"]["got"], json!({"z": 3}));
    worker.wait_line(&format!("delivered {id}"));
    assert_eq!(worker.count(&format!("started {id}")), 0, "not run again");
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_work_survives_a_server_restart_on_its_sqlite_file() {
    let env = Env::new();
    env.script("a", ECHO);
    let (server, url) = env.serve("127.0.0.1:0");
    env.share_once(&url);
    let id = env
        .run(&url, GS_A, "e2e-key-restart", json!({"r": 1}))
        .await;
    server.sigkill();
    let listen = url.trim_start_matches("http://").to_owned();
    let (_server, url) = env.serve(&listen);
    assert_eq!(env.get(&url, &id).await["status"], "queued");
    let _worker = env.worker(&url, &[]);
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"]["got"], json!({"r": 1}));
}

/// Waits for a line containing `needle` among `proc`'s lines from `from`
/// on; returns its index. `within` is a deadline for the wait, not a
/// measure of speed.
fn wait_line_after(proc: &Proc, from: usize, needle: &str, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let lines = proc.lines();
        if let Some(i) = lines.iter().skip(from).position(|l| l.contains(needle)) {
            return from + i;
        }
        assert!(
            Instant::now() < deadline,
            "no line with `{needle}` after line {from} within {within:?}:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_server_is_reported_lost_then_back_and_work_queued_after_its_restart_runs() {
    let env = Env::new();
    env.script("a", ECHO);
    let (server, url) = env.serve("127.0.0.1:0");
    env.share_once(&url);
    // Quiet: an outage is a problem, said even then.
    let worker = env.worker(&url, &["--quiet"]);
    let first = env.run(&url, GS_A, "e2e-key-outage-1", json!({})).await;
    env.wait_status(&url, &first, "completed").await;
    assert_eq!(worker.count("unreachable"), 0, "{:?}", worker.lines());

    // The server holding the worker's held sync dies.
    server.sigkill();
    let within = Duration::from_secs(15);
    let lost = wait_line_after(&worker, 0, "warning: server unreachable (", within);
    // Ten seconds later it says so again, with the attempts so far.
    let still = wait_line_after(&worker, lost, "server still unreachable: ", within);

    // A server again, on the same port and database.
    let listen = url.trim_start_matches("http://").to_owned();
    let (_server, url) = env.serve(&listen);
    let back = wait_line_after(&worker, still, "server reachable again after ", within);
    let lines = worker.lines();
    assert!(lost < still && still < back, "{lines:?}");
    assert_eq!(
        worker.count("warning: server unreachable ("),
        1,
        "the loss is said once: {lines:?}"
    );
    assert_eq!(worker.count("server reachable again"), 1, "{lines:?}");

    // Work queued after the restart runs.
    let second = env
        .run(&url, GS_A, "e2e-key-outage-2", json!({"after": "restart"}))
        .await;
    let run = env.wait_status(&url, &second, "completed").await;
    assert_eq!(run["result"]["got"], json!({"after": "restart"}));
}

#[tokio::test(flavor = "multi_thread")]
async fn five_runs_queued_at_once_run_one_after_another() {
    let env = Env::new();
    env.script(
        "a",
        "echo \"start $GRAPH_RELAY_COMMAND_ID\" >> order.log\nsleep 0.2\necho \"end $GRAPH_RELAY_COMMAND_ID\" >> order.log\n",
    );
    let (_server, url) = env.serve("127.0.0.1:0");
    env.share_once(&url);
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            env.run(&url, GS_A, &format!("e2e-key-five-{i}"), json!({"i": i}))
                .await,
        );
    }
    let _worker = env.worker(&url, &[]);
    for id in &ids {
        env.wait_status(&url, id, "completed").await;
    }
    let log = std::fs::read_to_string(env.path("order.log")).unwrap();
    let expected: Vec<String> = ids
        .iter()
        .flat_map(|id| [format!("start {id}"), format!("end {id}")])
        .collect();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        expected,
        "each run ends before the next starts, in queue order"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_cancels_the_current_run_reports_it_and_exits() {
    let env = Env::new();
    env.script("a", "echo $$ > main.pid\nexec sleep 300\n");
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-sigint", json!({})).await;
    let main: i32 = env.wait_file("main.pid").trim().parse().unwrap();
    env.wait_status(&url, &id, "running").await;
    let lines = worker.interrupt();
    assert!(process_gone(main), "the run's process outlived the worker");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("stopping: cancelling {id}"))),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("outbox flushed")),
        "{lines:?}"
    );
    // The cancelled run was reported before the worker exited.
    let run = env.get(&url, &id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
}

/// Writes `graphs.toml` atomically (a running worker reloads it).
fn write_graphs_text(env: &Env, text: &str) {
    let tmp = env.path("graphs.toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, env.path("graphs.toml")).unwrap();
}

/// The session ids `list_graph_sessions` shows for `p1`.
async fn listed(env: &Env, url: &str) -> Vec<String> {
    let result = env
        .call(url, "list_graph_sessions", json!({"project_id": "p1"}))
        .await;
    assert_eq!(result["isError"], false, "{result}");
    result["structuredContent"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["graph_session_id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_projects_last_graph_unshares_it_even_while_the_worker_is_down() {
    let env = Env::new();
    env.script("a", ECHO);
    // `p1` is enabled only through its one Graph (no top-level `projects`).
    let only_a = format!(
        "[[graph]]\nid = \"{GS_A}\"\nname = \"Graph a\"\nslug = \"a\"\nversion = \"1\"\nprojects = [\"p1\"]\ncommand = [\"/bin/sh\", \"a.sh\"]\nworking_dir = \".\"\n"
    );
    write_graphs_text(&env, &only_a);
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    assert_eq!(listed(&env, &url).await, [GS_A]);

    // The owner removes the project's last Graph while the worker runs.
    write_graphs_text(&env, "");
    worker.wait_line("sync: project p1 unshared");
    assert!(listed(&env, &url).await.is_empty());

    // Shared again; then, with a run queued, withdrawn while the worker is down.
    write_graphs_text(&env, &only_a);
    let deadline = Instant::now() + DEADLINE;
    while listed(&env, &url).await.is_empty() {
        assert!(Instant::now() < deadline, "never shared again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.interrupt();
    let id = env.run(&url, GS_A, "e2e-key-unshare-down", json!({})).await;
    write_graphs_text(&env, "");
    // The new worker remembers (from its outbox file) that it synced p1.
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1 unshared");
    assert!(listed(&env, &url).await.is_empty());
    // The queued run ends with the re-check error and never starts: the
    // empty sync hands it to the worker, whose re-check declines it (once
    // the server ends such runs on that sync itself, the outcome is the same).
    let run = env.wait_status(&url, &id, "cancelled").await;
    assert_eq!(
        run["error"],
        "Graph session is no longer shared with this project"
    );
    assert!(!env.path(&format!("{id}.started")).exists());
    assert_eq!(worker.count(&format!("started {id}")), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relative_command_runs_from_the_graphs_folder_whatever_the_workers_cwd() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    write_graphs_text(
        &env,
        &format!(
            "[[graph]]\nid = \"{GS_A}\"\nname = \"Echo\"\nslug = \"a\"\nprojects = [\"p1\"]\ncommand = [\"./echo.sh\"]\n"
        ),
    );
    let script = env.path("echo.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nargs=$(cat)\nprintf '{\"got\": %s}\\n' \"$args\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_server, url) = env.serve("127.0.0.1:0");
    // The worker starts in another folder; every path it is given is absolute.
    let elsewhere = tempfile::tempdir().unwrap();
    let path = |name: &str| env.path(name).to_str().unwrap().to_owned();
    let (token, graphs, outbox) = (path("device.token"), path("graphs.toml"), path("outbox.db"));
    let worker = Proc::spawn(
        &[
            "worker",
            "--server",
            &url,
            "--token-file",
            &token,
            "--graphs",
            &graphs,
            "--outbox",
            &outbox,
            "--grace-seconds",
            "2",
        ],
        elsewhere.path(),
        DEADLINE,
    );
    worker.wait_line("sync: project p1");
    let id = env
        .run(&url, GS_A, "e2e-key-relative", json!({"n": 1}))
        .await;
    let run = env.wait_status(&url, &id, "completed").await;
    assert_eq!(run["result"], json!({"got": {"n": 1}}), "{run}");
}

/// Waits until `pid` is gone (or a zombie).
fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !process_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The Graph process groups the worker has recorded in its outbox file.
fn recorded_groups(env: &Env) -> Vec<i32> {
    let outbox = graph_relay_store_sqlite::SqliteOutbox::open(env.path("outbox.db")).unwrap();
    futures::executor::block_on(outbox.processes())
        .unwrap()
        .iter()
        .map(|p| p.pgid)
        .collect()
}

/// Waits until the worker's record of left-over process groups is empty:
/// the worker removes a record after the group it names is gone, so the
/// removal may come a moment after the process disappeared.
fn wait_unrecorded(env: &Env) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let groups = recorded_groups(env);
        if groups.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the record of {groups:?} is still there"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_script_dies_with_it_and_the_next_worker_ends_what_it_left() {
    let env = Env::new();
    // The script starts a child and waits; both write their pids.
    env.script(
        "a",
        "sleep 300 &\necho $! > child.pid\necho $$ > main.pid\nwait\n",
    );
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-orphan", json!({})).await;
    let child: i32 = env.wait_file("child.pid").trim().parse().unwrap();
    let main: i32 = env.wait_file("main.pid").trim().parse().unwrap();
    env.wait_status(&url, &id, "running").await;
    assert_eq!(recorded_groups(&env), [main], "recorded while it runs");

    worker.sigkill();
    // The kernel's parent-death signal ends the script itself ...
    wait_gone(main, "the script of a killed worker");
    // ... but not the child it started, which runs on, orphaned.
    assert!(
        !process_gone(child),
        "the child should have outlived the worker"
    );

    let worker = env.worker(&url, &[]);
    let line = worker.wait_line("left running by a previous worker");
    assert!(
        line.contains(&format!("process group {main} of command {id}")) && line.contains("SIGTERM"),
        "{line}"
    );
    wait_gone(child, "the orphaned child");
    wait_unrecorded(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_left_over_script_that_ignores_sigterm_is_killed_after_the_grace() {
    let env = Env::new();
    // Ignores SIGTERM: neither the parent-death signal nor the first signal
    // of the next worker ends it.
    env.script(
        "a",
        "trap '' TERM\necho $$ > main.pid\nwhile true; do sleep 1; done\n",
    );
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-orphan-term", json!({})).await;
    let main: i32 = env.wait_file("main.pid").trim().parse().unwrap();
    env.wait_status(&url, &id, "running").await;
    worker.sigkill();
    assert!(!process_gone(main), "the script ignores SIGTERM");

    let worker = env.worker(&url, &[]);
    let line = worker.wait_line("left running by a previous worker");
    assert!(line.contains("SIGKILL after 2 s"), "{line}");
    wait_gone(main, "the orphaned script");
    wait_unrecorded(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_runs_process_record_is_removed() {
    let env = Env::new();
    env.script("a", ECHO);
    let (_server, url) = env.serve("127.0.0.1:0");
    let worker = env.worker(&url, &[]);
    worker.wait_line("sync: project p1");
    let id = env.run(&url, GS_A, "e2e-key-record", json!({})).await;
    env.wait_status(&url, &id, "completed").await;
    worker.wait_line(&format!("delivered {id}"));
    assert!(recorded_groups(&env).is_empty());
}
