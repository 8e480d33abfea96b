//! The Node host's native crypto, offered to the core as its host verifier and hasher.
//!
//! The wasmtime host gives the core native Ed25519 and SHA-256 through its
//! imports; this addon does the same for the Node host. Both functions call
//! the core's own code (`verify_own`, `sha256_own`) compiled natively, so a
//! verdict here is the verdict the core would reach in wasm, only faster. It also
//! holds the relays' pre-verification memories (`relay_core::wire::preverify`).

use napi::bindgen_prelude::Uint8ArraySlice;
use napi_derive::napi;
use relay_core::wire::digest::sha256_own;
use relay_core::wire::preverify::Memory;
use relay_core::wire::signature::{code, verify_own_slices};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

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

/// The pre-verification memories of this process, by the id `preverifyOpen` gave: one per
/// relay, shared by its transports' thread and its relay thread (both load this addon, and
/// its statics are the process's), so a success verified on one is found on the other.
static MEMORIES: LazyLock<Mutex<HashMap<u32, Arc<Memory>>>> = LazyLock::new(Default::default);
static NEXT: AtomicU32 = AtomicU32::new(1);

fn memory(id: u32) -> Option<Arc<Memory>> {
    MEMORIES.lock().ok()?.get(&id).cloned()
}

/// A new pre-verification memory (`relay_core::wire::preverify::Memory`); its id.
#[napi(js_name = "preverifyOpen")]
pub fn preverify_open() -> u32 {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut m) = MEMORIES.lock() {
        m.insert(id, Arc::default());
    }
    id
}

/// Forgets memory `id` (its relay stopped).
#[napi(js_name = "preverifyClose")]
pub fn preverify_close(id: u32) {
    if let Ok(mut m) = MEMORIES.lock() {
        m.remove(&id);
    }
}

/// On the transports' thread: verifies the envelope of message.send `params` (JSON text)
/// under the device key memory `id` knows for session `token`, and remembers a success.
#[napi(js_name = "preverifySend")]
pub fn preverify_send(id: u32, token: String, params: &[u8]) {
    if let (Some(m), Ok(params)) = (memory(id), relay_core::wire::json::parse_object(params)) {
        m.send(&token, &params);
    }
}

/// On the transports' thread: verifies the envelope of message.deliver `params` (JSON text)
/// under the key of the device certificate they carry, and remembers a success.
#[napi(js_name = "preverifyDeliver")]
pub fn preverify_deliver(id: u32, params: &[u8]) {
    if let (Some(m), Ok(params)) = (memory(id), relay_core::wire::json::parse_object(params)) {
        m.deliver(&params);
    }
}

/// On the relay thread, when the core asks to verify: whether memory `id` holds this exact
/// success (it is then used up).
#[napi(js_name = "preverifyTake")]
pub fn preverify_take(id: u32, key: &[u8], message: &[u8], signature: &[u8]) -> bool {
    memory(id).is_some_and(|m| m.take(key, message, signature))
}

/// On the relay thread: the core verified session `token`'s envelope under `key`.
#[napi(js_name = "preverifyLearn")]
pub fn preverify_learn(id: u32, token: String, key: &[u8], message: &[u8]) {
    if let Some(m) = memory(id) {
        m.learn(&token, key, message);
    }
}

/// What a pre-verification `send` of these params would remember: the digest's hex, else
/// null (tests compare it with the core's own verification).
#[napi(js_name = "preverifyDigest")]
pub fn preverify_digest(key: &[u8], params: &[u8]) -> Option<String> {
    let params = relay_core::wire::json::parse_object(params).ok()?;
    match <[u8; 32]>::try_from(key) {
        Ok(key) => relay_core::wire::preverify::send(&key, &params),
        Err(_) => relay_core::wire::preverify::deliver(&params),
    }
    .map(hex)
}

/// Hex of a digest.
fn hex(d: [u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}
