//! Experiment 2: five at once.

use super::*;

/// Experiment 2: five runs queued at once start and end one after another.
pub fn five_at_once(seed: u64) -> Outcome {
    let mut table = Table::new(
        "2. Five runs queued at once: start and end, seconds after queueing",
        &[
            "run",
            "interval start",
            "interval end",
            "long-poll start",
            "long-poll end",
        ],
    );
    let mut cells: Vec<Vec<String>> = (1..=5).map(|i| vec![i.to_string()]).collect();
    let mut figures = Map::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut w = world(mode, &mut rng);
        w.run_until(START.plus(REQUEST_AT));
        let t0 = w.now();
        let ids: Vec<CommandId> = (0..5).map(|i| queue_run(&mut w, i)).collect();
        let limit = t0.plus(Duration::from_secs(3600));
        w.run_while(limit, |w| {
            ids.iter()
                .all(|id| w.status(id).is_some_and(CommandStatus::is_terminal))
        });
        let mut times = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let c = w.command(&w.agent, id);
            let start = c
                .as_ref()
                .and_then(|c| c.started_at)
                .map(|t| secs_between(t0, t));
            let end = c
                .as_ref()
                .and_then(|c| c.finished_at)
                .map(|t| secs_between(t0, t));
            cells[i].push(start.map_or("-".into(), s1));
            cells[i].push(end.map_or("-".into(), s1));
            times.push(json!({"start": start, "end": end}));
        }
        let overlaps = w
            .executions
            .windows(2)
            .filter(|p| p[0].ended.is_some_and(|e| e > p[1].started))
            .count();
        figures.insert(
            mode_name(mode).into(),
            json!({"runs": times, "overlapping_executions": overlaps}),
        );
    }
    for row in cells {
        table.row(row);
    }
    table.note("A desktop is a single worker: each run starts only after the previous one ended.");
    Outcome {
        name: "five-at-once",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}
