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
//! This module is the one definition of what is verified and remembered (which requests
//! are seen ahead is `transport::ahead`'s), and
//! [`Memory`] the one memory both hosts keep it in.

use super::certificate::DeviceCertificate;
use super::envelope::MessageEnvelope;
use super::json::{Object, Value};
use super::signature::{verify_own, SignedObject, DOMAIN};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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

/// Session tokens whose device key is known, at most; when full, the memory starts over.
pub const MAX_KEYS: usize = 65_536;
/// Verified signatures waiting for the core, at most; when full, the memory starts over.
pub const MAX_VALID: usize = 16_384;

/// The two memories of pre-verification, shared by the host threads that verify ahead and
/// the core's thread (both hosts use this one: the wasmtime host's workers and the Node
/// addon's registry): the session tokens' device keys, learned from the core's own
/// verifications, and the successes waiting for the core.
#[derive(Default)]
pub struct Memory {
    keys: Mutex<HashMap<String, [u8; 32]>>,
    valid: Mutex<HashSet<[u8; 32]>>,
    /// Core-thread verifications answered from the memory (tests and measurements).
    pub hits: AtomicU64,
}

impl Memory {
    /// A verification on the core's thread, answered from the memory if these exact bytes verified (once).
    pub fn take(&self, key: &[u8], msg: &[u8], sig: &[u8]) -> bool {
        // Nothing waiting (a session's first send, or pre-verification idle): no hash to compute.
        if !is_envelope_input(msg) || self.waiting() == 0 {
            return false;
        }
        let d = digest(key, sig, msg);
        let hit = self.valid.lock().is_ok_and(|mut v| v.remove(&d));
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// What the core's thread saw: the envelope of `token`'s message.send verified under `key`.
    pub fn learn(&self, token: &str, key: &[u8], msg: &[u8]) {
        let Ok(key) = <[u8; 32]>::try_from(key) else {
            return;
        };
        if !is_envelope_input(msg) {
            return;
        }
        if let Ok(mut k) = self.keys.lock() {
            if k.get(token) == Some(&key) {
                return;
            }
            if k.len() >= MAX_KEYS {
                k.clear();
            }
            k.insert(token.to_string(), key);
        }
    }

    /// On a host thread: verifies a message.send envelope under the session's known key, if any.
    pub fn send(&self, token: &str, params: &Object) {
        let Some(key) = self.keys.lock().ok().and_then(|k| k.get(token).copied()) else {
            return;
        };
        if let Some(d) = send(&key, params) {
            self.remember(d);
        }
    }

    /// On a host thread: verifies a message.deliver envelope under its device certificate's key.
    pub fn deliver(&self, params: &Object) {
        if let Some(d) = deliver(params) {
            self.remember(d);
        }
    }

    fn remember(&self, d: [u8; 32]) {
        if let Ok(mut v) = self.valid.lock() {
            if v.len() >= MAX_VALID {
                v.clear();
            }
            v.insert(d);
        }
    }

    /// Verified signatures not yet asked for (for tests of the bound).
    pub fn waiting(&self) -> usize {
        self.valid.lock().map_or(0, |v| v.len())
    }

    /// Sessions whose key is known (for tests of the bound).
    pub fn sessions(&self) -> usize {
        self.keys.lock().map_or(0, |k| k.len())
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

#[cfg(test)]
mod memory_tests {
    use super::*;

    const INPUT: &[u8] = b"relay-v1:message_envelope\n{\"a\":1}";

    #[test]
    fn a_remembered_success_answers_once_and_only_for_its_exact_bytes() {
        let p = Memory::default();
        let (key, sig) = ([1u8; 32], [2u8; 64]);
        p.remember(digest(&key, &sig, INPUT));
        assert!(
            !p.take(&key, b"relay-v1:message_envelope\n{\"a\":2}", &sig),
            "other bytes"
        );
        assert!(!p.take(&[3u8; 32], INPUT, &sig), "another key");
        let mut other = sig;
        other[0] ^= 1;
        assert!(!p.take(&key, INPUT, &other), "another signature");
        assert!(p.take(&key, INPUT, &sig));
        assert!(!p.take(&key, INPUT, &sig), "used once");
        assert_eq!(p.hits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn only_envelope_inputs_are_learned_or_answered() {
        let p = Memory::default();
        let (key, sig) = ([1u8; 32], [2u8; 64]);
        let cert = b"relay-v1:device_certificate\n{}";
        p.learn("t", &key, cert);
        assert_eq!(p.sessions(), 0);
        p.remember(digest(&key, &sig, cert));
        assert!(!p.take(&key, cert, &sig));
        p.learn("t", &key, INPUT);
        assert_eq!(p.sessions(), 1);
    }

    #[test]
    fn both_memories_stay_bounded() {
        let p = Memory::default();
        for i in 0..(MAX_KEYS + 10) {
            p.learn(&i.to_string(), &[1u8; 32], INPUT);
            assert!(p.sessions() <= MAX_KEYS);
        }
        for i in 0..(MAX_VALID + 10) as u32 {
            let mut d = [0u8; 32];
            d[..4].copy_from_slice(&i.to_le_bytes());
            p.remember(d);
            assert!(p.waiting() <= MAX_VALID);
        }
    }
}
