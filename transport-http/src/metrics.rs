//! Prometheus metrics of a serving graph-relay: `GET /metrics` in the
//! OpenMetrics text format (which Prometheus scrapes as its text format).
//!
//! The endpoint is meant for its **own listener** (`serve --metrics
//! 127.0.0.1:9187`), never the MCP port: its figures are totals over every
//! owner, so an agent or desktop of one owner must not be able to read how
//! busy the others are. No metric carries an owner, agent, desktop,
//! project or command in its labels; labels are fixed sets (a status, a
//! route pattern, a method, an HTTP status code).
//!
//! Gauges are computed when scraped: the queue's figures from the store
//! (through [`OperatorStats`], when the store offers them), held requests
//! from the queue's wake-ups, sessions and listen streams from the HTTP
//! state. Counters and the pickup histogram accumulate from scrape to
//! scrape: each scrape adds the runs that finished since the previous one
//! (up to [`SETTLE`] ago, so a write whose clock reading precedes its
//! commit is not missed). HTTP requests are counted by the middleware
//! [`Metrics::instrument`] puts on the MCP router.
//!
//! The same listener can answer an operator: `GET /admin/status`
//! ([`Metrics::with_operator_status`]) returns the JSON document of
//! `graph-relay status --json`, to a bearer of the operator token. It spans
//! every owner, so it is never on the MCP port either.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `graph_relay_runs` | gauge | `status` (`queued`, `running`) | runs in the queue now |
//! | `graph_relay_queue_depth` | gauge | | queued runs (all owners) |
//! | `graph_relay_queue_oldest_seconds` | gauge | | age of the oldest queued run (0 when none) |
//! | `graph_relay_runs_finished_total` | counter | `status` (`completed`, `failed`, `cancelled`) | runs that finished since the server started |
//! | `graph_relay_pickup_latency_seconds` | histogram | | queued → running, observed when the run finishes |
//! | `graph_relay_cancel_latency_seconds` | histogram | | cancel requested → run finished, for the runs whose agent asked to cancel them |
//! | `graph_relay_desktops_online` | gauge | | desktops heard from within three expected sync gaps |
//! | `graph_relay_desktops_known` | gauge | | desktops ever seen |
//! | `graph_relay_held_requests` | gauge | | requests parked on the queue's wake-ups now: held syncs and control polls, `wait_seconds` calls, listen streams |
//! | `graph_relay_notifications_total` | counter | | topics notified to this server's held requests (its own writes and, on a shared store, other servers' forwarded hints) |
//! | `graph_relay_wakeups_total` | counter | | held requests those notifications woke: divided by `graph_relay_notifications_total`, the wake-ups per notification (about 1: a notification wakes only the requests it concerns) |
//! | `graph_relay_wakeups_all_total` | counter | | held requests woken all at once because another process wrote while its hints could not arrive (an external write seen by the SQLite marker, a wake-up bridge that reconnected) |
//! | `graph_relay_mcp_sessions` | gauge | | initialize-era MCP sessions |
//! | `graph_relay_listen_streams` | gauge | | open `subscriptions/listen` streams |
//! | `graph_relay_http_requests_total` | counter | `route`, `method`, `status` | answered HTTP requests by route pattern (`unmatched` for unknown paths) |
//! | `graph_relay_metrics_store_errors_total` | counter | | scrapes whose store figures could not be read |
//! | `graph_relay_store_operation_seconds` | histogram | `operation` (a [`Store`] method, [`OPERATIONS`](crate::store_timing::OPERATIONS)) | how long each store call took, for a store wrapped by [`Metrics::timed_store`] |

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use graph_relay_core::stats::{OperatorStats, STATUS_WINDOW, StatusReport};
use graph_relay_core::time::Clock;
use graph_relay_core::time::{SystemClock, Timestamp};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use graph_relay_core::store::Store;

use crate::HttpState;
use crate::store_timing::{OperationHistograms, TimedStore, Timing, operation_histograms};

/// The path of the metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";

/// The path of the operator's status on the metrics listener.
pub const STATUS_PATH: &str = "/admin/status";

/// Queued runs listed by `/admin/status` unless `?limit=` says otherwise.
pub const STATUS_DEFAULT_LIMIT: usize = 20;

/// The most queued runs `/admin/status` lists.
pub const STATUS_MAX_LIMIT: usize = 1000;

/// How far behind the present a scrape counts finished runs.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Upper bounds (seconds) of the latency histograms' buckets: from a
/// long-polling desktop's milliseconds to an offline desktop's minutes.
const PICKUP_BUCKETS: [f64; 16] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 3600.0,
];

/// Who may read `/admin/status`, and from what.
struct Operator {
    /// SHA-256 (hex) of the operator token.
    token_sha256: String,
    /// The status source; `None` when the store cannot tell it.
    source: Option<Arc<dyn OperatorStats>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    method: String,
    status: String,
}

/// The registry and its metrics.
pub struct Metrics {
    registry: Registry,
    runs: Family<StatusLabels, Gauge>,
    queue_depth: Gauge,
    queue_oldest: Gauge<f64, AtomicU64>,
    finished: Family<StatusLabels, Counter>,
    pickup: Histogram,
    cancel: Histogram,
    desktops_online: Gauge,
    desktops_known: Gauge,
    held: Gauge,
    notifications: Counter,
    wakeups: Counter,
    wakeups_all: Counter,
    sessions: Gauge,
    listen_streams: Gauge,
    http_requests: Family<HttpLabels, Counter>,
    store_errors: Counter,
    store_operations: OperationHistograms,
    figures: Option<Arc<dyn OperatorStats>>,
    operator: Option<Operator>,
    /// Finished runs up to this time are counted.
    counted_until: tokio::sync::Mutex<Timestamp>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("figures", &self.figures.is_some())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics whose queue figures come from `figures` (if any); runs that
    /// finished before now are not counted.
    pub fn new(figures: Option<Arc<dyn OperatorStats>>) -> Self {
        let mut metrics = Self {
            registry: Registry::default(),
            runs: Family::default(),
            queue_depth: Gauge::default(),
            queue_oldest: Gauge::default(),
            finished: Family::default(),
            pickup: Histogram::new(PICKUP_BUCKETS),
            cancel: Histogram::new(PICKUP_BUCKETS),
            desktops_online: Gauge::default(),
            desktops_known: Gauge::default(),
            held: Gauge::default(),
            notifications: Counter::default(),
            wakeups: Counter::default(),
            wakeups_all: Counter::default(),
            sessions: Gauge::default(),
            listen_streams: Gauge::default(),
            http_requests: Family::default(),
            store_errors: Counter::default(),
            store_operations: operation_histograms(),
            figures,
            operator: None,
            counted_until: tokio::sync::Mutex::new(SystemClock.now()),
        };
        metrics.register();
        metrics
    }

    /// Names each metric in the registry, with its help text, in the order
    /// a scrape lists them: first the queue's figures, then this server's.
    fn register(&mut self) {
        self.register_queue_figures();
        self.register_server_figures();
    }

    /// The figures of the queue, read from the store at each scrape.
    fn register_queue_figures(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "graph_relay_runs",
            "Runs in the queue now, by status (queued, running)",
            self.runs.clone(),
        );
        registry.register(
            "graph_relay_queue_depth",
            "Queued runs, all owners",
            self.queue_depth.clone(),
        );
        registry.register(
            "graph_relay_queue_oldest_seconds",
            "Age of the oldest queued run in seconds (0 when none)",
            self.queue_oldest.clone(),
        );
        registry.register(
            "graph_relay_runs_finished",
            "Runs that finished since the server started, by status",
            self.finished.clone(),
        );
        registry.register(
            "graph_relay_pickup_latency_seconds",
            "Queued to running, observed when the run finishes",
            self.pickup.clone(),
        );
        registry.register(
            "graph_relay_cancel_latency_seconds",
            "Cancel requested to run finished, for runs their agent asked to cancel",
            self.cancel.clone(),
        );
        registry.register(
            "graph_relay_desktops_online",
            "Desktops heard from within three expected sync gaps",
            self.desktops_online.clone(),
        );
        registry.register(
            "graph_relay_desktops_known",
            "Desktops ever seen",
            self.desktops_known.clone(),
        );
    }

    /// The figures of this server: its held requests and wake-ups, its MCP
    /// sessions and streams, the requests it answered and its store calls.
    fn register_server_figures(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "graph_relay_held_requests",
            "Requests parked on the queue's wake-ups (held syncs and control polls, waiting calls, listen streams)",
            self.held.clone(),
        );
        registry.register(
            "graph_relay_notifications",
            "Topics notified to this server's held requests",
            self.notifications.clone(),
        );
        registry.register(
            "graph_relay_wakeups",
            "Held requests woken by a notification of their topic",
            self.wakeups.clone(),
        );
        registry.register(
            "graph_relay_wakeups_all",
            "Held requests woken all at once after another process wrote unannounced",
            self.wakeups_all.clone(),
        );
        registry.register(
            "graph_relay_mcp_sessions",
            "Initialize-era MCP sessions",
            self.sessions.clone(),
        );
        registry.register(
            "graph_relay_listen_streams",
            "Open subscriptions/listen streams",
            self.listen_streams.clone(),
        );
        registry.register(
            "graph_relay_http_requests",
            "Answered HTTP requests by route pattern, method and status",
            self.http_requests.clone(),
        );
        registry.register(
            "graph_relay_metrics_store_errors",
            "Scrapes whose store figures could not be read",
            self.store_errors.clone(),
        );
        registry.register(
            "graph_relay_store_operation_seconds",
            "How long each store call took, by Store method",
            self.store_operations.clone(),
        );
    }

    /// Serves `GET /admin/status` on the metrics listener to a bearer of the
    /// token whose SHA-256 (hex) is `token_sha256`, with the document of
    /// `source` (`None`: the store cannot tell it; answered 501). Without
    /// this call the path answers 404.
    pub fn with_operator_status(
        mut self,
        token_sha256: String,
        source: Option<Arc<dyn OperatorStats>>,
    ) -> Self {
        self.operator = Some(Operator {
            token_sha256: token_sha256.to_ascii_lowercase(),
            source,
        });
        self
    }

    /// `store` with each of its calls timed into
    /// `graph_relay_store_operation_seconds`: install it under the queue
    /// whose store these metrics describe.
    pub fn timed_store(&self, store: Arc<dyn Store>) -> TimedStore {
        Timing::store(store, self.store_operations.clone())
    }

    /// `router` with every answered request counted by route pattern,
    /// method and status.
    pub fn instrument(self: &Arc<Self>, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            count_request,
        ))
    }

    /// The router of the metrics listener bound at `local`: `GET /metrics`
    /// reading `state`, and `GET /admin/status` for the operator. On a
    /// loopback listener only a loopback `Host` with its port is answered
    /// (403 otherwise), so a web page cannot read the figures through DNS
    /// rebinding.
    pub fn router(self: &Arc<Self>, state: HttpState, local: SocketAddr) -> Router {
        Router::new()
            .route(METRICS_PATH, axum::routing::get(scrape))
            .route(STATUS_PATH, axum::routing::get(operator_status))
            .with_state(Scrape {
                metrics: self.clone(),
                state,
                local,
            })
    }

    /// Brings every gauge up to date and returns the text exposition.
    pub async fn render(&self, state: &HttpState) -> String {
        self.refresh(state).await;
        encode(&self.registry)
    }

    async fn refresh(&self, state: &HttpState) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let signals = state.mcp().queue().signals();
        self.held.set(gauge(signals.waiting()));
        let counts = signals.counts();
        // The totals live in the signals; the counters catch up to them.
        for (counter, total) in [
            (&self.notifications, counts.notified),
            (&self.wakeups, counts.woken),
            (&self.wakeups_all, counts.woken_all),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.sessions.set(gauge(state.session_count()));
        self.listen_streams.set(gauge(state.listen_count()));
        let Some(figures) = &self.figures else {
            return;
        };
        // One scrape at a time counts finished runs, each exactly once.
        let mut counted_until = self.counted_until.lock().await;
        let now = SystemClock.now();
        let until = now.minus(SETTLE).max(*counted_until);
        match figures.figures(now, *counted_until, until).await {
            Ok(snapshot) => {
                *counted_until = until;
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                for (status, n) in [("queued", snapshot.queued), ("running", snapshot.running)] {
                    self.runs
                        .get_or_create(&StatusLabels {
                            status: status.into(),
                        })
                        .set(count(n));
                }
                self.queue_depth.set(count(snapshot.queued));
                self.queue_oldest.set(
                    snapshot
                        .oldest_queued_at
                        .map_or(0.0, |t| now.since(t).as_secs_f64()),
                );
                self.desktops_online.set(count(snapshot.desktops_online));
                self.desktops_known.set(count(snapshot.desktops_known));
                for status in ["completed", "failed", "cancelled"] {
                    // Present from the first scrape, so rates start at 0.
                    let _ = self.finished.get_or_create(&StatusLabels {
                        status: status.into(),
                    });
                }
                for run in snapshot.finished {
                    self.finished
                        .get_or_create(&StatusLabels { status: run.status })
                        .inc();
                    if let Some(pickup) = run.pickup {
                        self.pickup.observe(pickup.as_secs_f64());
                    }
                    if let Some(cancel) = run.cancel {
                        self.cancel.observe(cancel.as_secs_f64());
                    }
                }
            }
            Err(e) => {
                self.store_errors.inc();
                tracing::warn!(error = %e, "metrics: cannot read the queue's figures");
            }
        }
    }
}

#[derive(Clone)]
struct Scrape {
    metrics: Arc<Metrics>,
    state: HttpState,
    local: SocketAddr,
}

/// Whether `host` (a `Host` header) may read the metrics of `local`: any
/// host on a non-loopback listener (the operator chose to expose it), else
/// only a loopback name with the listener's port (no DNS rebinding).
pub(crate) fn host_allowed(host: Option<&str>, local: SocketAddr) -> bool {
    if !local.ip().is_loopback() {
        return true;
    }
    let port = local.port();
    host.is_some_and(|h| {
        [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ]
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(h))
    })
}

async fn scrape(State(scrape): State<Scrape>, headers: axum::http::HeaderMap) -> Response {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host_allowed(host, scrape.local) {
        return (StatusCode::FORBIDDEN, "Host not allowed\n").into_response();
    }
    exposition(scrape.metrics.render(&scrape.state).await)
}

/// The `?limit=` of `/admin/status`.
#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    limit: Option<usize>,
}

async fn operator_status(
    State(scrape): State<Scrape>,
    headers: axum::http::HeaderMap,
    query: Result<axum::extract::Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host_allowed(host, scrape.local) {
        return (StatusCode::FORBIDDEN, "Host not allowed\n").into_response();
    }
    let Some(operator) = &scrape.metrics.operator else {
        return (
            StatusCode::NOT_FOUND,
            "no operator token is configured ([server] operator_token_sha256; `graph-relay token operator`)\n",
        )
            .into_response();
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim);
    // Hashes compared, so the comparison's time says nothing of the token.
    if presented.is_none_or(|t| crate::auth::hash_token(t) != operator.token_sha256) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "the operator token is required\n",
        )
            .into_response();
    }
    let Ok(axum::extract::Query(query)) = query else {
        return (StatusCode::BAD_REQUEST, "limit: a whole number\n").into_response();
    };
    let limit = query
        .limit
        .unwrap_or(STATUS_DEFAULT_LIMIT)
        .clamp(1, STATUS_MAX_LIMIT);
    let Some(source) = &operator.source else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "the status needs a database store (SQLite or Postgres)\n",
        )
            .into_response();
    };
    match source.stats(SystemClock.now(), STATUS_WINDOW, limit).await {
        Ok(stats) => axum::Json(StatusReport::from_stats(&stats)).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "status: cannot read the store");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the store: {e}\n"),
            )
                .into_response()
        }
    }
}

/// The text exposition of `registry`.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
        // Writing into a String does not fail; keep what was written.
        tracing::warn!("metrics: encoding failed");
    }
    text
}

/// A 200 answer carrying `text` as OpenMetrics.
pub(crate) fn exposition(text: String) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn count_request(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    // A fixed set: a client inventing methods must not grow the label set.
    let method = match request.method().as_str() {
        m @ ("GET" | "POST" | "DELETE" | "HEAD" | "OPTIONS" | "PUT" | "PATCH") => m,
        _ => "other",
    }
    .to_owned();
    let response = next.run(request).await;
    metrics
        .http_requests
        .get_or_create(&HttpLabels {
            route,
            method,
            status: response.status().as_u16().to_string(),
        })
        .inc();
    response
}
