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

use std::cell::RefCell;
use std::collections::HashSet;

/// Entries per generation (32 bytes each: two generations hold at most 256 KiB).
pub const GENERATION: usize = 4096;

type Key = [u8; 32];

#[derive(Default)]
struct Memory {
    young: HashSet<Key>,
    old: HashSet<Key>,
}

thread_local! {
    // Per thread (one in wasm): no lock, and nothing shared between engines but pure results.
    static MEMORY: RefCell<Memory> = RefCell::new(Memory::default());
}

/// The cache key of a verification.
pub fn key(public_key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Key {
    let mut input = Vec::with_capacity(32 + 64 + 8 + msg.len());
    input.extend_from_slice(public_key);
    input.extend_from_slice(sig);
    input.extend_from_slice(&(msg.len() as u64).to_be_bytes());
    input.extend_from_slice(msg);
    super::digest::sha256(&input)
}

/// Whether this verification succeeded before (and is still remembered).
pub fn contains(k: &Key) -> bool {
    MEMORY.with(|m| {
        let mut m = m.borrow_mut();
        if m.young.contains(k) {
            return true;
        }
        if m.old.remove(k) {
            insert_into(&mut m, *k);
            return true;
        }
        false
    })
}

/// Remembers a successful verification.
pub fn insert(k: Key) {
    MEMORY.with(|m| insert_into(&mut m.borrow_mut(), k));
}

fn insert_into(m: &mut Memory, k: Key) {
    if m.young.len() >= GENERATION {
        m.old = std::mem::take(&mut m.young);
    }
    m.young.insert(k);
}

/// Entries held now (for tests of the bound).
pub fn len() -> usize {
    MEMORY.with(|m| {
        let m = m.borrow();
        m.young.len() + m.old.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let hot = key(&[1; 32], b"hot", &[1; 64]);
        insert(hot);
        for i in 0..(3 * GENERATION as u64) {
            insert(key(&[0; 32], &i.to_be_bytes(), &[0; 64]));
            if i % 1000 == 0 {
                assert!(contains(&hot));
            }
        }
        assert!(len() <= 2 * GENERATION);
        assert!(contains(&hot));
        assert!(!contains(&key(&[1; 32], b"cold", &[1; 64])));
    }
}
