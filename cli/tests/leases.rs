//! No run stays `running` forever, end to end over real sockets with the
//! real `serve` and `worker`: a worker killed mid-run leaves a run that
//! fails when its lease lapses, or at once when the worker restarts; a run
//! cancelled after its desktop died ends `cancelled`; a live worker's run
//! outlives a lease shorter than the long-poll hold; and `serve` stops
//! within a second on SIGTERM even with a worker holding a request.

mod common;

use std::time::{Duration, Instant};

use common::{Proc, Relay};
use serde_json::json;

const AGENT_TOKEN: &str = "gra_lease_agent_token_0123456789abcdef";
const DEVICE_TOKEN: &str = "grd_lease_device_token_0123456789abcdef";
const GS: &str = "gs_cccccccccccccccccccccccccccccccc";
const DEADLINE: Duration = Duration::from_secs(30);
/// The lapse that names the cause (core's `LEASE_LAPSED`).
const LAPSED: &str = "The owner's desktop stopped reporting on this run";
/// The close after a restart (core's `DESKTOP_RESTARTED`).
const RESTARTED: &str = "The owner's desktop restarted while this run was running";

/// A script that records its pid and runs until killed.
const SLEEPER: &str = "echo $$ > \"$GRAPH_RELAY_COMMAND_ID.pid\"\nwhile :; do sleep 0.05; done\n";

fn relay() -> Relay {
    let relay = Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.write_graphs(&[(GS, "slow", &["p1"])], "timeout_seconds = 600\n");
    relay.script("slow", SLEEPER);
    relay
}

fn serve(relay: &Relay, extra: &[&str]) -> (Proc, String) {
    let mut store = vec!["--db", "queue.db"];
    store.extend_from_slice(extra);
    relay.serve("127.0.0.1:0", &store)
}

/// Queues a run and waits until the worker's script runs it.
async fn started_run(relay: &Relay, url: &str, worker: &Proc, key: &str) -> String {
    let id = relay.run(url, GS, key, json!({})).await;
    worker.wait_line(&format!("started {id}"));
    relay.wait_exists(&format!("{id}.pid"), "the script").await;
    id
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_run_fails_when_its_lease_lapses() {
    let relay = relay();
    let (_server, url) = serve(&relay, &["--lease-seconds", "2"]);
    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = started_run(&relay, &url, &worker, "lease-key-0001").await;
    let killed = Instant::now();
    worker.sigkill();
    assert_eq!(relay.get(&url, &id).await["status"], "running");
    let run = relay.wait_status(&url, &id, "failed").await;
    let took = killed.elapsed();
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.starts_with(LAPSED), "{run}");
    assert!(
        error.contains("last heard from at"),
        "names the last contact: {error}"
    );
    assert!(run.get("poll_after_seconds").is_none(), "{run}");
    // The lease is 2 s from the last renewal (at most the start): the run
    // cannot fail before that, and the sweep runs every second.
    assert!(took < Duration::from_secs(2 + 3), "failed after {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_worker_ends_its_predecessors_run_at_once() {
    let relay = relay();
    // The default lease (60 s): only the restart can end the run quickly.
    let (_server, url) = serve(&relay, &[]);
    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = started_run(&relay, &url, &worker, "lease-key-0002").await;
    worker.sigkill();
    let restarted = Instant::now();
    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let synced = Instant::now();
    let run = relay.wait_status(&url, &id, "failed").await;
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.starts_with(RESTARTED), "{run}");
    assert!(
        synced.elapsed() < Duration::from_secs(1),
        "failed {:?} after the restarted worker's first sync",
        synced.elapsed()
    );
    assert!(restarted.elapsed() < Duration::from_secs(10));
    // It never runs again.
    assert_eq!(worker.count(&format!("started {id}")), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_cancelled_after_its_desktop_died_ends_cancelled() {
    let relay = relay();
    let (_server, url) = serve(&relay, &["--lease-seconds", "2"]);
    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = started_run(&relay, &url, &worker, "lease-key-0003").await;
    worker.sigkill();
    let answer = relay.cancel(&url, &id).await;
    assert_eq!(answer["isError"], false, "{answer}");
    let run = relay.wait_status(&url, &id, "cancelled").await;
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.contains(LAPSED), "{run}");
}

/// A Graph that runs 40 s, then prints its result.
const FORTY_SECONDS: &str = "sleep 40\necho '{\"slept\": 40}'\n";

/// `serve --lease-seconds 10` and a live long-polling worker: the held
/// control requests renew the 10 s lease in time, so a 40 s run ends
/// `completed` (it ended `failed`, "stopped reporting", 10 s in, when a
/// control request was held for the 25 s long-poll hold). The 40 s run is
/// the slow part of this test and the point of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_workers_run_outlives_a_lease_shorter_than_the_long_poll_hold() {
    let relay = Relay::new(
        &[("assistant", AGENT_TOKEN)],
        DEVICE_TOKEN,
        Duration::from_secs(90),
    );
    relay.write_graphs(&[(GS, "forty", &["p1"])], "timeout_seconds = 600\n");
    relay.script("forty", FORTY_SECONDS);
    let (_server, url) = serve(&relay, &["--lease-seconds", "10"]);
    let worker = relay.worker(&url, "outbox.db", "1", &[]);
    worker.wait_line("sync: project p1");
    let id = relay.run(&url, GS, "lease-key-0004", json!({})).await;
    worker.wait_line(&format!("started {id}"));
    let started = Instant::now();
    // Past two leases into the run: still running.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let run = relay.get(&url, &id).await;
    assert_eq!(run["status"], "running", "{run}");
    let run = relay.wait_status(&url, &id, "completed").await;
    assert!(started.elapsed() >= Duration::from_secs(39), "{run}");
    assert_eq!(run["result"], json!({"slept": 40}), "{run}");
    assert!(run.get("error").is_none(), "{run}");
}

/// SIGTERM with a worker holding a long-poll sync: `serve` answers it and
/// exits within 2 s. Twenty tries; the figures go to stderr
/// (`cargo test -p graph-relay --test leases -- --nocapture`).
#[tokio::test(flavor = "multi_thread")]
async fn serve_stops_within_a_second_with_a_worker_connected() {
    const TRIES: usize = 20;
    let relay = relay();
    let mut took = Vec::with_capacity(TRIES);
    for _ in 0..TRIES {
        let (server, url) = serve(&relay, &[]);
        let worker = relay.worker(&url, "outbox.db", "1", &[]);
        worker.wait_line("sync: project p1");
        // Give the pass time to end in its held sync.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (elapsed, lines) = server.terminate();
        assert!(
            elapsed < Duration::from_secs(2),
            "serve took {elapsed:?} to stop:\n{}",
            lines.join("\n")
        );
        took.push(elapsed);
        // The worker takes it as an ordinary reconnect: no error lines.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let lines = worker.lines();
        let noise: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("ERROR") || l.contains("panicked") || l.contains("failed"))
            .collect();
        assert!(noise.is_empty(), "{noise:?}");
        assert!(
            lines.iter().filter(|l| l.contains("unreachable")).count() <= 1,
            "{lines:?}"
        );
        worker.sigkill();
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "serve stop with a connected worker, {TRIES} tries: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(took[TRIES / 2]),
        ms(took[(TRIES * 99).div_ceil(100) - 1]),
        ms(took[TRIES - 1])
    );
}
