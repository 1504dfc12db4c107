//! The MCP protocol revisions graph-relay speaks.
//!
//! Two eras: the *initialize era* (2025-03-26, 2025-06-18, 2025-11-25),
//! where a connection negotiates a version once with `initialize`, and the
//! *modern* revision 2026-07-28, where every request carries its version in
//! `_meta` and no handshake exists.

use std::fmt;

/// A protocol revision this server implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// 2025-03-26: Streamable HTTP appears; no `MCP-Protocol-Version` header yet.
    V2025_03_26,
    /// 2025-06-18: `structuredContent`, the `MCP-Protocol-Version` header, no batches.
    V2025_06_18,
    /// 2025-11-25: input validation errors become tool execution errors.
    V2025_11_25,
    /// 2026-07-28: stateless, self-contained requests.
    V2026_07_28,
}

impl ProtocolVersion {
    /// Every supported revision, newest first (the order of `supported` lists).
    pub const SUPPORTED: [ProtocolVersion; 4] = [
        ProtocolVersion::V2026_07_28,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_03_26,
    ];

    /// The newest initialize-era revision: the counter-offer to an unknown one.
    pub const LATEST_LEGACY: ProtocolVersion = ProtocolVersion::V2025_11_25;

    /// The newest revision.
    pub const LATEST: ProtocolVersion = ProtocolVersion::V2026_07_28;

    /// The revision named `text`, if supported.
    pub fn parse(text: &str) -> Option<Self> {
        Self::SUPPORTED.into_iter().find(|v| v.as_str() == text)
    }

    /// The wire spelling, e.g. `2025-11-25`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V2025_03_26 => "2025-03-26",
            Self::V2025_06_18 => "2025-06-18",
            Self::V2025_11_25 => "2025-11-25",
            Self::V2026_07_28 => "2026-07-28",
        }
    }

    /// True for 2026-07-28 and later (stateless, `_meta`-carried version).
    pub const fn is_modern(self) -> bool {
        matches!(self, Self::V2026_07_28)
    }

    /// True when tool results may carry `structuredContent` (2025-06-18 on).
    pub const fn has_structured_content(self) -> bool {
        !matches!(self, Self::V2025_03_26)
    }

    /// The supported versions as wire strings, newest first.
    pub fn supported_strings() -> Vec<&'static str> {
        Self::SUPPORTED.iter().map(|v| v.as_str()).collect()
    }
}

/// Serialized as its wire spelling (a stored [`McpSession`](super::McpSession)).
impl serde::Serialize for ProtocolVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ProtocolVersion {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("unsupported protocol version {text}")))
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_and_refuses_unknown() {
        for v in ProtocolVersion::SUPPORTED {
            assert_eq!(ProtocolVersion::parse(v.as_str()), Some(v));
        }
        assert_eq!(ProtocolVersion::parse("2024-11-05"), None);
        assert_eq!(ProtocolVersion::parse("1900-01-01"), None);
        assert!(ProtocolVersion::V2026_07_28.is_modern());
        assert!(!ProtocolVersion::LATEST_LEGACY.is_modern());
    }
}
