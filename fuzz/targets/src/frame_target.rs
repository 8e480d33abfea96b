//! The WebSocket request frame parser (protocol.md §6).
//!
//! Oracle: no panic; an accepted frame's `params` are the object the strict
//! parser reads as the frame's `params` member, its id is a string of at most 64 characters or a protocol
//! integer, its method the frame's string; a frame rebuilt canonically from
//! those parts parses to the same parts; a refusal is `invalid_params` and
//! echoes only an id the frame could carry.

use relay_core::wire::canonical;
use relay_core::wire::frame;
use relay_core::wire::json::{self, Object, Value};
use relay_core::ErrorCode;

/// The frame target: see the module documentation for the oracle.
pub fn frame(data: &[u8]) {
    match frame::parse(data) {
        Ok(f) => {
            assert!(valid_id(&f.id), "accepted id {:?}", f.id);
            let whole = json::parse_object(data).expect("an accepted frame is strict JSON");
            assert_eq!(
                whole.get("method").and_then(Value::as_str),
                Some(f.method.as_str())
            );
            assert_eq!(whole.get("id"), Some(&f.id));
            let params = f.params.clone();
            assert_eq!(whole.get("params"), Some(&Value::Object(params.clone())));
            let mut rebuilt = Object::new();
            rebuilt.insert("id", f.id.clone());
            rebuilt.insert("method", f.method.as_str());
            rebuilt.insert("params", Value::Object(params.clone()));
            let text = canonical::object_to_vec(&rebuilt);
            let again = frame::parse(&text).expect("a canonical frame parses");
            assert_eq!(again.id, f.id);
            assert_eq!(again.method, f.method);
            // The same members; the canonical frame has them in key order.
            assert_eq!(
                canonical::object_to_vec(&again.params),
                canonical::object_to_vec(&params)
            );
        }
        Err((id, e)) => {
            assert_eq!(e.code, ErrorCode::InvalidParams, "{e}");
            assert!(
                id == Value::Null || valid_id(&id),
                "refusal echoes an invalid id {id:?}"
            );
        }
    }
}

fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(s) => s.chars().count() <= 64,
        Value::Number(n) => n.as_protocol_int().is_some(),
        _ => false,
    }
}
