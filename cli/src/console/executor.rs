//! The executor the console watches runs through.

use std::sync::Arc;

use async_trait::async_trait;
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job};

use super::Console;

/// Wraps the worker's executor so that the console shows each run while it
/// executes, with its latest progress (reports the server would refuse are
/// not shown). Everything else goes to the wrapped executor unchanged.
pub struct ConsoleExecutor {
    console: Console,
    inner: Arc<dyn Executor>,
}

impl ConsoleExecutor {
    /// Shows the runs `inner` executes on `console`.
    pub fn new(console: Console, inner: Arc<dyn Executor>) -> Self {
        Self { console, inner }
    }
}

#[async_trait]
impl Executor for ConsoleExecutor {
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        progress: ProgressSink,
    ) -> ExecutionOutcome {
        let command = job.command.id;
        self.console.started(job.clone());
        let console = self.console.clone();
        let sink = ProgressSink::new(move |report| {
            console.progressed(command, &report);
            progress.report(report);
        });
        self.inner.execute(job, cancel, sink).await
    }
}
