//! Every engine method through an in-memory world, with the engine's invariants as the oracle.
//!
//! A [`Fixture`] is built once per process with the test harness
//! (`relay_tests::World`): two relays `http://a.test` and `http://b.test`, four
//! registered accounts (two per relay, with one or two devices, discoverable or
//! not) with open sessions, and every route published at both relays. Each
//! input starts from copies of those stores and is read as a program of up to
//! [`MAX_OPS`] operations: calls of any method (with params built by the
//! client builders and signed, so they pass the shape and signature checks and
//! reach acceptance, delivery and the timeline, then given a defect when the
//! input says so, or raw bytes), from the natural caller or any other, at the
//! world's time or any other; carrying relay requests between the relays (or
//! reporting any outcome instead); ticks; time jumps; restarts; policy changes;
//! relay authentication (`authenticate_relay`) and `session_info`.
//!
//! Oracle, on every answer: no panic; the body is strict canonical JSON; an
//! error has a protocol code, is never `internal` (memory storage cannot
//! fail), emits no effect and commits nothing; `message.send`,
//! `message.deliver` and `message.delivery.status` answer well-formed
//! DeliveryStatus values whose `accepted_at`/`deadline` never change and
//! whose terminal status never changes; a sync page holds parseable objects
//! in increasing sequence and no message twice; an identical call repeated
//! at once answers identically (or is rate limited, except the idempotent
//! message.send and message.deliver), session.open excepted (its nonce is
//! spent); effects are well formed; ticks commit; after restarts the state
//! loads (next wake-up, a tick, every stored value a JSON record, the relay's
//! well-known document reads back); an authenticated relay request's nonce is refused
//! when it comes again; `session_info` names the device the session was opened for.

use crate::input::Input;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::engine::{Caller, Config, Effect, Engine, MemoryStore, Outcome, Response, Storage};
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::identity::{AccountId, DeviceId, RelayId};
use relay_core::wire::json::{self, Number, Object, Value, MAX_SAFE_INTEGER};
use relay_core::wire::key_box::KeyBox;
use relay_core::wire::{base64url, canonical, relay_request};
use relay_core::ErrorCode;
use relay_tests::{TestEntropy, World, NET};
use std::collections::{BTreeMap, HashMap};

/// Operations read from one input at most.
pub const MAX_OPS: usize = 40;

/// Bytes of input per operation: the first byte of an input seeds the world's
/// randomness, then each operation decodes from its own chunk (zero-padded), so a
/// mutation changes one operation and a script is easy to write.
pub const CHUNK: usize = 48;

/// Every method of the engine, in dispatch order.
pub use relay_core::engine::METHODS;

/// An account as its client holds it.
#[derive(Clone)]
struct Acct {
    key: AccountKey,
    devices: Vec<DeviceKey>,
    certs: Vec<Object>,
    /// A session token per device, at the account's home.
    sessions: Vec<Option<String>>,
    home: usize,
    revision: u64,
}

impl Acct {
    fn id(&self) -> String {
        self.key.id().as_str().to_string()
    }
}

/// The world every input starts from.
pub struct Fixture {
    configs: Vec<Config>,
    stores: Vec<BTreeMap<Vec<u8>, Vec<u8>>>,
    now: u64,
    accounts: Vec<Acct>,
}

impl Fixture {
    /// Two relays and four accounts with sessions, routes published everywhere.
    pub fn build() -> Fixture {
        let mut w = World::new(19);
        let a = w.relay("a");
        let b = w.relay("b");
        let accounts = [(a, 2, true), (a, 1, false), (b, 2, true), (b, 1, false)]
            .map(|(home, devices, discoverable)| w.account(home, devices, discoverable));
        for acct in &accounts {
            for n in [a, b] {
                if n != acct.home {
                    w.publish_route(n, acct);
                }
            }
        }
        Fixture {
            configs: w.nodes.iter().map(|n| n.config.clone()).collect(),
            stores: w.nodes.iter().map(|n| n.store.snapshot()).collect(),
            now: w.now,
            accounts: accounts
                .into_iter()
                .map(|a| Acct {
                    sessions: a.sessions.iter().cloned().map(Some).collect(),
                    key: a.key,
                    devices: a.devices,
                    certs: a.certs,
                    home: a.home,
                    revision: a.route_revision,
                })
                .collect(),
        }
    }
}

thread_local! {
    static FIXTURE: Fixture = Fixture::build();
}

/// The engine target: see the module documentation for the program and the oracle.
pub fn engine(data: &[u8]) {
    FIXTURE.with(|fx| Sim::new(fx, data).run());
}

struct Node {
    id: RelayId,
    config: Config,
    store: MemoryStore,
    engine: Engine<MemoryStore, TestEntropy>,
    wake: Option<u64>,
    restarts: u64,
}

impl Node {
    fn new(config: Config, store: MemoryStore, seed: u64) -> Node {
        let engine = Engine::new(
            config.clone(),
            store.clone(),
            TestEntropy(ChaCha20Rng::seed_from_u64(seed)),
        );
        Node {
            id: config.relay.clone(),
            config,
            store,
            engine,
            wake: None,
            restarts: 0,
        }
    }
}

/// A relay request in the network.
#[derive(Clone)]
struct InFlight {
    source: usize,
    task: String,
    attempt: u32,
    target: RelayId,
    method: &'static str,
    body: Vec<u8>,
    route_revision: Option<u64>,
}

/// What a DeliveryStatus promised: these never change while the record lives.
#[derive(Clone, Debug)]
struct Promise {
    accepted_at: u64,
    deadline: Option<u64>,
    terminal: Option<String>,
}

/// A call to make.
struct Request {
    node: usize,
    caller: Caller,
    method: String,
    params: Vec<u8>,
    /// (from, message_id, to) of the envelope the final params carry (send and deliver).
    envelope: Option<(String, String, String)>,
    /// Who gets the session an accepted session.open returns: (account, device).
    opens: Option<(usize, usize)>,
    /// An account an accepted account.register adds or moves.
    registers: Option<Acct>,
    /// A device an accepted device.register adds: (account, device, certificate).
    adds: Option<(usize, DeviceKey, Object)>,
}

/// A timeline entry's identity: (relay, account, kind, from, message_id).
type EntryKey = (usize, String, String, String, String);

struct Sim<'a> {
    /// The current operation's bytes.
    m: Input<'a>,
    /// The fixture's time, which traces count from.
    start: u64,
    /// The network address the current call comes from (`None`: from inside the host).
    origin: Option<String>,
    /// The operations' chunks not read yet.
    program: std::slice::Chunks<'a, u8>,
    nodes: Vec<Node>,
    now: u64,
    accounts: Vec<Acct>,
    outbox: Vec<InFlight>,
    rng: ChaCha20Rng,
    /// message.send params built so far (for exact repeats and conflicts).
    sends: Vec<(usize, Object)>,
    message_ids: Vec<String>,
    /// (issuer, grant_id or invite_id).
    authorizations: Vec<(usize, String, bool)>,
    nonces: Vec<String>,
    /// (node, from, message_id) at the source.
    promises: HashMap<(usize, String, String), Promise>,
    /// (node, from, message_id) at the destination: its accepted_at.
    receipts: HashMap<(usize, String, String), u64>,
    /// (node, account, kind, from, message_id) -> (seq, accepted_at) of timeline entries.
    entries: HashMap<EntryKey, (u64, u64)>,
}

impl<'a> Sim<'a> {
    fn new(fx: &Fixture, data: &'a [u8]) -> Sim<'a> {
        let (seed, program) = match data.split_first() {
            Some((s, rest)) => (u64::from(*s), rest),
            None => (0, data),
        };
        let nodes = fx
            .configs
            .iter()
            .zip(&fx.stores)
            .enumerate()
            .map(|(i, (config, snapshot))| {
                let mut store = MemoryStore::new();
                store
                    .commit(
                        snapshot
                            .iter()
                            .map(|(k, v)| (k.clone(), Some(v.clone())))
                            .collect(),
                    )
                    .expect("memory commit");
                Node::new(config.clone(), store, seed * 16 + i as u64)
            })
            .collect();
        Sim {
            m: Input::new(&[]),
            start: fx.now,
            origin: None,
            program: program.chunks(CHUNK),
            nodes,
            now: fx.now,
            accounts: fx.accounts.clone(),
            outbox: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            sends: Vec::new(),
            message_ids: Vec::new(),
            authorizations: Vec::new(),
            nonces: Vec::new(),
            promises: HashMap::new(),
            receipts: HashMap::new(),
            entries: HashMap::new(),
        }
    }

    fn run(mut self) {
        for _ in 0..MAX_OPS {
            let Some(chunk) = self.program.next() else {
                break;
            };
            self.m = Input::new(chunk);
            match self.m.choose(10) {
                0..=4 => self.op_call(),
                5 => self.op_network(),
                6 => {
                    let n = self.m.choose(self.nodes.len());
                    self.tick(n, self.now);
                }
                7 | 8 => self.op_advance(),
                _ => {
                    let n = self.m.choose(self.nodes.len());
                    match self.m.choose(6) {
                        0 | 1 => self.restart(n),
                        2 => self.op_policy(n),
                        3 | 4 => self.op_relay_auth(n),
                        _ => self.op_session_info(n),
                    }
                }
            }
        }
        // Whatever happened, every relay's state loads and every timeline reads back.
        for n in 0..self.nodes.len() {
            self.restart(n);
        }
        for a in 0..self.accounts.len() {
            for d in 0..self.accounts[a].devices.len() {
                self.sync_all(a, d);
            }
        }
    }

    // ---- time -------------------------------------------------------------------------

    fn policy_tolerance(&self) -> u64 {
        self.nodes[0].config.policies.clock_tolerance
    }

    /// A time near now: the edges of the clock tolerance and of the age limit, or anything.
    fn at(&mut self) -> u64 {
        let tol = self.policy_tolerance() as i64;
        let age = self.nodes[0].config.policies.message_delivery_age_limit as i64;
        let d: i64 = match self.m.choose(10) {
            0..=2 => 0,
            3 => -1_000,
            4 => 1_000,
            5 => tol + 1,
            6 => -tol - 1,
            7 => -age,
            8 => -age - 1,
            _ => i64::from(self.m.u32()) - (1 << 31),
        };
        (self.now as i64).saturating_add(d).max(0) as u64
    }

    fn op_advance(&mut self) {
        let ms = match self.m.choose(8) {
            0 | 1 => 1_000,
            2 => 30_000,
            3 => 60_000,
            4 => 3_600_000,
            5 => 86_400_000,
            6 => 2_592_000_000,
            _ => u64::from(self.m.u32()),
        };
        self.now = (self.now + ms).min(MAX_SAFE_INTEGER);
        for n in 0..self.nodes.len() {
            if self.nodes[n].wake.is_some_and(|w| w <= self.now) {
                self.nodes[n].wake = None;
                self.tick(n, self.now);
            }
        }
    }

    fn tick(&mut self, n: usize, now: u64) {
        let r = self.nodes[n].engine.try_tick(now);
        if let Err(e) = &r.result {
            panic!("a tick at relay {n} could not commit over memory storage: {e}");
        }
        self.absorb(n, &r.effects);
    }

    // ---- state ------------------------------------------------------------------------

    /// A new engine over the same storage: the state must load.
    fn restart(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        node.restarts += 1;
        node.engine = Engine::new(
            node.config.clone(),
            node.store.clone(),
            TestEntropy(ChaCha20Rng::seed_from_u64(1000 + node.restarts)),
        );
        node.wake = node
            .engine
            .next_wake()
            .unwrap_or_else(|e| panic!("relay {n}'s state does not load: {e}"));
        for (k, v) in node.store.snapshot() {
            assert!(k.is_ascii(), "a non-ASCII key {k:?}");
            if !v.is_empty() {
                serde_json::from_slice::<serde::de::IgnoredAny>(&v).unwrap_or_else(|e| {
                    panic!(
                        "stored value at {} is not a JSON record: {e}",
                        String::from_utf8_lossy(&k)
                    )
                });
            }
        }
        let key = [n as u8 + 1; 32];
        let doc = canonical::to_vec(&self.nodes[n].engine.well_known(&key));
        let id = self.nodes[n].id.clone();
        assert_eq!(
            relay_request::parse_well_known(&doc, &id, NET).ok(),
            Some(key),
            "the relay's own /.well-known/relay does not read back"
        );
        let now = self.now;
        self.tick(n, now);
    }

    /// A policy changed at run time (not retention: the oracle's windows follow it).
    fn op_policy(&mut self, n: usize) {
        const NAMES: [&str; 16] = [
            "clock_tolerance",
            "message_delivery_age_limit",
            "max_request_bytes",
            "max_boxes",
            "max_devices",
            "retry_initial",
            "retry_max",
            "send_rate",
            "deliver_rate",
            "deliver_rate_per_account",
            "session_ttl",
            "anonymous_rate",
            "account_request_rate",
            "deliver_rate_per_sender",
            "max_accounts",
            "max_sync_bytes",
        ];
        let name = NAMES[self.m.choose(NAMES.len())];
        let value = match self.m.choose(5) {
            0 => 0,
            1 => 1,
            2 => u64::from(self.m.u8()),
            3 => u64::from(self.m.u32()),
            _ => MAX_SAFE_INTEGER,
        };
        let mut policies = self.nodes[n].config.policies.clone();
        if policies.set(name, value).is_ok() {
            self.nodes[n].config.policies = policies.clone();
            self.nodes[n].engine.set_policies(policies);
        }
    }

    /// Relay authentication: a request signed by the other relay, as is or with one
    /// defect; an accepted (relay, nonce) is refused when it comes again.
    fn op_relay_auth(&mut self, n: usize) {
        let source = 1 - n;
        let seed = [40 + source as u8; 32];
        let key = relay_request::public_key(&seed);
        let (from, me) = (self.nodes[source].id.clone(), self.nodes[n].id.clone());
        let ts = self.at();
        let nonce: [u8; 16] = match self.m.choose(4) {
            0..=2 => {
                let mut b = [0u8; 16];
                self.rng.fill_bytes(&mut b);
                b
            }
            _ => [1; 16],
        };
        let body = self.m.bytes(24).to_vec();
        let revision = Some(u64::from(self.m.choose(3) as u8));
        let mut h = relay_request::sign(
            &seed,
            NET,
            "message.deliver",
            &from,
            &me,
            ts,
            &nonce,
            &body,
            revision,
        );
        let mut with_key = key;
        match self.m.choose(8) {
            0..=4 => {}
            5 => with_key = relay_request::public_key(&[99; 32]),
            6 => h.signature = base64url::encode(&[7; 64]),
            7 if self.m.chance(2) => h.route_revision = None,
            _ => h.timestamp = format!("0{}", h.timestamp),
        }
        let now = self.now;
        let tolerance = self.nodes[n].config.policies.clock_tolerance;
        let Ok(pre) =
            relay_request::precheck(&h, NET, &me, "message.deliver", &body, now, tolerance)
        else {
            return;
        };
        match self.nodes[n]
            .engine
            .authenticate_relay(&pre, &with_key, now)
        {
            Ok(id) => {
                assert_eq!(id, from, "authenticated as another relay");
                let again = self.nodes[n]
                    .engine
                    .authenticate_relay(&pre, &with_key, now);
                assert!(
                    matches!(&again, Err(e) if e.code == ErrorCode::Unauthenticated),
                    "a relay request nonce was accepted twice: {again:?}"
                );
            }
            Err(e) => assert_ne!(e.code, ErrorCode::Internal, "relay authentication: {e}"),
        }
    }

    /// `Engine::session_info` for a token a device holds (or any other).
    fn op_session_info(&mut self, n: usize) {
        let a = self.account();
        let d = self.m.choose(self.accounts[a].devices.len());
        let token = match (self.m.choose(4), &self.accounts[a].sessions[d]) {
            (0..=2, Some(t)) => t.clone(),
            _ => random_id(&mut self.rng),
        };
        let now = self.now;
        match self.nodes[n].engine.session_info(&token, now) {
            Ok(info) => {
                assert!(info.expires_at > now, "a session past its expiry: {info:?}");
                if self.accounts[a].sessions[d].as_ref() == Some(&token) {
                    assert_eq!(
                        info.account,
                        self.accounts[a].id(),
                        "another account's session"
                    );
                    assert_eq!(info.device_id, self.accounts[a].devices[d].id().as_str());
                }
            }
            Err(e) => assert_ne!(e.code, ErrorCode::Internal, "session_info: {e}"),
        }
    }

    fn absorb(&mut self, n: usize, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::Send {
                    task,
                    attempt,
                    target,
                    method,
                    body,
                    route_revision,
                    ..
                } => {
                    json::parse_object(body).unwrap_or_else(|e| {
                        panic!("a relay request body is not a strict JSON object: {e}")
                    });
                    RelayId::parse(target.as_str()).expect("a request's target is a relay id");
                    self.outbox.push(InFlight {
                        source: n,
                        task: task.clone(),
                        attempt: *attempt,
                        target: target.clone(),
                        method: method.as_str(),
                        body: body.clone(),
                        route_revision: *route_revision,
                    });
                }
                Effect::WakeAt(t) => self.nodes[n].wake = Some(*t),
                Effect::Notify {
                    account,
                    latest_seq,
                } => {
                    assert!(*latest_seq >= 1, "notify of seq 0 for {account}");
                    AccountId::parse(account).expect("notify names an account");
                }
                Effect::EndDeviceSessions { account, device_id } => {
                    AccountId::parse(account).expect("end sessions names an account");
                    DeviceId::parse(device_id).expect("end sessions names a device");
                }
                Effect::ShardCall { .. } => {
                    panic!("a relay of one shard handed a call to a sibling shard")
                }
                Effect::OperatorAction(a) => assert!(
                    matches!(
                        a.action,
                        "destination.retry"
                            | "delivery.retry"
                            | "destination.pause"
                            | "destination.resume"
                            | "quarantine.drop"
                            | "quarantine.requeue"
                    ),
                    "{a:?}"
                ),
                Effect::Accepted(a) => {
                    AccountId::parse(&a.from).expect("an acceptance names its sender");
                    AccountId::parse(&a.to).expect("an acceptance names its recipient");
                    let status = a.status;
                    assert!(
                        matches!(status, "delivering" | "target_accepted" | "failed"),
                        "{status}"
                    );
                }
                Effect::DeliveryEnded {
                    from, to, status, ..
                } => {
                    AccountId::parse(from).expect("an ended delivery names its sender");
                    AccountId::parse(to).expect("an ended delivery names its recipient");
                    assert!(matches!(*status, "target_accepted" | "failed"), "{status}");
                }
            }
        }
    }

    // ---- the network ------------------------------------------------------------------

    fn op_network(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        let i = self.m.choose(self.outbox.len());
        let keep = self.m.chance(10);
        let req = if keep {
            self.outbox[i].clone()
        } else {
            self.outbox.remove(i)
        };
        let outcome = match self.m.choose(12) {
            0..=6 => match self.nodes.iter().position(|n| n.id == req.target) {
                Some(t) => {
                    let source = self.nodes[req.source].id.clone();
                    let caller = Caller::relay_at(source, req.route_revision);
                    let now = self.now;
                    let r = self.call(t, &caller, req.method, &req.body, now, None);
                    if self.m.chance(15) {
                        // The answer is lost on the way back.
                        Outcome::Unknown
                    } else if r.result.is_ok() {
                        Outcome::Result(r.body())
                    } else {
                        Outcome::Error(r.body())
                    }
                }
                None => Outcome::NotAttempted,
            },
            7 => Outcome::Unknown,
            8 => Outcome::NotAttempted,
            9 => Outcome::Error(self.error_answer()),
            10 => Outcome::Result(self.m.bytes(64).to_vec()),
            _ => return, // lost: the attempt times out
        };
        let effects =
            self.nodes[req.source]
                .engine
                .outcome(&req.task, req.attempt, outcome, self.now);
        self.absorb(req.source, &effects);
    }

    /// An error answer as a peer might send it, with any code (or an unknown one).
    fn error_answer(&mut self) -> Vec<u8> {
        let codes = ErrorCode::ALL;
        let i = self.m.choose(codes.len() + 2);
        let code = match i {
            i if i < codes.len() => codes[i].as_str().to_string(),
            i if i == codes.len() => "teapot".to_string(),
            _ => String::from_utf8_lossy(self.m.bytes(8)).into_owned(),
        };
        let mut inner = Object::new();
        inner.insert("code", code);
        inner.insert("message", "fuzz");
        match self.m.choose(4) {
            0 => {}
            1 => {
                let mut d = Object::new();
                d.insert("retry_after", u64::from(self.m.u32()));
                inner.insert("data", d);
            }
            2 => {
                let a = self.m.choose(self.accounts.len());
                let relay = self.relay_choice();
                let rev = self.accounts[a].revision + self.m.choose(3) as u64;
                let mut d = Object::new();
                d.insert("route", self.route(a, &relay, rev));
                inner.insert("data", d);
            }
            _ => {
                let v = self.value(6);
                inner.insert("data", v);
            }
        }
        let mut outer = Object::new();
        outer.insert("error", inner);
        canonical::object_to_vec(&outer)
    }

    // ---- calls ------------------------------------------------------------------------

    fn op_call(&mut self) {
        let which = self.m.choose(METHODS.len() + 1);
        let mut req = match METHODS.get(which).copied() {
            Some("session.open") => self.session_open(),
            Some("account.register") => self.account_register(),
            Some("account.update") => {
                let a = self.account();
                let mut p = Object::new();
                p.insert("discoverable", self.m.chance(50));
                self.as_account(a, "account.update", p)
            }
            Some("device.register") => self.device_register(),
            Some("device.revoke") => self.device_revoke(),
            Some("device.list") => {
                let a = self.account_or_stranger();
                let mut p = Object::new();
                p.insert("account", a.1.as_str());
                let asker = a.0.unwrap_or(0);
                let mut r = self.as_account(asker, "device.list", p);
                if let Some(owner) = a.0 {
                    r.node = self.accounts[owner].home;
                }
                r
            }
            Some("route.get") => {
                let a = self.account_or_stranger();
                let mut p = Object::new();
                p.insert("account", a.1.as_str());
                let node = self.m.choose(self.nodes.len());
                self.plain(node, Caller::Anonymous, "route.get", p)
            }
            Some("route.publish") => self.route_publish(),
            Some("contact.revoke") => self.contact_revoke(),
            Some("message.send") => self.message_send(),
            Some("message.deliver") => self.message_deliver(),
            Some("message.delivery.status") => {
                let (a, id) = match self.sends.len() {
                    0 => (self.account(), random_id(&mut self.rng)),
                    n => {
                        let (a, p) = &self.sends[self.m.choose(n)];
                        let id = p
                            .get("envelope")
                            .and_then(|e| e.as_object())
                            .and_then(|e| e.get("message_id"))
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string();
                        (*a, id)
                    }
                };
                let mut p = Object::new();
                p.insert("message_id", id);
                self.as_account(a, "message.delivery.status", p)
            }
            Some("message.timeline.sync") => {
                let a = self.account();
                let d = self.m.choose(self.accounts[a].devices.len());
                let mut p = Object::new();
                let after = match self.m.choose(4) {
                    0 | 1 => 0,
                    2 => u64::from(self.m.u8()),
                    _ => MAX_SAFE_INTEGER,
                };
                p.insert("after", after);
                match self.m.choose(6) {
                    0 | 1 => {}
                    2 => p.insert("limit", 1u64),
                    3 => p.insert("limit", 500u64),
                    4 => p.insert("limit", 501u64),
                    _ => p.insert("limit", 0u64),
                }
                let mut r = self.as_account(a, "message.timeline.sync", p);
                r.caller = self.session(a, d);
                r
            }
            Some("admin.deliveries") => {
                let mut p = Object::new();
                match self.m.choose(4) {
                    0 | 1 => {}
                    2 => p.insert("state", "pending"),
                    _ => p.insert("state", "failed"),
                }
                if self.m.chance(30) {
                    let relay = self.relay_choice();
                    p.insert("destination", relay);
                }
                let node = self.m.choose(self.nodes.len());
                self.plain(node, Caller::Operator, "admin.deliveries", p)
            }
            _ => {
                let name = match self.m.choose(3) {
                    0 => "nope".to_string(),
                    1 => String::new(),
                    _ => String::from_utf8_lossy(self.m.bytes(24)).into_owned(),
                };
                let node = self.m.choose(self.nodes.len());
                self.plain(node, Caller::Anonymous, &name, Object::new())
            }
        };
        // Anything else than the natural node, caller, params or time, when the input says so.
        match self.m.choose(6) {
            0..=3 => {}
            4 => req.node = 0,
            _ => req.node = 1,
        }
        match self.m.choose(16) {
            0..=10 => {}
            11 => req.caller = Caller::Anonymous,
            12 => req.caller = Caller::Operator,
            13 => {
                let revision = self.m.chance(2).then(|| self.m.choose(4) as u64);
                req.caller = Caller::relay_at(self.nodes[1 - req.node].id.clone(), revision)
            }
            14 => {
                let a = self.account();
                let d = self.m.choose(self.accounts[a].devices.len());
                req.caller = self.session(a, d);
            }
            _ => req.caller = Caller::Session(random_id(&mut self.rng)),
        }
        match self.m.choose(24) {
            0..=19 => {}
            20 | 21 => {
                if let Ok(mut o) = json::parse_object(&req.params) {
                    self.defect(&mut o);
                    req.params = canonical::object_to_vec(&o);
                }
            }
            22 => req.params = self.m.bytes(200).to_vec(),
            _ => {
                // The same object spelled differently (member order, whitespace): same meaning.
                if let Ok(o) = json::parse_object(&req.params) {
                    let members: Vec<String> = o
                        .iter()
                        .rev()
                        .map(|(k, v)| {
                            format!(
                                "{} : {}",
                                canonical::to_string(&Value::from(k)),
                                canonical::to_string(v)
                            )
                        })
                        .collect();
                    req.params = format!(" {{ {} }}\n", members.join(" ,\t")).into_bytes();
                }
            }
        }
        // The envelope the params finally carry (a defect may have changed or removed it).
        req.envelope = match req.method.as_str() {
            "message.send" | "message.deliver" => json::parse_object(&req.params)
                .ok()
                .and_then(|o| envelope_key(&o)),
            _ => None,
        };
        let now = match self.m.choose(12) {
            0..=8 => self.now,
            9 => self.now.saturating_sub(u64::from(self.m.u32())),
            10 => self.now + u64::from(self.m.u32()),
            _ => self.m.u64() % (MAX_SAFE_INTEGER + 1),
        };
        self.origin = match self.m.choose(8) {
            0..=4 => None,
            5 | 6 => Some(
                ["192.0.2.1", "2001:db8::7", "[::ffff:192.0.2.1]"][self.m.choose(3)].to_string(),
            ),
            _ => Some(String::from_utf8_lossy(self.m.bytes(16)).into_owned()),
        };
        let repeat = self.m.chance(35);
        let r = self.call(
            req.node,
            &req.caller,
            &req.method,
            &req.params,
            now,
            req.envelope.clone(),
        );
        if r.result.is_ok() {
            self.learn(&req, &r);
        }
        if repeat && req.method != "session.open" {
            let again = self.call(
                req.node,
                &req.caller,
                &req.method,
                &req.params,
                now,
                req.envelope.clone(),
            );
            same_answer(&req.method, &r, &again);
        }
        self.origin = None;
    }

    /// What the client learns from an accepted call.
    fn learn(&mut self, req: &Request, r: &Response) {
        if let Some((a, d)) = req.opens {
            let token = r
                .result
                .as_ref()
                .ok()
                .and_then(|v| v.as_object())
                .and_then(|o| o.get("session"))
                .and_then(Value::as_str)
                .map(str::to_string);
            if req.node == self.accounts[a].home {
                self.accounts[a].sessions[d] = token;
            }
        }
        if let Some(acct) = &req.registers {
            match self.accounts.iter().position(|a| a.id() == acct.id()) {
                Some(i) if acct.revision > self.accounts[i].revision => {
                    let sessions = vec![None; self.accounts[i].devices.len()];
                    self.accounts[i].home = acct.home;
                    self.accounts[i].revision = acct.revision;
                    self.accounts[i].sessions = sessions;
                }
                Some(_) => {}
                None if self.accounts.len() < 12 => self.accounts.push(acct.clone()),
                None => {}
            }
        }
        if let Some((a, device, cert)) = &req.adds {
            let acct = &mut self.accounts[*a];
            if acct.devices.len() < 6 && !acct.devices.iter().any(|d| d.id() == device.id()) {
                acct.devices.push(device.clone());
                acct.certs.push(cert.clone());
                acct.sessions.push(None);
            }
        }
    }

    /// One call and the checks on its answer.
    fn call(
        &mut self,
        n: usize,
        caller: &Caller,
        method: &str,
        params: &[u8],
        now: u64,
        envelope: Option<(String, String, String)>,
    ) -> Response {
        let before = self.nodes[n].store.snapshot();
        let origin = self.origin.clone();
        let r = self.nodes[n]
            .engine
            .call_from(caller, origin.as_deref(), method, params, now);
        if trace() {
            let code = r.result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
            eprintln!(
                "  relay {n} {method} by {caller:?} at +{}: {code}",
                now as i64 - self.start as i64
            );
        }
        let body = r.body();
        let parsed = json::parse(&body)
            .unwrap_or_else(|e| panic!("{method}: the answer is not strict JSON: {e}"));
        assert_eq!(
            canonical::to_vec(&parsed),
            body,
            "{method}: the answer is not canonical"
        );
        match &r.result {
            Ok(_) => {
                let o = parsed
                    .as_object()
                    .unwrap_or_else(|| panic!("{method}: the result is not an object"));
                match method {
                    "message.send" | "message.deliver" | "message.delivery.status" => {
                        self.delivery_status(n, method, o, envelope.as_ref(), now)
                    }
                    "message.timeline.sync" => self.page(n, caller, o, params, now),
                    _ => {}
                }
            }
            Err(e) => {
                assert_ne!(
                    e.code,
                    ErrorCode::Internal,
                    "{method} answered internal over memory storage: {e}"
                );
                assert!(r.effects.is_empty(), "{method}: an error emitted effects");
                let after = self.nodes[n].store.snapshot();
                if after != before {
                    let changed: Vec<String> = after
                        .iter()
                        .filter(|(k, v)| before.get(*k) != Some(*v))
                        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                        .chain(
                            before
                                .keys()
                                .filter(|k| !after.contains_key(*k))
                                .map(|k| String::from_utf8_lossy(k).into_owned()),
                        )
                        .collect();
                    panic!("{method} answered {e} but committed writes: {changed:?}");
                }
                let err = parsed
                    .as_object()
                    .and_then(|o| o.get("error"))
                    .and_then(Value::as_object)
                    .expect("an error body has an error object");
                let code = err.get("code").and_then(Value::as_str).expect("a code");
                assert_eq!(ErrorCode::parse(code), Some(e.code));
                assert!(err.get("message").and_then(Value::as_str).is_some());
            }
        }
        self.absorb(n, &r.effects);
        r
    }

    fn delivery_status(
        &mut self,
        n: usize,
        method: &str,
        o: &Object,
        envelope: Option<&(String, String, String)>,
        now: u64,
    ) {
        const KEYS: [&str; 8] = [
            "message_id",
            "from",
            "to",
            "status",
            "accepted_at",
            "deadline",
            "target_accepted_at",
            "error",
        ];
        for (k, _) in o.iter() {
            assert!(
                KEYS.contains(&k),
                "{method}: unexpected member {k} in a DeliveryStatus"
            );
        }
        let s = |k: &str| {
            o.get(k)
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{method}: DeliveryStatus without {k}"))
                .to_string()
        };
        let int = |k: &str| o.get(k).map(|v| v.as_protocol_int().expect("an integer"));
        let (id, from, to, status) = (s("message_id"), s("from"), s("to"), s("status"));
        AccountId::parse(&from).expect("from is an account");
        AccountId::parse(&to).expect("to is an account");
        if let Some((f, m, t)) = envelope {
            assert_eq!(
                (&from, &id, &to),
                (f, m, t),
                "{method}: another message's status"
            );
        }
        let accepted_at = int("accepted_at").expect("accepted_at");
        let target_at = int("target_accepted_at");
        let error = o.get("error");
        match status.as_str() {
            "delivering" => assert!(target_at.is_none() && error.is_none(), "{o:?}"),
            "target_accepted" => assert!(target_at.is_some() && error.is_none(), "{o:?}"),
            "failed" => {
                let e = error
                    .and_then(Value::as_object)
                    .expect("failed has an error");
                assert!(e.get("code").and_then(Value::as_str).is_some());
            }
            other => panic!("{method}: status {other:?}"),
        }
        let retention = self.nodes[n].config.policies.message_retention;
        if method == "message.deliver" {
            assert_eq!(status, "target_accepted", "{method}: {o:?}");
            assert_eq!(target_at, Some(accepted_at));
            let key = (n, from, id);
            match self.receipts.get(&key) {
                Some(&at) if now < at.saturating_add(retention) => {
                    assert_eq!(at, accepted_at, "a receipt's accepted_at changed")
                }
                _ => {
                    self.receipts.insert(key, accepted_at);
                }
            }
            return;
        }
        let deadline = int("deadline");
        let deadline_at = deadline.expect("a source DeliveryStatus has a deadline");
        assert!(
            deadline_at >= accepted_at,
            "deadline before acceptance: {o:?}"
        );
        let key = (n, from, id);
        let terminal = (status != "delivering").then(|| status.clone());
        match self.promises.get_mut(&key) {
            Some(p) if now < p.accepted_at.saturating_add(retention) => {
                assert_eq!(
                    (p.accepted_at, p.deadline),
                    (accepted_at, deadline),
                    "accepted_at/deadline changed: {o:?}"
                );
                if let Some(t) = &p.terminal {
                    assert_eq!(
                        Some(t),
                        terminal.as_ref(),
                        "a terminal status changed: {o:?}"
                    );
                }
                if p.terminal.is_none() {
                    p.terminal = terminal;
                }
            }
            _ => {
                self.promises.insert(
                    key,
                    Promise {
                        accepted_at,
                        deadline,
                        terminal,
                    },
                );
            }
        }
    }

    /// A sync page: parseable entries of this device, increasing, and no message twice.
    fn page(&mut self, n: usize, caller: &Caller, o: &Object, params: &[u8], now: u64) {
        let after = json::parse_object(params)
            .ok()
            .and_then(|p| p.get("after").and_then(Value::as_protocol_int))
            .unwrap_or(0);
        let entries = match o.get("entries") {
            Some(Value::Array(e)) => e,
            _ => panic!("a sync page without entries"),
        };
        let next = o
            .get("next")
            .and_then(Value::as_protocol_int)
            .expect("a page has next");
        assert!(next >= after, "next {next} < after {after}");
        let retention = self.nodes[n].config.policies.message_retention;
        let mut last = after;
        // Entries are keyed by account: every device of it sees the same record.
        let account = match caller {
            Caller::Session(t) => self
                .accounts
                .iter()
                .find(|a| a.sessions.iter().any(|s| s.as_ref() == Some(t)))
                .map_or_else(|| t.clone(), Acct::id),
            _ => String::new(),
        };
        for e in entries {
            let e = e.as_object().expect("an entry is an object");
            let seq = e.get("seq").and_then(Value::as_protocol_int).expect("seq");
            assert!(
                seq > last && seq <= next,
                "entry seq {seq} after {last}, next {next}"
            );
            last = seq;
            let kind = e
                .get("kind")
                .and_then(Value::as_str)
                .expect("kind")
                .to_string();
            assert!(
                ["sent", "received", "self"].contains(&kind.as_str()),
                "{kind}"
            );
            let env = e
                .get("envelope")
                .and_then(Value::as_object)
                .map(|x| MessageEnvelope::parse(x.clone()))
                .expect("an entry has an envelope")
                .expect("an entry's envelope parses");
            e.get("device_certificate")
                .and_then(Value::as_object)
                .map(|x| DeviceCertificate::parse(x.clone()))
                .expect("an entry has a certificate")
                .expect("an entry's certificate parses");
            e.get("key_box")
                .and_then(Value::as_object)
                .map(|x| KeyBox::parse(x.clone()))
                .expect("an entry has a key box")
                .expect("an entry's key box parses");
            let accepted_at = e
                .get("accepted_at")
                .and_then(Value::as_protocol_int)
                .expect("accepted_at");
            let key = (
                n,
                account.clone(),
                kind,
                env.from.as_str().to_string(),
                env.message_id.clone(),
            );
            match self.entries.get(&key) {
                Some(&(s, at)) if s != seq && now < at.saturating_add(retention) => {
                    panic!("message {key:?} is in the timeline twice: seq {s} and {seq}")
                }
                _ => {
                    self.entries.insert(key, (seq, accepted_at));
                }
            }
        }
    }

    /// Every page of a device's timeline at its home.
    fn sync_all(&mut self, a: usize, d: usize) {
        let Some(token) = self.accounts[a].sessions[d].clone() else {
            return;
        };
        let home = self.accounts[a].home;
        let caller = Caller::Session(token);
        let mut after = 0;
        for _ in 0..20 {
            let mut p = Object::new();
            p.insert("after", after);
            p.insert("limit", 500u64);
            let params = canonical::object_to_vec(&p);
            let now = self.now;
            let r = self.call(home, &caller, "message.timeline.sync", &params, now, None);
            let Ok(Value::Object(o)) = json::parse(&r.body()) else {
                return;
            };
            if r.result.is_err() {
                return;
            }
            let next = o
                .get("next")
                .and_then(Value::as_protocol_int)
                .unwrap_or(after);
            let more = o.get("has_more") == Some(&Value::Bool(true));
            assert!(next > after || !more, "has_more without progress");
            if !more {
                return;
            }
            after = next;
        }
    }

    // ---- params -----------------------------------------------------------------------

    fn account(&mut self) -> usize {
        self.m.choose(self.accounts.len())
    }

    /// An account of the world (`Some`), or a stranger's id nobody registered.
    fn account_or_stranger(&mut self) -> (Option<usize>, String) {
        let i = self.m.choose(self.accounts.len() + 1);
        match self.accounts.get(i) {
            Some(a) => (Some(i), a.id()),
            None => (
                None,
                AccountKey::generate(&mut self.rng)
                    .id()
                    .as_str()
                    .to_string(),
            ),
        }
    }

    fn session(&self, a: usize, d: usize) -> Caller {
        let token = self.accounts[a].sessions[d].clone();
        Caller::Session(token.unwrap_or_else(|| "no-session".to_string()))
    }

    fn relay_choice(&mut self) -> String {
        match self.m.choose(6) {
            0 | 1 => self.nodes[0].id.as_str().to_string(),
            2 | 3 => self.nodes[1].id.as_str().to_string(),
            4 => "https://c.example".to_string(),
            _ => "http://a.test:80".to_string(),
        }
    }

    fn plain(&self, node: usize, caller: Caller, method: &str, p: Object) -> Request {
        Request {
            node,
            caller,
            method: method.to_string(),
            params: canonical::object_to_vec(&p),
            envelope: None,
            opens: None,
            registers: None,
            adds: None,
        }
    }

    /// A call by the session of device 0 of account `a` at its home.
    fn as_account(&mut self, a: usize, method: &str, p: Object) -> Request {
        let caller = self.session(a, 0);
        self.plain(self.accounts[a].home, caller, method, p)
    }

    fn route(&mut self, a: usize, relay: &str, revision: u64) -> Object {
        let issued = self.at();
        let acct = &self.accounts[a];
        draft::route(NET, &acct.key.id(), relay, revision, issued).sign(&acct.key)
    }

    fn session_open(&mut self) -> Request {
        let a = self.account();
        let d = self.m.choose(self.accounts[a].devices.len());
        let ts = self.at();
        let nonce = match (self.m.choose(4), self.nonces.last()) {
            (3, Some(n)) => n.clone(),
            _ => random_id(&mut self.rng),
        };
        self.nonces.push(nonce.clone());
        let home = self.accounts[a].home;
        let relay = if self.m.chance(10) {
            self.relay_choice()
        } else {
            self.nodes[home].id.as_str().to_string()
        };
        let acct = &self.accounts[a];
        let draft = draft::session_open(
            NET,
            &relay,
            &acct.key.id(),
            &acct.devices[d].id(),
            ts,
            &nonce,
        );
        let signed = match self.m.choose(12) {
            0..=9 => draft.sign(&acct.devices[d]),
            10 => draft.sign(&acct.key),
            _ => draft.sign(&acct.devices[(d + 1) % acct.devices.len()]),
        };
        let mut r = self.plain(home, Caller::Anonymous, "session.open", signed);
        r.opens = Some((a, d));
        r
    }

    fn permissions(&mut self) -> &'static [&'static str] {
        match self.m.choose(6) {
            0..=2 => &["send", "sync", "manage"],
            3 => &["send", "sync"],
            4 => &["sync"],
            _ => &["manage", "other"],
        }
    }

    fn certificate(&mut self, key: &AccountKey, device: &DeviceKey) -> Object {
        let perms = self.permissions();
        let issued = self.at();
        let mut c = draft::certificate(NET, key, device, perms, issued);
        if self.m.chance(15) {
            let e = self.at();
            c = c.set("expires_at", e);
        }
        if self.m.chance(8) {
            c.sign(device)
        } else {
            c.sign(key)
        }
    }

    fn account_register(&mut self) -> Request {
        let (acct, cert) = match self.m.choose(4) {
            0 | 1 => {
                let a = self.account();
                (self.accounts[a].clone(), self.accounts[a].certs[0].clone())
            }
            2 => {
                let key = AccountKey::generate(&mut self.rng);
                let device = DeviceKey::generate(&mut self.rng);
                let cert = self.certificate(&key, &device);
                let home = self.m.choose(self.nodes.len());
                let acct = Acct {
                    key,
                    devices: vec![device],
                    certs: vec![cert.clone()],
                    sessions: vec![None],
                    home,
                    revision: 1,
                };
                (acct, cert)
            }
            _ => {
                // Moving: a higher revision naming the other relay.
                let a = self.account();
                let mut acct = self.accounts[a].clone();
                acct.home = 1 - acct.home;
                acct.revision += 1;
                (acct.clone(), acct.certs[0].clone())
            }
        };
        let relay = self.nodes[acct.home].id.as_str().to_string();
        let issued = self.at();
        let route =
            draft::route(NET, &acct.key.id(), &relay, acct.revision, issued).sign(&acct.key);
        let mut p = Object::new();
        p.insert("route", route);
        p.insert("certificate", cert);
        match self.m.choose(3) {
            0 => {}
            1 => p.insert("discoverable", true),
            _ => p.insert("discoverable", false),
        }
        let caller = match (
            self.m.chance(20),
            self.accounts.iter().position(|a| a.id() == acct.id()),
        ) {
            (true, Some(i)) => self.session(i, 0),
            _ => Caller::Anonymous,
        };
        let mut r = self.plain(acct.home, caller, "account.register", p);
        r.registers = Some(acct);
        r
    }

    fn device_register(&mut self) -> Request {
        let a = self.account();
        let device = match self.m.choose(3) {
            0 | 1 => DeviceKey::generate(&mut self.rng),
            _ => {
                let d = self.m.choose(self.accounts[a].devices.len());
                self.accounts[a].devices[d].clone()
            }
        };
        let key = self.accounts[a].key.clone();
        let cert = self.certificate(&key, &device);
        let mut p = Object::new();
        p.insert("certificate", cert.clone());
        let mut r = self.as_account(a, "device.register", p);
        r.adds = Some((a, device, cert));
        r
    }

    fn device_revoke(&mut self) -> Request {
        let a = self.account();
        let n = self.accounts[a].devices.len();
        let i = self.m.choose(n + 1);
        let device = match self.accounts[a].devices.get(i) {
            Some(d) => d.id(),
            None => {
                let mut b = [0u8; 16];
                self.rng.fill_bytes(&mut b);
                DeviceId::parse(&base64url::encode(&b)).expect("device id")
            }
        };
        let at = self.at();
        let d = draft::revocation(NET, &self.accounts[a].key.id(), &device, at);
        let p = if self.m.chance(8) {
            d.sign(&self.accounts[a].devices[0])
        } else {
            d.sign(&self.accounts[a].key)
        };
        let mut r = self.as_account(a, "device.revoke", p);
        if n > 1 && self.m.chance(50) {
            // Revoke from another device than the one revoked, when there is one.
            r.caller = self.session(a, (i + 1) % n);
        }
        r
    }

    fn route_publish(&mut self) -> Request {
        let a = self.account();
        let relay = match self.m.choose(4) {
            0 | 1 => self.nodes[self.accounts[a].home].id.as_str().to_string(),
            _ => self.relay_choice(),
        };
        let rev = match self.m.choose(5) {
            0 | 1 => self.accounts[a].revision,
            2 => self.accounts[a].revision + 1,
            3 => 0,
            _ => self.accounts[a].revision + 2,
        };
        let route = if self.m.chance(8) {
            let issued = self.at();
            draft::route(NET, &self.accounts[a].key.id(), &relay, rev, issued)
                .sign(&self.accounts[a].devices[0])
        } else {
            self.route(a, &relay, rev)
        };
        let mut p = Object::new();
        p.insert("route", route);
        let node = self.m.choose(self.nodes.len());
        let caller = if self.m.chance(40) {
            Caller::relay(self.nodes[1 - node].id.clone())
        } else {
            Caller::Anonymous
        };
        self.plain(node, caller, "route.publish", p)
    }

    fn contact_revoke(&mut self) -> Request {
        let (a, id, grant) = match self.authorizations.len() {
            0 => (self.account(), random_id(&mut self.rng), true),
            n => self.authorizations[self.m.choose(n)].clone(),
        };
        let mut p = Object::new();
        match self.m.choose(5) {
            0..=2 => p.insert(if grant { "grant_id" } else { "invite_id" }, id),
            3 => p.insert(if grant { "invite_id" } else { "grant_id" }, id),
            _ => {
                p.insert("grant_id", id.as_str());
                p.insert("invite_id", id);
            }
        }
        self.as_account(a, "contact.revoke", p)
    }

    /// A grant or invite from `issuer` for `grantee`, signed (or signed by the wrong key).
    fn authorization(&mut self, issuer: usize, grantee: usize) -> Object {
        let id = random_id(&mut self.rng);
        let issued = self.at();
        let grant = self.m.choose(2) == 0;
        self.authorizations.push((issuer, id.clone(), grant));
        let i = &self.accounts[issuer];
        let mut d = if grant {
            draft::grant(
                NET,
                &id,
                &i.key.id(),
                &self.accounts[grantee].key.id(),
                issued,
            )
        } else {
            let expires = issued + u64::from(self.m.u32());
            let d = draft::invite(NET, &id, &i.key.id(), issued, expires);
            match self.m.choose(3) {
                0 => d,
                1 => d.set("max_uses", 1u64),
                _ => d.set("max_uses", 2u64),
            }
        };
        if self.m.chance(20) {
            let relay = self.nodes[self.accounts[issuer].home]
                .id
                .as_str()
                .to_string();
            let rev = self.accounts[issuer].revision;
            let route = self.route(issuer, &relay, rev);
            d = d.set("route", route);
        }
        let i = &self.accounts[issuer];
        if self.m.chance(8) {
            d.sign(&i.devices[0])
        } else {
            d.sign(&i.key)
        }
    }

    /// message.send params from device `d` of `from` to `to` (`None`: a stranger).
    fn message(&mut self, from: usize, d: usize, to: Option<usize>) -> Object {
        let to_key = match to {
            Some(t) => self.accounts[t].key.id(),
            None => AccountKey::generate(&mut self.rng).id(),
        };
        let created = self.at();
        let id = match (self.m.choose(5), self.message_ids.is_empty()) {
            (3, false) => {
                let i = self.m.choose(self.message_ids.len());
                self.message_ids[i].clone()
            }
            (4, _) => "AAAAAAAAAAAAAAAAAAAAAA".to_string(),
            _ => random_id(&mut self.rng),
        };
        if self.message_ids.len() < 32 {
            self.message_ids.push(id.clone());
        }
        let key = seal::message_key(&mut self.rng);
        let mut body = seal::seal_body(&mut self.rng, &key, b"fuzz");
        if self.m.chance(10) {
            let v = self.value(32);
            body.insert("x-fuzz", v);
        }
        let sender = &self.accounts[from];
        let mut env = draft::envelope(
            NET,
            &id,
            &sender.key.id(),
            &sender.devices[d].id(),
            &to_key,
            created,
            body,
        );
        if self.m.chance(15) {
            let t = self.at();
            env = env.set("body_expires_at", t);
        }
        let mut fields = env.fields().clone();
        if self.m.chance(8) {
            self.defect(&mut fields);
        }
        let mut env = relay_core::client::Draft::new("message_envelope");
        for (k, v) in fields.iter() {
            env = env.set(k, v.clone());
        }
        let env = match self.m.choose(12) {
            0..=9 => env.sign(&self.accounts[from].devices[d]),
            10 => env.sign(&self.accounts[from].key),
            _ => env.set("sig", base64url::encode(&[7u8; 64])).unsigned(),
        };
        let to_devices = match to {
            Some(t) => self.accounts[t].devices.clone(),
            None => vec![DeviceKey::generate(&mut self.rng)],
        };
        let picks: Vec<DeviceKey> = match self.m.choose(5) {
            0..=2 => to_devices,
            3 => to_devices.into_iter().take(1).collect(),
            _ => Vec::new(),
        };
        let mut boxes: Vec<Object> = picks
            .iter()
            .map(|dk| seal::seal_key_box(&mut self.rng, &dk.id(), &dk.box_key(), &key))
            .collect();
        if let Some(first) = boxes.first_mut() {
            if self.m.chance(10) {
                let v = self.value(32);
                first.insert("x-fuzz", v);
            }
        }
        let mut p = Object::new();
        p.insert("envelope", env);
        p.insert("recipient_boxes", seal::boxes(boxes));
        if self.m.chance(30) {
            let own: Vec<Object> = self.accounts[from]
                .devices
                .clone()
                .iter()
                .map(|dk| seal::seal_key_box(&mut self.rng, &dk.id(), &dk.box_key(), &key))
                .collect();
            p.insert("sender_boxes", seal::boxes(own));
        }
        if let Some(t) = to {
            match self.m.choose(8) {
                0..=4 => {}
                5 | 6 => {
                    let a = self.authorization(t, from);
                    p.insert("authorization", a);
                }
                _ => {
                    let a = self.authorization(from, t);
                    p.insert("authorization", a);
                }
            }
            match self.m.choose(8) {
                0..=5 => {}
                6 => {
                    let relay = self.nodes[self.accounts[t].home].id.as_str().to_string();
                    let rev = self.accounts[t].revision;
                    let r = self.route(t, &relay, rev);
                    p.insert("recipient_route", r);
                }
                _ => {
                    let relay = self.relay_choice();
                    let rev = self.accounts[t].revision + 1;
                    let r = self.route(t, &relay, rev);
                    p.insert("recipient_route", r);
                }
            }
        }
        p
    }

    fn message_send(&mut self) -> Request {
        if !self.sends.is_empty() && self.m.chance(15) {
            // An exact earlier request again (a client's retry).
            let (a, p) = self.sends[self.m.choose(self.sends.len())].clone();
            let d = self.device_of(a, &p);
            let mut r = self.as_account(a, "message.send", p);
            r.caller = self.session(a, d);
            return r;
        }
        let from = self.account();
        let d = self.m.choose(self.accounts[from].devices.len());
        let t = self.m.choose(self.accounts.len() + 1);
        let to = (t < self.accounts.len()).then_some(t);
        let p = self.message(from, d, to);
        if self.sends.len() < 32 {
            self.sends.push((from, p.clone()));
        }
        let mut r = self.as_account(from, "message.send", p);
        r.caller = self.session(from, d);
        r
    }

    /// The device of `a` that signed the params' envelope (device 0 when unknown).
    fn device_of(&self, a: usize, p: &Object) -> usize {
        let dev = p
            .get("envelope")
            .and_then(Value::as_object)
            .and_then(|e| e.get("from_device_id"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.accounts[a]
            .devices
            .iter()
            .position(|d| d.id().as_str() == dev)
            .unwrap_or(0)
    }

    fn message_deliver(&mut self) -> Request {
        let from = self.account();
        let d = self.m.choose(self.accounts[from].devices.len());
        let t = self.m.choose(self.accounts.len() + 1);
        let to = (t < self.accounts.len()).then_some(t);
        let mut p = self.message(from, d, to);
        p.remove("sender_boxes");
        p.remove("recipient_route");
        let cert = match self.m.choose(8) {
            0..=4 => self.accounts[from].certs[d].clone(),
            5 => {
                let n = self.accounts[from].certs.len();
                self.accounts[from].certs[(d + 1) % n].clone()
            }
            6 => {
                let key = self.accounts[from].key.clone();
                let dev = self.accounts[from].devices[d].clone();
                self.certificate(&key, &dev)
            }
            _ => {
                let other = self.account();
                self.accounts[other].certs[0].clone()
            }
        };
        p.insert("device_certificate", cert);
        // The revision the deliver targets: mostly a current one, sometimes an older one or
        // none (rule 6 and the header's shape).
        let revision = match self.m.choose(8) {
            0 => None,
            1 => Some(0),
            _ => Some(u64::from(u32::MAX)),
        };
        let source = Caller::relay_at(self.nodes[self.accounts[from].home].id.clone(), revision);
        let node = to.map_or(0, |t| self.accounts[t].home);
        self.plain(node, source, "message.deliver", p)
    }

    /// One defect in an object: a member removed, replaced or added.
    fn defect(&mut self, o: &mut Object) {
        let keys: Vec<String> = o.iter().map(|(k, _)| k.to_string()).collect();
        match (self.m.choose(3), keys.is_empty()) {
            (0, false) => {
                let k = &keys[self.m.choose(keys.len())];
                o.remove(k);
            }
            (1, false) => {
                let k = keys[self.m.choose(keys.len())].clone();
                let v = self.value(8);
                o.insert(k, v);
            }
            _ => {
                let v = self.value(40);
                o.insert("x-fuzz", v);
            }
        }
    }

    /// Any JSON value, nested at most `depth` deep.
    fn value(&mut self, depth: usize) -> Value {
        match self.m.choose(9) {
            0 => Value::Null,
            1 => Value::Bool(self.m.chance(50)),
            2 => Value::from(self.m.u64()),
            3 => {
                let f = f64::from_bits(self.m.u64());
                Value::Number(Number::Float(if f.is_finite() { f } else { -0.0 }))
            }
            4 => Value::String(String::from_utf8_lossy(self.m.bytes(24)).into_owned()),
            5 if depth > 0 => {
                let n = self.m.choose(4);
                Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
            6 if depth > 0 => {
                let n = self.m.choose(4);
                let mut o = Object::new();
                for _ in 0..n {
                    let k = ["a", "type", "sig", "", "x-fuzz", "device_id"][self.m.choose(6)];
                    let v = self.value(depth - 1);
                    o.insert(k, v);
                }
                Value::Object(o)
            }
            7 if depth > 0 => {
                // A deep chain, to meet the depth limit wherever it applies.
                let levels = self.m.choose(depth.min(40)) + 1;
                let mut v = Value::Null;
                for _ in 0..levels {
                    v = if self.m.chance(50) {
                        Value::Array(vec![v])
                    } else {
                        let mut o = Object::new();
                        o.insert("a", v);
                        Value::Object(o)
                    };
                }
                v
            }
            _ => Value::from("AAAAAAAAAAAAAAAAAAAAAA"),
        }
    }
}

/// (from, message_id, to) of params' envelope.
fn envelope_key(p: &Object) -> Option<(String, String, String)> {
    let e = p.get("envelope")?.as_object()?;
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    Some((s("from")?, s("message_id")?, s("to")?))
}

/// Whether `RELAY_FUZZ_TRACE` asks for every call and its answer on stderr.
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("RELAY_FUZZ_TRACE").is_some())
}

/// An identical call repeated at once answers the same, or is rate limited where allowed.
fn same_answer(method: &str, first: &Response, again: &Response) {
    let strict = matches!(method, "message.send" | "message.deliver");
    match (&first.result, &again.result) {
        (Ok(_), Ok(_)) => assert_eq!(
            String::from_utf8_lossy(&first.body()),
            String::from_utf8_lossy(&again.body()),
            "{method}: an identical repeat answered differently"
        ),
        (Ok(_), Err(e)) => {
            // Revoking the caller's own device ends its session, and registering a new
            // certificate for it may take away its `manage` permission or its validity.
            let own_device = match method {
                "device.revoke" => e.code == ErrorCode::Unauthenticated,
                "device.register" => matches!(
                    e.code,
                    ErrorCode::Unauthenticated | ErrorCode::PermissionDenied
                ),
                _ => false,
            };
            let allowed = (!strict && e.code == ErrorCode::RateLimited) || own_device;
            assert!(
                allowed,
                "{method}: accepted, then an identical repeat answered {e}"
            );
        }
        (Err(e), Ok(_)) => {
            panic!("{method}: refused with {e}, then an identical repeat was accepted")
        }
        (Err(a), Err(b)) => assert!(
            a.code == b.code || b.code == ErrorCode::RateLimited,
            "{method}: refused with {a}, then an identical repeat with {b}"
        ),
    }
}
