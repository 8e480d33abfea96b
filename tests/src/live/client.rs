//! A client that drives real relays over HTTP and WebSocket, as a person's client would:
//! accounts with devices, sessions, routes, messages, status, timeline sync.

use super::host::Relay;
use super::proxy::now_ms;
use crate::{compose, Msg, NET};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::json::{self, Object, Value};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// Blocking HTTP with statuses as values (an error answer is data, not a failure).
pub struct Http {
    agent: ureq::Agent,
}

impl Default for Http {
    fn default() -> Http {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build();
        Http {
            agent: config.into(),
        }
    }
}

impl Http {
    /// An agent for relays started with `opts` (trusting their test CA when they serve TLS).
    pub fn for_opts(opts: &super::host::Opts) -> Http {
        Http {
            agent: super::host::agent_for(opts, Duration::from_secs(30)),
        }
    }

    /// GETs `url`: the status and the body's bytes.
    pub fn get(&self, url: &str) -> (u16, Vec<u8>) {
        let mut resp = self
            .agent
            .get(url)
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .read_to_vec()
            .unwrap_or_else(|e| panic!("GET {url}: reading the answer: {e}"));
        (status, bytes)
    }

    /// POSTs `body`; the status and the parsed answer (`Null` if not JSON).
    pub fn post(&self, url: &str, bearer: Option<&str>, body: &[u8]) -> (u16, Value) {
        let (status, bytes) = self.post_bytes(url, bearer, body);
        (status, json::parse(&bytes).unwrap_or(Value::Null))
    }

    /// POSTs `body`; the status and the answer's bytes, exactly as the relay wrote them.
    pub fn post_bytes(&self, url: &str, bearer: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
        let mut req = self
            .agent
            .post(url)
            .header("content-type", "application/json");
        if let Some(b) = bearer {
            req = req.header("authorization", &format!("Bearer {b}"));
        }
        let mut resp = req.send(body).unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .read_to_vec()
            .unwrap_or_else(|e| panic!("POST {url}: reading the answer: {e}"));
        (status, bytes)
    }
}

/// An account with its devices, as its owner holds it.
pub struct User {
    pub key: AccountKey,
    pub devices: Vec<DeviceKey>,
    pub certs: Vec<Object>,
    pub sessions: Vec<String>,
    /// Where the client talks to its home relay.
    pub api: String,
    /// The home relay's id (the route's `relay`).
    pub relay: String,
    pub revision: u64,
    /// The current route, signed once (publishing it again is then idempotent).
    pub route: Object,
}

impl User {
    /// The account id.
    pub fn id(&self) -> String {
        self.key.id().as_str().to_string()
    }
}

/// The client: HTTP plus a seeded random source for keys, ids and nonces.
pub struct Client {
    pub http: Http,
    pub rng: ChaCha20Rng,
    /// The network its objects are signed for (`dev` unless made `on` another).
    pub net: String,
}

/// The `status` of a DeliveryStatus.
pub fn status_of(v: &Value) -> String {
    crate::status_of(v).to_string()
}

/// The `error.code` of an error answer or a failed DeliveryStatus.
pub fn code_of(v: &Value) -> String {
    crate::field(v, "error")
        .and_then(|e| crate::field(e, "code"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// A string member.
pub fn str_of(v: &Value, name: &str) -> String {
    crate::field(v, name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// An integer member.
pub fn u64_of(v: &Value, name: &str) -> Option<u64> {
    crate::field(v, name).and_then(Value::as_protocol_int)
}

impl Client {
    /// A client whose keys and ids come from `seed`.
    pub fn new(seed: u64) -> Client {
        Client {
            http: Http::default(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            net: NET.to_string(),
        }
    }

    /// A client for relays started with `opts`: objects signed for their network, HTTP
    /// trusting their test CA when they serve TLS.
    pub fn on(seed: u64, opts: &super::host::Opts) -> Client {
        Client {
            http: Http::for_opts(opts),
            rng: ChaCha20Rng::seed_from_u64(seed),
            net: opts.network.clone().unwrap_or_else(|| NET.to_string()),
        }
    }

    fn call(&self, api: &str, method: &str, session: Option<&str>, p: &Object) -> (u16, Value) {
        self.http.post(
            &format!("{api}/v1/{method}"),
            session,
            &canonical::object_to_vec(p),
        )
    }

    /// Signs the account's route at its current revision and home.
    fn sign_route(&self, u: &User) -> Object {
        draft::route(&self.net, &u.key.id(), &u.relay, u.revision, now_ms()).sign(&u.key)
    }

    fn certificate(&self, key: &AccountKey, device: &DeviceKey) -> Object {
        draft::certificate(
            &self.net,
            key,
            device,
            &["send", "sync", "manage"],
            now_ms(),
        )
        .sign(key)
    }

    /// Keys, a certificate and a route naming `relay_id` (any URL: a relay that need not
    /// exist), registered nowhere; `api` is where its client would talk.
    pub fn stranger(&mut self, api: &str, relay_id: &str) -> User {
        let key = AccountKey::generate(&mut self.rng);
        let device = DeviceKey::generate(&mut self.rng);
        let cert = self.certificate(&key, &device);
        let mut u = User {
            key,
            devices: vec![device],
            certs: vec![cert],
            sessions: Vec::new(),
            api: api.to_string(),
            relay: relay_id.to_string(),
            revision: 1,
            route: Object::new(),
        };
        u.route = self.sign_route(&u);
        u
    }

    /// Registers a new account with one device at `relay` and opens its session.
    pub fn register(&mut self, relay: &Relay, discoverable: bool) -> User {
        let mut u = self.unregistered(relay);
        let mut p = Object::new();
        p.insert("route", u.route.clone());
        p.insert("certificate", u.certs[0].clone());
        p.insert("discoverable", discoverable);
        let (s, v) = self.call(&u.api, "account.register", None, &p);
        assert_eq!(s, 200, "account.register at {}: {v:?}", u.api);
        let token = self.open_session(&u, 0);
        u.sessions.push(token);
        u
    }

    /// Keys, a certificate and a route naming `relay`, registered nowhere.
    pub fn unregistered(&mut self, relay: &Relay) -> User {
        self.stranger(&relay.api(), &relay.id())
    }

    /// Adds a device (registered through device 0's session) with its own session.
    pub fn add_device(&mut self, u: &mut User) {
        let (device, cert) = self.new_device(u);
        let mut p = Object::new();
        p.insert("certificate", cert.clone());
        let (s, v) = self.call(&u.api, "device.register", Some(&u.sessions[0]), &p);
        assert_eq!(s, 200, "device.register: {v:?}");
        u.devices.push(device);
        u.certs.push(cert);
        let token = self.open_session(u, u.devices.len() - 1);
        u.sessions.push(token);
    }

    /// A new device of `u` (send, sync, manage) and its certificate, registered nowhere.
    pub fn new_device(&mut self, u: &User) -> (DeviceKey, Object) {
        let device = DeviceKey::generate(&mut self.rng);
        let cert = self.certificate(&u.key, &device);
        (device, cert)
    }

    /// session.open for device `dev` of `u` at `u.api`, naming `u.relay` (which need not be
    /// the account's home): the answer as it came, asserting nothing.
    pub fn try_open_session(&mut self, u: &User, dev: usize) -> (u16, Value) {
        let nonce = random_id(&mut self.rng);
        let so = draft::session_open(
            &self.net,
            &u.relay,
            &u.key.id(),
            &u.devices[dev].id(),
            now_ms(),
            &nonce,
        )
        .sign(&u.devices[dev]);
        self.call(&u.api, "session.open", None, &so)
    }

    /// Opens a session for device `dev` at the account's home.
    pub fn open_session(&mut self, u: &User, dev: usize) -> String {
        let (s, v) = self.try_open_session(u, dev);
        assert_eq!(s, 200, "session.open at {}: {v:?}", u.api);
        str_of(&v, "session")
    }

    /// Publishes the account's current route at `relay` (so it can reach the account).
    pub fn publish(&self, relay: &Relay, u: &User) {
        let mut p = Object::new();
        p.insert("route", u.route.clone());
        let (s, v) = self.call(&relay.api(), "route.publish", None, &p);
        assert_eq!(s, 200, "route.publish at {}: {v:?}", relay.api());
    }

    /// Moves the account to `relay` with the next route revision (its devices re-registered
    /// there), and tells the old home, which learns the account moved.
    pub fn move_to(&mut self, u: &mut User, relay: &Relay, old: &Relay) {
        u.revision += 1;
        u.api = relay.api();
        u.relay = relay.id();
        u.route = self.sign_route(u);
        let mut p = Object::new();
        p.insert("route", u.route.clone());
        p.insert("certificate", u.certs[0].clone());
        p.insert("discoverable", true);
        let (s, v) = self.call(&u.api, "account.register", None, &p);
        assert_eq!(s, 200, "account.register (move) at {}: {v:?}", u.api);
        u.sessions = (0..u.devices.len())
            .map(|d| self.open_session(u, d))
            .collect();
        self.publish(old, u);
    }

    /// message.send params from device 0 of `from` to `to`, created now (+ `m.created_offset`).
    pub fn message(&mut self, from: &User, to: &User, text: &str, m: &Msg) -> Object {
        let created = (now_ms() as i64 + m.created_offset) as u64;
        let sender = compose::Sender {
            key: &from.key,
            devices: &from.devices,
            device: 0,
        };
        compose::message_on(
            &self.net,
            &mut self.rng,
            sender,
            &to.key.id(),
            &to.devices,
            text,
            created,
            m,
        )
    }

    /// A contact invite issued by `issuer`, valid for `ttl` ms.
    pub fn invite(&mut self, issuer: &User, ttl: u64) -> Object {
        let id = random_id(&mut self.rng);
        let now = now_ms();
        draft::invite(&self.net, &id, &issuer.key.id(), now, now + ttl).sign(&issuer.key)
    }

    /// message.send from device 0 of `from`.
    pub fn send(&self, from: &User, p: &Object) -> (u16, Value) {
        self.call(&from.api, "message.send", Some(&from.sessions[0]), p)
    }

    /// message.delivery.status of `id` as seen by `from`'s home.
    pub fn status(&self, from: &User, id: &str) -> (u16, Value) {
        let mut p = Object::new();
        p.insert("message_id", id);
        self.call(
            &from.api,
            "message.delivery.status",
            Some(&from.sessions[0]),
            &p,
        )
    }

    /// message.send from device 0 of `from`: the status and the answer's bytes as written.
    pub fn send_bytes(&self, from: &User, p: &Object) -> (u16, Vec<u8>) {
        self.http.post_bytes(
            &format!("{}/v1/message.send", from.api),
            Some(&from.sessions[0]),
            &canonical::object_to_vec(p),
        )
    }

    /// A method call with device 0's session.
    pub fn call_as(&self, u: &User, method: &str, p: &Object) -> (u16, Value) {
        self.call(&u.api, method, Some(&u.sessions[0]), p)
    }

    /// Polls the status until it is terminal; panics after `within`.
    pub fn wait_terminal(&self, from: &User, id: &str, within: Duration) -> Value {
        let started = Instant::now();
        loop {
            let (_, v) = self.status(from, id);
            let s = status_of(&v);
            if s == "target_accepted" || s == "failed" {
                return v;
            }
            assert!(
                started.elapsed() < within,
                "{id} is still {s:?} after {within:?}: {v:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every timeline entry visible to device `dev` of `u`, page by page.
    pub fn sync(&self, u: &User, dev: usize) -> Vec<Object> {
        let mut after = 0u64;
        let mut out = Vec::new();
        loop {
            let mut p = Object::new();
            p.insert("after", after);
            p.insert("limit", 100u64);
            let (s, v) = self.call(&u.api, "message.timeline.sync", Some(&u.sessions[dev]), &p);
            assert_eq!(s, 200, "message.timeline.sync: {v:?}");
            if let Some(Value::Array(es)) = crate::field(&v, "entries") {
                out.extend(es.iter().filter_map(|e| e.as_object().cloned()));
            }
            after = u64_of(&v, "next").unwrap_or(after);
            if crate::field(&v, "has_more") != Some(&Value::Bool(true)) {
                return out;
            }
        }
    }

    /// `(kind, message_id, text)` of each entry for device `dev`, the text decrypted
    /// with the device's own key box.
    pub fn texts(&self, u: &User, dev: usize) -> Vec<(String, String, String)> {
        self.sync(u, dev)
            .iter()
            .map(|e| decrypt(e, &u.devices[dev]))
            .collect()
    }

    /// An operator call (`admin.*`) to the shard of `account` (a relay of one shard: the
    /// relay), whose deliveries and destinations are that shard's.
    pub fn admin_for(
        &self,
        relay: &Relay,
        account: &str,
        method: &str,
        p: &Object,
    ) -> (u16, Value) {
        let k = relay_core::engine::shard::Shard::of_account(account, relay.shards());
        self.http.post(
            &format!("{}/admin/v1/{method}?shard={k}", relay.admin_api()),
            Some(&relay.admin_token()),
            &canonical::object_to_vec(p),
        )
    }

    /// An operator call (`admin.*`) with the relay's token, on its admin listener.
    pub fn admin(&self, relay: &Relay, method: &str, p: &Object) -> (u16, Value) {
        self.http.post(
            &format!("{}/admin/v1/{method}", relay.admin_api()),
            Some(&relay.admin_token()),
            &canonical::object_to_vec(p),
        )
    }

    /// The relay's pending deliveries (its operator's view).
    pub fn pending(&self, relay: &Relay) -> Vec<Value> {
        let mut p = Object::new();
        p.insert("state", "pending");
        let (s, v) = self.admin(relay, "deliveries", &p);
        assert_eq!(s, 200, "admin.deliveries: {v:?}");
        crate::field(&v, "deliveries")
            .and_then(crate::array)
            .unwrap_or_default()
    }
}

/// `(kind, message_id, text)` of an entry, decrypted by `device`.
pub fn decrypt(e: &Object, device: &DeviceKey) -> (String, String, String) {
    let entry = Value::Object(e.clone());
    let env = crate::field(&entry, "envelope")
        .cloned()
        .unwrap_or(Value::Null);
    let kind = str_of(&entry, "kind");
    let id = str_of(&env, "message_id");
    let text = crate::field(&entry, "key_box")
        .and_then(Value::as_object)
        .and_then(|kb| seal::open_key_box(kb, device))
        .and_then(|key| {
            let body = crate::field(&env, "body")?.as_object()?;
            seal::open_body(body, &key)
        })
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|| "<does not decrypt>".into());
    (kind, id, text)
}

/// A device's WebSocket: calls answered by id, notifications queued.
pub struct Socket {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Notifications that arrived while waiting for an answer.
    pub notifications: Vec<Value>,
}

impl Socket {
    /// Connects device `dev` of `u` (session as `?session=`).
    pub fn connect(u: &User, dev: usize) -> Socket {
        let url = format!(
            "{}/v1/ws?session={}",
            u.api.replacen("http://", "ws://", 1),
            u.sessions[dev]
        );
        let (ws, _) = tungstenite::connect(url.as_str()).expect("WebSocket upgrade");
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        }
        Socket {
            ws,
            next_id: 1,
            notifications: Vec::new(),
        }
    }

    fn read(&mut self) -> Option<Value> {
        match self.ws.read() {
            Ok(Message::Text(t)) => json::parse(t.as_bytes()).ok(),
            Ok(_) => None,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("WebSocket: {e}"),
        }
    }

    /// Calls `method` and waits for its answer (`{"result"}` or `{"error"}`).
    pub fn call(&mut self, method: &str, params: &Object) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = Object::new();
        frame.insert("id", id);
        frame.insert("method", method);
        frame.insert("params", params.clone());
        let text = String::from_utf8(canonical::object_to_vec(&frame)).expect("utf-8");
        self.ws.send(Message::text(text)).expect("WebSocket send");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            let Some(v) = self.read() else { continue };
            if crate::field(&v, "id").and_then(Value::as_protocol_int) == Some(id) {
                return v;
            }
            if crate::field(&v, "method").is_some() {
                self.notifications.push(v);
            }
        }
        panic!("no answer to {method} over the WebSocket");
    }

    /// Waits up to `within` for a notification (queued ones first).
    pub fn notification(&mut self, within: Duration) -> Option<Value> {
        if !self.notifications.is_empty() {
            return Some(self.notifications.remove(0));
        }
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(v) = self.read() {
                if crate::field(&v, "method").is_some() && crate::field(&v, "id").is_none() {
                    return Some(v);
                }
            }
        }
        None
    }
}
