//! The digest of what a run was asked to do (its idempotency check).

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::ids::GraphSessionId;

/// A stable digest of what a run was asked to do, to tell a retry (same
/// digest) from a reused key with other arguments. Object keys are sorted
/// at every depth, so `{"a":1,"b":2}` and `{"b":2,"a":1}` are the same request.
///
/// The digest is SHA-256 (lowercase hex) of the session id, a newline, and
/// the canonical compact JSON of the arguments (keys sorted, serde_json's
/// escapes and number format). The text is fed to the hash as it is
/// produced, never built in memory. Stores keep these digests, so the
/// format never changes.
pub fn request_fingerprint(
    graph_session_id: &GraphSessionId,
    arguments: &Map<String, Value>,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(graph_session_id.as_str().as_bytes());
    hasher.update(b"\n");
    canonical_map(&mut hasher, arguments);
    let digest = hasher.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(digest.len() * 2);
    for b in digest {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    hex
}

/// Feeds text to a hash through `std::fmt::Write`, for number formatting.
struct HashText<'a>(&'a mut Sha256);

impl std::fmt::Write for HashText<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

fn canonical_map(out: &mut Sha256, map: &Map<String, Value>) {
    out.update(b"{");
    // serde_json's default map is ordered already; sort only if not.
    if map.keys().is_sorted() {
        for (i, (k, v)) in map.iter().enumerate() {
            canonical_entry(out, i, k, v);
        }
    } else {
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (i, (k, v)) in entries.into_iter().enumerate() {
            canonical_entry(out, i, k, v);
        }
    }
    out.update(b"}");
}

fn canonical_entry(out: &mut Sha256, index: usize, key: &str, value: &Value) {
    if index > 0 {
        out.update(b",");
    }
    canonical_string(out, key);
    out.update(b":");
    canonical_value(out, value);
}

fn canonical_value(out: &mut Sha256, value: &Value) {
    match value {
        Value::Object(map) => canonical_map(out, map),
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                canonical_value(out, item);
            }
            out.update(b"]");
        }
        Value::String(text) => canonical_string(out, text),
        Value::Null => out.update(b"null"),
        Value::Bool(true) => out.update(b"true"),
        Value::Bool(false) => out.update(b"false"),
        // Formatting into a hash cannot fail.
        Value::Number(n) => drop(std::fmt::Write::write_fmt(
            &mut HashText(out),
            format_args!("{n}"),
        )),
    }
}

/// A JSON string literal exactly as serde_json writes it: `"` and `\\`
/// escaped, `\b \f \n \r \t` short, other controls as `\u00xx`
/// (lowercase hex), everything else as is.
fn canonical_string(out: &mut Sha256, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.update(b"\"");
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.update(&bytes[start..i]);
        if short.is_empty() {
            out.update([
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0x0f)],
            ]);
        } else {
            out.update(short);
        }
        start = i + 1;
    }
    out.update(&bytes[start..]);
    out.update(b"\"");
}
