//! Pre-signed requests: every setup runs the same bytes, signed before any clock starts.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use relay_host_wasmtime::now_ms;

/// The network every fixture uses.
pub const NET: &str = "dev";
/// The relay id of in-process runs (no socket is ever opened on it).
pub const INPROC_RELAY: &str = "http://127.0.0.1:1";
/// The peer relay that calls message.deliver in-process.
pub const PEER_RELAY: &str = "http://127.0.0.2:1";
/// The revision of every route the fixture makes (and so of what its deliveries target).
pub const ROUTE_REVISION: u64 = 1;
/// Sender accounts (registered here, round-robin over sends).
const SENDERS: usize = 16;
/// Remote sender accounts (their messages arrive by message.deliver).
const REMOTE: usize = 16;
/// Sync page size.
pub const PAGE: u64 = 50;

struct Account {
    key: AccountKey,
    device: DeviceKey,
    cert: Object,
}

fn account(rng: &mut ChaCha20Rng) -> Account {
    let key = AccountKey::generate(rng);
    let device = DeviceKey::generate(rng);
    let cert = draft::certificate(
        NET,
        &key,
        &device,
        &["send", "sync", "manage"],
        now_ms() - 1000,
    )
    .sign(&key);
    Account { key, device, cert }
}

/// One local account: its registration and session.open bodies.
#[derive(Clone)]
pub struct Local {
    pub register: Vec<u8>,
    pub session_open: Vec<u8>,
}

/// All requests of one run against one relay id.
pub struct Fixture {
    senders: Vec<Account>,
    to: Account,
    rng: ChaCha20Rng,
    pub relay: String,
    /// Senders first, the recipient last.
    pub accounts: Vec<Local>,
    /// (sender index, message.send params), all to the recipient.
    pub sends: Vec<(usize, Vec<u8>)>,
    /// message.deliver params from remote accounts to the recipient.
    pub delivers: Vec<Vec<u8>>,
}

impl Fixture {
    /// `n` more message.send params from the same senders; to the recipient, or to an
    /// account whose home is `remote` (with its route) when given.
    pub fn more_sends(&mut self, n: usize, remote: Option<&str>) -> Vec<(usize, Vec<u8>)> {
        let now = now_ms();
        let far = remote.map(|relay| {
            let key = AccountKey::generate(&mut self.rng);
            let device = DeviceKey::generate(&mut self.rng);
            let route = draft::route(NET, &key.id(), relay, ROUTE_REVISION, now).sign(&key);
            let cert = draft::certificate(NET, &key, &device, &["send"], now).sign(&key);
            (Account { key, device, cert }, route)
        });
        (0..n)
            .map(|i| {
                let s = i % self.senders.len();
                let to = far.as_ref().map_or(&self.to, |(a, _)| a);
                let (env, boxes) = message(&mut self.rng, &self.senders[s], to, now);
                let mut p = Object::new();
                p.insert("envelope", env);
                p.insert("recipient_boxes", boxes);
                if let Some((_, route)) = &far {
                    p.insert("recipient_route", route.clone());
                }
                (s, canonical::object_to_vec(&p))
            })
            .collect()
    }

    /// The recipient's index in `accounts`.
    pub fn recipient(&self) -> usize {
        self.accounts.len() - 1
    }

    /// The fixture as JSON for the Node in-process run (bodies as JSON text).
    pub fn to_json(&self) -> Vec<u8> {
        let text = |b: &[u8]| Value::String(String::from_utf8_lossy(b).into_owned());
        let mut o = Object::new();
        o.insert("relay", self.relay.as_str());
        o.insert("peer", PEER_RELAY);
        o.insert("route_revision", ROUTE_REVISION);
        o.insert(
            "accounts",
            Value::Array(
                self.accounts
                    .iter()
                    .map(|a| {
                        let mut x = Object::new();
                        x.insert("register", text(&a.register));
                        x.insert("session_open", text(&a.session_open));
                        Value::Object(x)
                    })
                    .collect(),
            ),
        );
        o.insert(
            "sends",
            Value::Array(
                self.sends
                    .iter()
                    .map(|(s, b)| {
                        let mut x = Object::new();
                        x.insert("sender", *s as u64);
                        x.insert("params", text(b));
                        Value::Object(x)
                    })
                    .collect(),
            ),
        );
        o.insert(
            "delivers",
            Value::Array(self.delivers.iter().map(|b| text(b)).collect()),
        );
        canonical::object_to_vec(&o)
    }
}

fn message(
    rng: &mut ChaCha20Rng,
    from: &Account,
    to: &Account,
    created_at: u64,
) -> (Object, Value) {
    let key = seal::message_key(rng);
    let body = seal::seal_body(rng, &key, &[b'x'; 900]);
    let env = draft::envelope(
        NET,
        &random_id(rng),
        &from.key.id(),
        &from.device.id(),
        &to.key.id(),
        created_at,
        body,
    )
    .sign(&from.device);
    let kb = seal::seal_key_box(rng, &to.device.id(), &to.device.box_key(), &key);
    (env, seal::boxes(vec![kb]))
}

/// An account's registration and session.open bodies for `relay`.
fn local(rng: &mut ChaCha20Rng, a: &Account, relay: &str, now: u64) -> Local {
    let mut p = Object::new();
    p.insert(
        "route",
        draft::route(NET, &a.key.id(), relay, ROUTE_REVISION, now).sign(&a.key),
    );
    p.insert("certificate", a.cert.clone());
    p.insert("discoverable", true);
    let open = draft::session_open(
        NET,
        relay,
        &a.key.id(),
        &a.device.id(),
        now,
        &random_id(rng),
    )
    .sign(&a.device);
    Local {
        register: canonical::object_to_vec(&p),
        session_open: canonical::object_to_vec(&open),
    }
}

/// Builds `sends` message.send and `delivers` message.deliver requests for relay `relay`.
pub fn build(relay: &str, sends: usize, delivers: usize, seed: u64) -> Fixture {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let senders: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
    let to = account(&mut rng);
    let remote: Vec<Account> = (0..REMOTE).map(|_| account(&mut rng)).collect();
    let now = now_ms();
    let accounts = senders
        .iter()
        .chain(std::iter::once(&to))
        .map(|a| local(&mut rng, a, relay, now))
        .collect();
    let sends = (0..sends)
        .map(|i| {
            let s = i % senders.len();
            let (env, boxes) = message(&mut rng, &senders[s], &to, now);
            let mut p = Object::new();
            p.insert("envelope", env);
            p.insert("recipient_boxes", boxes);
            (s, canonical::object_to_vec(&p))
        })
        .collect();
    let delivers = (0..delivers)
        .map(|i| {
            let from = &remote[i % remote.len()];
            let (env, boxes) = message(&mut rng, from, &to, now);
            let mut p = Object::new();
            p.insert("envelope", env);
            p.insert("recipient_boxes", boxes);
            p.insert("device_certificate", from.cert.clone());
            canonical::object_to_vec(&p)
        })
        .collect();
    Fixture {
        senders,
        to,
        rng,
        relay: relay.to_string(),
        accounts,
        sends,
        delivers,
    }
}

/// Accounts that send to each other: `accounts` registered at `relay` (sessions opened
/// with the bodies in `accounts`), and `sends` message.send params, each from one account
/// to another (or to itself, with `to_self`) drawn at random. On a sharded relay most go
/// between shards: with `k` shards, `(k - 1) / k` of them.
pub fn mesh(relay: &str, accounts: usize, sends: usize, to_self: bool, seed: u64) -> Fixture {
    let mut fx = build(relay, 0, 0, seed);
    let now = now_ms();
    let extra: Vec<Account> = (fx.senders.len()..accounts)
        .map(|_| account(&mut fx.rng))
        .collect();
    for a in &extra {
        let l = local(&mut fx.rng, a, relay, now);
        // Before the recipient, which stays last.
        let at = fx.accounts.len() - 1;
        fx.accounts.insert(at, l);
    }
    fx.senders.extend(extra);
    let n = fx.senders.len();
    fx.sends = (0..sends)
        .map(|i| {
            use rand::Rng;
            let s = i % n;
            let to = if to_self {
                s
            } else {
                (s + fx.rng.gen_range(1..n)) % n
            };
            let (env, boxes) = message(&mut fx.rng, &fx.senders[s], &fx.senders[to], now);
            let mut p = Object::new();
            p.insert("envelope", env);
            p.insert("recipient_boxes", boxes);
            (s, canonical::object_to_vec(&p))
        })
        .collect();
    fx
}

/// The session token in a session.open answer.
pub fn token(body: &[u8]) -> Option<String> {
    relay_core::wire::json::parse_object(body)
        .ok()?
        .get("session")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The `status` member of a message.send answer.
pub fn status(body: &[u8]) -> Option<String> {
    relay_core::wire::json::parse_object(body)
        .ok()?
        .get("status")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The number of entries in a sync answer.
pub fn entries(body: &[u8]) -> usize {
    relay_core::wire::json::parse_object(body)
        .ok()
        .and_then(|o| match o.get("entries") {
            Some(Value::Array(a)) => Some(a.len()),
            _ => None,
        })
        .unwrap_or(0)
}

/// Two relays' accounts and the sends between them (the federation part): [`SENDERS`]
/// senders at relay `a`, as many discoverable recipients at relay `b` and as many at `a`.
pub struct Federation {
    rng: ChaCha20Rng,
    senders: Vec<Account>,
    far: Vec<Account>,
    near: Vec<Account>,
    /// Registrations and session.open bodies at `a`: the senders, then `a`'s recipients.
    pub at_a: Vec<Local>,
    /// Registrations at `b`: its recipients.
    pub at_b: Vec<Local>,
    /// route.publish bodies of `b`'s recipients, for `a` to hold before any send.
    pub routes: Vec<Vec<u8>>,
}

impl Federation {
    /// The accounts of both relays, seeded.
    pub fn new(a: &str, b: &str, seed: u64) -> Federation {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let now = now_ms();
        let senders: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
        let far: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
        let near: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
        let at_a = senders
            .iter()
            .chain(&near)
            .map(|x| local(&mut rng, x, a, now))
            .collect();
        let at_b = far.iter().map(|x| local(&mut rng, x, b, now)).collect();
        let routes = far
            .iter()
            .map(|x| {
                let mut p = Object::new();
                p.insert(
                    "route",
                    draft::route(NET, &x.key.id(), b, ROUTE_REVISION, now).sign(&x.key),
                );
                canonical::object_to_vec(&p)
            })
            .collect();
        Federation {
            rng,
            senders,
            far,
            near,
            at_a,
            at_b,
            routes,
        }
    }

    /// `n` message.send params (sender index, params) from the senders round robin, each
    /// to a recipient at `b` (`far`) or at `a`, round robin too.
    pub fn sends(&mut self, n: usize, far: bool) -> Vec<(usize, Vec<u8>)> {
        let now = now_ms();
        (0..n)
            .map(|i| {
                let s = i % self.senders.len();
                let group = if far { &self.far } else { &self.near };
                let to = &group[(i / self.senders.len() + s) % group.len()];
                let (env, boxes) = message(&mut self.rng, &self.senders[s], to, now);
                let mut p = Object::new();
                p.insert("envelope", env);
                p.insert("recipient_boxes", boxes);
                (s, canonical::object_to_vec(&p))
            })
            .collect()
    }
}
