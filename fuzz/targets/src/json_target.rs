//! The strict JSON parser and the RFC 8785 canonicalizer, differentially against serde_json.
//!
//! Oracle, for any bytes:
//! - relay accepts => serde_json accepts, and the canonical form equals an
//!   independent RFC 8785 writer's output over serde_json's value (its own key
//!   sort by UTF-16 code units, its own string escaping, ECMAScript
//!   Number-to-String from Rust's shortest float formatting, not ryu-js);
//!   the canonical form parses back (strictly) to an equal value, and
//!   canonicalizing it again gives the same bytes;
//! - the core's canonical fast paths agree with the plain writer
//!   (`Value::Canonical` texts, `object_of_canonical`, `write_object_without`);
//! - relay rejects what serde_json accepts only for a documented strictness
//!   reason (protocol.md §1), found by an independent probe: a duplicate member
//!   name, or nesting deeper than [`MAX_DEPTH`]. Lone surrogates and numbers
//!   outside the double range are rejected by serde_json's own tokenizer, so
//!   both sides refuse them; size limits are the engine's (`max_request_bytes`),
//!   not the parser's.

use relay_core::wire::canonical;
use relay_core::wire::json::{self, Value, MAX_DEPTH};
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The JSON target: see the module documentation for the oracle.
pub fn json(data: &[u8]) {
    let relay = json::parse(data);
    let serde = serde_json::from_slice::<serde_json::Value>(data);
    assert_eq!(
        relay.as_ref().ok().and_then(Value::as_object).is_some(),
        json::parse_object(data).is_ok(),
        "parse_object disagrees with parse"
    );
    match (relay, serde) {
        (Ok(v), Ok(s)) => accepted(&v, &s),
        (Ok(v), Err(e)) => panic!("relay accepted {v:?}, which serde_json rejects: {e}"),
        (Err(e), Ok(_)) => {
            let p = probe(data).expect("serde_json accepted, so the probe parses too");
            assert!(
                p.duplicate || p.depth > MAX_DEPTH,
                "relay rejected input that serde_json accepts, with no duplicate key and depth {} <= {MAX_DEPTH}: {e}",
                p.depth
            );
        }
        (Err(_), Err(_)) => {}
    }
}

fn accepted(v: &Value, s: &serde_json::Value) {
    let c1 = canonical::to_vec(v);
    let reference = reference_jcs(s);
    assert_eq!(
        String::from_utf8_lossy(&c1),
        reference,
        "canonical form differs from the reference RFC 8785 writer"
    );
    let v2 =
        json::parse(&c1).unwrap_or_else(|e| panic!("canonical output is not strict JSON: {e}"));
    assert_eq!(&v2, v, "canonical output parses to another value");
    assert_eq!(
        canonical::to_vec(&v2),
        c1,
        "canonicalizing twice changed it"
    );
    let s2: serde_json::Value = serde_json::from_slice(&c1).expect("serde_json parses canonical");
    assert!(
        same_serde(&s2, s),
        "serde_json reads the canonical form as another value"
    );
    // A held canonical text is written verbatim and compares as its value.
    let held = Value::Canonical(String::from_utf8(c1.clone()).expect("utf-8"));
    assert_eq!(&held, v);
    assert_eq!(
        canonical::to_vec(&Value::Array(vec![held.clone(), v.clone()])),
        canonical::to_vec(&Value::Array(vec![v.clone(), v.clone()]))
    );
    if let Value::Object(o) = v {
        let texts: Vec<(String, String)> = o
            .iter()
            .map(|(k, m)| (k.to_string(), canonical::to_string(m)))
            .collect();
        let mut members: Vec<(&str, &str)> = texts
            .iter()
            .map(|(k, t)| (k.as_str(), t.as_str()))
            .collect();
        assert_eq!(
            canonical::object_of_canonical(&mut members).into_bytes(),
            c1,
            "object_of_canonical differs"
        );
        if let Some((first, _)) = o.iter().next() {
            let mut without = Vec::new();
            canonical::write_object_without(o, first, &mut without);
            let mut removed = o.clone();
            removed.remove(first);
            assert_eq!(
                without,
                canonical::object_to_vec(&removed),
                "write_object_without differs"
            );
        }
    }
}

/// Equality of serde_json values with numbers compared as doubles (what JCS keeps).
fn same_serde(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as S;
    match (a, b) {
        (S::Number(x), S::Number(y)) => x.as_f64() == y.as_f64(),
        (S::Array(x), S::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_serde(p, q))
        }
        (S::Object(x), S::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| same_serde(p, q)))
        }
        _ => a == b,
    }
}

/// An independent RFC 8785 writer over a serde_json value.
pub fn reference_jcs(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_ref(v, &mut out);
    out
}

fn write_ref(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value as S;
    match v {
        S::Null => out.push_str("null"),
        S::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        S::Number(n) => out.push_str(&es_number(n.as_f64().expect("finite"))),
        S::String(s) => ref_string(s, out),
        S::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_ref(item, out);
            }
            out.push(']');
        }
        S::Object(map) => {
            let mut members: Vec<(Vec<u16>, &String, &serde_json::Value)> = map
                .iter()
                .map(|(k, v)| (k.encode_utf16().collect(), k, v))
                .collect();
            members.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (_, k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ref_string(k, out);
                out.push(':');
                write_ref(v, out);
            }
            out.push('}');
        }
    }
}

fn ref_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript Number::toString (ECMA-262 §6.1.6.1.20), from Rust's float formatting.
///
/// The digit count `k` is that of Rust's shortest round-trip form; the digits are the
/// value rounded exactly to `k` digits (Rust's precision formatting rounds the exact
/// binary value, ties to even), which is the spec's choice "closest to the value, and
/// even on a tie" whenever it round-trips. Rust's shortest form alone rounds a tie
/// up: `123123123123112.125` is `...112.12` in ECMAScript, `...112.13` there.
pub fn es_number(f: f64) -> String {
    if f == 0.0 {
        return "0".to_string();
    }
    let shortest = format!("{:e}", f.abs());
    let k = shortest
        .split_once('e')
        .map_or(1, |(m, _)| m.replace('.', "").len());
    let nearest = format!("{:.*e}", k - 1, f.abs());
    let sci = if nearest.parse::<f64>() == Ok(f.abs()) {
        nearest
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i64 = exp.parse().expect("exponent digits");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i64;
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let sign = if e >= 0 { '+' } else { '-' };
        if k == 1 {
            format!("{digits}e{sign}{}", e.abs())
        } else {
            format!("{}.{}e{sign}{}", &digits[..1], &digits[1..], e.abs())
        }
    };
    if f < 0.0 {
        format!("-{body}")
    } else {
        body
    }
}

/// What the independent probe saw: the deepest nesting and whether any object repeats a name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Deepest container nesting; the outermost container is depth 1.
    pub depth: usize,
    /// Whether some object has two members of the same name.
    pub duplicate: bool,
}

/// Reads `data` with serde_json (not through the core's visitor) and reports its shape.
pub fn probe(data: &[u8]) -> Result<Probe, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(data);
    let p = ProbeSeed(0).deserialize(&mut de)?;
    de.end()?;
    Ok(p)
}

struct ProbeSeed(usize);

impl<'de> DeserializeSeed<'de> for ProbeSeed {
    type Value = Probe;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Probe, D::Error> {
        d.deserialize_any(self)
    }
}

impl ProbeSeed {
    fn scalar<E>(self) -> Result<Probe, E> {
        Ok(Probe {
            depth: self.0,
            duplicate: false,
        })
    }
}

impl<'de> Visitor<'de> for ProbeSeed {
    type Value = Probe;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_bool<E>(self, _: bool) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_u64<E>(self, _: u64) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_i64<E>(self, _: i64) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_f64<E>(self, _: f64) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_str<E>(self, _: &str) -> Result<Probe, E> {
        self.scalar()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probe, A::Error> {
        let depth = self.0 + 1;
        let mut p = Probe {
            depth,
            duplicate: false,
        };
        while let Some(q) = seq.next_element_seed(ProbeSeed(depth))? {
            p.depth = p.depth.max(q.depth);
            p.duplicate |= q.duplicate;
        }
        Ok(p)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe, A::Error> {
        let depth = self.0 + 1;
        let mut p = Probe {
            depth,
            duplicate: false,
        };
        let mut names = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            p.duplicate |= !names.insert(name);
            let q = map.next_value_seed(ProbeSeed(depth))?;
            p.depth = p.depth.max(q.depth);
            p.duplicate |= q.duplicate;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es_number_matches_ecmascript_examples() {
        for (f, s) in [
            (1.0, "1"),
            (-0.0, "0"),
            (0.5, "0.5"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (123.456, "123.456"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (-1.2312312312312312e29, "-1.2312312312312312e+29"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (9007199254740993.0, "9007199254740992"),
            (-123123123123112.12, "-123123123123112.12"),
        ] {
            assert_eq!(es_number(f), s, "{f:e}");
        }
    }

    #[test]
    fn the_probe_sees_duplicates_and_depth() {
        assert_eq!(
            probe(br#"{"a":[[1]],"a":2}"#).unwrap(),
            Probe {
                depth: 3,
                duplicate: true
            }
        );
        assert_eq!(probe(b"7").unwrap(), Probe::default());
    }
}
