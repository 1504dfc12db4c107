//! Liveness and readiness for load balancers and orchestrators.
//!
//! - `GET /healthz`: 200 while the process serves requests at all (a
//!   stopped or wedged process does not answer, which is what a liveness
//!   probe wants to learn).
//! - `GET /readyz`: 200 only when the queue's store answers (one indexed
//!   read, [`Queue::ready`](graph_relay_core::queue::Queue::ready)) within
//!   [`READINESS_TIMEOUT`] and the server is not shutting down; 503
//!   otherwise, with `Retry-After`. It turns unready during a database
//!   outage and at the first moment of shutdown, before requests drain, so
//!   a load balancer takes the server out of rotation.
//!
//! Both are cheap, need no credentials, skip the Host/Origin check (a load
//! balancer's probe names the backend's address, not the public host) and
//! say nothing about owners, runs or configuration: a status word and, when
//! unready, which of the two reasons.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use graph_relay_core::mcp::STORE_RETRY_AFTER_SECONDS;
use graph_relay_core::queue::NotReady;

use crate::HttpState;

/// Path of the liveness probe.
pub const LIVENESS_PATH: &str = "/healthz";
/// Path of the readiness probe.
pub const READINESS_PATH: &str = "/readyz";
/// Longest wait for the store's answer before a readiness probe answers
/// 503: a paused database must not hold a load balancer's probe.
pub const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz` and `GET /readyz`; [`router`](crate::router) serves them.
pub fn health_routes(state: HttpState) -> Router {
    Router::new()
        .route(LIVENESS_PATH, get(live))
        .route(READINESS_PATH, get(ready))
        .with_state(state)
}

async fn live() -> Response {
    probe_answer(StatusCode::OK, r#"{"status":"live"}"#)
}

async fn ready(State(state): State<HttpState>) -> Response {
    let queue = state.mcp().queue();
    match tokio::time::timeout(READINESS_TIMEOUT, queue.ready()).await {
        Ok(Ok(())) => probe_answer(StatusCode::OK, r#"{"status":"ready"}"#),
        Ok(Err(NotReady::ShuttingDown)) => unready("shutting down"),
        Ok(Err(NotReady::Store(e))) => {
            tracing::warn!(error = %e, "not ready: the queue's store cannot be reached");
            unready("store unreachable")
        }
        Err(_) => {
            tracing::warn!(
                timeout = ?READINESS_TIMEOUT,
                "not ready: the queue's store did not answer in time"
            );
            unready("store unreachable")
        }
    }
}

fn unready(reason: &'static str) -> Response {
    let mut response = probe_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(r#"{{"status":"unready","reason":"{reason}"}}"#),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(STORE_RETRY_AFTER_SECONDS),
    );
    response
}

fn probe_answer(status: StatusCode, body: &str) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body.to_owned(),
    )
        .into_response()
}
