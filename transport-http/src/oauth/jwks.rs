//! The authorization server's metadata and signing keys, fetched over HTTP.

use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// Largest metadata or JWKS document read (256 KiB).
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// Most keys kept from one JWKS.
pub const MAX_KEYS: usize = 64;

/// Why the authorization server's metadata or keys could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The request failed (connection, timeout, TLS).
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// What was fetched.
        url: String,
        /// Why.
        reason: String,
    },
    /// A status other than 200.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// What was fetched.
        url: String,
        /// The status.
        status: u16,
    },
    /// A body larger than [`MAX_DOCUMENT_BYTES`].
    #[error("{url} sent more than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge {
        /// What was fetched.
        url: String,
    },
    /// Not the JSON document expected.
    #[error("{url} did not send {what}")]
    Malformed {
        /// What was fetched.
        url: String,
        /// What was expected.
        what: &'static str,
    },
    /// The metadata names another issuer (RFC 8414 §3.3).
    #[error("the metadata at {url} is for issuer `{found}`, not `{expected}`")]
    IssuerMismatch {
        /// What was fetched.
        url: String,
        /// The configured issuer.
        expected: String,
        /// The metadata's.
        found: String,
    },
    /// Neither discovery document could be had.
    #[error("no authorization server metadata for `{issuer}`: {oauth}; {openid}")]
    NoMetadata {
        /// The issuer.
        issuer: String,
        /// Why RFC 8414 failed.
        oauth: Box<FetchError>,
        /// Why OpenID discovery failed.
        openid: Box<FetchError>,
    },
    /// A JWKS with no usable key.
    #[error("{url} holds no usable signing key (RS256, ES256 or EdDSA)")]
    NoKeys {
        /// What was fetched.
        url: String,
    },
}

impl FetchError {
    /// True when the server answered (a later attempt may still succeed,
    /// but it is not a connectivity problem).
    pub fn answered(&self) -> bool {
        !matches!(self, Self::Unreachable { .. })
    }
}

/// GETs `url` as JSON, bounded; returns it and its `Cache-Control: max-age`.
pub(crate) async fn get_json(
    http: &reqwest::Client,
    url: &str,
    what: &'static str,
) -> Result<(Value, Option<Duration>), FetchError> {
    let unreachable = |e: reqwest::Error| FetchError::Unreachable {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let mut response = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(unreachable)?;
    if response.status() != reqwest::StatusCode::OK {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: response.status().as_u16(),
        });
    }
    let max_age = response
        .headers()
        .get(reqwest::header::CACHE_CONTROL)
        .and_then(|v| v.to_str().ok())
        .and_then(cache_max_age);
    let body = read_bounded(&mut response, url).await?;
    let value = serde_json::from_slice(&body).map_err(|_| FetchError::Malformed {
        url: url.to_owned(),
        what,
    })?;
    Ok((value, max_age))
}

/// Reads a response body of at most [`MAX_DOCUMENT_BYTES`].
pub(crate) async fn read_bounded(
    response: &mut reqwest::Response,
    url: &str,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::TooLarge {
        url: url.to_owned(),
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_DOCUMENT_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| FetchError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
        })?
    {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The lifetime a `Cache-Control` value gives a JWKS: its `max-age`, or
/// `None` when it gives none, so that the configured
/// `jwks_cache_seconds` applies. `no-cache` and `no-store` without a
/// `max-age`, and `max-age=0`, give none: taken literally they would have
/// the keys fetched again every second, forever (Keycloak serves its JWKS
/// with `no-cache`), while a rotated key is picked up anyway by the
/// rate-limited refetch for a token with an unknown `kid`.
pub(crate) fn cache_max_age(value: &str) -> Option<Duration> {
    let mut age = None;
    for directive in value.split(',').map(str::trim) {
        let (name, arg) = match directive.split_once('=') {
            Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
            None => (directive, None),
        };
        if name.eq_ignore_ascii_case("max-age")
            && let Some(secs) = arg.and_then(|a| a.parse::<u64>().ok())
        {
            age = Some(Duration::from_secs(secs));
        }
    }
    age.filter(|a| !a.is_zero())
}

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    pub(crate) jwks_uri: Option<String>,
    pub(crate) introspection_endpoint: Option<String>,
}

/// RFC 8414 metadata (`/.well-known/oauth-authorization-server` inserted
/// before the issuer's path), else OpenID discovery (appended to it).
pub(crate) async fn discover(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<Endpoints, FetchError> {
    let trimmed = issuer.trim_end_matches('/');
    let oauth_url = match trimmed.find("://").map(|i| i + 3) {
        Some(start) => match trimmed[start..].find('/') {
            Some(slash) => {
                let (origin, path) = trimmed.split_at(start + slash);
                format!("{origin}/.well-known/oauth-authorization-server{path}")
            }
            None => format!("{trimmed}/.well-known/oauth-authorization-server"),
        },
        None => format!("{trimmed}/.well-known/oauth-authorization-server"),
    };
    let openid_url = format!("{trimmed}/.well-known/openid-configuration");
    let oauth = match metadata(http, &oauth_url, issuer).await {
        Ok(found) => return Ok(found),
        Err(e @ FetchError::Unreachable { .. }) => return Err(e),
        Err(e) => e,
    };
    match metadata(http, &openid_url, issuer).await {
        Ok(found) => Ok(found),
        Err(e @ FetchError::Unreachable { .. }) => Err(e),
        Err(openid) => Err(FetchError::NoMetadata {
            issuer: issuer.to_owned(),
            oauth: Box::new(oauth),
            openid: Box::new(openid),
        }),
    }
}

async fn metadata(
    http: &reqwest::Client,
    url: &str,
    issuer: &str,
) -> Result<Endpoints, FetchError> {
    let (doc, _) = get_json(http, url, "authorization server metadata").await?;
    let found = doc
        .get("issuer")
        .and_then(Value::as_str)
        .ok_or(FetchError::Malformed {
            url: url.to_owned(),
            what: "authorization server metadata (no `issuer`)",
        })?;
    if found != issuer {
        return Err(FetchError::IssuerMismatch {
            url: url.to_owned(),
            expected: issuer.to_owned(),
            found: found.to_owned(),
        });
    }
    let text = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_owned);
    Ok(Endpoints {
        jwks_uri: text("jwks_uri"),
        introspection_endpoint: text("introspection_endpoint"),
    })
}

/// One verification key.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) key: DecodingKey,
    /// The algorithm the JWK pins, if any.
    pub(crate) alg: Option<Algorithm>,
}

/// The keys of one JWKS, by `kid` (keys without one are tried in turn).
#[derive(Clone, Default)]
pub(crate) struct KeySet {
    pub(crate) by_kid: HashMap<String, Key>,
    pub(crate) without_kid: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("kids", &self.by_kid.keys().collect::<Vec<_>>())
            .field("without_kid", &self.without_kid.len())
            .finish()
    }
}

impl KeySet {
    /// The usable signing keys of a JWKS document: RSA, P-256 and Ed25519
    /// public keys not marked for encryption; others are skipped. At most
    /// [`MAX_KEYS`].
    pub(crate) fn from_jwks(doc: &Value) -> Option<Self> {
        let keys = doc.get("keys")?.as_array()?;
        let mut set = Self::default();
        for value in keys.iter().take(MAX_KEYS) {
            // One key the library does not know must not hide the others.
            let Ok(jwk) = serde_json::from_value::<Jwk>(value.clone()) else {
                continue;
            };
            if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
                continue;
            }
            let alg = match jwk.common.key_algorithm {
                None => None,
                Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
                Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
                Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
                Some(_) => continue,
            };
            let usable = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => true,
                AlgorithmParameters::EllipticCurve(p) => {
                    matches!(p.curve, jsonwebtoken::jwk::EllipticCurve::P256)
                }
                AlgorithmParameters::OctetKeyPair(p) => {
                    matches!(p.curve, jsonwebtoken::jwk::EllipticCurve::Ed25519)
                }
                // Symmetric keys never verify an access token here.
                AlgorithmParameters::OctetKey(_) => false,
            };
            if !usable {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(&jwk) else {
                continue;
            };
            let key = Key { key, alg };
            match jwk.common.key_id {
                Some(kid) => {
                    set.by_kid.insert(kid, key);
                }
                None => set.without_kid.push(key),
            }
        }
        Some(set)
    }

    /// True when the set has no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_kid.is_empty() && self.without_kid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cache_control() {
        assert_eq!(
            cache_max_age("public, max-age=600"),
            Some(Duration::from_secs(600))
        );
        // No lifetime given: the configured `jwks_cache_seconds` applies.
        for none in [
            "no-store",
            "no-cache",
            "NO-CACHE",
            "no-cache, must-revalidate, no-transform, no-store",
            "max-age=0",
            "no-cache, no-store, max-age=0, must-revalidate",
        ] {
            assert_eq!(cache_max_age(none), None, "{none}");
        }
        assert_eq!(
            cache_max_age("no-cache, max-age=120"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            cache_max_age("max-age=\"30\""),
            Some(Duration::from_secs(30))
        );
        assert_eq!(cache_max_age("public"), None);
        assert_eq!(cache_max_age("max-age=soon"), None);
    }

    #[test]
    fn only_signing_keys_are_kept() {
        let doc = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "ed"},
            {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "enc", "use": "enc"},
            {"kty": "weird", "kid": "w"},
            {"kty": "RSA", "n": "sXch", "e": "AQAB"}
        ]});
        let set = KeySet::from_jwks(&doc).unwrap();
        assert_eq!(set.by_kid.keys().collect::<Vec<_>>(), ["ed"]);
        assert_eq!(set.without_kid.len(), 1);
        assert!(KeySet::from_jwks(&json!({"nokeys": []})).is_none());
    }
}
