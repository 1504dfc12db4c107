//! The desktop relay's HTTP transport: the relay API spoken by the core's driver.
//!
//! [`HttpRelayTransport`] speaks the relay API (reqwest over rustls) and maps
//! every answer onto the inputs of the state machine: a 2xx is success;
//! anything else becomes a [`Refusal`] carrying the server's `retryable` flag
//! ([`ErrorReply`]), and the core's one mapping decides: `retryable: false`
//! is final ([`PostOutcome::Rejected`], [`ClaimOutcome::Refused`],
//! [`SyncFailure::Refused`]); a retryable refusal, an answer without the flag
//! (e.g. a 401 of the authentication layer, a proxy's 502) and no answer at
//! all are retried later. The status code alone never decides.
//!
//! The driver itself is the core's runtime-free
//! [`RelayDriver`](graph_relay_core::relay::driver::RelayDriver), with its
//! [`RelayTransport`] trait: this module supplies only the HTTP transport.

use std::time::Duration;

use async_trait::async_trait;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::ids::{CommandId, ExecutionId};
use graph_relay_core::outbox::{OutboxItem, RelayReport};
use graph_relay_core::queue::{ControlAnswer, SyncRequest};
use graph_relay_core::relay::driver::RelayTransport;
use graph_relay_core::relay::executor::ProgressReport;
use graph_relay_core::relay::{ClaimOutcome, PostOutcome, Refusal, RelayCommand, SyncFailure};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::relay_wire::{
    ControlBody, ControlReply, ErrorReply, ProgressBody, StartBody, SyncBody, SyncReply,
    command_path, sync_path,
};

/// How long the relay keeps an idle connection to the server (5 s). A
/// relay needs one connection for its held sync and, while a run runs,
/// another for its held control request; the start, progress and
/// completion posts in between open more when both are busy. Kept idle
/// for longer, those extra connections added up on the server: at 200 runs
/// a second over 10,000 desktops, each run left one behind for the
/// server's 30 s idle timeout, 6,000 connections in all.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most idle connections the relay keeps to the server (2: the held sync's
/// and the held control request's).
pub const POOL_MAX_IDLE: usize = 2;

/// Settings of [`HttpRelayTransport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRelayConfig {
    /// Base URL of the server, e.g. `https://relay.example.com` (no trailing slash needed).
    pub server: String,
    /// The device token.
    pub token: String,
    /// Timeout of an ordinary request (15 s).
    pub request_timeout: Duration,
    /// Timeout of a held request: the server's hold bound plus slack (40 s).
    pub held_timeout: Duration,
    /// Connect timeout (5 s).
    pub connect_timeout: Duration,
    /// How long a connection may sit unused before it is closed
    /// ([`POOL_IDLE_TIMEOUT`]).
    pub pool_idle_timeout: Duration,
    /// Most unused connections kept open for the next request
    /// ([`POOL_MAX_IDLE`]); a connection freed beyond that is closed.
    pub pool_max_idle: usize,
}

impl HttpRelayConfig {
    /// Defaults for `server` and `token`.
    pub fn new(server: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            server: server.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            request_timeout: Duration::from_secs(15),
            held_timeout: Duration::from_secs(40),
            connect_timeout: Duration::from_secs(5),
            pool_idle_timeout: POOL_IDLE_TIMEOUT,
            pool_max_idle: POOL_MAX_IDLE,
        }
    }
}

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    /// The server URL is not `http://` or `https://`.
    #[error("the server URL must start with http:// or https://, got `{0}`")]
    BadUrl(String),
    /// The device token is empty or contains characters a header cannot carry.
    #[error("the device token is empty or not printable ASCII")]
    BadToken,
    /// reqwest refused the configuration.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The relay API over HTTP (reqwest with rustls).
#[derive(Debug, Clone)]
pub struct HttpRelayTransport {
    client: reqwest::Client,
    config: HttpRelayConfig,
}

/// How one request ended: the answer, or why not (with the server's word
/// on retrying, if it gave one).
type Answer<T> = Result<T, Refusal>;

impl HttpRelayTransport {
    /// A client for `config`.
    pub fn new(config: HttpRelayConfig) -> Result<Self, ClientBuildError> {
        if !(config.server.starts_with("http://") || config.server.starts_with("https://")) {
            return Err(ClientBuildError::BadUrl(config.server));
        }
        if config.token.is_empty() || !config.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientBuildError::BadToken);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_max_idle_per_host(config.pool_max_idle)
            .user_agent(concat!("graph-relay/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, config })
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        held: bool,
    ) -> Answer<T> {
        let timeout = if held {
            self.config.held_timeout
        } else {
            self.config.request_timeout
        };
        let response = self
            .client
            .post(format!("{}{path}", self.config.server))
            .bearer_auth(&self.config.token)
            .timeout(timeout)
            .json(body)
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => return Err(Refusal::no_answer(format!("network error: {e}"))),
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Err(Refusal::no_answer(format!(
                    "network error reading the answer: {e}"
                )));
            }
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| Refusal::no_answer(format!("unreadable answer ({status}): {e}")));
        }
        Err(refusal(status, &bytes))
    }
}

/// A non-2xx answer as a [`Refusal`]: the server's [`ErrorReply`] carries its
/// `retryable` flag; any other body (an authentication challenge, a proxy's
/// page) carries none, and is therefore tried again.
fn refusal(status: reqwest::StatusCode, body: &[u8]) -> Refusal {
    match serde_json::from_slice::<ErrorReply>(body) {
        Ok(e) => Refusal::new(
            Some(e.retryable),
            format!("{status} {}: {}", e.error, e.message),
        ),
        Err(_) => Refusal::new(
            None,
            format!("{status}: {}", String::from_utf8_lossy(body).trim()),
        ),
    }
}

#[async_trait]
impl RelayTransport for HttpRelayTransport {
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure> {
        let body = SyncBody {
            project_id: request.project.clone(),
            sessions: request.sessions.clone(),
            long_poll: request.long_poll,
            restarted: request.restarted,
            running_command_id: request.running,
        };
        self.post::<_, SyncReply>(&sync_path(), &body, request.long_poll)
            .await
            .map(|reply| {
                reply
                    .commands
                    .into_iter()
                    .map(|c| c.into_relay_command())
                    .collect()
            })
            .map_err(SyncFailure::from)
    }

    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome {
        let body = StartBody {
            execution_id: execution.clone(),
        };
        match self
            .post::<_, serde_json::Value>(&command_path(command, "start"), &body, false)
            .await
        {
            Ok(_) => ClaimOutcome::Granted,
            Err(refusal) => refusal.into(),
        }
    }

    async fn control(
        &self,
        command: &CommandId,
        long_poll: bool,
    ) -> Result<ControlAnswer, Refusal> {
        let body = ControlBody { long_poll };
        match self
            .post::<_, ControlReply>(&command_path(command, "control"), &body, long_poll)
            .await
        {
            Ok(reply) => match CommandStatus::parse(&reply.status) {
                Some(status) => Ok(ControlAnswer {
                    cancel_requested: reply.cancel_requested,
                    status,
                }),
                None => Err(Refusal::no_answer(format!(
                    "unreadable control answer: unknown status `{}`",
                    reply.status
                ))),
            },
            Err(refusal) => Err(refusal),
        }
    }

    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome {
        let body = ProgressBody {
            execution_id: execution.clone(),
            message: report.message.clone(),
            percent: report.percent,
        };
        match self
            .post::<_, serde_json::Value>(&command_path(command, "progress"), &body, false)
            .await
        {
            Ok(_) => PostOutcome::Acknowledged,
            Err(refusal) => refusal.into(),
        }
    }

    async fn post_report(&self, item: &OutboxItem) -> PostOutcome {
        let answer = match &item.report {
            RelayReport::Completion { envelope } => {
                self.post::<_, serde_json::Value>(
                    &command_path(&item.command, "complete"),
                    envelope,
                    false,
                )
                .await
            }
            RelayReport::Declined => {
                self.post::<_, serde_json::Value>(
                    &command_path(&item.command, "decline"),
                    &serde_json::json!({}),
                    false,
                )
                .await
            }
        };
        match answer {
            Ok(_) => PostOutcome::Acknowledged,
            Err(refusal) => refusal.into(),
        }
    }
}
