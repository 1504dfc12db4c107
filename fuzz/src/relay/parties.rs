//! The server and desktop the relay talks to, reduced to what its answers
//! depend on, and what the checks remember.

use super::*;

/// Why the model server closed a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    /// A completion or decline of the relay was taken.
    Reported,
    /// Cancelled while queued, or closed by the server's own re-check.
    BeforeStart,
    /// Its lease lapsed.
    Lapsed,
    /// Its desktop announced a restart.
    Restarted,
}

/// A command as the model server holds it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ServerState {
    Queued,
    Running {
        execution: ExecutionId,
        lease_until: Timestamp,
        cancel: bool,
    },
    Closed(Closed),
}

/// The server of the relay, reduced to what the relay's answers depend on:
/// leases on running commands (granted by a claim, renewed by a control
/// request, lapsing into a close), the restart announcement, and the shares
/// a sync replaces (a sync that no longer shares a session closes its
/// queued commands).
pub(super) struct ModelServer {
    pub(super) lease: Duration,
    pub(super) commands: HashMap<CommandId, ServerState>,
    /// The last version of each command a sync handed out.
    pub(super) offered: HashMap<CommandId, RelayCommand>,
    /// Projects the server holds shares of this desktop in.
    pub(super) shares: BTreeSet<ProjectId>,
}

impl ModelServer {
    /// The command as it stands at `now`: a lapsed lease closes it.
    pub(super) fn state(&mut self, id: &CommandId, now: Timestamp) -> Option<ServerState> {
        let state = self.commands.get_mut(id)?;
        if let ServerState::Running { lease_until, .. } = state
            && *lease_until <= now
        {
            *state = ServerState::Closed(Closed::Lapsed);
        }
        Some(state.clone())
    }

    pub(super) fn close_running_after_restart(
        &mut self,
        running: Option<CommandId>,
        now: Timestamp,
    ) {
        let ids: Vec<CommandId> = self.commands.keys().copied().collect();
        for id in ids {
            if Some(id) != running
                && matches!(self.state(&id, now), Some(ServerState::Running { .. }))
            {
                self.commands
                    .insert(id, ServerState::Closed(Closed::Restarted));
            }
        }
    }
}

/// What the harness remembers of one relay process and of the desktop's disk.
#[derive(Default)]
pub(super) struct Desktop {
    /// The durable outbox: each item with the process (epoch) that stored it.
    pub(super) outbox: HashMap<CommandId, (u64, graph_relay_core::outbox::OutboxItem)>,
    /// Projects recorded as synced (durable).
    pub(super) remembered: BTreeSet<ProjectId>,
}

/// Requests of the current process awaiting an answer.
#[derive(Default)]
pub(super) struct InFlight {
    pub(super) sync: Option<(ProjectId, Vec<SessionMeta>, bool, Option<CommandId>)>,
    pub(super) claim: Option<(CommandId, ExecutionId)>,
    pub(super) controls: Vec<CommandId>,
    pub(super) store: Option<CommandId>,
    pub(super) posts: Vec<graph_relay_core::outbox::OutboxItem>,
    pub(super) load: bool,
    pub(super) progress: Vec<(CommandId, ExecutionId)>,
}

/// What the current process was told or did, for the invariants.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) running: Option<(CommandId, ExecutionId)>,
    /// The run waiting for the owner's approval.
    pub(super) asking: Option<(CommandId, ExecutionId)>,
    /// Runs the owner approved and that have not started yet.
    pub(super) approved: BTreeSet<CommandId>,
    /// A control answer said the server closed these runs.
    pub(super) told_closed: BTreeSet<CommandId>,
    pub(super) cancels: BTreeSet<CommandId>,
    /// Reports the server refused for good.
    pub(super) refused: Vec<graph_relay_core::outbox::OutboxItem>,
    pub(super) may_remove: HashMap<CommandId, bool>,
    pub(super) latest_progress: HashMap<CommandId, ProgressReport>,
    pub(super) last_progress_post: HashMap<CommandId, Timestamp>,
    /// Runs the owner cancelled on the desktop (the cancel was taken).
    pub(super) owner_cancelled: BTreeSet<CommandId>,
}
