//! SHA-256: by the host where it offers to (natively, with the CPU's SHA instructions), else by the core.
//!
//! Inside wasm, SHA-256 runs in software and was the hottest function of a
//! send (the params hash, the deliver body's hash, the keys of the memory of
//! verified signatures). An engine may be given a native one (`Crypto`); it computes the
//! same function, and anything it declines or gets wrong in shape falls back
//! to the core's own. Short inputs never cross: the crossing costs more than
//! a few blocks.

use sha2::{Digest, Sha256};

/// A host's SHA-256: `None` when it declines.
pub type Hasher = fn(&[u8]) -> Option<[u8; 32]>;

/// Inputs shorter than this are hashed by the core itself.
pub const HOST_MIN_LEN: usize = 256;

/// SHA-256 of `data`, by the core itself (an engine's hashing, which may use the host's, is
/// [`super::crypto::Crypto::sha256`]).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The core's own SHA-256 (the sha2 crate), never the host's: what a host's native one must equal.
pub fn sha256_own(data: &[u8]) -> [u8; 32] {
    sha256(data)
}
