//! Envelope signatures verified ahead of the core, by a host thread that holds the request.
//!
//! The strict verification of an envelope is a large share of the core's work
//! per message, and the core runs on one thread. A host thread that has the
//! request (an HTTP worker of the wasmtime host, the main thread of a Node
//! relay thread) can verify it in parallel when it knows the key: the device
//! key the core verified the session's previous envelope with (message.send),
//! or the key of the device certificate the request carries (message.deliver).
//!
//! A success is remembered by [`digest`] over (key, signature, signed bytes).
//! When the core then asks its host to verify exactly those bytes under that
//! key, the host answers from that memory, once. Only `verify_own` successes on
//! those exact bytes are remembered, and the core still picks the key from its
//! own records, so the verdict is the one it would compute: what the host
//! thread guessed only decides whether work is skipped, never what is accepted.
//! The memories are the hosts'; this module is the one definition of what is
//! verified and remembered.

use super::certificate::DeviceCertificate;
use super::envelope::MessageEnvelope;
use super::json::{Object, Value};
use super::signature::{verify_own, SignedObject, DOMAIN};
use sha2::{Digest, Sha256};

/// Whether `msg` is the signing input of a message envelope (protocol.md §1 signing rule).
pub fn is_envelope_input(msg: &[u8]) -> bool {
    msg.strip_prefix(DOMAIN.as_bytes())
        .and_then(|r| r.strip_prefix(MessageEnvelope::TYPE.as_bytes()))
        .is_some_and(|r| r.first() == Some(&b'\n'))
}

/// What a success is remembered by: SHA-256 over (key, signature, signed bytes).
pub fn digest(key: &[u8], sig: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key);
    h.update(sig);
    h.update(msg);
    h.finalize().into()
}

/// The digest of a message.send envelope that verifies under a session's known device key.
pub fn send(key: &[u8; 32], params: &Object) -> Option<[u8; 32]> {
    verified(key, &envelope(params)?)
}

/// The digest of a message.deliver envelope that verifies under its device certificate's key.
pub fn deliver(params: &Object) -> Option<[u8; 32]> {
    let cert = match params.get("device_certificate") {
        Some(Value::Object(o)) => DeviceCertificate::parse(o.clone()).ok()?,
        _ => return None,
    };
    verified(&cert.device_key, &envelope(params)?)
}

fn verified(key: &[u8; 32], env: &MessageEnvelope) -> Option<[u8; 32]> {
    let input = env.signing_input();
    verify_own(key, &input, env.sig()).ok()?;
    Some(digest(key, env.sig(), &input))
}

fn envelope(params: &Object) -> Option<MessageEnvelope> {
    match params.get("envelope") {
        Some(Value::Object(o)) => MessageEnvelope::parse(o.clone()).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_envelope_signing_inputs_count() {
        assert!(is_envelope_input(b"relay-v1:message_envelope\n{\"a\":1}"));
        assert!(!is_envelope_input(b"relay-v1:message_envelopes\n{}"));
        assert!(!is_envelope_input(b"relay-v1:device_certificate\n{}"));
        assert!(!is_envelope_input(b"relay-v1:message_envelope"));
    }

    #[test]
    fn the_digest_covers_key_signature_and_bytes() {
        let d = digest(&[1; 32], &[2; 64], b"m");
        assert_ne!(d, digest(&[3; 32], &[2; 64], b"m"));
        assert_ne!(d, digest(&[1; 32], &[4; 64], b"m"));
        assert_ne!(d, digest(&[1; 32], &[2; 64], b"n"));
        assert_eq!(d, digest(&[1; 32], &[2; 64], b"m"));
    }

    #[cfg(feature = "client")]
    #[test]
    fn send_and_deliver_remember_only_envelopes_that_verify_under_the_key() {
        use crate::client::keys::Signer;
        use crate::client::{draft, DeviceKey};
        let mut body = Object::new();
        body.insert("ct", "Zm9v");
        let (alice, _, phone, env) = draft::signed_test_envelope(body, 1);
        let other = DeviceKey::from_seeds([5; 32], [6; 32]);
        let cert = |device: &DeviceKey| {
            draft::certificate("dev", &alice, device, &["send"], 1).sign(&alice)
        };
        let params = |env: &Object, cert: &Object| {
            let mut p = Object::new();
            p.insert("envelope", Value::Object(env.clone()));
            p.insert("device_certificate", Value::Object(cert.clone()));
            p
        };
        let parsed = MessageEnvelope::parse(env.clone()).expect("envelope");
        let want = digest(&phone.public_key(), parsed.sig(), &parsed.signing_input());
        let good = params(&env, &cert(&phone));
        assert_eq!(send(&phone.public_key(), &good), Some(want));
        assert_eq!(deliver(&good), Some(want));
        assert_eq!(send(&other.public_key(), &good), None, "another key");
        assert_eq!(
            deliver(&params(&env, &cert(&other))),
            None,
            "another device's certificate"
        );
        let mut forged = env.clone();
        forged.insert("created_at", 2u64);
        assert_eq!(
            send(&phone.public_key(), &params(&forged, &cert(&phone))),
            None,
            "changed after signing"
        );
        assert_eq!(
            send(&phone.public_key(), &Object::new()),
            None,
            "no envelope"
        );
        assert!(is_envelope_input(&parsed.signing_input()));
    }
}
