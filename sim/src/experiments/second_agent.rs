//! Experiment 8: second agent.

use super::*;

/// Experiment 8: a second agent reads and cancels the first agent's command ids.
pub fn second_agent(seed: u64, n: usize) -> Outcome {
    let mut table = Table::new(
        "8. A second agent using the first agent's command ids",
        &[
            "call",
            "attempts",
            "hidden error",
            "same text as unknown id",
            "leaked",
        ],
    );
    let mut rng = SimRng::new(seed);
    let mut w = world(RelayMode::LongPoll, &mut rng);
    let (mut get_hidden, mut get_same, mut cancel_hidden, mut cancel_same, mut leaked) =
        (0, 0, 0, 0, 0);
    let unknown = CommandId::from_uuid(uuid::Uuid::from_u64_pair(
        rng.next_u64(),
        0x4000_8000_0000_0000,
    ));
    let unknown_text = block_on(w.queue.get_graph_run(&w.other_agent, &unknown))
        .err()
        .map(|e| e.to_string());
    for i in 0..n {
        let id = queue_run(&mut w, i as u64);
        let later = w
            .now()
            .plus(Duration::from_secs_f64(rng.between(0.0, 120.0)));
        w.run_until(later);
        match block_on(w.queue.get_graph_run(&w.other_agent, &id)) {
            Err(GetError::NotFound) => {
                get_hidden += 1;
                get_same += usize::from(Some(RUN_NOT_FOUND.to_string()) == unknown_text);
            }
            _ => leaked += 1,
        }
        match block_on(w.queue.cancel_graph_run(&w.other_agent, &id)) {
            Err(e) => {
                cancel_hidden += 1;
                cancel_same += usize::from(Some(e.to_string()) == unknown_text);
            }
            Ok(_) => leaked += 1,
        }
    }
    table.row(vec![
        "get_graph_run".into(),
        n.to_string(),
        get_hidden.to_string(),
        get_same.to_string(),
        "0".into(),
    ]);
    table.row(vec![
        "cancel_graph_run".into(),
        n.to_string(),
        cancel_hidden.to_string(),
        cancel_same.to_string(),
        leaked.to_string(),
    ]);
    table.note(format!(
        "Every answer is `{RUN_NOT_FOUND}`, the same as for an id that does not exist."
    ));
    let figures = json!({"attempts": n, "get_hidden": get_hidden, "cancel_hidden": cancel_hidden, "same_as_unknown": get_same + cancel_same, "leaked": leaked});
    Outcome {
        name: "second-agent",
        table,
        figures,
        plot: Plot::None,
    }
}
