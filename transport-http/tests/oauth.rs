//! OAuth access tokens against a stand-in authorization server on loopback
//! (`common/issuer.rs`): what is accepted, every refusal with its 401
//! challenge, key rotation and the refetch rate limit, `Cache-Control`,
//! the 503 while the keys are not loaded, introspection of opaque tokens,
//! and static tokens side by side with OAuth under one identity. The real
//! authorization server (oidc-provider) and real clients are exercised by
//! `cli/tests/oauth.rs`.

#[path = "common/issuer.rs"]
mod issuer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use graph_relay_core::catalog::ToolCatalog;
use graph_relay_core::mcp::{McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{
    AgentToken, StaticTokens, TokenConfig, TokenRefusal, hash_token,
};
use graph_relay_transport_http::oauth::{
    AuthChain, IntrospectionConfig, OAuthAuthenticator, OAuthConfig, SubjectEntry,
};
use graph_relay_transport_http::{
    HttpConfig, HttpState,
    auth::{AuthError, Authenticator, Principal},
    router,
};
use http_body_util::BodyExt;
use issuer::{RS_CLIENT, SigningKey, TestIssuer, hs256, now, unsigned};
use serde_json::{Value, json};
use tower::ServiceExt;

const AUDIENCE: &str = "http://127.0.0.1:8787/mcp";
const READ_RUN: &str = "osfoundry:read osfoundry:run";

fn config(issuer: &TestIssuer) -> OAuthConfig {
    let mut config = OAuthConfig::new(&issuer.url);
    config.owner = Some("alice".into());
    config.projects = vec!["p1".into()];
    config.jwks_refetch_min_seconds = 0;
    config
}

async fn started(config: &OAuthConfig) -> OAuthAuthenticator {
    let auth = OAuthAuthenticator::start(config, AUDIENCE).expect("start");
    assert!(
        auth.wait_until_ready(Duration::from_secs(10)).await,
        "keys never loaded"
    );
    auth
}

fn agent(principal: &Principal) -> (&str, &str, Vec<&str>, Vec<&str>) {
    let Principal::Agent(caller) = principal else {
        panic!("not an agent: {principal:?}");
    };
    (
        caller.agent.owner.as_str(),
        caller.agent.id.as_str(),
        caller.agent.projects.iter().map(|p| p.as_str()).collect(),
        caller.scopes.iter().map(String::as_str).collect(),
    )
}

#[tokio::test]
async fn valid_tokens_become_agents_by_claims_and_subject_table() {
    let ed = SigningKey::ed25519("ed-1");
    let ec = SigningKey::p256("ec-1");
    let issuer = TestIssuer::start(&[&ed, &ec]).await;
    let mut config = config(&issuer);
    config.subjects = vec![SubjectEntry {
        subject: "mapped".into(),
        owner: "bob".into(),
        projects: vec!["research".into()],
    }];
    config.projects_claim = Some("projects".into());
    let auth = started(&config).await;

    let plain = ed.sign(&issuer.claims(AUDIENCE, "assistant", READ_RUN));
    let principal = auth.authenticate(&plain).await.expect("EdDSA accepted");
    assert_eq!(
        agent(&principal),
        (
            "alice",
            "assistant",
            vec!["p1"],
            vec!["osfoundry:read", "osfoundry:run"]
        )
    );
    // ES256, scopes as `scp` (an array), projects from the claim.
    let mut claims = issuer.claims(AUDIENCE, "other", "");
    claims.as_object_mut().unwrap().remove("scope");
    claims["scp"] = json!(["osfoundry:read"]);
    claims["projects"] = json!(["p2", "p3"]);
    let principal = auth.authenticate(&ec.sign(&claims)).await.expect("ES256");
    assert_eq!(
        agent(&principal),
        ("alice", "other", vec!["p2", "p3"], vec!["osfoundry:read"])
    );
    // The subject table wins over claims and defaults.
    let principal = auth
        .authenticate(&ed.sign(&issuer.claims(AUDIENCE, "mapped", "osfoundry:read")))
        .await
        .unwrap();
    assert_eq!(
        agent(&principal),
        ("bob", "mapped", vec!["research"], vec!["osfoundry:read"])
    );
    // Named by client_id instead of sub.
    config.agent_claim = "client_id".into();
    let by_client = started(&config).await;
    let mut claims = issuer.claims(AUDIENCE, "user-7", READ_RUN);
    claims["client_id"] = json!("connector");
    let principal = by_client.authenticate(&ed.sign(&claims)).await.unwrap();
    assert_eq!(agent(&principal).1, "connector");
}

#[tokio::test]
async fn every_bad_token_is_refused_with_its_reason() {
    let ed = SigningKey::ed25519("ed-1");
    let other = SigningKey::ed25519("ed-1");
    let issuer = TestIssuer::start(&[&ed]).await;
    let auth = started(&config(&issuer)).await;
    let good = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut claims = good.clone();
        edit(&mut claims);
        claims
    };
    let refusal = |token: String| {
        let auth = auth.clone();
        async move {
            match auth.authenticate(&token).await {
                Err(AuthError::Refused(r)) => r,
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    };
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["aud"] = json!("https://elsewhere/mcp")))).await,
        TokenRefusal::Audience(AUDIENCE.into())
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["iss"] = json!("https://other-issuer")))).await,
        TokenRefusal::Issuer
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["exp"] = json!(now() - 3600)))).await,
        TokenRefusal::Expired
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["nbf"] = json!(now() + 3600)))).await,
        TokenRefusal::NotYetValid
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["iat"] = json!(now() + 3600)))).await,
        TokenRefusal::IssuedInFuture
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| {
            c.as_object_mut().unwrap().remove("iat");
        })))
        .await,
        TokenRefusal::MissingClaim("iat".into())
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| {
            c.as_object_mut().unwrap().remove("aud");
        })))
        .await,
        TokenRefusal::MissingClaim("aud".into())
    );
    // Within the clock skew (60 s): still accepted.
    assert!(
        auth.authenticate(&ed.sign(&with(&|c| c["exp"] = json!(now() - 30))))
            .await
            .is_ok()
    );
    assert_eq!(refusal(unsigned(&good)).await, TokenRefusal::Malformed);
    assert_eq!(
        refusal(hs256(&good, &ed.public, "ed-1")).await,
        TokenRefusal::Algorithm("HS256".into())
    );
    // Same kid, another private key: a forged signature.
    assert_eq!(refusal(other.sign(&good)).await, TokenRefusal::Signature);
    // A valid token with its payload swapped.
    let token = ed.sign(&good);
    let forged_payload = ed.sign(&with(&|c| c["sub"] = json!("root")));
    let mut parts: Vec<&str> = token.split('.').collect();
    parts[1] = forged_payload.split('.').nth(1).unwrap();
    assert_eq!(refusal(parts.join(".")).await, TokenRefusal::Signature);
    // An ID token or any JWT whose typ is not at+jwt.
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("ed-1".into());
    header.typ = Some("JWT".into());
    let id_token = jsonwebtoken::encode(&header, &good, &ed.key).unwrap();
    assert_eq!(
        refusal(id_token).await,
        TokenRefusal::TokenType("JWT".into())
    );
    assert_eq!(
        refusal(ed.sign(&with(&|c| c["sub"] = json!("bad name")))).await,
        TokenRefusal::BadClaim {
            claim: "sub".into(),
            rule: "must be 1 to 128 characters of letters, digits and `._:@-`".into()
        }
    );
    // A key that is not published.
    let stranger = SigningKey::ed25519("ed-unknown");
    assert_eq!(
        refusal(stranger.sign(&good)).await,
        TokenRefusal::UnknownKey
    );
}

#[tokio::test]
async fn owner_is_required_and_configured_algorithms_only() {
    let ed = SigningKey::ed25519("ed-1");
    let ec = SigningKey::p256("ec-1");
    let issuer = TestIssuer::start(&[&ed, &ec]).await;
    let mut config = config(&issuer);
    config.owner = None;
    config.owner_claim = Some("owner".into());
    config.algorithms = vec!["EdDSA".into()];
    let auth = started(&config).await;
    let mut claims = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    assert!(matches!(
        auth.authenticate(&ed.sign(&claims)).await,
        Err(AuthError::Refused(TokenRefusal::NoOwner))
    ));
    claims["owner"] = json!("carol");
    let principal = auth.authenticate(&ed.sign(&claims)).await.unwrap();
    assert_eq!(agent(&principal).0, "carol");
    assert!(matches!(
        auth.authenticate(&ec.sign(&claims)).await,
        Err(AuthError::Refused(TokenRefusal::Algorithm(a))) if a == "ES256"
    ));
}

#[tokio::test]
async fn rotation_is_picked_up_and_a_removed_key_stops_verifying() {
    let old = SigningKey::ed25519("k-old");
    let new = SigningKey::ed25519("k-new");
    let issuer = TestIssuer::start(&[&old]).await;
    let auth = started(&config(&issuer)).await;
    let claims = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    let old_token = old.sign(&claims);
    assert!(auth.authenticate(&old_token).await.is_ok());
    let fetched = issuer.jwks_fetches();
    issuer.publish(&[&new]);
    // A token with the new kid triggers one refetch and is accepted.
    assert!(auth.authenticate(&new.sign(&claims)).await.is_ok());
    assert_eq!(issuer.jwks_fetches(), fetched + 1);
    // The old key is no longer published: its tokens, even one verified
    // before, are refused.
    assert!(matches!(
        auth.authenticate(&old_token).await,
        Err(AuthError::Refused(TokenRefusal::UnknownKey))
    ));
}

#[tokio::test]
async fn unknown_kids_refetch_at_most_once_per_interval() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    let mut config = config(&issuer);
    config.jwks_refetch_min_seconds = 3600;
    let auth = started(&config).await;
    let fetched = issuer.jwks_fetches();
    let claims = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    for i in 0..20 {
        let stranger = SigningKey::ed25519(&format!("unknown-{i}"));
        assert!(matches!(
            auth.authenticate(&stranger.sign(&claims)).await,
            Err(AuthError::Refused(TokenRefusal::UnknownKey))
        ));
    }
    assert_eq!(
        issuer.jwks_fetches(),
        fetched,
        "the startup fetch is recent: no refetch"
    );
}

#[tokio::test]
async fn keys_are_kept_as_long_as_cache_control_allows() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    issuer.cache_control(Some("public, max-age=1"));
    let auth = started(&config(&issuer)).await;
    let first = issuer.jwks_fetches();
    let claims = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    let token = key.sign(&claims);
    let principal = auth.authenticate(&token).await.unwrap();
    let hash = hash_token(&token);
    let deadline = Instant::now() + Duration::from_secs(10);
    while issuer.jwks_fetches() < first + 2 {
        assert!(Instant::now() < deadline, "keys were not refreshed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A refresh with the same key keeps what it verified (held requests and
    // sessions are not ended by it); a refresh without the key forgets it.
    assert!(auth.still_valid(&hash, &principal).await);
    let fetched = issuer.jwks_fetches();
    issuer.publish(&[&SigningKey::ed25519("k2")]);
    while issuer.jwks_fetches() < fetched + 2 {
        assert!(Instant::now() < deadline, "keys were not refreshed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!auth.still_valid(&hash, &principal).await);
    // A long max-age: no refresh for the test's duration.
    let issuer = TestIssuer::start(&[&key]).await;
    issuer.cache_control(Some("max-age=3600"));
    let _auth = started(&config(&issuer)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(issuer.jwks_fetches(), 1);
    drop(auth);
}

/// `Cache-Control: no-cache` (Keycloak's JWKS) gives the keys no lifetime:
/// they are kept `jwks_cache_seconds`, not fetched again every second, and
/// a rotated key still comes in through the rate-limited refetch.
#[tokio::test]
async fn a_no_cache_jwks_is_kept_for_the_configured_time() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    issuer.cache_control(Some("no-cache"));
    let mut config = config(&issuer);
    config.jwks_refetch_min_seconds = 1;
    let auth = started(&config).await;
    assert_eq!(issuer.jwks_fetches(), 1);
    let until = Instant::now() + Duration::from_millis(3500);
    let mut i = 0;
    while Instant::now() < until {
        let token = key.sign(&issuer.claims(AUDIENCE, &format!("agent-{i}"), READ_RUN));
        auth.authenticate(&token).await.expect("valid token");
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        issuer.jwks_fetches(),
        1,
        "a no-cache JWKS was fetched again within jwks_cache_seconds ({i} token checks)"
    );
    // A rotation: the new key is fetched for its first token, once.
    let next = SigningKey::ed25519("k2");
    issuer.publish(&[&key, &next]);
    let claims = issuer.claims(AUDIENCE, "assistant", READ_RUN);
    auth.authenticate(&next.sign(&claims))
        .await
        .expect("the rotated key is fetched");
    assert_eq!(issuer.jwks_fetches(), 2);
    let stranger = SigningKey::ed25519("unknown");
    assert!(matches!(
        auth.authenticate(&stranger.sign(&claims)).await,
        Err(AuthError::Refused(TokenRefusal::UnknownKey))
    ));
    assert_eq!(issuer.jwks_fetches(), 2, "refetches stay rate-limited");
}

async fn oneshot(state: &HttpState, token: Option<&str>) -> (StatusCode, String, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let mut request = Request::post("/mcp")
        .header(header::HOST, "127.0.0.1:8787")
        .header(header::CONTENT_TYPE, "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = router(state.clone())
        .oneshot(request.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        challenge,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn state(auth: Arc<dyn Authenticator>) -> HttpState {
    let queue = Queue::new(
        Arc::new(MemoryStore::new()),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let mcp = McpServer::new(
        queue,
        ToolCatalog::default(),
        ServerInfo::new("graph-relay", "test"),
    );
    HttpState::new(
        mcp,
        auth,
        HttpConfig {
            listen_addr: Some("127.0.0.1:8787".parse().unwrap()),
            ..HttpConfig::default()
        },
    )
}

#[tokio::test]
async fn http_answers_401_with_the_reason_and_503_until_keys_load() {
    // Reserve a port where nothing answers yet.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}");
    let mut config = OAuthConfig::new(&url);
    config.owner = Some("alice".into());
    config.jwks_refetch_min_seconds = 0;
    let auth = OAuthAuthenticator::start(&config, AUDIENCE).unwrap();
    let state = state(Arc::new(auth.clone()));
    let key = SigningKey::ed25519("k1");
    let claims = json!({"iss": url, "aud": AUDIENCE, "sub": "assistant", "scope": READ_RUN, "iat": now(), "exp": now() + 600});
    let token = key.sign(&claims);
    let (status, _, body) = oneshot(&state, Some(&token)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "temporarily_unavailable");
    assert!(!auth.keys_loaded());
    // The authorization server comes up: the loader's retry finds it.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let issuer = TestIssuer::serve_on(listener, &[&key]).await;
    assert!(auth.wait_until_ready(Duration::from_secs(15)).await);
    let (status, _, body) = oneshot(&state, Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Refusals: 401 with the reason and the metadata URL.
    let expired = key.sign(&json!({"iss": url, "aud": AUDIENCE, "sub": "assistant", "iat": now() - 7200, "exp": now() - 3600}));
    let (status, challenge, body) = oneshot(&state, Some(&expired)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp\", error=\"invalid_token\", error_description=\"the token has expired\""
    );
    assert_eq!(body["error_description"], "the token has expired");
    let (status, challenge, _) = oneshot(&state, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(challenge.starts_with("Bearer resource_metadata="));
    drop(issuer);
}

#[tokio::test]
async fn opaque_tokens_are_introspected_and_cached() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    let mut config = config(&issuer);
    config.introspection = Some(IntrospectionConfig::new(RS_CLIENT.0, RS_CLIENT.1));
    let auth = started(&config).await;
    let active = |aud: &str| json!({"active": true, "iss": issuer.url, "aud": [aud], "sub": "assistant", "client_id": "c", "scope": READ_RUN, "exp": now() + 600, "iat": now()});
    issuer.opaque("opaque-good", active(AUDIENCE));
    issuer.opaque("opaque-other-aud", active("https://elsewhere/mcp"));
    // Client credentials: no `sub`, the client is the agent.
    issuer.opaque("opaque-client", json!({"active": true, "iss": issuer.url, "aud": AUDIENCE, "client_id": "connector", "scope": READ_RUN, "exp": now() + 600}));
    issuer.opaque("opaque-nobody", json!({"active": true, "iss": issuer.url, "aud": AUDIENCE, "scope": READ_RUN, "exp": now() + 600}));
    issuer.opaque("opaque-expired", json!({"active": true, "iss": issuer.url, "aud": AUDIENCE, "sub": "assistant", "exp": now() - 3600}));
    let principal = auth.authenticate("opaque-good").await.unwrap();
    assert_eq!(agent(&principal).1, "assistant");
    assert_eq!(issuer.introspections(), 1);
    assert!(auth.authenticate("opaque-good").await.is_ok());
    assert_eq!(issuer.introspections(), 1, "answered from the cache");
    let principal = auth.authenticate("opaque-client").await.unwrap();
    assert_eq!(agent(&principal).1, "connector");
    assert_eq!(
        auth.authenticate("opaque-nobody").await,
        Err(AuthError::Refused(TokenRefusal::MissingClaim("sub".into())))
    );
    assert!(matches!(
        auth.authenticate("opaque-unknown").await,
        Err(AuthError::Refused(TokenRefusal::Inactive))
    ));
    assert!(matches!(
        auth.authenticate("opaque-other-aud").await,
        Err(AuthError::Refused(TokenRefusal::Audience(_)))
    ));
    assert!(matches!(
        auth.authenticate("opaque-expired").await,
        Err(AuthError::Refused(TokenRefusal::Expired))
    ));
    // Wrong client credentials: the endpoint refuses us, which is a 503 (not the token's fault).
    let mut wrong = config.clone();
    wrong.introspection.as_mut().unwrap().client_secret = "nope".into();
    let wrong = started(&wrong).await;
    assert!(matches!(
        wrong.authenticate("opaque-good").await,
        Err(AuthError::Unavailable(_))
    ));
    // Without introspection an opaque token is simply unknown.
    let plain = started(&self::config(&issuer)).await;
    assert_eq!(
        plain.authenticate("opaque-good").await,
        Err(AuthError::InvalidToken)
    );
}

/// Both lengths of the introspection cache are settings: an active answer
/// is asked again after `active_cache_seconds` (so a token revoked at the
/// authorization server stops working that soon, not at its `exp`), and an
/// inactive one after `inactive_cache_seconds`.
#[tokio::test]
async fn the_introspection_cache_lengths_are_settings() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    let mut config = config(&issuer);
    let mut introspection = IntrospectionConfig::new(RS_CLIENT.0, RS_CLIENT.1);
    introspection.active_cache_seconds = Some(1);
    introspection.inactive_cache_seconds = 1;
    config.introspection = Some(introspection);
    let auth = started(&config).await;
    issuer.opaque("opaque-good", json!({"active": true, "iss": issuer.url, "aud": [AUDIENCE], "sub": "assistant", "scope": READ_RUN, "exp": now() + 600}));
    assert!(auth.authenticate("opaque-good").await.is_ok());
    assert!(auth.authenticate("opaque-unknown").await.is_err());
    assert!(auth.authenticate("opaque-good").await.is_ok());
    assert!(auth.authenticate("opaque-unknown").await.is_err());
    assert_eq!(issuer.introspections(), 2, "both answered from the cache");
    // Whole seconds: past the next second boundary both are asked again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(auth.authenticate("opaque-good").await.is_ok());
    assert!(auth.authenticate("opaque-unknown").await.is_err());
    assert_eq!(issuer.introspections(), 4, "both asked again");

    // Out of range: refused when the server starts.
    let mut long = config.clone();
    long.introspection.as_mut().unwrap().inactive_cache_seconds = 86_401;
    assert!(long.validate().is_err());
}

#[tokio::test]
async fn static_and_oauth_side_by_side_share_one_identity() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    let oauth = started(&config(&issuer)).await;
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "assistant".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec!["osfoundry:read".into(), "osfoundry:run".into()],
            token_sha256: hash_token("gra_static"),
            revoked: false,
        }],
        devices: vec![],
    };
    let chain = AuthChain::new(vec![
        Arc::new(StaticTokens::new(&tokens).unwrap()),
        Arc::new(oauth),
    ]);
    let from_file = chain.authenticate("gra_static").await.unwrap();
    let jwt = key.sign(&issuer.claims(AUDIENCE, "assistant", READ_RUN));
    let from_oauth = chain.authenticate(&jwt).await.unwrap();
    assert_eq!(
        from_file, from_oauth,
        "the same (owner, name), projects and scopes"
    );
    assert_eq!(
        chain.authenticate("gra_unknown").await,
        Err(AuthError::InvalidToken)
    );
    let expired = key.sign(&json!({"iss": issuer.url, "aud": AUDIENCE, "sub": "assistant", "iat": now() - 7200, "exp": now() - 3600}));
    assert_eq!(
        chain.authenticate(&expired).await,
        Err(AuthError::Refused(TokenRefusal::Expired))
    );
    // Held requests stay valid for both kinds.
    assert!(chain.still_valid(&hash_token(&jwt), &from_oauth).await);
    assert!(
        chain
            .still_valid(&hash_token("gra_static"), &from_file)
            .await
    );
    assert!(!chain.still_valid(&hash_token("gra_gone"), &from_file).await);
}

#[tokio::test]
async fn what_the_authorization_server_sends_is_checked_and_bounded() {
    let key = SigningKey::ed25519("k1");
    let issuer = TestIssuer::start(&[&key]).await;
    // Metadata for another issuer (here: the same URL spelled with a slash).
    let mut other = config(&issuer);
    other.issuer = format!("{}/", issuer.url);
    let auth = OAuthAuthenticator::start(&other, AUDIENCE).unwrap();
    assert!(!auth.wait_until_ready(Duration::from_secs(2)).await);
    // A JWKS larger than 256 KiB is not read.
    let huge: Vec<SigningKey> = (0..2000)
        .map(|i| {
            let mut k = key.clone();
            k.jwk["kid"] = json!(format!("padding-key-{i:04}-{}", "x".repeat(100)));
            k
        })
        .collect();
    issuer.publish(&huge.iter().collect::<Vec<_>>());
    let auth = OAuthAuthenticator::start(&config(&issuer), AUDIENCE).unwrap();
    assert!(!auth.wait_until_ready(Duration::from_secs(2)).await);
    let token = key.sign(&issuer.claims(AUDIENCE, "assistant", READ_RUN));
    assert!(matches!(
        auth.authenticate(&token).await,
        Err(AuthError::Unavailable(_))
    ));
    // An empty key set is no key set.
    issuer.publish(&[]);
    let auth = OAuthAuthenticator::start(&config(&issuer), AUDIENCE).unwrap();
    assert!(!auth.wait_until_ready(Duration::from_secs(2)).await);
}
