//! Canonical JSON, RFC 8785 (JCS): the bytes that are hashed and signed.
//!
//! Members are sorted by their keys' UTF-16 code units, strings use the
//! minimal JSON escapes, and numbers use ECMAScript's Number-to-String
//! (via `ryu-js`), so every host of the core produces the same bytes.

use super::json::{Number, Object, Value};
use std::cmp::Ordering;

/// Where canonical text is written: bytes for hashing and signing, a `String` for
/// texts kept as such (records, bodies), so those are never validated as UTF-8 again.
pub trait Sink {
    /// Appends an ASCII byte.
    fn push_ascii(&mut self, b: u8);
    /// Appends text.
    fn push_str(&mut self, s: &str);
    /// Reserves room for `n` more bytes.
    fn reserve(&mut self, n: usize);
}

impl Sink for Vec<u8> {
    fn push_ascii(&mut self, b: u8) {
        self.push(b);
    }
    fn push_str(&mut self, s: &str) {
        self.extend_from_slice(s.as_bytes());
    }
    fn reserve(&mut self, n: usize) {
        Vec::reserve(self, n);
    }
}

impl Sink for String {
    fn push_ascii(&mut self, b: u8) {
        self.push(char::from(b));
    }
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
    fn reserve(&mut self, n: usize) {
        String::reserve(self, n);
    }
}

/// The canonical form of `value`.
pub fn to_vec(value: &Value) -> Vec<u8> {
    to_string(value).into_bytes()
}

/// The canonical form of `value` as a string.
pub fn to_string(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(value, &mut out);
    out
}

/// The canonical form of `object`.
pub fn object_to_vec(object: &Object) -> Vec<u8> {
    object_to_string(object).into_bytes()
}

/// The canonical form of `object` as a string.
pub fn object_to_string(object: &Object) -> String {
    let mut out = String::with_capacity(256);
    write_object(object, None, &mut out);
    out
}

/// The canonical form of an object whose members' values are given in canonical form already.
///
/// Equal to [`object_to_string`] of the parsed members; it saves re-writing
/// values whose canonical text is at hand (an envelope in deliver params).
pub fn object_of_canonical(members: &mut [(&str, &str)]) -> String {
    members.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
    let len: usize = members.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = String::with_capacity(len + 2);
    out.push('{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(k, &mut out);
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    out
}

/// Appends the canonical form of `object` without its member `skip` (used for signing input).
pub fn write_object_without(object: &Object, skip: &str, out: &mut impl Sink) {
    write_object(object, Some(skip), out);
}

/// Appends the canonical form of `value` to `out`.
pub fn write_value(value: &Value, out: &mut impl Sink) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(*n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push_ascii(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_ascii(b',');
                }
                write_value(item, out);
            }
            out.push_ascii(b']');
        }
        Value::Object(o) => write_object(o, None, out),
        Value::Canonical(text) => out.push_str(text),
    }
}

fn write_object(object: &Object, skip: Option<&str>, out: &mut impl Sink) {
    let mut members: Vec<(&str, &Value)> =
        object.iter().filter(|(k, _)| Some(*k) != skip).collect();
    members.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
    out.push_ascii(b'{');
    for (i, (k, v)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push_ascii(b',');
        }
        write_string(k, out);
        out.push_ascii(b':');
        write_value(v, out);
    }
    out.push_ascii(b'}');
}

/// Orders keys by UTF-16 code units, as RFC 8785 §3.2.3 requires.
pub fn utf16_cmp(a: &str, b: &str) -> Ordering {
    // Byte order equals code-point order, which equals UTF-16 order unless a
    // supplementary character meets one in U+E000..U+FFFF; ASCII keys (the
    // common case) take the fast path.
    if a.is_ascii() && b.is_ascii() {
        return a.cmp(b);
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

fn write_number(n: Number, out: &mut impl Sink) {
    match n {
        Number::Int(u) if u <= super::json::MAX_SAFE_INTEGER => {
            write_u64(u, out);
        }
        _ => {
            let f = n.as_f64();
            if f == 0.0 {
                // -0 serializes as 0 in ECMAScript.
                out.push_ascii(b'0');
            } else {
                let mut buf = ryu_js::Buffer::new();
                out.push_str(buf.format_finite(f));
            }
        }
    }
}

fn write_u64(mut u: u64, out: &mut impl Sink) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push_ascii(d);
    }
}

/// Appends `s` as a JSON string with RFC 8785's escaping.
pub fn write_string(s: &str, out: &mut impl Sink) {
    out.push_ascii(b'"');
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 1);
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Skip eight bytes at a time while none needs an escape: strings here
        // are mostly long base64url runs, and this loop is the hottest in a send.
        if i + 8 <= bytes.len() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            if !word_needs_escape(u64::from_le_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        // Slices end at an ASCII byte or at the end, so they are whole UTF-8 text.
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0c => "\\f",
            0x0d => "\\r",
            0x00..=0x1f => {
                out.push_str(&s[start..i]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push_ascii(HEX[(b >> 4) as usize]);
                out.push_ascii(HEX[(b & 0xf) as usize]);
                i += 1;
                start = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_str(&s[start..i]);
        out.push_str(esc);
        i += 1;
        start = i;
    }
    out.push_str(&s[start..]);
    out.push_ascii(b'"');
}

/// Whether any of the eight bytes in `w` is a control character, `"` or `\\`.
fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20 (bytes of 0x80 and above are excluded by `!w`).
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    control | zero(w ^ (ONES * b'"' as u64)) | zero(w ^ (ONES * b'\\' as u64)) != 0
}
