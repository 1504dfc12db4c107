//! `graph-relay.toml`: server settings and token hashes in one file.

use std::path::Path;

use graph_relay_transport_http::auth::{AgentToken, DeviceToken};
use graph_relay_transport_http::oauth::OAuthConfig;
use serde::{Deserialize, Serialize};

/// The `[server]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Public base URL announced in resource metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// Authorization servers announced in resource metadata.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_servers: Vec<String>,
    /// Accepted `Host` names (default: loopback names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin`s besides loopback ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
    /// Request timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_secs: Option<u64>,
    /// Ports accepted in `Host` besides the listening port and that of
    /// `public_url` (e.g. 443 behind a TLS proxy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_ports: Vec<u16>,
    /// Most open connections (default 4,096); more are answered 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a complete request head (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds an idle kept-alive connection stays open (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// Most initialize-era sessions in all (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<usize>,
    /// Most initialize-era sessions of one agent (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_agent: Option<usize>,
    /// Seconds an unused session is kept (default 3,600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_idle_timeout_secs: Option<u64>,
    /// Most open `subscriptions/listen` streams of one agent (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_listen_streams_per_agent: Option<usize>,
    /// Longest life of one listen stream in seconds (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_listen_lifetime_secs: Option<u64>,
    /// The lease of a run on a long-polling desktop, in seconds (default
    /// 60): a run whose desktop says nothing for this long ends `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
    /// The lease of a run on a desktop in interval mode, in control
    /// intervals of 3 s (default 10, at least 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_interval_controls: Option<u32>,
    /// Serve `GET /metrics` (Prometheus) on this address, a listener of
    /// its own (e.g. `127.0.0.1:9187`); off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// SHA-256 (hex) of the operator token (`graph-relay token operator`):
    /// with it, the metrics listener answers `GET /admin/status`, which
    /// `graph-relay status --server` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_token_sha256: Option<String>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Server settings.
    #[serde(default)]
    pub server: ServerSection,
    /// Access tokens from an external authorization server (OAuth 2.1),
    /// accepted besides the static tokens below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthConfig>,
    /// Agent tokens (hashes only).
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentToken>,
    /// Device tokens (hashes only).
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceToken>,
}

/// Why the configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML of the expected shape.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// Could not be serialised.
    #[error("cannot write the configuration: {0}")]
    Serialize(#[from] toml::ser::Error),
}

impl ConfigFile {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source: Box::new(source),
        })
    }

    /// Writes `path` (owner-only permissions on Unix), via a temporary file.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let text = format!(
            "# graph-relay configuration. Tokens are stored as SHA-256 hashes only.\n{}",
            toml::to_string_pretty(self)?
        );
        let io = |source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        };
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }
}
