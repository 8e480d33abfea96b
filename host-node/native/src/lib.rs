//! The Node host's native crypto, offered to the core as its host verifier and hasher.
//!
//! The wasmtime host gives the core native Ed25519 and SHA-256 through its
//! imports; this addon does the same for the Node host. Both functions call
//! the core's own code (`verify_own`, `sha256_own`) compiled natively, so a
//! verdict here is the verdict the core would reach in wasm, only faster.

use napi::bindgen_prelude::Uint8ArraySlice;
use napi_derive::napi;
use relay_core::wire::digest::sha256_own;
use relay_core::wire::signature::{code, verify_own_slices};

/// Strict Ed25519 (ed25519-dalek `verify_strict`) of `signature` over `message` under `key`,
/// as a verdict code (`relay_core::wire::signature::code`); wrong lengths are declined.
#[napi(js_name = "verifyEd25519")]
pub fn verify_ed25519(key: &[u8], message: &[u8], signature: &[u8]) -> u32 {
    code::of(verify_own_slices(key, message, signature))
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
