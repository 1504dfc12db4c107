//! Experiment 5: idempotency.

use super::*;

/// Experiment 5: 30 % of start responses lost; retries with and without reusing the key.
pub fn idempotency(seed: u64, runs: usize, repetitions: usize) -> Outcome {
    let mut table = Table::new(
        "5. Idempotency: 30% of run_graph_session responses lost, the client retries",
        &[
            "retry policy",
            "runs wanted",
            "mean executions",
            "mean duplicates",
            "max duplicates",
        ],
    );
    let mut figures = Map::new();
    for reuse in [true, false] {
        let mut rng = SimRng::new(seed);
        let (mut executions, mut duplicates) = (Vec::new(), Vec::new());
        for _ in 0..repetitions {
            let mut w = World::new(WorldConfig {
                mode: RelayMode::LongPoll,
                seed: rng.next_u64(),
                run_time: crate::world::RunTime {
                    median_secs: 1.0,
                    sigma: 0.1,
                    min_secs: 1.0,
                },
                ..WorldConfig::default()
            });
            let mut attempt_key = 0u64;
            for run in 0..runs {
                loop {
                    let k = if reuse { run as u64 } else { attempt_key };
                    attempt_key += 1;
                    let args = RunArgs {
                        graph_session_id: w.session.clone(),
                        arguments: Map::new(),
                        idempotency_key: key(k + 1_000_000 * u64::from(!reuse)),
                    };
                    let reached = block_on(w.queue.run_graph_session(&w.agent, args)).is_ok();
                    // The server queued it; whether the client hears so is chance.
                    if reached && !rng.chance(0.3) {
                        break;
                    }
                }
            }
            let limit = w.now().plus(Duration::from_secs(24 * 3600));
            w.run_while(limit, |w| {
                w.executions.len() >= runs
                    && w.executions.iter().all(|e| e.ended.is_some())
                    && !w.has_queued()
            });
            executions.push(w.executions.len() as f64);
            duplicates.push(w.executions.len().saturating_sub(runs) as f64);
        }
        let (e, d) = (Summary::of(&executions), Summary::of(&duplicates));
        let name = if reuse {
            "same key on retry"
        } else {
            "new key on retry"
        };
        table.row(vec![
            name.into(),
            runs.to_string(),
            s1(e.mean),
            s1(d.mean),
            s1(d.max),
        ]);
        figures.insert(
            name.into(),
            json!({"executions": e, "duplicates": d, "repetitions": repetitions}),
        );
    }
    table.note("A duplicate is a second execution of a Graph with side effects; reusing the key makes retries safe.");
    Outcome {
        name: "idempotency",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

impl World {
    /// True while any command is still queued or running.
    pub fn has_queued(&self) -> bool {
        self.executions.iter().any(|e| e.ended.is_none())
            || block_on(self.queue.queued_for(&self.device, &self.project))
                .map(|c| !c.is_empty())
                .unwrap_or(false)
    }
}
