//! Experiment 9: the desktop dies mid-run.

use super::*;

/// How long the desktop stays down before it starts again, in experiment 9.
pub const RESTART_AFTER: Duration = Duration::from_secs(15);

/// How one run of experiment 9 ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Death {
    /// From the desktop's death until the waiting agent's call returned the
    /// run as terminal.
    pub learned_after: Duration,
    /// From the death until the server closed the run (its `finished_at`).
    pub closed_after: Duration,
    /// The status the agent saw.
    pub status: CommandStatus,
    /// The reason it was closed with.
    pub reason: String,
}

/// One run of experiment 9: a run starts, the desktop dies at a random
/// moment 5–120 s into it (the Graph would run for an hour), and starts
/// again after `restart` if given. The agent waits with `get_graph_run`
/// `wait_seconds=60`, call after call; the server runs its housekeeping
/// ([`Queue::maintain`](graph_relay_core::queue::Queue::maintain)) every
/// second. `None` if the run never started.
pub fn dies_mid_run(mode: RelayMode, restart: Option<Duration>, rng: &mut SimRng) -> Option<Death> {
    let mut w = World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs_f64(rng.between(0.0, 20.0)),
        seed: rng.next_u64(),
        run_time: RunTime {
            median_secs: 3600.0,
            sigma: 0.0,
            min_secs: 3600.0,
        },
        maintain: Some(Duration::from_secs(1)),
        ..WorldConfig::default()
    });
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, 0);
    let limit = w.now().plus(Duration::from_secs(120));
    w.run_while(limit, |w| !w.executions.is_empty());
    let started = w.executions.first()?.started;
    w.run_until(started.plus(Duration::from_secs_f64(rng.between(5.0, 120.0))));
    w.kill_desktop();
    let died = w.now();
    if let Some(delay) = restart {
        w.restart_desktop_after(delay);
    }
    let limit = died.plus(Duration::from_secs(600));
    while w.now() < limit {
        let view = w.wait_call(&id, Duration::from_secs(60))?;
        let c = view.command;
        if c.status.is_terminal() {
            return Some(Death {
                learned_after: w.now().since(died),
                closed_after: c.finished_at.unwrap_or(died).since(died),
                status: c.status,
                reason: c.reason.unwrap_or_default(),
            });
        }
    }
    None
}

/// Experiment 9: how long until the agent learns that a run failed when
/// the desktop died mid-run, with and without a restart.
pub fn desktop_dies(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "9. Desktop dies mid-run: seconds until a waiting agent sees the run `failed`",
        &[
            "relay",
            "desktop",
            "runs",
            "mean",
            "median",
            "p95",
            "max",
            "closed by",
        ],
    );
    let mut figures = Map::new();
    let restart_name = format!("restarts after {} s", RESTART_AFTER.as_secs());
    for mode in MODES {
        for restart in [None, Some(RESTART_AFTER)] {
            let mut rng = SimRng::new(seed);
            let (mut learned, mut lease, mut restarted, mut other) = (Vec::new(), 0, 0, 0);
            for _ in 0..n {
                let Some(death) = dies_mid_run(mode, restart, &mut rng) else {
                    other += 1;
                    continue;
                };
                learned.push(death.learned_after.as_secs_f64());
                match death.reason {
                    r if r.starts_with(LEASE_LAPSED) => lease += 1,
                    r if r.starts_with(DESKTOP_RESTARTED) => restarted += 1,
                    _ => other += 1,
                }
            }
            let desktop = if restart.is_some() {
                restart_name.as_str()
            } else {
                "stays down"
            };
            let s = Summary::of(&learned);
            let mut row = vec![mode_name(mode).to_string(), desktop.to_string()];
            row.extend(summary_cells(&s));
            row.push(format!("lease {lease}, restart {restarted}"));
            table.row(row);
            figures.insert(
                format!("{}/{desktop}", mode_name(mode)),
                json!({"summary": s, "lease_lapsed": lease, "restart": restarted, "other": other}),
            );
        }
    }
    table.note("The desktop dies 5-120 s into an hour-long run. A run's lease is 30 s in interval mode (10 control polls of 3 s) and 60 s in long-poll mode; renewals are written when less than half of it is left, so without a restart the run fails between about half a lease and a whole lease after the death.");
    table.note(format!("A restarted desktop announces it on its first sync (right away, its outbox being empty) and the server closes the run at once: {} s plus one round trip.", RESTART_AFTER.as_secs()));
    table.note("The waiting agent is woken by the write (the restart's close, or the server's sweep of lapsed leases, once a second).");
    Outcome {
        name: "desktop-dies",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}
