//! `graph-relay approve|deny`: the console's API from a terminal.

use serde_json::{Value, json};

use super::CSRF_HEADER;

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
