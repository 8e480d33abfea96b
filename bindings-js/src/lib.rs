//! relay-core for JavaScript: a wasm-bindgen class over the engine, and nothing else.
//!
//! Values cross as JSON strings (the cheapest crossing measured: see
//! docs/performance.md); storage is any JS object with synchronous
//! `get(key)`, `scan(start, end, limit)` and `commit(writes)`.

use js_sys::{Array, Function, Reflect, Uint8Array};
use relay_core::engine::storage::{Entry, Write};
use relay_core::engine::{
    Caller, Config, Effect, Engine, Entropy, Outcome, Response, Storage, StorageError,
};
use relay_core::wire::canonical::write_string;
use relay_core::wire::digest;
use relay_core::wire::identity::RelayId;
use relay_core::wire::relay_request::{self, RelayHeaders};
use relay_core::wire::signature::{self, SignatureError, SignedObject as _};
use relay_core::wire::{base64url, canonical};
use wasm_bindgen::prelude::*;

/// Storage implemented by a JS object.
struct JsStorage {
    obj: JsValue,
    get: Function,
    scan: Function,
    commit: Function,
}

fn method(obj: &JsValue, name: &str) -> Result<Function, JsValue> {
    Reflect::get(obj, &JsValue::from_str(name))?
        .dyn_into::<Function>()
        .map_err(|_| JsValue::from_str(&format!("storage.{name} must be a function")))
}

/// A stored value's bytes, copied once into the core: a Uint8Array (or Buffer) is read as it is;
/// anything else goes through the Uint8Array constructor (an ArrayBuffer, an array of numbers).
fn bytes(v: &JsValue) -> Vec<u8> {
    match v.dyn_ref::<Uint8Array>() {
        Some(a) => a.to_vec(),
        None => Uint8Array::new(v).to_vec(),
    }
}

fn js_err(e: JsValue) -> StorageError {
    StorageError(
        e.as_string()
            .or_else(|| js_sys::JSON::stringify(&e).ok().and_then(|s| s.as_string()))
            .unwrap_or_else(|| "storage error".into()),
    )
}

impl Storage for JsStorage {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let v = self
            .get
            .call1(&self.obj, &Uint8Array::from(key))
            .map_err(js_err)?;
        if v.is_null() || v.is_undefined() {
            return Ok(None);
        }
        Ok(Some(bytes(&v)))
    }

    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        let limit = JsValue::from_f64(limit.min(1 << 30) as f64);
        let rows = self
            .scan
            .call3(
                &self.obj,
                &Uint8Array::from(start),
                &Uint8Array::from(end),
                &limit,
            )
            .map_err(js_err)?;
        let rows = Array::from(&rows);
        let mut out = Vec::with_capacity(rows.length() as usize);
        for row in rows.iter() {
            let pair = Array::from(&row);
            out.push((bytes(&pair.get(0)), bytes(&pair.get(1))));
        }
        Ok(out)
    }

    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        let writes = Array::new_with_length(batch.len() as u32);
        for (i, (k, v)) in batch.iter().enumerate() {
            let pair = Array::new_with_length(2);
            pair.set(0, Uint8Array::from(k.as_slice()).into());
            pair.set(
                1,
                v.as_ref()
                    .map_or(JsValue::NULL, |v| Uint8Array::from(v.as_slice()).into()),
            );
            writes.set(i as u32, pair.into());
        }
        self.commit
            .call1(&self.obj, &writes)
            .map(|_| ())
            .map_err(js_err)
    }
}

/// A host's native crypto (the Node host's addon): `verifyEd25519(key, msg, sig)` and `sha256Into(data, out)`.
struct HostCrypto {
    obj: JsValue,
    verify: Option<Function>,
    sha256: Option<Function>,
}

thread_local! {
    static HOST_CRYPTO: std::cell::RefCell<Option<HostCrypto>> = const { std::cell::RefCell::new(None) };
}

/// Installs the host's native crypto for this instance (`null` removes it): an object with
/// `verifyEd25519(key, message, signature)` returning 0 valid, 1 invalid key, 2 mismatch
/// (anything else declines), and `sha256Into(data, out)` writing 32 bytes and returning true.
///
/// Either function may be missing; the core then does that work itself. They receive views
/// of the core's memory, valid only during the call, and must not call back into the core.
#[wasm_bindgen(js_name = setHostCrypto)]
pub fn set_host_crypto(crypto: JsValue) -> Result<(), JsValue> {
    if crypto.is_null() || crypto.is_undefined() {
        HOST_CRYPTO.with(|h| *h.borrow_mut() = None);
        signature::set_verifier(None);
        digest::set_hasher(None);
        return Ok(());
    }
    let optional = |name: &str| -> Result<Option<Function>, JsValue> {
        let v = Reflect::get(&crypto, &JsValue::from_str(name))?;
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        v.dyn_into::<Function>()
            .map(Some)
            .map_err(|_| JsValue::from_str(&format!("crypto.{name} must be a function")))
    };
    let (verify, sha256) = (optional("verifyEd25519")?, optional("sha256Into")?);
    signature::set_verifier(
        verify
            .is_some()
            .then_some(host_verify as signature::Verifier),
    );
    digest::set_hasher(sha256.is_some().then_some(host_sha256 as digest::Hasher));
    HOST_CRYPTO.with(|h| {
        *h.borrow_mut() = Some(HostCrypto {
            obj: crypto,
            verify,
            sha256,
        })
    });
    Ok(())
}

/// The host's verification; `None` (declined, absent, or a JS exception) falls back to the core's own.
fn host_verify(key: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Option<Result<(), SignatureError>> {
    HOST_CRYPTO.with(|h| {
        let h = h.borrow();
        let h = h.as_ref()?;
        let f = h.verify.as_ref()?;
        // SAFETY: the views live only for this call, and nothing allocates in the core's
        // memory while the host function runs (it must not call back into the core).
        let v = unsafe {
            f.call3(
                &h.obj,
                &Uint8Array::view(key),
                &Uint8Array::view(msg),
                &Uint8Array::view(sig),
            )
        }
        .ok()?;
        signature::code::verdict(v.as_f64()?)
    })
}

/// The host's SHA-256; `None` (declined, absent, or a JS exception) falls back to the core's own.
fn host_sha256(data: &[u8]) -> Option<[u8; 32]> {
    HOST_CRYPTO.with(|h| {
        let h = h.borrow();
        let h = h.as_ref()?;
        let f = h.sha256.as_ref()?;
        let mut out = [0u8; 32];
        // SAFETY: as in host_verify; `out` is this frame's and outlives the call.
        let done = unsafe {
            f.call2(
                &h.obj,
                &Uint8Array::view(data),
                &Uint8Array::view_mut_raw(out.as_mut_ptr(), 32),
            )
        }
        .ok()?;
        done.as_bool().filter(|&b| b).map(|_| out)
    })
}

/// The core's own strict verification in wasm, without the host (so tests can compare both paths),
/// as a verdict code (`signature::code`: 0 valid, 1 invalid key, 2 mismatch, 3 wrong lengths).
#[wasm_bindgen(js_name = verifyEd25519Own)]
pub fn verify_ed25519_own(key: &[u8], message: &[u8], signature: &[u8]) -> u32 {
    signature::code::of(signature::verify_own_slices(key, message, signature))
}

/// The JS platform's CSPRNG (crypto.getRandomValues), through getrandom.
struct JsEntropy;

impl Entropy for JsEntropy {
    fn fill(&mut self, buf: &mut [u8]) {
        // Without a CSPRNG no session token may be made: fail loudly (a trap), never weakly.
        getrandom::fill(buf).expect("crypto.getRandomValues");
    }
}

fn caller(kind: &str, value: &str) -> Caller {
    match kind {
        "session" => Caller::Session(value.to_string()),
        "relay" => RelayId::parse(value)
            .map(Caller::Relay)
            .unwrap_or(Caller::Anonymous),
        "operator" => Caller::Operator,
        _ => Caller::Anonymous,
    }
}

fn effects_json(effects: &[Effect], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, e) in effects.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match e {
            Effect::Send {
                task,
                attempt,
                target,
                method,
                body,
            } => {
                out.extend_from_slice(b"{\"type\":\"send\",\"task\":");
                write_string(task, out);
                out.extend_from_slice(format!(",\"attempt\":{attempt},\"target\":").as_bytes());
                write_string(target.as_str(), out);
                let m = method.as_str();
                out.extend_from_slice(format!(",\"method\":\"{m}\",\"body\":").as_bytes());
                write_string(&String::from_utf8_lossy(body), out);
                out.push(b'}');
            }
            Effect::WakeAt(t) => {
                out.extend_from_slice(format!("{{\"type\":\"wake\",\"at\":{t}}}").as_bytes())
            }
            Effect::Notify {
                account,
                latest_seq,
            } => {
                out.extend_from_slice(b"{\"type\":\"notify\",\"account\":");
                write_string(account, out);
                out.extend_from_slice(format!(",\"latest_seq\":{latest_seq}}}").as_bytes());
            }
            Effect::DeliveryEnded {
                from,
                message_id,
                to,
                status,
                error_code,
            } => {
                out.extend_from_slice(b"{\"type\":\"delivery_ended\",\"from\":");
                write_string(from, out);
                out.extend_from_slice(b",\"message_id\":");
                write_string(message_id, out);
                out.extend_from_slice(b",\"to\":");
                write_string(to, out);
                out.extend_from_slice(
                    format!(",\"status\":\"{status}\",\"error_code\":").as_bytes(),
                );
                match error_code {
                    Some(c) => write_string(c, out),
                    None => out.extend_from_slice(b"null"),
                }
                out.push(b'}');
            }
            Effect::EndDeviceSessions { account, device_id } => {
                out.extend_from_slice(b"{\"type\":\"end_device_sessions\",\"account\":");
                write_string(account, out);
                out.extend_from_slice(b",\"device_id\":");
                write_string(device_id, out);
                out.push(b'}');
            }
        }
    }
    out.push(b']');
}

/// `{"status", "body": <result or error object>, "effects": [...]}` as one JSON string.
fn reply_json(r: &Response) -> String {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(format!("{{\"status\":{},\"body\":", r.http_status()).as_bytes());
    out.extend_from_slice(&r.body());
    out.extend_from_slice(b",\"effects\":");
    effects_json(&r.effects, &mut out);
    out.push(b'}');
    String::from_utf8(out).unwrap_or_default()
}

fn effects_string(effects: &[Effect]) -> String {
    let mut out = Vec::new();
    effects_json(effects, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

fn error_json(e: relay_core::Error) -> JsValue {
    JsValue::from_str(&reply_json(&Response {
        result: Err(e),
        effects: Vec::new(),
    }))
}

/// One relay core over a JS storage object.
#[wasm_bindgen]
pub struct RelayCore {
    engine: Engine<JsStorage, JsEntropy>,
    seed: [u8; 32],
}

#[wasm_bindgen]
impl RelayCore {
    /// Starts the engine: config JSON `{relay, network, policies?}`, a storage object, the relay's 32-byte key seed.
    #[wasm_bindgen(constructor)]
    pub fn new(config: &str, storage: JsValue, relay_seed: &[u8]) -> Result<RelayCore, JsValue> {
        let config = Config::from_json(config.as_bytes()).map_err(|e| JsValue::from_str(&e))?;
        let seed: [u8; 32] = relay_seed
            .try_into()
            .map_err(|_| JsValue::from_str("relay seed must be 32 bytes"))?;
        let store = JsStorage {
            get: method(&storage, "get")?,
            scan: method(&storage, "scan")?,
            commit: method(&storage, "commit")?,
            obj: storage,
        };
        let mut engine = Engine::new(config, store, JsEntropy);
        // The store's schema version first: a store written by a newer relay is refused
        // here, with the core's message, before anything reads it.
        engine.open_store().map_err(|e| JsValue::from_str(&e))?;
        Ok(RelayCore { engine, seed })
    }

    /// Calls a method; `callerKind` is `anonymous`, `session`, `relay` or `operator`;
    /// `origin` is the network address the caller connected from (its IP address, no port),
    /// or null/undefined for an in-process caller: anonymous calls are limited per address
    /// too. Returns the reply JSON.
    pub fn call(
        &mut self,
        caller_kind: &str,
        caller_value: &str,
        origin: Option<String>,
        method: &str,
        params: &str,
        now: f64,
    ) -> String {
        reply_json(&self.engine.call_from(
            &caller(caller_kind, caller_value),
            origin.as_deref(),
            method,
            params.as_bytes(),
            now as u64,
        ))
    }

    /// The same call with structured values through serde-wasm-bindgen (kept for the boundary benchmark).
    #[wasm_bindgen(js_name = callValue)]
    pub fn call_value(
        &mut self,
        caller_kind: &str,
        caller_value: &str,
        method: &str,
        params: JsValue,
        now: f64,
    ) -> Result<JsValue, JsValue> {
        let p: serde_json::Value = serde_wasm_bindgen::from_value(params)?;
        let bytes = serde_json::to_vec(&p).map_err(|e| JsValue::from_str(&e.to_string()))?;
        let r = self.engine.call(
            &caller(caller_kind, caller_value),
            method,
            &bytes,
            now as u64,
        );
        let body: serde_json::Value =
            serde_json::from_slice(&r.body()).map_err(|e| JsValue::from_str(&e.to_string()))?;
        let out = serde_json::json!({ "status": r.http_status(), "body": body });
        Ok(serde_wasm_bindgen::to_value(&out)?)
    }

    /// Reports the outcome of a send effect: kind `answered`, `rejected`, `unknown` or `not_attempted`. Returns effects JSON.
    pub fn outcome(
        &mut self,
        task: &str,
        attempt: u32,
        kind: &str,
        body: &str,
        now: f64,
    ) -> String {
        let outcome = match kind {
            "answered" => Outcome::Result(body.as_bytes().to_vec()),
            "rejected" => Outcome::Error(body.as_bytes().to_vec()),
            "not_attempted" => Outcome::NotAttempted,
            _ => Outcome::Unknown,
        };
        effects_string(&self.engine.outcome(task, attempt, outcome, now as u64))
    }

    /// Runs what is due; returns JSON `{"effects": [...]}`, with `"quarantined": [...]` (the
    /// entries this tick set aside: `{entry, code, message, at}`) when there were any, and
    /// `"error": "code: message"` when the tick could not commit.
    pub fn tick(&mut self, now: f64) -> String {
        let r = self.engine.try_tick(now as u64);
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(b"{\"effects\":");
        effects_json(&r.effects, &mut out);
        match &r.result {
            Ok(v) => {
                if let Some(q) = v.as_object().and_then(|o| o.get("quarantined")) {
                    out.extend_from_slice(b",\"quarantined\":");
                    out.extend_from_slice(&canonical::to_vec(q));
                }
            }
            Err(e) => {
                out.extend_from_slice(b",\"error\":");
                write_string(&format!("{}: {}", e.code.as_str(), e.message), &mut out);
            }
        }
        out.push(b'}');
        String::from_utf8(out).unwrap_or_default()
    }

    /// What the engine counted since this instance started, and the pending deliveries per
    /// destination, in the Prometheus text exposition format (0.0.4); throws on a storage error.
    pub fn metrics(&mut self) -> Result<String, JsValue> {
        self.engine
            .metrics()
            .map(|m| m.to_prometheus())
            .map_err(|e| JsValue::from_str(&e.to_string()))
    }

    /// When the engine next wants a tick (ms), -1 for never, or -2 when the storage could not
    /// say (the host then ticks again soon, so no timer is lost).
    #[wasm_bindgen(js_name = nextWake)]
    pub fn next_wake(&mut self) -> f64 {
        match self.engine.next_wake() {
            Ok(Some(t)) => t as f64,
            Ok(None) => -1.0,
            Err(_) => -2.0,
        }
    }

    /// The session's holder as JSON `{account, device_id, expires_at}`; throws the error reply JSON.
    pub fn session(&mut self, token: &str, now: f64) -> Result<String, JsValue> {
        let i = self
            .engine
            .session_info(token, now as u64)
            .map_err(error_json)?;
        let mut o = relay_core::wire::json::Object::new();
        o.insert("account", i.account);
        o.insert("device_id", i.device_id);
        o.insert("expires_at", i.expires_at);
        Ok(canonical::to_string(
            &relay_core::wire::json::Value::Object(o),
        ))
    }

    /// Signs an outbound relay request: headers JSON `{relay_id, timestamp, nonce, signature}`.
    #[wasm_bindgen(js_name = signRequest)]
    pub fn sign_request(
        &mut self,
        method: &str,
        target: &str,
        body: &str,
        now: f64,
    ) -> Result<String, JsValue> {
        let to = RelayId::parse(target).map_err(|e| JsValue::from_str(&e))?;
        let mut nonce = [0u8; 16];
        JsEntropy.fill(&mut nonce);
        let c = self.engine.config();
        let h = relay_request::sign(
            &self.seed,
            &c.network,
            method,
            &c.relay,
            &to,
            now as u64,
            &nonce,
            body.as_bytes(),
        );
        Ok(headers_json(&h))
    }

    /// Cheap checks of an inbound relay request; returns the source relay id or throws the error reply JSON.
    #[wasm_bindgen(js_name = checkRequest)]
    pub fn check_request(
        &mut self,
        headers: &str,
        method: &str,
        body: &str,
        now: f64,
    ) -> Result<String, JsValue> {
        let h = parse_headers(headers)?;
        let c = self.engine.config();
        relay_request::precheck(
            &h,
            &c.network,
            &c.relay,
            method,
            body.as_bytes(),
            now as u64,
            c.policies.clock_tolerance,
        )
        .map(|p| p.source.as_str().to_string())
        .map_err(error_json)
    }

    /// Verifies an inbound relay request under the source's key (base64url) and consumes its nonce.
    #[wasm_bindgen(js_name = authenticateRequest)]
    pub fn authenticate_request(
        &mut self,
        headers: &str,
        method: &str,
        body: &str,
        now: f64,
        source_key: &str,
    ) -> Result<String, JsValue> {
        let h = parse_headers(headers)?;
        let c = self.engine.config().clone();
        let p = relay_request::precheck(
            &h,
            &c.network,
            &c.relay,
            method,
            body.as_bytes(),
            now as u64,
            c.policies.clock_tolerance,
        )
        .map_err(error_json)?;
        let key = base64url::decode_array::<32>(source_key).ok_or_else(|| {
            error_json(relay_core::Error::new(
                relay_core::ErrorCode::Unauthenticated,
                "bad relay key",
            ))
        })?;
        self.engine
            .authenticate_relay(&p, &key, now as u64)
            .map(|r| r.as_str().to_string())
            .map_err(error_json)
    }

    /// Parses a peer's `/.well-known/relay` and returns its key (base64url), checking relay and network.
    #[wasm_bindgen(js_name = peerKey)]
    pub fn peer_key(&self, body: &str, relay: &str) -> Result<String, JsValue> {
        let id = RelayId::parse(relay).map_err(|e| JsValue::from_str(&e))?;
        relay_request::parse_well_known(body.as_bytes(), &id, &self.engine.config().network)
            .map(|k| base64url::encode(&k))
            .map_err(error_json)
    }

    /// This relay's `/.well-known/relay` document.
    #[wasm_bindgen(js_name = wellKnown)]
    pub fn well_known(&self) -> String {
        canonical::to_string(
            &self
                .engine
                .well_known(&relay_request::public_key(&self.seed)),
        )
    }

    /// Parses a WebSocket frame: JSON `{"id", "method", "params"}` with params as the exact text sent,
    /// or `{"id", "error"}`.
    #[wasm_bindgen(js_name = parseFrame)]
    pub fn parse_frame(text: &str) -> String {
        use relay_core::wire::json::{Object, Value};
        let mut o = Object::new();
        match relay_core::wire::frame::parse(text.as_bytes()) {
            Ok(f) => {
                o.insert("id", f.id);
                o.insert("method", f.method);
                o.insert("params", String::from_utf8_lossy(&f.params).into_owned());
            }
            Err((id, e)) => {
                o.insert("id", id);
                let body = relay_core::engine::error_body(&e);
                o.insert(
                    "error",
                    body.as_object()
                        .and_then(|b| b.get("error"))
                        .cloned()
                        .unwrap_or(Value::Null),
                );
            }
        }
        canonical::to_string(&Value::Object(o))
    }

    /// Strict I-JSON check of a request body, as the core would judge it; returns the error reply JSON or empty.
    #[wasm_bindgen(js_name = checkJson)]
    pub fn check_json(body: &str) -> String {
        match relay_core::wire::json::parse_object(body.as_bytes()) {
            Ok(_) => String::new(),
            Err(e) => reply_json(&Response {
                result: Err(e.into()),
                effects: Vec::new(),
            }),
        }
    }
}

fn headers_json(h: &RelayHeaders) -> String {
    let mut o = relay_core::wire::json::Object::new();
    o.insert("relay_id", h.relay_id.as_str());
    o.insert("timestamp", h.timestamp.as_str());
    o.insert("nonce", h.nonce.as_str());
    o.insert("signature", h.signature.as_str());
    canonical::to_string(&relay_core::wire::json::Value::Object(o))
}

fn parse_headers(s: &str) -> Result<RelayHeaders, JsValue> {
    let o = relay_core::wire::json::parse_object(s.as_bytes())
        .map_err(|e| JsValue::from_str(&e.to_string()))?;
    let f = relay_core::wire::field::Fields::new(&o);
    let get = |k: &str| {
        f.str(k)
            .map(str::to_string)
            .map_err(|e| JsValue::from_str(&e.to_string()))
    };
    Ok(RelayHeaders {
        relay_id: get("relay_id")?,
        timestamp: get("timestamp")?,
        nonce: get("nonce")?,
        signature: get("signature")?,
    })
}

/// The platform CSPRNG as a `rand_core` generator, for the client builders.
struct JsRng;

impl rand_core::RngCore for JsRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        JsEntropy.fill(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl rand_core::CryptoRng for JsRng {}

/// A client identity (an account with one device) and the builders a JS client needs:
/// certificates, routes, sessions, encrypted messages, and opening received entries.
#[wasm_bindgen]
pub struct Identity {
    account: relay_core::client::AccountKey,
    device: relay_core::client::DeviceKey,
}

fn obj_text(o: &relay_core::wire::json::Object) -> String {
    String::from_utf8(canonical::object_to_vec(o)).unwrap_or_default()
}

fn parse_obj(s: &str) -> Result<relay_core::wire::json::Object, JsValue> {
    relay_core::wire::json::parse_object(s.as_bytes())
        .map_err(|e| JsValue::from_str(&e.to_string()))
}

#[wasm_bindgen]
impl Identity {
    /// A fresh random account and device.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Identity {
        Identity {
            account: relay_core::client::AccountKey::generate(&mut JsRng),
            device: relay_core::client::DeviceKey::generate(&mut JsRng),
        }
    }

    /// The account id.
    #[wasm_bindgen(js_name = accountId)]
    pub fn account_id(&self) -> String {
        self.account.id().as_str().to_string()
    }

    /// The device id.
    #[wasm_bindgen(js_name = deviceId)]
    pub fn device_id(&self) -> String {
        self.device.id().as_str().to_string()
    }

    /// A device certificate (permissions comma-separated).
    pub fn certificate(&self, network: &str, permissions: &str, issued_at: f64) -> String {
        let perms: Vec<&str> = permissions.split(',').filter(|p| !p.is_empty()).collect();
        obj_text(
            &relay_core::client::draft::certificate(
                network,
                &self.account,
                &self.device,
                &perms,
                issued_at as u64,
            )
            .sign(&self.account),
        )
    }

    /// A route naming `relay`.
    pub fn route(&self, network: &str, relay: &str, revision: f64, issued_at: f64) -> String {
        obj_text(
            &relay_core::client::draft::route(
                network,
                &self.account.id(),
                relay,
                revision as u64,
                issued_at as u64,
            )
            .sign(&self.account),
        )
    }

    /// A contact grant letting `grantee` deliver to this account.
    pub fn grant(&self, network: &str, grantee: &str, issued_at: f64) -> Result<String, JsValue> {
        let to = relay_core::wire::identity::AccountId::parse(grantee)
            .ok_or_else(|| JsValue::from_str("bad account id"))?;
        let id = relay_core::client::random_id(&mut JsRng);
        Ok(obj_text(
            &relay_core::client::draft::grant(
                network,
                &id,
                &self.account.id(),
                &to,
                issued_at as u64,
            )
            .sign(&self.account),
        ))
    }

    /// A signed session_open for `relay`.
    #[wasm_bindgen(js_name = sessionOpen)]
    pub fn session_open(&self, network: &str, relay: &str, ts: f64) -> String {
        let nonce = relay_core::client::random_id(&mut JsRng);
        obj_text(
            &relay_core::client::draft::session_open(
                network,
                relay,
                &self.account.id(),
                &self.device.id(),
                ts as u64,
                &nonce,
            )
            .sign(&self.device),
        )
    }

    /// message.send params: `text` encrypted to the devices of the given certificates (a JSON array).
    pub fn message(
        &self,
        network: &str,
        to_account: &str,
        recipient_certificates: &str,
        text: &str,
        created_at: f64,
        sender_boxes: bool,
    ) -> Result<String, JsValue> {
        use relay_core::client::seal;
        use relay_core::wire::json::Value;
        let to = relay_core::wire::identity::AccountId::parse(to_account)
            .ok_or_else(|| JsValue::from_str("bad account id"))?;
        let certs = relay_core::wire::json::parse(recipient_certificates.as_bytes())
            .map_err(|e| JsValue::from_str(&e.to_string()))?;
        let Value::Array(certs) = certs else {
            return Err(JsValue::from_str("certificates must be an array"));
        };
        let key = seal::message_key(&mut JsRng);
        let body = seal::seal_body(&mut JsRng, &key, text.as_bytes());
        let id = relay_core::client::random_id(&mut JsRng);
        let env = relay_core::client::draft::envelope(
            network,
            &id,
            &self.account.id(),
            &self.device.id(),
            &to,
            created_at as u64,
            body,
        )
        .sign(&self.device);
        let mut boxes = Vec::new();
        for c in certs {
            let c = relay_core::wire::certificate::DeviceCertificate::parse(
                c.as_object().cloned().unwrap_or_default(),
            )
            .map_err(|e| JsValue::from_str(&e.to_string()))?;
            boxes.push(seal::seal_key_box(
                &mut JsRng,
                &c.device_id,
                &c.box_key,
                &key,
            ));
        }
        let mut p = relay_core::wire::json::Object::new();
        p.insert("envelope", env);
        p.insert("recipient_boxes", seal::boxes(boxes));
        if sender_boxes {
            p.insert(
                "sender_boxes",
                seal::boxes(vec![seal::seal_key_box(
                    &mut JsRng,
                    &self.device.id(),
                    &self.device.box_key(),
                    &key,
                )]),
            );
        }
        Ok(obj_text(&p))
    }

    /// Verifies a timeline entry's envelope against its certificate and decrypts it; returns the text.
    #[wasm_bindgen(js_name = openEntry)]
    pub fn open_entry(&self, entry: &str) -> Result<String, JsValue> {
        use relay_core::wire::field::Fields;
        let e = parse_obj(entry)?;
        let f = Fields::new(&e);
        let err = |m: &str| JsValue::from_str(m);
        let env = relay_core::wire::envelope::MessageEnvelope::parse(
            f.object("envelope")
                .map_err(|_| err("no envelope"))?
                .clone(),
        )
        .map_err(|e| err(&e.to_string()))?;
        let cert = relay_core::wire::certificate::DeviceCertificate::parse(
            f.object("device_certificate")
                .map_err(|_| err("no certificate"))?
                .clone(),
        )
        .map_err(|e| err(&e.to_string()))?;
        cert.verify(&env.network).map_err(|e| err(&e.to_string()))?;
        env.verify_with(&cert).map_err(|e| err(&e.to_string()))?;
        let kb = f.object("key_box").map_err(|_| err("no key box"))?;
        let key = relay_core::client::seal::open_key_box(kb, &self.device)
            .ok_or_else(|| err("key box does not open"))?;
        let body = Fields::new(env.raw())
            .object("body")
            .map_err(|_| err("no body"))?
            .clone();
        let pt = relay_core::client::seal::open_body(&body, &key)
            .ok_or_else(|| err("body does not open"))?;
        String::from_utf8(pt).map_err(|_| err("not UTF-8"))
    }
}

impl Default for Identity {
    fn default() -> Identity {
        Identity::new()
    }
}
