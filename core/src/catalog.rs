//! The tool catalog: the four tools an agent sees in `tools/list` (SPEC §2).
//!
//! [`ToolCatalog::published`] reproduces the published wire form exactly.
//! Integrators may rename tools, reword descriptions and change scope
//! strings through [`CatalogBuilder`]; the schemas and annotations stay.

use std::collections::BTreeSet;

/// Published description of `run_graph_session`.
pub const RUN_DESCRIPTION: &str = "Queue a Graph run on the owner's online desktop in a connected project. Retrieve progress and result with get_graph_run. The desktop can go offline, and local tool approvals still apply.";
/// Description of `list_graph_sessions`.
pub const LIST_DESCRIPTION: &str = "List the Graph sessions the owner shared from the desktop to a connected project, as of the desktop's last sync. An empty list is normal until the owner shares a session.";
/// Description of `get_graph_run`.
pub const GET_DESCRIPTION: &str = "Read the status and, once it has finished, the result of a Graph run queued with run_graph_session. Runs are queued until the desktop picks them up; poll again after poll_after_seconds.";
/// Description of `cancel_graph_run`.
pub const CANCEL_DESCRIPTION: &str = "Cancel a Graph run queued with run_graph_session. A queued run is cancelled at once; a running one is stopped by the desktop at its next control check. Finished runs are not changed.";
/// Scope required by the tools that queue or cancel work.
pub const RUN_SCOPE: &str = "osfoundry:run";
/// Scope required by the read-only tools.
pub const READ_SCOPE: &str = "osfoundry:read";

/// The two access levels of the published system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeLevel {
    /// Reading: listing sessions, reading runs and their notifications.
    Read,
    /// Acting: queueing, cancelling or updating runs.
    Run,
}

impl ScopeLevel {
    /// The published scope string of the level.
    pub const fn default_scope(self) -> &'static str {
        match self {
            Self::Read => READ_SCOPE,
            Self::Run => RUN_SCOPE,
        }
    }
}

/// The level each tool needs; the catalog's default scopes come from here.
pub const fn tool_level(kind: ToolKind) -> ScopeLevel {
    match kind {
        ToolKind::RunGraphSession | ToolKind::CancelGraphRun => ScopeLevel::Run,
        ToolKind::ListGraphSessions | ToolKind::GetGraphRun => ScopeLevel::Read,
    }
}

/// Largest `wait_seconds` the server-side wait accepts by default.
pub const DEFAULT_MAX_WAIT_SECONDS: u32 = 60;

/// Which of the four operations a tool performs, whatever it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// `run_graph_session`: queue a run, return a ticket.
    RunGraphSession,
    /// `list_graph_sessions`: the sessions shared to a project.
    ListGraphSessions,
    /// `get_graph_run`: read a run by its ticket.
    GetGraphRun,
    /// `cancel_graph_run`: cancel a run by its ticket.
    CancelGraphRun,
}

impl ToolKind {
    /// All four, in the order `tools/list` shows them.
    pub const ALL: [ToolKind; 4] = [
        ToolKind::RunGraphSession,
        ToolKind::ListGraphSessions,
        ToolKind::GetGraphRun,
        ToolKind::CancelGraphRun,
    ];

    /// The published tool name.
    pub const fn default_name(self) -> &'static str {
        match self {
            Self::RunGraphSession => "run_graph_session",
            Self::ListGraphSessions => "list_graph_sessions",
            Self::GetGraphRun => "get_graph_run",
            Self::CancelGraphRun => "cancel_graph_run",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::RunGraphSession => 0,
            Self::ListGraphSessions => 1,
            Self::GetGraphRun => 2,
            Self::CancelGraphRun => 3,
        }
    }

    const fn default_description(self) -> &'static str {
        match self {
            Self::RunGraphSession => RUN_DESCRIPTION,
            Self::ListGraphSessions => LIST_DESCRIPTION,
            Self::GetGraphRun => GET_DESCRIPTION,
            Self::CancelGraphRun => CANCEL_DESCRIPTION,
        }
    }

    /// The published scope of the tool's level.
    const fn default_scope(self) -> &'static str {
        tool_level(self).default_scope()
    }
}

/// One tool as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    /// The operation.
    pub kind: ToolKind,
    /// The name agents call it by.
    pub name: String,
    /// The description agents read.
    pub description: String,
    /// OAuth2 scopes a token needs to call it (all of them).
    pub scopes: Vec<String>,
}

/// The four tools as an agent sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCatalog {
    tools: [ToolSpec; 4],
    max_wait_seconds: Option<u32>,
}

/// A catalog that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// Two tools would have the same name.
    #[error("two tools are both named `{0}`")]
    DuplicateName(String),
    /// A tool name is empty or not `[A-Za-z0-9_.-]{1,128}` (the MCP tool-name rule).
    #[error("tool name `{0}` must be 1 to 128 characters of letters, digits, `_`, `-` and `.`")]
    InvalidName(String),
    /// A tool has no scope.
    #[error("tool `{0}` needs at least one scope")]
    NoScope(String),
    /// `wait_seconds` was enabled with a maximum of zero.
    #[error("the maximum `wait_seconds` must be at least 1")]
    ZeroWait,
}

impl ToolCatalog {
    /// The published catalog (SPEC §2), without the `wait_seconds` extension.
    pub fn published() -> Self {
        Self {
            tools: ToolKind::ALL.map(|kind| ToolSpec {
                kind,
                name: kind.default_name().to_owned(),
                description: kind.default_description().to_owned(),
                scopes: vec![kind.default_scope().to_owned()],
            }),
            max_wait_seconds: None,
        }
    }

    /// A builder starting from the published catalog.
    pub fn builder() -> CatalogBuilder {
        CatalogBuilder {
            catalog: Self::published(),
        }
    }

    /// The tools, in `tools/list` order.
    pub fn tools(&self) -> &[ToolSpec; 4] {
        &self.tools
    }

    /// The tool performing `kind`.
    pub fn spec(&self, kind: ToolKind) -> &ToolSpec {
        &self.tools[kind.index()]
    }

    /// The tool called `name`, if any.
    pub fn find(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The largest `wait_seconds` accepted by `get_graph_run`, or `None` when
    /// the server-side wait is switched off (the published schema).
    pub fn max_wait_seconds(&self) -> Option<u32> {
        self.max_wait_seconds
    }
}

impl Default for ToolCatalog {
    fn default() -> Self {
        Self::published()
    }
}

/// Changes names, descriptions, scopes and the server-side wait of a catalog.
#[derive(Debug, Clone)]
pub struct CatalogBuilder {
    catalog: ToolCatalog,
}

impl CatalogBuilder {
    /// Renames the tool performing `kind`.
    #[must_use]
    pub fn name(mut self, kind: ToolKind, name: impl Into<String>) -> Self {
        self.catalog.tools[kind.index()].name = name.into();
        self
    }

    /// Rewords the description of the tool performing `kind`.
    #[must_use]
    pub fn description(mut self, kind: ToolKind, description: impl Into<String>) -> Self {
        self.catalog.tools[kind.index()].description = description.into();
        self
    }

    /// Replaces the scopes the tool performing `kind` requires.
    #[must_use]
    pub fn scopes<I, S>(mut self, kind: ToolKind, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.catalog.tools[kind.index()].scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// Enables the optional `wait_seconds` argument of `get_graph_run`, up to `max` seconds.
    #[must_use]
    pub fn wait_seconds(mut self, max: Option<u32>) -> Self {
        self.catalog.max_wait_seconds = max;
        self
    }

    /// Checks the names and scopes and returns the catalog.
    pub fn build(self) -> Result<ToolCatalog, CatalogError> {
        let mut seen = BTreeSet::new();
        for tool in &self.catalog.tools {
            let valid = (1..=128).contains(&tool.name.len())
                && tool
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !valid {
                return Err(CatalogError::InvalidName(tool.name.clone()));
            }
            if !seen.insert(tool.name.as_str()) {
                return Err(CatalogError::DuplicateName(tool.name.clone()));
            }
            if tool.scopes.is_empty() {
                return Err(CatalogError::NoScope(tool.name.clone()));
            }
        }
        if self.catalog.max_wait_seconds == Some(0) {
            return Err(CatalogError::ZeroWait);
        }
        Ok(self.catalog)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The `tools/list` wire form is pinned by a committed insta snapshot
    /// (`core/src/snapshots/`); a change fails until it is reviewed and
    /// accepted (`cargo insta review`, or `INSTA_UPDATE=always`).
    fn tools_snapshot(actual: &Value) -> String {
        serde_json::to_string_pretty(actual).expect("a Value serializes")
    }

    #[test]
    fn published_tools_list_matches_snapshot() {
        insta::assert_snapshot!(
            "tools_list",
            tools_snapshot(&ToolCatalog::published().tools_list())
        );
    }

    #[test]
    fn tools_list_with_wait_seconds_matches_snapshot() {
        let catalog = ToolCatalog::builder()
            .wait_seconds(Some(60))
            .build()
            .unwrap();
        insta::assert_snapshot!("tools_list_wait", tools_snapshot(&catalog.tools_list()));
    }

    #[test]
    fn run_graph_session_is_exactly_the_published_entry() {
        let published: Value = serde_json::from_str(r#"{"name": "run_graph_session",
 "description": "Queue a Graph run on the owner's online desktop in a connected project. Retrieve progress and result with get_graph_run. The desktop can go offline, and local tool approvals still apply.",
 "inputSchema": {"type": "object",
   "properties": {"graph_session_id": {"type": "string"},
                  "arguments": {"type": "object"},
                  "idempotency_key": {"type": "string", "minLength": 8, "maxLength": 128}},
   "required": ["graph_session_id", "idempotency_key"],
   "additionalProperties": false},
 "annotations": {"readOnlyHint": false, "destructiveHint": true},
 "securitySchemes": [{"type": "oauth2", "scopes": ["osfoundry:run"]}]}"#).unwrap();
        assert_eq!(ToolCatalog::published().tools_list()[0], published);
    }

    #[test]
    fn builder_renames_and_validates() {
        let c = ToolCatalog::builder()
            .name(ToolKind::GetGraphRun, "read_run")
            .scopes(ToolKind::GetGraphRun, ["acme:read"])
            .build()
            .unwrap();
        assert_eq!(c.find("read_run").unwrap().kind, ToolKind::GetGraphRun);
        assert!(c.find("get_graph_run").is_none());
        assert_eq!(
            c.tools_list()[2]["securitySchemes"][0]["scopes"],
            json!(["acme:read"])
        );
        assert_eq!(
            ToolCatalog::builder()
                .name(ToolKind::GetGraphRun, "run_graph_session")
                .build(),
            Err(CatalogError::DuplicateName("run_graph_session".into()))
        );
        assert!(matches!(
            ToolCatalog::builder()
                .name(ToolKind::GetGraphRun, "bad name")
                .build(),
            Err(CatalogError::InvalidName(_))
        ));
        assert!(matches!(
            ToolCatalog::builder()
                .scopes(ToolKind::GetGraphRun, Vec::<String>::new())
                .build(),
            Err(CatalogError::NoScope(_))
        ));
    }
}
