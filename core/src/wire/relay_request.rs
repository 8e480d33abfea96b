//! Relay RPC authentication (protocol.md §6): making and checking `Relay-Signature`.
//!
//! The source signs, by the signing rule, the object
//! `{type: "relay_request", network, method, relay, to, ts, nonce, body_sha256}`.
//! Both sides live here so that every host makes and checks the same bytes.

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
}

impl RelayHeaders {
    /// As `(name, value)` pairs, for a host's HTTP client.
    pub fn pairs(&self) -> [(&'static str, &str); 4] {
        [
            ("Relay-Id", &self.relay_id),
            ("Relay-Timestamp", &self.timestamp),
            ("Relay-Nonce", &self.nonce),
            ("Relay-Signature", &self.signature),
        ]
    }
}

/// The object a relay request signature covers.
pub fn signed_object(
    network: &str,
    method: &str,
    relay: &str,
    to: &str,
    ts: u64,
    nonce: &str,
    body_sha256: &[u8; 32],
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
    o
}

/// Signs a request from `relay` (whose key seed is `seed`) to `to`.
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
    );
    let sig = key.sign(&signing_input("relay_request", &o));
    RelayHeaders {
        relay_id: relay.as_str().to_string(),
        timestamp: ts.to_string(),
        nonce,
        signature: base64url::encode(&sig.to_bytes()),
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
    sig: [u8; 64],
    input: Vec<u8>,
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
    let o = signed_object(
        network,
        method,
        source.as_str(),
        me.as_str(),
        ts,
        &headers.nonce,
        &sha256(body),
    );
    Ok(Prechecked {
        source,
        ts,
        nonce: headers.nonce.clone(),
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
