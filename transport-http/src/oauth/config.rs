//! The `[oauth]` settings, as written in `graph-relay.toml`, and their
//! checked form.

use std::collections::HashMap;
use std::time::Duration;

use graph_relay_core::ids::{InvalidId, OwnerId, ProjectId};
use jsonwebtoken::Algorithm;
use serde::{Deserialize, Serialize};

/// Default of [`OAuthConfig::algorithms`].
pub const DEFAULT_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];
/// Default of [`OAuthConfig::clock_skew_seconds`].
pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 60;
/// Default of [`OAuthConfig::token_types`]: RFC 9068's `typ`.
pub const DEFAULT_TOKEN_TYPES: [&str; 2] = ["at+jwt", "application/at+jwt"];
/// Default of [`OAuthConfig::jwks_cache_seconds`]: keys whose response
/// gives them no lifetime (no `Cache-Control: max-age`, `max-age=0`,
/// `no-cache`, `no-store`) are kept five minutes.
pub const DEFAULT_JWKS_CACHE_SECONDS: u64 = 300;
/// Default of [`OAuthConfig::jwks_refetch_min_seconds`].
pub const DEFAULT_JWKS_REFETCH_MIN_SECONDS: u64 = 10;
/// Default of [`OAuthConfig::http_timeout_seconds`].
pub const DEFAULT_HTTP_TIMEOUT_SECONDS: u64 = 10;
/// Longest time keys are kept, whatever `Cache-Control` says (one day).
pub const MAX_JWKS_CACHE: Duration = Duration::from_secs(86_400);

/// Validation of OAuth 2.1 access tokens issued by an external
/// authorization server: the `[oauth]` section of `graph-relay.toml`.
///
/// ```toml
/// [oauth]
/// issuer = "https://auth.example.com"
/// # jwks_uri = "https://auth.example.com/jwks"   # else discovered
/// # audience = "https://relay.example.com/mcp"   # default: our /mcp URL
/// agent_claim = "sub"                            # or "client_id"
/// owner = "alice"                                # or owner_claim = "…"
/// projects = ["default"]                         # or projects_claim = "…"
///
/// [[oauth.subject]]                              # per-subject overrides
/// subject = "assistant"
/// owner = "alice"
/// projects = ["research"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier; tokens must carry it
    /// in `iss`, and its metadata is discovered from it (RFC 8414, then
    /// OpenID discovery) unless `jwks_uri` is given.
    pub issuer: String,
    /// The JWKS URL; skips discovery (introspection then needs its
    /// `endpoint` spelled out too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// Accepted signature algorithms, among `RS256`, `ES256` and `EdDSA`
    /// (default: all three). `none` and HMAC are refused.
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// The audience tokens must name in `aud` (RFC 8707); default: the
    /// resource URL of `/mcp` (`public_url` + `/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Allowed clock difference for `exp`, `nbf` and `iat` (default 60 s).
    #[serde(default = "default_skew")]
    pub clock_skew_seconds: u64,
    /// Accepted JWT `typ` headers, compared without case (default
    /// `at+jwt` and `application/at+jwt`, RFC 9068). An empty list accepts
    /// any (e.g. Keycloak's `JWT`).
    #[serde(default = "default_token_types")]
    pub token_types: Vec<String>,
    /// The claim that names the agent: `sub` (default; `client_id` when a
    /// token has no `sub`) or `client_id`.
    #[serde(default = "default_agent_claim")]
    pub agent_claim: String,
    /// A claim naming the owner; without it (or when a token lacks it) the
    /// subject table and then `owner` decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_claim: Option<String>,
    /// The owner of agents that neither the subject table nor the owner
    /// claim places; without it such a token is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A claim listing the agent's projects (an array of strings, or one
    /// space-separated string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects_claim: Option<String>,
    /// Projects of agents that neither the subject table nor the projects
    /// claim places (default: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// Seconds keys are kept when the JWKS response gives them no
    /// lifetime: no `Cache-Control: max-age`, `max-age=0`, or `no-cache` /
    /// `no-store` without a `max-age` (as Keycloak serves it). Default
    /// 300; at most one day. A token with an unknown `kid` still causes a
    /// refetch in between, at most once per `jwks_refetch_min_seconds`.
    #[serde(default = "default_jwks_cache")]
    pub jwks_cache_seconds: u64,
    /// Shortest time between two JWKS fetches caused by tokens with an
    /// unknown `kid` (default 10 s).
    #[serde(default = "default_refetch_min")]
    pub jwks_refetch_min_seconds: u64,
    /// Timeout of each request to the authorization server (default 10 s).
    #[serde(default = "default_http_timeout")]
    pub http_timeout_seconds: u64,
    /// Per-subject owner and projects, by the value of `agent_claim`.
    #[serde(default, rename = "subject", skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<SubjectEntry>,
    /// Opaque tokens through token introspection (RFC 7662); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introspection: Option<IntrospectionConfig>,
}

/// One `[[oauth.subject]]`: where an agent named by the token belongs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectEntry {
    /// The value of the agent claim.
    pub subject: String,
    /// Its owner.
    pub owner: String,
    /// Its projects (replacing the claim and the default).
    #[serde(default)]
    pub projects: Vec<String>,
}

/// `[oauth.introspection]`: opaque tokens checked at the authorization
/// server, which this server calls as a confidential client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntrospectionConfig {
    /// The introspection endpoint; default: `introspection_endpoint` from
    /// the discovered metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// This server's client id at the authorization server.
    pub client_id: String,
    /// Its secret (HTTP Basic authentication, RFC 6749 §2.3.1).
    pub client_secret: String,
    /// Longest time an *active* answer is remembered, in seconds. Without
    /// it an active answer is remembered until the token's `exp` (plus
    /// `clock_skew_seconds`), so a token revoked at the authorization
    /// server keeps working here until then; with it, a revocation takes
    /// effect within this many seconds, at the cost of one introspection
    /// per token per interval. An answer without `exp` is remembered
    /// [`DEFAULT_INACTIVE_CACHE_SECONDS`] at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_cache_seconds: Option<u64>,
    /// How long an *inactive* answer (or a refused token) is remembered, in
    /// seconds (default 60): a token that becomes valid later, or a mistyped
    /// one, is asked about again after this.
    #[serde(
        default = "default_inactive_cache",
        skip_serializing_if = "is_default_inactive_cache"
    )]
    pub inactive_cache_seconds: u64,
}

/// Default of [`IntrospectionConfig::inactive_cache_seconds`].
pub const DEFAULT_INACTIVE_CACHE_SECONDS: u64 = 60;
/// Most seconds either introspection cache setting may say (one day).
pub const MAX_INTROSPECTION_CACHE_SECONDS: u64 = 86_400;

fn default_inactive_cache() -> u64 {
    DEFAULT_INACTIVE_CACHE_SECONDS
}
fn is_default_inactive_cache(seconds: &u64) -> bool {
    *seconds == DEFAULT_INACTIVE_CACHE_SECONDS
}

impl IntrospectionConfig {
    /// Introspection as the client `client_id` with `client_secret`, at the
    /// endpoint the authorization server's metadata names, with the default
    /// cache lengths.
    pub fn new(client_id: impl Into<String>, client_secret: impl Into<String>) -> Self {
        Self {
            endpoint: None,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            active_cache_seconds: None,
            inactive_cache_seconds: DEFAULT_INACTIVE_CACHE_SECONDS,
        }
    }
}

fn default_algorithms() -> Vec<String> {
    DEFAULT_ALGORITHMS.iter().map(|a| (*a).to_owned()).collect()
}
fn default_skew() -> u64 {
    DEFAULT_CLOCK_SKEW_SECONDS
}
fn default_token_types() -> Vec<String> {
    DEFAULT_TOKEN_TYPES
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
}
fn default_agent_claim() -> String {
    "sub".to_owned()
}
fn default_jwks_cache() -> u64 {
    DEFAULT_JWKS_CACHE_SECONDS
}
fn default_refetch_min() -> u64 {
    DEFAULT_JWKS_REFETCH_MIN_SECONDS
}
fn default_http_timeout() -> u64 {
    DEFAULT_HTTP_TIMEOUT_SECONDS
}

impl OAuthConfig {
    /// A configuration for `issuer` with every default.
    pub fn new(issuer: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            jwks_uri: None,
            algorithms: default_algorithms(),
            audience: None,
            clock_skew_seconds: DEFAULT_CLOCK_SKEW_SECONDS,
            token_types: default_token_types(),
            agent_claim: default_agent_claim(),
            owner_claim: None,
            owner: None,
            projects_claim: None,
            projects: Vec::new(),
            jwks_cache_seconds: DEFAULT_JWKS_CACHE_SECONDS,
            jwks_refetch_min_seconds: DEFAULT_JWKS_REFETCH_MIN_SECONDS,
            http_timeout_seconds: DEFAULT_HTTP_TIMEOUT_SECONDS,
            subjects: Vec::new(),
            introspection: None,
        }
    }

    /// Checks the settings without starting anything (algorithms, URLs,
    /// claim names, owners and projects).
    pub fn validate(&self) -> Result<(), OAuthConfigError> {
        Settings::new(self, "http://localhost/mcp").map(|_| ())
    }
}

/// An `[oauth]` section that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthConfigError {
    /// An algorithm that is not RS256, ES256 or EdDSA.
    #[error(
        "[oauth] algorithms: `{0}` is not accepted (only RS256, ES256 and EdDSA; never `none` or HMAC)"
    )]
    Algorithm(String),
    /// No algorithm at all.
    #[error("[oauth] algorithms must name at least one of RS256, ES256, EdDSA")]
    NoAlgorithm,
    /// A URL that is not `http(s)://…`.
    #[error("[oauth] {field} must be an http or https URL, not `{value}`")]
    Url {
        /// The setting.
        field: &'static str,
        /// What it says.
        value: String,
    },
    /// `agent_claim` is neither `sub` nor `client_id`.
    #[error("[oauth] agent_claim must be `sub` or `client_id`, not `{0}`")]
    AgentClaim(String),
    /// An owner or project breaks its identifier rule.
    #[error("[oauth] {place}: {source}")]
    InvalidId {
        /// Which setting.
        place: String,
        /// The rule.
        source: InvalidId,
    },
    /// Two `[[oauth.subject]]` entries for one subject.
    #[error("[oauth] subject `{0}` is listed twice")]
    DuplicateSubject(String),
    /// An introspection cache length past [`MAX_INTROSPECTION_CACHE_SECONDS`].
    #[error("[oauth.introspection] {0} must be at most {MAX_INTROSPECTION_CACHE_SECONDS} seconds")]
    CacheLength(&'static str),
}

/// Where an agent named by a token belongs, from the subject table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) owner: OwnerId,
    pub(crate) projects: Vec<ProjectId>,
}

/// [`OAuthConfig`], checked and parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) issuer: String,
    pub(crate) jwks_uri: Option<String>,
    pub(crate) algorithms: Vec<Algorithm>,
    pub(crate) audience: String,
    pub(crate) skew: u64,
    pub(crate) token_types: Vec<String>,
    pub(crate) agent_claim: String,
    pub(crate) owner_claim: Option<String>,
    pub(crate) owner: Option<OwnerId>,
    pub(crate) projects_claim: Option<String>,
    pub(crate) projects: Vec<ProjectId>,
    pub(crate) subjects: HashMap<String, Placement>,
    pub(crate) jwks_cache: Duration,
    pub(crate) refetch_min: Duration,
    pub(crate) http_timeout: Duration,
    pub(crate) introspection: Option<IntrospectionConfig>,
}

fn check_url(field: &'static str, value: &str) -> Result<(), OAuthConfigError> {
    let ok = ["http://", "https://"].iter().any(|scheme| {
        value
            .get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
            && value.len() > scheme.len()
    });
    if ok {
        Ok(())
    } else {
        Err(OAuthConfigError::Url {
            field,
            value: value.to_owned(),
        })
    }
}

/// The URLs are http(s) URLs, and the introspection caches no longer than
/// [`MAX_INTROSPECTION_CACHE_SECONDS`].
fn check_endpoints(config: &OAuthConfig) -> Result<(), OAuthConfigError> {
    check_url("issuer", &config.issuer)?;
    if let Some(uri) = &config.jwks_uri {
        check_url("jwks_uri", uri)?;
    }
    if let Some(endpoint) = config
        .introspection
        .as_ref()
        .and_then(|i| i.endpoint.as_ref())
    {
        check_url("introspection.endpoint", endpoint)?;
    }
    if let Some(introspection) = &config.introspection {
        if introspection
            .active_cache_seconds
            .is_some_and(|s| s > MAX_INTROSPECTION_CACHE_SECONDS)
        {
            return Err(OAuthConfigError::CacheLength("active_cache_seconds"));
        }
        if introspection.inactive_cache_seconds > MAX_INTROSPECTION_CACHE_SECONDS {
            return Err(OAuthConfigError::CacheLength("inactive_cache_seconds"));
        }
    }
    Ok(())
}

/// The signature algorithms named, each once: asymmetric ones only, and at
/// least one.
fn algorithms(names: &[String]) -> Result<Vec<Algorithm>, OAuthConfigError> {
    let mut algorithms = Vec::new();
    for name in names {
        let alg = match name.as_str() {
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            "EdDSA" => Algorithm::EdDSA,
            other => return Err(OAuthConfigError::Algorithm(other.to_owned())),
        };
        if !algorithms.contains(&alg) {
            algorithms.push(alg);
        }
    }
    if algorithms.is_empty() {
        return Err(OAuthConfigError::NoAlgorithm);
    }
    Ok(algorithms)
}

/// Where each listed subject is placed (its owner and projects); a subject
/// listed twice is refused.
fn subjects(entries: &[SubjectEntry]) -> Result<HashMap<String, Placement>, OAuthConfigError> {
    let mut subjects = HashMap::new();
    for entry in entries {
        let place = format!("subject `{}`", entry.subject);
        let placement = Placement {
            owner: OwnerId::parse(&entry.owner).map_err(invalid_id(place.clone()))?,
            projects: entry
                .projects
                .iter()
                .map(|p| ProjectId::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(invalid_id(place))?,
        };
        if subjects.insert(entry.subject.clone(), placement).is_some() {
            return Err(OAuthConfigError::DuplicateSubject(entry.subject.clone()));
        }
    }
    Ok(subjects)
}

/// The error of an invalid id in the setting at `place`.
fn invalid_id(place: String) -> impl FnOnce(InvalidId) -> OAuthConfigError {
    move |source| OAuthConfigError::InvalidId { place, source }
}

impl Settings {
    /// Checks `config`; `resource` is the audience used when it names none.
    pub(crate) fn new(config: &OAuthConfig, resource: &str) -> Result<Self, OAuthConfigError> {
        check_endpoints(config)?;
        let algorithms = algorithms(&config.algorithms)?;
        if !matches!(config.agent_claim.as_str(), "sub" | "client_id") {
            return Err(OAuthConfigError::AgentClaim(config.agent_claim.clone()));
        }
        let owner = config
            .owner
            .as_deref()
            .map(OwnerId::parse)
            .transpose()
            .map_err(invalid_id("owner".into()))?;
        let projects = config
            .projects
            .iter()
            .map(|p| ProjectId::parse(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid_id("projects".into()))?;
        let subjects = subjects(&config.subjects)?;
        let audience = config
            .audience
            .clone()
            .unwrap_or_else(|| resource.to_owned());
        Ok(Self {
            issuer: config.issuer.clone(),
            jwks_uri: config.jwks_uri.clone(),
            algorithms,
            audience,
            skew: config.clock_skew_seconds,
            token_types: config
                .token_types
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            agent_claim: config.agent_claim.clone(),
            owner_claim: config.owner_claim.clone(),
            owner,
            projects_claim: config.projects_claim.clone(),
            projects,
            subjects,
            jwks_cache: Duration::from_secs(config.jwks_cache_seconds).min(MAX_JWKS_CACHE),
            refetch_min: Duration::from_secs(config.jwks_refetch_min_seconds),
            http_timeout: Duration::from_secs(config.http_timeout_seconds.max(1)),
            introspection: config.introspection.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_defaults_and_refusals() {
        let config: OAuthConfig = toml::from_str("issuer = \"https://as.example\"\n").unwrap();
        assert_eq!(config, OAuthConfig::new("https://as.example"));
        let settings = Settings::new(&config, "https://rs.example/mcp").unwrap();
        assert_eq!(settings.audience, "https://rs.example/mcp");
        assert_eq!(
            settings.algorithms,
            [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]
        );
        for alg in ["none", "HS256", "RS384"] {
            let mut c = config.clone();
            c.algorithms = vec![alg.into()];
            assert_eq!(
                Settings::new(&c, "x").unwrap_err(),
                OAuthConfigError::Algorithm(alg.into())
            );
        }
        let mut c = config.clone();
        c.algorithms.clear();
        assert_eq!(
            Settings::new(&c, "x").unwrap_err(),
            OAuthConfigError::NoAlgorithm
        );
        let mut c = config.clone();
        c.agent_claim = "email".into();
        assert!(matches!(
            Settings::new(&c, "x"),
            Err(OAuthConfigError::AgentClaim(_))
        ));
        let mut c = config.clone();
        c.issuer = "as.example".into();
        assert!(matches!(
            Settings::new(&c, "x"),
            Err(OAuthConfigError::Url { .. })
        ));
        let mut c = config.clone();
        c.owner = Some("bad owner".into());
        assert!(matches!(
            Settings::new(&c, "x"),
            Err(OAuthConfigError::InvalidId { .. })
        ));
        let entry = SubjectEntry {
            subject: "s".into(),
            owner: "o".into(),
            projects: vec![],
        };
        let mut c = config;
        c.subjects = vec![entry.clone(), entry];
        assert!(matches!(
            Settings::new(&c, "x"),
            Err(OAuthConfigError::DuplicateSubject(_))
        ));
        assert!(toml::from_str::<OAuthConfig>("issuer = \"https://a\"\nunknown = 1\n").is_err());
    }
}
