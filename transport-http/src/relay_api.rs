//! The relay API handlers (server side): sync, start, control, complete,
//! decline, progress.
//!
//! Plain async handlers over [`Queue`](graph_relay_core::queue::Queue); the wire types are in
//! [`crate::relay_wire`]; [`crate::relay_routes`] mounts them. Each request
//! passes the Host/Origin check, then needs a *device* token (an agent
//! token gets 403), which the handler takes with the
//! [`DevicePrincipal`] extractor. The core keys every
//! relay operation by the device's owner and id, so a device never sees or
//! touches another owner's projects or another device's commands.
//!
//! # Held requests
//! A long-poll sync or control request is a core [`Hold`] made by
//! [`Queue::sync_hold`](graph_relay_core::queue::Queue::sync_hold) or
//! [`Queue::control_hold`](graph_relay_core::queue::Queue::control_hold): it subscribes to the
//! topics that can change its answer *before* it looks, answers at once
//! when work is queued (sync) or cancellation was requested or the command
//! ended (control), and otherwise waits until a topic fires (a sync then
//! answers with what is queued, possibly nothing, so the relay starts a
//! fresh pass), until the hold bound passes, or until a periodic look at
//! the store finds a change made by another process on the same database
//! (every `hold_recheck` when such changes show only by reading; see
//! [`Queue::external_writes_fed`](graph_relay_core::queue::Queue::external_writes_fed)).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use graph_relay_core::command::{CompleteRefused, NO_LONGER_SHARED};
use graph_relay_core::envelope::ResultEnvelope;
use graph_relay_core::hold::Hold;
use graph_relay_core::ids::CommandId;
use graph_relay_core::queue::{
    CompleteAck, CompleteError, ControlError, DeclineAck, DeclineError, ProgressAck, ProgressError,
    StartError, SyncError, SyncRequest,
};
use graph_relay_core::store::StoreError;
use serde::de::DeserializeOwned;

use crate::relay_wire::{
    ControlBody, ControlReply, DeclineBody, ErrorReply, ProgressBody, ProgressReply, ReportReply,
    StartBody, StartReply, SyncBody, SyncReply, WireCommand,
};
use crate::{DevicePrincipal, HttpState, TokioSleeper};

/// Tunables of the relay API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayApiConfig {
    /// Longest hold of a long-poll sync or control request; `None` uses the
    /// queue's [`long_poll_hold`](graph_relay_core::queue::QueueConfig::long_poll_hold)
    /// (25 s). Always kept below the request timeout. A control request is
    /// held for less when its run's lease is short: the queue cuts it to a
    /// third of the lease ([`QueueConfig::control_hold`](graph_relay_core::queue::QueueConfig::control_hold)).
    pub hold: Option<Duration>,
    /// While holding, how often the store is looked at directly, for work
    /// queued by another process on the same database. `None` (the
    /// default) follows the queue: every
    /// [`hold_recheck`](graph_relay_core::queue::QueueConfig::hold_recheck)
    /// (500 ms) when such work shows only by reading the store, otherwise
    /// only as a rare safety net, so that thousands of held requests cost
    /// nothing while nothing happens. `Some` forces a pace.
    pub recheck: Option<Duration>,
}

/// A refusal, rendered as [`ErrorReply`].
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Whether the same request may succeed later: set from the queue's
    /// errors' own `is_retryable()` (a store failure), never guessed from
    /// the status. A retryable refusal carries `Retry-After`.
    retryable: bool,
}

impl ApiError {
    /// A final refusal of this request.
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retryable: false,
        }
    }

    fn conflict(code: &'static str, refusal: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::CONFLICT, code, refusal.to_string())
    }

    fn unprocessable(code: &'static str, refusal: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, refusal.to_string())
    }

    /// The store failed; the details stay in the server's log.
    fn unavailable(e: &StoreError) -> Self {
        tracing::error!(error = %e, "relay API: store failed");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the queue is unavailable; retry later",
        )
    }

    fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "command_not_found",
            "command not found for this device",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            axum::Json(ErrorReply {
                error: self.code.to_owned(),
                message: self.message,
                retryable: self.retryable,
            }),
        )
            .into_response();
        if self.retryable {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(graph_relay_core::mcp::STORE_RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

impl From<ApiError> for Response {
    fn from(refusal: ApiError) -> Self {
        refusal.into_response()
    }
}

/// The queue's refusals as the relay API answers them: each error's
/// variant names its status and code, and whether the device may retry
/// comes from the error's own `is_retryable()`.
macro_rules! api_errors {
    ($($error:ident: |$e:ident| $refusal:expr;)*) => {
        $(
            impl From<$error> for ApiError {
                fn from($e: $error) -> Self {
                    let retryable = $e.is_retryable();
                    Self { retryable, ..$refusal }
                }
            }
        )*
    };
}

api_errors! {
    SyncError: |e| match e {
        SyncError::Store(e) => Self::unavailable(&e),
        e @ SyncError::TooManyProjects { .. } => Self::unprocessable("too_many_projects", e),
        other => Self::unprocessable("invalid_sessions", other),
    };
    StartError: |e| match e {
        StartError::NotFound => Self::not_found(),
        StartError::Refused(r) => Self::conflict("start_refused", r),
        StartError::Store(e) => Self::unavailable(&e),
    };
    ControlError: |e| match e {
        ControlError::NotFound => Self::not_found(),
        ControlError::Store(e) => Self::unavailable(&e),
    };
    CompleteError: |e| match e {
        CompleteError::NotFound => Self::not_found(),
        CompleteError::Invalid(e) => Self::unprocessable("invalid_envelope", e),
        CompleteError::Refused(
            r @ (CompleteRefused::NotStarted | CompleteRefused::ClosedBeforeStart(_)),
        ) => Self::conflict("not_started", r),
        CompleteError::Refused(r @ CompleteRefused::Lapsed(_)) => Self::conflict("run_closed", r),
        CompleteError::Refused(r) => Self::conflict("completion_refused", r),
        CompleteError::Store(e) => Self::unavailable(&e),
    };
    DeclineError: |e| match e {
        DeclineError::NotFound => Self::not_found(),
        DeclineError::Refused(r) => Self::conflict("decline_refused", r),
        DeclineError::Store(e) => Self::unavailable(&e),
    };
    ProgressError: |e| match e {
        ProgressError::NotFound => Self::not_found(),
        ProgressError::Invalid(e) => Self::unprocessable("invalid_progress", e),
        ProgressError::Refused(r) => Self::conflict("progress_refused", r),
        ProgressError::Store(e) => Self::unavailable(&e),
    };
}

type ApiResult<T> = Result<axum::Json<T>, Response>;

/// How a body that is JSON but not of the expected shape is refused.
#[derive(Clone, Copy)]
struct ShapeRefusal {
    status: StatusCode,
    code: &'static str,
    what: &'static str,
}

/// Sync, start, control and decline bodies.
const BAD_REQUEST_BODY: ShapeRefusal = ShapeRefusal {
    status: StatusCode::BAD_REQUEST,
    code: "invalid_request",
    what: "the request body",
};

/// The result envelope of `complete` (SPEC §7).
const BAD_ENVELOPE: ShapeRefusal = ShapeRefusal {
    status: StatusCode::UNPROCESSABLE_ENTITY,
    code: "invalid_envelope",
    what: "the result envelope (SPEC §7)",
};

/// Decodes a body: 413 past the body limit, 400 `invalid_json` when it is
/// not JSON, and `shape` when it is JSON of the wrong shape. Every message
/// names what was wrong and where: the field as a path (`sessions[3].name`)
/// and the rule it breaks. An empty body reads as `{}`.
#[allow(clippy::result_large_err)]
fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    shape: ShapeRefusal,
) -> Result<T, Response> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than this server accepts",
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                rejection.body_text(),
            )
        }
        .into_response()
    })?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    // A body of the right shape, the common case, decodes at once; only a
    // refused one is decoded again, tracking the path, to name the field.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut decoder = serde_json::Deserializer::from_slice(bytes);
    let (path, inner) = match serde_path_to_error::deserialize::<_, T>(&mut decoder) {
        Ok(value) => match decoder.end() {
            Ok(()) => return Ok(value),
            Err(e) => (String::new(), e),
        },
        Err(e) => (e.path().to_string(), e.into_inner()),
    };
    let refusal = if inner.is_syntax() || inner.is_eof() {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the request body is not valid JSON: {inner}"),
        )
    } else if path.is_empty() || path == "." {
        ApiError::new(shape.status, shape.code, format!("{}: {inner}", shape.what))
    } else {
        ApiError::new(
            shape.status,
            shape.code,
            format!("{}: field `{path}`: {inner}", shape.what),
        )
    };
    Err(refusal.into_response())
}

#[allow(clippy::result_large_err)]
fn parse_command(text: &str) -> Result<CommandId, Response> {
    CommandId::parse(text).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()).into_response()
    })
}

fn hold_bound(state: &HttpState) -> Duration {
    let queue_hold = state.mcp().queue().config().long_poll_hold;
    let hold = state.config().relay.hold.unwrap_or(queue_hold);
    // Answer before the request timeout turns the held request into a 408.
    let ceiling = state
        .config()
        .request_timeout
        .saturating_sub(Duration::from_secs(1));
    hold.min(ceiling)
}

/// `POST /sync`.
pub(crate) async fn sync(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<SyncReply> {
    let body: SyncBody = parse_body(body, BAD_REQUEST_BODY)?;
    let queue = state.mcp().queue();
    let request = SyncRequest {
        project: body.project_id,
        sessions: body.sessions,
        long_poll: body.long_poll,
        restarted: body.restarted,
        running: body.running_command_id,
    };
    let limit = |hold| bounded(&state, hold);
    let response = queue
        .sync_held(&device, &request, limit, &TokioSleeper)
        .await
        .map_err(ApiError::from)?;
    let commands = response.commands;
    Ok(axum::Json(SyncReply {
        commands: commands.iter().map(WireCommand::from_record).collect(),
        poll_after_seconds: response.poll_after.as_secs(),
    }))
}

/// `hold` within this transport's bound ([`RelayApiConfig::hold`], and
/// before the request timeout) and at its re-look pace
/// ([`RelayApiConfig::recheck`], if set).
fn bounded(state: &HttpState, mut hold: Hold) -> Hold {
    if let Some(recheck) = state.config().relay.recheck {
        hold.recheck = recheck;
    }
    let now = state.mcp().queue().now();
    hold.until_at_most(now.plus(hold_bound(state)))
}

/// `POST /commands/{id}/start`.
pub(crate) async fn start(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StartReply> {
    let id = parse_command(&id)?;
    let body: StartBody = parse_body(body, BAD_REQUEST_BODY)?;
    let record = state
        .mcp()
        .queue()
        .start(&device, &id, &body.execution_id)
        .await
        .map_err(ApiError::from)?;
    Ok(axum::Json(StartReply {
        command_id: record.id,
        status: record.status.as_str().to_owned(),
        execution_id: body.execution_id,
    }))
}

/// `POST /commands/{id}/control`.
pub(crate) async fn control(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<ControlReply> {
    let id = parse_command(&id)?;
    let body: ControlBody = parse_body(body, BAD_REQUEST_BODY)?;
    let queue = state.mcp().queue();
    let limit = |hold| bounded(&state, hold);
    let answer = queue
        .control_held(&device, &id, body.long_poll, limit, &TokioSleeper)
        .await
        .map_err(ApiError::from)?;
    Ok(axum::Json(ControlReply {
        cancel_requested: answer.cancel_requested,
        status: answer.status.as_str().to_owned(),
    }))
}

/// `POST /commands/{id}/complete`.
pub(crate) async fn complete(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<ReportReply> {
    let id = parse_command(&id)?;
    let envelope: ResultEnvelope = parse_body(body, BAD_ENVELOPE)?;
    let queue = state.mcp().queue();
    let ack = queue
        .complete(&device, &id, &envelope)
        .await
        .map_err(ApiError::from)?;
    let status = ack.record().status.as_str().to_owned();
    Ok(axum::Json(match ack {
        CompleteAck::Recorded(_) => ReportReply {
            status,
            duplicate: false,
            message: None,
        },
        CompleteAck::Duplicate(_) => ReportReply {
            status,
            duplicate: true,
            message: Some("this completion had been recorded already; nothing changed".into()),
        },
    }))
}

/// `POST /commands/{id}/decline`.
pub(crate) async fn decline(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<ReportReply> {
    let id = parse_command(&id)?;
    let _: DeclineBody = parse_body(body, BAD_REQUEST_BODY)?;
    let ack = state
        .mcp()
        .queue()
        .decline(&device, &id)
        .await
        .map_err(ApiError::from)?;
    Ok(axum::Json(match ack {
        DeclineAck::Recorded(record) => ReportReply {
            status: record.status.as_str().to_owned(),
            duplicate: false,
            message: None,
        },
        DeclineAck::Unchanged(record) => {
            let message = match record.reason.as_deref() {
                Some(NO_LONGER_SHARED) => {
                    "this command had been declined already; nothing changed".to_owned()
                }
                Some(reason) => format!(
                    "the command was already {} ({reason}); nothing changed",
                    record.status.as_str()
                ),
                None => format!(
                    "the command was already {}; nothing changed",
                    record.status.as_str()
                ),
            };
            ReportReply {
                status: record.status.as_str().to_owned(),
                duplicate: true,
                message: Some(message),
            }
        }
    }))
}

/// A progress body that is JSON of the wrong shape (a percent that is not
/// a number, an unknown field).
const BAD_PROGRESS: ShapeRefusal = ShapeRefusal {
    status: StatusCode::UNPROCESSABLE_ENTITY,
    code: "invalid_progress",
    what: "the progress report",
};

/// `POST /commands/{id}/progress`.
pub(crate) async fn progress(
    State(state): State<HttpState>,
    DevicePrincipal { device, .. }: DevicePrincipal,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<ProgressReply> {
    let id = parse_command(&id)?;
    let body: ProgressBody = parse_body(body, BAD_PROGRESS)?;
    let ack = state
        .mcp()
        .queue()
        .report_progress(&device, &id, &body.execution_id, body.message, body.percent)
        .await
        .map_err(ApiError::from)?;
    Ok(axum::Json(ProgressReply {
        status: "running".to_owned(),
        recorded: match ack {
            ProgressAck::Recorded => "recorded",
            ProgressAck::Coalesced => "coalesced",
            ProgressAck::Unchanged => "unchanged",
        }
        .to_owned(),
    }))
}

/// `GET /openapi.json`.
pub(crate) async fn openapi(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check_host_and_origin(&headers) {
        return response;
    }
    axum::Json(crate::relay_wire::openapi()).into_response()
}
