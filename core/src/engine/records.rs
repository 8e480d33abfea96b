//! Records the engine persists. JSON via serde: readable in a database shell, stable across hosts.

use serde::{Deserialize, Serialize};

/// An account whose home is this relay.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AccountRec {
    pub registered_at: u64,
    pub discoverable: bool,
    pub latest_seq: u64,
}

/// The highest route held for an account (ours or not).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RouteRec {
    pub revision: u64,
    pub relay: String,
    /// The signed route, canonical JSON.
    pub route: String,
}

/// A device in an account's device state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct DeviceRec {
    /// Canonical certificate; empty when revoked before ever registering.
    pub cert: String,
    pub issued_at: u64,
    pub expires_at: Option<u64>,
    pub send: bool,
    pub sync: bool,
    pub manage: bool,
    pub revoked: bool,
}

/// An open session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SessionRec {
    pub account: String,
    pub device_id: String,
    pub expires_at: u64,
}

/// One key box of a record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BoxRec {
    pub device_id: String,
    /// The box, canonical JSON.
    pub key_box: String,
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
    pub envelope: String,
    /// Canonical certificate of the sending device.
    pub certificate: String,
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
    pub status: String,
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
    pub body: String,
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
}

/// A destination's health, for scheduling and the operator.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct PeerRec {
    pub in_flight: u32,
    pub last_success_at: Option<u64>,
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    pub park_seq: u64,
}

/// A token bucket, in thousandths of a token.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BucketRec {
    pub milli_tokens: u64,
    pub updated_at: u64,
}
