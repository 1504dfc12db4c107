//! Local approval: how the worker asks the owner whether a run may start.
//!
//! A Graph with `approval = "always"` in `graphs.toml` waits, before each
//! run, for the owner's answer (the relay state machine decides everything
//! else: the wait, its progress, the timeout, a cancel meanwhile; see
//! `graph_relay_core::relay`). [`HookApprover`] asks through the Graph's
//! `approval_command`, e.g. a script that shows a desktop notification:
//!
//! - the hook runs in its own process group, with `GRAPH_RELAY_COMMAND_ID`,
//!   `GRAPH_RELAY_EXECUTION_ID`, `GRAPH_RELAY_GRAPH_SESSION_ID`,
//!   `GRAPH_RELAY_PROJECT_ID` and `GRAPH_RELAY_APPROVAL_UNTIL` (RFC 3339) in
//!   its environment and the run's arguments as JSON on stdin;
//! - exit status 0 approves; anything else declines, and the first line of
//!   its stdout (at most [`MAX_REASON`] characters) is the owner's reason;
//! - when the question is withdrawn (the wait ended, the agent cancelled,
//!   the worker stops) the hook's whole process group is killed.
//!
//! A Graph that needs approval but has no `approval_command` is never
//! approved by this approver: its runs wait until their wait ends, and fail.

use std::process::Stdio;

use async_trait::async_trait;
use graph_relay_core::relay::executor::Approver;
use graph_relay_core::relay::{ApprovalDecision, Job};
use graph_relay_core::time::Timestamp;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::graphs::SpecTable;

/// The longest reason read from a hook's stdout, in characters.
pub const MAX_REASON: usize = 500;
/// Most stdout bytes read from a hook.
const STDOUT_CAP: usize = 4096;
/// How long a finished hook's stdout may stay open before it is given up.
const STDOUT_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks each run's `approval_command`; see the module docs.
#[derive(Debug, Clone)]
pub struct HookApprover {
    specs: SpecTable,
}

impl HookApprover {
    /// An approver reading each Graph's hook from `specs`.
    pub fn new(specs: SpecTable) -> Self {
        Self { specs }
    }
}

/// Kills a hook's process group when the question is dropped or answered,
/// so that nothing the hook started outlives it.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|p| *p > 0) {
            // ESRCH: the group is already gone.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

/// The owner's reason from a declining hook's stdout: its first non-empty
/// line, trimmed, cut to [`MAX_REASON`] characters.
fn reason_from(stdout: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(MAX_REASON).collect())
}

#[async_trait]
impl Approver for HookApprover {
    async fn ask(&self, job: Job, until: Timestamp) -> ApprovalDecision {
        let hook = self
            .specs
            .read()
            .ok()
            .and_then(|t| t.get(&job.command.graph_session_id).cloned())
            .and_then(|spec| spec.approval)
            .and_then(|approval| approval.command);
        let Some(argv) = hook else {
            // No way to ask: the run waits until its wait ends.
            return std::future::pending().await;
        };
        let Some((program, args)) = argv.split_first() else {
            return std::future::pending().await;
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .env("GRAPH_RELAY_COMMAND_ID", job.command.id.to_string())
            .env("GRAPH_RELAY_EXECUTION_ID", job.execution.as_str())
            .env(
                "GRAPH_RELAY_GRAPH_SESSION_ID",
                job.command.graph_session_id.as_str(),
            )
            .env("GRAPH_RELAY_PROJECT_ID", job.command.project.as_str())
            .env("GRAPH_RELAY_APPROVAL_UNTIL", until.to_rfc3339())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                return ApprovalDecision::Denied(Some(format!(
                    "the approval command `{program}` could not start: {e}"
                )));
            }
        };
        let _group = GroupGuard(child.id().and_then(|p| i32::try_from(p).ok()));
        let input = serde_json::to_vec(&Value::Object(job.command.arguments.clone()))
            .unwrap_or_else(|_| b"{}".to_vec());
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                // A hook that does not read its stdin is fine.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        let reader = child.stdout.take().map(|out| {
            tokio::spawn(async move {
                // Bounded: a chatty hook cannot fill the worker's memory.
                let mut kept = Vec::new();
                let _ = out.take(STDOUT_CAP as u64).read_to_end(&mut kept).await;
                kept
            })
        });
        let status = child.wait().await;
        // Something the hook left running may hold its stdout open.
        let stdout = match reader {
            Some(task) => tokio::time::timeout(STDOUT_DRAIN, task)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        match status {
            Ok(status) if status.success() => ApprovalDecision::Approved,
            Ok(_) => ApprovalDecision::Denied(reason_from(&stdout)),
            Err(e) => ApprovalDecision::Denied(Some(format!(
                "the approval command could not be waited for: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_first_non_empty_line_bounded() {
        assert_eq!(reason_from(b""), None);
        assert_eq!(reason_from(b"\n  \n"), None);
        assert_eq!(
            reason_from(b"\n  too expensive today \nmore"),
            Some("too expensive today".into())
        );
        let long = "日".repeat(MAX_REASON + 10);
        assert_eq!(
            reason_from(long.as_bytes()).map(|r| r.chars().count()),
            Some(MAX_REASON)
        );
    }
}
