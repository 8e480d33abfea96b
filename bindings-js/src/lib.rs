//! relay-core for JavaScript: a wasm-bindgen class over the relay's transports
//! (`relay_core::transport`), and nothing else.
//!
//! Bodies cross as bytes, messages as strings, the rest as small scalars; what comes back is
//! one buffer or string per call (a line of JSON, then the bytes to write), the cheapest
//! crossing measured (docs/performance.md). Storage is any JS object with synchronous
//! `get(key)`, `scan(start, end, limit)` and `commit(writes)`.

use js_sys::{Array, Function, Reflect, Uint8Array};
use relay_core::engine::group::Grouped;
use relay_core::engine::storage::{Entry, Write};
use relay_core::engine::{Caller, Config, Engine, Entropy, Storage, StorageError};
use relay_core::transport::health;
use relay_core::transport::http::HEADERS;
use relay_core::transport::{
    host_metrics, socket, Event, Fetch, Method, Need, Parked, Relay, Request, Response, Resumed,
    Resumption, Step,
};
use relay_core::wire::canonical;
use relay_core::wire::canonical::write_string;
use relay_core::wire::crypto::Crypto;
use relay_core::wire::identity::RelayId;
use relay_core::wire::relay_request;
use relay_core::wire::signature::{self, SignatureError, SignedObject as _};
use serde::Serialize as _;
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

/// A caller from its kind and value. A relay's value is its id and, for `message.deliver`,
/// a space and the recipient's route revision the delivery targets (`relayValue` in
/// relay-node builds it); a value that is neither is anonymous.
fn caller(kind: &str, value: &str) -> Caller {
    match kind {
        "session" => Caller::Session(value.to_string()),
        "relay" => {
            let (id, revision) = match value.split_once(' ') {
                Some((id, rev)) => match rev.parse::<u64>() {
                    Ok(r) => (id, Some(r)),
                    Err(_) => return Caller::Anonymous,
                },
                None => (value, None),
            };
            RelayId::parse(id)
                .map(|id| Caller::relay_at(id, revision))
                .unwrap_or(Caller::Anonymous)
        }
        "operator" => Caller::Operator,
        _ => Caller::Anonymous,
    }
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
}

/// Events as a JSON array: `{"type": "send"|"wake"|"notify"|"close"|"accepted"|"delivery_ended"|"operator_action"|"shard_call", ...}`.
fn events_json(events: &[Event], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match e {
            Event::Send(p) => {
                push_str(out, "{\"type\":\"send\",\"task\":");
                write_string(&p.task, out);
                push_str(out, &format!(",\"attempt\":{},\"target\":", p.attempt));
                write_string(&p.target, out);
                push_str(out, ",\"url\":");
                write_string(&p.url, out);
                push_str(out, ",\"headers\":{");
                for (j, (k, v)) in p.headers.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    write_string(k, out);
                    out.push(b':');
                    write_string(v, out);
                }
                push_str(out, "},\"body\":");
                write_string(&String::from_utf8_lossy(&p.body), out);
                push_str(out, &format!(",\"timeout_ms\":{}", p.timeout_ms));
                if let Some(k) = p.shard {
                    push_str(out, &format!(",\"shard\":{k}"));
                }
                out.push(b'}');
            }
            Event::WakeAt(t) => push_str(out, &format!("{{\"type\":\"wake\",\"at\":{t}}}")),
            Event::Notify {
                account,
                latest_seq,
                frame,
            } => {
                push_str(out, "{\"type\":\"notify\",\"account\":");
                write_string(account, out);
                push_str(out, &format!(",\"latest_seq\":{latest_seq},\"frame\":"));
                write_string(frame, out);
                out.push(b'}');
            }
            Event::Close {
                account,
                device_id,
                code,
                reason,
            } => {
                push_str(out, "{\"type\":\"close\",\"account\":");
                write_string(account, out);
                push_str(out, ",\"device_id\":");
                write_string(device_id, out);
                push_str(out, &format!(",\"code\":{code},\"reason\":"));
                write_string(reason, out);
                out.push(b'}');
            }
            Event::Accepted(a) => {
                let (method, status) = (a.method, a.status);
                push_str(
                    out,
                    &format!("{{\"type\":\"accepted\",\"method\":\"{method}\",\"from\":"),
                );
                write_string(&a.from, out);
                push_str(out, ",\"message_id\":");
                write_string(&a.message_id, out);
                push_str(out, ",\"to\":");
                write_string(&a.to, out);
                push_str(out, &format!(",\"status\":\"{status}\"}}"));
            }
            Event::DeliveryEnded {
                from,
                message_id,
                to,
                status,
                error_code,
            } => {
                push_str(out, "{\"type\":\"delivery_ended\",\"from\":");
                write_string(from, out);
                push_str(out, ",\"message_id\":");
                write_string(message_id, out);
                push_str(out, ",\"to\":");
                write_string(to, out);
                push_str(out, &format!(",\"status\":\"{status}\",\"error_code\":"));
                match error_code {
                    Some(c) => write_string(c, out),
                    None => push_str(out, "null"),
                }
                out.push(b'}');
            }
            Event::OperatorAction(a) => {
                push_str(
                    out,
                    &format!(
                        "{{\"type\":\"operator_action\",\"action\":\"{}\",\"subject\":",
                        a.action
                    ),
                );
                write_string(&a.subject, out);
                push_str(out, &format!(",\"touched\":{}}}", a.touched));
            }
            Event::ShardCall { shard, path, body } => {
                push_str(
                    out,
                    &format!("{{\"type\":\"shard_call\",\"shard\":{shard},\"path\":"),
                );
                write_string(path, out);
                push_str(out, ",\"body\":");
                write_string(&String::from_utf8_lossy(body), out);
                out.push(b'}');
            }
        }
    }
    out.push(b']');
}

fn events_string(events: &[Event]) -> String {
    let mut out = Vec::new();
    events_json(events, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Sets a field of an object this module just made (which cannot refuse it).
fn set(o: &js_sys::Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(o, &JsValue::from_str(key), value);
}

/// JSON text this module wrote, as JavaScript values.
fn parsed(json: &str) -> JsValue {
    js_sys::JSON::parse(json).unwrap_or(JsValue::NULL)
}

/// A JSON value the core made, as a JavaScript value (through its canonical text).
fn value_js(value: &relay_core::wire::json::Value) -> JsValue {
    parsed(&String::from_utf8(canonical::to_vec(value)).unwrap_or_default())
}

/// Events as JavaScript objects (`Event`).
fn events_js(events: &[Event]) -> JsValue {
    parsed(&events_string(events))
}

/// An answer to write as it is (`Answer`): `{status, headers, effects?, body}`.
fn answer_js(r: &Response) -> JsValue {
    let o = js_sys::Object::new();
    set(&o, "status", &JsValue::from(r.status));
    let headers = js_sys::Object::new();
    for (k, v) in &r.headers {
        set(&headers, k, &JsValue::from_str(v));
    }
    set(&o, "headers", &headers);
    if !r.effects.is_empty() {
        set(&o, "effects", &events_js(&r.effects));
    }
    set(&o, "body", &Uint8Array::from(r.body.as_slice()));
    o.into()
}

/// A step other than an answer: `{key: value}`.
fn step_value(key: &str, value: &relay_core::wire::json::Value) -> JsValue {
    let o = js_sys::Object::new();
    set(&o, key, &value_js(value));
    o.into()
}

/// A step as `handle` returns it (`Step`): an answer, `{parked}`, `{upgrade}` or `{backup}`.
fn step_js(step: Step) -> JsValue {
    use relay_core::wire::json::{Object, Value};
    match step {
        Step::Respond(r) => answer_js(&r),
        Step::Parked(p) => step_value("parked", &parked_json(&p)),
        Step::Upgrade(u) => {
            let mut o = Object::new();
            o.insert("token", u.token);
            o.insert("account", u.account);
            o.insert("device_id", u.device_id);
            o.insert("expires_at", u.expires_at);
            // The close the host makes at expires_at (the core's, so no host spells it).
            let mut close = Object::new();
            close.insert(
                "code",
                u64::from(relay_core::transport::socket::SESSION_CLOSED),
            );
            close.insert("reason", relay_core::transport::socket::EXPIRED);
            o.insert("expiry_close", close);
            step_value("upgrade", &Value::Object(o))
        }
        Step::Backup { path } => step_value("backup", &Value::from(path.as_str())),
    }
}

/// A frame's answer as `message` returns it (`Frame`): `{text, close?, effects?, parked?}`;
/// a parked frame has no text yet (its answer comes back from a report).
fn frame_js(a: relay_core::transport::Answer) -> JsValue {
    let o = js_sys::Object::new();
    set(&o, "text", &JsValue::from_str(&a.text));
    if let Some((code, reason)) = a.close {
        set(
            &o,
            "close",
            &Array::of2(&JsValue::from(code), &JsValue::from_str(reason)),
        );
    }
    if !a.effects.is_empty() {
        set(&o, "effects", &events_js(&a.effects));
    }
    if let Some(p) = &a.parked {
        set(&o, "parked", &value_js(&parked_json(p)));
    }
    o.into()
}

/// `{"key"?: {relay, url, timeout_ms}, "route"?: {account, shard, path, body}}`: the fetch a
/// parked request needs started (neither: one under way brings it).
fn parked_json(p: &Parked) -> relay_core::wire::json::Value {
    use relay_core::wire::json::{Object, Value};
    let mut o = Object::new();
    match &p.start {
        Some(Need::Key {
            relay,
            url,
            timeout_ms,
        }) => {
            let mut k = Object::new();
            k.insert("relay", relay.as_str());
            k.insert("url", url.as_str());
            k.insert("timeout_ms", *timeout_ms);
            o.insert("key", k);
        }
        Some(Need::Route(w)) => o.insert("route", route_wanted(w)),
        None => {}
    }
    Value::Object(o)
}

#[wasm_bindgen(typescript_custom_section)]
const RESUMED: &'static str = r#"
/** A parked request's step, handed back by the report of the fetch it waited for (the
 * WIT's `resumed`): an HTTP request's step as `handle` returns one, or a WebSocket frame's
 * answer as `message` returns one, under the ticket the host gave it. */
export type Resumed =
  | { ticket: number; step: Step }
  | { ticket: number; frame: Frame };

/** What the host must do after a call (the WIT's `event`), by `type`: `send` (POST `body` to
 * `url` with `headers`, report with `fetched`), `wake` (tick at `at`), `notify`, `close`,
 * `accepted`, `delivery_ended`, `operator_action`, `shard_call`. */
export type Event = { type: string; [field: string]: any };
/** An answer to write as it is (the WIT's `http-response`): status, headers, the events it
 * carries, the body's bytes. */
export interface Answer { status: number; headers: Record<string, string>; effects?: Event[]; body: Uint8Array }
/** A WebSocket upgrade's session (the WIT's `upgrade`), with the close to make at `expires_at`. */
export interface Upgrade { token: string; account: string; device_id: string; expires_at: number; expiry_close: { code: number; reason: string } }
/** The fetch a parked request needs started (the WIT's `parked`; neither: one under way brings it). */
export interface Parked {
  key?: { relay: string; url: string; timeout_ms: number };
  route?: { account: string; shard: number; path: string; body: string };
}
/** What the core makes of a request (the WIT's `step`). */
export type Step = Answer | { parked: Parked } | { upgrade: Upgrade } | { backup: string };
/** The answer to a WebSocket message (the WIT's `ws-answer`): the frame to send, then maybe a
 * close; `parked`: the frame waits in the core (no text yet). */
export interface Frame { text: string; close?: [number, string]; effects?: Event[]; parked?: Parked }
/** What a tick did (the WIT's `tick-report`). */
export interface TickReport { events: Event[]; quarantined?: { entry: string; code: string; message: string; at: number }[]; error?: string }
"#;

/// Resumptions as JavaScript objects (`Resumed`).
fn resumed_array(resumed: Vec<Resumed>) -> Array {
    let out = Array::new();
    for r in resumed {
        let o = js_sys::Object::new();
        let _ = Reflect::set(&o, &"ticket".into(), &JsValue::from(r.ticket));
        let _ = match r.resumption {
            Resumption::Step(s) => Reflect::set(&o, &"step".into(), &step_js(s)),
            Resumption::Frame(a) => Reflect::set(&o, &"frame".into(), &frame_js(a)),
        };
        out.push(&o);
    }
    out
}

/// `{"account", "shard", "path", "body"}` of a route a call waits for: the request to POST to
/// that shard (the core's), then report with `routeFetched`.
fn route_wanted(w: &relay_core::transport::RouteWanted) -> relay_core::wire::json::Value {
    use relay_core::wire::json::{Object, Value};
    let ask = w.request();
    let mut o = Object::new();
    o.insert("account", w.account.as_str());
    o.insert("shard", u64::from(w.shard));
    o.insert("path", ask.path);
    o.insert("body", String::from_utf8_lossy(&ask.body).into_owned());
    Value::Object(o)
}

#[wasm_bindgen(typescript_custom_section)]
const FETCH_OUTCOME: &'static str = r#"
/** What a host saw of an exchange it made for the core (the WIT's `fetch`): the peer's
 * answer, never sent (no connection was made), or unknown (it may have arrived). */
export type FetchOutcome =
  | { kind: 'answered'; status: number; body: Uint8Array }
  | { kind: 'not_sent' }
  | { kind: 'unknown' };
"#;

/// A `FetchOutcome` from JavaScript as the WIT's `fetch`; anything else is unknown (always safe).
fn fetch_of(outcome: &JsValue) -> Fetch {
    let field =
        |name: &str| Reflect::get(outcome, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED);
    match field("kind").as_string().as_deref() {
        Some("answered") => {
            let status = field("status")
                .as_f64()
                .unwrap_or(0.0)
                .clamp(0.0, f64::from(u16::MAX)) as u16;
            let body = field("body");
            let body = if body.is_instance_of::<Uint8Array>() {
                Uint8Array::from(body).to_vec()
            } else {
                Vec::new()
            };
            Fetch::Answered(status, body)
        }
        Some("not_sent") => Fetch::NotSent,
        _ => Fetch::Unknown,
    }
}

#[wasm_bindgen(typescript_custom_section)]
const TYPED: &'static str = r#"
/** A protocol error object as the wire carries it (the WIT's `error-object`). */
export interface ErrorObject { code: string; message: string; data?: string }
/** Why a typed call was refused (the WIT's `failure`): nothing was committed. */
export interface Failure { code: string; status: number; error: ErrorObject }
/** The seed's DeliveryStatus (the WIT's `delivery-status`); times in Unix milliseconds. */
export interface DeliveryStatus {
  messageId: string; from: string; to: string;
  status: 'delivering' | 'target-accepted' | 'failed';
  acceptedAt: number; deadline?: number; targetAcceptedAt?: number; error?: ErrorObject;
}
/** A DeliveryStatus and the events to carry out (the WIT's `delivery`). */
export interface Delivery { status: DeliveryStatus; events: object[] }
/** One timeline entry; its signed objects are canonical JSON text (the WIT's `timeline-entry`). */
export interface TimelineEntry {
  seq: number; kind: 'sent' | 'received' | 'self-delivery'; acceptedAt: number; expiresAt: number;
  envelope: string; deviceCertificate: string; keyBox: string;
}
/** A page of the timeline and the events to carry out (the WIT's `timeline-page`). */
export interface TimelinePage { entries: TimelineEntry[]; next: number; hasMore: boolean; events: object[] }
"#;

/// A typed answer as JavaScript: the record with `events` beside its fields (as the WIT's
/// records carry them), or the refusal thrown as an `Error` with the `Failure` as `payload`.
fn typed<T: serde::Serialize>(
    r: relay_core::transport::typed::Outcome<T>,
) -> Result<JsValue, JsValue> {
    let ser = serde_wasm_bindgen::Serializer::json_compatible();
    match r {
        Ok(t) => {
            let v = t.value.serialize(&ser)?;
            Reflect::set(&v, &"events".into(), &events_js(&t.events))?;
            Ok(v)
        }
        Err(f) => Err(failure_js(&f)?),
    }
}

/// A typed call's refusal as JavaScript throws it: an `Error` whose `payload` is the
/// `Failure` (as jco throws a WIT `result`'s error).
fn failure_js(f: &relay_core::transport::typed::Failure) -> Result<JsValue, JsValue> {
    let ser = serde_wasm_bindgen::Serializer::json_compatible();
    let e = js_sys::Error::new(&format!("{}: {}", f.error.code, f.error.message));
    Reflect::set(&e, &"payload".into(), &f.serialize(&ser)?)?;
    Ok(e.into())
}

/// A DeliveryStatus answer as the WIT's `delivery`: `{status, events}`.
fn typed_delivery(
    r: relay_core::transport::typed::Outcome<relay_core::transport::typed::DeliveryStatus>,
) -> Result<JsValue, JsValue> {
    typed(r.map(|t| relay_core::transport::typed::Typed {
        value: DeliveryJs { status: t.value },
        events: t.events,
    }))
}

/// The WIT's `delivery` record less its events (added beside).
#[derive(serde::Serialize)]
struct DeliveryJs {
    status: relay_core::transport::typed::DeliveryStatus,
}

/// One relay core over a JS storage object: the engine behind the transports
/// (`relay_core::transport`). Requests, WebSocket messages and exchange outcomes go in as
/// bytes, strings and numbers; what comes out is typed objects that mirror the WIT's records
/// (`Step`, `Answer`, `Frame`, `Event`, `TickReport`, `Resumed`, `Delivery`, `TimelinePage`),
/// declared in the generated `.d.ts`.
#[wasm_bindgen]
pub struct RelayCore {
    relay: Relay<Grouped<JsStorage>, JsEntropy>,
    seed: [u8; 32],
}

#[wasm_bindgen]
impl RelayCore {
    /// Starts the relay: config JSON `{relay, network, policies?}`, a storage object, the
    /// relay's 32-byte key seed, and the operator token (none: no operator API).
    #[wasm_bindgen(constructor)]
    pub fn new(
        config: &str,
        storage: JsValue,
        relay_seed: &[u8],
        operator_token: Option<String>,
    ) -> Result<RelayCore, JsValue> {
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
        let mut engine = Engine::new(config, Grouped::new(store), JsEntropy);
        // The store's schema version first: a store written by a newer relay is refused
        // here, with the core's message, before anything reads it.
        engine
            .open_store()
            .map_err(|e| JsValue::from_str(&e.to_string()))?;
        // The installed host crypto (setHostCrypto) is asked first; without one, or for
        // what it declines, the core's own decides.
        engine.set_crypto(Crypto::with_host(Some(host_verify), Some(host_sha256)));
        Ok(RelayCore {
            relay: Relay::new(engine, &seed, operator_token.as_deref()),
            seed,
        })
    }

    /// Opens a commit group: the following calls' commits wait for `flushGroup` (the core's
    /// group commit, the same the wasmtime host uses).
    #[wasm_bindgen(js_name = beginGroup)]
    pub fn begin_group(&mut self) {
        self.relay.engine().store_mut().begin();
    }

    /// Commits the open group's writes in one storage commit and closes it; whether there
    /// was anything to write. On error every write of the group is gone.
    #[wasm_bindgen(js_name = flushGroup)]
    pub fn flush_group(&mut self) -> Result<bool, JsValue> {
        let store = self.relay.engine().store_mut();
        let wrote = store.has_writes();
        store.flush().map_err(|e| JsValue::from_str(&e.0))?;
        Ok(wrote)
    }

    /// The request headers the core reads, lowercase, comma-separated.
    #[wasm_bindgen(js_name = requestHeaders)]
    pub fn request_headers() -> String {
        HEADERS.join(",")
    }

    /// Handles a request read whole. `headers` is `name\nvalue\n` for each header of
    /// `requestHeaders` present; `origin` the peer's IP address (none in process); `ticket`
    /// the host's name for the request, unique among those still parked. Returns the `Step`:
    /// an `Answer` (`{status, headers, effects?, body}`), or `{upgrade}`, `{backup: path}`, or
    /// `{parked: {key?: {relay, url, timeout_ms}, route?: {account, shard, path, body}}}`: the
    /// request waits in the core; start the fetch it names (GET the key document; POST `body`
    /// to `path` on that shard), report it with `keyFetched` / `routeFetched`, and its step
    /// comes back from that report under `ticket`.
    #[allow(clippy::too_many_arguments)]
    #[wasm_bindgen(unchecked_return_type = "Step")]
    pub fn handle(
        &mut self,
        admin: bool,
        method: String,
        path: String,
        query: String,
        headers: &str,
        body: Vec<u8>,
        origin: Option<String>,
        ticket: u32,
        now: f64,
    ) -> JsValue {
        let req = Request::from_lines(admin, method, path, query, headers, body, origin);
        step_js(self.relay.handle(&req, ticket, now as u64))
    }

    /// Requests and frames parked in this core now, waiting for a fetch's report.
    pub fn parked(&self) -> u32 {
        self.relay.parked() as u32
    }

    /// A `send` event of a sibling shard whose `shard` names this core (its `url` and
    /// `body`), run as the relay's own call with no relay authentication: the `Answer`, for
    /// the sibling's `fetched`. A host passes nothing else here.
    #[wasm_bindgen(unchecked_return_type = "Answer")]
    pub fn sibling(&mut self, url: &str, body: &[u8], now: f64) -> JsValue {
        answer_js(&self.relay.sibling(url, body, now as u64))
    }

    /// Reports the `route.get` a parked step named on the sibling shard: the parked
    /// requests it answers (and any no report reached in time, busy).
    #[wasm_bindgen(js_name = routeFetched, unchecked_return_type = "Resumed[]")]
    pub fn route_fetched(
        &mut self,
        account: &str,
        #[wasm_bindgen(unchecked_param_type = "FetchOutcome")] outcome: JsValue,
        now: f64,
    ) -> Array {
        resumed_array(
            self.relay
                .route_fetched(account, fetch_of(&outcome), now as u64),
        )
    }

    /// The shard (of `count`) whose core handles this request: `handle`'s arguments
    /// without the time. A relay of one shard needs no router.
    #[wasm_bindgen(js_name = shardOf)]
    pub fn shard_of(
        admin: bool,
        method: String,
        path: String,
        query: String,
        headers: &str,
        body: Vec<u8>,
        count: u32,
    ) -> u32 {
        let req = Request::from_lines(admin, method, path, query, headers, body, None);
        relay_core::transport::placement::shard_of(&req, count)
    }

    /// Reports the GET of the key document a parked step named for `relay`: the parked
    /// requests it answers (and any no report reached in time, busy).
    #[wasm_bindgen(js_name = keyFetched, unchecked_return_type = "Resumed[]")]
    pub fn key_fetched(
        &mut self,
        relay: &str,
        #[wasm_bindgen(unchecked_param_type = "FetchOutcome")] outcome: JsValue,
        now: f64,
    ) -> Array {
        resumed_array(
            self.relay
                .key_fetched(relay, fetch_of(&outcome), now as u64),
        )
    }

    /// A WebSocket text message of the session `token`: the `Frame` (`{text, close?,
    /// effects?}`), or `{parked, text: ""}`: the frame waits in the core under `ticket`, as
    /// for `handle`'s parked step.
    #[wasm_bindgen(unchecked_return_type = "Frame")]
    pub fn message(
        &mut self,
        token: &str,
        origin: Option<String>,
        text: &str,
        ticket: u32,
        now: f64,
    ) -> JsValue {
        frame_js(
            self.relay
                .message(token, origin.as_deref(), text, ticket, now as u64),
        )
    }

    /// Reports what became of a `send` event the host carried: the events to carry out.
    #[wasm_bindgen(unchecked_return_type = "Event[]")]
    pub fn fetched(
        &mut self,
        task: &str,
        attempt: u32,
        #[wasm_bindgen(unchecked_param_type = "FetchOutcome")] outcome: JsValue,
        now: f64,
    ) -> JsValue {
        events_js(
            &self
                .relay
                .fetched(task, attempt, fetch_of(&outcome), now as u64),
        )
    }

    /// Runs what is due: the `TickReport` (`{events, quarantined?: [{entry, code, message,
    /// at}], error?: "code: message"}`); the events end with the next wake-up, if any.
    #[wasm_bindgen(unchecked_return_type = "TickReport")]
    pub fn tick(&mut self, now: f64) -> JsValue {
        let t = self.relay.tick(now as u64);
        let mut out = Vec::with_capacity(128);
        push_str(&mut out, "{\"events\":");
        events_json(&t.events, &mut out);
        if !t.quarantined.is_empty() {
            push_str(&mut out, ",\"quarantined\":[");
            push_str(&mut out, &t.quarantined.join(","));
            out.push(b']');
        }
        if let Some(e) = &t.error {
            push_str(&mut out, ",\"error\":");
            write_string(e, &mut out);
        }
        out.push(b'}');
        parsed(&String::from_utf8(out).unwrap_or_default())
    }

    /// Calls a method in process; `callerKind` is `anonymous`, `session`, `relay` or
    /// `operator`; `origin` as for `handle`. Returns the answer as `handle` does.
    #[wasm_bindgen(unchecked_return_type = "Answer")]
    pub fn call(
        &mut self,
        caller_kind: &str,
        caller_value: &str,
        origin: Option<String>,
        method: &str,
        params: &[u8],
        now: f64,
    ) -> JsValue {
        let r = match Method::parse(method) {
            Some(m) => self.relay.call(
                &caller(caller_kind, caller_value),
                origin.as_deref(),
                m,
                params,
                now as u64,
            ),
            None => Response::fail(relay_core::ErrorCode::NotFound, "unknown method"),
        };
        answer_js(&r)
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
        let r = self.relay.engine().call(
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

    /// message.send for the caller (`kind` and `value` as for `call`), `params` the protocol's
    /// params object as JSON: the WIT's `send`. Throws the refusal (an `Error` whose
    /// `payload` is the `Failure`, as jco throws a WIT `result`'s error); nothing was committed.
    #[wasm_bindgen(unchecked_return_type = "Delivery")]
    pub fn send(
        &mut self,
        kind: &str,
        value: &str,
        params: &[u8],
        now: f64,
    ) -> Result<JsValue, JsValue> {
        let r = self.relay.send(&caller(kind, value), params, now as u64);
        typed_delivery(r)
    }

    /// message.deliver for the caller (a relay), as `send`: the WIT's `deliver`.
    #[wasm_bindgen(unchecked_return_type = "Delivery")]
    pub fn deliver(
        &mut self,
        kind: &str,
        value: &str,
        params: &[u8],
        now: f64,
    ) -> Result<JsValue, JsValue> {
        let r = self.relay.deliver(&caller(kind, value), params, now as u64);
        typed_delivery(r)
    }

    /// message.delivery.status of the caller's message: the WIT's `status`.
    #[wasm_bindgen(unchecked_return_type = "Delivery")]
    pub fn status(
        &mut self,
        kind: &str,
        value: &str,
        message_id: &str,
        now: f64,
    ) -> Result<JsValue, JsValue> {
        let r = self
            .relay
            .status(&caller(kind, value), message_id, now as u64);
        typed_delivery(r)
    }

    /// message.timeline.sync of the caller's device: entries after `after`, at most `limit`
    /// (none: the protocol's default). The WIT's `sync`.
    #[wasm_bindgen(unchecked_return_type = "TimelinePage")]
    pub fn sync(
        &mut self,
        kind: &str,
        value: &str,
        after: f64,
        limit: Option<u32>,
        now: f64,
    ) -> Result<JsValue, JsValue> {
        let r = self
            .relay
            .sync(&caller(kind, value), after as u64, limit, now as u64);
        typed(r)
    }

    /// What the engine counted since this instance started, and its destinations' gauges at
    /// `now`, in the Prometheus text exposition format (0.0.4); throws on a storage error.
    pub fn metrics(&mut self, now: f64) -> Result<String, JsValue> {
        self.relay
            .engine()
            .metrics(now as u64)
            .map(|m| m.to_prometheus())
            .map_err(|e| JsValue::from_str(&e.to_string()))
    }

    /// This relay's `/.well-known/relay` document.
    #[wasm_bindgen(js_name = wellKnown)]
    pub fn well_known(&self) -> String {
        String::from_utf8(self.relay.well_known()).unwrap_or_default()
    }

    /// The answer when the host's queue of work for the core is full (503), as `handle` gives it.
    #[wasm_bindgen(unchecked_return_type = "Answer")]
    pub fn busy() -> JsValue {
        answer_js(&Response::busy())
    }

    /// The answer for a call lost before it committed (500), as `handle` gives it.
    #[wasm_bindgen(unchecked_return_type = "Answer")]
    pub fn uncommitted() -> JsValue {
        answer_js(&Response::uncommitted())
    }

    /// The answer of a relay whose core cannot be started (`why`), as `handle` gives it.
    #[wasm_bindgen(js_name = cannotStart, unchecked_return_type = "Answer")]
    pub fn cannot_start(why: &str) -> JsValue {
        answer_js(&Response::cannot_start(why))
    }

    /// The answer to a WebSocket handshake that reached a path taking none.
    #[wasm_bindgen(js_name = misroutedHandshake, unchecked_return_type = "Answer")]
    pub fn misrouted_handshake() -> JsValue {
        answer_js(&Response::misrouted_handshake())
    }

    /// The answer to a backup on a host that writes none (`why`: where its data is backed up).
    #[wasm_bindgen(js_name = noBackup, unchecked_return_type = "Answer")]
    pub fn no_backup(why: &str) -> JsValue {
        answer_js(&Response::no_backup(why))
    }

    /// The refusal of a typed call lost before it committed (a trap): the `Error` the typed
    /// calls throw, its `payload` the `internal` Failure.
    #[wasm_bindgen(js_name = uncommittedFailure)]
    pub fn uncommitted_failure() -> Result<JsValue, JsValue> {
        failure_js(&relay_core::transport::typed::Failure::uncommitted())
    }

    /// The answer to a request the host refused on its own (`transport::Refusal` by name:
    /// `too_large` with the limit, `body_timeout` with the ms, `unreadable_body`,
    /// `unreadable_target`), as `handle` gives answers; it closes the connection.
    #[wasm_bindgen(unchecked_return_type = "Answer")]
    pub fn refused(name: &str, n: f64) -> Result<JsValue, JsValue> {
        let r = relay_core::transport::Refusal::from_name(name, n as u64)
            .ok_or_else(|| JsValue::from(js_sys::Error::new(&format!("no refusal {name}"))))?;
        Ok(answer_js(&Response::refused(r)))
    }

    /// The answer to a backup step: `{"bytes", "path"}` once written, or 500 `internal` with
    /// `error` when it was not; as `handle` gives answers.
    #[wasm_bindgen(js_name = backupAnswer, unchecked_return_type = "Answer")]
    pub fn backup_answer(path: &str, bytes: f64, error: Option<String>) -> JsValue {
        let written = match &error {
            Some(e) => Err(e.as_str()),
            None => Ok(bytes as u64),
        };
        answer_js(&Response::backup(path, written))
    }

    /// The health check a request of `method` on `path` is (`live`, `ready`), if it is one
    /// (`transport::health::Check::of`): the host answers those itself with `healthAnswer`.
    #[wasm_bindgen(js_name = healthCheck)]
    pub fn health_check(method: &str, path: &str) -> Option<String> {
        health::Check::of(method, path).map(|c| c.name().to_string())
    }

    /// The answer to health check `check` (`live`, `ready`), with why the relay is not
    /// ready if it is not; as `handle` gives answers.
    #[wasm_bindgen(js_name = healthAnswer, unchecked_return_type = "Answer")]
    pub fn health_answer(check: &str, not_ready: Option<String>) -> Result<JsValue, JsValue> {
        let check = health::Check::from_name(check).ok_or_else(|| {
            JsValue::from(js_sys::Error::new(&format!("no health check {check}")))
        })?;
        Ok(answer_js(&health::answer(check, not_ready.as_deref())))
    }

    /// The content type of the metrics text (Prometheus text format 0.0.4).
    #[wasm_bindgen(js_name = metricsType)]
    pub fn metrics_type() -> String {
        health::METRICS_TYPE.to_string()
    }

    /// Why a relay is not ready, in the core's words, from what its host knows: shutdown
    /// begun, the core instance not running, the storage refusing commits.
    #[wasm_bindgen(js_name = notReady)]
    pub fn not_ready(stopping: bool, core_down: bool, storage_failing: bool) -> Option<String> {
        let state = health::State {
            stopping,
            core_down,
            storage_failing,
        };
        state.not_ready().map(str::to_string)
    }

    /// The close every WebSocket gets when its relay stops: `[1001, reason]`.
    #[wasm_bindgen(js_name = stoppingClose)]
    pub fn stopping_close() -> js_sys::Array {
        let (code, reason) = socket::STOPPING;
        js_sys::Array::of2(&JsValue::from(code), &JsValue::from(reason))
    }

    /// The answer frame to a WebSocket message when the host's queue of work is full.
    #[wasm_bindgen(js_name = busyFrame)]
    pub fn busy_frame(text: &str) -> String {
        socket::busy_frame(text)
    }

    /// `max_request_bytes` under `policies` (JSON `{name: value}`, as a relay's configuration
    /// gives them; the default when not given): the body limit a host enforces before any
    /// core sees the request.
    #[wasm_bindgen(js_name = maxRequestBytes)]
    pub fn max_request_bytes(policies: &str) -> Result<f64, JsValue> {
        let p: relay_core::engine::Policies = serde_json::from_str(policies)
            .map_err(|e| JsValue::from(js_sys::Error::new(&format!("policies: {e}"))))?;
        Ok(p.max_request_bytes as f64)
    }

    /// `max_batch_bytes` under `policies`: the body limit of [`RelayCore::batch_path`], in
    /// place of `max_request_bytes`, which a host enforces before any core sees the request.
    #[wasm_bindgen(js_name = maxBatchBytes)]
    pub fn max_batch_bytes(policies: &str) -> Result<f64, JsValue> {
        let p: relay_core::engine::Policies = serde_json::from_str(policies)
            .map_err(|e| JsValue::from(js_sys::Error::new(&format!("policies: {e}"))))?;
        Ok(p.body_limit(relay_core::engine::config::BATCH_PATH) as f64)
    }

    /// The path of relay RPC in batches (`message.deliver.batch`), whose body limit is
    /// [`RelayCore::max_batch_bytes`].
    #[wasm_bindgen(js_name = batchPath)]
    pub fn batch_path() -> String {
        relay_core::engine::config::BATCH_PATH.to_string()
    }

    /// The answer frame to a WebSocket message whose call was lost before it committed.
    #[wasm_bindgen(js_name = uncommittedFrame)]
    pub fn uncommitted_frame(text: &str) -> String {
        socket::uncommitted_frame(text)
    }

    /// The transports' counts (`relay_core::transport::host_metrics::Transports`) in the
    /// Prometheus text format, as every host writes them.
    #[wasm_bindgen(js_name = transportMetrics)]
    pub fn transport_metrics(
        open_connections: f64,
        open_websockets: f64,
        refused_limit: f64,
        refused_per_ip: f64,
        busy: f64,
        websockets_dropped: f64,
    ) -> String {
        let mut out = String::new();
        host_metrics::Transports {
            open_connections: open_connections as i64,
            open_websockets: open_websockets as i64,
            refused_limit: refused_limit as u64,
            refused_per_ip: refused_per_ip as u64,
            busy: busy as u64,
            websockets_dropped: websockets_dropped as u64,
        }
        .write(&mut out);
        out
    }

    /// The transport limits every host enforces: JSON `[{"name", "default", "unit"}]`.
    #[wasm_bindgen(js_name = transportLimits)]
    pub fn transport_limits() -> String {
        relay_core::transport::limits::Limits::table_json()
    }

    /// The shards' metrics texts as one exposition, each sample labelled with its shard.
    #[wasm_bindgen(js_name = mergeShardMetrics)]
    pub fn merge_shard_metrics(texts: Vec<String>) -> String {
        relay_core::engine::metrics::merge_shards(&texts)
    }

    /// Why a relay must not connect to address `ip` as a peer (loopback, private, ...), or
    /// nothing when it may: the core's one definition, which hosts check each resolved address against.
    #[wasm_bindgen(js_name = refusedAddress)]
    pub fn refused_address(ip: &str) -> Option<String> {
        relay_core::transport::address::refused_text(ip).map(str::to_string)
    }

    /// Why a relay on `network` must not send to `url` at all (its scheme; off `dev`, not
    /// https; unless `allow_private`, a private IP literal), or nothing: checked before any connection.
    #[wasm_bindgen(js_name = refusedUrl)]
    pub fn refused_url(url: &str, network: &str, allow_private: bool) -> Option<String> {
        relay_core::transport::address::refused_url(url, network, allow_private)
    }

    /// The largest answer a host reads from a peer; a longer one is an unknown outcome.
    #[wasm_bindgen(js_name = maxAnswer)]
    pub fn max_answer() -> u32 {
        relay_core::transport::outbound::MAX_ANSWER as u32
    }

    /// Whether a relay on `network` checks every address a peer's name resolves to.
    #[wasm_bindgen(js_name = vettedAddresses)]
    pub fn vetted_addresses(network: &str, allow_private: bool) -> bool {
        relay_core::transport::address::vetted(network, allow_private)
    }

    /// Signs a relay request as this relay would (for tests that play a peer): headers JSON
    /// `{relay_id, timestamp, nonce, signature}`.
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
        let c = self.relay.engine().config();
        let h = relay_request::sign(
            &self.seed,
            &c.network,
            method,
            &c.relay,
            &to,
            now as u64,
            &nonce,
            body.as_bytes(),
            None,
        );
        let mut o = relay_core::wire::json::Object::new();
        o.insert("relay_id", h.relay_id.as_str());
        o.insert("timestamp", h.timestamp.as_str());
        o.insert("nonce", h.nonce.as_str());
        o.insert("signature", h.signature.as_str());
        Ok(canonical::to_string(
            &relay_core::wire::json::Value::Object(o),
        ))
    }
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

/// The host's timer rules ([`relay_core::transport::alarm`]): a JS host sleeps for
/// `delay(now)` and reports what its ticks did, so every host arms its timer alike.
#[wasm_bindgen]
#[derive(Default)]
pub struct Alarm(relay_core::transport::alarm::Alarm);

#[wasm_bindgen]
impl Alarm {
    /// An alarm that is not armed.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Alarm {
        Alarm::default()
    }

    /// Arms the alarm for `at` (ms) unless it is armed for earlier; true when the host must
    /// re-arm its timer.
    #[wasm_bindgen(js_name = wakeAt)]
    pub fn wake_at(&mut self, at: f64) -> bool {
        self.0.wake_at(at as u64)
    }

    /// The timer fired: disarmed until a wake-up arms it again.
    pub fn fire(&mut self) {
        self.0.fire()
    }

    /// A tick or group commit failed at `now`: a retry is armed; returns its wait (ms).
    pub fn failed(&mut self, now: f64) -> f64 {
        self.0.failed(now as u64) as f64
    }

    /// A tick succeeded: the backoff ends.
    pub fn succeeded(&mut self) {
        self.0.succeeded()
    }

    /// When the timer must fire (ms), or nothing when it is not armed.
    pub fn deadline(&self) -> Option<f64> {
        self.0.deadline().map(|d| d as f64)
    }

    /// How long to sleep from `now` (ms, at least 1), or nothing when not armed.
    pub fn delay(&self, now: f64) -> Option<f64> {
        self.0.delay(now as u64).map(|d| d as f64)
    }
}

/// The relay's side of the host's own metrics (`relay_core::transport::host_metrics`):
/// attempts, commits, ticks, traps. Made in a module that runs no relay, so a trap of the
/// relay's instance keeps them.
#[wasm_bindgen]
#[derive(Default)]
pub struct HostMetrics(host_metrics::HostMetrics);

#[wasm_bindgen]
impl HostMetrics {
    /// No observations yet.
    #[wasm_bindgen(constructor)]
    pub fn new() -> HostMetrics {
        HostMetrics::default()
    }

    /// One outbound attempt that took `seconds`, and what became of it.
    pub fn attempt(
        &self,
        #[wasm_bindgen(unchecked_param_type = "FetchOutcome")] outcome: JsValue,
        seconds: f64,
    ) {
        self.0.attempt(&fetch_of(&outcome), seconds);
    }

    /// One durable commit of `size` operations that took `seconds`.
    pub fn commit(&self, size: u32, seconds: f64) {
        self.0.commit(size as usize, seconds);
    }

    /// One tick of the core that took `seconds`.
    pub fn tick(&self, seconds: f64) {
        self.0.tick_duration.observe(seconds);
    }

    /// The relay's instance trapped.
    pub fn trap(&self) {
        self.0.traps.inc();
    }

    /// A fresh instance replaced a trapped one.
    pub fn restart(&self) {
        self.0.restarts.inc();
    }

    /// These metrics in the Prometheus text format.
    pub fn text(&self) -> String {
        let mut out = String::new();
        self.0.write_relay(&mut out);
        out
    }
}

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

    /// message.send params: `text` encrypted to the devices of the given certificates (a JSON
    /// array), under `message_id` when given (a retry that changes the message reuses it: the
    /// relay answers state_conflict), else a fresh one.
    #[allow(clippy::too_many_arguments)]
    pub fn message(
        &self,
        network: &str,
        to_account: &str,
        recipient_certificates: &str,
        text: &str,
        created_at: f64,
        sender_boxes: bool,
        message_id: Option<String>,
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
        let id = message_id.unwrap_or_else(|| relay_core::client::random_id(&mut JsRng));
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
