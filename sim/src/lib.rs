//! # graph-relay-sim
//!
//! Reruns the published experiments (SPEC §8), and one of ours (a desktop
//! that dies mid-run), with the real code: the real
//! [`Queue`](graph_relay_core::queue::Queue) over the memory store and the
//! real [`Relay`](graph_relay_core::relay::Relay) state machine, on one
//! virtual clock that jumps from deadline to deadline. Only what lies outside
//! the system is simulated: Graph run times (lognormal, median 60 s, minimum
//! 5 s), network latency, lost responses, a desktop that dies and starts
//! again, the Graph's progress reports and the scripted agent. No queue or
//! relay rule is re-implemented here.
//!
//! ```text
//!  scripted agent ──► Queue (memory store) ◄── simulated network ◄── Relay ──► synthetic executor
//!                          ▲ virtual clock (ManualClock), shared by all parties
//! ```
//!
//! Run it with `graph-relay sim [EXPERIMENT] [--seed N] [--json] [--plot DIR]`.

pub mod experiments;
pub mod plot;
pub mod rng;
pub mod stats;
pub mod world;

use serde_json::{Value, json};

use crate::experiments::{NAMES, Outcome};

/// The seed used when none is given.
pub const DEFAULT_SEED: u64 = 20_261_130;

/// An unknown experiment name.
#[derive(Debug, thiserror::Error)]
#[error("unknown experiment `{0}`; choose one of: {list}", list = NAMES.join(", "))]
pub struct UnknownExperiment(pub String);

/// Runs the named experiments (all when `names` is empty), in the order of [`NAMES`].
pub fn run(names: &[String], seed: u64) -> Result<Vec<Outcome>, UnknownExperiment> {
    let selected: Vec<&str> = if names.is_empty() {
        NAMES.to_vec()
    } else {
        for n in names {
            if !NAMES.contains(&n.as_str()) {
                return Err(UnknownExperiment(n.clone()));
            }
        }
        NAMES
            .iter()
            .copied()
            .filter(|n| names.iter().any(|m| m == n))
            .collect()
    };
    Ok(selected
        .into_iter()
        .filter_map(|n| experiments::run(n, seed))
        .collect())
}

/// The tables as text, one after another.
pub fn render_text(outcomes: &[Outcome], seed: u64) -> String {
    let mut out = format!("# graph-relay simulation (seed {seed})\n\n");
    for o in outcomes {
        out.push_str(&o.table.render());
        out.push('\n');
    }
    out
}

/// Every figure as one JSON document.
pub fn render_json(outcomes: &[Outcome], seed: u64) -> Value {
    json!({
        "seed": seed,
        "experiments": outcomes.iter().map(|o| json!({"name": o.name, "table": o.table, "figures": o.figures})).collect::<Vec<_>>(),
    })
}
