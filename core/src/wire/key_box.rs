//! `key_box` and box lists: the message key sealed to one device (not signed).

use super::field::{FieldError, Fields};
use super::identity::DeviceId;
use super::json::{Object, Value};

/// The largest sealed key accepted, in bytes (the reference client uses 48).
pub const MAX_BOX_CIPHERTEXT: usize = 1024;

/// A parsed `key_box`.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyBox {
    raw: Object,
    /// The device the box is sealed to; at most one box per device in a list.
    pub device_id: DeviceId,
}

impl KeyBox {
    /// Parses one box: `{device_id, enc, ciphertext}` (32-byte `enc`, 1 to 1024-byte ciphertext).
    pub fn parse(raw: Object) -> Result<KeyBox, FieldError> {
        let f = Fields::new(&raw);
        f.embeddable()?;
        let device_id = f.device_id("device_id")?;
        f.fixed::<32>("enc")?;
        f.bytes("ciphertext", 1, MAX_BOX_CIPHERTEXT)?;
        Ok(KeyBox { raw, device_id })
    }

    /// The box as received.
    pub fn raw(&self) -> &Object {
        &self.raw
    }
}

/// Parses a box list: 1 to `max_boxes` boxes with distinct device ids.
pub fn parse_boxes(name: &str, value: &Value, max_boxes: usize) -> Result<Vec<KeyBox>, FieldError> {
    let Value::Array(items) = value else {
        return Err(FieldError::invalid(name, "must be an array of key boxes"));
    };
    if items.is_empty() || items.len() > max_boxes {
        return Err(FieldError::invalid(
            name,
            format!("must hold 1 to {max_boxes} boxes, not {}", items.len()),
        ));
    }
    let mut boxes: Vec<KeyBox> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{name}[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| FieldError::invalid(at.clone(), "must be an object"))?;
        let b = KeyBox::parse(obj.clone()).map_err(|e| e.within(&at))?;
        if boxes.iter().any(|p| p.device_id == b.device_id) {
            return Err(FieldError::invalid(
                format!("{at}.device_id"),
                "device ids must be distinct",
            ));
        }
        boxes.push(b);
    }
    Ok(boxes)
}
