//! What the engine asks of its host, and what the host reports back.

use crate::wire::identity::RelayId;

/// `message.deliver`'s wire name.
pub const DELIVER: &str = "message.deliver";

/// A relay method the engine asks the host to call on another relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMethod {
    /// `message.deliver` with the stored params.
    Deliver,
    /// `message.deliver.batch`: the stored params of several deliveries to one destination.
    DeliverBatch,
    /// `route.get` for the recipient, after a route error without `data.route`.
    RouteGet,
}

impl PeerMethod {
    /// The method name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerMethod::Deliver => DELIVER,
            PeerMethod::DeliverBatch => super::batch::METHOD,
            PeerMethod::RouteGet => "route.get",
        }
    }
}

/// An effect for the host to execute after the operation committed.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Call `method` on `target` with `body` (exact bytes), then report with `Engine::outcome`.
    Send {
        /// The delivery task (`{from}.{message_id}`), to name when reporting the outcome.
        task: String,
        /// The task's attempt number, so a late outcome of an older attempt is ignored.
        attempt: u32,
        /// The peer relay to call.
        target: RelayId,
        /// The relay method to call there.
        method: PeerMethod,
        /// The request body, to send byte for byte (every retry sends the same bytes).
        body: Vec<u8>,
        /// When `target` is this relay: the sibling shard to hand the request to.
        shard: Option<u32>,
        /// For a delivery: the revision of the recipient's route it targets, signed in the
        /// request as `Relay-Route-Revision` (protocol.md "Home relay changes", rule 6).
        route_revision: Option<u64>,
        /// For a batch: the other deliveries it carries after `task`, as (task, attempt).
        /// Reporting this effect's outcome reports theirs; a host needs nothing of them.
        riders: Vec<(String, u32)>,
    },
    /// Call `Engine::tick` at (or after) this time; replaces any earlier wake-up request.
    WakeAt(u64),
    /// Push `message.timeline.changed` to the account's connected devices.
    Notify {
        /// The account whose timeline grew.
        account: String,
        /// The sequence of its newest timeline record.
        latest_seq: u64,
    },
    /// Close this device's sessions and WebSockets (it was revoked).
    EndDeviceSessions {
        /// The account of the revoked device.
        account: String,
        /// The revoked device.
        device_id: String,
    },
    /// A message was accepted for the first time (for the host's log).
    Accepted(Acceptance),
    /// A delivery this relay was responsible for ended (for the host's log and metrics):
    /// `status` is `target_accepted` or `failed`, `error_code` the failure's code.
    DeliveryEnded {
        /// The sending account.
        from: String,
        /// The message's id.
        message_id: String,
        /// The recipient account.
        to: String,
        /// `target_accepted` or `failed`.
        status: &'static str,
        /// The failure's code (a protocol code or `deadline_exceeded`); `None` on success.
        error_code: Option<String>,
    },
    /// An operator action took effect (for the host's audit log: always logged).
    OperatorAction(OperatorAction),
    /// Hand `body` to sibling shard `shard` of this relay as a public `POST {path}`; its
    /// answer is not needed. A shard shares a route it learned or used with the shard of
    /// the route's account, so that shard, which every other shard asks, holds it too.
    ShardCall {
        /// The sibling shard.
        shard: u32,
        /// The path, `/v1/{method}`.
        path: &'static str,
        /// The request body.
        body: Vec<u8>,
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

/// A message accepted for the first time, ids only (for the host's log): a `message.send`
/// this relay took from its account, or a `message.deliver` it received. A retry answered
/// from the stored result is not a second acceptance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// `message.send` or `message.deliver`.
    pub method: &'static str,
    /// The sending account.
    pub from: String,
    /// The message's id.
    pub message_id: String,
    /// The recipient account.
    pub to: String,
    /// The DeliveryStatus answered: `delivering`, `target_accepted`, or `failed` (a
    /// delivery to an account of this relay can end within the call that accepted it).
    pub status: &'static str,
}

/// One operator action, for the audit trail: what was done, to what, and how many
/// deliveries (or entries) it touched. Only the operator door reaches `admin.*`, so the
/// actor is the host's admin listener; the host's log line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorAction {
    /// The method without its `admin.` prefix: `destination.retry`, `delivery.retry`,
    /// `destination.pause`, `destination.resume`, `quarantine.drop`, `quarantine.requeue`.
    pub action: &'static str,
    /// What it acted on: a destination relay, a delivery (`{from}.{message_id}`), or a
    /// quarantined entry's id.
    pub subject: String,
    /// How many deliveries (or entries) it changed; 0 when it changed nothing.
    pub touched: u64,
}
