//! The in-process desktops of `graph-relay loadtest`: real relays (the
//! core's `RelayDriver` with the HTTP transport in long-poll mode), each
//! with its own token and an in-memory outbox, whose Graph runs in the
//! harness. Each execution is recorded by the command id it ran under and
//! the run's number from its arguments; each event that says a request
//! failed is counted by kind.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use graph_relay_core::envelope::FinishStatus;
use graph_relay_core::prelude::*;
use graph_relay_core::relay::driver::{DriverEvent, RelayDriver};
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressSink};
use graph_relay_core::relay::{
    ExecutionOutcome, Job, Relay, RelayConfig, RelayEvent, RelayMode, SharedSet,
};
use graph_relay_store_memory::MemoryOutbox;
use graph_relay_transport_http::TokioSleeper;
use graph_relay_transport_http::relay_http::{HttpRelayConfig, HttpRelayTransport};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::tally::{Party, Tally, lock};
use super::{LoadtestError, PROJECT, RUN_DEADLINE, session_id};

/// Starts desktop `index`: a relay over HTTP in long-poll mode.
pub(super) fn start_desktop(
    index: usize,
    base: &str,
    token: &str,
    tally: Arc<Tally>,
    run_time: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, LoadtestError> {
    let mut shared = SharedSet::new();
    let project = ProjectId::parse(PROJECT)
        .map_err(|e| LoadtestError::Bounds(format!("project `{PROJECT}`: {e}")))?;
    let session = session_id(index);
    shared.share(
        project,
        SessionMeta {
            graph_session_id: GraphSessionId::parse(&session)
                .map_err(|e| LoadtestError::Bounds(format!("session `{session}`: {e}")))?,
            name: format!("Load test {index}").into(),
            description: "Sleeps for --run-seconds, then completes".into(),
            slug: "loadtest".into(),
            version: "1".into(),
            status: "ready".into(),
        },
    );
    let config = RelayConfig {
        mode: RelayMode::LongPoll,
        seed: index as u64,
        shutdown_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    };
    let transport = HttpRelayTransport::new(HttpRelayConfig::new(base, token))?;
    let executor = LoadExecutor {
        tally: Arc::clone(&tally),
        run_time,
    };
    let driver = RelayDriver::new(
        Relay::new(config, shared, SystemClock.now()),
        Arc::new(transport),
        Arc::new(MemoryOutbox::new()),
        Arc::new(executor),
        Arc::new(SystemClock),
        Arc::new(TokioSleeper),
    );
    let mut connected = false;
    Ok(tokio::spawn(driver.run(
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
        move |event| {
            if let Some(kind) = desktop_saw(&event) {
                tally.observe(Party::Desktop, kind);
            }
            match event {
                DriverEvent::Relay(RelayEvent::Synced { .. }) if !connected => {
                    connected = true;
                    tally.connected.fetch_add(1, Ordering::Relaxed);
                }
                // Under faults a failed sync is what the fault causes: it is
                // reported with the fault, not as an error.
                DriverEvent::Relay(RelayEvent::SyncFailed { unreachable, .. })
                    if tally.loaded.load(Ordering::Relaxed)
                        && !tally.faulty.load(Ordering::Relaxed) =>
                {
                    tally.error(if unreachable {
                        "relay_sync_no_answer"
                    } else {
                        "relay_sync_refused"
                    });
                }
                DriverEvent::OutboxError(_) => tally.error("relay_outbox"),
                _ => {}
            }
        },
    )))
}

/// What a desktop's event says went wrong, as a kind to count (`None`:
/// nothing did).
fn desktop_saw(event: &DriverEvent) -> Option<String> {
    let DriverEvent::Relay(event) = event else {
        return Some("outbox error".into());
    };
    Some(match event {
        RelayEvent::SyncFailed { reason, .. } => format!("sync failed: {}", reason_kind(reason)),
        RelayEvent::ClaimUnconfirmed { reason, .. } => {
            format!("start unconfirmed: {}", reason_kind(reason))
        }
        RelayEvent::ClaimRefused { reason, .. } => {
            format!("start refused: {}", reason_kind(reason))
        }
        RelayEvent::ControlFailed { reason, .. } => {
            format!("control failed: {}", reason_kind(reason))
        }
        RelayEvent::DeliveryFailed { reason, .. } => {
            format!("report kept in the outbox: {}", reason_kind(reason))
        }
        RelayEvent::Dropped { reason, .. } => format!("report dropped: {}", reason_kind(reason)),
        RelayEvent::ClosedByServer { status, .. } => {
            format!("run closed by the server as {}", status.as_str())
        }
        RelayEvent::ProgressRefused { .. } => "progress refused".into(),
        RelayEvent::ServerLost { .. } => "server lost".into(),
        RelayEvent::ServerBack { .. } => "server back".into(),
        _ => return None,
    })
}

/// The kind of a relay request's failure reason: `network error` (no
/// answer), or the status and error code of the answer
/// (`503 Service Unavailable store_unavailable`, a balancer's `502 Bad
/// Gateway`).
pub(super) fn reason_kind(reason: &str) -> String {
    if reason.starts_with("network error") {
        return "no answer (network error)".into();
    }
    if reason.starts_with("unreadable answer") {
        return "unreadable answer".into();
    }
    let head = reason.split(':').next().unwrap_or(reason);
    head.chars().take(60).collect()
}

/// The desktops' executor: sleeps for the run time and completes, or waits
/// for the cancel when the run says `hold`.
struct LoadExecutor {
    tally: Arc<Tally>,
    run_time: Duration,
}

#[async_trait]
impl Executor for LoadExecutor {
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        _progress: ProgressSink,
    ) -> ExecutionOutcome {
        let id = job.command.id.to_string();
        {
            let now = Instant::now();
            let mut executions = self.tally.executions();
            let execution = executions.entry(id.clone()).or_default();
            execution.starts += 1;
            if execution.started.is_none() {
                execution.started = Some(now);
            }
            for waiter in execution.waiters.drain(..) {
                let _ = waiter.send(now);
            }
        }
        // What this Graph writes: the command id it ran under, by run.
        if let Some(run) = job.command.arguments.get("run").and_then(Value::as_u64) {
            lock(&self.tally.runs)
                .entry(run)
                .or_default()
                .insert(id.clone());
        }
        let hold = job.command.arguments.get("hold") == Some(&Value::Bool(true));
        let outcome = if hold {
            // The agent cancels it; the deadline only bounds a lost cancel.
            tokio::select! {
                () = cancel => ExecutionOutcome {
                    status: Some(FinishStatus::Cancelled),
                    ..Default::default()
                },
                () = tokio::time::sleep(RUN_DEADLINE) => ExecutionOutcome::completed(json!({"held": true})),
            }
        } else {
            tokio::select! {
                () = cancel => ExecutionOutcome {
                    status: Some(FinishStatus::Cancelled),
                    ..Default::default()
                },
                () = tokio::time::sleep(self.run_time) => ExecutionOutcome::completed(json!({"slept_ms": self.run_time.as_millis()})),
            }
        };
        if let Some(execution) = self.tally.executions().get_mut(&id) {
            execution.finished = Some(Instant::now());
        }
        outcome
    }
}
