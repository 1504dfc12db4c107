//! The desktop relay as a sans-IO state machine (SPEC §6).
//!
//! [`Relay`] decides everything the desktop half does: when a pass runs,
//! which project to sync, the re-check before running, one command at a
//! time, the control poll, the single cancel, and that every report goes
//! through the outbox before it is posted. It performs nothing itself.
//!
//! # Call order (after quinn-proto's `Connection`)
//! 1. Feed inputs with the `handle_*` methods, each with `now`.
//! 2. Drain [`Relay::poll_action`] and perform every [`Action`]; report each
//!    one's outcome with the matching `handle_*` call.
//! 3. Drain [`Relay::poll_event`] for status lines (optional).
//! 4. Sleep until [`Relay::poll_timeout`] (or until an outcome arrives), then
//!    call [`Relay::handle_timeout`].
//!
//! At most one request of the pass is outstanding at a time (outbox load,
//! a report post, a sync, a claim); while a command runs, the execution and
//! its control requests proceed beside it. The runtime-free
//! [`driver::RelayDriver`] (over HTTP, or in process with
//! [`in_process::QueueTransport`]) and the simulator in `graph-relay-sim`
//! both drive this type; neither contains relay logic.
//!
//! A minimal loop, answering by hand what a driver would perform:
//!
//! ```
//! use std::time::Duration;
//! use graph_relay_core::ids::ProjectId;
//! use graph_relay_core::relay::{Action, Relay, RelayConfig, RelayMode, SharedSet};
//! use graph_relay_core::time::Timestamp;
//!
//! let config = RelayConfig { mode: RelayMode::Interval, ..RelayConfig::default() };
//! let mut shared = SharedSet::new();
//! shared.enable(ProjectId::parse("research").unwrap());
//! let mut relay = Relay::new(config, shared, Timestamp(0));
//! let mut now = Timestamp(0);
//! for _ in 0..3 {
//!     relay.handle_timeout(now);
//!     while let Some(action) = relay.poll_action() {
//!         match action {
//!             // A real driver reads its outbox, then syncs over its transport.
//!             Action::LoadOutbox => relay.handle_outbox_loaded(vec![], now),
//!             Action::Sync(_) => relay.handle_sync_response(Ok(vec![]), now),
//!             Action::RememberProject(_) | Action::ForgetProject(_) => {}
//!             other => unreachable!("nothing was queued: {other:?}"),
//!         }
//!     }
//!     // Sleep until the next timer (the next pass, 20 s later by default).
//!     let next = relay.poll_timeout().expect("interval mode always has a next pass");
//!     assert_eq!(next.since(now), Duration::from_secs(20));
//!     now = next;
//! }
//! relay.handle_shutdown(now);
//! while let Some(action) = relay.poll_action() {
//!     assert_eq!(action, Action::LoadOutbox); // the last delivery attempt
//!     relay.handle_outbox_loaded(vec![], now);
//! }
//! assert!(relay.is_stopped());
//! ```
//!
//! # Modes
//! - [`RelayMode::Interval`] is the published relay: a pass every 20 s (ticks
//!   at a fixed phase; a tick that comes while a pass is busy is skipped),
//!   and a pass right after the shared set changes (if idle); a control poll
//!   every 3 s while a command runs.
//! - [`RelayMode::LongPoll`] (the default) runs passes back to back: when a
//!   pass found nothing to do, it ends with one *held* sync that the server
//!   answers as soon as work is queued for this device (or after its hold
//!   bound); control requests are held likewise and answered at once when
//!   the agent cancels. Network failures back off with jitter, between
//!   half and the whole of a back-off that doubles from 1 s to 5 s
//!   ([`RelayConfig::backoff_max`] says why 5 s).
//!
//! # Outages
//! The relay says when the server stops answering
//! ([`RelayEvent::ServerLost`]), how many attempts went unanswered and for
//! how long, at a bounded rate ([`RelayEvent::StillUnreachable`]), and
//! when it answers again, with the outage's length
//! ([`RelayEvent::ServerBack`]). The rule is in [`reachability`]; drivers
//! only print what it says.
//!
//! # Restarts and withdrawn projects
//! - A relay made by [`Relay::new`] announces that it restarted
//!   ([`Action::Sync`]'s `restarted`), with the command it executes
//!   (`running`), until one sync carrying the announcement succeeded: the
//!   server then ends at once what the device's previous process left
//!   `running`. The announcement waits for an empty outbox: the outbox is
//!   re-sent before the first sync of each pass, and while a report of it
//!   is still undelivered (say the server answers 503) the pass syncs
//!   without the announcement, so a result recorded before a crash always
//!   reaches the server before the server closes its run. If the report can
//!   never be delivered, the run's lease lapses on the server, the report is
//!   then refused for good (`run_closed`, dropped) and the announcement follows.
//! - The relay remembers every project it has synced ([`Action::RememberProject`],
//!   written before the sync is sent; hand the remembered ones back with
//!   [`Relay::remember_synced`] after a restart). A remembered project that is no
//!   longer enabled is synced with an empty list, which removes its shares on the
//!   server, until one such sync succeeded; then it is forgotten
//!   ([`Action::ForgetProject`]). Commands such a sync hands out fail the re-check.
//!
//! # Runs the server closed
//! The server holds a lease on every running command that the control
//! requests renew. When a control answer says the command is no longer
//! running (its lease lapsed while the desktop was unreachable, or it was
//! closed after a restart), the relay stops the execution once
//! ([`Action::CancelExecution`]), polls no more, and reports nothing when it
//! ends ([`RelayEvent::ClosedByServer`], [`RelayEvent::Abandoned`]): the
//! server would refuse the report for good. A report that reaches the
//! server after the close anyway is refused with `retryable: false` and
//! dropped, like any final refusal.
//!
//! # Progress
//! The executor's progress reports ([`Relay::handle_progress`]) are
//! coalesced per run: the latest one is posted ([`Action::PostProgress`])
//! at most once per [`RelayConfig::progress_interval`], one post at a time,
//! without the outbox (only the latest report matters, and a lost one is
//! replaced by the next). Reports stop when the run's execution ends or
//! the server refused one for good.
//!
//! # Local approval
//! A Graph may need the owner's approval before each run
//! ([`SharedSet::require_approval`]; the server never sees that setting).
//! Its command is claimed as usual, so the server shows it `running`; the
//! relay then asks the owner ([`Action::AskApproval`]), posts the progress
//! [`WAITING_FOR_APPROVAL`](crate::command::WAITING_FOR_APPROVAL), and keeps polling control (which renews the
//! lease and notices a cancel). Then:
//! - approved ([`Relay::handle_approval`]): the consent re-check runs again;
//!   if it holds, the command is claimed again under the same execution
//!   (the server may have closed it during a long wait, say its lease lapsed
//!   while the desktop was unreachable; then nothing runs), and the Graph
//!   starts;
//! - denied: the run ends `failed` with [`DECLINED_ON_THE_DESKTOP`] and the
//!   owner's reason, if any;
//! - no answer before the deadline: the prompt is withdrawn
//!   ([`Action::WithdrawApproval`]) and the run ends `failed`, saying so;
//! - the agent cancels: the prompt is withdrawn and the run ends `cancelled`;
//! - the server closes the run: the prompt is withdrawn, nothing is reported;
//! - the worker stops ([`Relay::handle_shutdown`]): the prompt is withdrawn
//!   and the run ends `failed`, saying so.
//!
//! Nothing runs before it is approved.
//!
//! # Cancel on the desktop
//! The owner may cancel the current run on the desktop
//! ([`Relay::handle_local_cancel`], the console's cancel button). It ends
//! like an agent's cancel: the engine is asked to stop once, and the run is
//! reported `cancelled` (fenced by its execution id, through the outbox)
//! with [`CANCELLED_ON_THE_DESKTOP`] as its error, so the agent reads who
//! cancelled it. A run waiting for approval is withdrawn and never runs.
//!
//! # Refusals
//! Whether a refused request is tried again is the server's word: its
//! `retryable` flag, carried by a [`Refusal`] and mapped onto [`PostOutcome`],
//! [`ClaimOutcome`] and [`SyncFailure`] in one place. Every driver (HTTP, the
//! simulator) goes through it.

mod control;
pub mod driver;
pub mod executor;
pub mod in_process;
mod machine;
mod pass;
mod progress;
pub mod reachability;
mod run;
mod types;

pub use machine::Relay;
pub use types::{
    APPROVED_ON_THE_DESKTOP, Action, ApprovalDecision, CANCELLED_ON_THE_DESKTOP, ClaimOutcome,
    DECLINED_ON_THE_DESKTOP, ExecutionOutcome, Job, NOT_APPROVED_IN_TIME, PostOutcome, Refusal,
    RelayCommand, RelayConfig, RelayEvent, RelayMode, SharedSet, SyncFailure,
    WORKER_STOPPED_BEFORE_APPROVAL, WORKER_STOPPED_BEFORE_START,
};
