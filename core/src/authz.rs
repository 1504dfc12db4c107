//! The authorization table: which OAuth2 scope every MCP method and every
//! tool needs, stated once (SPEC §10, "One scope table").
//!
//! | message | needs |
//! |---|---|
//! | `initialize`, `ping`, `tools/list`, `server/discover` | no scope |
//! | every `notifications/*`, every client response | no scope |
//! | `tools/call` | the scopes the catalog gives the named tool |
//! | `tasks/get`, `subscriptions/listen` | what `get_graph_run` needs (read) |
//! | `tasks/cancel` | what `cancel_graph_run` needs (run) |
//! | `tasks/update` | what `run_graph_session` needs (run) |
//!
//! | tool | level | published scope |
//! |---|---|---|
//! | `run_graph_session`, `cancel_graph_run` | [`ScopeLevel::Run`](crate::catalog::ScopeLevel::Run) | `osfoundry:run` |
//! | `list_graph_sessions`, `get_graph_run` | [`ScopeLevel::Read`](crate::catalog::ScopeLevel::Read) | `osfoundry:read` |
//!
//! Scope *strings* live in the [`ToolCatalog`], because integrators may
//! rename them; a method that is not a tool call needs "what tool X needs",
//! so the table and the catalog cannot disagree. The catalog's defaults come
//! from [`tool_level`](crate::catalog::tool_level).
//!
//! The MCP dispatcher ([`crate::mcp::McpServer::handle_incoming`]) only
//! answers methods it can parse into a [`Method`], and [`Method::access`] is
//! an exhaustive `match`: a method cannot be answered without an entry here.
//! Transports enforce the same table before any work
//! ([`crate::mcp::McpServer::authorize`]) and render a refusal, a
//! [`ScopeDenied`], as their one `insufficient_scope` answer.

use crate::catalog::{ToolCatalog, ToolKind};

/// Every JSON-RPC method the MCP server answers (or, for notifications,
/// accepts). Anything else is answered `-32601` without being looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `initialize` (initialize era).
    Initialize,
    /// `ping` (initialize era).
    Ping,
    /// `tools/list`.
    ToolsList,
    /// `tools/call`.
    ToolsCall,
    /// `server/discover` (2026-07-28).
    ServerDiscover,
    /// `subscriptions/listen` (2026-07-28, tasks extension).
    SubscriptionsListen,
    /// `tasks/get` (tasks extension).
    TasksGet,
    /// `tasks/cancel` (tasks extension).
    TasksCancel,
    /// `tasks/update` (tasks extension).
    TasksUpdate,
    /// Any `notifications/*` message: accepted, never answered.
    Notification,
}

/// What a message needs beyond an authenticated agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// No scope.
    Open,
    /// The scopes the catalog gives the tool the `tools/call` names (none
    /// for an unknown tool, which is refused with `-32602` instead).
    CalledTool,
    /// The scopes the catalog gives the tool performing this operation.
    AsTool(ToolKind),
}

impl Method {
    /// Every method, in the order of the table above.
    pub const ALL: [Method; 10] = [
        Method::Initialize,
        Method::Ping,
        Method::ToolsList,
        Method::ToolsCall,
        Method::ServerDiscover,
        Method::SubscriptionsListen,
        Method::TasksGet,
        Method::TasksCancel,
        Method::TasksUpdate,
        Method::Notification,
    ];

    /// The method called `name`; `None` for a method this server does not answer.
    pub fn parse(name: &str) -> Option<Self> {
        if name.starts_with("notifications/") {
            return Some(Self::Notification);
        }
        Self::ALL
            .into_iter()
            .find(|m| *m != Self::Notification && m.name() == name)
    }

    /// The wire name (`notifications/*` for the notification class).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Initialize => "initialize",
            Self::Ping => "ping",
            Self::ToolsList => "tools/list",
            Self::ToolsCall => "tools/call",
            Self::ServerDiscover => "server/discover",
            Self::SubscriptionsListen => "subscriptions/listen",
            Self::TasksGet => "tasks/get",
            Self::TasksCancel => "tasks/cancel",
            Self::TasksUpdate => "tasks/update",
            Self::Notification => "notifications/*",
        }
    }

    /// **The table**: what the method needs.
    pub const fn access(self) -> Access {
        match self {
            Self::Initialize
            | Self::Ping
            | Self::ToolsList
            | Self::ServerDiscover
            | Self::Notification => Access::Open,
            Self::ToolsCall => Access::CalledTool,
            Self::SubscriptionsListen | Self::TasksGet => Access::AsTool(ToolKind::GetGraphRun),
            Self::TasksCancel => Access::AsTool(ToolKind::CancelGraphRun),
            // Giving a run input is acting on it, like starting one.
            Self::TasksUpdate => Access::AsTool(ToolKind::RunGraphSession),
        }
    }
}

impl Access {
    /// The scope strings this needs under `catalog`; `tool` is the name a
    /// `tools/call` carries. Empty when nothing is needed.
    pub fn scopes<'c>(self, catalog: &'c ToolCatalog, tool: Option<&str>) -> &'c [String] {
        match self {
            Self::Open => &[],
            Self::CalledTool => tool
                .and_then(|name| catalog.find(name))
                .map_or(&[], |spec| spec.scopes.as_slice()),
            Self::AsTool(kind) => catalog.spec(kind).scopes.as_slice(),
        }
    }
}

/// A message refused because the token lacks a scope the table requires.
/// Every transport renders it as its one `insufficient_scope` answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "insufficient_scope: {subject} requires the scope `{scope}`, which this agent's token does not grant"
)]
pub struct ScopeDenied {
    /// What was refused: the tool name for `tools/call`, else the method.
    pub subject: String,
    /// The first required scope the token lacks.
    pub scope: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{READ_SCOPE, RUN_SCOPE, tool_level};

    #[test]
    fn parse_and_name_round_trip_for_every_method() {
        for method in Method::ALL {
            if method == Method::Notification {
                assert_eq!(Method::parse("notifications/initialized"), Some(method));
            } else {
                assert_eq!(Method::parse(method.name()), Some(method));
            }
        }
        for unknown in [
            "resources/list",
            "tasks/list",
            "",
            "notifications",
            "Tools/List",
        ] {
            assert_eq!(Method::parse(unknown), None, "{unknown}");
        }
    }

    /// The table, resolved against the published catalog, says exactly what
    /// SPEC §10 says.
    #[test]
    fn the_published_table_matches_the_spec() {
        let catalog = ToolCatalog::published();
        let expected = |m: Method| -> &'static [&'static str] {
            match m {
                Method::TasksGet | Method::SubscriptionsListen => &[READ_SCOPE],
                Method::TasksCancel | Method::TasksUpdate => &[RUN_SCOPE],
                _ => &[],
            }
        };
        for method in Method::ALL {
            assert_eq!(
                method.access().scopes(&catalog, None),
                expected(method),
                "{method:?}"
            );
        }
        for (tool, scope) in [
            ("run_graph_session", RUN_SCOPE),
            ("cancel_graph_run", RUN_SCOPE),
            ("list_graph_sessions", READ_SCOPE),
            ("get_graph_run", READ_SCOPE),
        ] {
            assert_eq!(
                Method::ToolsCall.access().scopes(&catalog, Some(tool)),
                [scope],
                "{tool}"
            );
        }
        assert!(
            Method::ToolsCall
                .access()
                .scopes(&catalog, Some("no_such_tool"))
                .is_empty()
        );
    }

    /// Renamed scopes follow the catalog: the table names tools, not strings.
    #[test]
    fn renamed_scopes_follow_the_catalog() {
        let catalog = ToolCatalog::builder()
            .scopes(ToolKind::GetGraphRun, ["acme:look"])
            .scopes(ToolKind::CancelGraphRun, ["acme:stop"])
            .build()
            .unwrap();
        assert_eq!(
            Method::TasksGet.access().scopes(&catalog, None),
            ["acme:look"]
        );
        assert_eq!(
            Method::SubscriptionsListen.access().scopes(&catalog, None),
            ["acme:look"]
        );
        assert_eq!(
            Method::TasksCancel.access().scopes(&catalog, None),
            ["acme:stop"]
        );
    }

    #[test]
    fn the_catalog_defaults_come_from_the_table() {
        for tool in ToolCatalog::published().tools() {
            assert_eq!(
                tool.scopes,
                [tool_level(tool.kind).default_scope()],
                "{}",
                tool.name
            );
        }
    }
}
