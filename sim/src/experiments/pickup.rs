//! Experiment 1: pickup wait.

use super::*;

/// Experiment 1: queued → started over `n` runs, per relay mode.
pub fn pickup(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "1. Pickup wait (queued -> started), seconds",
        &["relay", "runs", "mean", "median", "p95", "max"],
    );
    let mut figures = Map::new();
    let mut series = Vec::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut waits = Vec::with_capacity(n);
        for i in 0..n {
            let mut w = world(mode, &mut rng);
            w.run_until(START.plus(REQUEST_AT));
            let id = queue_run(&mut w, i as u64);
            let limit = w.now().plus(Duration::from_secs(120));
            w.run_while(limit, |w| {
                w.command(&w.agent, &id)
                    .is_some_and(|c| c.started_at.is_some())
            });
            if let Some(c) = w.command(&w.agent, &id)
                && let Some(started) = c.started_at
            {
                waits.push(secs_between(c.created_at, started));
            }
        }
        let s = Summary::of(&waits);
        let mut row = vec![mode_name(mode).to_string()];
        row.extend(summary_cells(&s));
        table.row(row);
        figures.insert(mode_name(mode).into(), json!(s));
        series.push((mode_name(mode).to_string(), waits));
    }
    table.note("Interval: the relay passes every 20 s at a random phase, so a run waits half an interval on average.");
    table.note("Long-poll: the held sync is answered as soon as the run is queued (25 ms one-way latency).");
    Outcome {
        name: "pickup",
        table,
        figures: Value::Object(figures),
        plot: Plot::Histogram {
            x_label: "pickup wait (s)".into(),
            series,
        },
    }
}
