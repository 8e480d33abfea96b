//! The signing rule of protocol.md §1 and strict Ed25519 verification.
//!
//! A signature covers `"relay-v1:" + type + "\n" + JCS(object without "sig")`,
//! unknown members included. Verification is ed25519-dalek's
//! `verify_strict`: non-canonical S, small-order keys and small-order R are
//! rejected, so a signature has one valid form and keys cannot be weak.

use super::canonical;
use super::crypto::Crypto;
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

/// Strict Ed25519 verification of `sig` over `msg` under `key`, by the core itself, with no
/// memory (clients and tests; an engine verifies through its [`super::crypto::Crypto`]).
pub fn verify_strict(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
    verify_own(key, msg, sig)
}

/// The core's own strict verification (ed25519-dalek `verify_strict`), without the host.
pub fn verify_own(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
    let vk = VerifyingKey::from_bytes(key).map_err(|_| SignatureError::InvalidKey)?;
    verify_decoded(&vk, msg, sig)
}

/// [`verify_own`] with the key already decoded.
pub fn verify_decoded(vk: &VerifyingKey, msg: &[u8], sig: &[u8; 64]) -> Result<(), SignatureError> {
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

    /// Verifies the signature under `key`, by the core itself (clients and tests).
    fn verify_signature(&self, key: &[u8; 32]) -> Result<(), SignatureError> {
        verify_strict(key, &self.signing_input(), self.sig())
    }

    /// Verifies the signature under `key` with an engine's crypto (host verifier, memories).
    fn verify_signature_in(
        &self,
        key: &[u8; 32],
        crypto: &mut Crypto,
    ) -> Result<(), SignatureError> {
        crypto.verify(key, &self.signing_input(), self.sig())
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
}
