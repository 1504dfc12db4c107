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

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::driver::LocalCanceller;
use graph_relay_core::relay::executor::{
    Approver, CancelSignal, Executor, ProgressReport, ProgressSink,
};
use graph_relay_core::relay::{
    ApprovalDecision, CANCELLED_ON_THE_DESKTOP, DECLINED_ON_THE_DESKTOP, ExecutionOutcome, Job,
    NOT_APPROVED_IN_TIME, RelayEvent,
};
use graph_relay_core::time::Clock;
use graph_relay_core::time::{SystemClock, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use crate::approval::{HookApprover, MAX_REASON};

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

async fn page(
    State(console): State<Console>,
    Path(secret): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    let html = PAGE.replace("__CSRF__", &console.csrf);
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'",
            ),
        ],
        Html(html),
    )
        .into_response()
}

async fn session(
    State(console): State<Console>,
    Path(secret): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    axum::Json(json!({"csrf": &*console.csrf})).into_response()
}

async fn waiting(
    State(console): State<Console>,
    Path(secret): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    let views = console.lock().waiting_views();
    axum::Json(json!({"waiting": views})).into_response()
}

async fn runs(
    State(console): State<Console>,
    Path(secret): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    let board = console.lock();
    let body = json!({
        "waiting": board.waiting_views(),
        "running": board.running_views(),
        "finished": board.finished,
    });
    drop(board);
    axum::Json(body).into_response()
}

/// The body of a decline.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DenyBody {
    #[serde(default)]
    reason: Option<String>,
}

async fn answer(
    State(console): State<Console>,
    Path((secret, command, verb)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    let csrf_ok = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| same_secret(v, &console.csrf));
    if !csrf_ok {
        return refuse(StatusCode::FORBIDDEN, "missing or wrong anti-CSRF token");
    }
    let Ok(command) = CommandId::parse(&command) else {
        return refuse(StatusCode::NOT_FOUND, "no run waits under this id");
    };
    if verb == "cancel" {
        return cancel(&console, command).await;
    }
    let decision = match verb.as_str() {
        "approve" => ApprovalDecision::Approved,
        "deny" => {
            let parsed: DenyBody = if body.iter().all(u8::is_ascii_whitespace) {
                DenyBody::default()
            } else {
                match serde_json::from_slice(&body) {
                    Ok(b) => b,
                    Err(e) => {
                        return refuse(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            &format!("the body must be {{\"reason\": \"…\"}}: {e}"),
                        );
                    }
                }
            };
            if let Some(reason) = &parsed.reason
                && reason.chars().count() > MAX_REASON
            {
                return refuse(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &format!("the reason is at most {MAX_REASON} characters"),
                );
            }
            ApprovalDecision::Denied(parsed.reason)
        }
        _ => return refuse(StatusCode::NOT_FOUND, "approve, deny or cancel"),
    };
    let sender = console
        .lock()
        .waiting
        .get_mut(&command)
        .and_then(|w| w.answer.take());
    match sender.map(|tx| tx.send(decision)) {
        Some(Ok(())) => axum::Json(json!({"ok": true})).into_response(),
        _ => refuse(StatusCode::NOT_FOUND, "no run waits under this id"),
    }
}

/// The cancel button: the relay state machine decides through the
/// driver's canceller.
async fn cancel(console: &Console, command: CommandId) -> Response {
    let Some(canceller) = console.canceller.get().cloned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the console is not attached to a running worker",
        );
    };
    if canceller.cancel(command).await {
        if let Some(r) = console.lock().running.get_mut(&command) {
            r.cancelling = true;
        }
        axum::Json(json!({"ok": true})).into_response()
    } else {
        refuse(
            StatusCode::NOT_FOUND,
            "no run under this id can be cancelled (not the current run, or already ending)",
        )
    }
}

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

/// `graph-relay approve|deny`: answers a waiting run through the console
/// at `url` (as the worker printed it). Returns what to print.
pub async fn answer_from_terminal(
    url: &str,
    command: &str,
    approve: bool,
    reason: Option<String>,
) -> Result<String, String> {
    let base = url.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(format!("the console URL starts with http://, not `{url}`"));
    }
    let client = reqwest::Client::new();
    let session: Value = client
        .get(format!("{base}/api/session"))
        .send()
        .await
        .map_err(|e| format!("cannot reach the console: {e}"))?
        .error_for_status()
        .map_err(|e| format!("the console refused: {e}"))?
        .json()
        .await
        .map_err(|e| format!("unreadable answer: {e}"))?;
    let csrf = session["csrf"].as_str().unwrap_or_default().to_owned();
    let verb = if approve { "approve" } else { "deny" };
    let response = client
        .post(format!("{base}/api/runs/{command}/{verb}"))
        .header(CSRF_HEADER, csrf)
        .json(&json!({"reason": reason}))
        .send()
        .await
        .map_err(|e| format!("cannot reach the console: {e}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Ok(format!(
            "{} {command}",
            if approve { "approved" } else { "declined" }
        ))
    } else {
        Err(format!(
            "{status}: {}",
            body["error"].as_str().unwrap_or("refused")
        ))
    }
}

/// The console's page: polls `api/runs` once a second and shows the three
/// lists. Text from runs goes in with `textContent` only, never as HTML.
const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>graph-relay console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#1d2330;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .5em}
.sub{color:#5a6475;margin:0 0 1em}
table{border-collapse:collapse;width:100%;background:#fff}
td,th{border:1px solid #d8dde6;padding:.4em .5em;text-align:left;vertical-align:top;font-size:.92em}
th{background:#eef1f6}pre{margin:0;font-size:.9em;white-space:pre-wrap;max-width:28em}
code{font-size:.85em}.empty{color:#5a6475;font-style:italic}
button{margin-right:.4em;padding:.3em .8em;border-radius:4px;border:1px solid #888;cursor:pointer}
button.approve{background:#1f883d;color:#fff;border-color:#1a7f37}
button.deny,button.cancel{background:#cf222e;color:#fff;border-color:#a40e26}
progress{width:12em;vertical-align:middle}
.note{font-weight:normal;color:#1d2330}.status-completed{color:#1a7f37;font-weight:600}.status-failed{color:#cf222e;font-weight:600}.status-cancelled{color:#9a6700;font-weight:600}
</style>
</head><body>
<h1>graph-relay console</h1>
<p class="sub">Runs that agents queued on this desktop. Updated every second.</p>
<h2>Runs waiting for your approval</h2>
<p id="waiting-empty" class="empty">No run waits for approval.</p>
<table id="waiting" hidden><thead><tr><th>Run</th><th>Graph</th><th>Agent</th><th>Project</th><th>Arguments</th><th>Waits until</th><th></th></tr></thead><tbody></tbody></table>
<h2>Running</h2>
<p id="running-empty" class="empty">No run is running.</p>
<table id="running" hidden><thead><tr><th>Run</th><th>Graph</th><th>Agent</th><th>Project</th><th>Arguments</th><th>Progress</th><th></th></tr></thead><tbody></tbody></table>
<h2>Finished (the last 50)</h2>
<p id="finished-empty" class="empty">No run has finished since the worker started.</p>
<table id="finished" hidden><thead><tr><th>Run</th><th>Graph</th><th>Agent</th><th>Project</th><th>Arguments</th><th>Status</th><th>Finished</th></tr></thead><tbody></tbody></table>
<script>
const csrf = "__CSRF__";
async function post(id, verb, body) {
  const r = await fetch("api/runs/" + id + "/" + verb, {method: "POST", headers: {"content-type": "application/json", "x-graph-relay-csrf": csrf}, body: JSON.stringify(body)});
  if (!r.ok) { const e = await r.json().catch(() => ({})); alert(e.error || r.status); }
  refresh();
}
function answer(id, verb) {
  if (verb === "deny") { const reason = prompt("Why not? (optional)"); if (reason === null) return; post(id, verb, {reason: reason || null}); }
  else if (verb === "cancel") { if (confirm("Cancel this run? The Graph is stopped.")) post(id, verb, {}); }
  else post(id, verb, {});
}
function cell(row, text) { const td = row.insertCell(); td.textContent = text; return td; }
function common(row, r) {
  row.dataset.command = r.command_id;
  const run = cell(row, ""); const code = document.createElement("code"); code.textContent = r.command_id; run.appendChild(code);
  const g = cell(row, r.graph || ""); g.appendChild(document.createElement("br"));
  const gid = document.createElement("code"); gid.textContent = r.graph_session_id; g.appendChild(gid);
  cell(row, r.agent_id || "(not told)").className = "agent";
  cell(row, r.project_id);
  const args = cell(row, ""); const pre = document.createElement("pre"); pre.textContent = JSON.stringify(r.arguments, null, 1); args.appendChild(pre);
}
function buttons(row, id, verbs) {
  const td = row.insertCell();
  for (const [verb, label] of verbs) {
    const b = document.createElement("button"); b.textContent = label; b.className = verb;
    b.onclick = () => answer(id, verb); td.appendChild(b);
  }
  return td;
}
function fill(name, list, each) {
  const body = document.querySelector("#" + name + " tbody");
  body.replaceChildren();
  for (const r of list) each(body.insertRow(), r);
  document.getElementById(name).hidden = list.length === 0;
  document.getElementById(name + "-empty").hidden = list.length !== 0;
}
function when(t) { return new Date(t).toLocaleTimeString(); }
async function refresh() {
  let data;
  try { data = await (await fetch("api/runs")).json(); } catch (e) { return; }
  fill("waiting", data.waiting, (row, w) => {
    common(row, w); cell(row, when(w.until));
    buttons(row, w.command_id, [["approve", "Approve"], ["deny", "Decline"]]);
  });
  fill("running", data.running, (row, r) => {
    common(row, r);
    const td = row.insertCell(); td.className = "progress";
    const p = r.progress || {};
    const msg = document.createElement("div"); msg.className = "message"; msg.textContent = r.cancelling ? "Cancelling…" : (p.message || "Started"); td.appendChild(msg);
    if (p.percent !== undefined) {
      const bar = document.createElement("progress"); bar.max = 100; bar.value = p.percent; td.appendChild(bar);
      const pc = document.createElement("span"); pc.className = "percent"; pc.textContent = " " + p.percent + "%"; td.appendChild(pc);
    }
    const up = document.createElement("div"); up.className = "updated"; up.textContent = "updated " + when(p.updated_at || r.started_at); td.appendChild(up);
    if (r.cancelling) row.insertCell(); else buttons(row, r.command_id, [["cancel", "Cancel"]]);
  });
  fill("finished", data.finished, (row, f) => {
    common(row, f);
    const st = cell(row, f.status); st.className = "status status-" + f.status;
    if (f.note) { const n = document.createElement("div"); n.className = "note"; n.textContent = f.note; st.appendChild(n); }
    cell(row, when(f.finished_at));
  });
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        let a = random_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_token());
    }

    fn job(n: u128) -> Job {
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(n));
        Job {
            command: graph_relay_core::relay::RelayCommand {
                id,
                project: graph_relay_core::ids::ProjectId::parse("p1").expect("project"),
                graph_session_id: graph_relay_core::ids::GraphSessionId::parse(
                    "gs_0123456789abcdef0123456789abcdef",
                )
                .expect("session"),
                arguments: Map::new(),
                slug: "g".into(),
                agent: Some(graph_relay_core::ids::AgentId::parse("assistant").expect("agent")),
            },
            execution: graph_relay_core::ids::ExecutionId::parse("exec-1").expect("execution"),
            channel: id.channel(),
        }
    }

    #[test]
    fn the_finished_list_keeps_the_newest_50_and_tracking_is_bounded() {
        let mut board = Board::default();
        for n in 1..=(MAX_FINISHED as u128 + 20) {
            board.track(&job(n));
            board.finish(
                CommandId::from_uuid(uuid::Uuid::from_u128(n)),
                "completed",
                false,
                Timestamp(0),
            );
        }
        assert_eq!(board.finished.len(), MAX_FINISHED);
        let newest = CommandId::from_uuid(uuid::Uuid::from_u128(MAX_FINISHED as u128 + 20));
        assert_eq!(board.finished[0].run.command_id, newest);
        assert_eq!(board.finished[0].run.agent_id.as_deref(), Some("assistant"));
        assert!(board.jobs.is_empty());
        // Runs whose end never comes are forgotten, oldest first.
        for n in 1000..(1000 + MAX_TRACKED as u128 + 5) {
            board.track(&job(n));
        }
        assert_eq!(board.jobs.len(), MAX_TRACKED);
        assert!(
            !board
                .jobs
                .contains_key(&CommandId::from_uuid(uuid::Uuid::from_u128(1000)))
        );
        // An end the console never saw start adds nothing.
        board.finish(
            CommandId::from_uuid(uuid::Uuid::from_u128(1)),
            "failed",
            false,
            Timestamp(0),
        );
        assert_eq!(board.finished[0].run.command_id, newest);
    }
}
