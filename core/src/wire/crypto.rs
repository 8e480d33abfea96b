//! The engine's cryptography: SHA-256 and strict Ed25519 verification, by the host's native
//! functions where it offers them, else by the core, and the memories that spare repeated work.
//!
//! One [`Crypto`] belongs to one engine, so two engines on one thread share nothing. The
//! host's functions must compute exactly what the core would (the vectors test both paths);
//! anything they decline falls back to the core's own. Remembering changes no verdict:
//! verification and key decoding are pure functions of their inputs.

use super::digest::{self, Hasher, HOST_MIN_LEN};
use super::signature::{verify_decoded, SignatureError, Verifier};
use super::verified;
use ed25519_dalek::VerifyingKey;
use std::collections::HashMap;

/// Decoded keys held at most (about 200 bytes each); when full, the memory starts over.
pub const DECODED_KEYS: usize = 1024;

/// An engine's cryptography and its memories.
#[derive(Debug, Default)]
pub struct Crypto {
    verifier: Option<Verifier>,
    hasher: Option<Hasher>,
    /// Verifications that succeeded.
    verified: verified::Memory,
    /// A sender's device key signs every message it sends: decoding it (a square root in
    /// the field) is about 7% of a verification in wasm, so it is done once per key.
    decoded: HashMap<[u8; 32], VerifyingKey>,
}

impl Crypto {
    /// The core's own functions only.
    pub fn new() -> Crypto {
        Crypto::default()
    }

    /// With the host's native verifier and SHA-256 (either may be absent).
    pub fn with_host(verifier: Option<Verifier>, hasher: Option<Hasher>) -> Crypto {
        Crypto {
            verifier,
            hasher,
            ..Crypto::default()
        }
    }

    /// SHA-256 of `data`: the host's for inputs of [`HOST_MIN_LEN`] bytes or more (the
    /// crossing costs more than a few blocks), else the core's.
    pub fn sha256(&self, data: &[u8]) -> [u8; 32] {
        if data.len() >= HOST_MIN_LEN {
            if let Some(d) = self.hasher.and_then(|h| h(data)) {
                return d;
            }
        }
        digest::sha256(data)
    }

    /// Strict Ed25519 verification of `sig` over `msg` under `key`; a success seen before is
    /// answered from memory.
    pub fn verify(
        &mut self,
        key: &[u8; 32],
        msg: &[u8],
        sig: &[u8; 64],
    ) -> Result<(), SignatureError> {
        let k = self.sha256(&verified::key_input(key, msg, sig));
        if self.verified.contains(&k) {
            return Ok(());
        }
        let verdict = self.verify_fresh(key, msg, sig);
        if verdict.is_ok() {
            self.verified.insert(k);
        }
        verdict
    }

    /// Strict verification without the memory of successes: the host's verifier if it has
    /// one and decides, else the core's own. (An envelope is verified once: remembering it
    /// would only evict what is used again.)
    pub fn verify_fresh(
        &mut self,
        key: &[u8; 32],
        msg: &[u8],
        sig: &[u8; 64],
    ) -> Result<(), SignatureError> {
        if let Some(v) = self.verifier.and_then(|host| host(key, msg, sig)) {
            return v;
        }
        let vk = self.decoded(key)?;
        verify_decoded(&vk, msg, sig)
    }

    /// `key` decoded, from the memory of decoded keys when it is there; invalid keys are not kept.
    fn decoded(&mut self, key: &[u8; 32]) -> Result<VerifyingKey, SignatureError> {
        if let Some(vk) = self.decoded.get(key) {
            return Ok(*vk);
        }
        let vk = VerifyingKey::from_bytes(key).map_err(|_| SignatureError::InvalidKey)?;
        if self.decoded.len() >= DECODED_KEYS {
            self.decoded.clear();
        }
        self.decoded.insert(*key, vk);
        Ok(vk)
    }

    /// Successful verifications remembered now (tests of the bound).
    pub fn remembered(&self) -> usize {
        self.verified.len()
    }

    /// Keys in the memory of decoded keys (tests of the bound).
    pub fn decoded_keys(&self) -> usize {
        self.decoded.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    #[test]
    fn decoded_keys_stay_bounded_and_invalid_keys_are_never_kept() {
        let mut c = Crypto::new();
        let msg = b"relay-v1:test\n{}";
        for i in 0..(DECODED_KEYS + 10) as u32 {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            let sk = SigningKey::from_bytes(&seed);
            let key = sk.verifying_key().to_bytes();
            let sig = sk.sign(msg).to_bytes();
            assert_eq!(c.verify_fresh(&key, msg, &sig), Ok(()));
            let mut bad = sig;
            bad[0] ^= 1;
            // A remembered key still checks every signature.
            assert_eq!(
                c.verify_fresh(&key, msg, &bad),
                Err(SignatureError::Mismatch)
            );
            assert!(c.decoded_keys() <= DECODED_KEYS);
        }
        let invalid = (2u8..=255)
            .map(|y| {
                let mut k = [0u8; 32];
                k[0] = y;
                k
            })
            .find(|k| VerifyingKey::from_bytes(k).is_err())
            .expect("some small y is not on the curve");
        let before = c.decoded_keys();
        for _ in 0..2 {
            assert_eq!(
                c.verify(&invalid, msg, &[0u8; 64]),
                Err(SignatureError::InvalidKey)
            );
        }
        assert_eq!(c.decoded_keys(), before, "an invalid key is not remembered");
    }

    #[test]
    fn successes_are_remembered_and_failures_never() {
        let mut c = Crypto::new();
        let sk = SigningKey::from_bytes(&[3; 32]);
        let key = sk.verifying_key().to_bytes();
        let sig = sk.sign(b"m").to_bytes();
        assert_eq!(c.verify(&key, b"m", &sig), Ok(()));
        assert_eq!(c.remembered(), 1);
        assert!(c.verify(&key, b"n", &sig).is_err());
        assert_eq!(c.remembered(), 1);
    }

    #[test]
    fn two_engines_crypto_share_nothing() {
        fn refuse(_: &[u8; 32], _: &[u8], _: &[u8; 64]) -> Option<Result<(), SignatureError>> {
            Some(Err(SignatureError::Mismatch))
        }
        let sk = SigningKey::from_bytes(&[4; 32]);
        let key = sk.verifying_key().to_bytes();
        let sig = sk.sign(b"m").to_bytes();
        let mut own = Crypto::new();
        let mut hosted = Crypto::with_host(Some(refuse), None);
        assert_eq!(own.verify(&key, b"m", &sig), Ok(()));
        // The other's host verifier decides for it alone, and the first's memory is not its.
        assert_eq!(
            hosted.verify(&key, b"m", &sig),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(own.verify(&key, b"m", &sig), Ok(()));
    }
}
