//! OAuth 2.1 resource server: access tokens issued by an external
//! authorization server.
//!
//! [`OAuthAuthenticator`] is an [`Authenticator`] for
//!
//! - **JWT access tokens** (RFC 9068), verified with the authorization
//!   server's published keys: signature (RS256, ES256 or EdDSA as
//!   configured; never `none`, never HMAC), `typ`, `iss`, `aud` (our
//!   resource URL by default, RFC 8707), `exp`, `nbf` and `iat` with the
//!   configured clock skew;
//! - **opaque tokens** through token introspection (RFC 7662), when
//!   `[oauth.introspection]` is configured; this server authenticates to the
//!   endpoint as a confidential client.
//!
//! A token becomes an agent [`Principal`]: its name from `sub` or
//! `client_id`, its owner and projects from the `[[oauth.subject]]` table,
//! from claims or from defaults, and its scopes from `scope` or `scp`. An
//! agent reached through OAuth is the same (owner, name) identity as one
//! with a static token: [`AuthChain`] puts both side by side.
//!
//! # Keys
//! The metadata is discovered from the issuer (RFC 8414, then OpenID
//! discovery) unless `jwks_uri` is configured. Keys are kept as long as the
//! JWKS response's `Cache-Control: max-age` allows (else, and for
//! `no-cache`, `no-store` or `max-age=0`, which would mean a fetch every
//! second, [`OAuthConfig::jwks_cache_seconds`]) and refreshed in the
//! background; a
//! failed refresh keeps the keys it has. A token whose `kid` is unknown
//! causes one refetch, at most once per
//! [`OAuthConfig::jwks_refetch_min_seconds`], so a rotated key is picked up
//! without a restart and a key the server stopped publishing stops
//! verifying. While no key could be had yet (the authorization server is
//! unreachable at start) the loader retries with backoff, says so in the
//! log, and tokens are answered 503: a token is never accepted unverified.
//!
//! # Caches
//! A verified JWT and an introspection answer are remembered by the
//! SHA-256 of the token until the token's `exp`
//! ([`MAX_CACHED_TOKENS`] entries at most), so a client that reuses its
//! token pays for the signature check once. A new key set forgets the JWTs
//! verified with a key it no longer has. An active introspection answer is
//! remembered until the token's `exp`, or at most
//! [`IntrospectionConfig::active_cache_seconds`]; an inactive one for
//! [`IntrospectionConfig::inactive_cache_seconds`] (60 s by default).

mod config;
pub mod jwks;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use graph_relay_core::ids::{AgentId, OwnerId, ProjectId};
use graph_relay_core::mcp::Caller;
use graph_relay_core::principal::Agent;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use serde_json::{Map, Value};

use self::config::Settings;
pub use self::config::{
    DEFAULT_ALGORITHMS, DEFAULT_CLOCK_SKEW_SECONDS, DEFAULT_HTTP_TIMEOUT_SECONDS,
    DEFAULT_INACTIVE_CACHE_SECONDS, DEFAULT_JWKS_CACHE_SECONDS, DEFAULT_JWKS_REFETCH_MIN_SECONDS,
    DEFAULT_TOKEN_TYPES, IntrospectionConfig, MAX_INTROSPECTION_CACHE_SECONDS, MAX_JWKS_CACHE,
    OAuthConfig, OAuthConfigError, SubjectEntry,
};
use self::jwks::FetchError;
use self::jwks::{Endpoints, KeySet};
use crate::auth::{
    AuthError, Authenticated, Authenticator, Challenge, Principal, TokenRefusal, hash_token,
};

/// Most tokens remembered by each cache (verified JWTs, introspection answers).
pub const MAX_CACHED_TOKENS: usize = 10_000;
/// How long an active introspection answer without `exp` is remembered.
pub const NEGATIVE_CACHE: Duration = Duration::from_secs(DEFAULT_INACTIVE_CACHE_SECONDS);
/// Most projects or scopes taken from one token.
pub const MAX_CLAIM_VALUES: usize = 256;
/// First pause of the key loader after a failure; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause of the key loader between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Shortest time between two scheduled key refreshes.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A cached verdict on one token.
#[derive(Debug, Clone)]
struct Cached {
    verdict: Result<Principal, TokenRefusal>,
    /// Unix seconds after which the entry is void.
    until: u64,
    /// The key a JWT was verified with (`None`: a key without `kid`, or
    /// an introspection answer).
    kid: Option<String>,
}

/// Tokens by SHA-256, bounded.
#[derive(Debug, Default)]
struct TokenCache {
    entries: Mutex<HashMap<String, Cached>>,
}

impl TokenCache {
    fn get(&self, hash: &str, now: u64) -> Option<Result<Principal, TokenRefusal>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(hash)
            .filter(|c| now < c.until)
            .map(|c| c.verdict.clone())
    }

    fn put(&self, hash: String, cached: Cached, now: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_CACHED_TOKENS {
            entries.retain(|_, c| now < c.until);
            if entries.len() >= MAX_CACHED_TOKENS {
                entries.clear();
            }
        }
        entries.insert(hash, cached);
    }

    /// Forgets the JWTs verified with a key that `keys` no longer has.
    fn keep_verified_by(&self, keys: &KeySet) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, c| match &c.kid {
                Some(kid) => keys.by_kid.contains_key(kid),
                None => false,
            });
    }
}

/// The keys in use.
#[derive(Debug, Default)]
struct KeyState {
    keys: Option<Arc<KeySet>>,
    /// Bumped on every new key set.
    generation: u64,
}

struct Shared {
    settings: Settings,
    http: reqwest::Client,
    keys: RwLock<KeyState>,
    endpoints: RwLock<Option<Endpoints>>,
    /// When the JWKS was last asked for.
    last_fetch: Mutex<Option<Instant>>,
    /// One refetch at a time.
    refetching: tokio::sync::Mutex<()>,
    /// Fetches of the JWKS so far.
    fetches: std::sync::atomic::AtomicU64,
    verified: TokenCache,
    introspected: TokenCache,
    ready: tokio::sync::watch::Sender<bool>,
}

/// Validates access tokens of one authorization server (see the module
/// docs). Cheap to clone; the background key loader ends with the last clone.
#[derive(Clone)]
pub struct OAuthAuthenticator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for OAuthAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthAuthenticator")
            .field("issuer", &self.shared.settings.issuer)
            .field("audience", &self.shared.settings.audience)
            .field("keys_loaded", &self.keys_loaded())
            .finish_non_exhaustive()
    }
}

/// Why [`OAuthAuthenticator::start`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum OAuthStartError {
    /// The configuration is not usable.
    #[error(transparent)]
    Config(#[from] OAuthConfigError),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client for the authorization server: {0}")]
    Client(String),
    /// Not called inside a tokio runtime (the key loader runs on it).
    #[error("the OAuth key loader needs a tokio runtime")]
    NoRuntime,
}

impl OAuthAuthenticator {
    /// Checks `config` and starts loading the keys in the background on the
    /// current tokio runtime. `resource` is this server's resource URL (the
    /// audience when `config` names none), e.g. `https://relay.example.com/mcp`.
    /// Returns at once: until the keys are loaded, tokens are answered
    /// [`AuthError::Unavailable`] (503).
    pub fn start(config: &OAuthConfig, resource: &str) -> Result<Self, OAuthStartError> {
        let settings = Settings::new(config, resource)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| OAuthStartError::NoRuntime)?;
        let http = reqwest::Client::builder()
            .timeout(settings.http_timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|e| OAuthStartError::Client(e.to_string()))?;
        let shared = Arc::new(Shared {
            settings,
            http,
            keys: RwLock::default(),
            endpoints: RwLock::default(),
            last_fetch: Mutex::default(),
            refetching: tokio::sync::Mutex::new(()),
            fetches: std::sync::atomic::AtomicU64::new(0),
            verified: TokenCache::default(),
            introspected: TokenCache::default(),
            ready: tokio::sync::watch::Sender::new(false),
        });
        runtime.spawn(keep_keys_loaded(Arc::downgrade(&shared)));
        Ok(Self { shared })
    }

    /// The issuer tokens must come from.
    pub fn issuer(&self) -> &str {
        &self.shared.settings.issuer
    }

    /// The audience tokens must name.
    pub fn audience(&self) -> &str {
        &self.shared.settings.audience
    }

    /// True once a key set is loaded.
    pub fn keys_loaded(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// How many times the JWKS was fetched (successfully or not).
    pub fn jwks_fetches(&self) -> u64 {
        self.shared
            .fetches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until the keys are loaded, at most `timeout`; true when they are.
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        let mut ready = self.shared.ready.subscribe();
        tokio::time::timeout(timeout, ready.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Loads the keys, then refreshes them when they go stale; retries with
/// backoff after a failure. Ends when the authenticator is dropped.
async fn keep_keys_loaded(weak: Weak<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    let mut failures = 0u32;
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let pause = match shared.load().await {
            Ok(fresh_for) => {
                if failures > 0 {
                    tracing::info!(issuer = %shared.settings.issuer, "the authorization server's keys are loaded; OAuth tokens are accepted again");
                }
                failures = 0;
                backoff = FIRST_BACKOFF;
                fresh_for.max(MIN_REFRESH)
            }
            Err(e) => {
                failures += 1;
                let loaded = *shared.ready.borrow();
                if failures == 1 || failures.is_power_of_two() {
                    if loaded {
                        tracing::warn!(issuer = %shared.settings.issuer, error = %e, retry_in = ?backoff, "cannot refresh the authorization server's keys; keeping the ones loaded");
                    } else {
                        tracing::error!(issuer = %shared.settings.issuer, error = %e, retry_in = ?backoff, "cannot load the authorization server's signing keys; requests with OAuth tokens are answered 503 until they are loaded (retrying with backoff)");
                    }
                }
                let pause = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                pause
            }
        };
        drop(shared);
        tokio::time::sleep(pause).await;
    }
}

impl Shared {
    /// Discovers (once) and fetches the JWKS; installs it. Returns how long
    /// it stays fresh.
    async fn load(&self) -> Result<Duration, FetchError> {
        let settings = &self.settings;
        let jwks_uri = match &settings.jwks_uri {
            Some(uri) => uri.clone(),
            None => {
                let known = self
                    .endpoints
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let endpoints = match known {
                    Some(e) => e,
                    None => {
                        let found = jwks::discover(&self.http, &settings.issuer).await?;
                        *self.endpoints.write().unwrap_or_else(|p| p.into_inner()) =
                            Some(found.clone());
                        found
                    }
                };
                endpoints.jwks_uri.ok_or_else(|| FetchError::Malformed {
                    url: settings.issuer.clone(),
                    what: "metadata with a jwks_uri",
                })?
            }
        };
        *self.last_fetch.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (doc, max_age) = jwks::get_json(&self.http, &jwks_uri, "a JWKS document").await?;
        let set = KeySet::from_jwks(&doc).ok_or(FetchError::Malformed {
            url: jwks_uri.clone(),
            what: "a JWKS document",
        })?;
        if set.is_empty() {
            return Err(FetchError::NoKeys { url: jwks_uri });
        }
        let count = set.by_kid.len() + set.without_kid.len();
        // Tokens verified with a key that is gone are checked again; the
        // others stay verified (a refresh does not end sessions).
        self.verified.keep_verified_by(&set);
        {
            let mut state = self.keys.write().unwrap_or_else(|p| p.into_inner());
            state.keys = Some(Arc::new(set));
            state.generation += 1;
        }
        let first = !self.ready.send_replace(true);
        if first {
            tracing::info!(issuer = %settings.issuer, %jwks_uri, keys = count, "loaded the authorization server's signing keys");
        } else {
            tracing::debug!(%jwks_uri, keys = count, "refreshed the authorization server's signing keys");
        }
        Ok(max_age.unwrap_or(settings.jwks_cache).min(MAX_JWKS_CACHE))
    }

    fn snapshot(&self) -> (Option<Arc<KeySet>>, u64) {
        let state = self.keys.read().unwrap_or_else(|p| p.into_inner());
        (state.keys.clone(), state.generation)
    }

    /// Fetches the JWKS again for a token with an unknown `kid`, unless that
    /// happened less than `jwks_refetch_min_seconds` ago. True when the key
    /// set changed since `seen` (by this fetch or a concurrent one).
    async fn refetch(&self, seen: u64) -> bool {
        let _one = self.refetching.lock().await;
        if self.snapshot().1 != seen {
            return true;
        }
        let recent = self
            .last_fetch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < self.settings.refetch_min);
        if recent {
            return false;
        }
        match self.load().await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot refetch the authorization server's keys for a token with an unknown key id");
                false
            }
        }
    }

    async fn verify_jwt(&self, token: &str, hash: String) -> Result<Principal, AuthError> {
        let settings = &self.settings;
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| refused(TokenRefusal::Malformed))?;
        check_header(settings, &header)?;
        let candidates = self.candidate_keys(&header).await?;
        let claims = self.verified_claims(token, header.alg, &candidates)?;
        let now = unix_now();
        match claims.get("iat").and_then(number) {
            None => return Err(refused(TokenRefusal::MissingClaim("iat".into()))),
            Some(iat) if iat > now.saturating_add(settings.skew) => {
                return Err(refused(TokenRefusal::IssuedInFuture));
            }
            Some(_) => {}
        }
        let principal = self.principal(&claims).map_err(refused)?;
        let until = claims
            .get("exp")
            .and_then(number)
            .unwrap_or(now)
            .saturating_add(settings.skew);
        self.verified.put(
            hash,
            Cached {
                verdict: Ok(principal.clone()),
                until,
                kid: header.kid.clone(),
            },
            now,
        );
        Ok(principal)
    }

    /// The keys that may have signed a token with `header`: by its key id
    /// (the keys are fetched again, at most once per refetch interval, when
    /// none has it) and algorithm.
    async fn candidate_keys(&self, header: &Header) -> Result<Vec<jwks::Key>, AuthError> {
        let (keys, generation) = self.snapshot();
        let Some(mut keys) = keys else {
            return Err(AuthError::Unavailable(
                "the authorization server's signing keys are not loaded yet".into(),
            ));
        };
        let mut candidates = keys_for(&keys, header.kid.as_deref(), header.alg);
        if candidates.is_empty() && header.kid.is_some() && self.refetch(generation).await {
            if let (Some(fresh), _) = self.snapshot() {
                keys = fresh;
            }
            candidates = keys_for(&keys, header.kid.as_deref(), header.alg);
        }
        if candidates.is_empty() {
            return Err(refused(TokenRefusal::UnknownKey));
        }
        Ok(candidates)
    }

    /// The claims of `token`, once one of `candidates` verifies its
    /// signature and its issuer, audience and times hold. A signature or
    /// algorithm mismatch tries the next key; any other refusal is final.
    fn verified_claims(
        &self,
        token: &str,
        alg: Algorithm,
        candidates: &[jwks::Key],
    ) -> Result<Map<String, Value>, AuthError> {
        let settings = &self.settings;
        let mut validation = Validation::new(alg);
        validation.leeway = settings.skew;
        validation.validate_nbf = true;
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let mut last = TokenRefusal::Signature;
        for key in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) => {
                    last = self.refusal_of(e.kind());
                    if !matches!(last, TokenRefusal::Signature | TokenRefusal::Algorithm(_)) {
                        return Err(refused(last));
                    }
                }
            }
        }
        Err(refused(last))
    }

    fn refusal_of(&self, kind: &ErrorKind) -> TokenRefusal {
        match kind {
            ErrorKind::InvalidSignature | ErrorKind::Crypto(_) => TokenRefusal::Signature,
            ErrorKind::ExpiredSignature => TokenRefusal::Expired,
            ErrorKind::ImmatureSignature => TokenRefusal::NotYetValid,
            ErrorKind::InvalidIssuer => TokenRefusal::Issuer,
            ErrorKind::InvalidAudience => TokenRefusal::Audience(self.settings.audience.clone()),
            ErrorKind::MissingRequiredClaim(c) => TokenRefusal::MissingClaim(c.clone()),
            ErrorKind::InvalidAlgorithm => TokenRefusal::Algorithm("this key's algorithm".into()),
            _ => TokenRefusal::Malformed,
        }
    }

    /// The agent a token's claims name.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, TokenRefusal> {
        let s = &self.settings;
        // Without `sub` (an introspection answer for a client-credentials
        // token may leave it out) the client is the agent, as RFC 9068
        // makes it for JWTs.
        let name = claims
            .get(&s.agent_claim)
            .or_else(|| {
                (s.agent_claim == "sub")
                    .then(|| claims.get("client_id"))
                    .flatten()
            })
            .and_then(Value::as_str)
            .ok_or_else(|| TokenRefusal::MissingClaim(s.agent_claim.clone()))?;
        let bad = |claim: &str| {
            let claim = claim.to_owned();
            move |e: graph_relay_core::ids::InvalidId| TokenRefusal::BadClaim {
                claim,
                rule: e.rule.to_owned(),
            }
        };
        let id = AgentId::parse(name).map_err(bad(&s.agent_claim))?;
        let placement = s.subjects.get(name);
        let owner = match (placement, &s.owner_claim) {
            (Some(p), _) => p.owner.clone(),
            (None, Some(claim)) => match claims.get(claim).and_then(Value::as_str) {
                Some(text) => OwnerId::parse(text).map_err(bad(claim))?,
                None => s.owner.clone().ok_or(TokenRefusal::NoOwner)?,
            },
            (None, None) => s.owner.clone().ok_or(TokenRefusal::NoOwner)?,
        };
        let projects = match (placement, &s.projects_claim) {
            (Some(p), _) => p.projects.clone(),
            (None, Some(claim)) if claims.contains_key(claim) => strings(claims.get(claim))
                .ok_or_else(|| TokenRefusal::BadClaim {
                    claim: claim.clone(),
                    rule: "must be an array of strings or a space-separated string".into(),
                })?
                .iter()
                .map(|p| ProjectId::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad(claim))?,
            (None, _) => s.projects.clone(),
        };
        let scopes = ["scope", "scp"]
            .iter()
            .find_map(|c| strings(claims.get(*c)))
            .unwrap_or_default();
        Ok(Principal::Agent(Caller::new(
            Agent::new(id, owner, projects),
            scopes,
        )))
    }

    async fn introspect(&self, token: &str, hash: String) -> Result<Principal, AuthError> {
        let settings = &self.settings;
        let Some(client) = &settings.introspection else {
            return Err(AuthError::InvalidToken);
        };
        let endpoint = match &client.endpoint {
            Some(e) => e.clone(),
            None => {
                let known = self
                    .endpoints
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                match known {
                    Some(Endpoints {
                        introspection_endpoint: Some(e),
                        ..
                    }) => e,
                    Some(_) => {
                        return Err(AuthError::Unavailable(
                            "the authorization server's metadata names no introspection_endpoint"
                                .into(),
                        ));
                    }
                    None => {
                        return Err(AuthError::Unavailable(
                            "the authorization server's metadata is not loaded yet".into(),
                        ));
                    }
                }
            }
        };
        let unavailable = |why: String| AuthError::Unavailable(format!("introspection: {why}"));
        let mut response = self
            .http
            .post(&endpoint)
            .basic_auth(&client.client_id, Some(&client.client_secret))
            .header(reqwest::header::ACCEPT, "application/json")
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(unavailable(format!("HTTP {}", response.status().as_u16())));
        }
        let body = jwks::read_bounded(&mut response, &endpoint)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let answer: Map<String, Value> =
            serde_json::from_slice(&body).map_err(|_| unavailable("not a JSON object".into()))?;
        let now = unix_now();
        let verdict = self.judge_introspection(&answer, now);
        let inactive = now.saturating_add(client.inactive_cache_seconds);
        let until = match &verdict {
            Ok(_) => {
                let until_exp = answer
                    .get("exp")
                    .and_then(number)
                    .map_or(now + NEGATIVE_CACHE.as_secs(), |exp| {
                        exp.saturating_add(settings.skew)
                    });
                client
                    .active_cache_seconds
                    .map_or(until_exp, |most| until_exp.min(now.saturating_add(most)))
            }
            Err(_) => inactive,
        };
        self.introspected.put(
            hash,
            Cached {
                verdict: verdict.clone(),
                until,
                kid: None,
            },
            now,
        );
        verdict.map_err(refused)
    }

    /// An RFC 7662 answer, checked like a JWT's claims.
    fn judge_introspection(
        &self,
        answer: &Map<String, Value>,
        now: u64,
    ) -> Result<Principal, TokenRefusal> {
        let s = &self.settings;
        if answer.get("active") != Some(&Value::Bool(true)) {
            return Err(TokenRefusal::Inactive);
        }
        if let Some(exp) = answer.get("exp").and_then(number)
            && exp.saturating_add(s.skew) < now
        {
            return Err(TokenRefusal::Expired);
        }
        if let Some(nbf) = answer.get("nbf").and_then(number)
            && nbf > now.saturating_add(s.skew)
        {
            return Err(TokenRefusal::NotYetValid);
        }
        if let Some(iss) = answer.get("iss")
            && iss.as_str() != Some(s.issuer.as_str())
        {
            return Err(TokenRefusal::Issuer);
        }
        let audience_ok = strings(answer.get("aud")).is_some_and(|aud| aud.contains(&s.audience));
        if !audience_ok {
            return Err(TokenRefusal::Audience(s.audience.clone()));
        }
        self.principal(answer)
    }
}

/// The keys that may have signed a token with `kid` and `alg`.
/// The token's type (when the settings name the accepted ones) and its
/// algorithm are accepted.
fn check_header(settings: &Settings, header: &Header) -> Result<(), AuthError> {
    if !settings.token_types.is_empty() {
        let typ = header.typ.as_deref().unwrap_or_default();
        if !settings
            .token_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case(typ))
        {
            return Err(refused(TokenRefusal::TokenType(printable(typ))));
        }
    }
    if !settings.algorithms.contains(&header.alg) {
        return Err(refused(TokenRefusal::Algorithm(format!(
            "{:?}",
            header.alg
        ))));
    }
    Ok(())
}

fn keys_for(keys: &KeySet, kid: Option<&str>, alg: Algorithm) -> Vec<jwks::Key> {
    let fits = |k: &&jwks::Key| k.alg.is_none_or(|a| a == alg);
    match kid {
        Some(kid) => keys
            .by_kid
            .get(kid)
            .filter(fits)
            .cloned()
            .into_iter()
            .collect(),
        None => keys
            .without_kid
            .iter()
            .chain(keys.by_kid.values())
            .filter(fits)
            .cloned()
            .collect(),
    }
}

/// A non-negative whole number of seconds.
fn number(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// An array of strings or one space-separated string; at most
/// [`MAX_CLAIM_VALUES`] values.
fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    match value? {
        Value::String(text) => Some(
            text.split_whitespace()
                .take(MAX_CLAIM_VALUES)
                .map(str::to_owned)
                .collect(),
        ),
        Value::Array(items) => items
            .iter()
            .take(MAX_CLAIM_VALUES)
            .map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

/// Text safe inside a quoted header parameter, at most 64 characters.
fn printable(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\'))
        .take(64)
        .collect()
}

fn refused(refusal: TokenRefusal) -> AuthError {
    AuthError::Refused(refusal)
}

/// True when `token` has the shape of a JWS compact serialization (three
/// dot-separated parts); decoding is left to the JOSE library.
fn jwt_shaped(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

#[async_trait]
impl Authenticator for OAuthAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let shared = &self.shared;
        let hash = hash_token(token);
        let now = unix_now();
        if let Some(verdict) = shared.verified.get(&hash, now) {
            return verdict.map_err(refused);
        }
        if jwt_shaped(token) {
            return shared.verify_jwt(token, hash).await;
        }
        if let Some(verdict) = shared.introspected.get(&hash, now) {
            return verdict.map_err(refused);
        }
        shared.introspect(token, hash).await
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        let now = unix_now();
        [&self.shared.verified, &self.shared.introspected]
            .iter()
            .any(|cache| {
                cache
                    .get(token_sha256, now)
                    .is_some_and(|v| v.as_ref() == Ok(principal))
            })
    }
}

/// Several authenticators side by side, e.g. the static token file and
/// OAuth: a token is the first one's that knows it. A refusal other than
/// "unknown token" (an expired JWT, an unreachable authorization server)
/// is answered as it is; every principal keeps its (owner, name) identity
/// whichever authenticator found it. Each source reads the request its own
/// way ([`Authenticator::authenticate_request`]), so a bearer-token source
/// and one with another header sit side by side; the 401 is the first
/// source's [`Authenticator::challenge`].
pub struct AuthChain {
    sources: Vec<Arc<dyn Authenticator>>,
}

impl std::fmt::Debug for AuthChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthChain")
            .field("sources", &self.sources.len())
            .finish()
    }
}

impl AuthChain {
    /// Tries `sources` in order.
    pub fn new(sources: Vec<Arc<dyn Authenticator>>) -> Self {
        Self { sources }
    }
}

#[async_trait]
impl Authenticator for AuthChain {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        for source in &self.sources {
            match source.authenticate(token).await {
                Err(AuthError::InvalidToken) => continue,
                other => return other,
            }
        }
        Err(AuthError::InvalidToken)
    }

    async fn anonymous(&self) -> Option<Principal> {
        for source in &self.sources {
            if let Some(p) = source.anonymous().await {
                return Some(p);
            }
        }
        None
    }

    /// Each source's own [`Authenticator::authenticate_request`] in turn:
    /// the first that accepts the request, or refuses it for another reason
    /// than "no credentials of mine" or "unknown credentials", answers.
    /// When none does, an unknown credential outranks a missing one.
    async fn authenticate_request(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<Authenticated, AuthError> {
        let mut unknown = false;
        for source in &self.sources {
            match source.authenticate_request(headers).await {
                Err(AuthError::InvalidToken) => unknown = true,
                Err(AuthError::MissingCredentials) => {}
                other => return other,
            }
        }
        Err(if unknown {
            AuthError::InvalidToken
        } else {
            AuthError::MissingCredentials
        })
    }

    /// The first source's challenge (the bearer challenge without sources).
    fn challenge(&self, challenge: &Challenge<'_>) -> axum::response::Response {
        match self.sources.first() {
            Some(source) => source.challenge(challenge),
            None => challenge.bearer_response(),
        }
    }

    fn revocations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.sources.iter().find_map(|s| s.revocations())
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        for source in &self.sources {
            if source.still_valid(token_sha256, principal).await {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_values_and_header_text() {
        assert_eq!(
            strings(Some(&serde_json::json!("a  b"))),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(strings(Some(&serde_json::json!(["a", 1]))), None);
        assert_eq!(strings(Some(&serde_json::json!(7))), None);
        let many = serde_json::json!(vec!["x"; MAX_CLAIM_VALUES + 10]);
        assert_eq!(
            strings(Some(&many)).map(|v| v.len()),
            Some(MAX_CLAIM_VALUES)
        );
        assert_eq!(printable("a\"b\\c\nd"), "abcd");
        assert_eq!(number(&serde_json::json!(12.7)), Some(12));
        assert_eq!(number(&serde_json::json!(-1)), None);
        assert!(jwt_shaped("a.b.c") && !jwt_shaped("a.b") && !jwt_shaped("gra_x"));
    }
}
