//! The composable surface: the route sets mounted on their own next to an
//! integrator's routes, the caller extractors, an authenticator with its
//! own credentials and challenge, and the public MCP header rules.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use common::*;
use graph_relay_core::mcp::{Incoming, McpServer, McpSession, ProtocolVersion};
use graph_relay_transport_http::auth::{Authenticated, StaticTokens, bearer_token, hash_token};
use graph_relay_transport_http::mcp_headers::{self, McpHeaderError, McpRoute};
use graph_relay_transport_http::oauth::AuthChain;
use graph_relay_transport_http::relay_wire::RELAY_PREFIX;
use graph_relay_transport_http::{
    AgentPrincipal, DevicePrincipal, HttpConfig, HttpState,
    auth::{AuthError, Authenticator, Challenge, Principal},
    mcp_routes, metadata_routes, relay_routes,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn whoami(AgentPrincipal { caller, .. }: AgentPrincipal) -> String {
    format!(
        "{}/{}",
        caller.agent.owner.as_str(),
        caller.agent.id.as_str()
    )
}

async fn device(DevicePrincipal { device, .. }: DevicePrincipal) -> String {
    format!("{}/{}", device.owner.as_str(), device.id.as_str())
}

/// `/mcp` and two routes of the integrator's own; no relay API.
fn app(state: HttpState) -> Router {
    Router::new()
        .route("/whoami", get(whoami))
        .route("/device", get(device))
        .with_state(state.clone())
        .merge(mcp_routes(state))
}

async fn call(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

fn get_with(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get(path).header("host", HOST);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.body(Body::empty()).unwrap()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn mcp_routes_alone_serve_mcp_next_to_the_integrators_routes() {
    let state = static_state(HttpConfig::default()).await;
    let app = app(state.clone());
    let (body, headers) = modern("tools/list", json!({}));
    let mut request = post(Some(FULL), &[], body);
    for (k, v) in &headers {
        request.headers_mut().insert(
            k.parse::<axum::http::HeaderName>().unwrap(),
            v.parse().unwrap(),
        );
    }
    let (status, _, text) = call(&app, request).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("run_graph_session"));
    // Only what was mounted: no relay API, no metadata.
    let sync = Request::post(format!("{RELAY_PREFIX}/sync"))
        .header("host", HOST)
        .header("authorization", bearer(DEVICE))
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(call(&app, sync).await.0, StatusCode::NOT_FOUND);
    // The Host rule comes with the routes.
    let (status, _, _) = call(
        &app,
        Request::post("/mcp")
            .header("host", "evil.example")
            .header("authorization", bearer(FULL))
            .body(Body::from("{}"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The other route sets mount the same way.
    let relay = relay_routes(state.clone()).merge(metadata_routes(state));
    let (status, _, text) = call(
        &relay,
        get_with("/.well-known/oauth-protected-resource/mcp", &[]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, _, text) = call(
        &relay,
        Request::post(format!("{RELAY_PREFIX}/sync"))
            .header("host", HOST)
            .header("authorization", bearer(FULL))
            .header("content-type", "application/json")
            .body(Body::from(r#"{"project_id":"p1"}"#))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
}

#[tokio::test]
async fn extractors_give_the_caller_and_refuse_as_the_server_does() {
    let app = app(static_state(HttpConfig::default()).await);
    let (status, _, text) = call(
        &app,
        get_with("/whoami", &[("authorization", &bearer(FULL))]),
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "alice/assistant"));
    let (status, _, text) = call(
        &app,
        get_with("/whoami", &[("authorization", &bearer(BOB))]),
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "bob/assistant"));

    // No token, an unknown one, a device's: 401 with the bearer challenge.
    for headers in [
        vec![],
        vec![("authorization", bearer("nope"))],
        vec![("authorization", bearer(DEVICE))],
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, h, _) = call(&app, get_with("/whoami", &headers)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{headers:?}");
        let challenge = h["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with("Bearer resource_metadata="),
            "{challenge}"
        );
    }

    let (status, _, text) = call(
        &app,
        get_with("/device", &[("authorization", &bearer(DEVICE))]),
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "alice/desktop"));
    let (status, _, text) = call(
        &app,
        get_with("/device", &[("authorization", &bearer(FULL))]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(text.contains("device_token_required"), "{text}");
}

/// Agents known by an `X-Key` header; its own challenge.
struct HeaderKeys(StaticTokens);

#[async_trait]
impl Authenticator for HeaderKeys {
    async fn authenticate(&self, _token: &str) -> Result<Principal, AuthError> {
        Err(AuthError::InvalidToken)
    }

    async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        let key = headers
            .get("x-key")
            .ok_or(AuthError::MissingCredentials)?
            .to_str()
            .map_err(|_| AuthError::MalformedCredentials("not ASCII".into()))?;
        Ok(Authenticated {
            principal: self.0.authenticate(key).await?,
            token_sha256: Some(hash_token(key)),
        })
    }

    fn challenge(&self, challenge: &Challenge<'_>) -> Response {
        let mut response = challenge.response("Key header=\"X-Key\"");
        response
            .headers_mut()
            .insert("x-why", HeaderValue::from_static("custom"));
        response.into_response()
    }
}

#[tokio::test]
async fn an_authenticator_reads_its_own_header_and_writes_its_own_challenge() {
    let auth = HeaderKeys(StaticTokens::new(&tokens()).unwrap());
    let config = HttpConfig {
        listen_addr: Some(HOST.parse().unwrap()),
        ..HttpConfig::default()
    };
    let app = app(state(config, Arc::new(auth)).await);
    let (status, _, text) = call(&app, get_with("/whoami", &[("x-key", FULL)])).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "alice/assistant"));
    // A bearer token means nothing to it.
    let (status, headers, text) = call(
        &app,
        post(
            Some(FULL),
            &[],
            initialize_body(&json!({"name": "t", "version": "1"})),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Key header=\"X-Key\"");
    assert_eq!(headers["x-why"], "custom");
    assert_eq!(headers["connection"], "close");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"], "unauthorized");
    let (status, headers, text) = call(&app, get_with("/whoami", &[("x-key", "wrong")])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Key header=\"X-Key\"");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"], "invalid_token");
}

#[tokio::test]
async fn a_chain_asks_each_source_its_own_way() {
    let keys: Arc<dyn Authenticator> = Arc::new(HeaderKeys(StaticTokens::new(&tokens()).unwrap()));
    let bearer_tokens: Arc<dyn Authenticator> = Arc::new(StaticTokens::new(&tokens()).unwrap());
    let chain = AuthChain::new(vec![keys, bearer_tokens]);
    let config = HttpConfig {
        listen_addr: Some(HOST.parse().unwrap()),
        ..HttpConfig::default()
    };
    let app = app(state(config, Arc::new(chain)).await);
    let (status, _, text) = call(&app, get_with("/whoami", &[("x-key", BOB)])).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "bob/assistant"));
    let (status, _, text) = call(
        &app,
        get_with("/whoami", &[("authorization", &bearer(FULL))]),
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "alice/assistant"));
    // Neither: the first source's challenge.
    let (status, headers, text) = call(&app, get_with("/whoami", &[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Key header=\"X-Key\"");
    assert!(text.contains("\"unauthorized\""), "{text}");
    // An unknown key outranks a missing bearer token.
    let (status, _, text) = call(&app, get_with("/whoami", &[("x-key", "wrong")])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(text.contains("\"invalid_token\""), "{text}");
}

#[tokio::test]
async fn the_default_request_authentication_reads_the_bearer_token() {
    let auth = StaticTokens::new(&tokens()).unwrap();
    let mut headers = HeaderMap::new();
    assert_eq!(
        auth.authenticate_request(&headers).await,
        Err(AuthError::MissingCredentials)
    );
    headers.insert("authorization", HeaderValue::from_static("Basic YTpi"));
    assert!(matches!(
        auth.authenticate_request(&headers).await,
        Err(AuthError::MalformedCredentials(_))
    ));
    assert!(bearer_token(&headers).is_err());
    headers.insert(
        "authorization",
        HeaderValue::from_str(&bearer(FULL)).unwrap(),
    );
    let who = auth.authenticate_request(&headers).await.unwrap();
    assert_eq!(who.token_sha256, Some(hash_token(FULL)));
    assert!(matches!(who.principal, Principal::Agent(c) if c.agent.id.as_str() == "assistant"));
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), HeaderValue::from_static(v)))
        .collect()
}

fn incoming(body: Value) -> Incoming {
    Incoming::parse(body.to_string().as_bytes()).unwrap()
}

#[test]
fn the_header_rules_route_each_kind_of_message() {
    let none = HeaderMap::new();
    let init = incoming(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert_eq!(mcp_headers::route(&none, &init), Ok(McpRoute::Initialize));
    let list = incoming(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    assert_eq!(
        mcp_headers::route(&none, &list),
        Err(McpHeaderError::MissingSession)
    );
    let in_session = headers(&[("mcp-session-id", "abc")]);
    assert_eq!(
        mcp_headers::route(&in_session, &list),
        Ok(McpRoute::Session("abc"))
    );
    let note = incoming(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(mcp_headers::route(&none, &note), Ok(McpRoute::NoReply));
    let ping = incoming(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
    assert_eq!(
        mcp_headers::route(&none, &ping),
        Ok(McpRoute::SessionlessPing)
    );

    let (body, _) = modern(
        "tools/call",
        json!({"name": "get_graph_run", "arguments": {}}),
    );
    let call: Incoming = Incoming::parse(body.as_bytes()).unwrap();
    let wrong_name = headers(&[
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "run_graph_session"),
    ]);
    let refused = mcp_headers::route(&wrong_name, &call).unwrap_err();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert_eq!(refused.to_outgoing().message()["error"]["code"], -32020);
    assert_eq!(refused.to_outgoing().message()["id"], 9);
    let right = headers(&[
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "=?base64?Z2V0X2dyYXBoX3J1bg==?="),
    ]);
    assert_eq!(mcp_headers::route(&right, &call), Ok(McpRoute::Stateless));

    let v = ProtocolVersion::parse("2025-11-25");
    assert_eq!(mcp_headers::check_session_version(&none, &list, v), Ok(()));
    let other = headers(&[("mcp-protocol-version", "2025-06-18")]);
    let refused = mcp_headers::check_session_version(&other, &list, v).unwrap_err();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert!(refused.to_string().contains("2025-11-25"), "{refused}");
    let response = McpHeaderError::SessionNotFound { id: None }.into_response();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn handling_a_message_is_send() {
    fn assert_send<T: Send>(t: T) -> T {
        t
    }
    let state = static_state(HttpConfig::default()).await;
    let server: McpServer = state.mcp().clone();
    let caller = match StaticTokens::new(&tokens())
        .unwrap()
        .authenticate(FULL)
        .await
        .unwrap()
    {
        Principal::Agent(caller) => caller,
        Principal::Device(_) => unreachable!("FULL is an agent token"),
    };
    let reply = tokio::spawn(async move {
        let mut session = McpSession::new();
        assert_send(server.handle(
            &mut session,
            &caller,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ))
        .await
    })
    .await
    .unwrap();
    assert!(reply.is_some());
}
