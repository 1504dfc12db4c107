//! OAuth2 resource-server side: who a bearer token belongs to.
//!
//! An [`Authenticator`] turns a token into a [`Principal`]: an agent (with
//! owner, projects and scopes) for `/mcp`, or a device (a relay) for the
//! relay API. The built-in [`TokenFile`] reads a TOML file that stores only
//! SHA-256 hashes of tokens; a token is shown once, when it is created.
//!
//! ```toml
//! [[agent]]
//! name = "assistant"
//! owner = "alice"
//! projects = ["research"]
//! scopes = ["osfoundry:read", "osfoundry:run"]
//! token_sha256 = "…64 hex digits…"
//!
//! [[device]]
//! name = "desktop"
//! owner = "alice"
//! token_sha256 = "…"
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use graph_relay_core::ids::{AgentId, DeviceId, InvalidId, OwnerId, ProjectId};
use graph_relay_core::mcp::Caller;
use graph_relay_core::principal::{Agent, Device};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Prefix of agent tokens.
pub const AGENT_TOKEN_PREFIX: &str = "gra_";
/// Prefix of device tokens.
pub const DEVICE_TOKEN_PREFIX: &str = "grd_";

/// Who a token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// An MCP client: its agent identity and granted scopes.
    Agent(Caller),
    /// A relay (one desktop).
    Device(Device),
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Unknown, revoked or malformed: answered with 401 `invalid_token`.
    #[error("the bearer token is unknown, revoked or malformed")]
    InvalidToken,
    /// An access token from the authorization server that does not pass
    /// its checks: 401 `invalid_token` whose `error_description` says why.
    #[error(transparent)]
    Refused(#[from] crate::oauth::TokenRefusal),
    /// The authenticator could not decide (e.g. its backend is down): 503.
    #[error("the token could not be checked: {0}")]
    Unavailable(String),
}

/// Turns bearer tokens into principals. Implement it to plug in another
/// identity source (token introspection, JWT validation, a database).
///
/// # Revocation
/// A request is authenticated once, but a `subscriptions/listen` stream, a
/// held `wait_seconds` call and an initialize-era session outlive that
/// moment. The transport ends them when the token stops being valid: it
/// waits on [`Authenticator::revocations`] and, whenever that changes, asks
/// [`Authenticator::still_valid`] about each token it holds (by hash). An
/// authenticator that keeps the defaults never revokes anything in flight;
/// new requests are still refused by [`Authenticator::authenticate`].
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// The principal `token` (without the `Bearer ` prefix) belongs to.
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError>;

    /// The principal of a request that carries no `Authorization` header at
    /// all; `None` (the default) answers it with 401. Only for local
    /// development set-ups such as the MCP conformance suite.
    async fn anonymous(&self) -> Option<Principal> {
        None
    }

    /// A signal that changes whenever tokens may have been revoked, removed
    /// or changed (e.g. the token file was reloaded); `None` (the default)
    /// when that never happens.
    fn revocations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Whether the token whose SHA-256 ([`hash_token`]) is `token_sha256`
    /// still authenticates as exactly `principal` (same identity, same
    /// scopes). The default, for authenticators that cannot tell, is `true`.
    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        let _ = (token_sha256, principal);
        true
    }
}

/// Lowercase hex SHA-256 of a token: what the token file stores.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Which kind of principal a new token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An agent token (`gra_…`).
    Agent,
    /// A device token (`grd_…`).
    Device,
}

/// A fresh random token (244 bits from the OS generator) with its kind's prefix.
pub fn new_token(kind: TokenKind) -> String {
    let prefix = match kind {
        TokenKind::Agent => AGENT_TOKEN_PREFIX,
        TokenKind::Device => DEVICE_TOKEN_PREFIX,
    };
    format!(
        "{prefix}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// One agent token in the token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentToken {
    /// The agent identity runs are filed under.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// The owner's projects the agent is connected to.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Granted scopes.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// SHA-256 of the token, lowercase hex.
    pub token_sha256: String,
    /// A revoked token is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// One device token in the token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceToken {
    /// The device id.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// SHA-256 of the token, lowercase hex.
    pub token_sha256: String,
    /// A revoked token is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// The tokens section of a configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenConfig {
    /// Agent tokens.
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentToken>,
    /// Device tokens.
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceToken>,
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// An id in an entry breaks its rule.
    #[error("token entry `{name}`: {source}")]
    InvalidId {
        /// The entry.
        name: String,
        /// The rule.
        source: InvalidId,
    },
    /// A hash is not 64 lowercase hex digits.
    #[error("token entry `{0}`: token_sha256 must be 64 lowercase hexadecimal digits")]
    InvalidHash(String),
}

impl TokenConfig {
    /// The agent and device principals by token hash (revoked ones left out).
    pub fn principals(&self) -> Result<HashMap<String, Principal>, TokenConfigError> {
        let mut map = HashMap::new();
        let bad_id = |name: &str| {
            let name = name.to_owned();
            move |source| TokenConfigError::InvalidId { name, source }
        };
        let check_hash = |name: &str, hash: &str| {
            if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                Ok(())
            } else {
                Err(TokenConfigError::InvalidHash(name.to_owned()))
            }
        };
        for a in &self.agents {
            check_hash(&a.name, &a.token_sha256)?;
            let projects = a
                .projects
                .iter()
                .map(|p| ProjectId::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad_id(&a.name))?;
            let agent = Agent::new(
                AgentId::parse(&a.name).map_err(bad_id(&a.name))?,
                OwnerId::parse(&a.owner).map_err(bad_id(&a.name))?,
                projects,
            );
            if !a.revoked {
                map.insert(
                    a.token_sha256.clone(),
                    Principal::Agent(Caller::new(agent, a.scopes.iter().cloned())),
                );
            }
        }
        for d in &self.devices {
            check_hash(&d.name, &d.token_sha256)?;
            let device = Device::new(
                DeviceId::parse(&d.name).map_err(bad_id(&d.name))?,
                OwnerId::parse(&d.owner).map_err(bad_id(&d.name))?,
            );
            if !d.revoked {
                map.insert(d.token_sha256.clone(), Principal::Device(device));
            }
        }
        Ok(map)
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

fn parse_token_config(path: &Path, text: &str) -> Result<TokenConfig, TokenConfigError> {
    #[derive(Deserialize)]
    struct Tokens {
        #[serde(default, rename = "agent")]
        agents: Vec<AgentToken>,
        #[serde(default, rename = "device")]
        devices: Vec<DeviceToken>,
    }
    let tokens: Tokens = toml::from_str(text).map_err(|source| TokenConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })?;
    Ok(TokenConfig {
        agents: tokens.agents,
        devices: tokens.devices,
    })
}

/// Tokens held in memory, by hash.
#[derive(Debug, Default)]
pub struct StaticTokens {
    by_hash: HashMap<String, Principal>,
}

impl StaticTokens {
    /// From a token config.
    pub fn new(config: &TokenConfig) -> Result<Self, TokenConfigError> {
        Ok(Self {
            by_hash: config.principals()?,
        })
    }
}

#[async_trait]
impl Authenticator for StaticTokens {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.by_hash
            .get(&hash_token(token))
            .cloned()
            .ok_or(AuthError::InvalidToken)
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        self.by_hash.get(token_sha256) == Some(principal)
    }
}

/// The built-in authenticator: a TOML token file, watched for changes.
///
/// A background thread looks at the file every [`TokenFile::RECHECK`] and
/// reloads it when its modification time, size or inode changed, so
/// `token revoke` takes effect on a running server at once: new requests
/// are refused, and [`Authenticator::revocations`] fires so that streams,
/// held calls and sessions of a revoked token end (within about a second).
/// A file that changed but cannot be used is reported and the previous
/// tokens are kept. The thread ends with the last clone of the value.
#[derive(Debug)]
pub struct TokenFile {
    shared: Arc<TokenFileShared>,
}

#[derive(Debug)]
struct TokenFileShared {
    path: PathBuf,
    tokens: RwLock<HashMap<String, Principal>>,
    /// What the file looked like when last read.
    seen: Mutex<Option<FileStamp>>,
    /// Bumped on every reload.
    generation: tokio::sync::watch::Sender<u64>,
}

/// Modification time, size and (on Unix) inode: a rename or a rewrite changes one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some(Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode,
        })
    }
}

impl TokenFile {
    /// How often the watcher thread looks at the file.
    pub const RECHECK: Duration = Duration::from_millis(250);

    /// Loads `path` and starts watching it.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, TokenConfigError> {
        let path = path.into();
        let stamp = FileStamp::of(&path);
        let tokens = load_token_config(&path)?.principals()?;
        let shared = Arc::new(TokenFileShared {
            path,
            tokens: RwLock::new(tokens),
            seen: Mutex::new(stamp),
            generation: tokio::sync::watch::Sender::new(0),
        });
        let weak = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("graph-relay-tokens".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Self::RECHECK);
                    let Some(shared) = weak.upgrade() else {
                        return;
                    };
                    shared.refresh();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot watch the token file; changes are read on the next request");
        }
        Ok(Self { shared })
    }

    /// How many times the file was reloaded since it was opened.
    pub fn reloads(&self) -> u64 {
        *self.shared.generation.borrow()
    }
}

impl TokenFileShared {
    /// Reloads the file if it changed since it was last read.
    fn refresh(&self) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let stamp = FileStamp::of(&self.path);
        if stamp == *seen {
            return;
        }
        *seen = stamp;
        match load_token_config(&self.path).and_then(|c| c.principals()) {
            Ok(tokens) => {
                if let Ok(mut current) = self.tokens.write() {
                    *current = tokens;
                }
                self.generation.send_modify(|g| *g += 1);
                tracing::info!(path = %self.path.display(), "token file reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "token file changed but cannot be used; keeping the previous tokens")
            }
        }
    }

    fn lookup(&self, token_sha256: &str) -> Result<Option<Principal>, AuthError> {
        let tokens = self
            .tokens
            .read()
            .map_err(|_| AuthError::Unavailable("token table poisoned".into()))?;
        Ok(tokens.get(token_sha256).cloned())
    }
}

#[async_trait]
impl Authenticator for TokenFile {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.shared
            .lookup(&hash_token(token))?
            .ok_or(AuthError::InvalidToken)
    }

    fn revocations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.shared.generation.subscribe())
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        // A poisoned table cannot say; keep what is open.
        self.shared
            .tokens
            .read()
            .map_or(true, |tokens| tokens.get(token_sha256) == Some(principal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_and_hashed() {
        let a = new_token(TokenKind::Agent);
        let b = new_token(TokenKind::Agent);
        assert!(a.starts_with("gra_") && a.len() == 68);
        assert_ne!(a, b);
        assert!(new_token(TokenKind::Device).starts_with("grd_"));
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn config_parses_and_skips_revoked() {
        let text = format!(
            "[server]\nlisten = \"x\"\n[[agent]]\nname = \"a\"\nowner = \"o\"\nprojects = [\"p\"]\nscopes = [\"s\"]\ntoken_sha256 = \"{}\"\n[[agent]]\nname = \"r\"\nowner = \"o\"\ntoken_sha256 = \"{}\"\nrevoked = true\n[[device]]\nname = \"d\"\nowner = \"o\"\ntoken_sha256 = \"{}\"\n",
            hash_token("t1"),
            hash_token("t2"),
            hash_token("t3")
        );
        let config = parse_token_config(Path::new("x.toml"), &text).unwrap();
        let map = config.principals().unwrap();
        assert_eq!(map.len(), 2);
        assert!(
            matches!(map.get(&hash_token("t1")), Some(Principal::Agent(c)) if c.scopes.contains("s"))
        );
        assert!(matches!(
            map.get(&hash_token("t3")),
            Some(Principal::Device(_))
        ));
        let bad = TokenConfig {
            agents: vec![AgentToken {
                name: "a".into(),
                owner: "o".into(),
                projects: vec![],
                scopes: vec![],
                token_sha256: "plain-token".into(),
                revoked: false,
            }],
            devices: vec![],
        };
        assert!(matches!(
            bad.principals(),
            Err(TokenConfigError::InvalidHash(_))
        ));
    }
}
