//! A stand-in authorization server on loopback for the OAuth tests and the
//! token-validation bench: RFC 8414 metadata, a JWKS whose keys the test
//! changes at will (rotation), an RFC 7662 introspection endpoint, and
//! signing keys (Ed25519 and P-256 from ring) to mint tokens with.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

/// Now, in Unix seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A signing key and its public JWK.
#[derive(Clone)]
pub struct SigningKey {
    pub kid: String,
    pub alg: Algorithm,
    pub key: EncodingKey,
    pub jwk: Value,
    /// The raw public key (what an HS256 forgery would use as its secret).
    pub public: Vec<u8>,
}

impl SigningKey {
    /// A fresh Ed25519 key.
    pub fn ed25519(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key");
        let public = pair.public_key().as_ref().to_vec();
        Self {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(&public), "kid": kid, "alg": "EdDSA", "use": "sig"}),
            public,
        }
    }

    /// A fresh P-256 key.
    pub fn p256(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("keygen");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("key");
        let public = pair.public_key().as_ref().to_vec();
        Self {
            kid: kid.into(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "crv": "P-256", "x": URL_SAFE_NO_PAD.encode(&public[1..33]), "y": URL_SAFE_NO_PAD.encode(&public[33..]), "kid": kid, "alg": "ES256", "use": "sig"}),
            public,
        }
    }

    /// An RSA key from its PKCS#1 DER (ring cannot generate RSA keys;
    /// `openssl genrsa` can).
    pub fn rsa(kid: &str, pkcs1_der: &[u8]) -> Self {
        let pair = ring::signature::RsaKeyPair::from_der(pkcs1_der).expect("RSA key");
        let public = pair.public_key();
        let parts: ring::rsa::PublicKeyComponents<Vec<u8>> = public.into();
        let (n, e) = (parts.n, parts.e);
        Self {
            kid: kid.into(),
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_der(pkcs1_der),
            jwk: json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&n), "e": URL_SAFE_NO_PAD.encode(&e), "kid": kid, "alg": "RS256", "use": "sig"}),
            public: public.as_ref().to_vec(),
        }
    }

    /// Signs `claims` with this key, `typ: at+jwt`.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        header.typ = Some("at+jwt".into());
        jsonwebtoken::encode(&header, claims, &self.key).expect("sign")
    }
}

/// `{"alg":"none"}` with `claims` and an empty signature.
pub fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"at+jwt"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.")
}

/// HS256 over `claims` with `secret` as the key, naming `kid`.
pub fn hs256(claims: &Value, secret: &[u8], kid: &str) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.into());
    header.typ = Some("at+jwt".into());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).expect("sign")
}

#[derive(Default)]
struct IssuerState {
    issuer: String,
    jwks: Mutex<Value>,
    cache_control: Mutex<Option<String>>,
    jwks_fetches: AtomicUsize,
    introspections: AtomicUsize,
    /// Opaque token → introspection answer.
    opaque: Mutex<HashMap<String, Value>>,
    /// The Basic credentials introspection requires.
    client: (String, String),
}

/// The stand-in authorization server.
pub struct TestIssuer {
    pub url: String,
    state: Arc<IssuerState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Credentials of the resource server at the stand-in's introspection endpoint.
pub const RS_CLIENT: (&str, &str) = ("graph-relay", "rs-secret");

impl TestIssuer {
    /// Serves on `listener` (bound by the caller, so a test can reserve the
    /// port before the server exists) with `keys` in its JWKS.
    pub async fn serve_on(listener: tokio::net::TcpListener, keys: &[&SigningKey]) -> Self {
        let addr = listener.local_addr().expect("addr");
        let url = format!("http://{addr}");
        let state = Arc::new(IssuerState {
            issuer: url.clone(),
            client: (RS_CLIENT.0.into(), RS_CLIENT.1.into()),
            ..Default::default()
        });
        *state.jwks.lock().unwrap() =
            json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
        let app = Router::new()
            .route("/.well-known/oauth-authorization-server", get(metadata))
            .route("/jwks", get(jwks))
            .route("/introspect", post(introspect))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("issuer serves");
        });
        Self { url, state, task }
    }

    /// Serves on a fresh loopback port.
    pub async fn start(keys: &[&SigningKey]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::serve_on(listener, keys).await
    }

    /// Publishes `keys` instead of the current ones (a rotation).
    pub fn publish(&self, keys: &[&SigningKey]) {
        *self.state.jwks.lock().unwrap() =
            json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    }

    /// The `Cache-Control` of JWKS responses.
    pub fn cache_control(&self, value: Option<&str>) {
        *self.state.cache_control.lock().unwrap() = value.map(str::to_owned);
    }

    /// How many times the JWKS was fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// How many introspection requests arrived.
    pub fn introspections(&self) -> usize {
        self.state.introspections.load(Ordering::SeqCst)
    }

    /// Makes `token` an opaque token whose introspection answers `answer`.
    pub fn opaque(&self, token: &str, answer: Value) {
        self.state
            .opaque
            .lock()
            .unwrap()
            .insert(token.into(), answer);
    }

    /// Claims of a valid token for `audience`: issued now, valid an hour.
    pub fn claims(&self, audience: &str, sub: &str, scope: &str) -> Value {
        let now = now();
        json!({"iss": self.url, "aud": audience, "sub": sub, "client_id": sub, "scope": scope,
               "iat": now, "exp": now + 3600, "jti": format!("{now}-{sub}")})
    }
}

async fn metadata(State(state): State<Arc<IssuerState>>) -> Response {
    axum::Json(json!({
        "issuer": state.issuer,
        "jwks_uri": format!("{}/jwks", state.issuer),
        "introspection_endpoint": format!("{}/introspect", state.issuer),
        "token_endpoint": format!("{}/token", state.issuer),
    }))
    .into_response()
}

async fn jwks(State(state): State<Arc<IssuerState>>) -> Response {
    state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    let mut response = axum::Json(state.jwks.lock().unwrap().clone()).into_response();
    if let Some(cc) = state.cache_control.lock().unwrap().clone() {
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_str(&cc).expect("header"),
        );
    }
    response
}

async fn introspect(
    State(state): State<Arc<IssuerState>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    state.introspections.fetch_add(1, Ordering::SeqCst);
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", state.client.0, state.client.1))
    );
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_client"})),
        )
            .into_response();
    }
    let token = body
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .unwrap_or_default()
        .to_owned();
    let answer = state
        .opaque
        .lock()
        .unwrap()
        .get(&token)
        .cloned()
        .unwrap_or_else(|| json!({"active": false}));
    axum::Json(answer).into_response()
}
