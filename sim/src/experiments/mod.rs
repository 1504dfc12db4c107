//! The eight experiments of SPEC §8, each printing one table of our own
//! measurements, and one of ours (9, a desktop that dies mid-run). Every
//! world is seeded from the experiment seed, and the relay's phase is drawn
//! at random relative to each request.

use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::args::RunArgs;
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE, ToolCatalog};
use graph_relay_core::command::{CommandStatus, DESKTOP_RESTARTED, LEASE_LAPSED};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{CommandId, ExecutionId, GraphSessionId, IdempotencyKey};
use graph_relay_core::limits::RESULT_LIMIT;
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo, TASKS_EXTENSION};
use graph_relay_core::queue::{GetError, RUN_NOT_FOUND};
use graph_relay_core::relay::RelayMode;
use graph_relay_core::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::rng::SimRng;
use crate::stats::{Summary, Table, s1, s2};
use crate::world::{RunTime, START, World, WorldConfig};

mod cancellation;
mod desktop_dies;
mod five_at_once;
mod idempotency;
mod offline;
mod pickup;
mod polling;
mod result_size;
mod second_agent;

pub use self::cancellation::cancellation;
pub use self::desktop_dies::{Death, RESTART_AFTER, desktop_dies, dies_mid_run};
pub use self::five_at_once::five_at_once;
pub use self::idempotency::idempotency;
pub use self::offline::offline;
pub use self::pickup::pickup;
pub use self::polling::{STRATEGIES, Strategy, polling};
pub use self::result_size::result_size;
pub use self::second_agent::second_agent;

/// The experiments by name, in order.
pub const NAMES: [&str; 9] = [
    "pickup",
    "five-at-once",
    "polling",
    "cancellation",
    "idempotency",
    "offline",
    "result-size",
    "second-agent",
    "desktop-dies",
];

/// What one experiment produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Its name (one of [`NAMES`]).
    pub name: &'static str,
    /// The printed table.
    pub table: Table,
    /// Every figure, for `--json`.
    pub figures: Value,
    /// Series for `--plot`.
    #[serde(skip)]
    pub plot: Plot,
}

/// A labelled point of a scatter chart: (x, y, label).
pub type LabelledPoint = (f64, f64, String);

/// Data for one chart.
#[derive(Debug, Clone, Default)]
pub enum Plot {
    /// No chart.
    #[default]
    None,
    /// Histograms of a quantity (label, seconds) per series.
    Histogram {
        /// x-axis label.
        x_label: String,
        /// (series name, values).
        series: Vec<(String, Vec<f64>)>,
    },
    /// Labelled points (x, y) per series.
    Points {
        /// x-axis label.
        x_label: String,
        /// y-axis label.
        y_label: String,
        /// (series name, points with labels).
        series: Vec<(String, Vec<LabelledPoint>)>,
    },
}

/// Runs the experiment `name` with `seed`.
pub fn run(name: &str, seed: u64) -> Option<Outcome> {
    Some(match name {
        "pickup" => pickup(seed, 2000),
        "five-at-once" => five_at_once(seed),
        "polling" => polling(seed, 2000),
        "cancellation" => cancellation(seed, 2000),
        "idempotency" => idempotency(seed, 200, 10),
        "offline" => offline(seed),
        "result-size" => result_size(),
        "second-agent" => second_agent(seed, 500),
        "desktop-dies" => desktop_dies(seed, 500),
        _ => return None,
    })
}

const MODES: [RelayMode; 2] = [RelayMode::Interval, RelayMode::LongPoll];

fn mode_name(mode: RelayMode) -> &'static str {
    match mode {
        RelayMode::Interval => "interval (published)",
        RelayMode::LongPoll => "long-poll",
    }
}

/// The request time in every world: 20 s after the start, so that the
/// relay's first pass (drawn in [0, 20) s) sets a random phase.
const REQUEST_AT: Duration = Duration::from_secs(20);

fn world(mode: RelayMode, rng: &mut SimRng) -> World {
    World::new(WorldConfig {
        mode,
        relay_start: Duration::from_secs_f64(rng.between(0.0, 20.0)),
        seed: rng.next_u64(),
        ..WorldConfig::default()
    })
}

fn key(n: u64) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("sim-key-{n:08}")).unwrap_or_else(|e| unreachable!("{e}"))
}

fn queue_run(w: &mut World, n: u64) -> CommandId {
    let args = RunArgs {
        graph_session_id: w.session.clone(),
        arguments: Map::new(),
        idempotency_key: key(n),
    };
    match block_on(w.queue.run_graph_session(&w.agent, args)) {
        Ok(ticket) => ticket.command.id,
        Err(e) => unreachable!("the shared session is always reachable: {e}"),
    }
}

fn secs_between(a: Timestamp, b: Timestamp) -> f64 {
    b.since(a).as_secs_f64()
}

fn summary_cells(s: &Summary) -> Vec<String> {
    vec![
        s.n.to_string(),
        s2(s.mean),
        s2(s.median),
        s2(s.p95),
        s2(s.max),
    ]
}
