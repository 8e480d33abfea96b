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

/// Hex of a pre-verification digest (`relay_core::wire::preverify`), the memory's key on both threads.
fn hex(d: [u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// On the transports' thread: verifies the envelope of message.send `params` (JSON text) under
/// the session's known device `key`; the digest of a success, else null.
#[napi(js_name = "preverifySend")]
pub fn preverify_send(key: &[u8], params: String) -> Option<String> {
    let key = <[u8; 32]>::try_from(key).ok()?;
    let params = relay_core::wire::json::parse_object(params.as_bytes()).ok()?;
    relay_core::wire::preverify::send(&key, &params).map(hex)
}

/// On the transports' thread: verifies the envelope of message.deliver `params` (JSON text)
/// under the key of the device certificate they carry; the digest of a success, else null.
#[napi(js_name = "preverifyDeliver")]
pub fn preverify_deliver(params: String) -> Option<String> {
    let params = relay_core::wire::json::parse_object(params.as_bytes()).ok()?;
    relay_core::wire::preverify::deliver(&params).map(hex)
}

/// On the relay thread, when the core asks to verify: the digest to look up if `message` is an
/// envelope's signing input, else null (nothing is looked up for other objects).
#[napi(js_name = "envelopeDigest")]
pub fn envelope_digest(key: &[u8], message: &[u8], signature: &[u8]) -> Option<String> {
    relay_core::wire::preverify::is_envelope_input(message)
        .then(|| hex(relay_core::wire::preverify::digest(key, signature, message)))
}

/// Whether `message` is an envelope's signing input (`relay_core::wire::preverify`), without hashing it.
#[napi(js_name = "isEnvelopeInput")]
pub fn is_envelope_input(message: &[u8]) -> bool {
    relay_core::wire::preverify::is_envelope_input(message)
}
