//! Experiment 7: result size.

use super::*;

/// Experiment 7: the longest result text that still fits the 100,000-character envelope.
pub fn result_size() -> Outcome {
    let mut table = Table::new(
        "7. Longest result text that fits (compact JSON length <= 100,000)",
        &[
            "text",
            "characters",
            "UTF-16 units",
            "UTF-8 bytes",
            "one more",
        ],
    );
    let mut figures = Map::new();
    for (label, unit) in [
        ("ASCII", "a"),
        ("Japanese", "日"),
        ("emoji", "😀"),
        ("newlines", "\n"),
    ] {
        let fits = |n: usize| {
            let body = EnvelopeBody {
                result: json!(unit.repeat(n)),
                total_tokens: Some(1000),
                reported_cost: Some(0.01),
                error: None,
            };
            let exec =
                ExecutionId::parse("exec-0123456789abcdef").unwrap_or_else(|e| unreachable!("{e}"));
            !ResultEnvelope::build(exec, FinishStatus::Completed, body).is_truncated()
        };
        let (mut lo, mut hi) = (0usize, RESULT_LIMIT);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let text = unit.repeat(lo);
        let units: usize = text.chars().map(char::len_utf16).sum();
        table.row(vec![
            label.into(),
            lo.to_string(),
            units.to_string(),
            text.len().to_string(),
            if fits(lo + 1) {
                "fits".into()
            } else {
                "truncated".into()
            },
        ]);
        figures.insert(
            label.into(),
            json!({"characters": lo, "utf16_units": units, "utf8_bytes": text.len()}),
        );
    }
    table.note("The limit counts UTF-16 code units of JSON.stringify, not bytes: Japanese fits like ASCII at three times the bytes.");
    Outcome {
        name: "result-size",
        table,
        figures: Value::Object(figures),
        plot: Plot::None,
    }
}
