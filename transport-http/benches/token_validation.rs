#![allow(missing_docs)] // criterion macros generate undocumented items
//! What a bearer token costs per request: the static token file's lookup
//! against OAuth JWT validation with the keys cached, for RS256, ES256 and
//! EdDSA, on a token seen for the first time (signature checked) and on a
//! token seen before (answered from the verified-token cache).
//!
//! `cargo bench -p graph-relay-transport-http --bench token_validation`
//!
//! RS256 needs `openssl` on the PATH to make a key (ring cannot); without
//! it that group is left out.

#[path = "../tests/common/issuer.rs"]
mod issuer;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use graph_relay_transport_http::auth::Authenticator;
use graph_relay_transport_http::auth::{AgentToken, StaticTokens, TokenConfig, hash_token};
use graph_relay_transport_http::oauth::{OAuthAuthenticator, OAuthConfig};
use issuer::{SigningKey, TestIssuer};
use serde_json::json;

const AUDIENCE: &str = "http://127.0.0.1:8787/mcp";

/// A 2048-bit RSA key as PKCS#1 DER, from `openssl`.
fn rsa_key() -> Option<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("graph-relay-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let pem = dir.join("key.pem");
    let der = dir.join("key.der");
    let ok = std::process::Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&pem)
        .arg("2048")
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?
        .success()
        && std::process::Command::new("openssl")
            .args(["rsa", "-traditional", "-outform", "DER", "-in"])
            .arg(&pem)
            .arg("-out")
            .arg(&der)
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?
            .success();
    let bytes = ok.then(|| std::fs::read(&der).ok()).flatten();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut keys = vec![SigningKey::ed25519("ed"), SigningKey::p256("ec")];
    if let Some(der) = rsa_key() {
        keys.push(SigningKey::rsa("rsa", &der));
    }
    let refs: Vec<&SigningKey> = keys.iter().collect();
    let issuer = runtime.block_on(TestIssuer::start(&refs));
    let mut config = OAuthConfig::new(&issuer.url);
    config.owner = Some("alice".into());
    config.projects = vec!["p1".into()];
    let oauth = runtime.block_on(async {
        let auth = OAuthAuthenticator::start(&config, AUDIENCE).expect("start");
        assert!(auth.wait_until_ready(Duration::from_secs(10)).await);
        auth
    });
    let tokens = TokenConfig {
        agents: vec![AgentToken {
            name: "assistant".into(),
            owner: "alice".into(),
            projects: vec!["p1".into()],
            scopes: vec!["osfoundry:read".into(), "osfoundry:run".into()],
            token_sha256: hash_token("gra_static_token_of_the_bench"),
            revoked: false,
        }],
        devices: vec![],
    };
    let file = StaticTokens::new(&tokens).expect("tokens");

    let mut group = c.benchmark_group("token_validation");
    group.bench_function("static_token", |b| {
        b.iter(|| {
            runtime
                .block_on(file.authenticate(black_box("gra_static_token_of_the_bench")))
                .expect("valid")
        })
    });
    let serial = AtomicU64::new(0);
    for key in &keys {
        let claims = |jti: u64| {
            let mut claims = issuer.claims(AUDIENCE, "assistant", "osfoundry:read osfoundry:run");
            claims["jti"] = json!(jti);
            claims
        };
        let seen = key.sign(&claims(u64::MAX));
        runtime
            .block_on(oauth.authenticate(&seen))
            .expect("valid token");
        group.bench_function(format!("jwt_{:?}_repeat", key.alg), |b| {
            b.iter(|| {
                runtime
                    .block_on(oauth.authenticate(black_box(&seen)))
                    .expect("valid")
            })
        });
        group.bench_function(format!("jwt_{:?}_first_sight", key.alg), |b| {
            b.iter_batched(
                || key.sign(&claims(serial.fetch_add(1, Ordering::Relaxed))),
                |token| {
                    runtime
                        .block_on(oauth.authenticate(black_box(&token)))
                        .expect("valid")
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    drop(issuer);
}

criterion_group!(benches, bench);
criterion_main!(benches);
