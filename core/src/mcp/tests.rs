//! Unit tests: every error code and both eras, over a tiny in-test store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::executor::block_on;
use serde_json::{Value, json};

use super::*;
use crate::command::CommandRecord;
use crate::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::queue::{Queue, QueueConfig, RUN_NOT_FOUND, SyncRequest};
use crate::session::{SessionMeta, SharedSession};
use crate::store::{
    DeviceContact, DeviceRecord, IdempotencyRecord, InsertOutcome, PruneReport, PruneRequest,
    Store, StoreError,
};
use crate::time::{ManualClock, SeededIds, Timestamp};

/// Just enough of a store for the agent-side tools.
#[derive(Default)]
pub(super) struct TinyStore {
    pub(super) commands: Mutex<HashMap<CommandId, CommandRecord>>,
    keys: Mutex<HashMap<(OwnerId, AgentId, IdempotencyKey), IdempotencyRecord>>,
    sessions: Mutex<Vec<SharedSession>>,
}

impl TinyStore {
    fn writes(&self) -> usize {
        self.commands.lock().unwrap().len() + self.keys.lock().unwrap().len()
    }
}

#[async_trait]
impl Store for TinyStore {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        _now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        Ok(self
            .keys
            .lock()
            .unwrap()
            .get(&(owner.clone(), agent.clone(), key.clone()))
            .cloned())
    }
    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        _now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        let mut keys = self.keys.lock().unwrap();
        let k = (key.owner.clone(), key.agent.clone(), key.key.clone());
        if let Some(existing) = keys.get(&k) {
            return Ok(InsertOutcome::KeyTaken(existing.clone()));
        }
        keys.insert(k, key.clone());
        self.commands
            .lock()
            .unwrap()
            .insert(command.id, command.clone());
        Ok(InsertOutcome::Inserted)
    }
    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .commands
            .lock()
            .unwrap()
            .get(id)
            .filter(|c| &c.agent == agent && &c.owner == owner)
            .cloned())
    }
    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .commands
            .lock()
            .unwrap()
            .get(id)
            .filter(|c| &c.device == device && &c.owner == owner)
            .cloned())
    }
    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .commands
            .lock()
            .unwrap()
            .get(id)
            .filter(|c| &c.owner == owner)
            .cloned())
    }
    async fn running_commands(
        &self,
        _owner: &OwnerId,
        _device: &DeviceId,
        _limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn lapsed_commands(
        &self,
        _now: Timestamp,
        _limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        let mut commands = self.commands.lock().unwrap();
        match commands.get(&next.id) {
            Some(c) if c.revision + 1 == next.revision => {
                commands.insert(next.id, next.clone());
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn queued_commands(
        &self,
        _owner: &OwnerId,
        _project: &ProjectId,
        _device: &DeviceId,
        _limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn replace_shared_sessions(
        &self,
        _owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut all = self.sessions.lock().unwrap();
        all.retain(|s| !(&s.project == project && &s.device == device));
        all.extend(sessions.iter().map(|meta| SharedSession {
            project: project.clone(),
            device: device.clone(),
            meta: meta.clone(),
            synced_at: now,
        }));
        Ok(())
    }
    async fn shared_projects(
        &self,
        _owner: &OwnerId,
        _device: &DeviceId,
        _limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        Ok(Vec::new())
    }
    async fn shared_sessions(
        &self,
        _owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        let all = self.sessions.lock().unwrap();
        Ok(all
            .iter()
            .filter(|s| &s.project == project)
            .take(limit)
            .cloned()
            .collect())
    }
    async fn find_shared_session(
        &self,
        _owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        let all = self.sessions.lock().unwrap();
        Ok(all
            .iter()
            .find(|s| projects.contains(&s.project) && &s.meta.graph_session_id == id)
            .cloned())
    }
    async fn touch_device(
        &self,
        _owner: &OwnerId,
        _device: &DeviceId,
        _contact: DeviceContact,
        _now: Timestamp,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn device(
        &self,
        _owner: &OwnerId,
        _device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        Ok(None)
    }
    async fn prune(&self, _request: PruneRequest) -> Result<PruneReport, StoreError> {
        Ok(PruneReport::default())
    }
}

pub(super) const GS: &str = "gs_0123456789abcdef0123456789abcdef";
pub(super) const MODERN: &str = "2026-07-28";

pub(super) struct Fixture {
    pub(super) server: McpServer,
    pub(super) store: Arc<TinyStore>,
    pub(super) alice: Caller,
    pub(super) reader: Caller,
    pub(super) other: Caller,
}

pub(super) fn fixture() -> Fixture {
    let store = Arc::new(TinyStore::default());
    let queue = Queue::new(
        store.clone(),
        Arc::new(ManualClock::new(Timestamp(1_767_225_600_000))),
        Arc::new(SeededIds::new(7)),
        QueueConfig::default(),
    );
    let owner = OwnerId::parse("alice").unwrap();
    let project = ProjectId::parse("p1").unwrap();
    let agent = |name: &str| {
        Agent::new(
            AgentId::parse(name).unwrap(),
            owner.clone(),
            [project.clone()],
        )
    };
    block_on(queue.sync(
        &crate::principal::Device::new(DeviceId::parse("desktop").unwrap(), owner.clone()),
        &SyncRequest {
            project: project.clone(),
            sessions: vec![SessionMeta {
                graph_session_id: GraphSessionId::parse(GS).unwrap(),
                name: "Drafts".into(),
                description: "".into(),
                slug: "drafts".into(),
                version: "1".into(),
                status: "ready".into(),
            }],
            long_poll: false,
            restarted: false,
            running: None,
        },
    ))
    .unwrap();
    let all = [crate::catalog::READ_SCOPE, crate::catalog::RUN_SCOPE];
    Fixture {
        server: McpServer::new(
            queue,
            ToolCatalog::published(),
            ServerInfo::new("graph-relay", "0.1.0"),
        ),
        store,
        alice: Caller::new(agent("assistant"), all),
        reader: Caller::new(agent("reader"), [crate::catalog::READ_SCOPE]),
        other: Caller::new(agent("helper"), all),
    }
}

impl Fixture {
    pub(super) fn send(
        &self,
        session: &mut McpSession,
        caller: &Caller,
        message: &Value,
    ) -> Option<Outgoing> {
        block_on(
            self.server
                .handle(session, caller, message.to_string().as_bytes()),
        )
    }

    pub(super) fn raw(&self, bytes: &[u8]) -> Outgoing {
        block_on(
            self.server
                .handle(&mut McpSession::new(), &self.alice, bytes),
        )
        .expect("a reply")
    }

    /// A legacy session after `initialize` + `initialized`.
    pub(super) fn legacy(&self, version: &str) -> McpSession {
        let mut session = McpSession::new();
        let reply = self
            .send(
                &mut session,
                &self.alice,
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
            )
            .unwrap();
        assert!(reply.error_code().is_none(), "{:?}", reply.message());
        assert!(
            self.send(
                &mut session,
                &self.alice,
                &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
            )
            .is_none()
        );
        assert!(session.is_initialized());
        session
    }

    pub(super) fn call_legacy(&self, caller: &Caller, name: &str, arguments: Value) -> Value {
        let mut session = self.legacy("2025-11-25");
        let reply = self
            .send(
                &mut session,
                caller,
                &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}),
            )
            .unwrap();
        reply.message().clone()
    }

    pub(super) fn call_modern(&self, caller: &Caller, name: &str, arguments: Value) -> Value {
        let reply = self
            .send(
                &mut McpSession::new(),
                caller,
                &json!({"jsonrpc": "2.0", "id": "m1", "method": "tools/call", "params": {
                    "name": name, "arguments": arguments, "_meta": modern_meta()}}),
            )
            .unwrap();
        reply.message().clone()
    }
}

pub(super) fn modern_meta() -> Value {
    json!({META_PROTOCOL_VERSION: MODERN, META_CLIENT_CAPABILITIES: {}, META_CLIENT_INFO: {"name": "t", "version": "1"}})
}

fn code(reply: &Outgoing) -> i64 {
    reply.message()["error"]["code"].as_i64().unwrap()
}

fn run_args(key: &str) -> Value {
    json!({"graph_session_id": GS, "idempotency_key": key})
}

#[test]
fn parse_error_is_32700_with_null_id() {
    let f = fixture();
    let reply = f.raw(b"{not json");
    assert_eq!(code(&reply), -32700);
    assert_eq!(reply.message()["id"], Value::Null);
    assert_eq!(reply.http_status(), 400);
}

#[test]
fn invalid_requests_are_32600() {
    let f = fixture();
    let cases: [(&[u8], &str); 6] = [
        (br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, "batch"),
        (br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, "jsonrpc"),
        (br#"{"id":1,"method":"ping"}"#, "jsonrpc"),
        (br#"{"jsonrpc":"2.0","id":1}"#, "`method` is missing"),
        (
            br#"{"jsonrpc":"2.0","method":"tools/list"}"#,
            "needs an `id`",
        ),
        (
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            "`id` must be",
        ),
    ];
    for (bytes, needle) in cases {
        let reply = f.raw(bytes);
        assert_eq!(code(&reply), -32600, "{}", String::from_utf8_lossy(bytes));
        let message = reply.message()["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message}");
        assert_eq!(reply.http_status(), 400);
    }
    let reply = f.raw(br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#);
    assert_eq!(
        reply.message()["id"],
        json!(7),
        "the id is echoed when readable"
    );
    assert_eq!(f.store.writes(), 0);
}

#[test]
fn initialize_echoes_supported_versions_and_counter_offers_others() {
    let f = fixture();
    for (offered, answered) in [
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
    ] {
        let mut session = McpSession::new();
        let reply = f
            .send(
                &mut session,
                &f.alice,
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": offered, "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}),
            )
            .unwrap();
        let result = reply.result_value().unwrap();
        assert_eq!(result["protocolVersion"], answered);
        assert_eq!(result["serverInfo"]["name"], "graph-relay");
        assert!(result["capabilities"]["tools"].is_object());
        assert!(result.get("resultType").is_none());
        assert_eq!(
            session.negotiated_version().map(ProtocolVersion::as_str),
            Some(answered)
        );
        assert!(!session.is_initialized());
    }
}

#[test]
fn initialize_twice_and_without_version_are_refused() {
    let f = fixture();
    let mut session = f.legacy("2025-06-18");
    let again = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
        )
        .unwrap();
    assert_eq!(code(&again), -32600);
    let bare = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {}}),
        )
        .unwrap();
    assert_eq!(code(&bare), -32602);
}

#[test]
fn ping_is_exactly_empty_in_the_initialize_era_and_unknown_in_2026() {
    let f = fixture();
    let mut session = f.legacy("2025-11-25");
    let reply = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": "p", "method": "ping"}),
        )
        .unwrap();
    assert_eq!(
        reply.message(),
        &json!({"jsonrpc": "2.0", "id": "p", "result": {}})
    );
    let before_init = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        )
        .unwrap();
    assert_eq!(before_init.result_value(), Some(&json!({})));
    let modern = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": modern_meta()}}),
        )
        .unwrap();
    assert_eq!(code(&modern), -32601);
    assert_eq!(modern.http_status(), 404);
}

#[test]
fn unknown_method_is_32601_in_both_eras() {
    let f = fixture();
    let mut session = f.legacy("2025-11-25");
    let legacy = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}),
        )
        .unwrap();
    assert_eq!(code(&legacy), -32601);
    assert!(
        legacy.message()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resources/list")
    );
    let modern = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/list", "params": {"_meta": modern_meta()}}),
        )
        .unwrap();
    assert_eq!(code(&modern), -32601);
}

/// The `tools/list` reply bytes of `server` in a session of `version`
/// (`None`: a 2026-07-28 request), with request id `id`.
fn tools_list_bytes(f: &Fixture, server: &McpServer, version: Option<&str>, id: Value) -> Vec<u8> {
    let (mut session, params) = match version {
        Some(version) => (f.legacy(version), json!({})),
        None => (McpSession::new(), json!({"_meta": modern_meta()})),
    };
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
    block_on(server.handle(&mut session, &f.alice, request.to_string().as_bytes()))
        .expect("a reply")
        .into_bytes()
}

#[test]
fn prerendered_tools_list_is_the_rendered_one_for_every_catalog_and_era() {
    let f = fixture();
    let renamed = ToolCatalog::builder()
        .name(crate::catalog::ToolKind::GetGraphRun, "read_run")
        .description(
            crate::catalog::ToolKind::RunGraphSession,
            "Queue a run \"now\" — ünïcode and quotes",
        )
        .scopes(crate::catalog::ToolKind::ListGraphSessions, ["acme:read"])
        .wait_seconds(Some(30))
        .build()
        .unwrap();
    let rescoped = ToolCatalog::builder()
        .scopes(
            crate::catalog::ToolKind::GetGraphRun,
            ["acme:read", "acme:audit"],
        )
        .scopes(crate::catalog::ToolKind::CancelGraphRun, ["acme:admin"])
        .wait_seconds(None)
        .build()
        .unwrap();
    let mut instructed = ServerInfo::new("relay \"x\"", "9.9.9");
    instructed.instructions = Some("Poll after 20 s.".into());
    let servers = [
        (
            ToolCatalog::published(),
            ServerInfo::new("graph-relay", "0.1.0"),
            None,
        ),
        (renamed, instructed.clone(), Some(1_234)),
        (rescoped, instructed, Some(0)),
    ];
    for (catalog, info, ttl) in servers {
        let mut server = McpServer::new(f.server.queue().clone(), catalog.clone(), info.clone());
        if let Some(ttl) = ttl {
            server = server.with_list_ttl_ms(ttl);
        }
        for id in [json!(1), json!("list-\"1\""), json!(u64::MAX)] {
            for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
                let expected = json!({"id": id, "jsonrpc": "2.0",
                                      "result": {"tools": catalog.tools_list()}});
                assert_eq!(
                    String::from_utf8(tools_list_bytes(&f, &server, Some(version), id.clone())),
                    Ok(expected.to_string()),
                    "{version}"
                );
            }
            let expected = json!({"id": id, "jsonrpc": "2.0", "result": {
                "_meta": {META_SERVER_INFO: {"name": info.name, "version": info.version}},
                "cacheScope": "public",
                "resultType": "complete",
                "tools": catalog.tools_list(),
                "ttlMs": ttl.unwrap_or(DEFAULT_LIST_TTL_MS),
            }});
            assert_eq!(
                String::from_utf8(tools_list_bytes(&f, &server, None, id.clone())),
                Ok(expected.to_string()),
                "2026-07-28"
            );
        }
    }
}

#[test]
fn tools_list_matches_the_catalog_in_both_eras() {
    let f = fixture();
    let mut session = f.legacy("2025-11-25");
    let legacy = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        .unwrap();
    assert_eq!(
        legacy.result_value().unwrap(),
        &json!({"tools": ToolCatalog::published().tools_list()})
    );
    let modern = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta()}}),
        )
        .unwrap();
    let result = modern.result_value().unwrap();
    assert_eq!(result["tools"], ToolCatalog::published().tools_list());
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["ttlMs"], json!(DEFAULT_LIST_TTL_MS));
    assert_eq!(result["cacheScope"], "public");
    assert_eq!(result["_meta"][META_SERVER_INFO]["name"], "graph-relay");
}

#[test]
fn server_discover_lists_the_modern_version() {
    let f = fixture();
    let reply = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": modern_meta()}}),
        )
        .unwrap();
    let result = reply.result_value().unwrap();
    assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));
    assert_eq!(result["resultType"], "complete");
    assert!(result["capabilities"]["tools"].is_object());
    assert!(result["ttlMs"].is_u64());
    assert_eq!(result["cacheScope"], "public");
}

#[test]
fn modern_requests_need_version_and_capabilities() {
    let f = fixture();
    let unsupported = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
                META_PROTOCOL_VERSION: "1900-01-01", META_CLIENT_CAPABILITIES: {}}}}),
        )
        .unwrap();
    assert_eq!(code(&unsupported), -32022);
    assert_eq!(unsupported.http_status(), 400);
    let error = &unsupported.message()["error"];
    assert_eq!(error["message"], "Unsupported protocol version");
    assert_eq!(error["data"]["requested"], "1900-01-01");
    assert_eq!(error["data"]["supported"][0], "2026-07-28");

    let no_caps = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {META_PROTOCOL_VERSION: MODERN}}}),
        )
        .unwrap();
    assert_eq!(code(&no_caps), -32602);
    assert_eq!(no_caps.http_status(), 400);
    assert!(
        no_caps.message()["error"]["message"]
            .as_str()
            .unwrap()
            .contains(META_CLIENT_CAPABILITIES)
    );

    let no_meta = f
        .send(
            &mut McpSession::new(),
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        .unwrap();
    assert_eq!(code(&no_meta), -32602);
}

#[test]
fn unknown_tool_and_missing_name_are_32602() {
    let f = fixture();
    let reply = f.call_legacy(&f.alice, "delete_everything", json!({}));
    assert_eq!(reply["error"]["code"], -32602);
    assert_eq!(reply["error"]["message"], "Unknown tool: delete_everything");
    let mut session = f.legacy("2025-11-25");
    let no_name = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}),
        )
        .unwrap();
    assert_eq!(code(&no_name), -32602);
    let bad_params = f.raw(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#);
    assert_eq!(code(&bad_params), -32602);
}

#[test]
fn bad_arguments_are_tool_errors_naming_the_field_and_write_nothing() {
    let f = fixture();
    let cases = [
        (
            "run_graph_session",
            json!({"graph_session_id": 5, "idempotency_key": "key-0001"}),
            "`graph_session_id` must be a string",
        ),
        (
            "run_graph_session",
            json!({"graph_session_id": GS, "idempotency_key": "key-0001", "extra": 1}),
            "unknown field `extra`",
        ),
        (
            "run_graph_session",
            run_args("1234567"),
            "`idempotency_key` must be 8 to 128 characters long",
        ),
        (
            "run_graph_session",
            run_args(&"k".repeat(129)),
            "`idempotency_key` must be 8 to 128 characters long",
        ),
        (
            "get_graph_run",
            json!({"command_id": "42"}),
            "`command_id` must be a UUID",
        ),
        (
            "cancel_graph_run",
            json!({"command_id": "42"}),
            "`command_id` must be a UUID",
        ),
        (
            "list_graph_sessions",
            json!({"project_id": "p1", "limit": 0}),
            "`limit` must be an integer from 1 to 50",
        ),
        (
            "list_graph_sessions",
            json!({"project_id": "p1", "limit": 51}),
            "`limit` must be an integer from 1 to 50",
        ),
    ];
    for (tool, arguments, needle) in cases {
        for reply in [
            f.call_legacy(&f.alice, tool, arguments.clone()),
            f.call_modern(&f.alice, tool, arguments.clone()),
        ] {
            let result = &reply["result"];
            assert_eq!(result["isError"], true, "{tool} {arguments}: {reply}");
            let text = result["content"][0]["text"].as_str().unwrap();
            assert!(text.contains(needle), "{text}");
            assert!(text.contains(tool), "{text}");
        }
    }
    assert_eq!(f.store.writes(), 0);
}

#[test]
fn run_returns_a_queued_ticket_then_get_and_cancel_read_it() {
    let f = fixture();
    for (call, key) in [
        (
            Fixture::call_legacy as fn(&Fixture, &Caller, &str, Value) -> Value,
            "key-0001",
        ),
        (Fixture::call_modern, "key-0002"),
    ] {
        let reply = call(&f, &f.alice, "run_graph_session", run_args(key));
        let result = &reply["result"];
        assert_eq!(result["isError"], false, "{reply}");
        let ticket = &result["structuredContent"];
        assert_eq!(ticket["status"], "queued");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("Queued ticket, not a result"), "{text}");
        assert!(text.contains("get_graph_run"), "{text}");
        let id = ticket["command_id"].as_str().unwrap().to_owned();

        let got = call(&f, &f.alice, "get_graph_run", json!({"command_id": id}));
        assert_eq!(got["result"]["structuredContent"]["status"], "queued");
        let text: Value =
            serde_json::from_str(got["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            text, got["result"]["structuredContent"],
            "text mirrors the JSON"
        );

        let cancelled = call(&f, &f.alice, "cancel_graph_run", json!({"command_id": id}));
        assert_eq!(
            cancelled["result"]["structuredContent"]["status"],
            "cancelled"
        );
    }
    let modern = f.call_modern(&f.alice, "run_graph_session", run_args("key-0003"));
    assert_eq!(modern["result"]["resultType"], "complete");
}

#[test]
fn another_agents_run_is_the_hidden_error() {
    let f = fixture();
    let reply = f.call_legacy(&f.alice, "run_graph_session", run_args("key-0001"));
    let id = reply["result"]["structuredContent"]["command_id"].clone();
    for tool in ["get_graph_run", "cancel_graph_run"] {
        for reply in [
            f.call_legacy(&f.other, tool, json!({"command_id": id})),
            f.call_modern(
                &f.other,
                tool,
                json!({"command_id": "67e55044-10b1-426f-9247-bb680e5fe0c8"}),
            ),
        ] {
            assert_eq!(
                reply["result"]["content"],
                json!([{"type": "text", "text": RUN_NOT_FOUND}])
            );
            assert_eq!(reply["result"]["isError"], true);
        }
    }
}

#[test]
fn list_graph_sessions_shows_the_shared_session() {
    let f = fixture();
    let reply = f.call_legacy(
        &f.alice,
        "list_graph_sessions",
        json!({"project_id": "p1", "limit": 50}),
    );
    let list = &reply["result"]["structuredContent"];
    assert_eq!(list["project_id"], "p1");
    assert_eq!(list["sessions"][0]["graph_session_id"], GS);
}

#[test]
fn missing_scope_is_known_before_the_queue_and_refused_by_the_core_too() {
    let f = fixture();
    let incoming = Incoming::parse(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_graph_session", "arguments": run_args("key-0001")}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        f.server.required_scopes(&incoming),
        Some(&["osfoundry:run".to_owned()][..])
    );
    assert_eq!(
        f.server.missing_scope(&incoming, &f.reader),
        Some("osfoundry:run")
    );
    assert_eq!(f.server.missing_scope(&incoming, &f.alice), None);
    let reply = f.call_legacy(&f.reader, "run_graph_session", run_args("key-0001"));
    assert_eq!(reply["error"]["code"], -32003, "{reply}");
    assert_eq!(reply["error"]["data"]["scope"], "osfoundry:run");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("osfoundry:run")
    );
    assert_eq!(f.store.writes(), 0);
}

#[test]
fn structured_content_is_left_out_for_2025_03_26() {
    let f = fixture();
    let mut session = f.legacy("2025-03-26");
    let reply = f
        .send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_graph_sessions", "arguments": {"project_id": "p1"}}}),
        )
        .unwrap();
    let result = reply.result_value().unwrap();
    assert!(result.get("structuredContent").is_none());
    assert!(result["content"][0]["text"].as_str().unwrap().contains(GS));
}

#[test]
fn notifications_and_responses_get_no_reply() {
    let f = fixture();
    let mut session = McpSession::new();
    for message in [
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "id": 5, "result": {}}),
        json!({"jsonrpc": "2.0", "id": 5, "error": {"code": 1, "message": "x"}}),
    ] {
        assert!(
            f.send(&mut session, &f.alice, &message).is_none(),
            "{message}"
        );
    }
    // initialized before initialize does not mark the session.
    assert!(
        f.send(
            &mut session,
            &f.alice,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        .is_none()
    );
    assert!(!session.is_initialized());
}

#[test]
fn classification_for_transports() {
    let incoming = Incoming::parse(
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "get_graph_run", "_meta": modern_meta()}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(incoming.method(), Some("tools/call"));
    assert_eq!(incoming.name_param(), Some("get_graph_run"));
    assert_eq!(incoming.meta_protocol_version(), Some(MODERN));
    assert!(incoming.is_request() && !incoming.is_initialize() && !incoming.is_notification());
    assert_eq!(incoming.id(), Some(&json!(3)));
}

#[test]
fn params_read_at_parse_agree_with_the_whole_object() {
    let messages = [
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_graph_run","arguments":{"command_id":"x"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        // Members given twice count with their last value, at every level.
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"get_graph_run","arguments":1,"arguments":{"b":[1,2]},"_meta":{"progressToken":1},"_meta":{"io.modelcontextprotocol/protocolVersion":"x","io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":"t","progressToken":2}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"progressToken":1},"_meta":[1,{"a":2}]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_graph_run"},"params":{"name":5,"other":{"deep":[true,null,1.5,-3]}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":null}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":"text"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t-1","_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","clientInfo":{"name":"c","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        // Escaped member names are the same members.
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"na\u006de":"get_graph_run","\u005fmeta":{"progress\u0054oken":"t"}}}"#,
        // Not accepted: params that are not an object, and bytes that are not JSON.
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1,2]}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"other":1e400}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"other":1e400}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":[1e400]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud800"}}"#,
    ];
    for message in messages {
        let parsed = Incoming::parse(message.as_bytes());
        let decoded = match serde_json::from_str::<Value>(message) {
            Ok(value) => Incoming::from_value(value).map_err(Box::new),
            Err(_) => {
                let reply = parsed.expect_err(message);
                assert_eq!(reply.error_code(), Some(ErrorCode::ParseError), "{message}");
                continue;
            }
        };
        match (parsed, decoded) {
            (Ok(parsed), Ok(decoded)) => {
                let whole: Value = serde_json::from_str(message).unwrap();
                let params = whole
                    .get("params")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                for incoming in [&parsed, &decoded] {
                    assert_eq!(incoming.params(), &params, "{message}");
                    assert_eq!(incoming.arguments(), params.get("arguments"), "{message}");
                    assert_eq!(incoming.task_id(), params.get("taskId"), "{message}");
                    let meta = params.get("_meta").and_then(Value::as_object);
                    assert_eq!(incoming.meta(), meta, "{message}");
                    assert_eq!(
                        incoming.meta_protocol_version(),
                        meta.and_then(|m| m.get(META_PROTOCOL_VERSION))
                            .and_then(Value::as_str),
                        "{message}"
                    );
                    assert_eq!(
                        incoming.client_capabilities(),
                        meta.and_then(|m| m.get(META_CLIENT_CAPABILITIES)),
                        "{message}"
                    );
                    assert_eq!(
                        incoming.progress_token(),
                        meta.and_then(|m| m.get("progressToken")),
                        "{message}"
                    );
                    let name = params.get("name").and_then(Value::as_str);
                    let is_call = incoming.method() == Some("tools/call");
                    assert_eq!(incoming.tool_name(), name.filter(|_| is_call), "{message}");
                }
                assert_eq!(parsed.name_param(), decoded.name_param(), "{message}");
                assert_eq!(parsed, decoded, "{message}");
                assert_eq!(format!("{parsed:?}"), format!("{decoded:?}"), "{message}");
            }
            (Err(parsed), Err(decoded)) => assert_eq!(parsed, decoded, "{message}"),
            (parsed, decoded) => panic!("{message}: {parsed:?} but {decoded:?}"),
        }
    }
}
