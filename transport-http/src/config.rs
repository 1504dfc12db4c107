//! `graph-relay.toml`, the server's one configuration file: the
//! `[server]` section (the HTTP edge, sessions, leases, metrics), the
//! `[oauth]` section ([`OAuthConfig`]) and the static agent and device
//! tokens (`[[agent]]`, `[[device]]`, hashes only). This is the file's one
//! schema: `graph-relay serve` reads it, [`TokenFile`](crate::token_file::TokenFile)
//! re-reads its tokens when it changes, and a
//! [`ServerBuilder`](crate::ServerBuilder) takes it whole
//! ([`ServerBuilder::config`](crate::ServerBuilder::config)).
//! Unknown keys are refused, so a misspelt setting never silently keeps
//! its default.
//!
//! ```
//! use graph_relay_transport_http::config::ConfigFile;
//!
//! let file = ConfigFile::parse(r#"
//!     [server]
//!     public_url = "https://relay.example.com"
//!     allowed_hosts = ["relay.example.com"]
//!     max_connections = 2000
//!     lease_seconds = 90
//!
//!     [[agent]]
//!     name = "assistant"
//!     owner = "alice"
//!     projects = ["default"]
//!     scopes = ["osfoundry:read", "osfoundry:run"]
//!     token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
//! "#)?;
//! assert_eq!(file.server.http_config().resource_url(), "https://relay.example.com/mcp");
//! assert_eq!(file.server.serve_config().max_connections, 2000);
//! assert!(ConfigFile::parse("[server]\nmax_conections = 1").is_err());
//! # Ok::<(), graph_relay_transport_http::config::ConfigError>(())
//! ```

use std::path::Path;
use std::time::Duration;

use graph_relay_core::queue::QueueConfig;
use serde::{Deserialize, Serialize};

use crate::auth::{AgentToken, DeviceToken, TokenConfig, TokenConfigError};
use crate::oauth::OAuthConfig;
use graph_relay_core::mcp::McpSessionLimits;

use crate::{HttpConfig, ListenLimits, ServeConfig};

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
    #[error("{}{source}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
    Parse {
        /// The file (empty for text read by [`ConfigFile::parse`]).
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
        Self::parse(&text).map_err(|e| e.in_file(path))
    }

    /// Reads the text of a configuration file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: String::new(),
            source: Box::new(source),
        })
    }

    /// The static tokens (`[[agent]]` and `[[device]]`).
    pub fn tokens(&self) -> TokenConfig {
        TokenConfig {
            agents: self.agents.clone(),
            devices: self.devices.clone(),
        }
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

impl ConfigError {
    /// The error, naming the file it came from.
    fn in_file(self, file: &Path) -> Self {
        match self {
            Self::Parse { source, .. } => Self::Parse {
                path: file.display().to_string(),
                source,
            },
            other => other,
        }
    }
}

impl ServerSection {
    /// The HTTP transport's settings: the section's values, defaults for
    /// what it leaves out. The listening address is the server's to set.
    pub fn http_config(&self) -> HttpConfig {
        let defaults = HttpConfig::default();
        let secs = Duration::from_secs;
        HttpConfig {
            public_url: self.public_url.clone(),
            listen_addr: None,
            authorization_servers: self.authorization_servers.clone(),
            allowed_hosts: if self.allowed_hosts.is_empty() {
                defaults.allowed_hosts.clone()
            } else {
                self.allowed_hosts.clone()
            },
            allowed_ports: self.allowed_ports.clone(),
            allowed_origins: self.allowed_origins.clone(),
            max_body_bytes: self.max_body_bytes.unwrap_or(defaults.max_body_bytes),
            request_timeout: self
                .request_timeout_secs
                .map_or(defaults.request_timeout, secs),
            mcp_sessions: McpSessionLimits {
                max_sessions: self
                    .max_sessions
                    .unwrap_or(defaults.mcp_sessions.max_sessions),
                max_sessions_per_agent: self
                    .max_sessions_per_agent
                    .unwrap_or(defaults.mcp_sessions.max_sessions_per_agent),
                idle_timeout: self
                    .session_idle_timeout_secs
                    .map_or(defaults.mcp_sessions.idle_timeout, secs),
            },
            listen: ListenLimits {
                max_streams_per_agent: self
                    .max_listen_streams_per_agent
                    .unwrap_or(defaults.listen.max_streams_per_agent),
                max_lifetime: self
                    .max_listen_lifetime_secs
                    .map_or(defaults.listen.max_lifetime, secs),
            },
            relay: defaults.relay.clone(),
        }
    }

    /// The serving loop's bounds: connections and the header-read and
    /// idle timeouts (defaults for what the section leaves out).
    pub fn serve_config(&self) -> ServeConfig {
        let defaults = ServeConfig::default();
        ServeConfig {
            max_connections: self.max_connections.unwrap_or(defaults.max_connections),
            header_read_timeout: self
                .header_read_timeout_secs
                .map_or(defaults.header_read_timeout, Duration::from_secs),
            idle_timeout: self
                .idle_timeout_secs
                .map_or(defaults.idle_timeout, Duration::from_secs),
            ..defaults
        }
    }

    /// `queue` with the section's leases applied.
    pub fn queue_config(&self, mut queue: QueueConfig) -> QueueConfig {
        if let Some(seconds) = self.lease_seconds {
            queue.lease_long_poll = Duration::from_secs(seconds);
        }
        if let Some(controls) = self.lease_interval_controls {
            queue.lease_interval_controls = controls;
        }
        queue
    }
}

/// Reads a TOML file and returns its token section (other sections ignored).
pub fn load_token_config(path: &Path) -> Result<TokenConfig, TokenConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_token_config(path, &text)
}

/// The tokens of a configuration file's text, read by the file's one
/// schema ([`ConfigFile`](ConfigFile)).
pub(crate) fn parse_token_config(path: &Path, text: &str) -> Result<TokenConfig, TokenConfigError> {
    match ConfigFile::parse(text) {
        Ok(file) => Ok(file.tokens()),
        Err(ConfigError::Parse { source, .. }) => Err(TokenConfigError::Parse {
            path: path.to_owned(),
            source,
        }),
        Err(other) => Err(TokenConfigError::Read {
            path: path.to_owned(),
            source: std::io::Error::other(other.to_string()),
        }),
    }
}
