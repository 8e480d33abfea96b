//! Strict I-JSON (protocol.md §1) against JSONTestSuite, with a decision for every `i_` case.

mod common;
use relay_core::wire::canonical;
use relay_core::wire::json::{parse, parse_object, MAX_DEPTH};
use std::fs;

/// Implementation-defined cases we accept, with the canonical form they take; every other `i_` case is rejected.
const ACCEPTED_I: &[(&str, &str)] = &[
    // Underflow: a finite value inside the double range that rounds to 0.
    ("i_number_double_huge_neg_exp.json", "[0]"),
    ("i_number_real_underflow.json", "[0]"),
    // Integers beyond 2^53 inside the double range: legal in unknown fields
    // (as doubles, JCS style); protocol integer fields reject them.
    ("i_number_too_big_neg_int.json", "[-1.2312312312312312e+29]"),
    ("i_number_too_big_pos_int.json", "[100000000000000000000]"),
    (
        "i_number_very_big_negative_int.json",
        "[-2.374623746732769e+47]",
    ),
];

fn cases(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = common::vectors().join("JSONTestSuite/test_parsing");
    let mut out: Vec<_> = fs::read_dir(&dir)
        .expect("JSONTestSuite")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, fs::read(&p).expect("read"))
        })
        .collect();
    out.sort();
    out
}

/// Valid JSON that I-JSON (RFC 7493 §2.3) forbids: duplicate member names.
const REJECTED_Y: &[&str] = &[
    "y_object_duplicated_key.json",
    "y_object_duplicated_key_and_value.json",
];

#[test]
fn json_test_suite_y_cases_parse_except_duplicate_keys() {
    let cases = cases("y_");
    assert_eq!(cases.len(), 95);
    for (name, bytes) in &cases {
        let got = parse(bytes);
        if REJECTED_Y.contains(&name.as_str()) {
            let e = got.expect_err(name);
            assert!(e.message.contains("duplicate key"), "{name}: {e}");
        } else {
            assert!(got.is_ok(), "{name} rejected: {:?}", got.err());
        }
    }
}

#[test]
fn json_test_suite_n_cases_are_rejected() {
    let cases = cases("n_");
    assert_eq!(cases.len(), 188);
    let accepted: Vec<_> = cases
        .iter()
        .filter(|(_, b)| parse(b).is_ok())
        .map(|(n, _)| n.clone())
        .collect();
    assert!(accepted.is_empty(), "n_ cases accepted: {accepted:#?}");
}

#[test]
fn json_test_suite_i_cases_follow_the_documented_decisions() {
    let cases = cases("i_");
    assert_eq!(cases.len(), 35);
    for (name, bytes) in &cases {
        let got = parse(bytes);
        match ACCEPTED_I.iter().find(|(n, _)| n == name) {
            Some((_, canon)) => {
                let v = got.unwrap_or_else(|e| panic!("{name} should be accepted: {e}"));
                assert_eq!(&canonical::to_string(&v), canon, "{name}");
            }
            None => assert!(got.is_err(), "{name} should be rejected"),
        }
    }
}

#[test]
fn json_test_suite_transform_cases_follow_the_documented_decisions() {
    let dir = common::vectors().join("JSONTestSuite/test_transform");
    // Duplicate keys, lone surrogates and invalid UTF-8 are rejected; the rest keep their JCS meaning.
    let expect: &[(&str, Option<&str>)] = &[
        (
            "number_-9223372036854775808.json",
            Some("[-9223372036854776000]"),
        ),
        (
            "number_-9223372036854775809.json",
            Some("[-9223372036854776000]"),
        ),
        ("number_1.0.json", Some("[1]")),
        ("number_1.000000000000000005.json", Some("[1]")),
        ("number_1000000000000000.json", Some("[1000000000000000]")),
        (
            "number_10000000000000000999.json",
            Some("[10000000000000000000]"),
        ),
        ("number_1e-999.json", Some("[0]")),
        ("number_1e6.json", Some("[1000000]")),
        (
            "number_9223372036854775807.json",
            Some("[9223372036854776000]"),
        ),
        (
            "number_9223372036854775808.json",
            Some("[9223372036854776000]"),
        ),
        // Keys are compared as code points, never normalized: NFC and NFD differ.
        (
            "object_key_nfc_nfd.json",
            Some("{\"e\u{301}\":\"NFD\",\"\u{e9}\":\"NFC\"}"),
        ),
        (
            "object_key_nfd_nfc.json",
            Some("{\"e\u{301}\":\"NFD\",\"\u{e9}\":\"NFC\"}"),
        ),
        ("object_same_key_different_values.json", None),
        ("object_same_key_same_value.json", None),
        ("object_same_key_unclear_values.json", None),
        ("string_1_escaped_invalid_codepoint.json", None),
        ("string_1_invalid_codepoint.json", None),
        ("string_2_escaped_invalid_codepoints.json", None),
        ("string_2_invalid_codepoints.json", None),
        ("string_3_escaped_invalid_codepoints.json", None),
        ("string_3_invalid_codepoints.json", None),
        ("string_with_escaped_NULL.json", Some("[\"A\\u0000B\"]")),
    ];
    let mut seen = 0;
    for entry in fs::read_dir(&dir).expect("test_transform") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (_, want) = expect
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no decision recorded for {name}"));
        let got = parse(&fs::read(&path).expect("read"));
        match want {
            Some(c) => assert_eq!(
                canonical::to_string(&got.unwrap_or_else(|e| panic!("{name}: {e}"))),
                *c,
                "{name}"
            ),
            None => assert!(got.is_err(), "{name} should be rejected"),
        }
        seen += 1;
    }
    assert_eq!(seen, expect.len());
}

#[test]
fn duplicate_keys_are_rejected_with_the_key_named() {
    let e = parse(br#"{"a":1,"b":{"x":1,"x":2}}"#).unwrap_err();
    assert!(e.message.contains("duplicate key \"x\""), "{e}");
    // Many members take the sorted path.
    let many: String = (0..40).map(|i| format!("\"k{i}\":{i},")).collect();
    let e = parse(format!("{{{many}\"k7\":0}}").as_bytes()).unwrap_err();
    assert!(e.message.contains("duplicate key \"k7\""), "{e}");
}

#[test]
fn lone_surrogate_escapes_are_rejected() {
    for s in [
        r#"["\uD800"]"#,
        r#"["\uDC00"]"#,
        r#"{"\uD83D":1}"#,
        r#"["\uD83Dx"]"#,
    ] {
        let e = parse(s.as_bytes()).unwrap_err();
        assert!(e.message.contains("surrogate"), "{s}: {e}");
    }
    assert!(parse(r#"["\uD83D\uDE00"]"#.as_bytes()).is_ok());
}

#[test]
fn invalid_utf8_is_rejected() {
    for b in [
        &b"[\"\xff\"]"[..],
        b"[\"\xc0\xaf\"]",
        b"[\"\xed\xa0\x80\"]",
        b"{\"\xe9\":1}",
    ] {
        assert!(parse(b).is_err(), "{b:?}");
    }
}

#[test]
fn nesting_is_limited_to_32_with_params_at_depth_1() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(ok.as_bytes()).is_ok());
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let e = parse(deep.as_bytes()).unwrap_err();
    assert!(e.message.contains("nesting deeper than 32"), "{e}");
    // A huge nesting is refused early, without exhausting the stack.
    let huge = "[".repeat(1_000_000);
    assert!(parse(huge.as_bytes()).is_err());
}

#[test]
fn numbers_outside_the_double_range_are_rejected() {
    for s in ["[1e400]", "[-1e400]", "[1.5e309]"] {
        assert!(parse(s.as_bytes()).is_err(), "{s}");
    }
}

#[test]
fn protocol_integers_are_plain_and_at_most_2_pow_53_minus_1() {
    let o = parse_object(
        br#"{"a":0,"b":9007199254740991,"c":9007199254740992,"d":1.0,"e":1e3,"f":-0,"g":-1,"h":"1"}"#,
    )
    .unwrap();
    let f = relay_core::wire::field::Fields::new(&o);
    assert_eq!(f.int("a"), Ok(0));
    assert_eq!(f.int("b"), Ok(9007199254740991));
    for k in ["c", "d", "e", "f", "g", "h"] {
        let e = f.int(k).unwrap_err();
        assert!(e.to_string().contains("must be an integer"), "{k}: {e}");
    }
}

#[test]
fn errors_say_where() {
    let e = parse(b"{\n  \"a\": [1, 2,]\n}").unwrap_err();
    assert!(e.message.contains("line 2"), "{e}");
    let err: relay_core::Error = e.into();
    assert_eq!(err.code, relay_core::ErrorCode::InvalidParams);
}

#[test]
fn params_must_be_an_object() {
    assert!(parse_object(b"[]").is_err());
    assert!(parse_object(b"{}").is_ok());
    assert!(parse_object(b"{} x").is_err());
}

#[test]
fn websocket_frames_keep_params_as_written() {
    use relay_core::wire::frame;
    use relay_core::wire::json::Value;
    let f =
        frame::parse(br#"{"id":"a","method":"m","params":{"after":1.0, "x":-0, "n":7}}"#).unwrap();
    // Spelled as floats, they stay floats: never a protocol integer, as in an HTTP body.
    assert_eq!(f.params.get("after").and_then(Value::as_protocol_int), None);
    assert_eq!(f.params.get("x").and_then(Value::as_protocol_int), None);
    assert_eq!(f.params.get("n").and_then(Value::as_protocol_int), Some(7));
    assert_eq!(f.method, "m");
    let (id, e) = frame::parse(br#"{"id":"b","method":"m","params":[]}"#).unwrap_err();
    assert_eq!(id, relay_core::wire::json::Value::from("b"));
    assert_eq!(e.code, relay_core::ErrorCode::InvalidParams);
    let too_long = format!(
        r#"{{"id":"{}","method":"m","params":{{}}}}"#,
        "x".repeat(65)
    );
    assert!(frame::parse(too_long.as_bytes()).is_err());
    assert!(frame::parse(br#"{"id":1,"id":2,"method":"m","params":{}}"#).is_err());
}
