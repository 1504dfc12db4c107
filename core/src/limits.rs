//! Every bound of the protocol in one place.
//!
//! The tool catalog's JSON Schemas, the argument decoder, the queue, the
//! session validation and the relay API's OpenAPI document all read these
//! constants, so a bound is written once and every copy agrees. Transport
//! limits (body sizes, timeouts, connection caps) are configuration and
//! live with their transport; the bound on what an MCP session keeps is
//! [`mcp::MAX_INITIALIZE_FIELD_BYTES`](crate::mcp::MAX_INITIALIZE_FIELD_BYTES).

/// `list_graph_sessions`' `limit`: at least this many.
pub const MIN_LIST_LIMIT: u32 = 1;
/// `list_graph_sessions`' `limit`: at most this many (SPEC §2).
pub const MAX_LIST_LIMIT: u32 = 50;
/// `list_graph_sessions`' `limit` when none is given.
pub const DEFAULT_LIST_LIMIT: u32 = MAX_LIST_LIMIT;

/// An idempotency key is at least this many characters (SPEC §5).
pub const MIN_IDEMPOTENCY_KEY_CHARS: usize = 8;
/// An idempotency key is at most this many characters (SPEC §5).
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 128;

/// A name id (agent, owner, project, device, execution) is at most this
/// many bytes of `[A-Za-z0-9._:@-]`.
pub const MAX_NAME_BYTES: usize = 128;

/// Largest `arguments` of `run_graph_session`, as compact JSON: 64 KiB.
pub const MAX_ARGUMENTS_BYTES: usize = 64 * 1024;

/// Most sessions one sync may carry for one project (SPEC §6).
pub const MAX_SESSIONS_PER_SYNC: usize = 100;
/// A shared session's `name`: 1 to this many characters.
pub const MAX_SESSION_NAME_CHARS: usize = 200;
/// A shared session's `description`: at most this many characters.
pub const MAX_SESSION_DESCRIPTION_CHARS: usize = 2_000;
/// A shared session's `slug`: 1 to this many characters.
pub const MAX_SESSION_SLUG_CHARS: usize = 200;
/// A shared session's `version` and `status` labels: at most this many characters.
pub const MAX_SESSION_LABEL_CHARS: usize = 64;

/// The compact JSON of a result envelope is at most this many UTF-16 code
/// units, or the result is truncated (SPEC §7).
pub const RESULT_LIMIT: usize = 100_000;
/// Error texts are cut to this many UTF-16 code units (SPEC §7).
pub const ERROR_LIMIT: usize = 2_000;

/// A progress message is at most this many characters.
pub const MAX_PROGRESS_MESSAGE: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::IdempotencyKey;
    use crate::session::SessionMeta;

    /// The refusal texts spell the bounds out; they must say what the
    /// constants say.
    #[test]
    fn refusals_name_the_bounds_these_constants_set() {
        let key = IdempotencyKey::parse("short")
            .expect_err("too short")
            .to_string();
        assert!(
            key.contains(&format!(
                "{MIN_IDEMPOTENCY_KEY_CHARS} to {MAX_IDEMPOTENCY_KEY_CHARS}"
            )),
            "{key}"
        );
        let meta = |name: &str, slug: &str, version: &str| SessionMeta {
            graph_session_id: crate::ids::GraphSessionId::parse(
                "gs_0123456789abcdef0123456789abcdef",
            )
            .expect("id"),
            name: name.into(),
            description: "".into(),
            slug: slug.into(),
            version: version.into(),
            status: "".into(),
        };
        let long_name = "n".repeat(MAX_SESSION_NAME_CHARS + 1);
        let refused = meta(&long_name, "s", "").validate(0).expect_err("name");
        assert!(
            refused
                .to_string()
                .contains(&format!("1 to {MAX_SESSION_NAME_CHARS}")),
            "{refused}"
        );
        assert!(
            meta(&"n".repeat(MAX_SESSION_NAME_CHARS), "s", "")
                .validate(0)
                .is_ok()
        );
        let long_slug = "s".repeat(MAX_SESSION_SLUG_CHARS + 1);
        let refused = meta("n", &long_slug, "").validate(0).expect_err("slug");
        assert!(
            refused
                .to_string()
                .contains(&format!("1 to {MAX_SESSION_SLUG_CHARS}")),
            "{refused}"
        );
        let long_label = "v".repeat(MAX_SESSION_LABEL_CHARS + 1);
        let refused = meta("n", "s", &long_label)
            .validate(0)
            .expect_err("version");
        assert!(
            refused
                .to_string()
                .contains(&format!("at most {MAX_SESSION_LABEL_CHARS}")),
            "{refused}"
        );
        let list = crate::args::ToolArgs::decode(
            crate::catalog::ToolKind::ListGraphSessions,
            Some(&serde_json::json!({"project_id": "p1", "limit": MAX_LIST_LIMIT + 1})),
            None,
        );
        let text = list.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains(&format!("from {MIN_LIST_LIMIT} to {MAX_LIST_LIMIT}")),
            "{text}"
        );
    }
}
