use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;
use crate::envelope::EnvelopeBody;

// The decisions of a transition as values, for these tests only.

/// What `cancel` decided.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
#[allow(clippy::large_enum_variant)] // returned once and moved into the store
enum CancelDecision {
    /// Write this record: queued → cancelled, or the running flag set.
    Apply(CommandRecord),
    /// Nothing to write: already terminal or already flagged.
    Unchanged,
}

/// What `start` decided.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
#[allow(clippy::large_enum_variant)] // returned once and moved into the store
enum StartDecision {
    /// Write this record: queued → running.
    Apply(CommandRecord),
    /// Already running under the same execution id: a retried start.
    AlreadyStarted,
}

/// What `complete` decided.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
#[allow(clippy::large_enum_variant)] // returned once and moved into the store
enum CompleteDecision {
    /// Write this record: running → terminal.
    Apply(CommandRecord),
    /// The same completion was already applied: acknowledge, change nothing.
    Duplicate,
}

/// What `decline` decided.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
#[allow(clippy::large_enum_variant)] // returned once and moved into the store
enum DeclineDecision {
    /// Write this record: queued → cancelled with [`NO_LONGER_SHARED`].
    Apply(CommandRecord),
    /// Already terminal: nothing to do.
    Unchanged,
}

impl CommandRecord {
    /// The agent asks to cancel. Queued: cancelled at once. Running: the flag
    /// is set for the relay's control poll. Terminal or already flagged: no change.
    fn cancel(&self, now: Timestamp) -> CancelDecision {
        let mut next = self.clone();
        if next.cancel_in_place(now) {
            CancelDecision::Apply(next)
        } else {
            CancelDecision::Unchanged
        }
    }

    /// The relay starts the command under `execution`.
    fn start(
        &self,
        execution: &ExecutionId,
        now: Timestamp,
        lease: std::time::Duration,
    ) -> Result<StartDecision, StartRefused> {
        let mut next = self.clone();
        Ok(if next.start_in_place(execution, now, lease)? {
            StartDecision::Apply(next)
        } else {
            StartDecision::AlreadyStarted
        })
    }

    /// The relay reports how the execution ended. Fenced by execution id: the
    /// first completion wins, an identical duplicate is acknowledged, anything
    /// else is refused. If the agent asked to cancel, the command ends
    /// `cancelled` whatever the relay reports.
    fn complete(
        &self,
        envelope: &ResultEnvelope,
        now: Timestamp,
    ) -> Result<CompleteDecision, CompleteRefused> {
        let mut next = self.clone();
        Ok(if next.complete_in_place(envelope, now)? {
            CompleteDecision::Apply(next)
        } else {
            CompleteDecision::Duplicate
        })
    }

    /// The relay's re-check just before running failed: close as cancelled
    /// with [`NO_LONGER_SHARED`].
    fn decline(&self, now: Timestamp) -> Result<DeclineDecision, DeclineRefused> {
        let mut next = self.clone();
        Ok(if next.decline_in_place(now)? {
            DeclineDecision::Apply(next)
        } else {
            DeclineDecision::Unchanged
        })
    }
}

fn record() -> CommandRecord {
    CommandRecord::queued(
        CommandId::parse("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap(),
        AgentId::parse("agent").unwrap(),
        OwnerId::parse("owner").unwrap(),
        ProjectId::parse("proj").unwrap(),
        DeviceId::parse("desk").unwrap(),
        GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap(),
        Map::new(),
        IdempotencyKey::parse("key-0001").unwrap(),
        Timestamp(1000),
    )
}

fn exec(s: &str) -> ExecutionId {
    ExecutionId::parse(s).unwrap()
}

const LEASE: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn a_lease_is_granted_renewed_by_half_and_lapses_into_failed() {
    let running = started();
    assert_eq!(running.lease_expires_at, Some(Timestamp(62_000)));
    assert_eq!(running.heard_at, Some(Timestamp(2000)));
    assert!(!running.is_lapsed(Timestamp(61_999)));
    assert!(running.is_lapsed(Timestamp(62_000)));
    // Renewal writes only once less than half the lease is left.
    let mut renewed = running.clone();
    assert!(!renewed.renew_in_place(Timestamp(30_000), LEASE));
    assert_eq!(renewed, running);
    assert!(renewed.renew_in_place(Timestamp(40_000), LEASE));
    assert_eq!(renewed.lease_expires_at, Some(Timestamp(100_000)));
    assert_eq!(renewed.heard_at, Some(Timestamp(40_000)));
    assert_eq!(renewed.revision, running.revision + 1);
    // A retried start is a contact too.
    let mut retried = running.clone();
    assert_eq!(
        retried.start_in_place(&exec("e1"), Timestamp(45_000), LEASE),
        Ok(true)
    );
    assert_eq!(retried.lease_expires_at, Some(Timestamp(105_000)));

    // A read after the lapse shows it closed, at the instant it lapsed.
    let seen = running.at(Timestamp(90_000)).into_owned();
    assert_eq!(seen.status, CommandStatus::Failed);
    assert_eq!(seen.finished_at, Some(Timestamp(62_000)));
    let reason = seen.reason.clone().unwrap_or_default();
    assert!(reason.starts_with(LEASE_LAPSED), "{reason}");
    assert!(
        reason.contains(&Timestamp(2000).to_rfc3339()),
        "names the last contact: {reason}"
    );
    assert!(seen.closed_without_report());
    // The write the sweep makes later is the same record.
    let mut swept = running.clone();
    assert!(swept.lapse_in_place(Timestamp(120_000)));
    assert_eq!(swept, seen);
    assert!(!swept.lapse_in_place(Timestamp(130_000)), "once");
    // Nothing renews, starts or completes a lapsed run.
    let mut late = running.clone();
    assert!(!late.renew_in_place(Timestamp(70_000), LEASE));
    let result = env("e1", FinishStatus::Completed, json!("late"));
    assert_eq!(
        running.complete(&result, Timestamp(70_000)),
        Err(CompleteRefused::Lapsed("failed"))
    );
    assert_eq!(
        swept.complete(&result, Timestamp(70_000)),
        Err(CompleteRefused::Lapsed("failed"))
    );
    assert_eq!(
        running.start(&exec("e1"), Timestamp(70_000), LEASE),
        Err(StartRefused::Finished("failed"))
    );
}

#[test]
fn cancelling_a_lapsed_run_ends_it_cancelled_at_once() {
    let running = started();
    let CancelDecision::Apply(cancelled) = running.cancel(Timestamp(70_000)) else {
        panic!("a lapsed run is cancelled")
    };
    assert_eq!(cancelled.status, CommandStatus::Cancelled);
    assert_eq!(cancelled.finished_at, Some(Timestamp(70_000)));
    assert!(
        cancelled
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(LEASE_LAPSED))
    );
    // Flagged before the lapse: the lapse ends it cancelled too.
    let CancelDecision::Apply(flagged) = running.cancel(Timestamp(10_000)) else {
        panic!("flag")
    };
    let ended = flagged.at(Timestamp(62_000)).into_owned();
    assert_eq!(ended.status, CommandStatus::Cancelled);
    assert_eq!(ended.finished_at, Some(Timestamp(62_000)));
    // A desktop that restarted closes what it no longer runs.
    let mut restarted = running.clone();
    assert!(restarted.close_after_restart_in_place(Timestamp(5000)));
    assert_eq!(restarted.status, CommandStatus::Failed);
    assert_eq!(restarted.finished_at, Some(Timestamp(5000)));
    assert!(
        restarted
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(DESKTOP_RESTARTED))
    );
    assert_eq!(
        restarted.complete(
            &env("e1", FinishStatus::Completed, json!(1)),
            Timestamp(6000)
        ),
        Err(CompleteRefused::Lapsed("failed"))
    );
    assert!(!record().close_after_restart_in_place(Timestamp(5000)));
}

fn env(e: &str, status: FinishStatus, result: Value) -> ResultEnvelope {
    ResultEnvelope::build(
        exec(e),
        status,
        EnvelopeBody {
            result,
            ..EnvelopeBody::default()
        },
    )
}

fn started() -> CommandRecord {
    match record().start(&exec("e1"), Timestamp(2000), LEASE).unwrap() {
        StartDecision::Apply(r) => r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn cancel_queued_is_immediate_and_terminal() {
    let CancelDecision::Apply(c) = record().cancel(Timestamp(1500)) else {
        panic!()
    };
    assert_eq!(c.status, CommandStatus::Cancelled);
    assert_eq!(c.finished_at, Some(Timestamp(1500)));
    assert_eq!(c.revision, 1);
    assert_eq!(c.cancel(Timestamp(1600)), CancelDecision::Unchanged);
    assert_eq!(
        c.start(&exec("e1"), Timestamp(1700), LEASE),
        Err(StartRefused::Finished("cancelled"))
    );
}

#[test]
fn cancel_running_sets_flag_and_wins_over_a_late_finish() {
    let CancelDecision::Apply(flagged) = started().cancel(Timestamp(3000)) else {
        panic!()
    };
    assert_eq!(flagged.status, CommandStatus::Running);
    assert!(flagged.cancel_requested);
    assert_eq!(flagged.cancel(Timestamp(3100)), CancelDecision::Unchanged);
    let late = env("e1", FinishStatus::Completed, json!("done"));
    let Ok(CompleteDecision::Apply(done)) = flagged.complete(&late, Timestamp(4000)) else {
        panic!()
    };
    assert_eq!(done.status, CommandStatus::Cancelled);
    assert_eq!(done.reason.as_deref(), Some(CANCELLED_WHILE_RUNNING));
}

#[test]
fn completion_is_fenced_by_execution() {
    let running = started();
    assert_eq!(
        running.start(&exec("e1"), Timestamp(2100), LEASE),
        Ok(StartDecision::AlreadyStarted)
    );
    assert_eq!(
        running.start(&exec("e2"), Timestamp(2100), LEASE),
        Err(StartRefused::OtherExecution)
    );
    let other = env("e2", FinishStatus::Completed, json!(1));
    assert_eq!(
        running.complete(&other, Timestamp(3000)),
        Err(CompleteRefused::StaleExecution)
    );
    let first = env("e1", FinishStatus::Completed, json!(1));
    let Ok(CompleteDecision::Apply(done)) = running.complete(&first, Timestamp(3000)) else {
        panic!()
    };
    assert_eq!(done.status, CommandStatus::Completed);
    assert_eq!(
        done.complete(&first, Timestamp(3500)),
        Ok(CompleteDecision::Duplicate)
    );
    let different = env("e1", FinishStatus::Failed, json!(null));
    assert_eq!(
        done.complete(&different, Timestamp(3500)),
        Err(CompleteRefused::Conflict)
    );
    assert_eq!(
        done.complete(&other, Timestamp(3500)),
        Err(CompleteRefused::StaleExecution)
    );
    assert_eq!(
        record().complete(&first, Timestamp(3500)),
        Err(CompleteRefused::NotStarted)
    );
    // Closed before it ever started: said so, not "another execution".
    let CancelDecision::Apply(cancelled) = record().cancel(Timestamp(1)) else {
        panic!()
    };
    let refused = cancelled.complete(&first, Timestamp(3500));
    assert_eq!(
        refused,
        Err(CompleteRefused::ClosedBeforeStart("cancelled"))
    );
    let text = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("cancelled before it started"), "{text}");
}

#[test]
fn decline_closes_queued_with_the_exact_message() {
    let Ok(DeclineDecision::Apply(d)) = record().decline(Timestamp(5000)) else {
        panic!()
    };
    assert_eq!(d.status, CommandStatus::Cancelled);
    assert_eq!(
        d.reason.as_deref(),
        Some("Graph session is no longer shared with this project")
    );
    assert_eq!(d.decline(Timestamp(5001)), Ok(DeclineDecision::Unchanged));
    assert_eq!(started().decline(Timestamp(5001)), Err(DeclineRefused));
}

#[test]
fn terminal_states_never_change() {
    let CancelDecision::Apply(cancelled) = record().cancel(Timestamp(1)) else {
        panic!()
    };
    let Ok(CompleteDecision::Apply(completed)) =
        started().complete(&env("e1", FinishStatus::Completed, json!(1)), Timestamp(3))
    else {
        panic!()
    };
    for t in [cancelled, completed] {
        assert_eq!(t.cancel(Timestamp(9)), CancelDecision::Unchanged);
        assert!(t.start(&exec("e9"), Timestamp(9), LEASE).is_err());
        assert!(matches!(
            t.decline(Timestamp(9)),
            Ok(DeclineDecision::Unchanged)
        ));
        assert!(!matches!(
            t.complete(&env("e9", FinishStatus::Failed, json!(0)), Timestamp(9)),
            Ok(CompleteDecision::Apply(_))
        ));
    }
}

/// The first implementation: the canonical text built in memory with
/// serde_json's own string writer, then hashed. Digests already stored
/// must stay valid, so the streaming version must agree with it.
fn reference_fingerprint(gs: &GraphSessionId, arguments: &Map<String, Value>) -> String {
    fn value(out: &mut String, v: &Value) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_unstable();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push(':');
                    value(out, &map[k]);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    value(out, item);
                }
                out.push(']');
            }
            Value::String(t) => out.push_str(&serde_json::to_string(t).unwrap()),
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut text = format!("{}\n", gs.as_str());
    value(&mut text, &Value::Object(arguments.clone()));
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn streaming_fingerprint_equals_the_stored_format() {
    let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
    let mut every_byte = String::new();
    for c in 0u8..0x80 {
        every_byte.push(char::from(c));
    }
    let samples = [
        json!({}),
        json!({"n": 1}),
        json!({"b": 2, "a": [1, -2.5, 1e300, 0.1, null, true, false]}),
        json!({"text": every_byte, "日本": "😀 \u{7f} \u{2028}", "": {"z": {}, "y": []}}),
        json!({"deep": {"b": {"d": 1, "c": 2}, "a": [{"y": 1, "x": 2}]}, "u64": u64::MAX, "i64": i64::MIN}),
    ];
    for sample in samples {
        let Value::Object(map) = sample else { panic!() };
        assert_eq!(
            request_fingerprint(&gs, &map),
            reference_fingerprint(&gs, &map),
            "{map:?}"
        );
    }
}

#[test]
fn overwrite_with_makes_records_equal() {
    // A later revision of the same command: the cheap path.
    let mut stored = record();
    let running = started();
    stored.overwrite_with(&running);
    assert_eq!(stored, running);
    let Ok(CompleteDecision::Apply(done)) = running.complete(
        &env("e1", FinishStatus::Completed, json!({"ok": 1})),
        Timestamp(3000),
    ) else {
        panic!()
    };
    stored.overwrite_with(&done);
    assert_eq!(stored, done);
    // A different request (other arguments): everything is copied.
    let mut other = record();
    other.arguments = std::sync::Arc::new(Map::from_iter([("x".to_owned(), json!(1))]));
    other.revision = 9;
    stored.overwrite_with(&other);
    assert_eq!(stored, other);
}

fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\a-z\u{7f}\u{2028}é😀]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("[a-z\\x00-\\x1f\"é]{0,6}", inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn streaming_fingerprint_equals_the_reference_for_any_arguments(
        entries in proptest::collection::vec(("[a-z\\x00-\\x1f\"é]{0,6}", json_value()), 0..6)
    ) {
        let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
        let map: Map<String, Value> = entries.into_iter().collect();
        proptest::prop_assert_eq!(
            request_fingerprint(&gs, &map),
            reference_fingerprint(&gs, &map)
        );
    }
}

#[test]
fn fingerprint_ignores_key_order_only() {
    let gs = GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").unwrap();
    let a: Map<String, Value> = serde_json::from_str(r#"{"a":1,"b":{"y":[1,2],"x":"s"}}"#).unwrap();
    let b: Map<String, Value> = serde_json::from_str(r#"{"b":{"x":"s","y":[1,2]},"a":1}"#).unwrap();
    let c: Map<String, Value> = serde_json::from_str(r#"{"a":1,"b":{"y":[2,1],"x":"s"}}"#).unwrap();
    assert_eq!(request_fingerprint(&gs, &a), request_fingerprint(&gs, &b));
    assert_ne!(request_fingerprint(&gs, &a), request_fingerprint(&gs, &c));
    assert_eq!(request_fingerprint(&gs, &a).len(), 64);
}
