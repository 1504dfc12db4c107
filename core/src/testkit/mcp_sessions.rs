//! The [`McpSessionStore`] conformance functions (feature `testkit`): the
//! bounds, expiry, owner and token isolation, deletion and revocation that
//! every initialize-era session table keeps, whether in one process or
//! shared by a cluster. Time is passed in; nothing sleeps.
//!
//! Run them all with [`mcp_session_store_suite!`](crate::mcp_session_store_suite):
//!
//! ```ignore
//! graph_relay_core::mcp_session_store_suite!(futures::executor::block_on, async { MyTable::new() });
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::ids::{AgentId, OwnerId};
use crate::mcp::{
    Caller, McpSession, McpSessionCreateError, McpSessionLimits, McpSessionOwner, McpSessionStore,
};
use crate::principal::Agent;
use crate::time::Timestamp;

/// Runs every [`McpSessionStore`] conformance function as its own `#[test]`;
/// arguments as [`store_conformance_suite!`](crate::store_conformance_suite).
#[macro_export]
macro_rules! mcp_session_store_suite {
    ($block_on:path, $make:expr $(, #[$attr:meta])* $(,)?) => {
        $crate::mcp_session_store_suite!(@tests [$(#[$attr])*] $block_on, $make;
            mcp_session_round_trip, mcp_session_holder_isolation,
            mcp_session_per_agent_bound, mcp_session_global_bound, mcp_session_expiry,
            mcp_session_delete, mcp_session_revoked_holder, mcp_session_figures);
    };
    (@tests $attrs:tt $block_on:path, $make:expr; $($name:ident),*) => {
        $( $crate::mcp_session_store_suite!(@one $attrs $block_on, $make, $name); )*
    };
    (@one [$($attr:tt)*] $block_on:path, $make:expr, $name:ident) => {
        #[test]
        $($attr)*
        fn $name() {
            $block_on(async {
                let store: ::std::sync::Arc<dyn $crate::mcp::McpSessionStore> =
                    ::std::sync::Arc::new(($make).await);
                $crate::testkit::mcp_sessions::$name(store).await;
            });
        }
    };
}

fn id<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.expect("a valid literal id")
}

/// The holder `owner`/`agent` with token `token` (scopes `read`, `run`).
pub fn holder(owner: &str, agent: &str, token: &str) -> McpSessionOwner {
    McpSessionOwner {
        caller: Caller::new(
            Agent::new(
                id(AgentId::parse(agent)),
                id(OwnerId::parse(owner)),
                [super::p1()],
            ),
            ["read", "run"],
        ),
        token_sha256: Some(format!("{token:0>64}")),
    }
}

/// An initialized 2025-11-25 session whose `clientInfo` name is `name`.
pub fn initialized(name: &str) -> McpSession {
    let client_info = serde_json::json!({"name": name}).to_string();
    let state = serde_json::json!({
        "version": "2025-11-25", "initialized": true, "client_info": client_info,
    });
    McpSession::from_state(&state.to_string()).expect("a stored session")
}

/// A fresh, unique session id.
fn sid(n: u32) -> String {
    format!("{n:064x}")
}

fn at(seconds: u64) -> Timestamp {
    Timestamp(1_700_000_000_000 + seconds * 1000)
}

fn limits(max_sessions: usize, per_agent: usize, idle: Duration) -> McpSessionLimits {
    McpSessionLimits {
        max_sessions,
        max_sessions_per_agent: per_agent,
        idle_timeout: idle,
    }
}

const HOUR: Duration = Duration::from_secs(3600);

async fn create(
    store: &Arc<dyn McpSessionStore>,
    n: u32,
    who: &McpSessionOwner,
    l: &McpSessionLimits,
    now: Timestamp,
) {
    store
        .create(&sid(n), who, &initialized("c"), l, now)
        .await
        .expect("created");
}

async fn found(
    store: &Arc<dyn McpSessionStore>,
    n: u32,
    who: &McpSessionOwner,
    l: &McpSessionLimits,
    now: Timestamp,
) -> bool {
    store
        .get(&sid(n), who, l, now)
        .await
        .expect("looked up")
        .is_some()
}

/// A stored session reads back as it was written, and `put` replaces it.
pub async fn mcp_session_round_trip(store: Arc<dyn McpSessionStore>) {
    let l = McpSessionLimits::default();
    let alice = holder("alice", "assistant", "a");
    let fresh = McpSession::new();
    store
        .create(&sid(1), &alice, &fresh, &l, at(0))
        .await
        .expect("created");
    assert_eq!(
        store.get(&sid(1), &alice, &l, at(1)).await.expect("get"),
        Some(fresh)
    );
    let done = initialized("Claude");
    store.put(&sid(1), &alice, &done).await.expect("put");
    let back = store.get(&sid(1), &alice, &l, at(2)).await.expect("get");
    assert_eq!(back.as_ref(), Some(&done));
    assert_eq!(
        back.and_then(|s| s.client_info()),
        Some(serde_json::json!({"name": "Claude"}))
    );
}

/// Another owner's agent of the same name, another agent of the same owner
/// and another token of the same agent find nothing, change nothing and
/// delete nothing: exactly an unknown id.
pub async fn mcp_session_holder_isolation(store: Arc<dyn McpSessionStore>) {
    let l = McpSessionLimits::default();
    let alice = holder("alice", "assistant", "a");
    create(&store, 1, &alice, &l, at(0)).await;
    let strangers = [
        holder("mallory", "assistant", "a"),
        holder("alice", "other", "a"),
        holder("alice", "assistant", "b"),
    ];
    for other in &strangers {
        assert!(
            !found(&store, 1, other, &l, at(1)).await,
            "{other:?} found it"
        );
        assert!(!found(&store, 99, other, &l, at(1)).await);
        store
            .put(&sid(1), other, &McpSession::new())
            .await
            .expect("put");
        assert!(!store.delete(&sid(1), other).await.expect("delete"));
    }
    assert_eq!(
        store.get(&sid(1), &alice, &l, at(2)).await.expect("get"),
        Some(initialized("c")),
        "untouched by the others"
    );
}

/// Beyond `max_sessions_per_agent` the agent's least recently used session
/// goes, never another agent's.
pub async fn mcp_session_per_agent_bound(store: Arc<dyn McpSessionStore>) {
    let l = limits(100, 3, HOUR);
    let alice = holder("alice", "assistant", "a");
    let bob = holder("bob", "assistant", "b");
    create(&store, 100, &bob, &l, at(0)).await;
    for n in 1..=3 {
        create(&store, n, &alice, &l, at(u64::from(n))).await;
    }
    // Session 1 is used later than the last-use precision: now 2 is the oldest.
    assert!(found(&store, 1, &alice, &l, at(600)).await);
    create(&store, 4, &alice, &l, at(601)).await;
    assert!(!found(&store, 2, &alice, &l, at(602)).await, "LRU evicted");
    for n in [1, 3, 4] {
        assert!(found(&store, n, &alice, &l, at(602)).await, "session {n}");
    }
    assert!(
        found(&store, 100, &bob, &l, at(602)).await,
        "bob's untouched"
    );
}

/// At `max_sessions` an agent without sessions is refused and evicts no
/// one; an agent with sessions gives up its own oldest.
pub async fn mcp_session_global_bound(store: Arc<dyn McpSessionStore>) {
    let l = limits(2, 10, HOUR);
    let alice = holder("alice", "assistant", "a");
    let bob = holder("bob", "assistant", "b");
    create(&store, 1, &alice, &l, at(0)).await;
    create(&store, 2, &alice, &l, at(1)).await;
    match store
        .create(&sid(3), &bob, &initialized("b"), &l, at(2))
        .await
    {
        Err(McpSessionCreateError::Full(full)) => assert_eq!(full.limit, 2),
        other => panic!("expected Full, got {other:?}"),
    }
    assert!(found(&store, 1, &alice, &l, at(3)).await);
    assert!(found(&store, 2, &alice, &l, at(3)).await);
    assert!(!found(&store, 3, &bob, &l, at(3)).await);
    create(&store, 4, &alice, &l, at(4)).await;
    assert!(
        !found(&store, 1, &alice, &l, at(5)).await,
        "her oldest went"
    );
    assert!(found(&store, 2, &alice, &l, at(5)).await);
    assert!(found(&store, 4, &alice, &l, at(5)).await);
}

/// A session in use lives on; one idle for `idle_timeout` is never served
/// again, and a sweep deletes what expired.
pub async fn mcp_session_expiry(store: Arc<dyn McpSessionStore>) {
    let l = limits(100, 10, Duration::from_secs(60));
    let alice = holder("alice", "assistant", "a");
    create(&store, 1, &alice, &l, at(0)).await;
    create(&store, 2, &alice, &l, at(0)).await;
    // Used at 59 s and 118 s: each use keeps it (a use later than the
    // last-use precision is always recorded).
    assert!(found(&store, 1, &alice, &l, at(59)).await);
    assert!(found(&store, 1, &alice, &l, at(118)).await);
    assert!(!found(&store, 2, &alice, &l, at(118)).await, "idle 118 s");
    assert!(!found(&store, 1, &alice, &l, at(178)).await, "idle 60 s");
    assert!(
        !found(&store, 1, &alice, &l, at(120)).await,
        "an expired session stays gone"
    );
    create(&store, 3, &alice, &l, at(200)).await;
    create(&store, 4, &alice, &l, at(230)).await;
    assert!(store.sweep(&l, at(261)).await.expect("sweep") >= 1);
    assert!(!found(&store, 3, &alice, &l, at(262)).await);
    assert!(found(&store, 4, &alice, &l, at(262)).await);
}

/// `delete` ends a session of its holder; a second delete finds nothing.
pub async fn mcp_session_delete(store: Arc<dyn McpSessionStore>) {
    let l = McpSessionLimits::default();
    let alice = holder("alice", "assistant", "a");
    create(&store, 1, &alice, &l, at(0)).await;
    create(&store, 2, &alice, &l, at(0)).await;
    assert!(store.delete(&sid(1), &alice).await.expect("delete"));
    assert!(!found(&store, 1, &alice, &l, at(1)).await);
    assert!(!store.delete(&sid(1), &alice).await.expect("delete"));
    assert!(found(&store, 2, &alice, &l, at(1)).await);
}

/// The revocation check sees each token's holder; ending one holder ends
/// its sessions only.
pub async fn mcp_session_revoked_holder(store: Arc<dyn McpSessionStore>) {
    let l = McpSessionLimits::default();
    let old = holder("alice", "assistant", "a");
    let new = holder("alice", "assistant", "b");
    let anonymous = McpSessionOwner {
        token_sha256: None,
        ..holder("alice", "local", "c")
    };
    create(&store, 1, &old, &l, at(0)).await;
    create(&store, 2, &old, &l, at(0)).await;
    create(&store, 3, &new, &l, at(0)).await;
    create(&store, 4, &anonymous, &l, at(0)).await;
    let holders = store.holders(100).await.expect("holders");
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(holders.contains(&old) && holders.contains(&new));
    assert_eq!(store.end_holder(&old).await.expect("end"), 2);
    assert!(!found(&store, 1, &old, &l, at(1)).await);
    assert!(!found(&store, 2, &old, &l, at(1)).await);
    assert!(found(&store, 3, &new, &l, at(1)).await);
    assert!(found(&store, 4, &anonymous, &l, at(1)).await);
}

/// After a sweep the figures count the live sessions and their client bytes.
pub async fn mcp_session_figures(store: Arc<dyn McpSessionStore>) {
    let l = limits(100, 10, Duration::from_secs(60));
    let alice = holder("alice", "assistant", "a");
    let big = initialized(&"x".repeat(1000));
    for n in 1..=3 {
        store
            .create(&sid(n), &alice, &big, &l, at(0))
            .await
            .expect("created");
    }
    store.sweep(&l, at(1)).await.expect("sweep");
    let figures = store.figures();
    assert_eq!(figures.sessions, 3);
    assert_eq!(figures.bytes, 3 * big.retained_bytes());
    store.sweep(&l, at(100)).await.expect("sweep");
    assert_eq!(store.figures().sessions, 0);
    assert_eq!(store.figures().bytes, 0);
}
