//! Graph processes a crashed worker left behind.
//!
//! The process executor records each Graph process group in the outbox file
//! right after starting it ([`record_of`]) and removes the record when the
//! run ended. A worker killed mid-run (SIGKILL, a crash, the OOM killer)
//! leaves its record behind, and possibly the group: the Graph's own process
//! gets SIGTERM from the kernel when the worker dies (the parent-death
//! signal), but what it started, or a process that ignores SIGTERM, runs on.
//! When the next worker starts, [`end_left_over`] ends every recorded group
//! that still runs (SIGTERM, the grace period, then SIGKILL), logs it and
//! removes the records.
//!
//! A recorded group is the one the worker started only if it is the same
//! boot and, when its leader still runs, the leader's start time matches:
//! process ids are reused, start times (clock ticks since boot) are not. A
//! group whose leader is gone still holds its id, which the kernel does not
//! hand out while any member lives; its members are those in the group that
//! started no earlier than the leader did.
//!
//! Everything here reads Linux's `/proc`; elsewhere nothing is recorded and
//! nothing is killed.

use std::time::{Duration, Instant};

use graph_relay_core::ids::CommandId;
use graph_relay_core::time::Clock;
use graph_relay_core::time::SystemClock;
use graph_relay_store_sqlite::{GraphProcess, SqliteOutbox};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How often a group is looked at while it is given time to end.
const POLL: Duration = Duration::from_millis(50);
/// How long to wait for a group to go after SIGKILL.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// The fields of `/proc/<pid>/stat` this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `Z` (zombie), …
    pub state: char,
    /// Field 5: the process group.
    pub pgrp: i32,
    /// Field 22: when the process started, in clock ticks since boot.
    pub start_time: u64,
}

impl ProcStat {
    /// Parses the text of `/proc/<pid>/stat`. The command name (field 2) may
    /// hold spaces and parentheses, so the fields are counted from its last `)`.
    pub fn parse(text: &str) -> Option<Self> {
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3.
        Some(Self {
            state: fields.first()?.chars().next()?,
            pgrp: fields.get(2)?.parse().ok()?,
            start_time: fields.get(19)?.parse().ok()?,
        })
    }

    /// The stat of process `pid`, if it exists (and `/proc` does).
    pub fn of(pid: i32) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The record of the Graph process `pid` (the leader of its own group) that
/// runs `command`; `None` where `/proc` cannot tell its start time.
pub fn record_of(pid: u32, command: CommandId) -> Option<GraphProcess> {
    let pid = i32::try_from(pid).ok()?;
    let stat = ProcStat::of(pid)?;
    Some(GraphProcess {
        pgid: pid,
        start_time: stat.start_time,
        boot_id: boot_id()?,
        command,
        recorded_at: SystemClock.now(),
    })
}

/// The live (not zombie) processes of the recorded group: none if the
/// record is from another boot or its id now names another process.
pub fn members(record: &GraphProcess) -> Vec<i32> {
    if boot_id().as_deref() != Some(record.boot_id.as_str()) {
        return Vec::new();
    }
    if let Some(leader) = ProcStat::of(record.pgid)
        && leader.start_time != record.start_time
    {
        // The id was reused: the recorded group ended long ago.
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            ProcStat::of(*pid).is_some_and(|s| {
                s.pgrp == record.pgid && s.state != 'Z' && s.start_time >= record.start_time
            })
        })
        .collect()
}

/// Sends `signal` to the group, then waits up to `wait` for it to be gone.
/// Returns true if it is gone.
async fn signal_and_wait(record: &GraphProcess, signal: Signal, wait: Duration) -> bool {
    // ESRCH: the group ended meanwhile.
    let _ = killpg(Pid::from_raw(record.pgid), signal);
    let deadline = Instant::now() + wait;
    loop {
        if members(record).is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Ends every Graph process group a previous worker recorded in `outbox`
/// and left running (SIGTERM, `grace`, SIGKILL), calls `report` with a line
/// for each, and removes the records.
pub async fn end_left_over(outbox: &SqliteOutbox, grace: Duration, mut report: impl FnMut(String)) {
    let records = match outbox.processes().await {
        Ok(records) => records,
        Err(e) => {
            report(format!("orphans: cannot read the recorded processes: {e}"));
            return;
        }
    };
    for record in records {
        let alive = members(&record);
        if !alive.is_empty() {
            let what = format!(
                "orphans: process group {} of command {} ({} process(es)) was left running by a previous worker",
                record.pgid,
                record.command,
                alive.len()
            );
            if signal_and_wait(&record, Signal::SIGTERM, grace).await {
                report(format!("{what}: ended with SIGTERM"));
            } else if signal_and_wait(&record, Signal::SIGKILL, AFTER_KILL).await {
                report(format!(
                    "{what}: ended with SIGKILL after {} s",
                    grace.as_secs()
                ));
            } else {
                report(format!("{what}: it survived SIGKILL"));
            }
        }
        if let Err(e) = outbox.remove_process(record.pgid, record.start_time).await {
            report(format!(
                "orphans: cannot remove the record of group {}: {e}",
                record.pgid
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (we (i) rd) S 1 4240 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(
            ProcStat::parse(line),
            Some(ProcStat {
                state: 'S',
                pgrp: 4240,
                start_time: 987_654
            })
        );
        assert_eq!(ProcStat::parse("4242 (cut) S 1 2"), None);
        assert_eq!(ProcStat::parse("no parenthesis"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id();
        let stat = ProcStat::of(i32::try_from(me).unwrap()).expect("/proc");
        assert_ne!(stat.state, 'Z');
        let record = record_of(me, CommandId::from_uuid(uuid::Uuid::from_u128(1))).unwrap();
        assert_eq!(record.start_time, stat.start_time);
        assert!(!record.boot_id.is_empty());
        // Another start time: not this process, so nothing to end.
        let reused = GraphProcess {
            start_time: stat.start_time + 1,
            ..record.clone()
        };
        assert!(members(&reused).is_empty());
        let other_boot = GraphProcess {
            boot_id: "another-boot".into(),
            ..record
        };
        assert!(members(&other_boot).is_empty());
    }
}
