//! Experiment 4: cancellation.

use super::*;

/// Experiment 4: cancel at a random 0–40 s after queueing.
pub fn cancellation(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "4. Cancellation 0-40 s after queueing: state at the request and time to terminal (s)",
        &[
            "relay",
            "state at cancel",
            "runs",
            "mean",
            "median",
            "p95",
            "max",
        ],
    );
    let mut figures = Map::new();
    let mut series = Vec::new();
    for mode in MODES {
        let mut rng = SimRng::new(seed);
        let mut by_state: [(&str, Vec<f64>); 3] = [
            ("queued", Vec::new()),
            ("running", Vec::new()),
            ("already done", Vec::new()),
        ];
        let mut executed_after_queued_cancel = 0usize;
        for i in 0..n {
            let cancelled = cancel_once(mode, i as u64, &mut rng);
            if cancelled.ran_anyway {
                executed_after_queued_cancel += 1;
            }
            by_state[cancelled.state].1.push(cancelled.seconds);
        }
        let mut per_state = Map::new();
        for (state, values) in &by_state {
            let s = Summary::of(values);
            let mut row = vec![mode_name(mode).to_string(), state.to_string()];
            row.extend(summary_cells(&s));
            table.row(row);
            per_state.insert((*state).into(), json!(s));
        }
        per_state.insert(
            "executed_after_queued_cancel".into(),
            json!(executed_after_queued_cancel),
        );
        figures.insert(mode_name(mode).into(), Value::Object(per_state));
        series.push((
            format!("{} (running)", mode_name(mode)),
            by_state[1].1.clone(),
        ));
    }
    table.note("A queued run is cancelled by the server at once and never reaches the desktop; a running one waits for the control poll.");
    Outcome {
        name: "cancellation",
        table,
        figures: Value::Object(figures),
        plot: Plot::Histogram {
            x_label: "time from cancel to terminal, running runs (s)".into(),
            series,
        },
    }
}

/// One run of experiment 4, cancelled where it stood.
struct Cancelled {
    /// Where it stood when the cancel was asked: 0 queued, 1 running, 2
    /// already done.
    state: usize,
    /// From the request to the run's end (0 when it was done already).
    seconds: f64,
    /// Cancelled while queued, and executed all the same.
    ran_anyway: bool,
}

/// Queues run `n`, cancels it 0–40 s later, and waits for its end.
fn cancel_once(mode: RelayMode, n: u64, rng: &mut SimRng) -> Cancelled {
    let mut w = world(mode, rng);
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, n);
    let cancel_at = w
        .now()
        .plus(Duration::from_secs_f64(rng.between(0.0, 40.0)));
    w.run_until(cancel_at);
    let before = w.status(&id).unwrap_or(CommandStatus::Queued);
    let asked = w.now();
    let _ = block_on(w.queue.cancel_graph_run(&w.agent, &id));
    let limit = asked.plus(Duration::from_secs(3600));
    w.run_while(limit, |w| {
        w.status(&id).is_some_and(CommandStatus::is_terminal)
    });
    let finished = w
        .command(&w.agent, &id)
        .and_then(|c| c.finished_at)
        .unwrap_or(limit);
    let slot = match before {
        CommandStatus::Queued => 0,
        CommandStatus::Running => 1,
        _ => 2,
    };
    Cancelled {
        state: slot,
        seconds: if slot == 2 {
            0.0
        } else {
            secs_between(asked, finished)
        },
        ran_anyway: slot == 0 && w.executions.iter().any(|e| e.command == id),
    }
}
