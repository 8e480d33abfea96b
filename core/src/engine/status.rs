//! DeliveryStatus: the answer of message.send, message.deliver and message.delivery.status.

use super::records::{ErrorRec, RecvRec, SendRec};
use crate::wire::field::Fields;
use crate::wire::json::{self, Object, Value};

/// A delivery's status value (stored in send records by its wire spelling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Accepted by the source; the delivery is still being attempted.
    Delivering,
    /// The destination accepted the message (terminal).
    TargetAccepted,
    /// The delivery ended without acceptance; `error` says why (terminal).
    Failed,
}

impl Status {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Delivering => "delivering",
            Status::TargetAccepted => "target_accepted",
            Status::Failed => "failed",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "delivering" => Some(Status::Delivering),
            "target_accepted" => Some(Status::TargetAccepted),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }

    /// Whether the status can never change again.
    pub fn is_terminal(self) -> bool {
        self != Status::Delivering
    }
}

pub(crate) fn error_value(e: &ErrorRec) -> Value {
    let mut o = Object::new();
    o.insert("code", e.code.as_str());
    o.insert("message", e.message.as_str());
    if let Some(d) = e
        .data
        .as_deref()
        .and_then(|d| json::parse(d.as_bytes()).ok())
    {
        o.insert("data", d);
    }
    Value::Object(o)
}

/// The source's DeliveryStatus for a stored send result.
pub(crate) fn from_send(from: &str, message_id: &str, r: &SendRec) -> Value {
    let mut o = Object::new();
    o.insert("message_id", message_id);
    o.insert("from", from);
    o.insert("to", r.to.as_str());
    o.insert("status", r.status.as_str());
    o.insert("accepted_at", r.accepted_at);
    o.insert("deadline", r.deadline);
    if let Some(t) = r.target_accepted_at {
        o.insert("target_accepted_at", t);
    }
    if let Some(e) = &r.error {
        o.insert("error", error_value(e));
    }
    Value::Object(o)
}

/// The destination's DeliveryStatus for a stored receipt (always `target_accepted`).
pub(crate) fn from_receipt(from: &str, message_id: &str, r: &RecvRec) -> Value {
    let mut o = Object::new();
    o.insert("message_id", message_id);
    o.insert("from", from);
    o.insert("to", r.to.as_str());
    o.insert("status", Status::TargetAccepted.as_str());
    o.insert("accepted_at", r.accepted_at);
    o.insert("target_accepted_at", r.accepted_at);
    Value::Object(o)
}

/// A destination's successful answer, if it really is `target_accepted` for this message.
pub(crate) fn accepted_at_if_target_accepted(
    body: &[u8],
    from: &str,
    message_id: &str,
    to: &str,
) -> Option<u64> {
    let o = json::parse_object(body).ok()?;
    let f = Fields::new(&o);
    let matches = f.str("status").ok()? == Status::TargetAccepted.as_str()
        && f.str("message_id").ok()? == message_id
        && f.str("from").ok()? == from
        && f.str("to").ok()? == to;
    if !matches {
        return None;
    }
    f.int("accepted_at").ok()
}
