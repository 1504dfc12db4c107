//! # graph-relay-core
//!
//! The no-IO protocol core of graph-relay. An AI agent queues long-running
//! "Graph runs" through MCP and gets a ticket back at once; the owner's
//! desktop (the relay) pulls queued work over outbound HTTP, runs it and
//! posts a bounded result; the agent reads it with the ticket.
//!
//! This crate owns every rule of that system and performs no IO: it opens no
//! socket, reads no file, and learns the time only from a [`Clock`](time::Clock). Stores
//! ([`Store`](store::Store)) and transports are thin crates around it.
//!
//! ```text
//!  agent ── MCP ──► transport ──► Queue ◄── relay HTTP API ◄── desktop relay
//!                                  │
//!                                Store (memory | sqlite | postgres)
//! ```
//!
//! Every public module, with what it holds:
//!
//! - [`ids`]: identifiers as validated types.
//! - [`principal`]: the agent and the device, each an (owner, name) identity.
//! - [`limits`]: every bound of the protocol, in one place.
//! - [`catalog`]: the four tools and their exact `tools/list` wire form.
//! - [`authz`]: the one table of the scope every MCP method and tool needs.
//! - [`args`]: tool arguments decoded into typed requests.
//! - [`session`]: the Graph sessions a desktop shares, as it describes them.
//! - [`command`]: the command state machine as pure transitions.
//! - [`envelope`]: the 100,000-character result envelope.
//! - [`store`]: the persistence trait.
//! - [`queue`]: the service that applies the rules over a store, and its
//!   maintenance loop.
//! - [`hold`]: the one rule of every request that may wait.
//! - [`signals`]: runtime-free wake-ups for held requests.
//! - [`mcp`]: MCP (JSON-RPC) message handling shared by the transports.
//! - [`outbox`]: the relay's durable outbox trait.
//! - [`relay`]: the desktop relay as a sans-IO state machine, what runs a
//!   Graph on the desktop ([`relay::executor`]), its runtime-free driver
//!   ([`relay::driver`]) and in-process transport ([`relay::in_process`]).
//! - [`stats`]: the operator's view of a queue (status document, metrics
//!   figures) and the trait a store implements to give it.
//! - [`time`]: the clock, sleepers and id sources, the only doors to the
//!   system's time and randomness.
//! - `testkit` (feature `testkit`): the store conformance suite and the
//!   model every store is checked against.
//! - [`prelude`]: the names most embedders need, in one import; each is a
//!   re-export of its home module above.
//!
//! # Example
//! ```
//! use graph_relay_core::prelude::*;
//! use serde_json::json;
//!
//! // Ids are parsed before anything else happens.
//! assert!(CommandId::parse("not-a-uuid").is_err());
//! // A result that would not fit 100,000 characters is truncated, all or nothing.
//! let big = EnvelopeBody { result: json!("x".repeat(200_000)), ..Default::default() };
//! let envelope = ResultEnvelope::build(ExecutionId::parse("exec-1")?, FinishStatus::Completed, big);
//! assert!(envelope.is_truncated());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The embedding example with a store is in `graph-relay-store-memory`.

pub mod args;
pub mod authz;
pub mod catalog;
pub mod command;
pub mod envelope;
pub mod hold;
pub mod ids;
pub mod limits;
pub mod mcp;
pub mod outbox;
pub mod principal;
pub mod queue;
pub mod relay;
pub mod session;
pub mod signals;
pub mod stats;
pub mod store;
pub mod time;

#[cfg(feature = "testkit")]
pub mod testkit;

/// The `#[async_trait]` attribute the store, outbox, executor and
/// authenticator traits are written with, so an implementation needs no
/// dependency of its own to match them.
pub use async_trait::async_trait;

/// The names most embedders need, in one import. Each is a re-export: its
/// one home is the module named in its path.
pub mod prelude {
    #[doc(no_inline)]
    pub use crate::args::{CancelArgs, GetArgs, ListArgs, RunArgs, ToolArgs};
    #[doc(no_inline)]
    pub use crate::catalog::{ToolCatalog, ToolKind};
    #[doc(no_inline)]
    pub use crate::command::{CommandRecord, CommandStatus};
    #[doc(no_inline)]
    pub use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    #[doc(no_inline)]
    pub use crate::ids::{
        AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId,
        ProjectId,
    };
    #[doc(no_inline)]
    pub use crate::principal::{Agent, Device};
    #[doc(no_inline)]
    pub use crate::queue::{Queue, QueueConfig, SyncRequest};
    #[doc(no_inline)]
    pub use crate::session::SessionMeta;
    #[doc(no_inline)]
    pub use crate::store::Store;
    #[doc(no_inline)]
    pub use crate::time::{
        Clock, IdSource, ManualClock, RandomIds, SeededIds, SystemClock, Timestamp,
    };
}
