//! Property tests: canonical form is a fixed point, and a signed object tolerates no edit.

use proptest::prelude::*;
use relay_core::client::draft;
use relay_core::client::{AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::json::{parse, parse_object, Number, Object, Value};

fn arb_number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<u64>().prop_map(Number::Int),
        (0u64..1000).prop_map(Number::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Number::Float),
        (-1e6f64..1e6).prop_map(Number::Float),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number().prop_map(Value::Number),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Object>())),
        ]
    })
}

/// Writes `v` as valid but non-canonical JSON: members reversed, spaces, every non-ASCII char as \u escapes.
fn write_loose(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push('"');
            for u in s.encode_utf16() {
                if (0x20..0x7f).contains(&u) && u != b'"' as u16 && u != b'\\' as u16 {
                    out.push(u as u8 as char);
                } else {
                    out.push_str(&format!("\\u{u:04X}"));
                }
            }
            out.push('"');
        }
        Value::Number(Number::Float(f)) => out.push_str(&format!("{f:e}")),
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                write_loose(it, out);
            }
            out.push_str(" ]");
        }
        Value::Object(o) => {
            out.push_str("{\t");
            for (i, (k, v)) in o.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_loose(&Value::String(k.to_string()), out);
                out.push_str(" : ");
                write_loose(v, out);
            }
            out.push('}');
        }
        other => out.push_str(&canonical::to_string(other)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn canonicalize_parse_canonicalize_is_a_fixed_point(v in arb_value()) {
        let c1 = canonical::to_vec(&v);
        let parsed = parse(&c1).expect("canonical output is valid I-JSON");
        prop_assert_eq!(&parsed, &v);
        prop_assert_eq!(canonical::to_vec(&parsed), c1);
    }

    #[test]
    fn a_value_held_as_its_canonical_text_writes_and_compares_as_the_value(v in arb_value(), w in arb_value()) {
        // Value::Canonical: stored canonical texts an answer writes verbatim.
        let text = canonical::to_string(&v);
        let held = Value::Canonical(text.clone());
        let arr = vec![held.clone(), v.clone()];
        prop_assert_eq!(canonical::to_vec(&Value::Array(arr)), canonical::to_vec(&Value::Array(vec![v.clone(), v.clone()])));
        prop_assert_eq!(&held, &v);
        prop_assert_eq!(&v, &held);
        prop_assert_eq!(&held, &Value::Canonical(text));
        let same = v == w;
        prop_assert_eq!(held == w, same);
        prop_assert_eq!(held == Value::Canonical(canonical::to_string(&w)), same);
    }

    #[test]
    fn any_spelling_of_a_value_has_the_same_canonical_form(v in arb_value()) {
        let mut loose = String::new();
        write_loose(&v, &mut loose);
        let parsed = parse(loose.as_bytes()).expect("loose output is valid I-JSON");
        prop_assert_eq!(canonical::to_vec(&parsed), canonical::to_vec(&v));
    }
}

/// Unknown members for the signed-object property. Strings without control
/// characters and integers only: `\u001f` vs `\u001F` and `1e+21` vs `1E+21`
/// are one-byte edits that JCS defines as the same value, so they are not defects.
fn arb_extra() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        (0u64..(1 << 53)).prop_map(|u| Value::Number(Number::Int(u))),
        "[^\\x00-\\x1f]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Value::Array)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_single_changed_byte_anywhere_in_a_signed_object_fails_verification(
        seed in any::<[u8; 32]>(),
        extras in prop::collection::btree_map("[a-z_]{1,8}", arb_extra(), 0..4),
        at in any::<prop::sample::Index>(),
        delta in 1u8..=255,
    ) {
        let account = AccountKey::from_seed(seed);
        let device = DeviceKey::from_seeds(seed.map(|b| b ^ 0x55), seed.map(|b| b ^ 0xaa));
        let mut d = draft::certificate("dev", &account, &device, &["send"], 1_700_000_000_000);
        for (k, v) in extras {
            if !d.fields().contains(&k) {
                d = d.set(&k, v);
            }
        }
        let text = canonical::object_to_vec(&d.sign(&account));
        let verifies = |bytes: &[u8]| {
            parse_object(bytes)
                .ok()
                .and_then(|o| DeviceCertificate::parse(o).ok())
                .is_some_and(|c| c.verify("dev").is_ok())
        };
        prop_assert!(verifies(&text));
        let i = at.index(text.len());
        let mut edited = text.clone();
        edited[i] = edited[i].wrapping_add(delta);
        prop_assert!(!verifies(&edited), "byte {} edited to {:?} still verifies", i, edited[i] as char);
    }
}

/// RFC 8785 §3.2.2.2 string escaping, written the obvious way: one byte at a time.
fn escape_reference(s: &str) -> Vec<u8> {
    let mut out = vec![b'"'];
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
    out
}

/// Strings made of the bytes that matter to the word-at-a-time escape scan.
fn arb_escapable() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        (0u32..0x80).prop_map(|c| char::from_u32(c).unwrap_or('a')),
        Just('"'),
        Just('\\'),
        Just('\u{7f}'),
        Just('é'),
        Just('\u{2028}'),
        Just('😀'),
        Just('a'),
    ];
    prop::collection::vec(ch, 0..40).prop_map(|v| v.into_iter().collect())
}

proptest! {
    /// The word-at-a-time string writer escapes exactly what RFC 8785 escapes, at every offset.
    #[test]
    fn string_escaping_matches_the_byte_at_a_time_rule(s in arb_escapable()) {
        let mut out = Vec::new();
        canonical::write_string(&s, &mut out);
        prop_assert_eq!(out, escape_reference(&s));
    }

    /// Text written into a `String` is byte for byte what is written into bytes, any Unicode included.
    #[test]
    fn string_and_byte_sinks_write_the_same_text(s in prop_oneof![arb_escapable(), any::<String>()]) {
        let (mut bytes, mut text) = (Vec::new(), String::new());
        canonical::write_string(&s, &mut bytes);
        canonical::write_string(&s, &mut text);
        prop_assert_eq!(text.into_bytes(), bytes);
    }
}

/// Every control character, quote and backslash is escaped wherever it sits in an 8-byte word.
#[test]
fn string_escaping_at_every_word_offset() {
    for c in (0u8..0x80).chain([b'"', b'\\']) {
        for at in 0..17 {
            let mut s = vec![b'a'; 17];
            s[at] = c;
            let s = String::from_utf8(s).expect("ascii");
            let mut out = Vec::new();
            canonical::write_string(&s, &mut out);
            assert_eq!(out, escape_reference(&s), "byte {c:#x} at {at}");
        }
    }
}

proptest! {
    /// An object spliced from its members' canonical texts is the object's canonical form.
    #[test]
    fn splicing_canonical_members_is_the_canonical_object(
        m in prop::collection::btree_map(any::<String>(), arb_value(), 0..8)
    ) {
        let o: Object = m.into_iter().collect();
        let texts: Vec<(String, String)> =
            o.iter().map(|(k, v)| (k.to_string(), canonical::to_string(v))).collect();
        let mut members: Vec<(&str, &str)> =
            texts.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        prop_assert_eq!(
            canonical::object_of_canonical(&mut members).into_bytes(),
            canonical::object_to_vec(&o)
        );
    }
}
