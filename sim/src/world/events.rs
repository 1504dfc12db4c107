//! What is on its way between the desktop and the server, on the clock,
//! and what the server holds.

use super::*;

/// A request on its way to the server.
#[derive(Debug)]
pub(super) enum Request {
    Sync(SyncRequest),
    Claim {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
    },
    Control {
        command: CommandId,
        long_poll: bool,
    },
    Post(OutboxItem),
    Progress {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
        report: ProgressReport,
    },
}

/// An answer on its way to the relay.
#[derive(Debug)]
pub(super) enum Answer {
    Sync(Result<Vec<RelayCommand>, SyncFailure>),
    Claim(CommandId, ClaimOutcome),
    Control(CommandId, Result<ControlAnswer, Refusal>),
    Posted(CommandId, PostOutcome),
    ProgressPosted(CommandId, PostOutcome),
}

/// Requests and answers carry the epoch of the desktop process that sent
/// them: an answer for a process that died is lost with it.
#[derive(Debug)]
pub(super) enum Event {
    Arrive(u64, Request),
    Answer(u64, Answer),
    /// The server's periodic housekeeping ([`Queue::maintain`]).
    Maintain,
    /// The desktop (a new relay process) starts.
    DesktopStarts,
    ExecutionDone {
        command: CommandId,
        generation: u64,
        status: FinishStatus,
    },
    HoldExpired {
        generation: u64,
    },
    /// The synthetic Graph of execution `generation` reports its `n`th progress.
    Progress {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
        generation: u64,
        n: u64,
        ends_at: Timestamp,
    },
}

pub(super) struct Scheduled {
    pub(super) at: Timestamp,
    pub(super) seq: u64,
    pub(super) event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A long-poll request the server is holding (for the desktop process of
/// `epoch`), under the queue's own [`Hold`] rule: subscribed to its topics
/// before the look that found nothing, answered with the next look when a
/// topic fires (both relay holds answer on notify) or at the hold's `until`.
/// The simulated clock stands in for the hold's timer; the periodic re-look
/// for writes of other processes has nothing to find in one process.
pub(super) struct Held {
    pub(super) epoch: u64,
    pub(super) kind: HeldKind,
    pub(super) subscriptions: Vec<Subscription>,
    pub(super) generation: u64,
}

/// What the held request will look at when it answers.
pub(super) enum HeldKind {
    Sync(ProjectId),
    Control(CommandId),
}
