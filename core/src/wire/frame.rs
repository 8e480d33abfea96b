//! WebSocket frames (protocol.md §6): `{"id", "method", "params"}`, with `params` kept as the exact bytes sent.
//!
//! Params must reach the engine unre-serialized: `1.0` or `-0` in a protocol
//! integer field is invalid as written, and re-serializing would hide that.

use super::json::{self, Value};
use crate::{Error, ErrorCode};
use serde::Deserialize;

/// A request frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// A string of at most 64 characters, or an integer.
    pub id: Value,
    /// The method called, e.g. `message.send`.
    pub method: String,
    /// The params object exactly as it appeared in the frame.
    pub params: Vec<u8>,
}

#[derive(Deserialize)]
struct Raw<'a> {
    #[serde(borrow)]
    params: Option<&'a serde_json::value::RawValue>,
}

/// Parses a frame strictly; on error, the id (if it could be read) and the error.
pub fn parse(text: &[u8]) -> Result<Frame, (Value, Error)> {
    let bad = |id: Value, m: &str| (id, Error::new(ErrorCode::InvalidParams, m));
    let o = json::parse_object(text).map_err(|e| (Value::Null, e.into()))?;
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
    if !matches!(o.get("params"), Some(Value::Object(_))) {
        return Err(bad(id, "frame params must be an object"));
    }
    // The strict parse above already vouched for the bytes; take the params slice verbatim.
    let raw: Raw<'_> = serde_json::from_slice(text).map_err(|e| {
        (
            id.clone(),
            Error::new(ErrorCode::InvalidParams, e.to_string()),
        )
    })?;
    let params = raw
        .params
        .map(|p| p.get().as_bytes().to_vec())
        .unwrap_or_default();
    Ok(Frame { id, method, params })
}
