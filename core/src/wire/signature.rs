//! The signing rule of protocol.md §1 and strict Ed25519 verification.
//!
//! A signature covers `"relay-v1:" + type + "\n" + JCS(object without "sig")`,
//! unknown members included. Verification is ed25519-dalek's
//! `verify_strict`: non-canonical S, small-order keys and small-order R are
//! rejected, so a signature has one valid form and keys cannot be weak.

use super::canonical;
use super::field::{FieldError, Fields};
use super::json::Object;
use ed25519_dalek::{Signature, VerifyingKey};
use std::fmt;

/// The domain-separation prefix of every signature.
pub const DOMAIN: &str = "relay-v1:";

/// Why a signature does not verify; `invalid_signature` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureError {
    /// The public key is not a valid point encoding.
    InvalidKey,
    /// The signature is not a strict Ed25519 signature of the input under the key.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::InvalidKey => f.write_str("the signing key is not a valid Ed25519 key"),
            SignatureError::Mismatch => f.write_str("the signature does not verify"),
        }
    }
}

impl std::error::Error for SignatureError {}

impl From<SignatureError> for crate::Error {
    fn from(e: SignatureError) -> crate::Error {
        crate::Error::new(crate::ErrorCode::InvalidSignature, e.to_string())
    }
}

/// The bytes a signature of `object` (of type `type_`) covers.
pub fn signing_input(type_: &str, object: &Object) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(DOMAIN.as_bytes());
    out.extend_from_slice(type_.as_bytes());
    out.push(b'\n');
    canonical::write_object_without(object, "sig", &mut out);
    out
}

/// A verifier outside the core (a host's native one): `None` when it declines, and the core verifies itself.
///
/// It must give ed25519-dalek `verify_strict`'s verdict exactly (the vectors test both paths).
pub type Verifier = fn(&[u8; 32], &[u8], &[u8; 64]) -> Option<Result<(), SignatureError>>;

thread_local! {
    static VERIFIER: std::cell::Cell<Option<Verifier>> = const { std::cell::Cell::new(None) };
}

/// Installs (or, with `None`, removes) the host's verifier for this thread.
pub fn set_verifier(v: Option<Verifier>) {
    VERIFIER.with(|c| c.set(v));
}

/// Strict Ed25519 verification of `sig` over `msg` under `key`.
///
/// A success seen before is answered from [`super::verified`]; otherwise the
/// host's verifier runs if one is installed, else the core's own.
pub fn verify_strict(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
    let k = super::verified::key(key, msg, sig);
    if super::verified::contains(&k) {
        return Ok(());
    }
    let verdict = verify_fresh(key, msg, sig);
    if verdict.is_ok() {
        super::verified::insert(k);
    }
    verdict
}

/// Strict Ed25519 verification without the memory: the host's verifier if installed, else the core's own.
pub fn verify_fresh(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
    VERIFIER
        .with(|c| c.get())
        .and_then(|host| host(key, msg, sig))
        .unwrap_or_else(|| verify_own(key, msg, sig))
}

/// Decoded keys held at most (about 200 bytes each); when full, the memory starts over.
pub const DECODED_KEYS: usize = 1024;

thread_local! {
    // A sender's device key signs every message it sends: decoding it (a square root in
    // the field) is about 7% of a verification in wasm, so it is done once per key.
    static DECODED: std::cell::RefCell<std::collections::HashMap<[u8; 32], VerifyingKey>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// `key` decoded, from the memory of decoded keys when it is there; invalid keys are not kept.
fn decoded(key: &[u8; 32]) -> Result<VerifyingKey, SignatureError> {
    if let Some(vk) = DECODED.with(|d| d.borrow().get(key).copied()) {
        return Ok(vk);
    }
    let vk = VerifyingKey::from_bytes(key).map_err(|_| SignatureError::InvalidKey)?;
    DECODED.with(|d| {
        let mut d = d.borrow_mut();
        if d.len() >= DECODED_KEYS {
            d.clear();
        }
        d.insert(*key, vk);
    });
    Ok(vk)
}

/// The core's own strict verification (ed25519-dalek `verify_strict`), without the host.
///
/// Only the decoding of the key is remembered (a pure function of its bytes); the
/// signature itself is checked on every call.
pub fn verify_own(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
    let vk = decoded(key)?;
    let sig = Signature::from_bytes(sig);
    vk.verify_strict(msg, &sig)
        .map_err(|_| SignatureError::Mismatch)
}

/// [`verify_own`] over slices as a host receives them: `None` when the key is not 32 bytes or
/// the signature not 64 (the core never asks with other shapes, so a host declines them).
pub fn verify_own_slices(key: &[u8], msg: &[u8], sig: &[u8]) -> Option<Result<(), SignatureError>> {
    let key = <&[u8; 32]>::try_from(key).ok()?;
    let sig = <&[u8; 64]>::try_from(sig).ok()?;
    Some(verify_own(key, msg, sig))
}

/// The verdict codes of a JS host's verifier (the Node addon, relay-wasm's `setHostCrypto`).
pub mod code {
    /// The signature verifies.
    pub const VALID: u32 = 0;
    /// [`super::SignatureError::InvalidKey`].
    pub const INVALID_KEY: u32 = 1;
    /// [`super::SignatureError::Mismatch`].
    pub const MISMATCH: u32 = 2;
    /// Not decided here (wrong shapes): the core verifies itself.
    pub const DECLINED: u32 = 3;

    /// A verdict as its code.
    pub fn of(v: Option<Result<(), super::SignatureError>>) -> u32 {
        match v {
            Some(Ok(())) => VALID,
            Some(Err(super::SignatureError::InvalidKey)) => INVALID_KEY,
            Some(Err(super::SignatureError::Mismatch)) => MISMATCH,
            None => DECLINED,
        }
    }

    /// A code as a verdict; `None` (declined) for any other value.
    pub fn verdict(code: f64) -> Option<Result<(), super::SignatureError>> {
        if code == VALID as f64 {
            Some(Ok(()))
        } else if code == INVALID_KEY as f64 {
            Some(Err(super::SignatureError::InvalidKey))
        } else if code == MISMATCH as f64 {
            Some(Err(super::SignatureError::Mismatch))
        } else {
            None
        }
    }
}

/// Keys in the memory of decoded keys (for tests of its bound).
pub fn decoded_keys() -> usize {
    DECODED.with(|d| d.borrow().len())
}

/// A protocol object signed by the signing rule.
pub trait SignedObject {
    /// The object's `type` member.
    const TYPE: &'static str;

    /// The object as received, unknown members included.
    fn raw(&self) -> &Object;

    /// The decoded `sig` member.
    fn sig(&self) -> &[u8; 64];

    /// What the signature covers.
    fn signing_input(&self) -> Vec<u8> {
        signing_input(Self::TYPE, self.raw())
    }

    /// Verifies the signature under `key`.
    fn verify_signature(&self, key: &[u8; 32]) -> Result<(), SignatureError> {
        verify_strict(key, &self.signing_input(), self.sig())
    }

    /// The object's canonical form.
    fn canonical(&self) -> Vec<u8> {
        self.canonical_string().into_bytes()
    }

    /// The object's canonical form as text (for records, which keep it as text).
    fn canonical_string(&self) -> String {
        canonical::object_to_string(self.raw())
    }
}

impl<'a> Fields<'a> {
    /// The `sig` member: a 64-byte signature.
    pub fn sig(&self) -> Result<[u8; 64], FieldError> {
        self.fixed::<64>("sig")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    #[test]
    fn verdict_codes_round_trip_and_anything_else_declines() {
        for v in [
            Some(Ok(())),
            Some(Err(SignatureError::InvalidKey)),
            Some(Err(SignatureError::Mismatch)),
        ] {
            assert_eq!(code::verdict(code::of(v) as f64), v);
        }
        assert_eq!(code::of(None), code::DECLINED);
        for other in [3.0, -1.0, 0.5, f64::NAN] {
            assert_eq!(code::verdict(other), None);
        }
        assert_eq!(verify_own_slices(&[0u8; 31], b"", &[0u8; 64]), None);
        assert_eq!(verify_own_slices(&[0u8; 32], b"", &[0u8; 65]), None);
    }

    #[test]
    fn decoded_keys_stay_bounded_and_invalid_keys_are_never_kept() {
        let msg = b"relay-v1:test\n{}";
        for i in 0..(DECODED_KEYS + 10) as u32 {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            let sk = SigningKey::from_bytes(&seed);
            let key = sk.verifying_key().to_bytes();
            let sig = sk.sign(msg).to_bytes();
            assert_eq!(verify_own(&key, msg, &sig), Ok(()));
            let mut bad = sig;
            bad[0] ^= 1;
            // A remembered key still checks every signature.
            assert_eq!(verify_own(&key, msg, &bad), Err(SignatureError::Mismatch));
            assert!(decoded_keys() <= DECODED_KEYS);
        }
        let invalid = (2u8..=255)
            .map(|y| {
                let mut k = [0u8; 32];
                k[0] = y;
                k
            })
            .find(|k| VerifyingKey::from_bytes(k).is_err())
            .expect("some small y is not on the curve");
        let before = decoded_keys();
        for _ in 0..2 {
            assert_eq!(
                verify_own(&invalid, msg, &[0u8; 64]),
                Err(SignatureError::InvalidKey)
            );
        }
        assert_eq!(decoded_keys(), before, "an invalid key is not remembered");
    }
}
