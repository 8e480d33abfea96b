//! SHA-256: by the host where it offers to (natively, with the CPU's SHA instructions), else by the core.
//!
//! Inside wasm, SHA-256 runs in software and was the hottest function of a
//! send (the params hash, the deliver body's hash, the keys of the memory of
//! verified signatures). A host may install a native one; it computes the
//! same function, and anything it declines or gets wrong in shape falls back
//! to the core's own. Short inputs never cross: the crossing costs more than
//! a few blocks.

use sha2::{Digest, Sha256};
use std::cell::Cell;

/// A host's SHA-256: `None` when it declines.
pub type Hasher = fn(&[u8]) -> Option<[u8; 32]>;

/// Inputs shorter than this are hashed by the core itself.
pub const HOST_MIN_LEN: usize = 256;

thread_local! {
    static HASHER: Cell<Option<Hasher>> = const { Cell::new(None) };
}

/// Installs (or, with `None`, removes) the host's SHA-256 for this thread.
pub fn set_hasher(h: Option<Hasher>) {
    HASHER.with(|c| c.set(h));
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    if data.len() >= HOST_MIN_LEN {
        if let Some(d) = HASHER.with(|c| c.get()).and_then(|h| h(data)) {
            return d;
        }
    }
    sha256_own(data)
}

/// The core's own SHA-256 (the sha2 crate), never the host's.
pub fn sha256_own(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}
