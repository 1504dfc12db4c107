//! A server of an integrator's own, built from the library with API-key
//! authentication.
//!
//! [`Server::builder`] serves the MCP endpoint and the relay API next to a
//! route of its own (`/whoami`), on a queue in memory, with everything a
//! real server runs: the queue's maintenance (a run whose desktop stops
//! reporting ends `failed` when its lease lapses; coalesced progress is
//! written), the bounded edge (connection cap, header-read and idle
//! timeouts), the revocation watch and graceful shutdown on Ctrl-C.
//! Agents and the desktop send `X-Api-Key: <key>` instead of an OAuth
//! bearer token; a request without a valid key gets this server's own 401
//! challenge (`WWW-Authenticate: ApiKey header="X-Api-Key"`).
//!
//! ```text
//! cargo run -p graph-relay-transport-http --example api_key_server
//! ```
//!
//! It prints its MCP URL and the two keys (set `AGENT_API_KEY` and
//! `DEVICE_API_KEY` to choose them). `cli/tests/api_key_example.rs` drives
//! [`builder`]'s server with the official Python MCP client, and
//! `transport-http/tests/embedded_server.rs` checks that it keeps leases,
//! progress and the edge.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_core::ids::InvalidId;
use graph_relay_core::mcp::{Caller, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_store_memory::MemoryStore;
use graph_relay_transport_http::auth::{Authenticated, TokenKind, hash_token, new_token};
use graph_relay_transport_http::shutdown_signal;
use graph_relay_transport_http::{
    AgentPrincipal, Server, ServerBuilder,
    auth::{AuthError, Authenticator, Challenge, Principal},
};

/// The header that carries the key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The challenge of this server's 401.
pub const API_KEY_CHALLENGE: &str = "ApiKey realm=\"graph-relay\", header=\"X-Api-Key\"";

/// API keys, kept as SHA-256 hashes, each for one agent or device.
#[derive(Debug, Default)]
pub struct ApiKeys {
    by_hash: HashMap<String, Principal>,
}

impl ApiKeys {
    /// Lets `key` act as `principal`.
    pub fn with_key(mut self, key: &str, principal: Principal) -> Self {
        self.by_hash.insert(hash_token(key), principal);
        self
    }
}

#[async_trait]
impl Authenticator for ApiKeys {
    /// Bearer tokens are not accepted here.
    async fn authenticate(&self, _token: &str) -> Result<Principal, AuthError> {
        Err(AuthError::InvalidToken)
    }

    async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        let key = headers
            .get(API_KEY_HEADER)
            .ok_or(AuthError::MissingCredentials)?
            .to_str()
            .map_err(|_| {
                AuthError::MalformedCredentials("X-Api-Key must be visible ASCII".into())
            })?;
        let hash = hash_token(key);
        let principal = self
            .by_hash
            .get(&hash)
            .cloned()
            .ok_or(AuthError::InvalidToken)?;
        Ok(Authenticated {
            principal,
            token_sha256: Some(hash),
        })
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        self.by_hash.get(token_sha256) == Some(principal)
    }

    fn challenge(&self, challenge: &Challenge<'_>) -> Response {
        let error = match challenge.error {
            None => "missing_api_key",
            Some(_) => "invalid_api_key",
        };
        let mut response = (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({
                "error": error,
                "message": format!("send a valid key in X-Api-Key ({})", challenge.message),
            })),
        )
            .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(API_KEY_CHALLENGE),
        );
        response
    }
}

/// `GET /whoami`: a route of this server's own, for agents.
async fn whoami(AgentPrincipal { caller, .. }: AgentPrincipal) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "owner": caller.agent.owner.as_str(),
        "agent": caller.agent.id.as_str(),
    }))
}

/// The whole server for `keys`: an in-memory queue, the MCP and relay
/// routes, and `/whoami`. Build it on a listener and serve it.
pub fn builder(keys: ApiKeys) -> ServerBuilder {
    Server::builder(Arc::new(MemoryStore::new()))
        .info(ServerInfo::new("api-key-example", "1"))
        .authenticator(Arc::new(keys))
        .routes(Router::new().route("/whoami", get(whoami)))
}

/// alice's agent `assistant` (project `p1`, read and run) and her desktop.
pub fn example_keys(agent_key: &str, device_key: &str) -> Result<ApiKeys, InvalidId> {
    let alice = OwnerId::parse("alice")?;
    let agent = Agent::new(
        AgentId::parse("assistant")?,
        alice.clone(),
        vec![ProjectId::parse("p1")?],
    );
    let desktop = Device::new(DeviceId::parse("desktop")?, alice);
    Ok(ApiKeys::default()
        .with_key(
            agent_key,
            Principal::Agent(Caller::new(
                agent,
                [READ_SCOPE, RUN_SCOPE].map(String::from),
            )),
        )
        .with_key(device_key, Principal::Device(desktop)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let key = |name: &str, kind| std::env::var(name).unwrap_or_else(|_| new_token(kind));
    let agent_key = key("AGENT_API_KEY", TokenKind::Agent);
    let device_key = key("DEVICE_API_KEY", TokenKind::Device);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = builder(example_keys(&agent_key, &device_key)?)
        .build(listener)
        .await?;
    let addr = server.local_addr();
    println!("MCP endpoint: http://{addr}/mcp");
    println!("agent key:    {agent_key}");
    println!("device key:   {device_key}");
    server.serve(shutdown_signal()).await?;
    Ok(())
}
