//! Envelope signatures checked on the HTTP workers, before their request reaches the core thread.
//!
//! What is verified and remembered is `relay_core::wire::preverify` (shared with
//! the Node host's relay thread); this module keeps the two memories: session
//! tokens' device keys, learned from the core thread's verifications, and the
//! successes waiting for the core. A miss (a new session, a stale key, a
//! signing input the worker built differently) is verified on the core thread
//! as before.

use relay_core::wire::json::Object;
use relay_core::wire::preverify::{self, digest, is_envelope_input};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Session tokens whose device key is known, at most; when full, the memory starts over.
pub const MAX_KEYS: usize = 65_536;
/// Verified signatures waiting for the core, at most; when full, the memory starts over.
pub const MAX_VALID: usize = 16_384;

/// Signatures verified off the core thread, and the session keys that let workers verify.
#[derive(Default)]
pub struct Preverify {
    keys: Mutex<HashMap<String, [u8; 32]>>,
    valid: Mutex<HashSet<[u8; 32]>>,
    /// Core-thread verifications answered from the memory (tests and measurements).
    pub hits: AtomicU64,
}

impl Preverify {
    /// A verification on the core thread, answered from the memory if these exact bytes verified (once).
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

    /// What the core thread saw: the envelope of `token`'s message.send verified under `key`.
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

    /// On a worker: verifies a message.send envelope under the session's known key, if any.
    pub fn send(&self, token: &str, params: &Object) {
        let Some(key) = self.keys.lock().ok().and_then(|k| k.get(token).copied()) else {
            return;
        };
        if let Some(d) = preverify::send(&key, params) {
            self.remember(d);
        }
    }

    /// On a worker: verifies a message.deliver envelope under its device certificate's key.
    pub fn deliver(&self, params: &Object) {
        if let Some(d) = preverify::deliver(params) {
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

    const INPUT: &[u8] = b"relay-v1:message_envelope\n{\"a\":1}";

    #[test]
    fn a_remembered_success_answers_once_and_only_for_its_exact_bytes() {
        let p = Preverify::default();
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
        let p = Preverify::default();
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
        let p = Preverify::default();
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
