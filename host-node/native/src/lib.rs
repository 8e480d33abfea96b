//! The Node host's native crypto, offered to the core as its host verifier and hasher.
//!
//! The wasmtime host gives the core native Ed25519 and SHA-256 through its
//! imports; this addon does the same for the Node host. Both functions call
//! the core's own code (`verify_own`, `sha256_own`) compiled natively, so a
//! verdict here is the verdict the core would reach in wasm, only faster.

use napi::bindgen_prelude::Uint8ArraySlice;
use napi_derive::napi;
use relay_core::wire::digest::sha256_own;
use relay_core::wire::signature::{verify_own, SignatureError};

/// The verdict codes the JS binding maps to the core's: valid, invalid key, mismatch, declined.
const VALID: u32 = 0;
const INVALID_KEY: u32 = 1;
const MISMATCH: u32 = 2;
const DECLINED: u32 = 3;

/// Strict Ed25519 (ed25519-dalek `verify_strict`) of `signature` over `message` under `key`.
///
/// Arguments of the wrong length are declined, so the core decides them itself.
#[napi(js_name = "verifyEd25519")]
pub fn verify_ed25519(key: &[u8], message: &[u8], signature: &[u8]) -> u32 {
    let (Ok(key), Ok(sig)) = (<&[u8; 32]>::try_from(key), <&[u8; 64]>::try_from(signature)) else {
        return DECLINED;
    };
    match verify_own(key, message, sig) {
        Ok(()) => VALID,
        Err(SignatureError::InvalidKey) => INVALID_KEY,
        Err(SignatureError::Mismatch) => MISMATCH,
    }
}

/// SHA-256 of `data` written into `out` (32 bytes, else nothing is written and it returns false).
#[napi(js_name = "sha256Into")]
pub fn sha256_into(data: &[u8], mut out: Uint8ArraySlice<'_>) -> bool {
    // SAFETY: `out` is a view the caller made for this call alone, and nothing else
    // reads or writes it while this runs (JS is single-threaded and waits here).
    let out = unsafe { out.as_mut() };
    if out.len() != 32 {
        return false;
    }
    out.copy_from_slice(&sha256_own(data));
    true
}
