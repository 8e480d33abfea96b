//! WebSocket messages as the core sees them (protocol.md §6): request frames in, answer
//! frames, notifications and close directives out.
//!
//! The host owns the WebSocket protocol itself (upgrade, masking, ping/pong, fragments,
//! 1002/1007/1009 for broken frames); every text message goes to the core whole.

use super::Event;
use crate::wire::canonical;
use crate::wire::json::{self, Object, Value};

/// Close code for a session that ended (expired, revoked, or refused mid-socket).
pub const SESSION_CLOSED: u16 = 4401;
/// Close reason when the session's `expires_at` passes.
pub const EXPIRED: &str = "session expired";
/// Close reason when a call on the socket finds the session gone.
pub const ENDED: &str = "session ended";
/// Close reason when the device was revoked.
pub const REVOKED: &str = "device revoked";
/// The close every socket gets when its relay stops (1001, going away): the client
/// reconnects, rather than seeing an abnormal end.
pub const STOPPING: (u16, &str) = (1001, "the relay is stopping");

/// Who a WebSocket belongs to, decided at the upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// The session token the socket calls with.
    pub token: String,
    /// Its account: notifications for it go to this socket.
    pub account: String,
    /// Its device: revoking it closes this socket.
    pub device_id: String,
    /// When the session expires: the host closes the socket then with
    /// [`SESSION_CLOSED`], [`EXPIRED`].
    pub expires_at: u64,
}

/// The core's answer to one text message.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The answer frame to send.
    pub text: String,
    /// Close the socket after it, with this code and reason.
    pub close: Option<(u16, &'static str)>,
    /// What the host must do once the answer is on its way.
    pub effects: Vec<Event>,
    /// The frame was not answered: it is parked in the core under its ticket, as for
    /// [`super::Step::Parked`]; its answer comes back from the fetch's report.
    pub parked: Option<super::Parked>,
}

/// An answer frame: `{"id", "result"}` or `{"id", "error"}` from a call's status and body.
pub fn answer_frame(id: Value, status: u16, body: &[u8]) -> String {
    let mut o = Object::new();
    o.insert("id", id);
    let v = json::parse(body).unwrap_or(Value::Null);
    if status == 200 {
        o.insert("result", v);
    } else {
        let e = v
            .as_object()
            .and_then(|o| o.get("error"))
            .cloned()
            .unwrap_or(Value::Null);
        o.insert("error", e);
    }
    canonical::to_string(&Value::Object(o))
}

/// The answer frame for a call's result, built from the engine's value (its serialized body
/// would only be parsed again): `{"id", "result"}`, or `{"id", "error"}` with the error object
/// the HTTP body carries under `error`.
pub fn answer_of(id: Value, result: &Result<Value, crate::Error>) -> String {
    let mut o = Object::new();
    o.insert("id", id);
    match result {
        Ok(v) => o.insert("result", v.clone()),
        Err(e) => {
            let inner = match crate::engine::error_body(e) {
                Value::Object(mut b) => b.remove("error").unwrap_or(Value::Null),
                _ => Value::Null,
            };
            o.insert("error", inner)
        }
    };
    canonical::to_string(&Value::Object(o))
}

/// The frame id of a text message, when it can be read (for an answer the core did not
/// give, such as "busy"); `null` otherwise.
pub fn frame_id(text: &str) -> Value {
    match crate::wire::frame::parse(text.as_bytes()) {
        Ok(f) => f.id,
        Err((id, _)) => id,
    }
}

/// The answer frame when the host's queue of work for the core is full, or a frame may not
/// wait for what it needs ([`super::ROUNDS`], [`super::parking::MAX_PARKED`]).
pub fn busy_frame(text: &str) -> String {
    answer_frame(frame_id(text), 503, super::http::BUSY)
}

/// The answer frame to `text` when its call was lost before it committed (a trap, a failed
/// group commit): `internal`, nothing was accepted, so a retry is safe.
pub fn uncommitted_frame(text: &str) -> String {
    answer_frame(frame_id(text), 500, super::http::UNCOMMITTED)
}

/// The `message.timeline.changed` notification for an account.
pub fn notification(account: &str, latest_seq: u64) -> String {
    let mut p = Object::new();
    p.insert("account", account);
    p.insert("latest_seq", latest_seq);
    let mut o = Object::new();
    o.insert("method", "message.timeline.changed");
    o.insert("params", p);
    canonical::to_string(&Value::Object(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        assert_eq!(
            answer_frame(Value::from(7u64), 200, br#"{"a":1}"#),
            r#"{"id":7,"result":{"a":1}}"#
        );
        assert_eq!(
            busy_frame(r#"{"id":"x","method":"m","params":{}}"#),
            r#"{"error":{"code":"unavailable","data":{"retry_after":1000},"message":"the relay is busy; retry"},"id":"x"}"#
        );
        assert!(busy_frame("garbage").starts_with(r#"{"error""#));
        assert_eq!(
            uncommitted_frame(r#"{"id":"x","method":"m","params":{}}"#),
            r#"{"error":{"code":"internal","message":"the relay core failed; nothing was accepted"},"id":"x"}"#
        );
        assert_eq!(
            notification("a", 3),
            r#"{"method":"message.timeline.changed","params":{"account":"a","latest_seq":3}}"#
        );
    }
}
