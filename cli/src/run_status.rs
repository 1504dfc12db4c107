//! The worker's status line while a long run runs: how long it has been
//! running and, when the Graph reports progress, its latest report
//! (`running 3f2c… for 2 min 30 s: step 2 of 5 (40%)`).
//!
//! [`Watched`] wraps the executor and keeps the current run and its latest
//! progress in a [`CurrentRun`]; [`report_long_runs`] prints a line for it
//! at a fixed period once the run is older than one period.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use graph_relay_core::ids::CommandId;
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressReport, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job};

/// What runs now, shared between the executor and the status line.
#[derive(Debug, Clone, Default)]
pub struct CurrentRun(Arc<Mutex<Option<RunningNow>>>);

/// The run in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningNow {
    /// Its command id.
    pub command: CommandId,
    /// When its process started.
    pub since: Instant,
    /// The latest progress report, if any.
    pub progress: Option<ProgressReport>,
}

impl CurrentRun {
    fn set(&self, value: Option<RunningNow>) {
        if let Ok(mut current) = self.0.lock() {
            *current = value;
        }
    }

    fn progress(&self, report: &ProgressReport) {
        if let Ok(mut current) = self.0.lock()
            && let Some(run) = current.as_mut()
        {
            run.progress = Some(report.clone());
        }
    }

    /// The run in progress, if any.
    pub fn snapshot(&self) -> Option<RunningNow> {
        self.0.lock().ok().and_then(|c| c.clone())
    }
}

impl RunningNow {
    /// The status line at `now`.
    pub fn line(&self, now: Instant) -> String {
        let elapsed = now.saturating_duration_since(self.since);
        let mut line = format!("running {} for {}", self.command, human(elapsed));
        if let Some(p) = &self.progress {
            match (&p.message, p.percent) {
                (Some(m), Some(pc)) => line.push_str(&format!(": {m} ({pc:.0}%)")),
                (Some(m), None) => line.push_str(&format!(": {m}")),
                (None, Some(pc)) => line.push_str(&format!(": {pc:.0}%")),
                (None, None) => {}
            }
        }
        line
    }
}

/// `45 s`, `2 min 30 s`, `1 h 5 min`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// An executor whose current run is kept in a [`CurrentRun`].
pub struct Watched<E> {
    inner: E,
    current: CurrentRun,
}

impl<E> Watched<E> {
    /// Wraps `inner`, recording into `current`.
    pub fn new(inner: E, current: CurrentRun) -> Self {
        Self { inner, current }
    }
}

#[async_trait]
impl<E: Executor> Executor for Watched<E> {
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        progress: ProgressSink,
    ) -> ExecutionOutcome {
        self.current.set(Some(RunningNow {
            command: job.command.id,
            since: Instant::now(),
            progress: None,
        }));
        let current = self.current.clone();
        let sink = ProgressSink::new(move |report| {
            current.progress(&report);
            progress.report(report);
        });
        let outcome = self.inner.execute(job, cancel, sink).await;
        self.current.set(None);
        outcome
    }
}

/// Says every `every` what runs, once a run is older than `every`.
pub async fn report_long_runs(current: CurrentRun, every: Duration, say: impl Fn(&str)) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        if let Some(run) = current.snapshot()
            && now.saturating_duration_since(run.since) >= every
        {
            say(&run.line(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_how_long_and_how_far() {
        let since = Instant::now();
        let mut run = RunningNow {
            command: CommandId::parse("3f2c8a4e-0000-4000-8000-000000000001").expect("id"),
            since,
            progress: None,
        };
        let later = since + Duration::from_secs(150);
        assert_eq!(
            run.line(later),
            "running 3f2c8a4e-0000-4000-8000-000000000001 for 2 min 30 s"
        );
        run.progress = Some(ProgressReport {
            message: Some("step 2 of 5".into()),
            percent: Some(40.0),
        });
        assert!(
            run.line(later)
                .ends_with("for 2 min 30 s: step 2 of 5 (40%)")
        );
        run.progress = Some(ProgressReport {
            message: None,
            percent: Some(12.5),
        });
        assert!(
            run.line(since + Duration::from_secs(4000))
                .ends_with("for 1 h 6 min: 12%")
        );
    }
}
