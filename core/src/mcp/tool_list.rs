//! The catalog as MCP publishes it: the `tools/list` entry of each tool
//! (its input schema, annotations and OAuth scopes).

use serde_json::{Value, json};

use super::wire::{SecurityScheme, Tool, ToolAnnotations};
use crate::catalog::{ToolCatalog, ToolKind, ToolSpec};
use crate::limits::{
    MAX_IDEMPOTENCY_KEY_CHARS, MAX_LIST_LIMIT, MIN_IDEMPOTENCY_KEY_CHARS, MIN_LIST_LIMIT,
};

/// The annotations of a tool that only reads.
const READ_ONLY: ToolAnnotations = ToolAnnotations {
    destructive_hint: None,
    idempotent_hint: None,
    read_only_hint: true,
};

impl ToolCatalog {
    /// The `tools/list` array, as JSON.
    pub fn tools_list(&self) -> Value {
        crate::mcp::wire::to_value(&self.tool_definitions())
    }

    /// The `tools/list` array, typed.
    pub fn tool_definitions(&self) -> Vec<Tool> {
        self.tools().iter().map(|t| self.definition(t)).collect()
    }

    fn definition(&self, tool: &ToolSpec) -> Tool {
        let (schema, annotations) = self.schema_and_hints(tool.kind);
        let mut description = tool.description.clone();
        if tool.kind == ToolKind::GetGraphRun
            && let Some(max) = self.max_wait_seconds()
        {
            description.push_str(&format!(
                " Pass wait_seconds (up to {max}) to wait for the run to finish instead of polling."
            ));
        }
        Tool {
            annotations,
            description,
            input_schema: schema,
            name: tool.name.clone(),
            security_schemes: vec![SecurityScheme {
                scopes: tool.scopes.clone(),
                kind: "oauth2".to_owned(),
            }],
        }
    }

    /// The input schema of a tool of `kind`, and the hints a client may
    /// show about it (whether it changes anything, and may be repeated).
    fn schema_and_hints(&self, kind: ToolKind) -> (Value, ToolAnnotations) {
        let command_id = json!({"type": "string", "format": "uuid"});
        match kind {
            ToolKind::RunGraphSession => (
                json!({
                    "type": "object",
                    "properties": {
                        "graph_session_id": {"type": "string"},
                        "arguments": {"type": "object"},
                        "idempotency_key": {"type": "string", "minLength": MIN_IDEMPOTENCY_KEY_CHARS, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS}
                    },
                    "required": ["graph_session_id", "idempotency_key"],
                    "additionalProperties": false
                }),
                ToolAnnotations {
                    destructive_hint: Some(true),
                    idempotent_hint: None,
                    read_only_hint: false,
                },
            ),
            ToolKind::ListGraphSessions => (
                json!({
                    "type": "object",
                    "properties": {
                        "project_id": {"type": "string"},
                        "limit": {"type": "integer", "minimum": MIN_LIST_LIMIT, "maximum": MAX_LIST_LIMIT}
                    },
                    "required": ["project_id"],
                    "additionalProperties": false
                }),
                READ_ONLY,
            ),
            ToolKind::GetGraphRun => {
                let mut properties = json!({"command_id": command_id});
                if let Some(max) = self.max_wait_seconds() {
                    properties["wait_seconds"] = json!({
                        "type": "integer",
                        "minimum": 0,
                        "maximum": max,
                        "description": format!("Optional. Hold the call up to this many seconds (0 to {max}, default 0) and return as soon as the run finishes.")
                    });
                }
                (
                    json!({
                        "type": "object",
                        "properties": properties,
                        "required": ["command_id"],
                        "additionalProperties": false
                    }),
                    READ_ONLY,
                )
            }
            ToolKind::CancelGraphRun => (
                json!({
                    "type": "object",
                    "properties": {"command_id": command_id},
                    "required": ["command_id"],
                    "additionalProperties": false
                }),
                ToolAnnotations {
                    destructive_hint: Some(true),
                    idempotent_hint: Some(true),
                    read_only_hint: false,
                },
            ),
        }
    }
}
