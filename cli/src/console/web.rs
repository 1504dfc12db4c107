//! The console's web side: its page and the API behind it, each request
//! admitted by [`Console::admit`] first.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::ApprovalDecision;
use serde::Deserialize;
use serde_json::json;

use super::{CSRF_HEADER, Console, refuse, same_secret};
use crate::approval::MAX_REASON;

pub(super) async fn page(
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

pub(super) async fn session(
    State(console): State<Console>,
    Path(secret): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = console.admit(&secret, &headers) {
        return refused;
    }
    axum::Json(json!({"csrf": &*console.csrf})).into_response()
}

pub(super) async fn waiting(
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

pub(super) async fn runs(
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

pub(super) async fn answer(
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
