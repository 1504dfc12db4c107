//! The faults `loadtest --cluster --faults …` injects while the load runs,
//! and what each one did to the runs.
//!
//! The faults come one after another: `--fault-gap` seconds of steady
//! load, the first fault for `--fault-hold` seconds, another gap, the next
//! fault, and so on. Each run belongs to the window of the last fault
//! injected before the agent sent it (runs sent before the first fault are
//! the baseline), and each window says what its runs came to: acknowledged
//! runs never executed (lost), executed twice, not ended when the agent
//! gave up (stuck), how pickup went, and what agents, desktops, the
//! balancer and the servers saw meanwhile.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde::Serialize;

use super::Latency;
use super::agents::RunRecord;
use super::cluster::{Cluster, Source};
use super::tally::{Observation, Party};

/// Pickup p99 that counts as recovered, milliseconds.
pub const RECOVERED_P99_MS: f64 = 50.0;
/// Width of the buckets the recovery is read in.
const BUCKET: Duration = Duration::from_secs(1);
/// Balancer and server lines shown per window.
const LINES_SHOWN: usize = 8;

/// A fault the harness can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL a server; start it again after the hold.
    KillServer,
    /// SIGSTOP a server; SIGCONT after the hold.
    StopServer,
    /// `pg_terminate_backend` on every connection of the servers.
    TerminateBackends,
    /// `pg_ctl stop -m immediate`; start Postgres again after the hold.
    CrashPostgres,
    /// Fill the database's disk (its tmpfs shrunk to what is in use) for
    /// the hold; start Postgres again if it stopped.
    DiskFull,
}

impl Fault {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillServer => "kill-server",
            Fault::StopServer => "stop-server",
            Fault::TerminateBackends => "terminate-backends",
            Fault::CrashPostgres => "crash-postgres",
            Fault::DiskFull => "disk-full",
        }
    }
}

/// One fault as it was injected.
#[derive(Debug, Clone)]
pub struct FaultEvent {
    /// Which.
    pub fault: Fault,
    /// What exactly was done.
    pub what: String,
    /// When it began.
    pub injected: Instant,
    /// When it was lifted (the server or database started again, the
    /// server continued, the disk freed).
    pub lifted: Instant,
    /// Why the injection or the lift failed, if it did.
    pub error: Option<String>,
}

/// Injects `faults` one after another from `origin`: each `gap` seconds
/// after the previous one ended, held `hold` seconds. Server faults go to
/// the servers in turn.
pub async fn inject(
    cluster: &Cluster,
    faults: &[Fault],
    origin: tokio::time::Instant,
    hold: Duration,
    gap: Duration,
) -> Vec<FaultEvent> {
    let mut events = Vec::with_capacity(faults.len());
    let servers = cluster.server_names();
    for (k, fault) in faults.iter().enumerate() {
        // On a fixed schedule (see `schedule_seconds`), so that a slow
        // restart does not push the last fault past the end of the load.
        let k32 = u32::try_from(k).unwrap_or(u32::MAX);
        tokio::time::sleep_until(origin + gap + (hold + gap) * k32).await;
        let i = k % servers.len().max(1);
        let server = servers.get(i).cloned().unwrap_or_default();
        let injected = Instant::now();
        let outcome = one_fault(cluster, *fault, i, &server, hold).await;
        let lifted = Instant::now();
        let (what, error) = match outcome {
            Ok(what) => (what, None),
            Err((what, e)) => (what, Some(e)),
        };
        if let Some(e) = &error {
            tracing::warn!(fault = fault.name(), error = %e, "the fault failed");
        }
        events.push(FaultEvent {
            fault: *fault,
            what,
            injected,
            lifted,
            error,
        });
    }
    events
}

/// Seconds of load `count` faults need: a gap, then each fault's hold and
/// the gap after it.
pub fn schedule_seconds(count: usize, hold: f64, gap: f64) -> f64 {
    gap + count as f64 * (hold + gap)
}

/// An injection or a lift that failed: what was being done, and why.
type Failed = (String, String);

/// Maps an error to a [`Failed`] saying what was being done.
fn failed<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Failed + '_ {
    move |e| (what.to_owned(), e.to_string())
}

/// Injects one fault, holds it and lifts it; returns what was done.
async fn one_fault(
    cluster: &Cluster,
    fault: Fault,
    i: usize,
    server: &str,
    hold: Duration,
) -> Result<String, Failed> {
    match fault {
        Fault::KillServer => kill_server(cluster, i, server, hold).await,
        Fault::StopServer => stop_server(cluster, i, server, hold).await,
        Fault::TerminateBackends => {
            let what = "pg_terminate_backend on every connection of the servers";
            let n = cluster
                .postgres()
                .terminate_backends()
                .await
                .map_err(failed(what))?;
            Ok(format!("{what} ({n} terminated)"))
        }
        Fault::CrashPostgres => crash_postgres(cluster, hold).await,
        Fault::DiskFull => fill_disk(cluster, hold).await,
    }
}

async fn kill_server(
    cluster: &Cluster,
    i: usize,
    server: &str,
    hold: Duration,
) -> Result<String, Failed> {
    let what = format!(
        "SIGKILL {server}, started again after {} s",
        hold.as_secs_f64()
    );
    cluster.kill_server(i).await.map_err(failed(&what))?;
    tokio::time::sleep(hold).await;
    let restart = Instant::now();
    cluster.start_server(i).await.map_err(failed(&what))?;
    Ok(format!(
        "{what} (serving {:.1} s after the start)",
        restart.elapsed().as_secs_f64()
    ))
}

async fn stop_server(
    cluster: &Cluster,
    i: usize,
    server: &str,
    hold: Duration,
) -> Result<String, Failed> {
    let what = format!("SIGSTOP {server}, SIGCONT after {} s", hold.as_secs_f64());
    cluster
        .signal_server(i, Signal::SIGSTOP)
        .map_err(failed(&what))?;
    tokio::time::sleep(hold).await;
    cluster
        .signal_server(i, Signal::SIGCONT)
        .map_err(failed(&what))?;
    Ok(what)
}

async fn crash_postgres(cluster: &Cluster, hold: Duration) -> Result<String, Failed> {
    let what = format!(
        "pg_ctl stop -m immediate, started again after {} s",
        hold.as_secs_f64()
    );
    cluster.postgres().crash().await.map_err(failed(&what))?;
    tokio::time::sleep(hold).await;
    cluster.postgres().restart().await.map_err(failed(&what))?;
    Ok(what)
}

async fn fill_disk(cluster: &Cluster, hold: Duration) -> Result<String, Failed> {
    let secs = hold.as_secs_f64();
    let what = format!("the database's tmpfs shrunk to its use for {secs} s");
    let pg = cluster.postgres();
    let size = pg.fill_disk().await.map_err(failed(&what))?;
    tokio::time::sleep(hold).await;
    pg.free_disk().await.map_err(failed(&what))?;
    let mut what = format!(
        "the database's tmpfs shrunk to its use ({:.0} MiB) for {secs} s",
        size as f64 / (1024.0 * 1024.0)
    );
    // Postgres stops for good when it cannot write its WAL, and an
    // operator then starts it again once there is room.
    if pg.exited() {
        pg.restart().await.map_err(failed(&what))?;
        what.push_str("; Postgres had stopped and was started again");
    }
    Ok(what)
}

/// What one fault (or the baseline before the first) did.
#[derive(Debug, Clone, Serialize)]
pub struct FaultFigures {
    /// The fault's name, or `baseline`.
    pub fault: String,
    /// What was done.
    pub what: String,
    /// Seconds from the start of the load to the injection.
    pub injected_at_s: f64,
    /// Seconds the fault lasted (to the lift).
    pub held_s: f64,
    /// Seconds from the injection to the next fault (or the end).
    pub window_s: f64,
    /// Runs the agents sent in the window.
    pub issued: usize,
    /// Of them, runs a ticket came back for.
    pub acknowledged: usize,
    /// Acknowledged runs no desktop ever executed.
    pub lost: usize,
    /// Runs executed more than once (by command id, or one run under two
    /// command ids).
    pub executed_twice: usize,
    /// Acknowledged runs not ended when the agent gave up (past the lease).
    pub stuck: usize,
    /// Runs read `completed` (or `cancelled`, as asked).
    pub ended_as_asked: usize,
    /// Runs that ended otherwise, by status and reason.
    pub ended_otherwise: BTreeMap<String, usize>,
    /// Pickup of the runs that started in the window (those sent just
    /// before it and slowed by its fault included).
    pub pickup_ms: Latency,
    /// The worst pickup p99 of one second's runs in the window.
    pub worst_second_p99_ms: f64,
    /// Seconds from the lift until every later second's pickup p99 in the
    /// window is under [`RECOVERED_P99_MS`] (0: it never went above after
    /// the lift); `None`: not within the window. Of the runs that started
    /// in the window, by the second they were sent in.
    pub p99_recovered_after_s: Option<f64>,
    /// Each second of the window: seconds from the injection, runs (that
    /// started in the window) sent in that second, their pickup p99; runs
    /// sent before the injection count in the first second.
    pub p99_by_second_ms: Vec<(f64, usize, f64)>,
    /// What the agents saw and retried, by kind.
    pub agents_saw: BTreeMap<String, u64>,
    /// What the desktops saw, by kind.
    pub desktops_saw: BTreeMap<String, u64>,
    /// The balancer's health changes (`+seconds` from the injection).
    pub balancer: Vec<String>,
    /// Warning and error lines of the servers in the window.
    pub server_warnings: usize,
    /// The first few of them, and any exit nobody asked for.
    pub server_lines: Vec<String>,
    /// Why the injection or the lift failed, if it did.
    pub error: Option<String>,
}

/// Everything the windows are cut from.
pub struct Timeline<'a> {
    /// The start of the load.
    pub origin: Instant,
    /// The end of the load.
    pub end: Instant,
    /// The runs, with their outcome.
    pub records: &'a [RunRecord],
    /// Per run (same order): executed twice.
    pub twice: &'a [bool],
    /// Per run (same order): never executed.
    pub never: &'a [bool],
    /// What agents and desktops saw.
    pub observations: &'a [Observation],
    /// The balancer's and servers' kept lines.
    pub lines: &'a [super::cluster::LogLine],
}

impl Timeline<'_> {
    /// The baseline and one entry per fault.
    pub fn windows(&self, events: &[FaultEvent]) -> Vec<FaultFigures> {
        let mut out = Vec::with_capacity(events.len() + 1);
        let first = events.first().map_or(self.end, |e| e.injected);
        out.push(self.window(None, self.origin, self.origin, first));
        for (k, event) in events.iter().enumerate() {
            let end = events.get(k + 1).map_or(self.end, |e| e.injected);
            out.push(self.window(Some(event), event.injected, event.lifted, end));
        }
        out
    }

    fn window(
        &self,
        event: Option<&FaultEvent>,
        from: Instant,
        lifted: Instant,
        to: Instant,
    ) -> FaultFigures {
        let inside = |at: Instant| at >= from && at < to;
        let runs: Vec<usize> = (0..self.records.len())
            .filter(|&i| self.records[i].sent.is_some_and(inside))
            .collect();
        let acknowledged: Vec<usize> = runs
            .iter()
            .copied()
            .filter(|&i| self.records[i].command.is_some())
            .collect();
        let (ended_as_asked, ended_otherwise) = self.endings(&acknowledged);
        // Pickup goes by when the run started: a run sent just before a
        // fault and slowed by it counts with that fault.
        let pickups: Vec<(Instant, Duration)> = self
            .records
            .iter()
            .filter_map(|r| Some((r.sent?, r.pickup?)))
            .filter(|(sent, pickup)| inside(*sent + *pickup))
            .collect();
        let seconds = per_second(&pickups, from);
        let (worst, recovered) = recovery(&seconds, from, lifted);
        let (agents_saw, desktops_saw) = self.seen(inside);
        let (server_warnings, server_lines) = self.server_lines(from, inside);
        FaultFigures {
            fault: event.map_or("baseline".to_owned(), |e| e.fault.name().to_owned()),
            what: event.map_or("steady load, no fault".to_owned(), |e| e.what.clone()),
            injected_at_s: from.saturating_duration_since(self.origin).as_secs_f64(),
            held_s: lifted.saturating_duration_since(from).as_secs_f64(),
            window_s: to.saturating_duration_since(from).as_secs_f64(),
            issued: runs.len(),
            acknowledged: acknowledged.len(),
            lost: acknowledged.iter().filter(|&&i| self.never[i]).count(),
            executed_twice: runs.iter().filter(|&&i| self.twice[i]).count(),
            stuck: acknowledged
                .iter()
                .filter(|&&i| self.records[i].stuck)
                .count(),
            ended_as_asked,
            ended_otherwise,
            pickup_ms: Latency::of(pickups.iter().map(|(_, d)| *d).collect()),
            worst_second_p99_ms: worst,
            p99_recovered_after_s: recovered,
            p99_by_second_ms: seconds
                .iter()
                .map(|(i, n, p99)| (*i as f64 * BUCKET.as_secs_f64(), *n, *p99))
                .collect(),
            agents_saw,
            desktops_saw,
            balancer: self.balancer_lines(from, inside),
            server_warnings,
            server_lines,
            error: event.and_then(|e| e.error.clone()),
        }
    }

    /// Of the acknowledged runs: how many ended as asked, and the others
    /// by status and reason (runs not ended are in neither).
    fn endings(&self, acknowledged: &[usize]) -> (usize, BTreeMap<String, usize>) {
        let mut otherwise = BTreeMap::new();
        let mut as_asked = 0;
        for &i in acknowledged {
            let r = &self.records[i];
            let asked = if r.cancel { "cancelled" } else { "completed" };
            match r.status.as_deref() {
                Some(s) if s == asked => as_asked += 1,
                Some(s) => {
                    let reason = r.reason.as_deref().unwrap_or("no reason");
                    *otherwise.entry(format!("{s}: {reason}")).or_default() += 1;
                }
                None => {}
            }
        }
        (as_asked, otherwise)
    }

    /// What agents and desktops saw in the window, by kind.
    fn seen(
        &self,
        inside: impl Fn(Instant) -> bool,
    ) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let mut agents = BTreeMap::new();
        let mut desktops = BTreeMap::new();
        for o in self.observations.iter().filter(|o| inside(o.at)) {
            let map = match o.party {
                Party::Agent => &mut agents,
                Party::Desktop => &mut desktops,
            };
            *map.entry(o.kind.clone()).or_default() += 1;
        }
        (agents, desktops)
    }

    /// The balancer's health changes in the window.
    fn balancer_lines(&self, from: Instant, inside: impl Fn(Instant) -> bool) -> Vec<String> {
        self.lines
            .iter()
            .filter(|l| l.source == Source::Balancer && inside(l.at))
            .filter(|l| l.text.contains(" is UP") || l.text.contains(" is DOWN"))
            .map(|l| format!("+{:.1}s {}", since(from, l.at), balancer_line(&l.text)))
            .take(LINES_SHOWN)
            .collect()
    }

    /// The servers' warning lines in the window, and the lines shown: the
    /// harness's own, then the first few of the servers'.
    fn server_lines(
        &self,
        from: Instant,
        inside: impl Fn(Instant) -> bool,
    ) -> (usize, Vec<String>) {
        let server: Vec<&super::cluster::LogLine> = self
            .lines
            .iter()
            .filter(|l| l.source != Source::Balancer && inside(l.at))
            .collect();
        let mut shown: Vec<String> = server
            .iter()
            .filter(|l| l.source == Source::Harness)
            .map(|l| format!("+{:.1}s {}", since(from, l.at), l.text))
            .collect();
        shown.extend(
            server
                .iter()
                .filter(|l| l.source == Source::Server)
                .take(LINES_SHOWN)
                .map(|l| format!("+{:.1}s {}", since(from, l.at), shorten(&l.text))),
        );
        let warnings = server.iter().filter(|l| l.source == Source::Server).count();
        (warnings, shown)
    }
}

/// Seconds from `from` to `at` (0 before it).
fn since(from: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(from).as_secs_f64()
}

/// Pickups by the second (from `from`) they were sent in: the second's
/// number, how many, their p99.
fn per_second(pickups: &[(Instant, Duration)], from: Instant) -> Vec<(u64, usize, f64)> {
    let mut buckets: BTreeMap<u64, Vec<Duration>> = BTreeMap::new();
    for (sent, pickup) in pickups {
        let index = sent.saturating_duration_since(from).as_millis() / BUCKET.as_millis();
        buckets
            .entry(u64::try_from(index).unwrap_or(u64::MAX))
            .or_default()
            .push(*pickup);
    }
    buckets
        .into_iter()
        .map(|(i, samples)| (i, samples.len(), Latency::of(samples).p99))
        .collect()
}

/// The worst second's pickup p99, and the seconds from `lifted` until
/// every later second's p99 is under [`RECOVERED_P99_MS`] (0 when none
/// after the lift is above; `None` when the last one is).
fn recovery(seconds: &[(u64, usize, f64)], from: Instant, lifted: Instant) -> (f64, Option<f64>) {
    let worst = seconds.iter().map(|(_, _, p)| *p).fold(0.0, f64::max);
    // The first second after which none is above the threshold.
    let recovered_bucket = match seconds.iter().rposition(|(_, _, p)| *p >= RECOVERED_P99_MS) {
        None => Some(0),
        Some(last_bad) => seconds.get(last_bad + 1).map(|(i, _, _)| *i),
    };
    let recovered = recovered_bucket.map(|i| {
        let at = from + BUCKET * u32::try_from(i).unwrap_or(u32::MAX);
        at.saturating_duration_since(lifted).as_secs_f64()
    });
    (worst, recovered)
}

/// `Server graph_relay/s1 is DOWN, reason: …, check duration: …` → the
/// part up to the check duration.
fn balancer_line(text: &str) -> String {
    let text = text.split(") : ").nth(1).unwrap_or(text);
    let text = text.split(", check duration").next().unwrap_or(text);
    shorten(text)
}

fn shorten(text: &str) -> String {
    const MAX: usize = 160;
    if text.chars().count() <= MAX {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(MAX).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_read_after_the_last_slow_second() {
        let from = Instant::now();
        let at = |ms: u64| from + Duration::from_millis(ms);
        let fast = Duration::from_millis(10);
        let slow = Duration::from_millis(800);
        let pickups = [
            (at(100), fast),
            (at(1100), slow),
            (at(2100), slow),
            (at(3100), fast),
            (at(4100), fast),
        ];
        let seconds = |p: &[(Instant, Duration)]| per_second(p, from);
        assert_eq!(seconds(&pickups)[1], (1, 1, 800.0));
        // Lifted at 1 s: the slow seconds end at 3 s, 2 s after the lift.
        let (worst, recovered) = recovery(&seconds(&pickups), from, at(1000));
        assert_eq!(worst, 800.0);
        assert_eq!(recovered, Some(2.0));
        // Nothing slow: recovered at once.
        assert_eq!(
            recovery(&seconds(&pickups[3..]), from, at(1000)).1,
            Some(0.0)
        );
        // Slow to the end: not recovered within the window.
        assert_eq!(recovery(&seconds(&pickups[..3]), from, at(1000)).1, None);
    }

    #[test]
    fn balancer_lines_keep_the_reason() {
        let line = "[WARNING]  (3374) : Server graph_relay/s2 is DOWN, reason: Layer7 timeout, check duration: 1001ms. 2 active and 0 backup servers left.";
        assert_eq!(
            balancer_line(line),
            "Server graph_relay/s2 is DOWN, reason: Layer7 timeout"
        );
    }
}
