//! The worker's local console: where the owner approves or declines runs
//! waiting for approval, watches the running run and cancels it, and sees
//! the last [`MAX_FINISHED`] finished runs, in a browser or with
//! `graph-relay approve`/`deny`.
//!
//! - Off by default; `worker --console 127.0.0.1:PORT` turns it on. It
//!   listens on a loopback address only (anything else is refused).
//! - Every path starts with a random secret drawn when the worker starts
//!   (256 bits); the worker prints the console's URL with it once. Any
//!   other path is `404`.
//! - The `Host` header must name the console's own address
//!   (`127.0.0.1:PORT` or `localhost:PORT`), and an `Origin` header, when
//!   present, the same (`http://…`): a page of another site, or a DNS
//!   rebinding, gets `403`.
//! - Every `POST` carries the header [`CSRF_HEADER`] with the per-start
//!   token that `GET …/api/session` returns (and the page embeds): a form
//!   or a cross-site request cannot set it.
//!
//! Each run is shown with its command id, its Graph (id and slug), the
//! agent that queued it (`agent_id`, absent when the server did not say),
//! its project and its arguments.
//!
//! | method | path (under `/<secret>`) | answer |
//! |---|---|---|
//! | GET | `/` | the page (waiting, running and finished runs; approve, decline and cancel buttons) |
//! | GET | `/api/session` | `{"csrf": "…"}` |
//! | GET | `/api/waiting` | `{"waiting": [{command_id, graph_session_id, graph, agent_id, project_id, arguments, until}]}` |
//! | GET | `/api/runs` | `{"waiting": […], "running": [{…, started_at, progress: {message, percent, updated_at}, cancelling}], "finished": [{…, status, note, finished_at}]}` (finished: newest first, at most [`MAX_FINISHED`]) |
//! | POST | `/api/runs/{command_id}/approve` | `{"ok": true}`; `404` if nothing waits under that id |
//! | POST | `/api/runs/{command_id}/deny` | body `{"reason": "…"}` (optional, at most 500 characters); as approve |
//! | POST | `/api/runs/{command_id}/cancel` | `{"ok": true}`: the worker stops the run and it ends `cancelled` with "Cancelled on the desktop by the owner" (a waiting run never runs); `404` if no run under that id can be cancelled (not the current run, already ending) |
//!
//! The console learns what runs through [`ConsoleExecutor`] (which wraps
//! the worker's executor and keeps each run's latest progress), what waits
//! through [`ConsoleApprover`], and how runs end from the relay's events
//! ([`Console::observe`]); a cancel goes to the relay state machine through
//! the driver's [`LocalCanceller`] ([`Console::attach`]).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::driver::LocalCanceller;
use graph_relay_core::relay::executor::ProgressReport;
use graph_relay_core::relay::{
    ApprovalDecision, CANCELLED_ON_THE_DESKTOP, DECLINED_ON_THE_DESKTOP, Job, NOT_APPROVED_IN_TIME,
    RelayEvent,
};
use graph_relay_core::time::Clock;
use graph_relay_core::time::{SystemClock, Timestamp};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

mod approver;
mod executor;
mod terminal;
#[cfg(test)]
mod tests;
mod web;

pub use self::approver::ConsoleApprover;
pub use self::executor::ConsoleExecutor;
pub use self::terminal::answer_from_terminal;
use self::web::{answer, page, runs, session, waiting};

/// The header every `POST` must carry, with the console's per-start token.
pub const CSRF_HEADER: &str = "x-graph-relay-csrf";
/// Largest request body the console reads.
const MAX_BODY: usize = 4096;

/// Why the console cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The address is not a loopback address.
    #[error("the console listens on a loopback address only (127.0.0.1 or ::1), not {0}")]
    NotLoopback(SocketAddr),
    /// Binding failed.
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
}

/// How many finished runs the console keeps (newest first).
pub const MAX_FINISHED: usize = 50;
/// How many runs the console remembers between their start and their end
/// (a run whose end it never hears of, say after a restart, goes first).
const MAX_TRACKED: usize = 64;

/// One run waiting for the owner's answer.
struct Waiting {
    job: Job,
    until: Timestamp,
    answer: Option<oneshot::Sender<ApprovalDecision>>,
}

/// One run that executes.
struct Running {
    job: Job,
    started_at: Timestamp,
    progress: Option<ProgressView>,
    cancelling: bool,
}

/// What the console learned about how a run ends, before it ends.
#[derive(Debug, Clone, Default)]
struct Note {
    text: Option<String>,
    /// The server closed the run with this status.
    closed: Option<&'static str>,
}

/// Everything the console shows, shared by the approver, the executor,
/// the relay's events and the web side.
#[derive(Default)]
struct Board {
    waiting: BTreeMap<CommandId, Waiting>,
    running: BTreeMap<CommandId, Running>,
    /// Runs asked about or started, until their end is observed.
    jobs: BTreeMap<CommandId, (u64, Job)>,
    notes: BTreeMap<CommandId, Note>,
    finished: VecDeque<FinishedView>,
    /// Orders `jobs` by arrival.
    arrivals: u64,
}

impl Board {
    /// Remembers `job` until its end is observed (bounded).
    fn track(&mut self, job: &Job) {
        self.arrivals += 1;
        self.jobs
            .insert(job.command.id, (self.arrivals, job.clone()));
        while self.jobs.len() > MAX_TRACKED {
            let oldest = self
                .jobs
                .iter()
                .min_by_key(|(_, (n, _))| *n)
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                self.jobs.remove(&id);
                self.notes.remove(&id);
            }
        }
    }

    fn note(&mut self, command: CommandId) -> &mut Note {
        if self.notes.len() >= MAX_TRACKED && !self.notes.contains_key(&command) {
            self.notes.pop_first();
        }
        self.notes.entry(command).or_default()
    }

    /// The run ended with `status`: it moves to the finished list.
    fn finish(
        &mut self,
        command: CommandId,
        status: &'static str,
        truncated: bool,
        now: Timestamp,
    ) {
        let running = self.running.remove(&command);
        let tracked = self.jobs.remove(&command).map(|(_, job)| job);
        let note = self.notes.remove(&command).unwrap_or_default();
        let Some(job) = running.map(|r| r.job).or(tracked) else {
            return;
        };
        let mut text = note.text;
        if truncated {
            text = Some(match text {
                Some(t) => format!("{t}; the result was too long and was truncated"),
                None => "The result was too long and was truncated".to_owned(),
            });
        }
        self.finished.push_front(FinishedView {
            run: RunView::of(&job),
            status,
            note: text,
            finished_at: now.to_rfc3339(),
        });
        self.finished.truncate(MAX_FINISHED);
    }
}

/// The console: its secrets, its address and its board of runs.
#[derive(Clone)]
pub struct Console {
    secret: Arc<str>,
    csrf: Arc<str>,
    address: SocketAddr,
    board: Arc<Mutex<Board>>,
    canceller: Arc<OnceLock<LocalCanceller>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// 256 random bits as hex, from the operating system's generator.
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Compares two secrets without stopping at the first difference.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Console {
    /// Binds `address` (loopback only) and serves the console there until
    /// the runtime ends. Returns the console, whose [`Console::url`] the
    /// worker prints.
    pub async fn start(address: SocketAddr) -> Result<Self, ConsoleError> {
        if !address.ip().is_loopback() {
            return Err(ConsoleError::NotLoopback(address));
        }
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| ConsoleError::Bind(address, e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| ConsoleError::Bind(address, e))?;
        let console = Self {
            secret: random_token().into(),
            csrf: random_token().into(),
            address: bound,
            board: Arc::default(),
            canceller: Arc::default(),
        };
        let app = console.router();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "the console stopped serving");
            }
        });
        Ok(console)
    }

    /// The console's URL, secret included.
    pub fn url(&self) -> String {
        format!("http://{}/{}/", self.address, self.secret)
    }

    fn router(&self) -> axum::Router {
        axum::Router::new()
            .route("/{secret}/", get(page))
            .route("/{secret}/api/session", get(session))
            .route("/{secret}/api/waiting", get(waiting))
            .route("/{secret}/api/runs", get(runs))
            .route("/{secret}/api/runs/{command}/{verb}", post(answer))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(self.clone())
    }

    /// The secret, Host and Origin checks of every request.
    #[allow(clippy::result_large_err)]
    fn admit(&self, secret: &str, headers: &HeaderMap) -> Result<(), Response> {
        if !same_secret(secret, &self.secret) {
            return Err(StatusCode::NOT_FOUND.into_response());
        }
        let port = self.address.port();
        let hosts = [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        let host_ok = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| hosts.iter().any(|ok| ok == h));
        let origin_ok = match headers.get(header::ORIGIN) {
            None => true,
            Some(origin) => origin
                .to_str()
                .ok()
                .is_some_and(|o| hosts.iter().any(|ok| o == format!("http://{ok}"))),
        };
        if host_ok && origin_ok {
            Ok(())
        } else {
            Err(refuse(
                StatusCode::FORBIDDEN,
                "this console answers its own page only",
            ))
        }
    }

    /// Hands the console the driver's canceller: its cancel buttons work
    /// from then on (before, a cancel gets `503`). A second call changes
    /// nothing.
    pub fn attach(&self, canceller: LocalCanceller) {
        let _ = self.canceller.set(canceller);
    }

    /// Follows a relay event: how runs end (their status and why) and
    /// which run is being cancelled. The worker calls it for every event.
    pub fn observe(&self, event: &RelayEvent) {
        let now = SystemClock.now();
        let mut board = self.lock();
        match event {
            RelayEvent::ApprovalDenied { command, reason } => {
                board.note(*command).text = Some(match reason {
                    Some(r) => format!("{DECLINED_ON_THE_DESKTOP}: {r}"),
                    None => DECLINED_ON_THE_DESKTOP.to_owned(),
                });
            }
            RelayEvent::ApprovalTimedOut { command } => {
                board.note(*command).text = Some(NOT_APPROVED_IN_TIME.to_owned());
            }
            RelayEvent::CancelSent { command } => {
                board.note(*command).text = Some("Cancelled by the agent".to_owned());
                if let Some(r) = board.running.get_mut(command) {
                    r.cancelling = true;
                }
            }
            RelayEvent::CancelledOnTheDesktop { command } => {
                board.note(*command).text = Some(CANCELLED_ON_THE_DESKTOP.to_owned());
                if let Some(r) = board.running.get_mut(command) {
                    r.cancelling = true;
                }
            }
            RelayEvent::ClosedByServer { command, status } => {
                let note = board.note(*command);
                note.text = Some(
                    "Closed by the server (the desktop stopped reporting on it, or restarted)"
                        .to_owned(),
                );
                note.closed = Some(status.as_str());
                if !board.running.contains_key(command) {
                    // It waited for approval: nothing runs, nothing more comes.
                    board.finish(*command, status.as_str(), false, now);
                }
            }
            RelayEvent::Abandoned { command } => {
                let status = board
                    .notes
                    .get(command)
                    .and_then(|n| n.closed)
                    .unwrap_or("failed");
                board.finish(*command, status, false, now);
            }
            RelayEvent::Finished {
                command,
                status,
                truncated,
            } => board.finish(*command, status.as_str(), *truncated, now),
            _ => {}
        }
    }

    /// Puts `job` on the board until answered; the receiver gets the answer.
    fn post(&self, job: Job, until: Timestamp) -> oneshot::Receiver<ApprovalDecision> {
        let (tx, rx) = oneshot::channel();
        let command = job.command.id;
        let mut board = self.lock();
        board.track(&job);
        board.waiting.insert(
            command,
            Waiting {
                job,
                until,
                answer: Some(tx),
            },
        );
        rx
    }

    /// `job` started executing.
    fn started(&self, job: Job) {
        let mut board = self.lock();
        board.track(&job);
        board.running.insert(
            job.command.id,
            Running {
                job,
                started_at: SystemClock.now(),
                progress: None,
                cancelling: false,
            },
        );
    }

    /// The running `command` reported progress.
    fn progressed(&self, command: CommandId, report: &ProgressReport) {
        if report.check().is_err() {
            return;
        }
        if let Some(running) = self.lock().running.get_mut(&command) {
            running.progress = Some(ProgressView {
                message: report.message.clone(),
                percent: report.percent,
                updated_at: SystemClock.now().to_rfc3339(),
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// What every list shows of a run: who queued which Graph, where, with what.
#[derive(Debug, Clone, Serialize)]
struct RunView {
    command_id: CommandId,
    graph_session_id: String,
    /// The Graph's slug when the run was queued.
    graph: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_id: Option<String>,
    project_id: String,
    arguments: Map<String, Value>,
}

impl RunView {
    fn of(job: &Job) -> Self {
        let c = &job.command;
        Self {
            command_id: c.id,
            graph_session_id: c.graph_session_id.to_string(),
            graph: c.slug.clone(),
            agent_id: c.agent.as_ref().map(ToString::to_string),
            project_id: c.project.to_string(),
            arguments: c.arguments.clone(),
        }
    }
}

/// What the board shows of one waiting run.
#[derive(Debug, Serialize)]
struct WaitingView {
    #[serde(flatten)]
    run: RunView,
    until: String,
}

/// The latest progress of a running run.
#[derive(Debug, Clone, Serialize)]
struct ProgressView {
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    percent: Option<f64>,
    updated_at: String,
}

/// What the board shows of one running run.
#[derive(Debug, Serialize)]
struct RunningView {
    #[serde(flatten)]
    run: RunView,
    started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<ProgressView>,
    cancelling: bool,
}

/// What the board shows of one finished run.
#[derive(Debug, Clone, Serialize)]
struct FinishedView {
    #[serde(flatten)]
    run: RunView,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    finished_at: String,
}

impl Board {
    fn waiting_views(&self) -> Vec<WaitingView> {
        self.waiting
            .values()
            .map(|w| WaitingView {
                run: RunView::of(&w.job),
                until: w.until.to_rfc3339(),
            })
            .collect()
    }

    fn running_views(&self) -> Vec<RunningView> {
        self.running
            .values()
            .map(|r| RunningView {
                run: RunView::of(&r.job),
                started_at: r.started_at.to_rfc3339(),
                progress: r.progress.clone(),
                cancelling: r.cancelling,
            })
            .collect()
    }
}
