//! The worker's local console: where the owner approves or declines runs
//! waiting for approval, in a browser or with `graph-relay approve`/`deny`.
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
//! | method | path (under `/<secret>`) | answer |
//! |---|---|---|
//! | GET | `/` | the page (lists the waiting runs; approve and decline buttons) |
//! | GET | `/api/session` | `{"csrf": "…"}` |
//! | GET | `/api/waiting` | `{"waiting": [{command_id, graph_session_id, project_id, arguments, until}]}` |
//! | POST | `/api/runs/{command_id}/approve` | `{"ok": true}`; `404` if nothing waits under that id |
//! | POST | `/api/runs/{command_id}/deny` | body `{"reason": "…"}` (optional, at most 500 characters); as approve |
//!
//! Not built yet: the running run with its live progress and a cancel
//! button, the last 50 finished runs, the agent's name (the relay API does
//! not hand it to the desktop), and browser tests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use graph_relay_core::executor::Approver;
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::{ApprovalDecision, Job};
use graph_relay_core::time::Timestamp;
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

/// One run waiting for the owner's answer.
struct Waiting {
    job: Job,
    until: Timestamp,
    answer: Option<oneshot::Sender<ApprovalDecision>>,
}

/// The runs waiting for approval, shared by the approver and the web side.
#[derive(Default)]
struct Board {
    waiting: BTreeMap<CommandId, Waiting>,
}

/// The console: its secrets, its address and its board of waiting runs.
#[derive(Clone)]
pub struct Console {
    secret: Arc<str>,
    csrf: Arc<str>,
    address: SocketAddr,
    board: Arc<Mutex<Board>>,
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

    /// Puts `job` on the board until answered; the receiver gets the answer.
    fn post(&self, job: Job, until: Timestamp) -> oneshot::Receiver<ApprovalDecision> {
        let (tx, rx) = oneshot::channel();
        let command = job.command.id;
        self.lock().waiting.insert(
            command,
            Waiting {
                job,
                until,
                answer: Some(tx),
            },
        );
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// What the board shows of one waiting run.
#[derive(Debug, Serialize)]
struct WaitingView {
    command_id: CommandId,
    graph_session_id: String,
    project_id: String,
    arguments: Map<String, Value>,
    until: String,
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
    let views: Vec<WaitingView> = console
        .lock()
        .waiting
        .values()
        .map(|w| WaitingView {
            command_id: w.job.command.id,
            graph_session_id: w.job.command.graph_session_id.to_string(),
            project_id: w.job.command.project.to_string(),
            arguments: w.job.command.arguments.clone(),
            until: w.until.to_rfc3339(),
        })
        .collect();
    axum::Json(json!({"waiting": views})).into_response()
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
        _ => return refuse(StatusCode::NOT_FOUND, "approve or deny"),
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

/// The console's page: polls the waiting runs once a second.
const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>graph-relay: runs waiting for approval</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.4em;text-align:left}pre{margin:0}</style>
</head><body>
<h1>Runs waiting for your approval</h1>
<p id="empty">No run waits for approval.</p>
<table id="runs" hidden><thead><tr><th>Run</th><th>Graph</th><th>Project</th><th>Arguments</th><th>Until</th><th></th></tr></thead><tbody></tbody></table>
<script>
const csrf = "__CSRF__";
async function answer(id, verb) {
  const body = verb === "deny" ? {reason: prompt("Why not? (optional)") || null} : {};
  await fetch("api/runs/" + id + "/" + verb, {method: "POST", headers: {"content-type": "application/json", "x-graph-relay-csrf": csrf}, body: JSON.stringify(body)});
  refresh();
}
function cell(row, text) { const td = row.insertCell(); td.textContent = text; return td; }
async function refresh() {
  const data = await (await fetch("api/waiting")).json();
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  for (const w of data.waiting) {
    const row = body.insertRow();
    row.dataset.command = w.command_id;
    cell(row, w.command_id); cell(row, w.graph_session_id); cell(row, w.project_id);
    const args = cell(row, ""); const pre = document.createElement("pre"); pre.textContent = JSON.stringify(w.arguments, null, 1); args.appendChild(pre);
    cell(row, w.until);
    const actions = row.insertCell();
    for (const [verb, label] of [["approve", "Approve"], ["deny", "Decline"]]) {
      const b = document.createElement("button"); b.textContent = label; b.className = verb;
      b.onclick = () => answer(w.command_id, verb); actions.appendChild(b);
    }
  }
  document.getElementById("runs").hidden = data.waiting.length === 0;
  document.getElementById("empty").hidden = data.waiting.length !== 0;
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
}
