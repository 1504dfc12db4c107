//! What the desktops and agents of `graph-relay loadtest` share while the
//! load runs: the executions by command id and by run, the errors and the
//! failed requests by kind, the connections, and the pickups so far.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::agents::RunRecord;
use super::workers;

/// Who saw a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Party {
    Agent,
    Desktop,
}

/// A failed request an agent or a desktop saw (and retried).
#[derive(Debug, Clone)]
pub(super) struct Observation {
    pub(super) at: Instant,
    pub(super) party: Party,
    pub(super) kind: String,
}

/// Most observations kept (a long outage makes many); later ones are
/// counted as `observations_dropped`.
pub(super) const MAX_OBSERVATIONS: usize = 1_000_000;

/// What the harness records of each execution, per command id.
#[derive(Debug, Default)]
pub(super) struct Execution {
    /// How many times a desktop's executor started the command.
    pub(super) starts: u32,
    /// When it first started.
    pub(super) started: Option<Instant>,
    /// When the executor returned.
    pub(super) finished: Option<Instant>,
    /// Agents waiting for the start.
    pub(super) waiters: Vec<oneshot::Sender<Instant>>,
}

/// What the desktops and agents share: executions, errors, connections.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) executions: Mutex<HashMap<String, Execution>>,
    /// The command ids each run (its number in the Graph's arguments) was
    /// executed under: more than one is a run executed twice.
    pub(super) runs: Mutex<HashMap<u64, BTreeSet<String>>>,
    pub(super) errors: Mutex<BTreeMap<String, u64>>,
    pub(super) connected: AtomicUsize,
    /// The load phase runs: failed syncs count as errors.
    pub(super) loaded: AtomicBool,
    /// Faults are injected: failed requests are what they cause, reported
    /// with them, not errors.
    pub(super) faulty: AtomicBool,
    pub(super) observations: Mutex<Vec<Observation>>,
    /// (sent, pickup) of every run picked up so far.
    pub(super) pickups: Mutex<Vec<(Instant, Duration)>>,
    /// Worker processes whose first sync was answered.
    pub(super) workers_connected: AtomicUsize,
}

impl Tally {
    pub(super) fn executions(&self) -> MutexGuard<'_, HashMap<String, Execution>> {
        lock(&self.executions)
    }

    pub(super) fn error(&self, kind: &str) {
        *lock(&self.errors).entry(kind.to_owned()).or_default() += 1;
    }

    /// Counts a failed request. Without faults, an agent's is an error
    /// too (a desktop's failed sync is one already, by its own kind; its
    /// other retries never were).
    pub(super) fn observe(&self, party: Party, kind: String) {
        if party == Party::Agent
            && !self.faulty.load(Ordering::Relaxed)
            && self.loaded.load(Ordering::Relaxed)
        {
            self.error(&format!("agent retried {kind}"));
        }
        let mut observations = lock(&self.observations);
        if observations.len() < MAX_OBSERVATIONS {
            observations.push(Observation {
                at: Instant::now(),
                party,
                kind,
            });
        } else {
            drop(observations);
            self.error("observations_dropped");
        }
    }

    pub(super) fn observations(&self) -> Vec<Observation> {
        lock(&self.observations).clone()
    }

    /// Records a run's pickup for the interval rows.
    pub(super) fn picked_up(&self, sent: Instant, pickup: Duration) {
        lock(&self.pickups).push((sent, pickup));
    }

    /// Pickups of the runs sent in `[from, to)`.
    pub(super) fn pickups_sent_between(&self, from: Instant, to: Instant) -> Vec<Duration> {
        lock(&self.pickups)
            .iter()
            .filter(|(sent, _)| *sent >= from && *sent < to)
            .map(|(_, pickup)| *pickup)
            .collect()
    }

    /// Resolves when command `id` starts (at once if it did).
    pub(super) fn started(&self, id: &str) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        let mut executions = self.executions();
        let execution = executions.entry(id.to_owned()).or_default();
        match execution.started {
            Some(at) => {
                let _ = tx.send(at);
            }
            None => execution.waiters.push(tx),
        }
        rx
    }

    pub(super) fn finished(&self, id: &str) -> Option<Instant> {
        self.executions().get(id).and_then(|e| e.finished)
    }

    /// Counts the executions the workers' Graphs wrote, and gives each
    /// worker run its pickup (from the wall clock the agent sent it by).
    pub(super) fn count_ledger(&self, ledger: &[workers::LedgerEntry], records: &mut [RunRecord]) {
        let started: HashMap<&str, std::time::SystemTime> = ledger
            .iter()
            .map(|e| (e.command.as_str(), e.started))
            .collect();
        {
            let mut executions = self.executions();
            let mut runs = lock(&self.runs);
            for entry in ledger {
                executions.entry(entry.command.clone()).or_default().starts += 1;
                if let Some(run) = entry.run {
                    runs.entry(run).or_default().insert(entry.command.clone());
                }
            }
        }
        for record in records.iter_mut().filter(|r| r.worker) {
            let (Some(id), Some(sent)) = (&record.command, record.sent_wall) else {
                continue;
            };
            record.worker_pickup = started
                .get(id.as_str())
                .and_then(|at| at.duration_since(sent).ok());
        }
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
