//! Decoding tool arguments from a JSON object into typed requests.
//!
//! Every failure names the field: unknown fields, wrong types, values out of
//! range and malformed ids are all refused here, before any store is touched.

use serde_json::{Map, Value};

use crate::catalog::ToolKind;
use crate::ids::{CommandId, GraphSessionId, IdempotencyKey, InvalidId, ProjectId};

use crate::limits::{DEFAULT_LIST_LIMIT, MAX_ARGUMENTS_BYTES};

/// Arguments of `run_graph_session`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// The saved Graph to run.
    pub graph_session_id: GraphSessionId,
    /// Input for the Graph (an object; `{}` when omitted).
    pub arguments: Map<String, Value>,
    /// The client's retry key.
    pub idempotency_key: IdempotencyKey,
}

impl RunArgs {
    /// The arguments of a run, checked as `run_graph_session` checks them:
    /// `arguments` must be a JSON object of at most
    /// [`MAX_ARGUMENTS_BYTES`] bytes of compact JSON.
    pub fn new(
        graph_session_id: GraphSessionId,
        arguments: Value,
        idempotency_key: IdempotencyKey,
    ) -> Result<Self, ArgError> {
        Ok(Self {
            graph_session_id,
            arguments: checked_arguments(&arguments, None)?,
            idempotency_key,
        })
    }
}

/// The `arguments` of a run, if they are an object within the size limit.
/// `measured`: their size, when an empty object stands for arguments too
/// large to be kept (see [`ToolArgs::decode_measured`]).
fn checked_arguments(
    value: &Value,
    measured: Option<usize>,
) -> Result<Map<String, Value>, ArgError> {
    let Value::Object(map) = value else {
        return Err(ArgError::WrongType {
            field: "arguments",
            expected: "an object",
        });
    };
    let size = measured.unwrap_or_else(|| {
        serde_json::to_vec(map)
            .map(|v| v.len())
            .unwrap_or(usize::MAX)
    });
    if size > MAX_ARGUMENTS_BYTES {
        return Err(ArgError::TooLarge {
            field: "arguments",
            size,
            limit: MAX_ARGUMENTS_BYTES,
        });
    }
    Ok(map.clone())
}

/// Arguments of `list_graph_sessions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListArgs {
    /// The connected project.
    pub project_id: ProjectId,
    /// At most this many sessions (1–50).
    pub limit: u32,
}

/// Arguments of `get_graph_run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetArgs {
    /// The ticket.
    pub command_id: CommandId,
    /// Seconds to wait for a terminal state (0 unless the wait is enabled).
    pub wait_seconds: u32,
}

/// Arguments of `cancel_graph_run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelArgs {
    /// The ticket.
    pub command_id: CommandId,
}

/// Typed arguments of any of the four tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolArgs {
    /// `run_graph_session`.
    Run(RunArgs),
    /// `list_graph_sessions`.
    List(ListArgs),
    /// `get_graph_run`.
    Get(GetArgs),
    /// `cancel_graph_run`.
    Cancel(CancelArgs),
}

/// Why tool arguments were refused. Each message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// The arguments are not a JSON object.
    #[error("arguments must be a JSON object")]
    NotAnObject,
    /// A field the schema does not define.
    #[error("unknown field `{0}` (additional properties are not allowed)")]
    UnknownField(String),
    /// A required field is absent.
    #[error("missing required field `{0}`")]
    Missing(&'static str),
    /// A field has the wrong JSON type.
    #[error("`{field}` must be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be, e.g. "a string".
        expected: &'static str,
    },
    /// An integer outside its range.
    #[error("`{field}` must be an integer from {min} to {max}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// A value larger than the server accepts.
    #[error("`{field}` is too large ({size} bytes; the limit is {limit})")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its size in bytes of compact JSON.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A malformed identifier.
    #[error(transparent)]
    Invalid(#[from] InvalidId),
}

/// Reads fields of one arguments object, refusing any it was not asked about.
struct Fields<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn new(value: Option<&'a Value>, allowed: &[&str]) -> Result<Self, ArgError> {
        debug_assert!(allowed.iter().all(|f| TOOL_FIELDS.contains(f)));
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match value {
            None | Some(Value::Null) => EMPTY.get_or_init(Map::new),
            Some(Value::Object(map)) => map,
            Some(_) => return Err(ArgError::NotAnObject),
        };
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ArgError::UnknownField(unknown.clone()));
        }
        Ok(Self { map })
    }

    fn string(&self, field: &'static str) -> Result<&'a str, ArgError> {
        match self.map.get(field) {
            None => Err(ArgError::Missing(field)),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(ArgError::WrongType {
                field,
                expected: "a string",
            }),
        }
    }

    fn integer(&self, field: &'static str, min: u64, max: u64) -> Result<Option<u64>, ArgError> {
        match self.map.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                // JSON Schema's "integer" admits 5.0; accept integral floats too.
                let value = n.as_u64().or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                        .map(|f| f as u64)
                });
                match value {
                    Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                    _ if n.is_f64() && n.as_f64().is_some_and(|f| f.fract() != 0.0) => {
                        Err(ArgError::WrongType {
                            field,
                            expected: "an integer",
                        })
                    }
                    _ => Err(ArgError::OutOfRange { field, min, max }),
                }
            }
            Some(_) => Err(ArgError::WrongType {
                field,
                expected: "an integer",
            }),
        }
    }
}

/// Every field some tool's `arguments` define. A field outside this list
/// is unknown to every tool.
pub(crate) const TOOL_FIELDS: &[&str] = &[
    "graph_session_id",
    "arguments",
    "idempotency_key",
    "project_id",
    "limit",
    "command_id",
    "wait_seconds",
];

impl ToolArgs {
    /// Decodes the `arguments` of a `tools/call` for the tool performing
    /// `kind`. `max_wait_seconds` is `None` when the server-side wait is off,
    /// in which case `wait_seconds` is an unknown field like any other.
    pub fn decode(
        kind: ToolKind,
        arguments: Option<&Value>,
        max_wait_seconds: Option<u32>,
    ) -> Result<Self, ArgError> {
        Self::decode_measured(kind, arguments, max_wait_seconds, None)
    }

    /// [`ToolArgs::decode`] of `arguments` in which an empty object stands
    /// for a run's `arguments` of `too_large` bytes of compact JSON, more
    /// than a run accepts (the MCP layer does not build what it would
    /// refuse anyway).
    pub(crate) fn decode_measured(
        kind: ToolKind,
        arguments: Option<&Value>,
        max_wait_seconds: Option<u32>,
        too_large: Option<usize>,
    ) -> Result<Self, ArgError> {
        match kind {
            ToolKind::RunGraphSession => {
                let f = Fields::new(
                    arguments,
                    &["graph_session_id", "arguments", "idempotency_key"],
                )?;
                let graph_session_id = GraphSessionId::parse(f.string("graph_session_id")?)?;
                let idempotency_key = IdempotencyKey::parse(f.string("idempotency_key")?)?;
                let arguments = match f.map.get("arguments") {
                    None => Map::new(),
                    Some(value) => checked_arguments(value, too_large)?,
                };
                Ok(Self::Run(RunArgs {
                    graph_session_id,
                    arguments,
                    idempotency_key,
                }))
            }
            ToolKind::ListGraphSessions => {
                let f = Fields::new(arguments, &["project_id", "limit"])?;
                let project_id = ProjectId::parse(f.string("project_id")?)?;
                let limit = f
                    .integer(
                        "limit",
                        crate::limits::MIN_LIST_LIMIT.into(),
                        crate::limits::MAX_LIST_LIMIT.into(),
                    )?
                    .map_or(DEFAULT_LIST_LIMIT, |v| v as u32);
                Ok(Self::List(ListArgs { project_id, limit }))
            }
            ToolKind::GetGraphRun => {
                let allowed: &[&str] = if max_wait_seconds.is_some() {
                    &["command_id", "wait_seconds"]
                } else {
                    &["command_id"]
                };
                let f = Fields::new(arguments, allowed)?;
                let command_id = CommandId::parse(f.string("command_id")?)?;
                let wait_seconds = match max_wait_seconds {
                    Some(max) => f.integer("wait_seconds", 0, u64::from(max))?.unwrap_or(0) as u32,
                    None => 0,
                };
                Ok(Self::Get(GetArgs {
                    command_id,
                    wait_seconds,
                }))
            }
            ToolKind::CancelGraphRun => {
                let f = Fields::new(arguments, &["command_id"])?;
                let command_id = CommandId::parse(f.string("command_id")?)?;
                Ok(Self::Cancel(CancelArgs { command_id }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GS: &str = "gs_0123456789abcdef0123456789abcdef";
    const UUID: &str = "67e55044-10b1-426f-9247-bb680e5fe0c8";

    fn run(v: Value) -> Result<ToolArgs, ArgError> {
        ToolArgs::decode(ToolKind::RunGraphSession, Some(&v), None)
    }

    #[test]
    fn run_args_built_in_code_are_checked_as_decoded_ones() {
        let (gs, key) = (
            GraphSessionId::parse(GS).unwrap(),
            IdempotencyKey::parse("key-0001").unwrap(),
        );
        let ok = RunArgs::new(gs.clone(), json!({"a": 1}), key.clone()).unwrap();
        assert_eq!(ok.arguments.get("a"), Some(&json!(1)));
        assert!(matches!(
            RunArgs::new(gs.clone(), json!([1]), key.clone()),
            Err(ArgError::WrongType {
                field: "arguments",
                ..
            })
        ));
        let huge = json!({"x": "y".repeat(MAX_ARGUMENTS_BYTES)});
        assert!(matches!(
            RunArgs::new(gs, huge, key),
            Err(ArgError::TooLarge {
                field: "arguments",
                ..
            })
        ));
    }

    #[test]
    fn every_field_a_tool_defines_is_a_tool_field() {
        // A field outside TOOL_FIELDS is refused as unknown by every tool.
        for kind in [
            ToolKind::RunGraphSession,
            ToolKind::ListGraphSessions,
            ToolKind::GetGraphRun,
            ToolKind::CancelGraphRun,
        ] {
            // `Fields::new` checks its allowed fields against TOOL_FIELDS.
            let refused = ToolArgs::decode(kind, Some(&json!({"~other": 1})), Some(30));
            assert_eq!(refused, Err(ArgError::UnknownField("~other".into())));
        }
    }

    #[test]
    fn run_args_decode_and_default_arguments() {
        let ToolArgs::Run(a) =
            run(json!({"graph_session_id": GS, "idempotency_key": "key-0001"})).unwrap()
        else {
            panic!()
        };
        assert!(a.arguments.is_empty());
        assert_eq!(a.graph_session_id.as_str(), GS);
    }

    #[test]
    fn run_args_refusals_name_the_field() {
        let cases = [
            (json!([1]), "arguments must be a JSON object"),
            (
                json!({"graph_session_id": GS}),
                "missing required field `idempotency_key`",
            ),
            (
                json!({"graph_session_id": 5, "idempotency_key": "key-0001"}),
                "`graph_session_id` must be a string",
            ),
            (
                json!({"graph_session_id": GS, "idempotency_key": "1234567"}),
                "`idempotency_key` must be 8 to 128 characters long",
            ),
            (
                json!({"graph_session_id": GS, "idempotency_key": "k".repeat(129)}),
                "`idempotency_key` must be 8 to 128 characters long",
            ),
            (
                json!({"graph_session_id": GS, "idempotency_key": "key-0001", "arguments": []}),
                "`arguments` must be an object",
            ),
            (
                json!({"graph_session_id": GS, "idempotency_key": "key-0001", "extra": 1}),
                "unknown field `extra` (additional properties are not allowed)",
            ),
            (
                json!({"graph_session_id": "gs_x", "idempotency_key": "key-0001"}),
                "`graph_session_id` must be `gs_` followed by exactly 32 lowercase hexadecimal characters",
            ),
        ];
        for (input, message) in cases {
            assert_eq!(
                run(input.clone()).unwrap_err().to_string(),
                message,
                "{input}"
            );
        }
        let huge = json!({"graph_session_id": GS, "idempotency_key": "key-0001", "arguments": {"x": "y".repeat(MAX_ARGUMENTS_BYTES)}});
        assert!(matches!(
            run(huge),
            Err(ArgError::TooLarge {
                field: "arguments",
                ..
            })
        ));
    }

    #[test]
    fn list_limit_range() {
        let list = |v: Value| ToolArgs::decode(ToolKind::ListGraphSessions, Some(&v), None);
        assert_eq!(
            list(json!({"project_id": "p1"})).unwrap(),
            ToolArgs::List(ListArgs {
                project_id: ProjectId::parse("p1").unwrap(),
                limit: DEFAULT_LIST_LIMIT
            })
        );
        assert!(list(json!({"project_id": "p1", "limit": 1})).is_ok());
        assert!(list(json!({"project_id": "p1", "limit": 50.0})).is_ok());
        for bad in [json!(0), json!(51), json!(-1), json!(1e300)] {
            assert_eq!(
                list(json!({"project_id": "p1", "limit": bad}))
                    .unwrap_err()
                    .to_string(),
                "`limit` must be an integer from 1 to 50"
            );
        }
        assert_eq!(
            list(json!({"project_id": "p1", "limit": 2.5}))
                .unwrap_err()
                .to_string(),
            "`limit` must be an integer"
        );
        assert_eq!(
            list(json!({"project_id": "p1", "limit": "5"}))
                .unwrap_err()
                .to_string(),
            "`limit` must be an integer"
        );
    }

    #[test]
    fn get_and_cancel_need_a_uuid() {
        for kind in [ToolKind::GetGraphRun, ToolKind::CancelGraphRun] {
            assert!(ToolArgs::decode(kind, Some(&json!({"command_id": UUID})), None).is_ok());
            assert_eq!(
                ToolArgs::decode(kind, Some(&json!({"command_id": "42"})), None)
                    .unwrap_err()
                    .to_string(),
                "`command_id` must be a UUID in hyphenated form (8-4-4-4-12 hex digits)"
            );
            assert_eq!(
                ToolArgs::decode(kind, None, None).unwrap_err(),
                ArgError::Missing("command_id")
            );
        }
    }

    #[test]
    fn wait_seconds_exists_only_when_enabled() {
        let v = json!({"command_id": UUID, "wait_seconds": 10});
        assert_eq!(
            ToolArgs::decode(ToolKind::GetGraphRun, Some(&v), None).unwrap_err(),
            ArgError::UnknownField("wait_seconds".into())
        );
        assert!(matches!(
            ToolArgs::decode(ToolKind::GetGraphRun, Some(&v), Some(30)).unwrap(),
            ToolArgs::Get(GetArgs {
                wait_seconds: 10,
                ..
            })
        ));
        let too_long = json!({"command_id": UUID, "wait_seconds": 31});
        assert!(matches!(
            ToolArgs::decode(ToolKind::GetGraphRun, Some(&too_long), Some(30)),
            Err(ArgError::OutOfRange {
                field: "wait_seconds",
                ..
            })
        ));
    }
}
