//! A world of relay engines and clients for tests: in-memory relays, accounts with devices,
//! message building, and a network that carries `Effect::Send` between engines.
//!
//! Rule tests drive it step by step; the deterministic simulation drives it
//! with faults. Everything is seeded: a world replays exactly from its seed.

pub mod compose;
pub mod live;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, AccountKey, DeviceKey};
use relay_core::engine::shard::{Shard, SiblingRoute};
use relay_core::engine::{
    Caller, Config, Effect, Engine, MemoryStore, Outcome, PeerMethod, Response,
};
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{Object, Value};
use relay_core::wire::{canonical, json};

/// The network every test world uses.
pub const NET: &str = "dev";
/// The world's start time (ms since epoch).
pub const T0: u64 = 1_800_000_000_000;

/// Seeded entropy for engines in tests (never for production).
pub struct TestEntropy(pub ChaCha20Rng);

impl relay_core::engine::Entropy for TestEntropy {
    fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill_bytes(buf)
    }
}

/// One relay: its storage survives restarts; the engine is rebuilt over it.
pub struct Node {
    pub id: RelayId,
    pub config: Config,
    pub store: MemoryStore,
    pub engine: Engine<MemoryStore, TestEntropy>,
    /// Added to the world's time to give this relay's clock.
    pub skew: i64,
    pub wake: Option<u64>,
    /// `(account, latest_seq)` notifications, in order.
    pub notifications: Vec<(String, u64)>,
    /// Sessions ended by revocation.
    pub ended: Vec<(String, String)>,
    /// Operator actions the engine reported for the audit log, in order.
    pub audit: Vec<relay_core::engine::OperatorAction>,
    pub restarts: u32,
}

impl Node {
    /// Drops the engine and builds a new one over the same storage (a process restart).
    pub fn restart(&mut self, seed: u64) {
        self.engine = Engine::new(
            self.config.clone(),
            self.store.clone(),
            TestEntropy(ChaCha20Rng::seed_from_u64(seed)),
        );
        self.restarts += 1;
        self.wake = self.engine.next_wake().ok().flatten();
    }
}

/// An account with its devices, as a client holds it.
pub struct Account {
    pub key: AccountKey,
    pub devices: Vec<DeviceKey>,
    pub certs: Vec<Object>,
    pub sessions: Vec<String>,
    pub home: usize,
    pub route_revision: u64,
}

impl Account {
    /// The account id as a string.
    pub fn id(&self) -> String {
        self.key.id().as_str().to_string()
    }
}

/// A request in the network from one relay to another.
#[derive(Clone, Debug)]
pub struct InFlight {
    pub source: usize,
    pub task: String,
    pub attempt: u32,
    pub target: RelayId,
    pub method: PeerMethod,
    pub body: Vec<u8>,
    /// A sibling shard of the source's own relay, when the request stays inside it.
    pub shard: Option<u32>,
    /// The recipient's route revision a delivery targets (`Relay-Route-Revision`).
    pub route_revision: Option<u64>,
    /// A batch's other deliveries after `task`, as (task, attempt).
    pub riders: Vec<(String, u32)>,
}

/// What a test asks of a message it builds.
#[derive(Clone, Default)]
pub struct Msg {
    pub sender_boxes: bool,
    pub authorization: Option<Object>,
    pub recipient_route: Option<Object>,
    /// Box only these recipient devices (default: all).
    pub to_devices: Option<Vec<usize>>,
    /// created_at relative to the sender relay's now.
    pub created_offset: i64,
    pub body_expires_at: Option<u64>,
    /// This message_id instead of a random one (to reuse a logical key).
    pub message_id: Option<String>,
}

/// Relays, accounts and a network, all seeded.
pub struct World {
    pub now: u64,
    pub nodes: Vec<Node>,
    pub rng: ChaCha20Rng,
    pub outbox: Vec<InFlight>,
    /// `route.get` calls made for shards that waited for a sibling's route.
    pub route_requests: u64,
    /// Calls a shard handed to a sibling (`Effect::ShardCall`), waiting to run.
    pub shard_calls: Vec<(usize, u32, &'static str, Vec<u8>)>,
}

impl World {
    /// An empty world.
    pub fn new(seed: u64) -> World {
        World {
            now: T0,
            nodes: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            outbox: Vec::new(),
            route_requests: 0,
            shard_calls: Vec::new(),
        }
    }

    /// Adds a relay `http://{name}.test` with default policies, adjusted by `tune`.
    pub fn relay_with(&mut self, name: &str, tune: impl FnOnce(&mut Config)) -> usize {
        let id = RelayId::parse(&format!("http://{name}.test")).expect("relay id");
        let mut config = Config::new(id.clone(), NET);
        tune(&mut config);
        let store = MemoryStore::new();
        let seed = self.rng.gen();
        let engine = Engine::new(
            config.clone(),
            store.clone(),
            TestEntropy(ChaCha20Rng::seed_from_u64(seed)),
        );
        self.nodes.push(Node {
            id,
            config,
            store,
            engine,
            skew: 0,
            wake: None,
            notifications: Vec::new(),
            ended: Vec::new(),
            audit: Vec::new(),
            restarts: 0,
        });
        self.nodes.len() - 1
    }

    /// Adds a relay with default policies.
    pub fn relay(&mut self, name: &str) -> usize {
        self.relay_with(name, |_| {})
    }

    /// Adds a relay `http://{name}.test` of `count` shards: one node per shard, each an
    /// engine with storage of its own, all with the relay's id. Returns shard 0's node.
    pub fn sharded_relay(&mut self, name: &str, count: u32) -> usize {
        let first = self.nodes.len();
        for i in 0..count {
            self.relay_with(name, |c| c.shard = Shard::new(i, count).expect("shard"));
        }
        first
    }

    /// Adds a relay `http://{name}.test` of `count` shards, each with the policies `tune`
    /// gives (then its shard). Returns shard 0's node; shard `i` is node `first + i`.
    pub fn sharded_relay_with(
        &mut self,
        name: &str,
        count: u32,
        tune: impl Fn(&mut Config),
    ) -> usize {
        let first = self.nodes.len();
        for i in 0..count {
            self.relay_with(name, |c| {
                tune(c);
                c.shard = Shard::new(i, count).expect("shard");
            });
        }
        first
    }

    /// The node of relay `id` that serves `account` (the relay's only node, unsharded).
    pub fn node_serving(&self, id: &RelayId, account: &str) -> Option<usize> {
        let mut nodes = self.nodes.iter().enumerate().filter(|(_, n)| &n.id == id);
        let (first, node) = nodes.next()?;
        let count = node.config.shard.count;
        let want = Shard::of_account(account, count);
        std::iter::once((first, node))
            .chain(nodes)
            .find(|(_, n)| n.config.shard.index == want)
            .map(|(i, _)| i)
    }

    /// The node of relay `id` that is shard `index`.
    pub fn shard_node(&self, id: &RelayId, index: u32) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| &n.id == id && n.config.shard.index == index)
    }

    /// The time on relay `n`'s clock.
    pub fn clock(&self, n: usize) -> u64 {
        (self.now as i64 + self.nodes[n].skew) as u64
    }

    fn absorb(&mut self, n: usize, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Send {
                    task,
                    attempt,
                    target,
                    method,
                    body,
                    shard,
                    route_revision,
                    riders,
                } => self.outbox.push(InFlight {
                    source: n,
                    task,
                    attempt,
                    target,
                    method,
                    body,
                    shard,
                    route_revision,
                    riders,
                }),
                Effect::WakeAt(t) => self.nodes[n].wake = Some(t),
                Effect::Notify {
                    account,
                    latest_seq,
                } => self.nodes[n].notifications.push((account, latest_seq)),
                Effect::EndDeviceSessions { account, device_id } => {
                    self.nodes[n].ended.push((account, device_id))
                }
                Effect::Accepted(_) | Effect::DeliveryEnded { .. } => {}
                Effect::OperatorAction(a) => self.nodes[n].audit.push(a),
                Effect::ShardCall { shard, path, body } => {
                    self.shard_calls.push((n, shard, path, body))
                }
            }
        }
        // Run after the call's own effects, as a host runs them after its answer.
        while let Some((n, shard, path, body)) = self.shard_calls.pop() {
            let id = self.nodes[n].id.clone();
            if let Some(sib) = self.shard_node(&id, shard) {
                let method = path.strip_prefix("/v1/").unwrap_or(path);
                let _ = self.call_raw(sib, &Caller::Anonymous, method, &body);
            }
        }
    }

    /// Calls a method on relay `n`; effects go to the world.
    pub fn call(&mut self, n: usize, caller: &Caller, method: &str, params: &Object) -> Response {
        self.call_raw(n, caller, method, &canonical::object_to_vec(params))
    }

    /// Calls a method with raw bytes.
    ///
    /// A call on a shard that waits for a sibling shard's route gets it here as a sharded
    /// host would (`route.get` on the sibling, reported to the engine) and runs again.
    pub fn call_raw(&mut self, n: usize, caller: &Caller, method: &str, params: &[u8]) -> Response {
        let mut asked = 0;
        loop {
            let now = self.clock(n);
            let r = self.nodes[n].engine.call(caller, method, params, now);
            let Some(account) = self.nodes[n].engine.wanted_route() else {
                self.absorb(n, r.effects.clone());
                return r;
            };
            assert!(asked < 2, "a call asked for the route of {account} again");
            asked += 1;
            self.route_requests += 1;
            let id = self.nodes[n].id.clone();
            let answer = match self.node_serving(&id, &account) {
                Some(sib) => {
                    let mut p = Object::new();
                    p.insert("account", account.as_str());
                    let r = self.call(sib, &Caller::Anonymous, "route.get", &p);
                    match r.result {
                        Ok(v) => match field(&v, "route") {
                            Some(Value::Object(o)) => SiblingRoute::Route(o.clone()),
                            _ => SiblingRoute::Failed,
                        },
                        Err(e) if e.code == relay_core::ErrorCode::NotFound => SiblingRoute::Absent,
                        Err(_) => SiblingRoute::Failed,
                    }
                }
                None => SiblingRoute::Failed,
            };
            self.nodes[n].engine.sibling_route(&account, answer);
        }
    }

    /// Reports an outcome to relay `n`.
    pub fn outcome(&mut self, n: usize, task: &str, attempt: u32, outcome: Outcome) {
        let now = self.clock(n);
        let effects = self.nodes[n].engine.outcome(task, attempt, outcome, now);
        self.absorb(n, effects);
    }

    /// Ticks relay `n` at its current time.
    pub fn tick(&mut self, n: usize) {
        let now = self.clock(n);
        let effects = self.nodes[n].engine.tick(now);
        self.absorb(n, effects);
    }

    /// The relay whose id is `id` (its shard 0 when it is sharded).
    pub fn node_of(&self, id: &RelayId) -> Option<usize> {
        self.nodes.iter().position(|n| &n.id == id)
    }

    /// The node a request goes to: the sibling shard it names, or the shard of its target
    /// that the router would pick from its params.
    pub fn target_node(&self, req: &InFlight) -> Option<usize> {
        if let Some(k) = req.shard {
            return self.shard_node(&req.target, k);
        }
        let first = self.node_of(&req.target)?;
        let count = self.nodes[first].config.shard.count;
        let request = relay_core::transport::Request {
            listener: relay_core::transport::Listener::Public,
            method: "POST".into(),
            path: format!("/relay/v1/{}", req.method.as_str()),
            query: String::new(),
            headers: Vec::new(),
            body: req.body.clone(),
            origin: None,
        };
        let k = relay_core::transport::placement::shard_of(&request, count);
        self.shard_node(&req.target, k)
    }

    /// Carries one request to its target and its answer back (no faults).
    pub fn carry(&mut self, req: InFlight) {
        let outcome = match self.target_node(&req) {
            Some(t) => {
                let source = self.nodes[req.source].id.clone();
                let caller = Caller::relay_at(source, req.route_revision);
                let r = self.call_raw(t, &caller, req.method.as_str(), &req.body);
                if r.result.is_ok() {
                    Outcome::Result(r.body())
                } else {
                    Outcome::Error(r.body())
                }
            }
            None => Outcome::NotAttempted,
        };
        self.outcome(req.source, &req.task, req.attempt, outcome);
    }

    /// Carries every request until none is left.
    pub fn pump(&mut self) {
        while !self.outbox.is_empty() {
            let req = self.outbox.remove(0);
            self.carry(req);
        }
    }

    /// Advances time by `ms`, ticking relays whose wake-up time has come, and pumps.
    pub fn advance(&mut self, ms: u64) {
        self.advance_without_network(ms);
        self.pump();
    }

    /// Advances time by `ms` and ticks relays whose wake-up time has come; requests stay in the outbox.
    pub fn advance_without_network(&mut self, ms: u64) {
        self.now += ms;
        for n in 0..self.nodes.len() {
            if self.nodes[n].wake.is_some_and(|w| w <= self.clock(n)) {
                self.nodes[n].wake = None;
                self.tick(n);
            }
        }
    }

    /// Runs time forward, wake-up by wake-up, for at most `horizon` ms.
    pub fn run_for(&mut self, horizon: u64) {
        let end = self.now + horizon;
        loop {
            self.pump();
            let next = (0..self.nodes.len())
                .filter_map(|n| {
                    self.nodes[n]
                        .wake
                        .map(|w| (w as i64 - self.nodes[n].skew) as u64)
                })
                .min();
            match next {
                Some(t) if t <= end => {
                    let step = t.saturating_sub(self.now);
                    self.advance(step);
                }
                _ => break,
            }
        }
        self.now = self.now.max(end);
    }

    /// Registers an account at relay `home` with `devices` devices (device 0 has every permission).
    pub fn account(&mut self, home: usize, devices: usize, discoverable: bool) -> Account {
        let key = AccountKey::generate(&mut self.rng);
        // On a sharded relay the account's home node is the shard that serves it.
        let id = self.nodes[home].id.clone();
        let home = self.node_serving(&id, key.id().as_str()).unwrap_or(home);
        let now = self.clock(home);
        let relay = self.nodes[home].id.as_str().to_string();
        let route = draft::route(NET, &key.id(), &relay, 1, now).sign(&key);
        let mut acct = Account {
            key,
            devices: Vec::new(),
            certs: Vec::new(),
            sessions: Vec::new(),
            home,
            route_revision: 1,
        };
        for i in 0..devices {
            let d = DeviceKey::generate(&mut self.rng);
            let cert = draft::certificate(NET, &acct.key, &d, &["send", "sync", "manage"], now)
                .sign(&acct.key);
            if i == 0 {
                let mut p = Object::new();
                p.insert("route", route.clone());
                p.insert("certificate", cert.clone());
                p.insert("discoverable", discoverable);
                let r = self.call(home, &Caller::Anonymous, "account.register", &p);
                r.result.expect("account.register");
            }
            acct.devices.push(d);
            acct.certs.push(cert.clone());
            if i > 0 {
                let mut p = Object::new();
                p.insert("certificate", cert);
                let s = Caller::Session(acct.sessions[0].clone());
                self.call(home, &s, "device.register", &p)
                    .result
                    .expect("device.register");
            }
            let token = self.open_session(&acct, i).expect("session.open");
            acct.sessions.push(token);
        }
        acct
    }

    /// Opens a session for device `dev` of `acct` at its home.
    pub fn open_session(
        &mut self,
        acct: &Account,
        dev: usize,
    ) -> Result<String, relay_core::Error> {
        self.open_session_at(acct, dev, acct.home)
    }

    /// Opens a session for device `dev` of `acct` at relay `n` (a former home, say).
    pub fn open_session_at(
        &mut self,
        acct: &Account,
        dev: usize,
        n: usize,
    ) -> Result<String, relay_core::Error> {
        let now = self.clock(n);
        let nonce = random_id(&mut self.rng);
        let relay = self.nodes[n].id.as_str().to_string();
        let so = draft::session_open(
            NET,
            &relay,
            &acct.key.id(),
            &acct.devices[dev].id(),
            now,
            &nonce,
        )
        .sign(&acct.devices[dev]);
        let r = self
            .call(n, &Caller::Anonymous, "session.open", &so)
            .result?;
        Ok(field(&r, "session")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    /// The session caller of device `dev`.
    pub fn session(acct: &Account, dev: usize) -> Caller {
        Caller::Session(acct.sessions[dev].clone())
    }

    /// Builds message.send params from device `dev` of `from` to `to`.
    pub fn message(
        &mut self,
        from: &Account,
        dev: usize,
        to: &Account,
        text: &str,
        m: &Msg,
    ) -> Object {
        let created = (self.clock(from.home) as i64 + m.created_offset) as u64;
        let sender = compose::Sender {
            key: &from.key,
            devices: &from.devices,
            device: dev,
        };
        compose::message(
            &mut self.rng,
            sender,
            &to.key.id(),
            &to.devices,
            text,
            created,
            m,
        )
    }

    /// A contact grant from `grantor` to `grantee`.
    pub fn grant(&mut self, grantor: &Account, grantee: &Account) -> Object {
        let id = random_id(&mut self.rng);
        draft::grant(
            NET,
            &id,
            &grantor.key.id(),
            &grantee.key.id(),
            self.clock(grantor.home),
        )
        .sign(&grantor.key)
    }

    /// message.send from device `dev` of `from`.
    pub fn send(&mut self, from: &Account, dev: usize, params: &Object) -> Response {
        self.call(
            from.home,
            &World::session(from, dev),
            "message.send",
            params,
        )
    }

    /// message.timeline.sync for device `dev` of `acct`.
    pub fn sync(
        &mut self,
        acct: &Account,
        dev: usize,
        after: u64,
        limit: Option<u64>,
    ) -> Result<Object, relay_core::Error> {
        let mut p = Object::new();
        p.insert("after", after);
        if let Some(l) = limit {
            p.insert("limit", l);
        }
        let r = self.call(
            acct.home,
            &World::session(acct, dev),
            "message.timeline.sync",
            &p,
        );
        // As a client reads it: the answer's bytes, parsed (entries carry stored texts verbatim).
        let body = r.body();
        r.result
            .map(|_| parse(&body).as_object().cloned().unwrap_or_default())
    }

    /// Every entry visible to a device, following pages.
    pub fn sync_all(&mut self, acct: &Account, dev: usize) -> Vec<Object> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self.sync(acct, dev, after, Some(500)).expect("sync");
            for e in page.get("entries").and_then(array).unwrap_or_default() {
                out.push(e.as_object().cloned().unwrap_or_default());
            }
            let next = page
                .get("next")
                .and_then(Value::as_protocol_int)
                .unwrap_or(after);
            let more = page.get("has_more") == Some(&Value::Bool(true));
            assert!(
                next > after || !more,
                "sync cursor did not advance but has_more is set"
            );
            after = next;
            if !more {
                return out;
            }
        }
    }

    /// message.delivery.status of `message_id` for `from`.
    pub fn status(&mut self, from: &Account, message_id: &str) -> Response {
        let mut p = Object::new();
        p.insert("message_id", message_id);
        self.call(
            from.home,
            &World::session(from, 0),
            "message.delivery.status",
            &p,
        )
    }
}

/// The array inside a value.
pub fn array(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) => Some(a.clone()),
        _ => None,
    }
}

/// A string member of an object value.
pub fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.as_object()?.get(name)
}

/// The `status` of a DeliveryStatus value.
pub fn status_of(v: &Value) -> &str {
    field(v, "status").and_then(Value::as_str).unwrap_or("")
}

/// The message id of message.send params.
pub fn message_id(params: &Object) -> String {
    params
        .get("envelope")
        .and_then(|e| field(e, "message_id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The `x-test` text of an entry's envelope body.
pub fn entry_text(entry: &Object) -> String {
    entry
        .get("envelope")
        .and_then(|e| field(e, "body"))
        .and_then(|b| field(b, "x-test"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Parses a JSON body (for assertions on raw responses).
pub fn parse(body: &[u8]) -> Value {
    json::parse(body).expect("json")
}

impl World {
    /// The message.deliver params a source would build from message.send params.
    pub fn deliver_params(from: &Account, dev: usize, send: &Object) -> Object {
        let mut p = Object::new();
        p.insert(
            "envelope",
            send.get("envelope").cloned().unwrap_or(Value::Null),
        );
        p.insert(
            "recipient_boxes",
            send.get("recipient_boxes").cloned().unwrap_or(Value::Null),
        );
        p.insert("device_certificate", from.certs[dev].clone());
        if let Some(a) = send.get("authorization") {
            p.insert("authorization", a.clone());
        }
        p
    }

    /// Calls message.deliver on relay `n` as relay `source`, aimed at the revision of the
    /// recipient's route that `n` answers `route.get` with (1 when it holds none), as a
    /// source that knows the current route would.
    pub fn deliver(&mut self, n: usize, source: &str, params: &Object) -> Response {
        let to = params
            .get("envelope")
            .and_then(Value::as_object)
            .and_then(|e| e.get("to"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut q = Object::new();
        q.insert("account", to);
        let revision = self
            .call(n, &Caller::Anonymous, "route.get", &q)
            .result
            .ok()
            .and_then(|v| {
                v.as_object()?
                    .get("route")?
                    .as_object()?
                    .get("revision")?
                    .as_protocol_int()
            })
            .unwrap_or(1);
        self.deliver_at(n, source, params, revision)
    }

    /// Calls message.deliver on relay `n` as relay `source`, aimed at revision `revision` of
    /// the recipient's route (its signed `Relay-Route-Revision`).
    pub fn deliver_at(
        &mut self,
        n: usize,
        source: &str,
        params: &Object,
        revision: u64,
    ) -> Response {
        let caller = Caller::relay_at(RelayId::parse(source).expect("relay id"), Some(revision));
        self.call(n, &caller, "message.deliver", params)
    }

    /// The account's current signed route.
    pub fn route_of(&self, acct: &Account) -> Object {
        let relay = self.nodes[acct.home].id.as_str().to_string();
        draft::route(NET, &acct.key.id(), &relay, acct.route_revision, T0).sign(&acct.key)
    }

    /// Teaches relay `n` the account's current route (route.publish).
    pub fn publish_route(&mut self, n: usize, acct: &Account) {
        let mut p = Object::new();
        p.insert("route", self.route_of(acct));
        self.call(n, &Caller::Anonymous, "route.publish", &p)
            .result
            .expect("route.publish");
    }

    /// Moves an account to relay `to` (route revision + 1, device 0 registered there, sessions reopened).
    pub fn migrate(&mut self, acct: &mut Account, to: usize) {
        // On a sharded relay the new home is the shard that serves the account.
        let id = self.nodes[to].id.clone();
        let to = self.node_serving(&id, &acct.id()).unwrap_or(to);
        acct.route_revision += 1;
        acct.home = to;
        let route = self.route_of(acct);
        let mut p = Object::new();
        p.insert("route", route);
        p.insert("certificate", acct.certs[0].clone());
        p.insert("discoverable", true);
        self.call(to, &Caller::Anonymous, "account.register", &p)
            .result
            .expect("register at new home");
        for i in 1..acct.devices.len() {
            let mut p = Object::new();
            p.insert("certificate", acct.certs[i].clone());
            let s = Caller::Session(self.open_session(acct, 0).expect("session"));
            self.call(to, &s, "device.register", &p)
                .result
                .expect("device.register");
        }
        acct.sessions = (0..acct.devices.len())
            .map(|i| self.open_session(acct, i).expect("session"))
            .collect();
    }

    /// Pops every request in the network without delivering it.
    pub fn take_outbox(&mut self) -> Vec<InFlight> {
        std::mem::take(&mut self.outbox)
    }

    /// Number of timeline records an account has at relay `n` (any kind, any visibility).
    pub fn record_count(&self, n: usize, acct: &Account) -> usize {
        let prefix = format!("tl/{}/", acct.id());
        self.nodes[n]
            .store
            .snapshot()
            .keys()
            .filter(|k| k.starts_with(prefix.as_bytes()))
            .count()
    }

    /// Operator listing of deliveries at relay `n`.
    pub fn deliveries(&mut self, n: usize, state: Option<&str>) -> Vec<Value> {
        let mut p = Object::new();
        if let Some(s) = state {
            p.insert("state", s);
        }
        let r = self
            .call(n, &Caller::Operator, "admin.deliveries", &p)
            .result
            .expect("admin.deliveries");
        field(&r, "deliveries").and_then(array).unwrap_or_default()
    }
}

/// The error code of a response.
pub fn code_of(r: &Response) -> &'static str {
    match &r.result {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    }
}

/// An error body as a peer would send it.
pub fn error_body(code: &str, data: Option<&str>) -> Vec<u8> {
    match data {
        Some(d) => {
            format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"test\",\"data\":{d}}}}}")
                .into_bytes()
        }
        None => format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"test\"}}}}").into_bytes(),
    }
}
