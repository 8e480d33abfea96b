//! The seed's four methods as typed calls: `message.send`, `message.deliver`,
//! `message.delivery.status` and `message.timeline.sync` with typed params where the
//! protocol's are plain values, and their answers as records rather than JSON: what the WIT's
//! `send`, `deliver`, `status` and `sync` return, and the JavaScript binding mirrors.
//!
//! The engine answers every method with a JSON value; this module reads the four answers into
//! records once, here, so no host or binding parses them. The signed objects of a timeline
//! entry stay their canonical JSON text: a client verifies them end to end over exactly those
//! bytes.

use super::{Event, Relay};
use crate::engine::{Caller, Entropy, Storage};
use crate::wire::canonical;
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};

/// A protocol error object (`{code, message, data?}`) as the wire carries it: a destination's
/// code is copied as it came, so it is a string here; `data` is its canonical JSON.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorObject {
    /// The error's code, as written.
    pub code: String,
    /// What is wrong, for people.
    pub message: String,
    /// Structured details, as canonical JSON, when the code defines them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// Why a typed call was refused: the protocol's code and its error object. Nothing of the
/// call was committed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The code, one of the protocol's (§5); serialized as the WIT spells it (`state-conflict`).
    #[serde(serialize_with = "wit_code")]
    pub code: ErrorCode,
    /// The HTTP status the code travels with.
    pub status: u16,
    /// The error object an HTTP client would have read.
    pub error: ErrorObject,
}

/// An error code as the WIT's `error-code` enum spells it: kebab-case.
fn wit_code<S: serde::Serializer>(code: &ErrorCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&code.as_str().replace('_', "-"))
}

impl Failure {
    /// A typed call lost before it committed (a trap, a failed group commit): `internal`,
    /// nothing was accepted, so a retry is safe. The typed twin of
    /// [`super::Response::uncommitted`], which every host answers with as it is.
    pub fn uncommitted() -> Failure {
        Failure::from(&Error::new(
            crate::ErrorCode::Internal,
            super::http::UNCOMMITTED_MESSAGE,
        ))
    }
}

impl From<&Error> for Failure {
    fn from(e: &Error) -> Failure {
        Failure {
            code: e.code,
            status: e.code.http_status(),
            error: ErrorObject {
                code: e.code.as_str().to_string(),
                message: e.message.clone(),
                data: e
                    .data
                    .as_ref()
                    .map(|d| String::from_utf8_lossy(&canonical::to_vec(d)).into_owned()),
            },
        }
    }
}

/// A delivery's state: the seed's DeliveryStatus `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryState {
    /// Accepted by the source; still being delivered.
    Delivering,
    /// The destination accepted it (final).
    TargetAccepted,
    /// It ended without acceptance; `error` says why (final).
    Failed,
}

/// The seed's DeliveryStatus; times in Unix milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryStatus {
    /// The message's id.
    pub message_id: String,
    /// The sending account.
    pub from: String,
    /// The receiving account.
    pub to: String,
    /// Where the delivery stands.
    pub status: DeliveryState,
    /// When the relay that answers accepted it.
    pub accepted_at: u64,
    /// The delivery deadline (the source's answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// When the destination accepted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_accepted_at: Option<u64>,
    /// Why it failed (only when failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
}

/// Which record a timeline entry is, for the calling account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// A message the account sent to another.
    Sent,
    /// A message the account received.
    Received,
    /// A message the account sent to itself (one record; the protocol's `kind` "self").
    SelfDelivery,
}

/// One timeline entry for the calling device.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    /// The account's sequence number of the record.
    pub seq: u64,
    /// Sent, received, or to itself.
    pub kind: EntryKind,
    /// When this relay accepted it.
    pub accepted_at: u64,
    /// When the record expires.
    pub expires_at: u64,
    /// The signed envelope, canonical JSON.
    pub envelope: String,
    /// The sending device's signed certificate, canonical JSON.
    pub device_certificate: String,
    /// The calling device's key box, canonical JSON.
    pub key_box: String,
}

/// A page of the calling device's timeline.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelinePage {
    /// The entries, in sequence order.
    pub entries: Vec<TimelineEntry>,
    /// The highest sequence scanned: the next page's `after`.
    pub next: u64,
    /// Whether a higher sequence exists.
    pub has_more: bool,
}

/// A typed call's result and the events to carry out (committed with it).
#[derive(Clone, Debug, PartialEq)]
pub struct Typed<T> {
    /// The answer.
    pub value: T,
    /// What the host must do now, as for any call.
    pub events: Vec<Event>,
}

/// A typed call's outcome.
pub type Outcome<T> = Result<Typed<T>, Failure>;

impl<S: Storage, E: Entropy> Relay<S, E> {
    /// message.send for `caller`, `params` the protocol's params object as JSON (its envelope
    /// and certificates are signed over their canonical form, so they cross as JSON).
    pub fn send(&mut self, caller: &Caller, params: &[u8], now: u64) -> Outcome<DeliveryStatus> {
        self.typed(caller, "message.send", params, now, delivery_status)
    }

    /// message.deliver for `caller` (a relay), `params` as for [`Relay::send`].
    pub fn deliver(&mut self, caller: &Caller, params: &[u8], now: u64) -> Outcome<DeliveryStatus> {
        self.typed(caller, "message.deliver", params, now, delivery_status)
    }

    /// message.delivery.status of the caller's message `message_id`.
    pub fn status(
        &mut self,
        caller: &Caller,
        message_id: &str,
        now: u64,
    ) -> Outcome<DeliveryStatus> {
        let mut p = Object::new();
        p.insert("message_id", message_id);
        let params = canonical::object_to_vec(&p);
        self.typed(
            caller,
            "message.delivery.status",
            &params,
            now,
            delivery_status,
        )
    }

    /// message.timeline.sync of the caller's device: entries after `after`, at most `limit`
    /// (none: the protocol's default).
    pub fn sync(
        &mut self,
        caller: &Caller,
        after: u64,
        limit: Option<u32>,
        now: u64,
    ) -> Outcome<TimelinePage> {
        let mut p = Object::new();
        p.insert("after", after);
        if let Some(l) = limit {
            p.insert("limit", u64::from(l));
        }
        let params = canonical::object_to_vec(&p);
        self.typed(caller, "message.timeline.sync", &params, now, timeline_page)
    }

    /// Runs `method` as any call, then reads its answer with `read`.
    fn typed<T>(
        &mut self,
        caller: &Caller,
        method: &str,
        params: &[u8],
        now: u64,
        read: fn(&Value) -> Option<T>,
    ) -> Outcome<T> {
        let r = self.engine().call_from(caller, None, method, params, now);
        let value = match &r.result {
            Ok(v) => read(v).ok_or_else(|| {
                // The engine's own answer not in its documented shape: a bug, said as one.
                Failure::from(&Error::new(
                    ErrorCode::Internal,
                    format!("the answer of {method} is not in its documented shape"),
                ))
            }),
            Err(e) => Err(Failure::from(e)),
        };
        let events = self.events(r.effects, now);
        value.map(|value| Typed { value, events })
    }
}

fn text(o: &Object, key: &str) -> Option<String> {
    o.get(key)?.as_str().map(str::to_string)
}

fn int(o: &Object, key: &str) -> Option<u64> {
    o.get(key)?.as_protocol_int()
}

fn canonical_text(o: &Object, key: &str) -> Option<String> {
    String::from_utf8(canonical::to_vec(o.get(key)?)).ok()
}

fn error_object(v: &Value) -> Option<ErrorObject> {
    let o = v.as_object()?;
    Some(ErrorObject {
        code: text(o, "code")?,
        message: text(o, "message")?,
        data: o.get("data").and_then(|_| canonical_text(o, "data")),
    })
}

/// A DeliveryStatus from the engine's answer.
pub fn delivery_status(v: &Value) -> Option<DeliveryStatus> {
    let o = v.as_object()?;
    let status = match o.get("status")?.as_str()? {
        "delivering" => DeliveryState::Delivering,
        "target_accepted" => DeliveryState::TargetAccepted,
        "failed" => DeliveryState::Failed,
        _ => return None,
    };
    Some(DeliveryStatus {
        message_id: text(o, "message_id")?,
        from: text(o, "from")?,
        to: text(o, "to")?,
        status,
        accepted_at: int(o, "accepted_at")?,
        deadline: int(o, "deadline"),
        target_accepted_at: int(o, "target_accepted_at"),
        error: match o.get("error") {
            Some(e) => Some(error_object(e)?),
            None => None,
        },
    })
}

/// A timeline page from the engine's answer.
pub fn timeline_page(v: &Value) -> Option<TimelinePage> {
    let o = v.as_object()?;
    let Value::Array(items) = o.get("entries")? else {
        return None;
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let e = item.as_object()?;
        entries.push(TimelineEntry {
            seq: int(e, "seq")?,
            kind: match e.get("kind")?.as_str()? {
                "sent" => EntryKind::Sent,
                "received" => EntryKind::Received,
                "self" => EntryKind::SelfDelivery,
                _ => return None,
            },
            accepted_at: int(e, "accepted_at")?,
            expires_at: int(e, "expires_at")?,
            envelope: canonical_text(e, "envelope")?,
            device_certificate: canonical_text(e, "device_certificate")?,
            key_box: canonical_text(e, "key_box")?,
        });
    }
    let has_more = match o.get("has_more")? {
        Value::Bool(b) => *b,
        _ => return None,
    };
    Some(TimelinePage {
        entries,
        next: int(o, "next")?,
        has_more,
    })
}
