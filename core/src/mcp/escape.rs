//! Writing JSON text fast: the escaper behind every reply's strings.
//!
//! A reply's largest string is usually a tool result's text, which is the
//! compact JSON of its structured content (quotes to escape, rarely a
//! control character). [`write_text`] copies it in runs between the bytes
//! to escape, found eight at a time by [`to_escape`], which the message
//! reader also uses to find the end of a string.

/// Appends `value` as compact JSON to `out`. The values written this way
/// (strings, the server's implementation) serialize infallibly.
pub(super) fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// Appends the UTF-8 text `bytes` as a JSON string to `out`: the bytes
/// [`write_json`] writes, faster for text without control characters
/// (compact JSON, as the text of a tool's output is), where only `"` and
/// `\` are escaped. Text with a control character is written by
/// [`write_json`].
///
/// The text is scanned eight bytes at a time and copied in runs between
/// the bytes to escape (the general escaper cost more than a
/// tenth of a `get_graph_run`).
pub(super) fn write_text(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.reserve(bytes.len() + bytes.len() / 8 + 2);
    out.push(b'"');
    // `bytes[run..]` is not written yet; `bytes[..i]` holds nothing to escape past `run`.
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        let found = match bytes
            .get(i..i + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
        {
            Some(chunk) => {
                let marks = to_escape(u64::from_le_bytes(chunk));
                if marks == 0 {
                    i += 8;
                    continue;
                }
                // The lowest mark is exact (see `to_escape`); its bit is the
                // top bit of that byte, so this is below 8.
                i + (marks.trailing_zeros() / 8) as usize
            }
            None => match bytes[i..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            {
                Some(at) => i + at,
                None => break,
            },
        };
        if bytes[found] < 0x20 {
            // A control character: the general escaper writes it (compact
            // JSON is UTF-8; other bytes are written as text with
            // replacement characters, as no caller passes them).
            out.truncate(start);
            write_json(out, &String::from_utf8_lossy(bytes));
            return;
        }
        out.extend_from_slice(&bytes[run..found]);
        out.push(b'\\');
        // The escaped byte starts the next run.
        run = found;
        i = found + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// The top bit of each byte of `word` that is `"`, `\` or below 0x20, and
/// maybe of bytes above such a byte (a borrow carries upwards), so the
/// lowest bit set marks the first byte to escape exactly.
pub(super) const fn to_escape(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    // Bytes of `v` that are zero (exact up to the first one).
    const fn zero_bytes(v: u64) -> u64 {
        v.wrapping_sub(ONES) & !v & TOPS
    }
    zero_bytes(word ^ (ONES * b'"' as u64))
        | zero_bytes(word ^ (ONES * b'\\' as u64))
        | (word.wrapping_sub(ONES * 0x20) & !word & TOPS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::write_text;

    #[test]
    fn json_text_is_escaped_as_serde_json_escapes_it() {
        let mut samples: Vec<String> = [
            "",
            "plain",
            r#"{"a":"b","c":[1,2.5,null],"d":{"e":"\"quoted\" and \\ back"}}"#,
            "\"",
            "\\",
            "\\\"",
            "ends with a quote\"",
            "ünïcødé ✓ 𝄞 and \u{7f}",
            "a\nnew line",
            "tab\tand \u{1} and \u{1f}",
            "\u{0}",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        // Every byte below 0x80 once, at the start, middle and end.
        for b in 0_u8..0x80 {
            let c = char::from(b);
            samples.push(format!("{c}x\"y{c}z\\{c}"));
        }
        // One or two bytes of each kind at every place of texts of up to three
        // eight-byte words and a tail.
        for special in [
            "\"", "\\", "\n", "\u{1f}", "\u{0}", " ", "!", "#", "[", "]", "é", "\u{7f}",
        ] {
            for len in 0..27 {
                for at in 0..len {
                    let mut text = "a".repeat(len);
                    text.replace_range(at..=at, special);
                    samples.push(text.clone());
                    text.push_str(special);
                    samples.push(text);
                }
            }
        }
        // The compact JSON of a run, as a tool result's text is.
        samples.push(
            serde_json::to_string(&json!({"result": {"text": "say \"hi\"\n", "path": "C:\\tmp"}}))
                .unwrap(),
        );
        for text in samples {
            let mut fast = b"prefix".to_vec();
            write_text(&mut fast, text.as_bytes());
            let mut general = b"prefix".to_vec();
            serde_json::to_writer(&mut general, &text).unwrap();
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(general).unwrap(),
                "{text:?}"
            );
        }
    }
}
