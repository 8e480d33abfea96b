//! What the engine asks of its host, and what the host reports back.

use crate::wire::identity::RelayId;

/// A relay method the engine asks the host to call on another relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMethod {
    /// `message.deliver` with the stored params.
    Deliver,
    /// `route.get` for the recipient, after a route error without `data.route`.
    RouteGet,
}

impl PeerMethod {
    /// The method name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerMethod::Deliver => "message.deliver",
            PeerMethod::RouteGet => "route.get",
        }
    }
}

/// An effect for the host to execute after the operation committed.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Call `method` on `target` with `body` (exact bytes), then report with `Engine::outcome`.
    Send {
        task: String,
        attempt: u32,
        target: RelayId,
        method: PeerMethod,
        body: Vec<u8>,
    },
    /// Call `Engine::tick` at (or after) this time; replaces any earlier wake-up request.
    WakeAt(u64),
    /// Push `message.timeline.changed` to the account's connected devices.
    Notify { account: String, latest_seq: u64 },
    /// Close this device's sessions and WebSockets (it was revoked).
    EndDeviceSessions { account: String, device_id: String },
    /// A delivery this relay was responsible for ended (for the host's log and metrics):
    /// `status` is `target_accepted` or `failed`, `error_code` the failure's code.
    DeliveryEnded {
        from: String,
        message_id: String,
        to: String,
        status: &'static str,
        error_code: Option<String>,
    },
}

/// What became of one `Effect::Send`.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A 200 answer with this body.
    Result(Vec<u8>),
    /// An error answer with this body (`{"error": {...}}`).
    Error(Vec<u8>),
    /// Timeout, reset or lost response: the peer may or may not have acted.
    Unknown,
    /// Known not to have reached the peer (connection refused, name not resolved).
    NotAttempted,
}
