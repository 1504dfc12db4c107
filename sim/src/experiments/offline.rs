//! Experiment 6: offline desktop and lost completion.

use super::*;

/// Experiment 6: a desktop offline for 600 s with 5 runs queued; one lost completion POST.
pub fn offline(seed: u64) -> Outcome {
    let mut table = Table::new(
        "6. Offline desktop and a lost completion POST",
        &["scenario", "relay", "outcome", "seconds"],
    );
    let mut figures = Map::new();
    for mode in MODES {
        desktop_offline(mode, seed, &mut table, &mut figures);
    }
    for mode in MODES {
        for outbox in [true, false] {
            completion_lost(mode, outbox, seed, &mut table, &mut figures);
        }
    }
    table.note("The queue lives on the server, so work queued while the desktop sleeps runs when it wakes.");
    table.note("Without a durable outbox a lost completion is lost for good: the run no longer stays `running` for ever, but ends `failed` when its lease lapses.");
    Outcome {
        name: "offline",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}

/// The desktop sleeps the first 600 s with 5 runs queued: when they start
/// and end once it wakes.
fn desktop_offline(
    mode: RelayMode,
    seed: u64,
    table: &mut Table,
    figures: &mut Map<String, Value>,
) {
    let mut w = World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs(600),
        seed,
        ..WorldConfig::default()
    });
    let ids: Vec<CommandId> = (0..5).map(|i| queue_run(&mut w, i)).collect();
    let limit = START.plus(Duration::from_secs(4 * 3600));
    w.run_while(limit, |w| {
        ids.iter()
            .all(|id| w.status(id).is_some_and(CommandStatus::is_terminal))
    });
    let first_start = ids
        .iter()
        .filter_map(|id| w.command(&w.agent, id)?.started_at)
        .min();
    let last_end = ids
        .iter()
        .filter_map(|id| w.command(&w.agent, id)?.finished_at)
        .max();
    let done = ids
        .iter()
        .filter(|id| w.status(id) == Some(CommandStatus::Completed))
        .count();
    table.row(vec![
        "offline 600 s, 5 queued".into(),
        mode_name(mode).into(),
        format!("{done}/5 completed; first start"),
        first_start.map_or("-".into(), |t| s1(secs_between(START, t))),
    ]);
    table.row(vec![
        String::new(),
        String::new(),
        "last end".into(),
        last_end.map_or("-".into(), |t| s1(secs_between(START, t))),
    ]);
    figures.insert(format!("offline/{}", mode_name(mode)), json!({"completed": done, "first_start": first_start.map(|t| secs_between(START, t)), "last_end": last_end.map(|t| secs_between(START, t))}));
}

/// The first completion POST is lost: whether, and how late, the run's
/// result still reaches the server, with and without the durable outbox.
fn completion_lost(
    mode: RelayMode,
    outbox: bool,
    seed: u64,
    table: &mut Table,
    figures: &mut Map<String, Value>,
) {
    let mut w = World::new(WorldConfig {
        mode,
        outbox,
        seed,
        ..WorldConfig::default()
    });
    w.lose_next_posts(1);
    w.run_until(START.plus(REQUEST_AT));
    let id = queue_run(&mut w, 1);
    let limit = w.now().plus(Duration::from_secs(1800));
    w.run_while(limit, |w| {
        w.status(&id).is_some_and(CommandStatus::is_terminal)
    });
    let c = w.command(&w.agent, &id);
    let status = c.as_ref().map_or(CommandStatus::Queued, |c| c.status);
    let ended = w.executions.first().and_then(|e| e.ended);
    let delay = match (ended, c.as_ref().and_then(|c| c.finished_at)) {
        (Some(e), Some(f)) => s1(secs_between(e, f)),
        _ => "never".into(),
    };
    let scenario = format!(
        "lost completion, outbox {}",
        if outbox { "on" } else { "off" }
    );
    table.row(vec![
        scenario.clone(),
        mode_name(mode).into(),
        format!("{} after 30 min; delivered after", status.as_str()),
        delay.clone(),
    ]);
    figures.insert(
        format!("{scenario}/{}", mode_name(mode)),
        json!({"status": status.as_str(), "delivery_delay": delay}),
    );
}
