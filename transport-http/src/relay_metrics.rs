//! Prometheus metrics of a relay (desktop worker): `GET /metrics` in the
//! OpenMetrics text format, on a loopback listener of the worker's own
//! (`graph-relay worker --metrics 127.0.0.1:9188`).
//!
//! The figures come from two places: the driver's events, which the worker
//! hands to [`RelayMetrics::observe`] as they happen, and the outbox, read
//! when scraped ([`Outbox::pending`]). No metric carries a command, project
//! or Graph in its labels; labels are fixed sets (an outcome, a failure
//! kind), present at zero from the first scrape so that rates start at 0.
//! The listener answers only a loopback `Host` with its port (403
//! otherwise), the rule of the server's metrics listener, so a web page
//! cannot read the figures through DNS rebinding.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `graph_relay_worker_outbox_pending` | gauge | | relay reports in the outbox, not yet delivered |
//! | `graph_relay_worker_outbox_oldest_seconds` | gauge | | age of the oldest pending report (0 when none) |
//! | `graph_relay_worker_runs_total` | counter | `outcome` (`completed`, `failed`, `cancelled`, `abandoned`) | runs this worker finished, counted when their report was stored (`abandoned`: the server had closed the run, nothing reported) |
//! | `graph_relay_worker_running` | gauge | | 1 while a run is executing, else 0 |
//! | `graph_relay_worker_progress_posted_total` | counter | | progress reports the server took |
//! | `graph_relay_worker_reports_delivered_total` | counter | | reports delivered (acknowledged by the server) |
//! | `graph_relay_worker_failures_total` | counter | `kind` (see below) | failed requests and refusals |
//! | `graph_relay_worker_server_reachable` | gauge | | 1 if the last sync got an answer, 0 if it got none (or none yet) |
//! | `graph_relay_worker_outbox_errors_total` | counter | | scrapes whose outbox could not be read |
//!
//! The failure kinds: `sync_unreachable` (no answer to a sync),
//! `sync_refused` (the server refused a sync for good), `claim_refused`,
//! `claim_unconfirmed` (a claim got no usable answer), `control` (a control
//! poll got no usable answer), `progress_refused`, `delivery` (a report
//! could not be delivered; kept), `report_dropped` (the server refused a
//! report for good), `outbox` (the outbox could not be read or written).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use graph_relay_core::outbox::Outbox;
use graph_relay_core::relay::RelayEvent;
use graph_relay_core::relay::driver::DriverEvent;
use graph_relay_core::time::Clock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{METRICS_PATH, exposition, host_allowed};

/// The `outcome` label values of `graph_relay_worker_runs_total`.
pub const RUN_OUTCOMES: [&str; 4] = ["completed", "failed", "cancelled", "abandoned"];

/// The `kind` label values of `graph_relay_worker_failures_total`.
pub const FAILURE_KINDS: [&str; 9] = [
    "sync_unreachable",
    "sync_refused",
    "claim_refused",
    "claim_unconfirmed",
    "control",
    "progress_refused",
    "delivery",
    "report_dropped",
    "outbox",
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// The registry of a relay's metrics, fed by its driver's events.
///
/// Call order: build it with the outbox and clock the driver uses, pass
/// every [`DriverEvent`] to [`RelayMetrics::observe`], and serve
/// [`RelayMetrics::router`] (or call [`RelayMetrics::render`]).
pub struct RelayMetrics {
    registry: Registry,
    outbox_pending: Gauge,
    outbox_oldest: Gauge<f64, AtomicU64>,
    runs: Family<OutcomeLabels, Counter>,
    running: Gauge,
    progress_posted: Counter,
    delivered: Counter,
    failures: Family<KindLabels, Counter>,
    reachable: Gauge,
    outbox_errors: Counter,
    outbox: Arc<dyn Outbox>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for RelayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayMetrics").finish_non_exhaustive()
    }
}

impl RelayMetrics {
    /// Metrics of a relay whose pending reports are in `outbox`; ages are
    /// measured with `clock`.
    pub fn new(outbox: Arc<dyn Outbox>, clock: Arc<dyn Clock>) -> Self {
        let mut registry = Registry::default();
        let outbox_pending = Gauge::default();
        registry.register(
            "graph_relay_worker_outbox_pending",
            "Relay reports in the outbox, not yet delivered",
            outbox_pending.clone(),
        );
        let outbox_oldest = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "graph_relay_worker_outbox_oldest_seconds",
            "Age of the oldest pending report in seconds (0 when none)",
            outbox_oldest.clone(),
        );
        let runs = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "graph_relay_worker_runs",
            "Runs this worker finished, by outcome (abandoned: the server had closed the run)",
            runs.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "graph_relay_worker_running",
            "1 while a run is executing, else 0",
            running.clone(),
        );
        let progress_posted = Counter::default();
        registry.register(
            "graph_relay_worker_progress_posted",
            "Progress reports the server took",
            progress_posted.clone(),
        );
        let delivered = Counter::default();
        registry.register(
            "graph_relay_worker_reports_delivered",
            "Reports delivered to the server",
            delivered.clone(),
        );
        let failures = Family::<KindLabels, Counter>::default();
        registry.register(
            "graph_relay_worker_failures",
            "Failed requests and refusals, by kind (sync_unreachable, sync_refused, claim_refused, claim_unconfirmed, control, progress_refused, delivery, report_dropped, outbox)",
            failures.clone(),
        );
        let reachable = Gauge::default();
        registry.register(
            "graph_relay_worker_server_reachable",
            "1 if the last sync got an answer, 0 if it got none (or none yet)",
            reachable.clone(),
        );
        let outbox_errors = Counter::default();
        registry.register(
            "graph_relay_worker_outbox_errors",
            "Scrapes whose outbox could not be read",
            outbox_errors.clone(),
        );
        for outcome in RUN_OUTCOMES {
            let _ = runs.get_or_create(&OutcomeLabels { outcome });
        }
        for kind in FAILURE_KINDS {
            let _ = failures.get_or_create(&KindLabels { kind });
        }
        Self {
            registry,
            outbox_pending,
            outbox_oldest,
            runs,
            running,
            progress_posted,
            delivered,
            failures,
            reachable,
            outbox_errors,
            outbox,
            clock,
        }
    }

    /// Counts `event` (every event the driver reports goes through here).
    pub fn observe(&self, event: &DriverEvent) {
        let fail = |kind: &'static str| {
            self.failures.get_or_create(&KindLabels { kind }).inc();
        };
        let event = match event {
            DriverEvent::Relay(event) => event,
            DriverEvent::OutboxError(_) => {
                fail("outbox");
                return;
            }
        };
        match event {
            RelayEvent::Synced { .. } | RelayEvent::Unshared { .. } => {
                self.reachable.set(1);
            }
            RelayEvent::SyncFailed {
                unreachable: true, ..
            } => {
                self.reachable.set(0);
                fail("sync_unreachable");
            }
            RelayEvent::SyncFailed { .. } => {
                // The server answered, with a refusal.
                self.reachable.set(1);
                fail("sync_refused");
            }
            RelayEvent::ClaimRefused { .. } => fail("claim_refused"),
            RelayEvent::ClaimUnconfirmed { .. } => fail("claim_unconfirmed"),
            RelayEvent::ControlFailed { .. } => fail("control"),
            RelayEvent::ProgressRefused { .. } => fail("progress_refused"),
            RelayEvent::DeliveryFailed { .. } => fail("delivery"),
            RelayEvent::Dropped { .. } => fail("report_dropped"),
            RelayEvent::Started { .. } => {
                self.running.set(1);
            }
            RelayEvent::Finished { status, .. } => {
                self.running.set(0);
                self.runs
                    .get_or_create(&OutcomeLabels {
                        outcome: status.as_str(),
                    })
                    .inc();
            }
            RelayEvent::Abandoned { .. } => {
                self.running.set(0);
                self.runs
                    .get_or_create(&OutcomeLabels {
                        outcome: "abandoned",
                    })
                    .inc();
            }
            RelayEvent::Stopped { .. } => {
                self.running.set(0);
            }
            RelayEvent::ProgressPosted { .. } => {
                self.progress_posted.inc();
            }
            RelayEvent::Delivered { .. } => {
                self.delivered.inc();
            }
            RelayEvent::PassStarted
            | RelayEvent::PassFinished { .. }
            | RelayEvent::Declined { .. }
            | RelayEvent::ApprovalRequested { .. }
            | RelayEvent::Approved { .. }
            | RelayEvent::ApprovalDenied { .. }
            | RelayEvent::ApprovalTimedOut { .. }
            | RelayEvent::CancelSent { .. }
            | RelayEvent::CancelledOnTheDesktop { .. }
            | RelayEvent::ClosedByServer { .. }
            | RelayEvent::Stopping { .. }
            | RelayEvent::GaveUpWaiting { .. }
            // The requests behind these are counted one by one above.
            | RelayEvent::ServerLost { .. }
            | RelayEvent::StillUnreachable { .. }
            | RelayEvent::ServerBack { .. } => {}
        }
    }

    /// Reads the outbox into its gauges and returns the text exposition.
    pub async fn render(&self) -> String {
        match self.outbox.pending().await {
            Ok(items) => {
                self.outbox_pending
                    .set(i64::try_from(items.len()).unwrap_or(i64::MAX));
                let now = self.clock.now();
                let oldest = items
                    .iter()
                    .map(|item| now.since(item.stored_at))
                    .max()
                    .unwrap_or_default();
                self.outbox_oldest.set(oldest.as_secs_f64());
            }
            Err(e) => {
                self.outbox_errors.inc();
                tracing::warn!(error = %e, "metrics: cannot read the outbox");
            }
        }
        crate::metrics::encode(&self.registry)
    }

    /// The router of the metrics listener bound at `local`: `GET /metrics`.
    /// On a loopback listener only a loopback `Host` with its port is
    /// answered (403 otherwise).
    pub fn router(self: &Arc<Self>, local: SocketAddr) -> Router {
        Router::new()
            .route(METRICS_PATH, axum::routing::get(scrape))
            .with_state(Scrape {
                metrics: self.clone(),
                local,
            })
    }
}

#[derive(Clone)]
struct Scrape {
    metrics: Arc<RelayMetrics>,
    local: SocketAddr,
}

async fn scrape(State(scrape): State<Scrape>, headers: HeaderMap) -> Response {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host_allowed(host, scrape.local) {
        return (StatusCode::FORBIDDEN, "Host not allowed\n").into_response();
    }
    exposition(scrape.metrics.render().await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_relay_core::envelope::FinishStatus;
    use graph_relay_core::ids::{CommandId, ExecutionId, ProjectId};
    use graph_relay_core::outbox::{OutboxError, OutboxItem};
    use graph_relay_core::time::ManualClock;

    struct EmptyOutbox;

    #[async_trait::async_trait]
    impl Outbox for EmptyOutbox {
        async fn put(&self, _: &OutboxItem) -> Result<(), OutboxError> {
            Ok(())
        }
        async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError> {
            Ok(Vec::new())
        }
        async fn record_attempt(&self, _: &CommandId) -> Result<(), OutboxError> {
            Ok(())
        }
        async fn remove(&self, _: &CommandId) -> Result<(), OutboxError> {
            Ok(())
        }
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
            rest.split_whitespace().next()?.parse().ok()
        })
    }

    #[tokio::test]
    async fn events_move_the_figures() {
        let clock = Arc::new(ManualClock::default());
        let metrics = RelayMetrics::new(Arc::new(EmptyOutbox), clock);
        let command = CommandId::from_uuid(uuid::Uuid::from_u128(7));
        let project = ProjectId::parse("p1").expect("id");
        let before = metrics.render().await;
        assert_eq!(
            sample(
                &before,
                r#"graph_relay_worker_failures_total{kind="control"}"#
            ),
            Some(0.0),
            "{before}"
        );
        assert_eq!(
            sample(&before, "graph_relay_worker_server_reachable"),
            Some(0.0)
        );
        for event in [
            RelayEvent::Synced {
                project: project.clone(),
                commands: 1,
            },
            RelayEvent::Started {
                command,
                execution: ExecutionId::parse("e1").expect("id"),
            },
            RelayEvent::ProgressPosted { command },
            RelayEvent::ControlFailed {
                command,
                reason: "timeout".into(),
            },
        ] {
            metrics.observe(&DriverEvent::Relay(event));
        }
        let text = metrics.render().await;
        assert_eq!(sample(&text, "graph_relay_worker_running"), Some(1.0));
        assert_eq!(
            sample(&text, "graph_relay_worker_server_reachable"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "graph_relay_worker_progress_posted_total"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"graph_relay_worker_failures_total{kind="control"}"#
            ),
            Some(1.0)
        );
        for event in [
            RelayEvent::Finished {
                command,
                status: FinishStatus::Failed,
                truncated: false,
            },
            RelayEvent::SyncFailed {
                project,
                reason: "connection refused".into(),
                unreachable: true,
            },
        ] {
            metrics.observe(&DriverEvent::Relay(event));
        }
        let text = metrics.render().await;
        assert_eq!(sample(&text, "graph_relay_worker_running"), Some(0.0));
        assert_eq!(
            sample(&text, r#"graph_relay_worker_runs_total{outcome="failed"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "graph_relay_worker_server_reachable"),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"graph_relay_worker_failures_total{kind="sync_unreachable"}"#
            ),
            Some(1.0)
        );
    }
}
