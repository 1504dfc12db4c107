//! The core's `McpSessionStore` conformance functions, run unchanged
//! against the in-memory table (the default of every server).

use graph_relay_transport_http::mcp_sessions::MemoryMcpSessionStore;

graph_relay_core::mcp_session_store_suite!(futures::executor::block_on, async {
    MemoryMcpSessionStore::new()
});
