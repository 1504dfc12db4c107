//! What the server keeps of the members it reads, built from their JSON
//! text without spending more than a small multiple of it.
//!
//! A [`Value`] costs far more than its text: 32 bytes per element of an
//! array of one-digit numbers (two bytes of text each), a B-tree node per
//! small object. A member the server only measures, drops or reads one
//! field of is therefore never built whole when its text is long: it is
//! read as a [`RawValue`] (a slice of the message), measured by
//! [`Measure`] (which reads it exactly as a `Value` is read, with the same
//! refusals, and allocates nothing), and only what a handler looks at is
//! built. The replies stay the same, because each reduced form answers
//! every question a handler asks of the member as the whole value would:
//!
//! - a member read as a string or an integer ([`scalar`]): strings and
//!   numbers are kept whole (they cost about their text); a long array or
//!   object becomes an empty one of the same kind, which is refused the
//!   same way;
//! - the client capabilities ([`capabilities`]): only
//!   `extensions.<tasks extension>` is read;
//! - a tool's `arguments` ([`tool_arguments`]): the fields a tool defines
//!   (each as a scalar, the run's own `arguments` whole up to its limit,
//!   else only its size) and the smallest other name (the first unknown
//!   field a decoder reports);
//! - `initialize`'s `clientInfo` and `capabilities` ([`Limited`]): kept
//!   whole up to their limit, else only the fact that they are too large.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::super::limits::escaped_len;
use crate::args::TOOL_FIELDS;
use crate::limits::MAX_ARGUMENTS_BYTES;

/// Text up to which a member is built whole, whatever its shape.
pub(super) const WHOLE: usize = 4 * 1024;
/// Text up to which a tool's `arguments` are built whole.
pub(super) const WHOLE_ARGUMENTS: usize = MAX_ARGUMENTS_BYTES;

/// The JSON type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// The length of a JSON value as compact JSON (what serde_json writes for
/// the [`Value`] it reads) and its type, read without building it. It
/// accepts and refuses exactly what reading a `Value` does: the reader
/// decides (numbers out of range, lone surrogates, depth), not the visitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Measure {
    pub(super) len: usize,
    pub(super) kind: Kind,
}

impl Measure {
    fn of(kind: Kind, len: usize) -> Self {
        Self { len, kind }
    }
}

/// Counts bytes written.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `n` as serde_json writes it.
fn number_len<N: serde::Serialize>(n: N) -> usize {
    let mut count = Count(0);
    // Writing a number to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, &n);
    count.0
}

impl<'de> serde::Deserialize<'de> for Measure {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MeasureVisitor)
    }
}

struct MeasureVisitor;

impl<'de> Visitor<'de> for MeasureVisitor {
    type Value = Measure;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Measure, E> {
        Ok(Measure::of(Kind::Bool, if b { 4 } else { 5 }))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Measure, E> {
        Ok(Measure::of(Kind::Number, number_len(n)))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Measure, E> {
        Ok(Measure::of(Kind::Number, number_len(n)))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Measure, E> {
        // As `Value` keeps it: a finite number (the reader refuses others).
        Ok(Measure::of(Kind::Number, number_len(n)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Measure, E> {
        Ok(Measure::of(Kind::String, escaped_len(s)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Measure, E> {
        Ok(Measure::of(Kind::Null, 4))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Measure, A::Error> {
        let mut len = 2usize;
        let mut items = 0usize;
        while let Some(item) = seq.next_element::<Measure>()? {
            len = len.saturating_add(item.len);
            items += 1;
        }
        len = len.saturating_add(items.saturating_sub(1));
        Ok(Measure::of(Kind::Array, len))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Measure, A::Error> {
        // A `Value` keeps the last of two members with one name: each
        // member's length by (a seeded 64-bit hash of) its name, so that
        // a repeated name replaces its earlier member's length.
        let names = foldhash::fast::RandomState::default();
        let mut seen: std::collections::HashMap<u64, usize, NoHash> =
            std::collections::HashMap::default();
        let mut len = 2usize;
        let mut members = 0usize;
        while let Some(key) = map.next_key_seed(KeySeed(&names))? {
            let value = map.next_value::<Measure>()?;
            // `"key":value`
            let member = key.len.saturating_add(1 + value.len);
            match seen.insert(key.hash, member) {
                Some(earlier) => len -= earlier,
                None => members += 1,
            }
            len = len.saturating_add(member);
        }
        len = len.saturating_add(members.saturating_sub(1));
        Ok(Measure::of(Kind::Object, len))
    }
}

/// A member name: its length as serde_json writes it, and its hash by
/// `names` (seeded per process, so names cannot be chosen to collide).
struct Key {
    len: usize,
    hash: u64,
}

struct KeySeed<'a>(&'a foldhash::fast::RandomState);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed<'_> {
    type Value = Key;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
        use std::hash::BuildHasher;
        Ok(Key {
            len: escaped_len(s),
            hash: self.0.hash_one(s),
        })
    }
}

/// The hasher of keys that are hashes already.
#[derive(Default, Clone, Copy)]
struct NoHash(u64);

impl std::hash::Hasher for NoHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::BuildHasher for NoHash {
    type Hasher = Self;
    fn build_hasher(&self) -> Self {
        Self(0)
    }
}

/// Reads `text` (a member's JSON) as `T`.
fn read<'a, T: serde::Deserialize<'a>>(text: &'a str) -> Result<T, serde_json::Error> {
    serde_json::from_str(text)
}

/// The [`Value`] of `raw`, as serde_json reads it, when its compact JSON
/// is short but its text may be long (whitespace, or a name given twice
/// whose earlier member a `Value` drops): an object's members are built
/// only for the last occurrence of each name, so what is built is what
/// is kept, never the members a repeated name replaces.
fn whole(raw: &RawValue) -> Result<Value, serde_json::Error> {
    read::<Whole>(raw.get()).map(|w| w.0)
}

/// A [`Value`] built by [`whole`].
struct Whole(Value);

impl<'de> serde::Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WholeVisitor)
    }
}

struct WholeVisitor;

impl<'de> Visitor<'de> for WholeVisitor {
    type Value = Whole;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Whole, E> {
        Ok(Whole(Value::Bool(b)))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Whole, E> {
        Ok(Whole(Value::from(n)))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Whole, E> {
        Ok(Whole(Value::from(n)))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Whole, E> {
        Ok(Whole(
            serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Whole, E> {
        Ok(Whole(Value::String(s.to_owned())))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Whole, E> {
        Ok(Whole(Value::String(s)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Whole, E> {
        Ok(Whole(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Whole, A::Error> {
        let mut items = Vec::new();
        while let Some(Whole(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Whole(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Whole, A::Error> {
        // The names in the map's order (a placeholder each) and the last
        // member of each name as text; then each of those built.
        let mut members = Map::new();
        let mut last: std::collections::HashMap<String, &'de RawValue> = Default::default();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            if !members.contains_key(&key) {
                members.insert(key.clone(), Value::Null);
            }
            last.insert(key, value);
        }
        for (key, slot) in members.iter_mut() {
            if let Some(value) = last.get(key) {
                *slot = whole(value).map_err(de::Error::custom)?;
            }
        }
        Ok(Whole(Value::Object(members)))
    }
}

/// An empty array or object for a long one; `None` for any other kind.
fn empty_of(kind: Kind) -> Option<Value> {
    match kind {
        Kind::Array => Some(Value::Array(Vec::new())),
        Kind::Object => Some(Value::Object(Map::new())),
        _ => None,
    }
}

/// A member read as a string or an integer (a name, an id, a version, a
/// progress token): whole, but a long array or object is an empty one of
/// its kind (a handler only asks whether it is a string or a number).
pub(super) fn scalar(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    if text.len() <= WHOLE {
        return read(text);
    }
    let measure: Measure = read(text)?;
    match empty_of(measure.kind) {
        Some(empty) => Ok(empty),
        None => read(text),
    }
}

/// Calls `member` with the name and raw value of each member of the
/// object `text`, in order (a caller that keeps members lets the last of
/// two with one name win, as a [`Map`] does).
fn members<'a>(
    text: &'a str,
    member: impl FnMut(String, &'a RawValue) -> Result<(), serde_json::Error>,
) -> Result<(), serde_json::Error> {
    struct Members<F>(F);
    impl<'de, F> Visitor<'de> for Members<F>
    where
        F: FnMut(String, &'de RawValue) -> Result<(), serde_json::Error>,
    {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<bool, A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                let raw: &'de RawValue = map.next_value()?;
                (self.0)(key, raw).map_err(de::Error::custom)?;
            }
            Ok(true)
        }
    }
    impl<'de, F> DeserializeSeed<'de> for Members<F>
    where
        F: FnMut(String, &'de RawValue) -> Result<(), serde_json::Error>,
    {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_map(self)
        }
    }
    let mut reader = serde_json::Deserializer::from_str(text);
    Members(member).deserialize(&mut reader)?;
    reader.end()
}

/// The client capabilities (`_meta.…clientCapabilities`): whole when short,
/// else only `extensions.<tasks extension>` (all a handler reads of them).
pub(super) fn capabilities(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    if text.len() <= WHOLE {
        return read(text);
    }
    let measure: Measure = read(text)?;
    if measure.kind != Kind::Object {
        return scalar(raw);
    }
    let mut kept = Map::new();
    members(text, |key, value| {
        if key == "extensions" {
            kept.insert(key, extensions(value)?);
        }
        Ok(())
    })?;
    Ok(Value::Object(kept))
}

/// `capabilities.extensions`: only the tasks extension's member.
fn extensions(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    if text.len() <= WHOLE {
        return read(text);
    }
    let measure: Measure = read(text)?;
    if measure.kind != Kind::Object {
        return scalar(raw);
    }
    let mut kept = Map::new();
    members(text, |key, value| {
        if key == super::super::tasks::TASKS_EXTENSION {
            kept.insert(key, scalar(value)?);
        }
        Ok(())
    })?;
    Ok(Value::Object(kept))
}

/// `subscriptions/listen`'s `notifications`: whole when short, else only
/// `taskIds`, and of an array of them only the first
/// [`MAX_LISTEN_TASKS`](super::super::MAX_LISTEN_TASKS) strings (the
/// tasks a stream watches; other elements are skipped when read anyway).
pub(super) fn notifications(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    if text.len() <= WHOLE {
        return read(text);
    }
    let measure: Measure = read(text)?;
    if measure.kind != Kind::Object {
        return scalar(raw);
    }
    let mut kept = Map::new();
    members(text, |key, value| {
        if key == "taskIds" {
            let ids = if value.get().len() <= WHOLE {
                read(value.get())?
            } else {
                match read::<Measure>(value.get())?.kind {
                    Kind::Array => read::<FirstStrings>(value.get())?.0,
                    _ => scalar(value)?,
                }
            };
            kept.insert(key, ids);
        }
        Ok(())
    })?;
    Ok(Value::Object(kept))
}

/// The first [`MAX_LISTEN_TASKS`](super::super::MAX_LISTEN_TASKS) strings
/// of an array, as an array; every element read as a `Value` would be.
struct FirstStrings(Value);

impl<'de> serde::Deserialize<'de> for FirstStrings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> Visitor<'de> for Elements {
            type Value = FirstStrings;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstStrings, A::Error> {
                let mut kept = Vec::new();
                while let Some(item) = seq.next_element::<StringOrOther>()? {
                    if let StringOrOther::String(s) = item
                        && kept.len() < super::super::MAX_LISTEN_TASKS
                    {
                        kept.push(Value::String(s));
                    }
                }
                Ok(FirstStrings(Value::Array(kept)))
            }
        }
        deserializer.deserialize_seq(Elements)
    }
}

/// An element: a string, or anything else (measured and dropped).
enum StringOrOther {
    String(String),
    Other,
}

impl<'de> serde::Deserialize<'de> for StringOrOther {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Element;
        impl<'de> Visitor<'de> for Element {
            type Value = StringOrOther;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StringOrOther, E> {
                Ok(StringOrOther::String(s.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<StringOrOther, E> {
                Ok(StringOrOther::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<StringOrOther, E> {
                Ok(StringOrOther::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<StringOrOther, E> {
                Ok(StringOrOther::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<StringOrOther, E> {
                Ok(StringOrOther::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<StringOrOther, E> {
                Ok(StringOrOther::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StringOrOther, A::Error> {
                MeasureVisitor.visit_seq(seq).map(|_| StringOrOther::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StringOrOther, A::Error> {
                MeasureVisitor.visit_map(map).map(|_| StringOrOther::Other)
            }
        }
        deserializer.deserialize_any(Element)
    }
}

/// A tool's `arguments` as the tool decoders read them, and the size of
/// the run's own `arguments` when they were too large to keep (then an
/// empty object stands for them).
///
/// Whole when short. A long object keeps the fields some tool defines
/// ([`TOOL_FIELDS`]), each as a [`scalar`] except the run's `arguments`
/// (whole up to [`MAX_ARGUMENTS_BYTES`] of compact JSON, the most a run
/// accepts), and, with the value `null`, the smallest other name: every
/// tool refuses it as unknown, and a decoder reports the smallest unknown
/// name first.
pub(super) fn tool_arguments(raw: &RawValue) -> Result<(Value, Option<usize>), serde_json::Error> {
    let text = raw.get();
    if text.len() <= WHOLE_ARGUMENTS {
        return Ok((read(text)?, None));
    }
    let measure: Measure = read(text)?;
    if measure.kind != Kind::Object {
        return Ok((scalar(raw)?, None));
    }
    let mut kept = Map::new();
    let mut too_large = None;
    let mut smallest_other: Option<String> = None;
    members(text, |key, value| {
        if !TOOL_FIELDS.contains(&key.as_str()) {
            // Read as a `Value` would be, and dropped.
            read::<Measure>(value.get())?;
            if smallest_other.as_ref().is_none_or(|s| key < *s) {
                smallest_other = Some(key);
            }
            return Ok(());
        }
        let value = if key == "arguments" {
            let measure: Measure = read(value.get())?;
            too_large = None;
            if measure.len <= MAX_ARGUMENTS_BYTES {
                whole(value)?
            } else if measure.kind == Kind::Object {
                too_large = Some(measure.len);
                Value::Object(Map::new())
            } else {
                scalar(value)?
            }
        } else {
            scalar(value)?
        };
        kept.insert(key, value);
        Ok(())
    })?;
    if let Some(other) = smallest_other {
        kept.insert(other, Value::Null);
    }
    Ok((Value::Object(kept), too_large))
}

/// A member of `initialize` bounded by `limit` bytes of compact JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Limited {
    /// Within the limit: the member.
    Within(Value),
    /// Larger than the limit.
    TooLarge,
}

impl Limited {
    /// `raw` kept whole when its compact JSON is at most `limit` bytes.
    pub(super) fn read(raw: &RawValue, limit: usize) -> Result<Self, serde_json::Error> {
        let text = raw.get();
        let measure: Measure = read(text)?;
        Ok(if measure.len <= limit {
            Self::Within(whole(raw)?)
        } else {
            Self::TooLarge
        })
    }

    /// `value` kept when its compact JSON is at most `limit` bytes.
    pub(super) fn of(value: &Value, limit: usize) -> Self {
        match super::super::limits::compact_json_len_within(value, limit) {
            Some(_) => Self::Within(value.clone()),
            None => Self::TooLarge,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn the_measure_is_what_serde_json_writes_and_refuses_what_a_value_refuses() {
        for text in [
            "null",
            "true",
            "false",
            "0",
            "-0",
            "-12",
            "1.0",
            "1e3",
            "-1.5E-7",
            "18446744073709551615",
            "18446744073709551616",
            "123456789012345678901234567890",
            "\"\"",
            "\"é \\\" \\\\ \\n \\u0001 \\u001f \\ud83d\\ude00 / \u{7f}\"",
            "[]",
            "[ 1 , [ ] , { } , \"x\" ]",
            "{ \"a\" : [1, 2.50, {\"b\\n\": null}] , \"a\": 3 }",
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            let measure: Measure = serde_json::from_str(text).unwrap();
            assert_eq!(measure.len, value.to_string().len(), "{text}");
        }
        for text in ["1E400", "\"\\ud800\"", "[1,]", "{\"a\" 1}", "\"\u{1}\""] {
            let value = serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
            let measure = serde_json::from_str::<Measure>(text).map_err(|e| e.to_string());
            assert!(value.is_err(), "{text}");
            assert_eq!(value.err(), measure.err(), "{text}");
        }
    }

    #[test]
    fn a_whole_value_is_the_value_serde_json_reads() {
        for text in [
            "null",
            "[1, -2, 3.5, \"é\\n\", true, {}]",
            "{\"b\": 1, \"a\": {\"x\": [1], \"x\": {\"y\": 2, \"y\": 3}}, \"b\": [null]}",
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(whole(&raw(text)).unwrap(), value, "{text}");
            assert_eq!(whole(&raw(text)).unwrap().to_string(), value.to_string());
        }
    }

    #[test]
    fn long_members_keep_what_is_read() {
        let numbers = format!("[{}1]", "1,".repeat(WHOLE));
        assert_eq!(scalar(&raw(&numbers)).unwrap(), json!([]));
        let long = format!("\"{}\"", "x".repeat(WHOLE * 2));
        assert_eq!(
            scalar(&raw(&long)).unwrap(),
            Value::String("x".repeat(WHOLE * 2))
        );
        let caps = format!(
            "{{\"a\":{numbers},\"extensions\":{{\"b\":{numbers},\"io.modelcontextprotocol/tasks\":{{}}}}}}"
        );
        assert_eq!(
            capabilities(&raw(&caps)).unwrap(),
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        );
        let big = format!("[{}1]", "1,".repeat(MAX_ARGUMENTS_BYTES));
        let args = format!(
            "{{\"zz\":1,\"graph_session_id\":{big},\"arguments\":{{\"x\":{big}}},\"idempotency_key\":\"k\",\"b\":[]}}"
        );
        let (kept, too_large) = tool_arguments(&raw(&args)).unwrap();
        assert_eq!(
            kept,
            json!({"graph_session_id": [], "arguments": {}, "idempotency_key": "k", "b": null})
        );
        let inner: Value = serde_json::from_str(&format!("{{\"x\":{big}}}")).unwrap();
        assert_eq!(too_large, Some(inner.to_string().len()));
    }
}
