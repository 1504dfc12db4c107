//! The bounded result a relay posts when a run ends (SPEC §7).
//!
//! The published relay measures `JSON.stringify(envelope).length`: UTF-16
//! code units of the compact JSON text, escapes included. [`js_json_length`]
//! reproduces that count exactly for any `serde_json::Value` (including
//! JavaScript's number formatting), so an ASCII result and a Japanese result
//! of the same character count fit alike. Over the limit the envelope is
//! replaced, all or nothing, by `{execution_id, status, result_truncated: true}`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ExecutionId;

use crate::limits::{ERROR_LIMIT, RESULT_LIMIT};

/// How a run ended, as the relay reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishStatus {
    /// The Graph ran to the end.
    Completed,
    /// The Graph or the engine failed.
    Failed,
    /// The run was stopped (cancelled by the agent or refused by the re-check).
    Cancelled,
}

impl FinishStatus {
    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What a finished run produced, in one of the two forms of SPEC §7.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultEnvelope {
    /// The engine's id for the execution this result belongs to.
    pub execution_id: ExecutionId,
    /// How the run ended.
    pub status: FinishStatus,
    /// The full result, or `None` when it was too large and was truncated away.
    /// Shared: copies of an envelope (and of the command holding it) do not
    /// copy the result.
    pub body: Option<Arc<EnvelopeBody>>,
}

/// The payload of an envelope that fits the limit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnvelopeBody {
    /// The Graph's output.
    pub result: Value,
    /// Tokens the run spent, if the engine reported it.
    pub total_tokens: Option<u64>,
    /// Cost the engine reported, if any.
    pub reported_cost: Option<f64>,
    /// Why the run failed, at most [`ERROR_LIMIT`] UTF-16 units.
    pub error: Option<String>,
}

/// An envelope received from outside that breaks a rule of SPEC §7.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The full form is larger than [`RESULT_LIMIT`].
    #[error(
        "the result envelope is {length} characters long; the limit is {RESULT_LIMIT} (post `result_truncated: true` instead)"
    )]
    TooLarge {
        /// The measured length in UTF-16 units.
        length: usize,
    },
    /// The error text is longer than [`ERROR_LIMIT`].
    #[error("`error` is {length} characters long; the limit is {ERROR_LIMIT}")]
    ErrorTooLong {
        /// The measured length in UTF-16 units.
        length: usize,
    },
}

impl ResultEnvelope {
    /// Builds the envelope a relay posts: the error is cut to
    /// [`ERROR_LIMIT`], and if the full form would exceed [`RESULT_LIMIT`]
    /// the truncated form is returned instead.
    pub fn build(execution_id: ExecutionId, status: FinishStatus, mut body: EnvelopeBody) -> Self {
        if let Some(error) = body.error.as_mut() {
            cut_utf16(error, ERROR_LIMIT);
        }
        let full = Self {
            execution_id,
            status,
            body: Some(Arc::new(body)),
        };
        if full.js_length() <= RESULT_LIMIT {
            full
        } else {
            Self { body: None, ..full }
        }
    }

    /// True when the result was too large and only the truncated form remains.
    pub fn is_truncated(&self) -> bool {
        self.body.is_none()
    }

    /// `JSON.stringify(self).length` as the published relay computes it
    /// (computed from the parts, without building the JSON).
    pub fn js_length(&self) -> usize {
        // `{"execution_id":…,"status":…` and the closing brace.
        let key = |k: &str| js_string_length(k) + 1;
        let mut length = 2
            + key("execution_id")
            + js_string_length(self.execution_id.as_str())
            + 1
            + key("status")
            + js_string_length(self.status.as_str());
        match &self.body {
            None => length += 1 + key("result_truncated") + 4,
            Some(body) => {
                length += 1 + key("result") + js_json_length(&body.result);
                length += 1
                    + key("total_tokens")
                    + body.total_tokens.map_or(4, |t| js_number_length(t as f64));
                length += 1
                    + key("reported_cost")
                    + body
                        .reported_cost
                        .filter(|c| c.is_finite())
                        .map_or(4, js_number_length);
                if let Some(error) = &body.error {
                    length += 1 + key("error") + js_string_length(error);
                }
            }
        }
        length
    }

    /// Checks an envelope that came from outside against SPEC §7.
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        if let Some(error) = self.body.as_ref().and_then(|b| b.error.as_deref()) {
            let length = utf16_len(error);
            if length > ERROR_LIMIT {
                return Err(EnvelopeError::ErrorTooLong { length });
            }
        }
        let length = self.js_length();
        if length > RESULT_LIMIT {
            return Err(EnvelopeError::TooLarge { length });
        }
        Ok(())
    }

    /// The wire form as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The flat wire form shared by both shapes. `R` is the result: owned when
/// reading, borrowed when writing (so writing copies nothing).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEnvelope<R> {
    execution_id: ExecutionId,
    status: FinishStatus,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present",
        bound(deserialize = "R: Deserialize<'de>")
    )]
    result: Option<R>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_truncated: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    total_tokens: Option<Value>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    reported_cost: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Deserializes a field that is present (even as `null`) to `Some`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Serialize for ResultEnvelope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = match &self.body {
            None => WireEnvelope {
                execution_id: self.execution_id.clone(),
                status: self.status,
                result: None,
                result_truncated: Some(true),
                total_tokens: None,
                reported_cost: None,
                error: None,
            },
            Some(body) => WireEnvelope {
                execution_id: self.execution_id.clone(),
                status: self.status,
                result: Some(&body.result),
                result_truncated: None,
                total_tokens: Some(body.total_tokens.map_or(Value::Null, Value::from)),
                reported_cost: Some(
                    body.reported_cost
                        .and_then(serde_json::Number::from_f64)
                        .map_or(Value::Null, Value::Number),
                ),
                error: body.error.clone(),
            },
        };
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ResultEnvelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = WireEnvelope::<Value>::deserialize(deserializer)?;
        match wire.result_truncated {
            Some(true) => {
                if wire.result.is_some()
                    || wire.total_tokens.is_some()
                    || wire.reported_cost.is_some()
                    || wire.error.is_some()
                {
                    return Err(D::Error::custom(
                        "a truncated envelope carries only `execution_id`, `status` and `result_truncated`",
                    ));
                }
                Ok(Self {
                    execution_id: wire.execution_id,
                    status: wire.status,
                    body: None,
                })
            }
            Some(false) => Err(D::Error::custom("`result_truncated` may only be `true`")),
            None => {
                let total_tokens = match wire.total_tokens {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_u64().ok_or_else(|| {
                        D::Error::custom("`total_tokens` must be a non-negative integer or null")
                    })?),
                };
                let reported_cost = match wire.reported_cost {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| {
                        D::Error::custom("`reported_cost` must be a number or null")
                    })?),
                };
                Ok(Self {
                    execution_id: wire.execution_id,
                    status: wire.status,
                    body: Some(Arc::new(EnvelopeBody {
                        result: wire.result.unwrap_or(Value::Null),
                        total_tokens,
                        reported_cost,
                        error: wire.error,
                    })),
                })
            }
        }
    }
}

/// Length of `text` in UTF-16 code units.
pub fn utf16_len(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

/// Cuts `text` to at most `limit` UTF-16 units without splitting a
/// surrogate pair (a character that would straddle the limit is dropped whole).
pub fn cut_utf16(text: &mut String, limit: usize) {
    let mut units = 0;
    for (index, ch) in text.char_indices() {
        units += ch.len_utf16();
        if units > limit {
            text.truncate(index);
            return;
        }
    }
}

/// `JSON.stringify(value).length` in JavaScript: the UTF-16 length of the
/// compact serialization, with JavaScript's string escapes and number format.
pub fn js_json_length(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => js_number_length(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => js_string_length(s),
        Value::Array(items) => {
            2 + items.iter().map(js_json_length).sum::<usize>() + items.len().saturating_sub(1)
        }
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| js_string_length(k) + 1 + js_json_length(v))
                .sum::<usize>()
                + map.len().saturating_sub(1)
        }
    }
}

/// Length of a JSON string literal as `JSON.stringify` writes it, quotes included.
fn js_string_length(s: &str) -> usize {
    // Byte by byte (no UTF-8 decoding): every character is one UTF-16 unit
    // except those of four UTF-8 bytes (two units); continuation bytes add
    // nothing; ASCII controls, `"` and `\\` are escaped.
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0x00..=0x1f => 6,
            0x80..=0xbf => 0,
            0xf0..=0xff => 2,
            _ => 1,
        })
        .sum::<usize>()
}

/// Length of `Number.prototype.toString()` for a finite double.
fn js_number_length(x: f64) -> usize {
    if x == 0.0 {
        return 1;
    }
    // Integers below 2^53 print as their digits: no formatting needed.
    if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 {
        let mut n = x.abs() as u64;
        let mut digits = 1;
        while n >= 10 {
            n /= 10;
            digits += 1;
        }
        return digits + usize::from(x < 0.0);
    }
    let sign = usize::from(x < 0.0);
    // Rust's `{:e}` prints the shortest round-tripping digits, as ECMAScript
    // does; written to the stack (at most 24 bytes for a double).
    let mut buffer = StackText::default();
    let text = match std::fmt::Write::write_fmt(&mut buffer, format_args!("{:e}", x.abs())) {
        Ok(()) => buffer.as_str(),
        Err(_) => "0e0",
    };
    let (mantissa, exponent) = text.split_once('e').unwrap_or((text, "0"));
    let k = mantissa.bytes().filter(u8::is_ascii_digit).count() as i64;
    let n = exponent.parse::<i64>().unwrap_or(0) + 1;
    let body = if k <= n && n <= 21 {
        n
    } else if 0 < n && n <= 21 {
        k + 1
    } else if -6 < n && n <= 0 {
        2 - n + k
    } else {
        let exp_digits = (n - 1).unsigned_abs().to_string().len() as i64;
        k + i64::from(k > 1) + 2 + exp_digits
    };
    sign + body as usize
}

/// A small text buffer on the stack for number formatting.
struct StackText {
    bytes: [u8; 40],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            bytes: [0; 40],
            len: 0,
        }
    }
}

impl StackText {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("0e0")
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exec() -> ExecutionId {
        ExecutionId::parse("exec-1").unwrap()
    }

    fn body(result: Value) -> EnvelopeBody {
        EnvelopeBody {
            result,
            ..EnvelopeBody::default()
        }
    }

    /// Envelope overhead around a string result `"…"`:
    /// `{"execution_id":"exec-1","status":"completed","result":"","total_tokens":null,"reported_cost":null}`.
    fn overhead() -> usize {
        ResultEnvelope::build(exec(), FinishStatus::Completed, body(json!(""))).js_length()
    }

    #[test]
    fn length_matches_serialization_for_ascii() {
        let v = json!({"a": [1, true, null, "x\ny"], "b": {"c": -2.5}});
        assert_eq!(js_json_length(&v), serde_json::to_string(&v).unwrap().len());
        assert_eq!(overhead(), r#"{"execution_id":"exec-1","status":"completed","result":"","total_tokens":null,"reported_cost":null}"#.len());
    }

    #[test]
    fn escapes_and_surrogates_count_as_javascript_does() {
        assert_eq!(js_json_length(&json!("\n")), 4); // "\n" is 2 + quotes
        assert_eq!(js_json_length(&json!("\u{0001}")), 8); // "\u0001"
        assert_eq!(js_json_length(&json!("\"\\")), 6);
        assert_eq!(js_json_length(&json!("\u{7f}")), 3); // DEL is not escaped
        assert_eq!(js_json_length(&json!("日本")), 4);
        assert_eq!(js_json_length(&json!("😀")), 4); // one emoji, two UTF-16 units
        assert_eq!(js_json_length(&json!("/")), 3); // `/` is not escaped
    }

    proptest::proptest! {
        /// `Number.prototype.toString()` as ryu-js writes it (the ECMAScript
        /// algorithm) has the length the envelope counts, for every finite
        /// double: bit patterns cover subnormals, huge and tiny exponents.
        #[test]
        fn number_lengths_match_an_ecmascript_formatter(bits in proptest::prelude::any::<u64>()) {
            let x = f64::from_bits(bits);
            if x.is_finite() {
                let mut buffer = ryu_js::Buffer::new();
                let js = buffer.format_finite(x);
                proptest::prop_assert_eq!(js_number_length(x), js.len(), "{} prints as {}", x, js);
            }
        }

        /// The same for doubles that are whole numbers or short decimals,
        /// where the shortcuts for integers apply.
        #[test]
        fn integer_and_decimal_lengths_match(n in proptest::prelude::any::<i64>(), scale in 0u32..12) {
            let x = n as f64 / 10f64.powi(scale as i32);
            let mut buffer = ryu_js::Buffer::new();
            let js = buffer.format_finite(x);
            proptest::prop_assert_eq!(js_number_length(x), js.len(), "{} prints as {}", x, js);
        }
    }

    #[test]
    fn numbers_count_as_javascript_prints_them() {
        for (x, js) in [
            (1.0, "1"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (123456789012345680000.0, "123456789012345680000"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (-2.5e300, "-2.5e+300"),
            (0.5, "0.5"),
            (123.456, "123.456"),
        ] {
            assert_eq!(js_number_length(x), js.len(), "{x} should print as {js}");
        }
        assert_eq!(
            js_json_length(&json!(u64::MAX)),
            "18446744073709552000".len()
        );
        assert_eq!(js_json_length(&json!(42)), 2);
    }

    fn boundary(unit: &str, units_per_char: usize) {
        let room = RESULT_LIMIT - overhead();
        let n = room / units_per_char;
        let fits =
            ResultEnvelope::build(exec(), FinishStatus::Completed, body(json!(unit.repeat(n))));
        assert!(!fits.is_truncated(), "{unit}");
        assert!(fits.js_length() <= RESULT_LIMIT);
        let over = ResultEnvelope::build(
            exec(),
            FinishStatus::Completed,
            body(json!(unit.repeat(n + 1))),
        );
        assert!(over.is_truncated(), "{unit}");
        assert_eq!(
            serde_json::to_value(&over).unwrap(),
            json!({"execution_id": "exec-1", "status": "completed", "result_truncated": true})
        );
    }

    #[test]
    fn boundary_ascii_japanese_emoji_and_escapes() {
        boundary("a", 1);
        boundary("日", 1);
        boundary("😀", 2);
        boundary("\n", 2);
        boundary("\u{1}", 6);
        // A Japanese result of the same character count fits exactly like ASCII.
        let room = RESULT_LIMIT - overhead();
        let ascii = ResultEnvelope::build(
            exec(),
            FinishStatus::Completed,
            body(json!("a".repeat(room))),
        );
        let japanese = ResultEnvelope::build(
            exec(),
            FinishStatus::Completed,
            body(json!("日".repeat(room))),
        );
        assert_eq!(ascii.js_length(), RESULT_LIMIT);
        assert_eq!(japanese.js_length(), RESULT_LIMIT);
        assert!(!japanese.is_truncated());
    }

    #[test]
    fn error_cut_never_splits_a_surrogate_pair() {
        let mut s = format!("{}😀", "a".repeat(ERROR_LIMIT - 1));
        cut_utf16(&mut s, ERROR_LIMIT);
        assert_eq!(s, "a".repeat(ERROR_LIMIT - 1));
        let mut s = "😀".repeat(ERROR_LIMIT);
        cut_utf16(&mut s, ERROR_LIMIT);
        assert_eq!(utf16_len(&s), ERROR_LIMIT);
        let env = ResultEnvelope::build(
            exec(),
            FinishStatus::Failed,
            EnvelopeBody {
                error: Some("é".repeat(5000)),
                ..EnvelopeBody::default()
            },
        );
        assert_eq!(
            env.body.unwrap().error.as_ref().unwrap().chars().count(),
            ERROR_LIMIT
        );
    }

    #[test]
    fn direct_length_equals_the_length_of_the_wire_form() {
        for env in [
            ResultEnvelope::build(
                exec(),
                FinishStatus::Completed,
                body(json!({"a": [1, 2.5, "é\n"]})),
            ),
            ResultEnvelope::build(
                exec(),
                FinishStatus::Failed,
                EnvelopeBody {
                    result: json!(null),
                    total_tokens: Some(123_456),
                    reported_cost: Some(0.1),
                    error: Some("bad \"x\"".into()),
                },
            ),
            ResultEnvelope {
                execution_id: exec(),
                status: FinishStatus::Cancelled,
                body: None,
            },
        ] {
            assert_eq!(env.js_length(), js_json_length(&env.to_value()));
        }
    }

    #[test]
    fn wire_round_trip_and_validation() {
        let env = ResultEnvelope::build(
            exec(),
            FinishStatus::Completed,
            EnvelopeBody {
                result: json!({"k": 1}),
                total_tokens: Some(12),
                reported_cost: Some(0.25),
                error: None,
            },
        );
        let text = serde_json::to_string(&env).unwrap();
        let back: ResultEnvelope = serde_json::from_str(&text).unwrap();
        assert_eq!(back, env);
        assert!(back.validate().is_ok());

        let big = ResultEnvelope {
            execution_id: exec(),
            status: FinishStatus::Completed,
            body: Some(Arc::new(body(json!("x".repeat(RESULT_LIMIT))))),
        };
        assert!(matches!(
            big.validate(),
            Err(EnvelopeError::TooLarge { .. })
        ));

        for bad in [
            json!({"execution_id": "e", "status": "completed", "result_truncated": true, "result": 1}),
            json!({"execution_id": "e", "status": "completed", "result_truncated": false}),
            json!({"execution_id": "e", "status": "done", "result": 1}),
            json!({"execution_id": "e", "status": "completed", "result": 1, "extra": 1}),
            json!({"execution_id": "e", "status": "completed", "result": 1, "total_tokens": -1}),
        ] {
            assert!(
                serde_json::from_value::<ResultEnvelope>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
