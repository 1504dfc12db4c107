//! The lifecycle workload shared by the stores' benchmarks and examples.
//!
//! One *lifecycle* is what a Graph run costs the server from ticket to
//! result: `run_graph_session → sync → start → complete → get_graph_run`
//! through the real [`Queue`], with every input (key, arguments, execution
//! id, result envelope) built fresh inside the lifecycle.
//!
//! [`Workload::steady`] runs it the way a long-lived server does: the
//! queue's clock moves 1 ms per lifecycle, keys and finished commands are
//! kept [`STEADY_KEY_TTL`], and every [`PRUNE_EVERY`] lifecycles a pruning
//! step removes what expired, so the store stays at a constant size (about
//! 10,000 commands and keys) instead of growing without end. The pruning is
//! part of the measured cost.

use std::time::Duration;

use serde_json::json;

use super::{World, completed, exec, gs, meta, p1};
use crate::args::RunArgs;
use crate::ids::{GraphSessionId, IdempotencyKey};
use crate::queue::{QueueConfig, SyncRequest};
use crate::store::Store;
use std::sync::Arc;

/// How long an idempotency key lives in the steady workload (virtual time).
pub const STEADY_KEY_TTL: Duration = Duration::from_secs(10);
/// Virtual time per lifecycle in the steady workload.
pub const STEADY_TICK: Duration = Duration::from_millis(1);
/// Lifecycles between pruning steps in the steady workload.
pub const PRUNE_EVERY: u64 = 100;

/// A queue over one store, one agent, one device sharing one session.
pub struct Workload {
    /// The queue and its principals.
    pub world: World,
    sync: SyncRequest,
    session: GraphSessionId,
    steady: bool,
    done: u64,
}

impl Workload {
    /// Default configuration; the store only grows (nothing expires).
    pub fn growing(store: Arc<dyn Store>) -> Self {
        Self::new(World::new(store), false)
    }

    /// A store kept at a constant size by expiry and pruning (see the module docs).
    pub fn steady(store: Arc<dyn Store>) -> Self {
        let config = QueueConfig {
            idempotency_ttl: STEADY_KEY_TTL,
            // Finished commands are kept as long as keys, as by default
            // (30 days against 24 hours): a command is pruned after its key.
            terminal_retention: Some(STEADY_KEY_TTL),
            ..QueueConfig::default()
        };
        Self::new(World::with_config(store, config), true)
    }

    fn new(world: World, steady: bool) -> Self {
        Self {
            world,
            sync: SyncRequest {
                project: p1(),
                sessions: vec![meta(1)],
                long_poll: false,
            },
            session: gs(1),
            steady,
            done: 0,
        }
    }

    /// Lifecycles run so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Runs one lifecycle; panics if any step misbehaves.
    pub async fn lifecycle(&mut self) {
        let n = self.done;
        self.done += 1;
        let w = &self.world;
        if n == 0 {
            // The desktop shares the session before the first run.
            w.queue
                .sync(&w.device, &self.sync)
                .await
                .expect("first sync");
        }
        if self.steady {
            w.clock.advance(STEADY_TICK);
            if n.is_multiple_of(PRUNE_EVERY) {
                w.queue.prune().await.expect("prune");
            }
        }
        let mut arguments = serde_json::Map::new();
        arguments.insert("n".to_owned(), json!(n));
        let args = RunArgs {
            graph_session_id: self.session.clone(),
            arguments,
            idempotency_key: IdempotencyKey::parse(&format!("lifecycle-key-{n}")).expect("key"),
        };
        let ticket = w
            .queue
            .run_graph_session(&w.agent, args)
            .await
            .expect("run");
        let queued = w.queue.sync(&w.device, &self.sync).await.expect("sync");
        assert_eq!(
            queued.commands.len(),
            1,
            "the one queued command is handed out"
        );
        let id = ticket.command.id;
        let execution = exec(&format!("exec-{n}"));
        w.queue
            .start(&w.device, &id, &execution)
            .await
            .expect("start");
        w.queue
            .complete(
                &w.device,
                &id,
                &completed(execution.as_str(), json!({ "ok": n })),
            )
            .await
            .expect("complete");
        let view = w.queue.get_graph_run(&w.agent, &id).await.expect("get");
        assert!(view.command.status.is_terminal());
    }
}
