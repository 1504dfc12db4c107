//! Graph sessions shared from a desktop to a project.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::{DeviceId, GraphSessionId, ProjectId};
use crate::time::Timestamp;

use crate::limits::{
    MAX_SESSION_DESCRIPTION_CHARS, MAX_SESSION_LABEL_CHARS, MAX_SESSION_NAME_CHARS,
    MAX_SESSION_SLUG_CHARS,
};

/// The metadata a relay uploads for one shared session. Text fields are
/// shared (`Arc<str>`): the queue copies session records often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionMeta {
    /// The saved Graph.
    pub graph_session_id: GraphSessionId,
    /// Display name (1–200 characters).
    pub name: Arc<str>,
    /// What the Graph does (at most 2,000 characters).
    #[serde(default)]
    pub description: Arc<str>,
    /// Stable short name (1–200 characters); a change means a different Graph.
    pub slug: Arc<str>,
    /// Version label (at most 64 characters).
    #[serde(default)]
    pub version: Arc<str>,
    /// Status label from the desktop, e.g. `ready` (at most 64 characters).
    #[serde(default)]
    pub status: Arc<str>,
}

/// A session metadata field that breaks its rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session {index}: `{field}` {rule}")]
pub struct InvalidSession {
    /// Position in the uploaded list.
    pub index: usize,
    /// The field.
    pub field: &'static str,
    /// The rule.
    pub rule: &'static str,
}

impl SessionMeta {
    /// A session named `name` with the stable short name `slug`, status
    /// `ready`, no description and no version label.
    pub fn new(graph_session_id: GraphSessionId, name: &str, slug: &str) -> Self {
        Self {
            graph_session_id,
            name: name.into(),
            description: "".into(),
            slug: slug.into(),
            version: "".into(),
            status: "ready".into(),
        }
    }

    /// Checks the length rules; `index` is the position used in the error.
    pub fn validate(&self, index: usize) -> Result<(), InvalidSession> {
        let fields: [(&'static str, &str, usize, usize, &'static str); 5] = [
            (
                "name",
                &self.name,
                1,
                MAX_SESSION_NAME_CHARS,
                "must be 1 to 200 characters without control characters",
            ),
            (
                "description",
                &self.description,
                0,
                MAX_SESSION_DESCRIPTION_CHARS,
                "must be at most 2,000 characters",
            ),
            (
                "slug",
                &self.slug,
                1,
                MAX_SESSION_SLUG_CHARS,
                "must be 1 to 200 characters without control characters",
            ),
            (
                "version",
                &self.version,
                0,
                MAX_SESSION_LABEL_CHARS,
                "must be at most 64 characters without control characters",
            ),
            (
                "status",
                &self.status,
                0,
                MAX_SESSION_LABEL_CHARS,
                "must be at most 64 characters without control characters",
            ),
        ];
        for (field, value, min, max, rule) in fields {
            let count = value.chars().count();
            let controls_ok = field == "description" || !value.chars().any(char::is_control);
            if count < min || count > max || !controls_ok {
                return Err(InvalidSession { index, field, rule });
            }
        }
        Ok(())
    }
}

/// A session as the server knows it: what some device's last sync uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSession {
    /// The project it is shared to.
    pub project: ProjectId,
    /// The desktop that shares it (and will run it).
    pub device: DeviceId,
    /// The metadata from that sync.
    pub meta: SessionMeta,
    /// When that sync happened.
    pub synced_at: Timestamp,
}
