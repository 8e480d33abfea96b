//! The Node host's native crypto, offered to the core as its host verifier and hasher.
//!
//! The wasmtime host gives the core native Ed25519 and SHA-256 through its
//! imports; this addon does the same for the Node host. Both functions call
//! the core's own code (`verify_own`, `sha256_own`) compiled natively, so a
//! verdict here is the verdict the core would reach in wasm, only faster. It also
//! holds the relays' pre-verification memories (`relay_core::wire::preverify`).

use napi::bindgen_prelude::{Buffer, Uint8ArraySlice};
use napi_derive::napi;
use relay_core::engine::Config;
use relay_core::transport::ahead::{Ahead, Verdict};
use relay_core::transport::Request;
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

/// Forgets memory `id` and its rules (its relay stopped).
#[napi(js_name = "preverifyClose")]
pub fn preverify_close(id: u32) {
    if let Ok(mut m) = MEMORIES.lock() {
        m.remove(&id);
    }
    if let Ok(mut a) = AHEADS.lock() {
        a.remove(&id);
    }
}

/// The transports' thread's [`Ahead`] of each relay, by its memory's id (`aheadOpen`).
static AHEADS: LazyLock<Mutex<HashMap<u32, Arc<Ahead>>>> = LazyLock::new(Default::default);

/// On the transports' thread, once the relay stands: the rules of the relay built from
/// `config` (its config JSON), verifying into memory `id`.
#[napi(js_name = "aheadOpen")]
pub fn ahead_open(id: u32, config: String) -> napi::Result<()> {
    let config = Config::from_json(config.as_bytes()).map_err(napi::Error::from_reason)?;
    let ahead = Arc::new(Ahead::new(&config, memory(id)));
    if let Ok(mut a) = AHEADS.lock() {
        a.insert(id, ahead);
    }
    Ok(())
}

/// What `aheadRequest` made of a request: an answer to write (`status`, `headers`, `body`),
/// or none, and then the session of a `message.send` to name to the core's verifier.
#[napi(object)]
pub struct AheadVerdict {
    /// The answer's status, when it is answered here.
    pub status: Option<u32>,
    /// The answer's headers.
    pub headers: Option<HashMap<String, String>>,
    /// The answer's body.
    pub body: Option<Buffer>,
    /// The session token of a `message.send` going to the core.
    pub sending: Option<String>,
}

/// On the transports' thread: `relay_core::transport::ahead` on a request as the core takes
/// it (`headers` is `name\nvalue\n` per header), for relay `id`.
#[napi(js_name = "aheadRequest")]
#[allow(clippy::too_many_arguments)]
pub fn ahead_request(
    id: u32,
    admin: bool,
    method: String,
    path: String,
    headers: String,
    body: &[u8],
    now: f64,
) -> AheadVerdict {
    let go = |sending| AheadVerdict {
        status: None,
        headers: None,
        body: None,
        sending,
    };
    let Some(ahead) = AHEADS.lock().ok().and_then(|a| a.get(&id).cloned()) else {
        return go(None);
    };
    let req = Request::from_lines(
        admin,
        method,
        path,
        String::new(),
        &headers,
        body.to_vec(),
        None,
    );
    match ahead.request(&req, now as u64) {
        Verdict::Answer(r) => AheadVerdict {
            status: Some(u32::from(r.status)),
            headers: Some(
                r.headers
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            body: Some(r.body.into()),
            sending: None,
        },
        Verdict::Core { sending } => go(sending),
    }
}

/// On the transports' thread: whether WebSocket text `text` of session `token` is a
/// `message.send` (its envelope verified ahead where the memory knows the session's key).
#[napi(js_name = "aheadFrame")]
pub fn ahead_frame(id: u32, token: String, text: String) -> bool {
    AHEADS
        .lock()
        .ok()
        .and_then(|a| a.get(&id).cloned())
        .is_some_and(|a| a.frame(&token, &text))
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
