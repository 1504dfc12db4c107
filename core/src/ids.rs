//! Identifiers as types.
//!
//! Every value that crosses the system boundary is parsed into one of these
//! types before anything else happens, so a malformed id can never reach a
//! store. Parsing errors name the field and the rule that was broken.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that does not satisfy the rule of its identifier type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {rule}")]
pub struct InvalidId {
    /// The wire name of the field, e.g. `command_id`.
    pub field: &'static str,
    /// The rule that was broken, phrased to follow the field name.
    pub rule: &'static str,
}

/// Ticket of one queued Graph run: a UUID, printed in lowercase hyphenated form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommandId(uuid::Uuid);

impl CommandId {
    const RULE: &'static str = "must be a UUID in hyphenated form (8-4-4-4-12 hex digits)";

    /// Parses the hyphenated form (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
    /// either case). Braced, URN and undelimited forms are refused so that a
    /// ticket has exactly one spelling on the wire.
    pub fn parse(text: &str) -> Result<Self, InvalidId> {
        let invalid = InvalidId {
            field: "command_id",
            rule: Self::RULE,
        };
        if text.len() != 36 {
            return Err(invalid);
        }
        uuid::Uuid::try_parse(text).map(Self).map_err(|_| invalid)
    }

    /// Wraps a UUID.
    pub const fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID inside.
    pub const fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }

    /// The relay channel this command runs on: `graph:external:<command id>`.
    pub fn channel(&self) -> String {
        format!("graph:external:{}", self.0.hyphenated())
    }
}

impl fmt::Display for CommandId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for CommandId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CommandId({})", self.0.hyphenated())
    }
}

impl FromStr for CommandId {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for CommandId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // The `Display` text, written into a buffer on the stack (no
        // formatting machinery).
        let mut buffer = uuid::Uuid::encode_buffer();
        serializer.serialize_str(self.0.hyphenated().encode_lower(&mut buffer))
    }
}

impl<'de> Deserialize<'de> for CommandId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Defines a string-backed identifier with a validating constructor.
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, field = $field:literal, rule = $rule:literal, check = $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// The wire name of this identifier, used in error messages.
            pub const FIELD: &'static str = $field;

            /// Parses and validates a value.
            pub fn parse(text: &str) -> Result<Self, InvalidId> {
                let check: fn(&str) -> bool = $check;
                if check(text) {
                    Ok(Self(std::sync::Arc::from(text)))
                } else {
                    Err(InvalidId { field: $field, rule: $rule })
                }
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// True for 1–128 characters of `[A-Za-z0-9._:@-]`.
fn is_name(text: &str) -> bool {
    (1..=crate::limits::MAX_NAME_BYTES).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

string_id!(
    /// Durable identity of a saved Graph on one device: `gs_` and 32 lowercase hex digits.
    GraphSessionId,
    field = "graph_session_id",
    rule = "must be `gs_` followed by exactly 32 lowercase hexadecimal characters",
    check = |t| t.len() == 35
        && t.starts_with("gs_")
        && t.bytes().skip(3).all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
);

string_id!(
    /// Client-chosen key that makes `run_graph_session` safe to retry:
    /// 8 to 128 characters, counted as Unicode code points (as JSON Schema's
    /// `minLength`/`maxLength` count them).
    IdempotencyKey,
    field = "idempotency_key",
    rule = "must be 8 to 128 characters long",
    check = |t| (crate::limits::MIN_IDEMPOTENCY_KEY_CHARS
        ..=crate::limits::MAX_IDEMPOTENCY_KEY_CHARS)
        .contains(&t.chars().count())
);

string_id!(
    /// A connected project of an owner (1–128 characters of `[A-Za-z0-9._:@-]`).
    ProjectId,
    field = "project_id",
    rule = "must be 1 to 128 characters of letters, digits and `._:@-`",
    check = is_name
);

string_id!(
    /// The principal an agent's token belongs to (1–128 characters of `[A-Za-z0-9._:@-]`).
    AgentId,
    field = "agent_id",
    rule = "must be 1 to 128 characters of letters, digits and `._:@-`",
    check = is_name
);

string_id!(
    /// The person who owns desktops, projects and agents (1–128 characters of `[A-Za-z0-9._:@-]`).
    OwnerId,
    field = "owner_id",
    rule = "must be 1 to 128 characters of letters, digits and `._:@-`",
    check = is_name
);

string_id!(
    /// One desktop running one relay (1–128 characters of `[A-Za-z0-9._:@-]`).
    DeviceId,
    field = "device_id",
    rule = "must be 1 to 128 characters of letters, digits and `._:@-`",
    check = is_name
);

string_id!(
    /// The id the desktop engine gave one execution of a command; completions
    /// are fenced by it. 1–256 visible ASCII characters.
    ExecutionId,
    field = "execution_id",
    rule = "must be 1 to 256 visible ASCII characters",
    check = |t| (1..=256).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic())
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_id_accepts_hyphenated_uuids_only() {
        let id = CommandId::parse("67E55044-10B1-426F-9247-BB680E5FE0C8").unwrap();
        assert_eq!(id.to_string(), "67e55044-10b1-426f-9247-bb680e5fe0c8");
        assert_eq!(
            id.channel(),
            "graph:external:67e55044-10b1-426f-9247-bb680e5fe0c8"
        );
        for bad in [
            "",
            "not-a-uuid",
            "67e5504410b1426f9247bb680e5fe0c8",
            "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
            "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0c8",
            "67e55044-10b1-426f-9247-bb680e5fe0cg",
            " 67e55044-10b1-426f-9247-bb680e5fe0c8",
        ] {
            let err = CommandId::parse(bad).unwrap_err();
            assert_eq!(err.field, "command_id", "{bad}");
            assert!(err.to_string().contains("UUID"));
        }
    }

    #[test]
    fn graph_session_id_is_gs_and_32_lowercase_hex() {
        let ok = format!("gs_{}", "0123456789abcdef".repeat(2));
        assert!(GraphSessionId::parse(&ok).is_ok());
        for bad in [
            format!("gs_{}", "0123456789ABCDEF".repeat(2)),
            format!("gs_{}", "0".repeat(31)),
            format!("gs_{}", "0".repeat(33)),
            format!("GS_{}", "0".repeat(32)),
            format!("gx_{}", "0".repeat(32)),
            format!("gs_{}g", "0".repeat(31)),
        ] {
            let err = GraphSessionId::parse(&bad).unwrap_err();
            assert_eq!(err.field, "graph_session_id");
            assert!(
                err.to_string().contains("32 lowercase hexadecimal"),
                "{err}"
            );
        }
    }

    #[test]
    fn idempotency_key_counts_code_points() {
        assert!(IdempotencyKey::parse("1234567").is_err());
        assert!(IdempotencyKey::parse("12345678").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(128)).is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(129)).is_err());
        // Eight Japanese characters are 24 UTF-8 bytes but 8 code points.
        assert!(IdempotencyKey::parse("日本語のキーです").is_ok());
        assert!(IdempotencyKey::parse(&"鍵".repeat(128)).is_ok());
        assert!(IdempotencyKey::parse(&"鍵".repeat(129)).is_err());
        let err = IdempotencyKey::parse("short").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`idempotency_key` must be 8 to 128 characters long"
        );
    }

    #[test]
    fn names_and_execution_ids() {
        assert!(ProjectId::parse("proj-1").is_ok());
        assert!(ProjectId::parse("").is_err());
        assert!(ProjectId::parse("has space").is_err());
        assert!(ProjectId::parse(&"p".repeat(129)).is_err());
        assert!(ExecutionId::parse("exec/42:a").is_ok());
        assert!(ExecutionId::parse("exec 42").is_err());
        assert!(ExecutionId::parse(&"e".repeat(257)).is_err());
    }

    #[test]
    fn serde_round_trip_validates() {
        let id: CommandId =
            serde_json::from_str("\"67e55044-10b1-426f-9247-bb680e5fe0c8\"").unwrap();
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            "\"67e55044-10b1-426f-9247-bb680e5fe0c8\""
        );
        assert!(serde_json::from_str::<CommandId>("\"nope\"").is_err());
        assert!(serde_json::from_str::<GraphSessionId>("\"gs_1\"").is_err());
    }
}
