//! Relay RPC authentication (protocol.md §6): making and checking `Relay-Signature`.
//!
//! The source signs, by the signing rule, the object
//! `{type: "relay_request", network, method, relay, to, ts, nonce, body_sha256, route_revision?}`.
//! Both sides live here so that every host makes and checks the same bytes.
//!
//! Rules decided here, a test each:
//! - `message.deliver` carries `Relay-Route-Revision` (the recipient's route revision the
//!   attempt targets, decimal), signed as the integer `route_revision`; one without it, or
//!   with a value that is not a canonical decimal of at most 2^53 - 1, is `invalid_params`,
//!   judged after the cheap checks of the other headers (`to`, `method` and `ts` come
//!   before anything else, §6) and before any key is fetched or signature verified.
//! - No other method carries it: the header on any other method is `invalid_params`, so a
//!   request never holds an unsigned value a reader could mistake for a signed one.
//! - A revision changed in transit fails the signature (`unauthenticated`), as any other
//!   signed member does.

use super::base64url;
use super::crypto::Crypto;
use super::field::Fields;
use super::identity::RelayId;
use super::json::{Object, Value};
use super::signature::{signing_input, verify_strict};
use crate::{Error, ErrorCode};
use ed25519_dalek::{Signer, SigningKey};

/// The headers of a relay request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayHeaders {
    /// `Relay-Id`: the source relay.
    pub relay_id: String,
    /// `Relay-Timestamp`: decimal milliseconds.
    pub timestamp: String,
    /// `Relay-Nonce`: base64url of 16 bytes.
    pub nonce: String,
    /// `Relay-Signature`: base64url of 64 bytes.
    pub signature: String,
    /// `Relay-Route-Revision`: decimal, on `message.deliver` only (protocol.md §6).
    pub route_revision: Option<String>,
}

impl RelayHeaders {
    /// As `(name, value)` pairs, for a host's HTTP client.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut v = vec![
            ("Relay-Id", self.relay_id.as_str()),
            ("Relay-Timestamp", self.timestamp.as_str()),
            ("Relay-Nonce", self.nonce.as_str()),
            ("Relay-Signature", self.signature.as_str()),
        ];
        if let Some(r) = &self.route_revision {
            v.push(("Relay-Route-Revision", r.as_str()));
        }
        v
    }
}

/// The method whose requests carry `Relay-Route-Revision`, and only it.
pub const ROUTED_METHOD: &str = "message.deliver";

/// The largest revision the header may carry (an I-JSON integer).
const MAX_REVISION: u64 = (1 << 53) - 1;

/// The object a relay request signature covers.
#[allow(clippy::too_many_arguments)]
pub fn signed_object(
    network: &str,
    method: &str,
    relay: &str,
    to: &str,
    ts: u64,
    nonce: &str,
    body_sha256: &[u8; 32],
    route_revision: Option<u64>,
) -> Object {
    let mut o = Object::new();
    o.insert("type", "relay_request");
    o.insert("network", network);
    o.insert("method", method);
    o.insert("relay", relay);
    o.insert("to", to);
    o.insert("ts", ts);
    o.insert("nonce", nonce);
    o.insert("body_sha256", base64url::encode(body_sha256));
    if let Some(r) = route_revision {
        o.insert("route_revision", r);
    }
    o
}

/// Signs a request from `relay` (whose key seed is `seed`) to `to`; `route_revision` is the
/// recipient's route revision a `message.deliver` targets (none for other methods).
#[allow(clippy::too_many_arguments)]
pub fn sign(
    seed: &[u8; 32],
    network: &str,
    method: &str,
    relay: &RelayId,
    to: &RelayId,
    ts: u64,
    nonce: &[u8; 16],
    body: &[u8],
    route_revision: Option<u64>,
) -> RelayHeaders {
    sign_with(
        &SigningKey::from_bytes(seed),
        network,
        method,
        relay,
        to,
        ts,
        nonce,
        &super::digest::sha256(body),
        route_revision,
    )
}

/// [`sign`] with a key already expanded and the body's SHA-256 already computed (a relay signs every outbound request with it).
#[allow(clippy::too_many_arguments)]
pub fn sign_with(
    key: &SigningKey,
    network: &str,
    method: &str,
    relay: &RelayId,
    to: &RelayId,
    ts: u64,
    nonce: &[u8; 16],
    body_sha256: &[u8; 32],
    route_revision: Option<u64>,
) -> RelayHeaders {
    let nonce = base64url::encode(nonce);
    let o = signed_object(
        network,
        method,
        relay.as_str(),
        to.as_str(),
        ts,
        &nonce,
        body_sha256,
        route_revision,
    );
    let sig = key.sign(&signing_input("relay_request", &o));
    RelayHeaders {
        relay_id: relay.as_str().to_string(),
        timestamp: ts.to_string(),
        nonce,
        signature: base64url::encode(&sig.to_bytes()),
        route_revision: route_revision.map(|r| r.to_string()),
    }
}

/// The public key of a relay key seed (published in `/.well-known/relay`).
pub fn public_key(seed: &[u8; 32]) -> [u8; 32] {
    SigningKey::from_bytes(seed).verifying_key().to_bytes()
}

/// A request whose cheap checks passed; its signature still awaits the source's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prechecked {
    /// The claimed source relay (`Relay-Id`), whose key the signature must verify under.
    pub source: RelayId,
    /// `Relay-Timestamp`, Unix ms, already within the clock tolerance of now.
    pub ts: u64,
    /// `Relay-Nonce` as sent (base64url of 16 bytes), to be consumed once the signature verifies.
    pub nonce: String,
    /// `Relay-Route-Revision` of a `message.deliver` (signed): the recipient's route revision
    /// the attempt targets.
    pub route_revision: Option<u64>,
    sig: [u8; 64],
    input: Vec<u8>,
}

/// A canonical decimal (no sign, no leading zero) of at most [`MAX_REVISION`].
fn decimal(text: &str) -> Option<u64> {
    let ok = !text.is_empty()
        && text.len() <= 16
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    let v: u64 = text.parse().ok().filter(|_| ok)?;
    (v <= MAX_REVISION).then_some(v)
}

/// `Relay-Route-Revision` as `method` needs it: required on `message.deliver`, refused on
/// every other method.
fn route_revision(headers: &RelayHeaders, method: &str) -> Result<Option<u64>, Error> {
    match (&headers.route_revision, method == ROUTED_METHOD) {
        (None, false) => Ok(None),
        (Some(_), false) => Err(Error::new(
            ErrorCode::InvalidParams,
            format!("Relay-Route-Revision is sent with {ROUTED_METHOD} only"),
        )),
        (None, true) => Err(Error::new(
            ErrorCode::InvalidParams,
            "message.deliver needs Relay-Route-Revision: the recipient's route revision it targets",
        )),
        (Some(text), true) => decimal(text).map(Some).ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidParams,
                "Relay-Route-Revision must be a decimal integer of at most 2^53 - 1",
            )
        }),
    }
}

fn unauthenticated(why: &str) -> Error {
    Error::new(
        ErrorCode::Unauthenticated,
        format!("relay authentication: {why}"),
    )
}

/// Checks the headers, `method` and `ts` before anything else (no key needed yet).
pub fn precheck(
    headers: &RelayHeaders,
    network: &str,
    me: &RelayId,
    method: &str,
    body: &[u8],
    now: u64,
    tolerance: u64,
) -> Result<Prechecked, Error> {
    precheck_with(headers, network, me, method, body, now, tolerance, |b| {
        super::digest::sha256(b)
    })
}

/// [`precheck`], hashing the body with `sha256` (an engine's, which may be the host's) only
/// once the cheap checks passed.
#[allow(clippy::too_many_arguments)]
pub fn precheck_with(
    headers: &RelayHeaders,
    network: &str,
    me: &RelayId,
    method: &str,
    body: &[u8],
    now: u64,
    tolerance: u64,
    sha256: impl FnOnce(&[u8]) -> [u8; 32],
) -> Result<Prechecked, Error> {
    let source = RelayId::parse(&headers.relay_id)
        .map_err(|e| unauthenticated(&format!("Relay-Id: {e}")))?;
    if !source.allowed_on(network) {
        return Err(unauthenticated("Relay-Id must be https on this network"));
    }
    let ts_ok = !headers.timestamp.is_empty()
        && headers.timestamp.len() <= 16
        && headers.timestamp.bytes().all(|b| b.is_ascii_digit())
        && (headers.timestamp == "0" || !headers.timestamp.starts_with('0'));
    let ts: u64 = if ts_ok {
        headers.timestamp.parse().unwrap_or(u64::MAX)
    } else {
        u64::MAX
    };
    if ts == u64::MAX {
        return Err(unauthenticated(
            "Relay-Timestamp must be decimal milliseconds",
        ));
    }
    if ts > now.saturating_add(tolerance) || ts.saturating_add(tolerance) < now {
        return Err(unauthenticated(
            "Relay-Timestamp is outside the clock tolerance",
        ));
    }
    if base64url::decode_array::<16>(&headers.nonce).is_none() {
        return Err(unauthenticated("Relay-Nonce must be base64url of 16 bytes"));
    }
    let sig = base64url::decode_array::<64>(&headers.signature)
        .ok_or_else(|| unauthenticated("Relay-Signature must be base64url of 64 bytes"))?;
    let route_revision = route_revision(headers, method)?;
    let o = signed_object(
        network,
        method,
        source.as_str(),
        me.as_str(),
        ts,
        &headers.nonce,
        &sha256(body),
        route_revision,
    );
    Ok(Prechecked {
        source,
        ts,
        nonce: headers.nonce.clone(),
        route_revision,
        sig,
        input: signing_input("relay_request", &o),
    })
}

impl Prechecked {
    /// Verifies the signature under the source's published key (by the core itself).
    pub fn verify(&self, source_key: &[u8; 32]) -> Result<(), Error> {
        verify_strict(source_key, &self.input, &self.sig)
            .map_err(|_| unauthenticated("bad signature"))
    }

    /// [`Prechecked::verify`] with an engine's crypto (no memory: a nonce is used once).
    pub fn verify_in(&self, source_key: &[u8; 32], crypto: &mut Crypto) -> Result<(), Error> {
        crypto
            .verify_fresh(source_key, &self.input, &self.sig)
            .map_err(|_| unauthenticated("bad signature"))
    }
}

/// Parses a `/.well-known/relay` document: `{relay, relay_key, network, policies}`; checks it names `relay` on `network`.
pub fn parse_well_known(body: &[u8], relay: &RelayId, network: &str) -> Result<[u8; 32], Error> {
    let o = super::json::parse_object(body)?;
    let f = Fields::new(&o);
    if f.str("relay")? != relay.as_str() || f.str("network")? != network {
        return Err(unauthenticated(
            "the peer's /.well-known/relay names another relay or network",
        ));
    }
    Ok(f.fixed::<32>("relay_key")?)
}

/// Builds this relay's `/.well-known/relay` document.
pub fn well_known(relay: &RelayId, network: &str, key: &[u8; 32], policies: Value) -> Value {
    let mut o = Object::new();
    o.insert("relay", relay.as_str());
    o.insert("relay_key", base64url::encode(key));
    o.insert("network", network);
    o.insert("policies", policies);
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET: &str = "dev";
    const NOW: u64 = 1_700_000_000_000;
    const SEED: [u8; 32] = [3; 32];

    fn ids() -> (RelayId, RelayId) {
        (
            RelayId::parse("http://a.test").unwrap(),
            RelayId::parse("http://b.test").unwrap(),
        )
    }

    fn signed(method: &str, revision: Option<u64>) -> RelayHeaders {
        let (a, b) = ids();
        sign(&SEED, NET, method, &a, &b, NOW, &[1; 16], b"{}", revision)
    }

    fn check(h: &RelayHeaders, method: &str) -> Result<Prechecked, Error> {
        let (_, b) = ids();
        let p = precheck(h, NET, &b, method, b"{}", NOW, 300_000)?;
        p.verify(&public_key(&SEED))?;
        Ok(p)
    }

    #[test]
    fn a_deliver_carries_its_route_revision_signed() {
        let h = signed(ROUTED_METHOD, Some(7));
        assert_eq!(h.route_revision.as_deref(), Some("7"));
        assert!(h.pairs().contains(&("Relay-Route-Revision", "7")));
        assert_eq!(check(&h, ROUTED_METHOD).unwrap().route_revision, Some(7));
    }

    #[test]
    fn a_deliver_without_a_well_formed_route_revision_is_invalid_params() {
        for bad in [
            None,
            Some(""),
            Some("07"),
            Some("-1"),
            Some("1.0"),
            Some("9007199254740992"),
        ] {
            let mut h = signed(ROUTED_METHOD, Some(7));
            h.route_revision = bad.map(str::to_string);
            let e = check(&h, ROUTED_METHOD).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParams, "{bad:?}");
        }
    }

    #[test]
    fn no_other_method_carries_a_route_revision() {
        let h = signed("route.get", None);
        assert!(!h.pairs().iter().any(|(k, _)| *k == "Relay-Route-Revision"));
        assert_eq!(check(&h, "route.get").unwrap().route_revision, None);
        let mut h = h;
        h.route_revision = Some("1".into());
        assert_eq!(
            check(&h, "route.get").unwrap_err().code,
            ErrorCode::InvalidParams
        );
    }

    #[test]
    fn a_route_revision_changed_in_transit_fails_the_signature() {
        let mut h = signed(ROUTED_METHOD, Some(1));
        h.route_revision = Some("3".into());
        assert_eq!(
            check(&h, ROUTED_METHOD).unwrap_err().code,
            ErrorCode::Unauthenticated
        );
    }
}
