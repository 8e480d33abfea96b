//! Records the engine persists. JSON via serde: readable in a database shell, stable across hosts.
//!
//! Signed objects a record holds (routes, certificates, envelopes, key boxes,
//! deliver params) are kept as their canonical JSON, embedded as JSON
//! ([`Canon`]): writing a record copies that text, and reading one skips
//! over it, instead of escaping every quote of it into a string and
//! unescaping it again (that was about a sixth of the wasm time of a send).

use super::status::Status;
use crate::wire::json::Value;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Canonical JSON text held in a record as JSON (not as a string); empty is stored as `null`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Canon(String);

/// serde_json's name for a value written verbatim: the struct name and sole field name
/// `RawValue` itself serializes with (serde_json's `raw_value` feature).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

impl Canon {
    /// Holds `text`, the engine's canonical JSON output (empty is allowed).
    ///
    /// The text is not parsed again: it comes from the canonical writer, which only
    /// writes JSON. Building a `RawValue` parsed it once more (about a twentieth of a
    /// send's wasm time); the record tests check the text is written verbatim.
    pub(crate) fn new(text: String) -> Canon {
        Canon(text)
    }

    /// The text (empty when none is held).
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The text's bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Whether no text is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text as a value an answer writes verbatim (`null` when none is held).
    pub(crate) fn into_value(self) -> Value {
        if self.0.is_empty() {
            return Value::Null;
        }
        Value::Canonical(self.0)
    }
}

impl Serialize for Canon {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if self.0.is_empty() {
            return s.serialize_none();
        }
        // What `RawValue::serialize` does: serde_json copies the field's text as it is.
        let mut raw = s.serialize_struct(RAW_TOKEN, 1)?;
        raw.serialize_field(RAW_TOKEN, self.0.as_str())?;
        raw.end()
    }
}

impl<'de> Deserialize<'de> for Canon {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Canon, D::Error> {
        let Some(raw) = Option::<Box<RawValue>>::deserialize(d)? else {
            return Ok(Canon::default());
        };
        if !raw.get().starts_with('"') {
            return Ok(Canon(String::from(Box::<str>::from(raw))));
        }
        // Records written before texts were embedded hold them as JSON strings.
        let text: String = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
        Ok(Canon(text))
    }
}

/// An account registered here: served, or kept as a former home (protocol.md, "Home relay changes").
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AccountRec {
    pub registered_at: u64,
    pub discoverable: bool,
    pub latest_seq: u64,
    /// Home or former home; absent in the record of an account that never moved.
    #[serde(default, skip_serializing_if = "Standing::is_home")]
    pub standing: Standing,
    /// The home span: the revision of the route under which this relay serves the account
    /// now (its registration, a move back, any later route naming this relay). Sessions
    /// opened in another span are a former account's (rule 6). 0 in records written before
    /// spans were kept, as in the sessions of that time, which belong to it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub span: u64,
}

/// Whether this relay is an account's home or a former home of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Standing {
    /// The account's current route names this relay.
    #[default]
    Home,
    /// A valid route of higher revision naming another relay arrived at `since`: the
    /// account's results and records are kept until they expire, its device state frozen.
    Former { since: u64 },
}

impl Standing {
    /// Whether this is the home standing (so the field is left out of the record).
    pub(crate) fn is_home(&self) -> bool {
        *self == Standing::Home
    }
}

/// The highest route held for an account (ours or not).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RouteRec {
    pub revision: u64,
    pub relay: String,
    /// The signed route, canonical JSON.
    pub route: Canon,
    /// When it was last stored or used: a route of an account served elsewhere is
    /// forgotten `message_retention` after that.
    #[serde(default)]
    pub touched_at: u64,
    /// The last timeline sequence of an account this relay forgot (rule 5), so that moving
    /// back continues its numbering instead of restarting it under a client's cursor.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A device in an account's device state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct DeviceRec {
    /// Canonical certificate; empty when revoked before ever registering.
    pub cert: Canon,
    pub issued_at: u64,
    pub expires_at: Option<u64>,
    pub send: bool,
    pub sync: bool,
    pub manage: bool,
    pub revoked: bool,
}

impl DeviceRec {
    /// A device revoked before it ever registered: no certificate, no permissions.
    pub(crate) fn revoked_unregistered() -> DeviceRec {
        DeviceRec {
            cert: Canon::default(),
            issued_at: 0,
            expires_at: None,
            send: false,
            sync: false,
            manage: false,
            revoked: true,
        }
    }
}

/// An open session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SessionRec {
    pub account: String,
    pub device_id: String,
    pub expires_at: u64,
    /// The account's home span when the session was opened ([`AccountRec::span`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub span: u64,
}

/// One key box of a record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BoxRec {
    pub device_id: String,
    /// The box, canonical JSON.
    pub key_box: Canon,
}

/// A timeline record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RecordRec {
    pub seq: u64,
    pub kind: String,
    pub accepted_at: u64,
    pub expires_at: u64,
    pub body_expires_at: Option<u64>,
    /// Canonical envelope.
    pub envelope: Canon,
    /// Canonical certificate of the sending device.
    pub certificate: Canon,
    pub boxes: Vec<BoxRec>,
    /// Devices that may read it: a box and valid at acceptance.
    pub visible: Vec<String>,
}

/// A failure reason, as it will be written in DeliveryStatus.error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ErrorRec {
    pub code: String,
    pub message: String,
    /// Canonical JSON of `data`.
    pub data: Option<String>,
}

/// The source's result for (from, message_id).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SendRec {
    pub hash: String,
    pub to: String,
    pub status: Status,
    pub accepted_at: u64,
    pub deadline: u64,
    pub retain_until: u64,
    pub target_accepted_at: Option<u64>,
    pub error: Option<ErrorRec>,
}

/// The destination's result for (from, message_id).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RecvRec {
    pub hash: String,
    pub to: String,
    pub accepted_at: u64,
    pub retain_until: u64,
}

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TaskState {
    /// Waiting for `next_at`.
    Waiting,
    /// Waiting for a free in-flight slot at the destination.
    Parked,
    /// An attempt is out; `next_at` is when it times out.
    InFlight,
    /// Ended (target_accepted or failed); kept for the operator until retention ends.
    Done,
}

impl TaskState {
    /// The state's wire spelling, as serde writes it in records.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Parked => "parked",
            TaskState::InFlight => "in_flight",
            TaskState::Done => "done",
        }
    }
}

/// A delivery the source is responsible for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TaskRec {
    pub from: String,
    pub message_id: String,
    pub to: String,
    /// Current target relay (this relay's id for local delivery).
    pub target: String,
    /// Revision of the route that designated the target.
    pub route_revision: u64,
    /// The message.deliver params, canonical JSON, identical on every attempt.
    pub body: Canon,
    pub attempt: u32,
    /// Attempts since the target last changed or answered (drives backoff).
    pub failures: u32,
    pub state: TaskState,
    /// The next (or in-flight) attempt is a route.get to the target, after a route error without a route.
    pub want_route_get: bool,
    /// The route error that the route.get may overcome; the failure if it does not.
    pub route_error: Option<ErrorRec>,
    pub next_at: u64,
    pub deadline: u64,
    /// No attempt before this time (a rate_limited retry_after).
    pub not_before: u64,
    /// Last error code seen, or `result_unknown`.
    pub last_error: Option<String>,
    /// Some attempt at the current target has an unknown outcome: no switch without a route error.
    pub uncertain: bool,
    pub retain_until: u64,
    pub park_order: u64,
    /// The last failure was an outage (not attempted, or an unknown outcome): the task is
    /// in the destination's outage index while it waits, to come forward when it is back.
    #[serde(default)]
    pub outage: bool,
    /// When the latest attempt left.
    #[serde(default)]
    pub sent_at: u64,
    /// When the source accepted it (its destination's oldest pending age counts from here).
    #[serde(default)]
    pub accepted_at: u64,
    /// In flight as the first item of a `message.deliver.batch`: the other items' tasks and
    /// attempts, which the exchange's answer also reports (this task holds its slot).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carries: Vec<(String, u32)>,
    /// In flight as a later item of the batch that this task leads: it holds no slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rides: Option<String>,
}

/// A destination's health, for scheduling and the operator.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct PeerRec {
    pub in_flight: u32,
    pub last_success_at: Option<u64>,
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    pub park_seq: u64,
    /// When it last came back after failures: attempts sent before then were lost to that outage.
    #[serde(default)]
    pub back_at: Option<u64>,
    /// Deliveries to it not yet ended (for the operator's metrics).
    #[serde(default)]
    pub pending: u64,
    /// When its current run of failures began (the first failure since its last success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<u64>,
    /// Held by the operator (`admin.destination.pause`): no attempt starts until resumed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Deliveries to it that ended failed and are still kept (until their retention ends).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u64,
    /// The message that came with `last_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_message: Option<String>,
}

/// A token bucket, in thousandths of a token.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BucketRec {
    pub milli_tokens: u64,
    pub updated_at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> RouteRec {
        RouteRec {
            revision: 1,
            relay: "https://relay.example".into(),
            route: Canon::new(text.to_string()),
            touched_at: 0,
            last_seq: 0,
        }
    }

    #[test]
    fn embedded_texts_are_stored_as_json_and_read_back_unchanged() {
        let text = r#"{"account":"a\"b","sig":"x"}"#;
        let stored = serde_json::to_string(&route(text)).expect("serialize");
        assert_eq!(
            stored,
            format!(
                r#"{{"revision":1,"relay":"https://relay.example","route":{text},"touched_at":0}}"#
            )
        );
        let back: RouteRec = serde_json::from_str(&stored).expect("deserialize");
        assert_eq!(back.route.as_str(), text);
    }

    #[test]
    fn records_written_with_texts_as_strings_still_read() {
        let old = r#"{"revision":1,"relay":"r","route":"{\"account\":\"a\",\"sig\":\"x\"}"}"#;
        let back: RouteRec = serde_json::from_str(old).expect("deserialize");
        assert_eq!(back.route.as_str(), r#"{"account":"a","sig":"x"}"#);
        let old_empty = r#"{"cert":"","issued_at":0,"expires_at":null,"send":false,"sync":false,"manage":false,"revoked":true}"#;
        let d: DeviceRec = serde_json::from_str(old_empty).expect("deserialize");
        assert!(d.cert.is_empty());
    }

    #[test]
    fn an_empty_text_is_stored_as_null() {
        let d = DeviceRec::revoked_unregistered();
        let stored = serde_json::to_string(&d).expect("serialize");
        assert!(stored.starts_with(r#"{"cert":null,"#), "{stored}");
        let back: DeviceRec = serde_json::from_str(&stored).expect("deserialize");
        assert!(back.cert.is_empty() && back.cert.as_str().is_empty());
    }
}

/// How far the sweep of attempts orphaned by a restart got, for one process start.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SweepRec {
    /// The process start (`Config::started_at`) the sweep is for.
    pub started_at: u64,
    /// The last due key looked at.
    pub after: Option<Vec<u8>>,
    /// The whole window was looked at.
    pub done: bool,
}
