//! # graph-relay-store-postgres
//!
//! The queue's [`Store`](graph_relay_core::store::Store) on PostgreSQL, for the
//! case where one server is not enough: several `graph-relay serve`
//! processes behind a load balancer share one database, and so one queue.
//!
//! ```text
//!  serve A ─┐                         ┌─ serve B
//!   Queue ──┼── PostgresStore (pool) ─┼── Queue
//!   Signals ◄── SignalBridge: LISTEN ◄─────┼── NOTIFY graph_relay ◄── Signals
//! ```
//!
//! * [`PostgresStore`] keeps commands, idempotency keys, shared sessions
//!   and device liveness. It decides nothing: every transition is a
//!   conditional update on the command's id and revision (the core's
//!   compare-and-swap); an insert under an idempotency key writes the key
//!   and the command together or neither; pruning claims its batches with
//!   `FOR UPDATE SKIP LOCKED`, so two servers pruning at once take
//!   different rows and never wait on each other.
//! * Concurrent requests share statements (see "Requests in flight share
//!   statements" below): the inserts and compare-and-swaps of many requests
//!   commit together, with one flush of the WAL, and the look-ups every run
//!   makes are answered together.
//! * [`PostgresMcpSessionStore`] keeps the initialize-era MCP sessions
//!   (`MCP-Session-Id`) in the same database, so any server of a cluster
//!   serves any session and a load balancer needs no affinity: bounded per
//!   agent and in all under one advisory lock, keyed by id, agent and
//!   token, with the last use written at most every tenth of the idle
//!   timeout (see its module docs).
//! * The schema lives in one Postgres schema (default: the connection's
//!   `search_path`, or [`PostgresOptions::schema`]). Migrations are numbered,
//!   recorded in `schema_migrations`, and applied under an advisory lock, so
//!   servers starting together migrate once; a database migrated by a newer
//!   build is refused untouched.
//! * [`SignalBridge`] carries the core's [`Signals`](graph_relay_core::signals::Signals)
//!   across processes: every local notification is published with
//!   `NOTIFY graph_relay, '<topic>'` and every other process's notification
//!   wakes the local waiters. Topics travel as `w/<owner>/<device>` and
//!   `c/<command uuid>` (`/` cannot occur in an id).
//!
//! ## When a notification is missed
//! `NOTIFY` is a hint, not a delivery guarantee: a listener that is
//! reconnecting, or a publish that fails, loses it. Nothing depends on it
//! alone. While the bridge's listener is not listening, a held long-poll
//! sync and a held control request re-read the store every 500 ms
//! (`QueueConfig::hold_recheck` in the core), and `wait_seconds` waits
//! re-read it every second (`QueueConfig::wait_recheck`): a missed
//! notification costs at most that delay. While it listens, held requests
//! wait on notifications alone (`Queue::external_writes_fed`), and every
//! time the listener starts listening again it wakes every held request
//! once (`Signals::wake_all`), so that what was written while it was away
//! is seen. A delivered notification wakes the waiter within a round trip.
//!
//! ## A sync is one statement
//! A long-polling desktop syncs again after every held request, nearly
//! always with the sessions it shared last time. [`PostgresStore`]'s
//! [`record_sync`](graph_relay_core::store::Store::record_sync) compares them with
//! the stored rows (not with what this process wrote last: the desktop may
//! have synced through another server since) and, when they are the same,
//! moves their stamps and records the device's contact in the same
//! statement. Only a sync that changes them takes the per-device advisory
//! lock and replaces them in a transaction.
//!
//! ## A run is one statement
//! The queue keeps the share each session resolved to for its last run,
//! and the share each sync it wrote uploaded the session to, and builds
//! the run's command on it;
//! [`insert_command_if_shared`](graph_relay_core::store::Store::insert_command_if_shared)
//! then writes the key and the command only if the session, looked up in
//! the same statement exactly as
//! [`find_shared_session`](graph_relay_core::store::Store::find_shared_session)
//! looks it up, still resolves to that project, device and slug. A share
//! that changed writes nothing, and the run looks the session up again:
//! one round trip per run instead of two.
//!
//! ## Requests in flight share statements
//! A Graph run costs the store four statements, three of them commits that
//! wait for the disk: the insert of the command with its key, and the
//! compare-and-swaps of `start` and `complete`. Run one by one, each
//! request holding a pooled connection through its round trip and its
//! commit, a server spent most of its time on per-statement work and on
//! waiting for flushes, its connections busy, and every other request
//! queued behind them.
//!
//! So the hot requests are gathered in two kinds: the durable writes
//! (inserts of commands with their keys, and compare-and-swaps, together:
//! the runs in flight are at different steps, and one batch takes the
//! new run of one, the start of another and the result of a third), and
//! the look-ups of a command by id, of a device's queued commands and of
//! a shared session. The writes have one lane, the look-ups two (one
//! with a pool of fewer than 8 connections). A request that finds a lane
//! free leads: it lets the scheduler run once, so that the requests woken
//! with it (a burst) queue meanwhile, and then runs everything queued as
//! one statement, their rows as arrays, one per column (a lone request
//! runs the same single-row statement as ever, and a batch of
//! compare-and-swaps alone a statement of its own, smaller than the mixed
//! one). Requests that arrive while every lane is busy wait and go
//! together in the next batch. A batch of writes is one
//! transaction, so one commit and one flush of the WAL for all of them,
//! whatever their kinds, and while it waits for the disk the next writes
//! gather for the next batch. It answers each request on its own: an insert whose key is live or a swap whose revision moved is
//! told `false` alone while the rest commits; a statement the server
//! refuses (a constraint) runs again request by request so that only the
//! one at fault fails; any other failure (no connection, a connection lost
//! while committing) fails every request of the batch with a
//! [`StoreError::Backend`](graph_relay_core::store::StoreError), which the
//! caller may retry. An answer is sent only after the statement returned,
//! so a write that returned is committed. The quieter the server, the
//! smaller the batches; a lone request costs one more turn of the
//! scheduler.
//!
//! [`PostgresStore::statements_executed`] counts a batch as one statement,
//! however many requests it answers.
//!
//! ## Syncs and contacts commit without waiting for the disk
//! The writes of a sync (shared sessions and the device's contact), and
//! the contact a desktop's other requests record (`touch_device`, at most
//! once per touch interval, before a `start`, a control request or a
//! result), commit with `synchronous_commit` off for their own
//! transaction, so they do not wait for the WAL flush. With thousands of
//! desktops every re-sync is a commit; waiting for the flush behind every
//! other commit kept the pool's connections busy and queued every other
//! request behind them, and a result that came with a contact waited for
//! two flushes in a row, the contact's and its own. The risk is bounded:
//! if the database server itself crashes, the last fraction of a second
//! of these commits may be lost (whole, never in part, and never one that
//! a later synchronous commit depends on: the WAL is flushed in order, so
//! queuing or starting a run on a share also makes the share durable, and
//! a start or result makes the contact before it durable). Every sync
//! writes that state again, compared with what is stored, and every
//! contact moves the device's times forward again, so the next contact of
//! each desktop restores it. Commands, idempotency keys, results and every
//! other write keep the database's setting, batched or not: with
//! `synchronous_commit` on (Postgres's default), a batch answers its
//! requests only once the WAL holding it is on disk.

mod batch;
mod errors;
pub mod figures;
mod mcp_sessions;
mod rows;
mod schema;
mod signal_bridge;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use crate::errors::{ConnectError, DropSchemaError};
pub use crate::mcp_sessions::{PostgresMcpSessionStore, SWEEP_BATCH};
pub use crate::schema::{MIGRATIONS, SCHEMA_VERSION};
pub use crate::signal_bridge::{
    CHANNEL, SignalBridge, SignalBridgeHandle, SignalForwarder, SignalListener, SignalStats,
    SignalStatus, TopicDecodeError, WAKE_ALL, decode_topic, encode_topic,
};
pub use crate::store::{PostgresOptions, PostgresStore};
