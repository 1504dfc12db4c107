//! Running `graph-relay loadtest` and checking its `--json` report, for the
//! small-scale harness tests (one server it starts itself, or several
//! running ones).

use std::ffi::OsStr;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// Runs `graph-relay loadtest ARGS` to the end; without the baselines
/// unless `ARGS` asks for them (`--baseline-seconds`): the README's small
/// load test measures them.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    if !args.iter().any(|a| a == "--baseline-seconds") {
        args.extend(["--baseline-seconds".into(), "0".into()]);
    }
    Command::new(BIN)
        .arg("loadtest")
        .args(args)
        .env("GRAPH_RELAY_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// Lossy UTF-8 of a child's output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The stdout of a run that must have succeeded.
pub fn succeeded(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "loadtest failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    stdout
}

/// `issued` runs queued and each executed exactly once, `cancelled` of
/// them cancelled and the rest completed.
pub fn check_runs(report: &Value, issued: u64, cancelled: u64) {
    let count = |k: &str| {
        report["runs"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("runs.{k} is missing: {report}"))
    };
    assert_eq!(count("issued"), issued, "{report}");
    assert_eq!(count("queued"), issued, "{report}");
    assert_eq!(count("executed_once"), issued, "{report}");
    assert_eq!(count("executed_twice"), 0, "{report}");
    assert_eq!(count("never_executed"), 0, "{report}");
    assert_eq!(count("cancelled"), cancelled, "{report}");
    assert_eq!(count("completed"), issued - cancelled, "{report}");
}

/// p50 ≤ p99 ≤ max, all finite and not negative, and `count` samples.
pub fn check_latency(report: &Value, name: &str, count: u64) {
    let l = &report["latency_ms"][name];
    assert_eq!(l["count"].as_u64(), Some(count), "{name} count: {report}");
    let figure = |f: &str| {
        l[f].as_f64()
            .unwrap_or_else(|| panic!("{name}.{f} is missing: {report}"))
    };
    let (p50, p99, max) = (figure("p50"), figure("p99"), figure("max"));
    assert!(
        p50.is_finite() && p50 >= 0.0 && p50 <= p99 && p99 <= max,
        "{name}: p50 {p50} p99 {p99} max {max}"
    );
    if count > 0 {
        assert!(
            max > 0.0,
            "{name}: {count} samples and a max of 0: {report}"
        );
    }
}

/// A server's process figures: RSS within its peak, CPU finite and not
/// negative.
pub fn check_server_process(server: &Value) {
    let rss = server["rss_mib"].as_f64().expect("server RSS");
    let peak = server["peak_rss_mib"].as_f64().expect("server peak RSS");
    assert!(rss > 0.0 && rss <= peak, "RSS {rss} peak {peak}");
    for cpu in ["idle_cpu_percent", "load_cpu_percent"] {
        let v = server[cpu].as_f64().expect("server CPU");
        assert!(v >= 0.0 && v.is_finite(), "{cpu} {v}");
    }
}
