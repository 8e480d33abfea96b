//! WebSocket frames (protocol.md §6): `{"id", "method", "params"}`, parsed once, strictly.
//!
//! `params` is the object as the strict parser read it, which the method then works on:
//! it is never re-serialized, so `1.0` or `-0` in a protocol integer field stays invalid as
//! written (the parser keeps any number not spelled as a plain integer as a float).

use super::json::{self, Object, Value};
use crate::{Error, ErrorCode};

/// A request frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// A string of at most 64 characters, or an integer.
    pub id: Value,
    /// The method called, e.g. `message.send`.
    pub method: String,
    /// The params object, as the strict parser read it from the frame.
    pub params: Object,
}

/// Parses a frame strictly; on error, the id (if it could be read) and the error.
pub fn parse(text: &[u8]) -> Result<Frame, (Value, Error)> {
    let bad = |id: Value, m: &str| (id, Error::new(ErrorCode::InvalidParams, m));
    let mut o = json::parse_object(text).map_err(|e| (Value::Null, e.into()))?;
    let id = o.get("id").cloned().unwrap_or(Value::Null);
    let id_ok = match &id {
        Value::String(s) => s.chars().count() <= 64,
        Value::Number(n) => n.as_protocol_int().is_some(),
        _ => false,
    };
    if !id_ok {
        return Err(bad(
            Value::Null,
            "frame id must be a string of at most 64 characters or an integer",
        ));
    }
    let method = match o.get("method").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => return Err(bad(id, "frame method must be a string")),
    };
    let params = match o.remove("params") {
        Some(Value::Object(p)) => p,
        _ => return Err(bad(id, "frame params must be an object")),
    };
    Ok(Frame { id, method, params })
}
