//! RFC 8785 canonicalization against the RFC author's reference data.

mod common;
use relay_core::wire::canonical;
use relay_core::wire::json::{parse, Number, Value};
use std::fs;

#[test]
fn rfc8785_reference_inputs_canonicalize_to_the_reference_outputs() {
    let root = common::vectors().join("cyberphone-json-canonicalization");
    let mut names: Vec<_> = fs::read_dir(root.join("input"))
        .expect("input dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names.len(), 6, "{names:?}");
    let mut failed = Vec::new();
    for name in &names {
        let input = fs::read(root.join("input").join(name)).expect("input");
        let want = fs::read(root.join("output").join(name)).expect("output");
        let hex_name = name.replace(".json", ".txt");
        let want_hex: String = fs::read_to_string(root.join("outhex").join(hex_name))
            .expect("outhex")
            .split_whitespace()
            .collect();
        assert_eq!(
            common::hex(&want_hex),
            want,
            "{name}: outhex and output agree"
        );
        let got = canonical::to_vec(&parse(&input).unwrap_or_else(|e| panic!("{name}: {e}")));
        if got != want {
            failed.push(format!(
                "{name}:\n got  {}\n want {}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn es6_number_serialization_matches_the_first_100k_reference_numbers() {
    let path = common::vectors()
        .join("cyberphone-json-canonicalization/es6numbers/es6testfile-first100k.txt");
    let text = fs::read_to_string(path).expect("es6 numbers");
    let mut count = 0;
    let mut failed = Vec::new();
    for line in text.lines() {
        let (bits, want) = line.split_once(',').expect("line format");
        let f = f64::from_bits(u64::from_str_radix(bits, 16).expect("hex bits"));
        let got = canonical::to_string(&Value::Number(Number::Float(f)));
        if got != want {
            failed.push(format!("{bits}: got {got}, want {want}"));
        }
        // Parsing the expected text back gives the same double, and it canonicalizes to itself.
        let reparsed = canonical::to_string(&parse(want.as_bytes()).expect("reparse"));
        if reparsed != want {
            failed.push(format!("{bits}: reparsed {want} as {reparsed}"));
        }
        count += 1;
    }
    assert_eq!(count, 100_000);
    assert!(
        failed.is_empty(),
        "{} failures, first: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

#[test]
fn keys_sort_by_utf16_code_units_not_code_points() {
    // U+1F600 is the pair D83D DE00 in UTF-16, so it sorts before U+E000,
    // although code-point (and UTF-8 byte) order puts it after.
    let v = parse("{\"\u{E000}\":2,\"\u{1F600}\":1,\"a\":3}".as_bytes()).unwrap();
    assert_eq!(
        canonical::to_string(&v),
        "{\"a\":3,\"\u{1F600}\":1,\"\u{E000}\":2}"
    );
}

#[test]
fn strings_use_minimal_escapes() {
    let v = parse(br#"["\u0000\u001f\b\t\n\f\r\"\\\/\u007f\u2028"]"#).unwrap();
    assert_eq!(
        canonical::to_string(&v),
        "[\"\\u0000\\u001f\\b\\t\\n\\f\\r\\\"\\\\/\u{7f}\u{2028}\"]"
    );
}
