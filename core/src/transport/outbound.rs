//! Requests to other relays: built and signed by the core, carried by the host, and what
//! the host saw classified here, the same way on every host.

use crate::engine::{Outcome, PeerMethod};
use crate::wire::identity::RelayId;
use crate::wire::relay_request::{self, RelayHeaders};
use ed25519_dalek::SigningKey;

/// A relay request ready to go: the host POSTs `body` to `url` with `headers` exactly,
/// follows no redirect, gives up after `timeout_ms`, and reports what it saw with
/// `Relay::fetched`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRequest {
    /// The delivery task this attempt belongs to.
    pub task: String,
    /// The attempt's number within the task.
    pub attempt: u32,
    /// The relay it goes to.
    pub target: String,
    /// `{target}/relay/v1/{method}`.
    pub url: String,
    /// `content-type`, the four relay authentication headers and, for a delivery,
    /// `Relay-Route-Revision` (none for a sibling shard).
    pub headers: Vec<(&'static str, String)>,
    /// The exact bytes to send.
    pub body: Vec<u8>,
    /// The host gives up after this many ms: two thirds of the engine's attempt timeout,
    /// so its verdict reaches the core before the core's own timer decides.
    pub timeout_ms: u64,
    /// When the target is this relay itself: the sibling shard whose core takes the request
    /// directly (`Relay::sibling` of `url` and `body`), with no network between.
    pub shard: Option<u32>,
}

/// The largest answer a host reads from a peer (a relay request's or a key fetch's): a
/// longer one is cut off and reported as [`Fetch::Unknown`], since the peer may have acted.
pub const MAX_ANSWER: usize = 1 << 20;

/// What a host saw of an HTTP exchange it made for the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// An answer came: its status and body.
    Answered(u16, Vec<u8>),
    /// The request never reached the peer: refused, unresolved, an address the host's
    /// rules refuse, a failed TLS handshake.
    NotSent,
    /// Sent, but no answer: timeout, reset, a lost or unreadable answer.
    Unknown,
}

/// The error body that stands for a redirect: relays never follow one.
const REDIRECT: &[u8] =
    br#"{"error":{"code":"unavailable","message":"the peer answered with a redirect"}}"#;

/// What an exchange means for the delivery it carried.
pub fn classify(fetch: Fetch) -> Outcome {
    match fetch {
        Fetch::Answered(200, body) => Outcome::Result(body),
        Fetch::Answered(s, _) if (300..400).contains(&s) => Outcome::Error(REDIRECT.to_vec()),
        Fetch::Answered(_, body) => Outcome::Error(body),
        Fetch::NotSent => Outcome::NotAttempted,
        Fetch::Unknown => Outcome::Unknown,
    }
}

/// The URL of `method` on `target`.
pub fn url(target: &RelayId, method: PeerMethod) -> String {
    format!("{}/relay/v1/{}", target.as_str(), method.as_str())
}

/// The URL of a relay's published key document.
pub fn well_known_url(relay: &RelayId) -> String {
    format!("{}/.well-known/relay", relay.as_str())
}

/// The headers of a signed request, as sent.
pub fn headers(h: &RelayHeaders) -> Vec<(&'static str, String)> {
    let mut v = vec![("content-type", "application/json".to_string())];
    v.extend(h.pairs().iter().map(|(k, v)| (*k, v.to_string())));
    v
}

/// Signs a request with the relay's key; the nonce is the caller's (drawn from the engine's
/// entropy), `route_revision` the recipient's route revision a delivery targets.
#[allow(clippy::too_many_arguments)]
pub fn sign(
    key: &SigningKey,
    network: &str,
    me: &RelayId,
    target: &RelayId,
    method: PeerMethod,
    body_sha256: &[u8; 32],
    now: u64,
    nonce: &[u8; 16],
    route_revision: Option<u64>,
) -> RelayHeaders {
    relay_request::sign_with(
        key,
        network,
        method.as_str(),
        me,
        target,
        now,
        nonce,
        body_sha256,
        route_revision,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        assert_eq!(
            classify(Fetch::Answered(200, b"{}".to_vec())),
            Outcome::Result(b"{}".to_vec())
        );
        assert_eq!(
            classify(Fetch::Answered(302, Vec::new())),
            Outcome::Error(REDIRECT.to_vec())
        );
        assert_eq!(
            classify(Fetch::Answered(409, b"x".to_vec())),
            Outcome::Error(b"x".to_vec())
        );
        assert_eq!(classify(Fetch::NotSent), Outcome::NotAttempted);
        assert_eq!(classify(Fetch::Unknown), Outcome::Unknown);
    }
}
