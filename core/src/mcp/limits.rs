//! Bounds on what a session keeps from its client.

use serde_json::Value;

/// Largest `clientInfo`, and largest `capabilities`, an `initialize` may
/// carry, each measured as compact JSON: 16 KiB. A larger one is refused
/// with `-32602` naming this limit, so a session never keeps more.
pub const MAX_INITIALIZE_FIELD_BYTES: usize = 16 * 1024;

/// The length of `value` as compact JSON (what `serde_json::to_string`
/// writes) if it is at most `limit` bytes; `None` beyond. The work is
/// bounded by `limit`, not by the size of `value`: a 1 MB string is
/// refused after looking at its length.
pub fn compact_json_len_within(value: &Value, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    add(value, &mut total, limit)?;
    Some(total)
}

/// Adds `n` bytes; `None` once past `limit`.
fn grow(total: &mut usize, n: usize, limit: usize) -> Option<()> {
    *total = total.checked_add(n)?;
    (*total <= limit).then_some(())
}

fn add(value: &Value, total: &mut usize, limit: usize) -> Option<()> {
    match value {
        Value::Null | Value::Bool(true) => grow(total, 4, limit),
        Value::Bool(false) => grow(total, 5, limit),
        Value::Number(n) => grow(total, n.to_string().len(), limit),
        Value::String(s) => add_string(s, total, limit),
        Value::Array(items) => {
            grow(total, 2 + items.len().saturating_sub(1), limit)?;
            items.iter().try_for_each(|item| add(item, total, limit))
        }
        Value::Object(members) => {
            // `{}`, a `:` per member and a `,` between members.
            grow(
                total,
                2 + members.len() * 2 - usize::from(!members.is_empty()),
                limit,
            )?;
            members.iter().try_for_each(|(key, item)| {
                add_string(key, total, limit)?;
                add(item, total, limit)
            })
        }
    }
}

/// The length of `s` as serde_json writes it: with its quotes and escapes.
pub(crate) fn escaped_len(s: &str) -> usize {
    s.len()
        + 2
        + s.bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                0x00..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// A string with its quotes and escapes, as serde_json writes it.
fn add_string(s: &str, total: &mut usize, limit: usize) -> Option<()> {
    // The escaped form is never shorter: refuse before looking inside.
    grow(total, s.len() + 2, limit)?;
    let extra: usize = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0x00..=0x1f => 5,
            _ => 0,
        })
        .sum();
    grow(total, extra, limit)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_length_is_exactly_what_serde_json_writes() {
        for value in [
            json!(null),
            json!(true),
            json!(false),
            json!(-12.5e3),
            json!(u64::MAX),
            json!(""),
            json!("é \" \\ \n \r \t \u{8} \u{c} \u{1} \u{1f} 日本"),
            json!([]),
            json!([1, "two", [null], {}]),
            json!({}),
            json!({"name": "t", "version": "1", "nested": {"a": [1, 2, {"b\n": "c"}]}}),
        ] {
            let written = value.to_string().len();
            assert_eq!(
                compact_json_len_within(&value, written),
                Some(written),
                "{value}"
            );
            if written > 0 {
                assert_eq!(
                    compact_json_len_within(&value, written - 1),
                    None,
                    "{value}"
                );
            }
        }
    }

    #[test]
    fn a_huge_value_is_refused_by_its_size() {
        let big = json!({"name": "x".repeat(1_000_000)});
        assert_eq!(
            compact_json_len_within(&big, MAX_INITIALIZE_FIELD_BYTES),
            None
        );
        let many = Value::Array(vec![json!(1); 100_000]);
        assert_eq!(
            compact_json_len_within(&many, MAX_INITIALIZE_FIELD_BYTES),
            None
        );
    }
}
