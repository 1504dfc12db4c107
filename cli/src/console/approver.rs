//! The approver that asks on the console.

use async_trait::async_trait;
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::executor::Approver;
use graph_relay_core::relay::{ApprovalDecision, Job};
use graph_relay_core::time::Timestamp;

use super::Console;
use crate::approval::HookApprover;

/// Asks on the console and through the Graph's hook, if it has one; the
/// first answer wins. The question leaves the board when it is answered or
/// withdrawn (the future is dropped).
pub struct ConsoleApprover {
    console: Console,
    hook: HookApprover,
}

impl ConsoleApprover {
    /// Asks on `console`, and through `hook` for Graphs that have one.
    pub fn new(console: Console, hook: HookApprover) -> Self {
        Self { console, hook }
    }
}

/// Takes a run off the board when its question ends.
struct OffTheBoard(Console, CommandId);

impl Drop for OffTheBoard {
    fn drop(&mut self) {
        self.0.lock().waiting.remove(&self.1);
    }
}

#[async_trait]
impl Approver for ConsoleApprover {
    async fn ask(&self, job: Job, until: Timestamp) -> ApprovalDecision {
        let command = job.command.id;
        let answer = self.console.post(job.clone(), until);
        let _off = OffTheBoard(self.console.clone(), command);
        tokio::select! {
            decision = answer => decision.unwrap_or(ApprovalDecision::Denied(None)),
            decision = self.hook.ask(job, until) => decision,
        }
    }
}
