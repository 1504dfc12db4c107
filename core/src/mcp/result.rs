//! The one writer of results: every reply's `result` member is written
//! here, in every protocol revision.
//!
//! A result is a JSON object written with its members in the lexicographic
//! order of their names, which is how every reply is rendered (a [`Value`]
//! writes its keys that way, and every wire type declares its fields in
//! that order). Protocol 2026-07-28 adds two members to every result, and
//! [`Revision`] is the only place that knows them:
//!
//! - `_meta`, with the server's identity under
//!   `io.modelcontextprotocol/serverInfo` (first: every member name of a
//!   result sorts after `_`);
//! - `resultType`, `"complete"` unless the result names its own (a created
//!   task says `"task"`), at its place in the order.
//!
//! They are merged in while the members are written, so no tree of the
//! result is built to add them. A tool's output is the largest part of
//! most replies: [`Answer::Output`] serializes it once and writes it twice
//! (as the escaped text and as `structuredContent`), with the fast escaper
//! of [`super::escape`].

use std::sync::Arc;

use serde_json::Value;

use super::escape::{write_json, write_text};
use super::jsonrpc::{Outgoing, RequestId};
use super::wire::{CallToolResult, TextContent, ToolOutput};

/// What a method answered: its result's own members, without the
/// revision's.
pub(crate) enum Answer {
    /// A result built as a JSON value (an object for every method).
    Value(Value),
    /// A `tools/call` result.
    Tool(CallToolResult),
    /// A `tools/call` success whose text is its structured content as
    /// compact JSON (`json`, what [`CallToolResult::of_output`] writes),
    /// carried as `structuredContent` too when `with_structured` (the
    /// revision has structured content).
    Output {
        /// The structured content, compact JSON.
        json: Vec<u8>,
        /// Whether the revision carries `structuredContent`.
        with_structured: bool,
    },
    /// A result this module rendered before ([`Revision::render`]), kept
    /// as its bytes because it is the same for every caller.
    Rendered(Arc<[u8]>),
}

/// What a protocol revision adds to every result.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Revision<'a> {
    /// The initialize era: nothing.
    Legacy,
    /// 2026-07-28: `_meta` (its compact JSON, rendered once per server)
    /// and `resultType`.
    Modern {
        /// `{"io.modelcontextprotocol/serverInfo":{…}}`.
        meta: &'a [u8],
    },
}

/// The value of one member of a result.
enum Member<'a> {
    /// A JSON value.
    Json(&'a Value),
    /// Content blocks.
    Content(&'a [TextContent]),
    /// One text block whose text is this compact JSON (escaped by the fast
    /// escaper).
    TextOf(&'a [u8]),
    /// A boolean.
    Bool(bool),
    /// A tool's structured content.
    Output(&'a ToolOutput),
    /// Compact JSON, written as is.
    Raw(&'a [u8]),
}

/// `resultType` when a result does not name its own.
const COMPLETE: &[u8] = b"\"complete\"";

impl Revision<'_> {
    /// The reply to request `id` carrying `answer`.
    pub(crate) fn reply(self, id: &RequestId, answer: &Answer) -> Outgoing {
        let len = match answer {
            // The text (escaped: a quote in eight, at most, in compact
            // JSON of runs) and the structured copy, and the fixed members.
            Answer::Output { json, .. } => 2 * json.len() + json.len() / 8 + 200,
            Answer::Rendered(bytes) => bytes.len(),
            Answer::Value(_) | Answer::Tool(_) => 256,
        } + self.extra_len();
        Outgoing::result_written(id, len, |out| self.write(out, answer))
    }

    /// `answer`'s result as bytes, to be sent later as
    /// [`Answer::Rendered`].
    pub(crate) fn render(self, answer: &Answer) -> Arc<[u8]> {
        let mut out = Vec::with_capacity(256 + self.extra_len());
        self.write(&mut out, answer);
        out.into()
    }

    fn extra_len(self) -> usize {
        match self {
            Self::Legacy => 0,
            Self::Modern { meta } => meta.len() + 40,
        }
    }

    fn write(self, out: &mut Vec<u8>, answer: &Answer) {
        match answer {
            Answer::Value(Value::Object(members)) => self.write_members(
                out,
                members
                    .iter()
                    .map(|(name, v)| (name.as_str(), Member::Json(v))),
            ),
            // No method answers with anything but an object; a value that
            // is not one has no members to add to.
            Answer::Value(other) => write_json(out, other),
            Answer::Tool(result) => self.write_members(
                out,
                [
                    ("content", Member::Content(&result.content)),
                    ("isError", Member::Bool(result.is_error)),
                ]
                .into_iter()
                .chain(
                    result
                        .structured_content
                        .as_ref()
                        .map(|output| ("structuredContent", Member::Output(output))),
                ),
            ),
            Answer::Output {
                json,
                with_structured,
            } => self.write_members(
                out,
                [
                    ("content", Member::TextOf(json)),
                    ("isError", Member::Bool(false)),
                ]
                .into_iter()
                .chain(with_structured.then_some(("structuredContent", Member::Raw(json)))),
            ),
            Answer::Rendered(bytes) => out.extend_from_slice(bytes),
        }
    }

    /// Writes an object of `members` (in the order of their names) with the
    /// revision's members merged in at their places.
    fn write_members<'m>(
        self,
        out: &mut Vec<u8>,
        members: impl IntoIterator<Item = (&'m str, Member<'m>)>,
    ) {
        let mut first = true;
        let mut result_type_due = false;
        out.push(b'{');
        if let Self::Modern { meta } = self {
            write_member(out, &mut first, "_meta", Member::Raw(meta));
            result_type_due = true;
        }
        for (name, value) in members {
            debug_assert_ne!(
                name, "_meta",
                "a result's own `_meta` would be written twice"
            );
            if result_type_due && name >= "resultType" {
                result_type_due = false;
                if name != "resultType" {
                    write_member(out, &mut first, "resultType", Member::Raw(COMPLETE));
                }
            }
            write_member(out, &mut first, name, value);
        }
        if result_type_due {
            write_member(out, &mut first, "resultType", Member::Raw(COMPLETE));
        }
        out.push(b'}');
    }
}

fn write_member(out: &mut Vec<u8>, first: &mut bool, name: &str, value: Member<'_>) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    // Member names are nearly always plain (the wire types' own): copied
    // between quotes, the bytes serde_json writes, without its escaper.
    if name.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
    } else {
        write_json(out, name);
        out.push(b':');
    }
    match value {
        Member::Json(value) => write_json(out, value),
        Member::Content(blocks) => write_json(out, blocks),
        Member::TextOf(json) => {
            // `[TextContent { text, kind: "text" }]`, its fields in order.
            out.extend_from_slice(b"[{\"text\":");
            write_text(out, json);
            out.extend_from_slice(b",\"type\":\"text\"}]");
        }
        Member::Bool(true) => out.extend_from_slice(b"true"),
        Member::Bool(false) => out.extend_from_slice(b"false"),
        Member::Output(output) => write_json(out, output),
        Member::Raw(json) => out.extend_from_slice(json),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;
    use crate::ids::ProjectId;
    use crate::mcp::wire::{SessionList, to_json_bytes};

    const META: &[u8] = br#"{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}}"#;

    /// The result as a tree: `answer`'s members, and in 2026-07-28 the
    /// revision's, added the way the specification describes them.
    fn as_a_tree(answer: &Answer, modern: bool) -> Value {
        let mut value = match answer {
            Answer::Value(v) => v.clone(),
            Answer::Tool(result) => serde_json::to_value(result).unwrap(),
            Answer::Output {
                json,
                with_structured,
            } => {
                let output: Value = serde_json::from_slice(json).unwrap();
                let mut result = json!({
                    "content": [{"type": "text", "text": String::from_utf8(json.clone()).unwrap()}],
                    "isError": false,
                });
                if *with_structured {
                    result["structuredContent"] = output;
                }
                result
            }
            Answer::Rendered(bytes) => serde_json::from_slice(bytes).unwrap(),
        };
        if modern && let Some(object) = value.as_object_mut() {
            object.entry("resultType").or_insert(json!("complete"));
            object.insert("_meta".into(), serde_json::from_slice(META).unwrap());
        }
        value
    }

    fn answers() -> Vec<Answer> {
        let output = ToolOutput::Sessions(SessionList {
            project_id: ProjectId::parse("p").unwrap(),
            sessions: Vec::new(),
        });
        let run: Value = json!({"status": "done", "result": {"text": "say \"hi\"\n"}});
        vec![
            Answer::Value(json!({})),
            Answer::Value(json!({"tools": [], "ttlMs": 5, "cacheScope": "public"})),
            Answer::Value(json!({"task": {"taskId": "t"}, "resultType": "task"})),
            Answer::Value(json!({"a": 1, "zeta": 2, "resultTypo": 3, "resultTypf": 4})),
            Answer::Tool(CallToolResult::error("Invalid arguments: \"x\"")),
            Answer::Tool(CallToolResult::success("text".into(), Some(output.clone()))),
            Answer::Output {
                json: to_json_bytes(&output),
                with_structured: true,
            },
            Answer::Output {
                json: serde_json::to_vec(&run).unwrap(),
                with_structured: false,
            },
        ]
    }

    #[test]
    fn every_result_is_the_canonical_rendering_of_its_tree() {
        for answer in answers() {
            for (revision, modern) in [
                (Revision::Legacy, false),
                (Revision::Modern { meta: META }, true),
            ] {
                let written = revision.render(&answer);
                let tree = as_a_tree(&answer, modern);
                assert_eq!(
                    std::str::from_utf8(&written).unwrap(),
                    serde_json::to_string(&tree).unwrap(),
                    "modern: {modern}"
                );
                let rendered = Answer::Rendered(written.clone());
                assert_eq!(
                    revision.render(&rendered),
                    written,
                    "a rendered result is sent as is"
                );
            }
        }
    }

    #[test]
    fn a_reply_carries_the_result_in_its_envelope() {
        let reply = Revision::Modern { meta: META }
            .reply(&json!(7), &Answer::Value(Value::Object(Map::new())));
        assert_eq!(
            std::str::from_utf8(reply.as_bytes()).unwrap(),
            r#"{"id":7,"jsonrpc":"2.0","result":{"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}},"resultType":"complete"}}"#
        );
    }
}
