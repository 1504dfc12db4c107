//! The lifecycle workload shared by the stores' benchmarks and examples.
//!
//! One *lifecycle* is what a Graph run costs the server from ticket to
//! result: `run_graph_session → sync → start → complete → get_graph_run`
//! through the real [`Queue`](crate::queue::Queue), with every input (key, arguments, execution
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

use super::{World, completed, exec, meta, p1};
use crate::args::RunArgs;
use crate::command::CommandStatus;
use crate::ids::{DeviceId, IdempotencyKey};
use crate::principal::Device;
use crate::queue::{QueueConfig, SyncRequest};
use crate::store::Store;
use std::sync::Arc;

/// How long an idempotency key lives in the steady workload (virtual time).
pub const STEADY_KEY_TTL: Duration = Duration::from_secs(10);
/// Virtual time per lifecycle in the steady workload.
pub const STEADY_TICK: Duration = Duration::from_millis(1);
/// Lifecycles between pruning steps in the steady workload.
pub const PRUNE_EVERY: u64 = 100;

/// A desktop of the world's owner and the sync it sends: it alone shares
/// one session to `p1`.
#[derive(Debug, Clone)]
pub struct Desk {
    /// The desktop.
    pub device: Device,
    /// Its sync of `p1`, sharing its one session.
    pub sync: SyncRequest,
}

impl Desk {
    /// `device` sharing session `session` (not synced yet).
    pub fn new(device: Device, session: u32) -> Self {
        Self {
            device,
            sync: SyncRequest {
                project: p1(),
                sessions: vec![meta(session)],
                long_poll: false,
                restarted: false,
                running: None,
            },
        }
    }
}

/// Desks `desk-k` (k < `count`) of the world's owner, desk k the only one
/// sharing session k + 1; each has synced once.
pub async fn desks(w: &World, count: u32) -> Vec<Desk> {
    let mut out = Vec::new();
    for k in 0..count {
        let device = Device::new(
            DeviceId::parse(&format!("desk-{k:03}")).expect("device id"),
            w.device.owner.clone(),
        );
        let desk = Desk::new(device, k + 1);
        w.queue.sync(&desk.device, &desk.sync).await.expect("sync");
        out.push(desk);
    }
    out
}

/// One lifecycle of a fresh command (number `n`, which makes its key) of the
/// desk's session, checked at every step; panics if any step misbehaves.
pub async fn lifecycle(w: &World, desk: &Desk, n: u64) {
    let device = &desk.device;
    let mut arguments = serde_json::Map::new();
    arguments.insert("n".to_owned(), json!(n));
    let args = RunArgs {
        graph_session_id: desk.sync.sessions[0].graph_session_id.clone(),
        arguments,
        idempotency_key: IdempotencyKey::parse(&format!("lifecycle-key-{n}")).expect("key"),
    };
    let ticket = w
        .queue
        .run_graph_session(&w.agent, args)
        .await
        .expect("run");
    let id = ticket.command.id;
    assert_eq!(&ticket.command.device, &device.id);
    let synced = w.queue.sync(device, &desk.sync).await.expect("sync");
    assert_eq!(
        synced.commands.len(),
        1,
        "the one queued command is handed out"
    );
    let execution = exec(&format!("exec-{n}"));
    w.queue.start(device, &id, &execution).await.expect("start");
    w.queue
        .complete(
            device,
            &id,
            &completed(execution.as_str(), json!({ "n": n })),
        )
        .await
        .expect("complete");
    let view = w.queue.get_graph_run(&w.agent, &id).await.expect("get");
    assert_eq!(view.command.status, CommandStatus::Completed);
}

/// A queue over one store, one agent, one device sharing one session.
pub struct Workload {
    /// The queue and its principals.
    pub world: World,
    desk: Desk,
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
        let desk = Desk::new(world.device.clone(), 1);
        Self {
            world,
            desk,
            steady,
            done: 0,
        }
    }

    /// Lifecycles run so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Runs one lifecycle (see [`lifecycle`]), with the steady workload's
    /// clock and pruning steps; panics if any step misbehaves.
    pub async fn lifecycle(&mut self) {
        let n = self.done;
        self.done += 1;
        let w = &self.world;
        if n == 0 {
            // The desktop shares the session before the first run.
            w.queue
                .sync(&self.desk.device, &self.desk.sync)
                .await
                .expect("first sync");
        }
        if self.steady {
            w.clock.advance(STEADY_TICK);
            if n.is_multiple_of(PRUNE_EVERY) {
                w.queue.prune().await.expect("prune");
            }
        }
        lifecycle(w, &self.desk, n).await;
    }
}
