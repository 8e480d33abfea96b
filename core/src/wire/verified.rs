//! A bounded memory of signatures that verified, so the same object is never verified twice.
//!
//! A send with local delivery used to verify three signatures (the envelope
//! at send, then the certificate and the envelope again at receive), and
//! every deliver re-verifies the sender's certificate. Verification is a
//! pure function of (key, message, signature), so remembering successes
//! changes no verdict: a hit answers what verification would answer.
//! Entries are keyed by SHA-256 over the three inputs (length-prefixed), so
//! a hit for different inputs needs a SHA-256 collision. Only successes are
//! kept; a failure is recomputed every time. The memory is two generations
//! of at most [`GENERATION`] entries: when the young one fills, the old one
//! is dropped, and a hit in the old one moves back to the young one, so hot
//! entries (a sender's certificate) stay while the total stays bounded.

use std::collections::HashSet;

/// Entries per generation (32 bytes each: two generations hold at most 256 KiB).
pub const GENERATION: usize = 4096;

/// What a verification is remembered by: SHA-256 of [`key_input`].
pub type Key = [u8; 32];

/// The memory: two generations of successes. One per engine (in its [`super::crypto::Crypto`]).
#[derive(Debug, Default)]
pub struct Memory {
    young: HashSet<Key>,
    old: HashSet<Key>,
}

/// The bytes whose SHA-256 keys a verification: key, signature, length of the message, message.
pub fn key_input(public_key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Vec<u8> {
    let mut input = Vec::with_capacity(32 + 64 + 8 + msg.len());
    input.extend_from_slice(public_key);
    input.extend_from_slice(sig);
    input.extend_from_slice(&(msg.len() as u64).to_be_bytes());
    input.extend_from_slice(msg);
    input
}

impl Memory {
    /// Whether this verification succeeded before (and is still remembered).
    pub fn contains(&mut self, k: &Key) -> bool {
        if self.young.contains(k) {
            return true;
        }
        if self.old.remove(k) {
            self.insert(*k);
            return true;
        }
        false
    }

    /// Remembers a successful verification.
    pub fn insert(&mut self, k: Key) {
        if self.young.len() >= GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(k);
    }

    /// Entries held now (for tests of the bound).
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Key {
        super::super::digest::sha256(&key_input(k, msg, sig))
    }

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let mut m = Memory::default();
        let hot = key(&[1; 32], b"hot", &[1; 64]);
        m.insert(hot);
        for i in 0..(3 * GENERATION as u64) {
            m.insert(key(&[0; 32], &i.to_be_bytes(), &[0; 64]));
            if i % 1000 == 0 {
                assert!(m.contains(&hot));
            }
        }
        assert!(m.len() <= 2 * GENERATION);
        assert!(m.contains(&hot));
        assert!(!m.contains(&key(&[1; 32], b"cold", &[1; 64])));
    }
}
