//! Strict I-JSON (RFC 7493): the only way bytes become values in the core.
//!
//! serde_json does the tokenizing (UTF-8 validation, escapes, lone
//! surrogates, number range); the visitor here adds what I-JSON and
//! protocol.md §1 demand on top: duplicate keys are rejected and nesting is
//! limited to [`MAX_DEPTH`] while parsing, so a deep input is refused before
//! it costs stack or memory. Objects keep their members in input order;
//! canonical order is applied only when serializing.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The deepest nesting accepted; the outermost container is depth 1.
pub const MAX_DEPTH: usize = 32;

/// The deepest a stored signed object or key box may nest by itself: an answer carries it
/// three levels down (a sync page: result, entries, entry; an error: error, data), so
/// at most this keeps every answer within [`MAX_DEPTH`].
pub const MAX_EMBEDDED_DEPTH: usize = MAX_DEPTH - 3;

/// The largest integer a protocol field may hold (2^53 - 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// A JSON number as parsed.
#[derive(Clone, Copy, Debug)]
pub enum Number {
    /// Written as `0|[1-9][0-9]*` (no sign, fraction or exponent); may exceed 2^53.
    Int(u64),
    /// Any other spelling, as the nearest double.
    Float(f64),
}

impl Number {
    /// The IEEE-754 double this number denotes (what JCS serializes).
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(u) => u as f64,
            Number::Float(f) => f,
        }
    }

    /// The value as a protocol integer: written plainly and at most 2^53 - 1.
    pub fn as_protocol_int(self) -> Option<u64> {
        match self {
            Number::Int(u) if u <= MAX_SAFE_INTEGER => Some(u),
            _ => None,
        }
    }
}

impl PartialEq for Number {
    /// Numbers are equal when they denote the same double (JCS semantics).
    fn eq(&self, other: &Number) -> bool {
        self.as_f64() == other.as_f64()
    }
}

/// A JSON object: members in input order, keys unique.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Object {
    members: Vec<(String, Value)>,
}

impl Object {
    /// An empty object.
    pub fn new() -> Object {
        Object::default()
    }

    /// The member named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether a member named `key` exists.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`, replacing an existing member in place.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.members.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.members.push((key, value)),
        }
    }

    /// Removes and returns the member named `key`.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let at = self.members.iter().position(|(k, _)| k == key)?;
        Some(self.members.remove(at).1)
    }

    /// Members in input order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, &Value)> + ExactSizeIterator {
        self.members.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Builds an object from members, rejecting a duplicate key.
    pub fn from_members(members: Vec<(String, Value)>) -> Result<Object, String> {
        if let Some(dup) = first_duplicate(&members) {
            return Err(dup.to_string());
        }
        Ok(Object { members })
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Object {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Object {
        let mut o = Object::new();
        for (k, v) in iter {
            o.insert(k, v);
        }
        o
    }
}

impl Object {
    /// How deep the object nests: 1 for an object of scalars.
    pub fn depth(&self) -> usize {
        1 + self.iter().map(|(_, v)| v.depth()).max().unwrap_or(0)
    }
}

impl Value {
    /// How deep the value nests: 0 for a scalar, 1 for a container of scalars.
    pub fn depth(&self) -> usize {
        match self {
            Value::Array(items) => 1 + items.iter().map(Value::depth).max().unwrap_or(0),
            Value::Object(o) => o.depth(),
            _ => 0,
        }
    }
}

/// Equality of objects ignores member order (JCS semantics).
fn objects_equal(a: &Object, b: &Object) -> bool {
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// A parsed I-JSON value.
#[derive(Clone, Debug)]
pub enum Value {
    /// JSON `null`.
    Null,
    /// JSON `true` or `false`.
    Bool(bool),
    /// A number, as written (integer) or as the nearest double.
    Number(Number),
    /// A string, escapes resolved.
    String(String),
    /// An array, in order.
    Array(Vec<Value>),
    /// An object: members unique by name, compared regardless of order.
    Object(Object),
    /// A value held as its canonical JSON text, which the canonical writer copies verbatim:
    /// signed objects the engine stored in canonical form, on their way out in an answer
    /// (a sync page), so they are not parsed only to be written again. Made only by the
    /// engine from texts it canonicalized; the accessors see no object or string in it.
    Canonical(String),
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Number(a), Value::Number(b)) => a == b,
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Array(a), Value::Array(b)) => a == b,
            (Value::Object(a), Value::Object(b)) => objects_equal(a, b),
            // Canonical texts are equal exactly when their values are (RFC 8785).
            (Value::Canonical(a), Value::Canonical(b)) => a == b,
            (Value::Canonical(t), v) | (v, Value::Canonical(t)) => {
                parse(t.as_bytes()).is_ok_and(|p| &p == v)
            }
            _ => false,
        }
    }
}

impl Value {
    /// The object inside, if this is one.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The string inside, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a protocol integer (see [`Number::as_protocol_int`]).
    pub fn as_protocol_int(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_protocol_int(),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}
impl From<u64> for Value {
    fn from(u: u64) -> Value {
        Value::Number(Number::Int(u))
    }
}
impl From<Object> for Value {
    fn from(o: Object) -> Value {
        Value::Object(o)
    }
}
impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Value {
        Value::Array(a)
    }
}

/// Why bytes are not strict I-JSON; always `invalid_params` on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// What is wrong and where (line and column, 1-based).
    pub message: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON: {}", self.message)
    }
}

impl std::error::Error for JsonError {}

impl From<JsonError> for crate::Error {
    fn from(e: JsonError) -> crate::Error {
        crate::Error::new(crate::ErrorCode::InvalidParams, e.to_string())
    }
}

/// Parses strict I-JSON from raw bytes.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = ValueSeed { depth: 0 }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| JsonError {
            message: explain(e.to_string()),
        })?;
    Ok(value)
}

/// Parses strict I-JSON whose top level must be an object (the shape of all params).
pub fn parse_object(bytes: &[u8]) -> Result<Object, JsonError> {
    match parse(bytes)? {
        Value::Object(o) => Ok(o),
        _ => Err(JsonError {
            message: "expected a JSON object at the top level".to_string(),
        }),
    }
}

/// Rewords serde_json's messages where they would mislead a reader.
fn explain(message: String) -> String {
    if message.starts_with("lone leading surrogate")
        || message.starts_with("unexpected end of hex escape")
    {
        // Both arise from a \u escape of a surrogate that is not part of a valid pair.
        let at = message.find(" at line").map_or("", |i| &message[i..]);
        return format!("lone surrogate in a \\u escape{at}");
    }
    if message.starts_with("invalid unicode code point") {
        let at = message.find(" at line").map_or("", |i| &message[i..]);
        return format!("invalid UTF-8 or lone surrogate{at}");
    }
    message
}

fn first_duplicate(members: &[(String, Value)]) -> Option<&str> {
    if members.len() <= 16 {
        for (i, (k, _)) in members.iter().enumerate() {
            if members[..i].iter().any(|(p, _)| p == k) {
                return Some(k);
            }
        }
        return None;
    }
    let mut keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Deserializes one value at a known depth, refusing to go deeper than allowed.
struct ValueSeed {
    depth: usize,
}

impl ValueSeed {
    fn enter<E: de::Error>(&self) -> Result<ValueSeed, E> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(E::custom(format_args!(
                "nesting deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(ValueSeed { depth })
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(Number::Int(u)))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        // serde_json reports only negative integers here; they are never protocol integers.
        Ok(Value::Number(Number::Float(i as f64)))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        if !f.is_finite() {
            return Err(E::custom("number outside the IEEE-754 double range"));
        }
        Ok(Value::Number(Number::Float(f)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed { depth: inner.depth })? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut members: Vec<(String, Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(ValueSeed { depth: inner.depth })?;
            members.push((key, value));
        }
        if let Some(dup) = first_duplicate(&members) {
            return Err(de::Error::custom(format_args!("duplicate key {dup:?}")));
        }
        Ok(Value::Object(Object { members }))
    }
}
