//! OAuth2 resource-server side: who a bearer token belongs to.
//!
//! An [`Authenticator`] turns a token into a [`Principal`]: an agent (with
//! owner, projects and scopes) for `/mcp`, or a device (a relay) for the
//! relay API. The built-in [`TokenFile`](crate::token_file::TokenFile) reads a TOML file that stores only
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
//!
//! An authenticator sees the whole request head
//! ([`Authenticator::authenticate_request`]), so it is not bound to bearer
//! tokens: an API-key header, a client certificate forwarded by a proxy or
//! a session cookie work too. It also writes the 401 the server answers
//! with ([`Authenticator::challenge`]); the default is the RFC 6750 bearer
//! challenge pointing at the resource metadata.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use graph_relay_core::ids::{AgentId, DeviceId, InvalidId, OwnerId, ProjectId};
use graph_relay_core::mcp::Caller;
use graph_relay_core::principal::{Agent, Device};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Prefix of agent tokens.
pub const AGENT_TOKEN_PREFIX: &str = "gra_";
/// Prefix of device tokens.
pub const DEVICE_TOKEN_PREFIX: &str = "grd_";
/// Prefix of an operator token (`graph-relay status --server`; the
/// metrics listener's `/admin/status`).
pub const OPERATOR_TOKEN_PREFIX: &str = "gro_";

/// Who a token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// An MCP client: its agent identity and granted scopes.
    Agent(Caller),
    /// A relay (one desktop).
    Device(Device),
}

/// Who a request's credentials belong to, as established from its
/// headers before its body was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The agent or device.
    pub principal: Principal,
    /// SHA-256 ([`hash_token`]) of the credential, what revocation is
    /// checked against ([`Authenticator::still_valid`]); `None` for an
    /// anonymous caller, whose requests are never ended by a revocation.
    pub token_sha256: Option<String>,
}

/// Why a request's credentials were not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The request carries no credentials at all: 401 with the plain
    /// challenge (no `error` attribute).
    #[error("the request carries no credentials")]
    MissingCredentials,
    /// Credentials that are not of the expected form (e.g. an
    /// `Authorization` header that is not `Bearer <token>`): 401
    /// `invalid_request` with this description.
    #[error("malformed credentials: {0}")]
    MalformedCredentials(String),
    /// Unknown, revoked or malformed: answered with 401 `invalid_token`.
    #[error("the bearer token is unknown, revoked or malformed")]
    InvalidToken,
    /// An access token from the authorization server that does not pass
    /// its checks: 401 `invalid_token` whose `error_description` says why.
    #[error(transparent)]
    Refused(#[from] TokenRefusal),
    /// The authenticator could not decide (e.g. its backend is down): 503.
    #[error("the token could not be checked: {0}")]
    Unavailable(String),
}

/// Why a token from the authorization server was refused (401
/// `invalid_token`; the text is the `error_description`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not a JWS compact token with a known algorithm (this covers `alg: none`).
    #[error("the token is not a well-formed JWT signed with an algorithm this server accepts")]
    Malformed,
    /// A `typ` header other than the accepted access-token types.
    #[error(
        "the token's typ `{0}` is not an access token type this server accepts (RFC 9068 at+jwt)"
    )]
    TokenType(String),
    /// An algorithm that is not configured (e.g. HS256).
    #[error("the token is signed with {0}, which this server does not accept")]
    Algorithm(String),
    /// A `kid` the authorization server does not publish (any more).
    #[error("the token is signed with a key the authorization server does not publish")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still ahead.
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// `iat` is ahead.
    #[error("the token was issued in the future (iat)")]
    IssuedInFuture,
    /// `iss` names another authorization server.
    #[error("the token was issued by another authorization server (iss)")]
    Issuer,
    /// `aud` does not name this resource.
    #[error("the token is not meant for this resource (aud must include {0})")]
    Audience(String),
    /// A required claim is missing.
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    /// A claim whose value cannot be used.
    #[error("the token's `{claim}` claim {rule}")]
    BadClaim {
        /// The claim.
        claim: String,
        /// What is wrong with it.
        rule: String,
    },
    /// No owner could be found for the agent.
    #[error("the token's agent has no owner on this server")]
    NoOwner,
    /// Introspection says the token is not active.
    #[error("the authorization server says the token is not active")]
    Inactive,
}

/// Turns the credentials of a request into a principal. Implement it to
/// plug in another identity source (token introspection, JWT validation, a
/// database, an API-key header).
///
/// A bearer-token source implements [`Authenticator::authenticate`] only;
/// the default [`Authenticator::authenticate_request`] reads
/// `Authorization: Bearer <token>` and calls it. A source with other
/// credentials overrides `authenticate_request` (and usually
/// [`Authenticator::challenge`], to tell clients what to send).
///
/// ```
/// use axum::http::HeaderMap;
/// use graph_relay_core::ids::{DeviceId, OwnerId};
/// use graph_relay_core::principal::Device;
/// use graph_relay_transport_http::auth::{
///     AuthError, Authenticated, Authenticator, Principal, hash_token,
/// };
///
/// /// One device, known by the key in `X-Device-Key`.
/// struct DeviceKey(String);
///
/// #[async_trait::async_trait]
/// impl Authenticator for DeviceKey {
///     async fn authenticate(&self, _token: &str) -> Result<Principal, AuthError> {
///         Err(AuthError::InvalidToken) // no bearer tokens here
///     }
///
///     async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
///         let key = headers.get("x-device-key").ok_or(AuthError::MissingCredentials)?;
///         if key.as_bytes() != self.0.as_bytes() {
///             return Err(AuthError::InvalidToken);
///         }
///         let device = Device::new(
///             DeviceId::parse("desktop").map_err(|e| AuthError::Unavailable(e.to_string()))?,
///             OwnerId::parse("alice").map_err(|e| AuthError::Unavailable(e.to_string()))?,
///         );
///         Ok(Authenticated {
///             principal: Principal::Device(device),
///             token_sha256: Some(hash_token(&self.0)),
///         })
///     }
/// }
/// ```
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

    /// Who the request with these headers comes from. Called before the
    /// body is read, on every authenticated route.
    ///
    /// The default reads `Authorization: Bearer <token>`: no header at all
    /// is [`Authenticator::anonymous`] or [`AuthError::MissingCredentials`],
    /// a header of another form is [`AuthError::MalformedCredentials`], and
    /// a token is passed to [`Authenticator::authenticate`] (its hash kept
    /// for revocation).
    async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        match bearer_token(headers)? {
            None => without_credentials(self).await,
            Some(token) => Ok(Authenticated {
                principal: self.authenticate(token).await?,
                token_sha256: Some(hash_token(token)),
            }),
        }
    }

    /// The 401 answer to a refused request (missing, malformed, unknown or
    /// revoked credentials; a device's credentials on `/mcp`). The default
    /// is [`Challenge::bearer_response`]: `WWW-Authenticate: Bearer
    /// resource_metadata="…"` with the OAuth `error` and
    /// `error_description`, and a JSON body `{error, error_description}`.
    /// The transport adds `Connection: close`.
    fn challenge(&self, challenge: &Challenge<'_>) -> Response {
        challenge.bearer_response()
    }

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

/// Why a request is answered with 401: what [`Authenticator::challenge`]
/// renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge<'a> {
    /// The URL of the resource metadata (RFC 9728) of this server.
    pub resource_metadata: &'a str,
    /// The OAuth error code (`invalid_token`, `invalid_request`); `None`
    /// when the request carried no credentials at all.
    pub error: Option<&'a str>,
    /// A short reason, for the `error_description` attribute of the
    /// challenge (visible ASCII, no quotes or backslashes); `None` with
    /// `error`.
    pub description: Option<&'a str>,
    /// The reason in a sentence, for the response body.
    pub message: &'a str,
}

impl Challenge<'_> {
    /// The RFC 6750 challenge: `Bearer resource_metadata="…"`, then
    /// `error="…", error_description="…"` when there is an error.
    ///
    /// ```
    /// use graph_relay_transport_http::auth::Challenge;
    ///
    /// let challenge = Challenge {
    ///     resource_metadata: "https://relay.example.com/.well-known/oauth-protected-resource/mcp",
    ///     error: Some("invalid_token"),
    ///     description: Some("the token was revoked"),
    ///     message: "the token was revoked",
    /// };
    /// assert_eq!(
    ///     challenge.bearer(),
    ///     "Bearer resource_metadata=\"https://relay.example.com/.well-known/oauth-protected-resource/mcp\", \
    ///      error=\"invalid_token\", error_description=\"the token was revoked\""
    /// );
    /// ```
    pub fn bearer(&self) -> String {
        let mut value = format!("Bearer resource_metadata=\"{}\"", self.resource_metadata);
        if let Some(error) = self.error {
            value.push_str(&format!(", error=\"{error}\""));
            if let Some(description) = self.description {
                value.push_str(&format!(", error_description=\"{description}\""));
            }
        }
        value
    }

    /// 401 with [`Challenge::bearer`] as `WWW-Authenticate` and the JSON
    /// body `{"error": …, "error_description": message}` (`error` is
    /// `unauthorized` when there is none).
    pub fn bearer_response(&self) -> Response {
        self.response(&self.bearer())
    }

    /// 401 with `www_authenticate` as `WWW-Authenticate` (left out if it
    /// is not a valid header value) and the JSON body of
    /// [`Challenge::bearer_response`]: for an authenticator with its own
    /// scheme.
    pub fn response(&self, www_authenticate: &str) -> Response {
        let body = serde_json::json!({
            "error": self.error.unwrap_or("unauthorized"),
            "error_description": self.message,
        });
        let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
        if let Ok(v) = HeaderValue::from_str(www_authenticate) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        response
    }
}

/// The token of `Authorization: Bearer <token>`: `Ok(None)` without the
/// header, [`AuthError::MalformedCredentials`] when it is of another form
/// or the token is empty or not visible ASCII.
///
/// ```
/// use axum::http::{HeaderMap, HeaderValue, header};
/// use graph_relay_transport_http::auth::bearer_token;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(bearer_token(&headers), Ok(None));
/// headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer gra_abc"));
/// assert_eq!(bearer_token(&headers), Ok(Some("gra_abc")));
/// headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic YTpi"));
/// assert!(bearer_token(&headers).is_err());
/// ```
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .map(Some)
        .ok_or_else(|| {
            AuthError::MalformedCredentials(
                "the Authorization header must be `Bearer <token>`".into(),
            )
        })
}

/// Lowercase hex SHA-256 of a token: what the token file stores.
pub fn hash_token(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(token.as_bytes());
    // Every request hashes its token: two table look-ups a byte, not a
    // `format!` (an allocation and the formatting machinery) each.
    let mut hex = String::with_capacity(digest.len() * 2);
    for b in digest {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    hex
}

/// Which kind of principal a new token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An agent token (`gra_…`).
    Agent,
    /// A device token (`grd_…`).
    Device,
    /// An operator token (`gro_…`): reads the status on the metrics listener.
    Operator,
}

/// A fresh random token (244 bits from the OS generator) with its kind's prefix.
pub fn new_token(kind: TokenKind) -> String {
    let prefix = match kind {
        TokenKind::Agent => AGENT_TOKEN_PREFIX,
        TokenKind::Device => DEVICE_TOKEN_PREFIX,
        TokenKind::Operator => OPERATOR_TOKEN_PREFIX,
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

/// A request with no `Authorization` header: the authenticator's anonymous
/// principal, if it has one, or [`AuthError::MissingCredentials`].
async fn without_credentials<A: Authenticator + ?Sized>(
    authenticator: &A,
) -> Result<Authenticated, AuthError> {
    match authenticator.anonymous().await {
        Some(principal) => Ok(Authenticated {
            principal,
            token_sha256: None,
        }),
        None => Err(AuthError::MissingCredentials),
    }
}

/// [`Authenticator::authenticate_request`] of an authenticator that keeps
/// its tokens by hash: the same answers as the default, with the token
/// hashed once (for the look-up and for revocation alike).
pub(crate) async fn authenticate_by_hash<A: Authenticator + ?Sized>(
    authenticator: &A,
    headers: &HeaderMap,
    lookup: impl FnOnce(&str) -> Result<Option<Principal>, AuthError>,
) -> Result<Authenticated, AuthError> {
    match bearer_token(headers)? {
        None => without_credentials(authenticator).await,
        Some(token) => {
            let token_sha256 = hash_token(token);
            let principal = lookup(&token_sha256)?.ok_or(AuthError::InvalidToken)?;
            Ok(Authenticated {
                principal,
                token_sha256: Some(token_sha256),
            })
        }
    }
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

    async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        authenticate_by_hash(self, headers, |hash| Ok(self.by_hash.get(hash).cloned())).await
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        self.by_hash.get(token_sha256) == Some(principal)
    }
}

/// An authenticator that serves requests carrying no credentials at all
/// as one agent, and hands everything else to `inner`. For development
/// servers on a loopback address only (the [`Server`](crate::Server)
/// builder refuses it anywhere else): whoever can reach the port acts as
/// that agent.
pub struct AnonymousFallback {
    inner: Arc<dyn Authenticator>,
    caller: Caller,
}

impl std::fmt::Debug for AnonymousFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnonymousFallback")
            .field("agent", &self.caller.agent.id)
            .finish_non_exhaustive()
    }
}

impl AnonymousFallback {
    /// `inner`, with requests without credentials served as `caller`.
    pub fn new(inner: Arc<dyn Authenticator>, caller: Caller) -> Self {
        Self { inner, caller }
    }
}

#[async_trait]
impl Authenticator for AnonymousFallback {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.inner.authenticate(token).await
    }
    async fn anonymous(&self) -> Option<Principal> {
        Some(Principal::Agent(self.caller.clone()))
    }
    fn revocations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.revocations()
    }
    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        self.inner.still_valid(token_sha256, principal).await
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
            "[server]\nmax_connections = 10\n[[agent]]\nname = \"a\"\nowner = \"o\"\nprojects = [\"p\"]\nscopes = [\"s\"]\ntoken_sha256 = \"{}\"\n[[agent]]\nname = \"r\"\nowner = \"o\"\ntoken_sha256 = \"{}\"\nrevoked = true\n[[device]]\nname = \"d\"\nowner = \"o\"\ntoken_sha256 = \"{}\"\n",
            hash_token("t1"),
            hash_token("t2"),
            hash_token("t3")
        );
        let config =
            crate::config::parse_token_config(std::path::Path::new("x.toml"), &text).unwrap();
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
