//! One conformance suite for every host: each rule of the seed, run against real relay
//! processes (the wasmtime host, the Node host, each over SQLite, and the edge host on
//! workerd over its Durable Objects' SQLite) over HTTP and WebSocket, for every ordered
//! pair of hosts (each host with itself, and every mixed pair both ways). Each relay sits
//! behind a fault-injecting proxy, which is its public id, so every relay RPC between them
//! passes through it.
//!
//! Each scenario is a function of its hosts; `every_pair!` and `every_host!` make one test
//! per pair or host, named `scenario::wasmtime_to_node` or `scenario::node`.
//!
//! The relays are built by `./x test` (`target/release/relay`, `target/component/`,
//! `host-node/pkg`, `host-node/pkg/web` and workerd) before this suite runs.

use relay_core::client::DeviceKey;
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use relay_tests::live::check::{verify, Sent};
use relay_tests::live::client::{
    code_of, decrypt, status_of, str_of, u64_of, Client, Socket, User,
};
use relay_tests::live::host::{Kind, Opts, Relay};
use relay_tests::live::proxy::{now_ms, Chaos, Fault, Hit, Proxy};
use relay_tests::{field, Msg};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// One test per ordered pair of hosts for `scenario(ka, kb)`, in a module named after it:
/// `scenario::wasmtime_to_node` runs it with A on wasmtime and B on Node, so a failure
/// names its pair.
macro_rules! every_pair {
    ($scenario:ident) => {
        mod $scenario {
            use super::Kind::{Edge, Node, Wasmtime};

            #[test]
            fn wasmtime_to_wasmtime() {
                super::$scenario(Wasmtime, Wasmtime);
            }

            #[test]
            fn node_to_node() {
                super::$scenario(Node, Node);
            }

            #[test]
            fn wasmtime_to_node() {
                super::$scenario(Wasmtime, Node);
            }

            #[test]
            fn node_to_wasmtime() {
                super::$scenario(Node, Wasmtime);
            }

            #[test]
            fn edge_to_edge() {
                super::$scenario(Edge, Edge);
            }

            #[test]
            fn edge_to_wasmtime() {
                super::$scenario(Edge, Wasmtime);
            }

            #[test]
            fn edge_to_node() {
                super::$scenario(Edge, Node);
            }

            #[test]
            fn wasmtime_to_edge() {
                super::$scenario(Wasmtime, Edge);
            }

            #[test]
            fn node_to_edge() {
                super::$scenario(Node, Edge);
            }
        }
    };
}

/// One test per host for `scenario(k)`, in a module named after it: `scenario::wasmtime`,
/// `scenario::node` and `scenario::edge`.
macro_rules! every_host {
    ($scenario:ident) => {
        mod $scenario {
            use super::Kind::{Edge, Node, Wasmtime};

            #[test]
            fn wasmtime() {
                super::$scenario(Wasmtime);
            }

            #[test]
            fn node() {
                super::$scenario(Node);
            }

            #[test]
            fn edge() {
                super::$scenario(Edge);
            }
        }
    };
}

// The macros name each host (`Kind::ALL`) and each pair (`Kind::PAIRS`) by hand: a new
// host fails to compile here until they name it too.
const _: fn(Kind) = |k| match k {
    Kind::Wasmtime | Kind::Node | Kind::Edge => {}
};
const _: () = assert!(Kind::ALL.len() == 3 && Kind::PAIRS.len() == 9);

/// Chaos that loses every request on the fault prefix (none is forwarded).
const LOSE_ALL: Chaos = Chaos {
    drop_request: 1000,
    drop_response: 0,
    delay: 0,
    delay_ms: 0,
    rate_limited: 0,
    retry_after_ms: 0,
    unavailable: 0,
    reset: 0,
};

/// A relay behind its proxy.
struct Proxied {
    relay: Relay,
    proxy: Proxy,
}

fn proxied(kind: Kind, opts: Opts) -> Proxied {
    let proxy = Proxy::start();
    let relay = Relay::start(
        kind,
        Opts {
            url: Some(proxy.url()),
            ..opts
        },
    );
    proxy.set_upstream(relay.port);
    Proxied { relay, proxy }
}

/// Two relays behind proxies, alice homed at A and bob at B, and A holding bob's route.
struct Duo {
    a: Proxied,
    b: Proxied,
    c: Client,
    alice: User,
    bob: User,
}

fn duo(ka: Kind, kb: Kind, oa: Opts, ob: Opts, seed: u64) -> Duo {
    let (a, b) = (proxied(ka, oa), proxied(kb, ob));
    let mut c = Client::new(seed);
    let alice = c.register(&a.relay, true);
    let bob = c.register(&b.relay, true);
    c.publish(&a.relay, &bob);
    Duo {
        a,
        b,
        c,
        alice,
        bob,
    }
}

/// The invariants after messages from `alice` (at A) to `bob` (at B).
fn verify_pair(c: &Client, (alice, bob): (&User, &User), a: &Proxied, b: &Proxied, p: &[&Object]) {
    let sent: Vec<Sent> = p.iter().map(|p| sent_from(0, 1, p)).collect();
    verify(
        c,
        &[alice, bob],
        &sent,
        &[&a.proxy, &b.proxy],
        &[&a.relay, &b.relay],
        100,
        WAIT,
    );
}

/// After retries of `p` (B's proxy saw `hits`): every retry was unchanged, bob received the
/// message once, and every invariant holds.
fn retried_unchanged_and_accepted_once(d: &Duo, p: &Object, hits: &[Hit]) {
    assert!(
        hits.windows(2).all(|w| w[0].body == w[1].body),
        "retries are unchanged"
    );
    assert_eq!(
        received(&d.c, &d.bob, &message_id(p)).len(),
        1,
        "accepted once"
    );
    verify_pair(&d.c, (&d.alice, &d.bob), &d.a, &d.b, &[p]);
}

fn message_id(p: &Object) -> String {
    relay_tests::message_id(p)
}

fn received(c: &Client, u: &User, id: &str) -> Vec<(String, String, String)> {
    c.texts(u, 0)
        .into_iter()
        .filter(|(k, i, _)| i == id && (k == "received" || k == "self"))
        .collect()
}

fn sent_from(i: usize, to: usize, p: &Object) -> Sent {
    Sent {
        id: message_id(p),
        from: i,
        to,
    }
}

// ---------------------------------------------------------------- delivery flow

/// Seed, "Cross-Account Delivery": send, deliver, target_accepted; the recipient is told
/// over its WebSocket, syncs, verifies nothing is lost; sender_boxes make a sent record.
fn seed_cross_account_delivery_both_ways(ka: Kind, kb: Kind) {
    let Duo {
        a,
        b,
        mut c,
        alice,
        bob,
    } = duo(ka, kb, Opts::default(), Opts::default(), 1);
    c.publish(&b.relay, &alice);
    let mut bob_ws = Socket::connect(&bob, 0);
    for (from, to, sock) in [(&alice, &bob, Some(&mut bob_ws)), (&bob, &alice, None)] {
        let m = Msg {
            sender_boxes: true,
            ..Msg::default()
        };
        let p = c.message(from, to, &format!("hello {}", to.id()), &m);
        let id = message_id(&p);
        let (s, v) = c.send(from, &p);
        assert_eq!(s, 200, "{v:?}");
        assert!(
            matches!(status_of(&v).as_str(), "delivering" | "target_accepted"),
            "{v:?}"
        );
        assert_eq!(str_of(&v, "message_id"), id);
        let done = c.wait_terminal(from, &id, WAIT);
        assert_eq!(status_of(&done), "target_accepted", "{done:?}");
        assert!(u64_of(&done, "deadline").is_some());
        assert_eq!(u64_of(&done, "accepted_at"), u64_of(&v, "accepted_at"));
        // The recipient: one received record, decrypted with its own key box.
        let got = received(&c, to, &id);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].2, format!("hello {}", to.id()));
        let rec = c
            .sync(to, 0)
            .into_iter()
            .find(|e| str_of(&Value::Object(e.clone()), "kind") == "received");
        let rec = Value::Object(rec.expect("received record"));
        assert_eq!(
            u64_of(&rec, "accepted_at"),
            u64_of(&done, "target_accepted_at")
        );
        let cert = field(&rec, "device_certificate")
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(
            canonical::to_vec(&cert),
            canonical::object_to_vec(&from.certs[0]),
            "the entry carries the sending device's certificate"
        );
        // The sender: one sent record (sender_boxes were given), which it can read.
        let mine: Vec<_> = c
            .texts(from, 0)
            .into_iter()
            .filter(|(k, i, _)| k == "sent" && *i == id)
            .collect();
        assert_eq!(mine.len(), 1, "{mine:?}");
        assert_eq!(mine[0].2, format!("hello {}", to.id()));
        if let Some(ws) = sock {
            let n = ws
                .notification(Duration::from_secs(10))
                .expect("message.timeline.changed over the WebSocket");
            assert_eq!(str_of(&n, "method"), "message.timeline.changed");
            let params = field(&n, "params").cloned().unwrap_or(Value::Null);
            assert_eq!(str_of(&params, "account"), to.id());
            let mut q = Object::new();
            q.insert("after", 0u64);
            let page = ws.call("message.timeline.sync", &q);
            let entries = field(&page, "result")
                .and_then(|r| field(r, "entries"))
                .and_then(relay_tests::array)
                .unwrap_or_default();
            let texts: Vec<String> = entries
                .iter()
                .filter_map(Value::as_object)
                .map(|e| decrypt(e, &to.devices[0]).2)
                .collect();
            assert_eq!(texts, vec![format!("hello {}", to.id())]);
        }
    }
    // Exactly one relay RPC each way: nothing was retried.
    assert_eq!(
        b.proxy
            .log()
            .iter()
            .filter(|h| h.message_id.is_some())
            .count(),
        1
    );
    assert_eq!(
        a.proxy
            .log()
            .iter()
            .filter(|h| h.message_id.is_some())
            .count(),
        1
    );
}
every_pair!(seed_cross_account_delivery_both_ways);

/// Seed, "Account Self-Delivery": one record, target_accepted at once, no relay RPC;
/// sender_boxes, authorization or recipient_route are refused.
fn seed_self_delivery(k: Kind) {
    let a = proxied(k, Opts::default());
    let mut c = Client::new(2);
    let mut alice = c.register(&a.relay, false);
    c.add_device(&mut alice);
    let p = c.message(&alice, &alice, "note to self", &Msg::default());
    let (s, v) = c.send(&alice, &p);
    assert_eq!(s, 200, "{v:?}");
    assert_eq!(status_of(&v), "target_accepted");
    let (_, st) = c.status(&alice, &message_id(&p));
    assert_eq!(status_of(&st), "target_accepted");
    assert_eq!(u64_of(&st, "accepted_at"), u64_of(&v, "accepted_at"));
    for dev in 0..2 {
        let all = c.texts(&alice, dev);
        assert_eq!(
            all,
            vec![("self".into(), message_id(&p), "note to self".into())],
            "device {dev}"
        );
    }
    let refused = [
        Msg {
            sender_boxes: true,
            ..Msg::default()
        },
        Msg {
            recipient_route: Some(alice.route.clone()),
            ..Msg::default()
        },
    ];
    for m in refused {
        let p = c.message(&alice, &alice, "bad", &m);
        let (s, v) = c.send(&alice, &p);
        assert_eq!((s, code_of(&v).as_str()), (400, "invalid_params"), "{v:?}");
    }
    assert_eq!(c.texts(&alice, 0).len(), 1);
    assert!(a.proxy.log().is_empty(), "self-delivery used relay RPC");
}
every_host!(seed_self_delivery);

/// Seed, "Delivery Flow" step 2: a relay serving both accounts delivers directly.
fn seed_local_delivery(k: Kind) {
    let a = proxied(k, Opts::default());
    let mut c = Client::new(3);
    let alice = c.register(&a.relay, true);
    let carol = c.register(&a.relay, true);
    let p = c.message(&alice, &carol, "next door", &Msg::default());
    let (s, v) = c.send(&alice, &p);
    assert_eq!(s, 200, "{v:?}");
    let done = c.wait_terminal(&alice, &message_id(&p), WAIT);
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    assert_eq!(received(&c, &carol, &message_id(&p)).len(), 1);
    // No sender_boxes: no sent record.
    assert!(c.texts(&alice, 0).is_empty());
    assert!(a.proxy.log().is_empty(), "local delivery used relay RPC");
}
every_host!(seed_local_delivery);

// ---------------------------------------------------------------- receiving rules

/// Builds a message from `from` to `to`, sends it, and returns its terminal status.
fn send_and_wait(c: &mut Client, from: &User, to: &User, text: &str, m: &Msg) -> Value {
    let p = c.message(from, to, text, m);
    deliver_and_wait(c, from, &p)
}

/// Sends `p` from `from` and returns its terminal status.
fn deliver_and_wait(c: &Client, from: &User, p: &Object) -> Value {
    let (s, v) = c.send(from, p);
    assert_eq!(s, 200, "the source accepts: {v:?}");
    c.wait_terminal(from, &message_id(p), WAIT)
}

/// Seed, "Receiving Validation Rules" 1 to 5, checked by the destination with its own
/// policies; a rejection ends the source's delivery `failed` with the destination's error.
fn seed_receiving_validation_rules(ka: Kind, kb: Kind) {
    let a = proxied(ka, Opts::default());
    // The destination's own, stricter policies (rules 2 and 3): policies are independent.
    let b = proxied(
        kb,
        Opts::default()
            .policy("max_boxes", 1)
            .policy("message_delivery_age_limit", 60_000),
    );
    let mut c = Client::new(4);
    let alice = c.register(&a.relay, true);
    let mut bob = c.register(&b.relay, true);
    c.publish(&a.relay, &bob);

    // Rule 1: B is named by a route, but does not serve the account.
    let dave = c.unregistered(&b.relay);
    c.publish(&a.relay, &dave);
    let st = send_and_wait(&mut c, &alice, &dave, "r1", &Msg::default());
    assert_eq!(
        (status_of(&st).as_str(), code_of(&st).as_str()),
        ("failed", "not_home_relay"),
        "{st:?}"
    );

    // Rule 2: the destination's object constraints (two boxes, its max_boxes is 1).
    c.add_device(&mut bob);
    let st = send_and_wait(&mut c, &alice, &bob, "r2", &Msg::default());
    assert_eq!(
        (status_of(&st).as_str(), code_of(&st).as_str()),
        ("failed", "invalid_params"),
        "{st:?}"
    );

    // Rule 3: the destination's own age limit (a minute; the source's is a week).
    let old = Msg {
        created_offset: -120_000,
        to_devices: Some(vec![0]),
        ..Msg::default()
    };
    let st = send_and_wait(&mut c, &alice, &bob, "r3", &old);
    assert_eq!(
        (status_of(&st).as_str(), code_of(&st).as_str()),
        ("failed", "message_expired"),
        "{st:?}"
    );

    // Rule 4: credentials. Not discoverable and none given: refused.
    let erin = c.register(&b.relay, false);
    c.publish(&a.relay, &erin);
    let st = send_and_wait(&mut c, &alice, &erin, "r4", &Msg::default());
    assert_eq!(code_of(&st), "discovery_disabled", "{st:?}");
    // An invite from the recipient opens the way.
    let invite = c.invite(&erin, 3_600_000);
    let with = Msg {
        authorization: Some(invite.clone()),
        ..Msg::default()
    };
    let p = c.message(&alice, &erin, "r4 invited", &with);
    let st = deliver_and_wait(&c, &alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    assert_eq!(received(&c, &erin, &message_id(&p))[0].2, "r4 invited");
    // Revoked at the destination: refused, and never falls back to discovery (bob is
    // discoverable, yet his revoked invite is not accepted).
    let bob_invite = c.invite(&bob, 3_600_000);
    for (who, inv) in [(&erin, &invite), (&bob, &bob_invite)] {
        let mut q = Object::new();
        q.insert(
            "invite_id",
            str_of(&Value::Object(inv.clone()), "invite_id"),
        );
        let (s, v) = c.call_as(who, "contact.revoke", &q);
        assert_eq!(s, 200, "{v:?}");
        let m = Msg {
            authorization: Some(inv.clone()),
            to_devices: Some(vec![0]),
            ..Msg::default()
        };
        let st = send_and_wait(&mut c, &alice, who, "r4 revoked", &m);
        assert_eq!(code_of(&st), "authorization_invalid", "{st:?}");
    }

    // Rule 5: no box names a valid device of the recipient.
    let mut ghost = c.register(&b.relay, true);
    c.publish(&a.relay, &ghost);
    let mut rng = <rand_chacha::ChaCha20Rng as rand::SeedableRng>::seed_from_u64(40);
    ghost.devices.push(DeviceKey::generate(&mut rng));
    let only_unknown = Msg {
        to_devices: Some(vec![1]),
        ..Msg::default()
    };
    let st = send_and_wait(&mut c, &alice, &ghost, "r5", &only_unknown);
    assert_eq!(code_of(&st), "device_unknown", "{st:?}");
    // One valid device is enough; the unknown one simply cannot read it. (B's max_boxes
    // is 1, so this runs against a relay without that limit: A, locally.)
    let mut local = c.register(&a.relay, true);
    local.devices.push(DeviceKey::generate(&mut rng));
    let p = c.message(&alice, &local, "r5 partly", &Msg::default());
    let st = deliver_and_wait(&c, &alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");

    // No rejected message left a record anywhere.
    assert!(c.texts(&bob, 0).is_empty(), "{:?}", c.texts(&bob, 0));
    assert!(c.texts(&ghost, 0).is_empty());
    assert_eq!(c.texts(&erin, 0).len(), 1);
}
every_pair!(seed_receiving_validation_rules);

// ---------------------------------------------------------------- idempotency

/// Seed, "Idempotent Message Retries": an identical send (over HTTP or the WebSocket)
/// answers the latest status with the same accepted_at and adds nothing; a different one
/// under the same message id is state_conflict and changes nothing.
fn seed_identical_and_conflicting_retries(ka: Kind, kb: Kind) {
    // `_a` keeps relay A running to the end of the scenario.
    let Duo {
        a: _a,
        b,
        mut c,
        alice,
        bob,
    } = duo(ka, kb, Opts::default(), Opts::default(), 5);
    let p = c.message(&alice, &bob, "once", &Msg::default());
    let id = message_id(&p);
    let (_, first) = c.send(&alice, &p);
    let done = c.wait_terminal(&alice, &id, WAIT);
    assert_eq!(status_of(&done), "target_accepted");
    for _ in 0..3 {
        let (s, again) = c.send(&alice, &p);
        assert_eq!(s, 200);
        assert_eq!(status_of(&again), "target_accepted", "the latest status");
        assert_eq!(u64_of(&again, "accepted_at"), u64_of(&first, "accepted_at"));
    }
    let mut ws = Socket::connect(&alice, 0);
    let over_ws = ws.call("message.send", &p);
    let r = field(&over_ws, "result").cloned().unwrap_or(Value::Null);
    assert_eq!(
        u64_of(&r, "accepted_at"),
        u64_of(&first, "accepted_at"),
        "{over_ws:?}"
    );
    // Same key, different content (fresh key boxes): state_conflict.
    let mut other = c.message(&alice, &bob, "twice", &Msg::default());
    other.insert(
        "envelope",
        p.get("envelope").cloned().unwrap_or(Value::Null),
    );
    let (s, v) = c.send(&alice, &other);
    assert_eq!((s, code_of(&v).as_str()), (409, "state_conflict"), "{v:?}");
    let (_, st) = c.status(&alice, &id);
    assert_eq!(status_of(&st), "target_accepted");
    let got = received(&c, &bob, &id);
    assert_eq!(got.len(), 1, "one record, still readable: {got:?}");
    assert_eq!(got[0].2, "once");
    assert_eq!(b.proxy.delivers(&id).len(), 1, "no duplicate delivery");
}
every_pair!(seed_identical_and_conflicting_retries);

/// Sends each body once from its own thread, all released together by a barrier, and
/// returns the answers in the order of `bodies`.
fn all_at_once(c: &Client, from: &User, bodies: &[&Object]) -> Vec<(u16, Vec<u8>)> {
    let start = std::sync::Barrier::new(bodies.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = bodies
            .iter()
            .map(|p| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    c.send_bytes(from, p)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("sender thread"))
            .collect()
    })
}

/// Seed, "Idempotent retries", with the requests truly concurrent: eight identical
/// `message.send`s at once are one acceptance and one record, and every answer is the latest
/// status known with the one `accepted_at` (on a sharded relay the recipient may sit on
/// another shard, so an answer may already say `target_accepted` where the first said
/// `delivering`); four and four of two contents under one key at once are one acceptance of
/// whichever came first, and `state_conflict` for every request of the other.
fn concurrent_identical_sends_are_one_acceptance(k: Kind) {
    let a = proxied(k, Opts::default());
    let mut c = Client::new(8);
    let alice = c.register(&a.relay, true);
    let carol = c.register(&a.relay, true);
    let p = c.message(&alice, &carol, "at once", &Msg::default());
    let id = message_id(&p);
    let accepted_at = |body: &[u8]| {
        let v: Value = relay_core::wire::json::parse(body).expect("a JSON answer");
        (u64_of(&v, "accepted_at"), str_of(&v, "message_id"))
    };
    let answers = all_at_once(&c, &alice, &[&p; 8]);
    for (s, body) in &answers {
        assert_eq!(*s, 200, "{}", String::from_utf8_lossy(body));
        assert_eq!(
            accepted_at(body),
            accepted_at(&answers[0].1),
            "one acceptance"
        );
    }
    assert!(accepted_at(&answers[0].1).0.is_some());
    let done = c.wait_terminal(&alice, &id, WAIT);
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    assert_eq!(received(&c, &carol, &id).len(), 1, "one record");

    let q = c.message(&alice, &carol, "first", &Msg::default());
    let mut other = c.message(&alice, &carol, "second", &Msg::default());
    other.insert(
        "envelope",
        q.get("envelope").cloned().unwrap_or(Value::Null),
    );
    let bodies = [&q, &other, &q, &other, &q, &other, &q, &other];
    let answers = all_at_once(&c, &alice, &bodies);
    let won: Vec<bool> = answers.iter().map(|(s, _)| *s == 200).collect();
    let winner = won.iter().position(|w| *w).expect("one content accepted");
    for (i, (s, body)) in answers.iter().enumerate() {
        let text = String::from_utf8_lossy(body);
        if i % 2 == winner % 2 {
            assert_eq!(*s, 200, "{text}");
            assert_eq!(
                accepted_at(body),
                accepted_at(&answers[winner].1),
                "one acceptance"
            );
        } else {
            assert_eq!(*s, 409, "{text}");
            assert!(text.contains("state_conflict"), "{text}");
        }
    }
    let qid = message_id(&q);
    c.wait_terminal(&alice, &qid, WAIT);
    let got = received(&c, &carol, &qid);
    assert_eq!(got.len(), 1, "one record: {got:?}");
    // `other` carries boxes made for another envelope: its record is kept but reads as such.
    let text = if winner % 2 == 0 {
        "first"
    } else {
        "<does not decrypt>"
    };
    assert_eq!(got[0].2, text, "the record is the winner's");
}
every_host!(concurrent_identical_sends_are_one_acceptance);

/// Seed, "DeliveryStatus" and retention: status of an unknown or another account's message
/// is not_found; during retention it answers; after it the request is not recognized and,
/// beyond the age limit, message_expired.
fn seed_status_queries_and_result_retention(k: Kind) {
    let opts = Opts::default()
        .policy("message_retention", 4_000)
        .policy("message_delivery_age_limit", 3_000);
    let a = proxied(k, opts);
    let mut c = Client::new(6);
    let alice = c.register(&a.relay, true);
    let carol = c.register(&a.relay, true);
    let (s, v) = c.status(&alice, "AAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!((s, code_of(&v).as_str()), (404, "not_found"), "{v:?}");
    let p = c.message(&alice, &carol, "kept a while", &Msg::default());
    let id = message_id(&p);
    let created = u64_of(p.get("envelope").unwrap(), "created_at").unwrap();
    let done = deliver_and_wait(&c, &alice, &p);
    assert_eq!(status_of(&done), "target_accepted");
    // The deadline: the earlier of created_at + age limit and accepted_at + retention.
    let accepted = u64_of(&done, "accepted_at").unwrap();
    assert_eq!(
        u64_of(&done, "deadline"),
        Some((created + 3_000).min(accepted + 4_000))
    );
    let (s, v) = c.status(&carol, &id);
    assert_eq!(
        (s, code_of(&v).as_str()),
        (404, "not_found"),
        "only the sender's: {v:?}"
    );
    let self_p = c.message(&alice, &alice, "me", &Msg::default());
    c.send(&alice, &self_p);
    let (_, st) = c.status(&alice, &message_id(&self_p));
    assert_eq!(
        status_of(&st),
        "target_accepted",
        "status of self-delivery too"
    );
    // During retention, a retry is recognized.
    let (_, again) = c.send(&alice, &p);
    assert_eq!(u64_of(&again, "accepted_at"), Some(accepted));
    std::thread::sleep(Duration::from_millis(
        (accepted + 4_500).saturating_sub(now_ms()),
    ));
    let (s, v) = c.status(&alice, &id);
    assert!(
        matches!(code_of(&v).as_str(), "not_found" | "message_expired") && s >= 400,
        "after retention: {s} {v:?}"
    );
    let (s, v) = c.send(&alice, &p);
    assert_eq!((s, code_of(&v).as_str()), (410, "message_expired"), "{v:?}");
    assert_eq!(
        received(&c, &carol, &id).len(),
        0,
        "expired with its retention"
    );
}
every_host!(seed_status_queries_and_result_retention);

/// How close to the deadline an attempt's answer may be written and still count as in
/// flight at the deadline (the source's deadline timer and that answer race).
const IN_FLIGHT_MARGIN_MS: u64 = 250;

/// Seed, "Delivery Deadlines and Retries": a destination that never answers well ends the
/// delivery failed with deadline_exceeded at the fixed deadline, carrying the last error
/// (`result_unknown` when the last outcome was never learned); nothing is sent after it.
fn seed_delivery_deadline(ka: Kind, kb: Kind) {
    let a = proxied(
        ka,
        Opts::default().policy("message_delivery_age_limit", 3_000),
    );
    let b = proxied(kb, Opts::default());
    let mut c = Client::new(7);
    let alice = c.register(&a.relay, true);
    let bob = c.register(&b.relay, true);
    c.publish(&a.relay, &bob);
    let always = |f| Chaos {
        drop_request: 0,
        drop_response: if f == Fault::DropResponse { 1000 } else { 0 },
        delay: 0,
        delay_ms: 0,
        rate_limited: 0,
        retry_after_ms: 0,
        unavailable: if f == Fault::Unavailable { 1000 } else { 0 },
        reset: 0,
    };
    let mut sent = Vec::new();
    for (fault, last) in [
        (Fault::Unavailable, "unavailable"),
        (Fault::DropResponse, "result_unknown"),
    ] {
        b.proxy.chaos(always(fault), 7);
        let p = c.message(&alice, &bob, "in vain", &Msg::default());
        let st = deliver_and_wait(&c, &alice, &p);
        b.proxy.heal();
        assert_eq!(code_of(&st), "deadline_exceeded", "{st:?}");
        let data = field(&st, "error").and_then(|e| field(e, "data")).cloned();
        let seen = data.as_ref().map(|d| str_of(d, "last_error"));
        let hits = b.proxy.delivers(&message_id(&p));
        // An attempt still in flight at the deadline has an outcome never learned, so
        // `result_unknown` is right for it whatever the fault: allowed only when the
        // last attempt was answered so near the deadline that its answer could land
        // after it (the source's timer and the answer race on a loaded machine).
        let deadline = u64_of(&st, "deadline").expect("the source's deadline");
        let last_in_flight = hits
            .last()
            .is_some_and(|h| h.done_at + IN_FLIGHT_MARGIN_MS >= deadline);
        assert!(
            seen.as_deref() == Some(last)
                || (seen.as_deref() == Some("result_unknown") && last_in_flight),
            "last_error {seen:?}, expected {last} (last attempt {:?}): {st:?}",
            hits.last().map(|h| (h.at, h.done_at))
        );
        assert!(hits.len() >= 2, "it retried");
        sent.push(sent_from(0, 1, &p));
    }
    verify(
        &c,
        &[&alice, &bob],
        &sent,
        &[&a.proxy, &b.proxy],
        &[&a.relay, &b.relay],
        100,
        WAIT,
    );
}
every_pair!(seed_delivery_deadline);

/// Seed, "rate_limited carries valid data.retry_after": the source waits at least that
/// long before the next attempt; and a client over the send rate is told how long to wait.
fn seed_rate_limited_waits_retry_after(ka: Kind, kb: Kind) {
    let oa = Opts::default().policy("send_rate", 3);
    // `_a` keeps relay A running to the end of the scenario.
    let Duo {
        a: _a,
        b,
        mut c,
        alice,
        bob,
    } = duo(ka, kb, oa, Opts::default(), 8);
    b.proxy
        .script(&[Fault::RateLimited(1_200), Fault::RateLimited(700)]);
    let p = c.message(&alice, &bob, "patience", &Msg::default());
    let st = deliver_and_wait(&c, &alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let hits = b.proxy.delivers(&message_id(&p));
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert!(
        hits[1].at >= hits[0].done_at + 1_200,
        "waited {} ms",
        hits[1].at - hits[0].done_at
    );
    assert!(
        hits[2].at >= hits[1].done_at + 700,
        "waited {} ms",
        hits[2].at - hits[1].done_at
    );
    // The source's own limit: 3 sends a minute, then rate_limited with retry_after.
    let mut last = (0, Value::Null);
    for i in 0..3 {
        let p = c.message(&alice, &bob, &format!("burst {i}"), &Msg::default());
        last = c.send(&alice, &p);
    }
    let (s, v) = last;
    assert_eq!((s, code_of(&v).as_str()), (429, "rate_limited"), "{v:?}");
    let wait = field(&v, "error")
        .and_then(|e| field(e, "data"))
        .and_then(|d| u64_of(d, "retry_after"));
    assert!(wait.is_some_and(|w| w > 0), "{v:?}");
}
every_pair!(seed_rate_limited_waits_retry_after);

/// Seed, "Delivery Result Confirmation": a lost request, a lost answer, a reset or a delay
/// past the timeout leaves receipt unknown; the source retries the unchanged
/// message.deliver to the same target, and the destination accepts it once.
fn seed_unknown_outcomes_retried_unchanged_to_the_same_target(ka: Kind, kb: Kind) {
    let mut d = duo(ka, kb, Opts::default(), Opts::default(), 9);
    d.b.proxy.script(&[
        Fault::DropResponse,
        Fault::Delay(2_500),
        Fault::Reset,
        Fault::DropRequest,
        Fault::Unavailable,
    ]);
    let p =
        d.c.message(&d.alice, &d.bob, "are you there", &Msg::default());
    let st = deliver_and_wait(&d.c, &d.alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let hits = d.b.proxy.wait_delivers(&message_id(&p), 6);
    assert_eq!(hits.len(), 6, "{hits:?}");
    retried_unchanged_and_accepted_once(&d, &p, &hits);
}
every_pair!(seed_unknown_outcomes_retried_unchanged_to_the_same_target);

/// protocol.md §6, outbound: an answer longer than the largest a relay reads (1 MiB,
/// `transport::outbound::MAX_ANSWER`) is not read, so its outcome is unknown even though
/// it is a valid `target_accepted`; the source retries the unchanged message.deliver, and
/// the destination accepts the message once. The source's host reads the answer, so the
/// scenario runs once per host.
fn an_answer_over_the_cap_is_an_unknown_outcome(k: Kind) {
    let mut d = duo(k, k, Opts::default(), Opts::default(), 21);
    d.b.proxy.script(&[Fault::Oversized]);
    let p =
        d.c.message(&d.alice, &d.bob, "a long answer", &Msg::default());
    let st = deliver_and_wait(&d.c, &d.alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let hits = d.b.proxy.wait_delivers(&message_id(&p), 2);
    let faults: Vec<Fault> = hits.iter().map(|h| h.fault).collect();
    assert_eq!(
        faults,
        [Fault::Oversized, Fault::Pass],
        "the oversized answer was taken as a result"
    );
    retried_unchanged_and_accepted_once(&d, &p, &hits);
}
every_host!(an_answer_over_the_cap_is_an_unknown_outcome);

/// The operator's `admin.destinations` and retries on every host (issue 32): a destination
/// that keeps answering `unavailable` is listed as failing, with its pending delivery, when
/// its failures began and its last error; retry now reaches it once it is back, its failures
/// end and its last success shows, and retrying the ended delivery is `state_conflict`.
fn operators_see_each_destination_fail_and_recover(k: Kind) {
    let mut d = duo(k, k, Opts::default(), Opts::default(), 23);
    let unavailable = Chaos {
        drop_request: 0,
        drop_response: 0,
        delay: 0,
        delay_ms: 0,
        rate_limited: 0,
        retry_after_ms: 0,
        unavailable: 1000,
        reset: 0,
    };
    d.b.proxy.chaos(unavailable, 23);
    let p =
        d.c.message(&d.alice, &d.bob, "through an outage", &Msg::default());
    let (s, v) = d.c.send(&d.alice, &p);
    assert_eq!(s, 200, "{v:?}");
    let dest = d.b.relay.id();
    // A sharded relay's destinations and deliveries are per shard: ask alice's.
    let alice_id = d.alice.id();
    let row = |c: &Client, failing: bool| {
        let mut q = Object::new();
        q.insert("failing", failing);
        q.insert("limit", 10u64);
        let (s, v) = c.admin_for(&d.a.relay, &alice_id, "destinations", &q);
        assert_eq!(s, 200, "admin.destinations: {v:?}");
        field(&v, "destinations")
            .and_then(relay_tests::array)
            .unwrap_or_default()
            .into_iter()
            .find(|r| field(r, "destination").and_then(Value::as_str) == Some(dest.as_str()))
    };
    let deadline = std::time::Instant::now() + WAIT;
    let failing = loop {
        if let Some(r) = row(&d.c, true) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never listed as failing"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        u64_of(&failing, "consecutive_failures").is_some_and(|n| n >= 1),
        "{failing:?}"
    );
    assert_eq!(u64_of(&failing, "pending"), Some(1), "{failing:?}");
    assert!(u64_of(&failing, "failing_since").is_some(), "{failing:?}");
    let last_error = field(&failing, "last_error")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(str_of(&last_error, "code"), "unavailable", "{failing:?}");
    assert!(!str_of(&last_error, "message").is_empty(), "{failing:?}");
    // The same row as the operator's command line prints it, against this host.
    let shard = relay_core::engine::shard::Shard::of_account(&alice_id, d.a.relay.shards());
    let (ok, table) = d.a.relay.relayctl(shard, &["destinations", "--failing"]);
    assert!(ok, "relay admin destinations: {table}");
    let line = table
        .lines()
        .find(|l| l.starts_with(dest.as_str()))
        .unwrap_or_else(|| panic!("no row for {dest}:\n{table}"));
    assert!(
        line.contains("  no  ") && line.contains("unavailable"),
        "{table}"
    );
    assert!(
        table.starts_with("DESTINATION") && table.contains("(1 destination)"),
        "{table}"
    );
    d.b.proxy.heal();
    // Retry now, through the admin listener of each host (a dotted operator method).
    let mut q = Object::new();
    q.insert("destination", dest.as_str());
    let (s, v) =
        d.c.admin_for(&d.a.relay, &alice_id, "destination.retry", &q);
    assert_eq!(s, 200, "admin.destination.retry: {v:?}");
    assert!(
        u64_of(&v, "brought_forward").is_some_and(|n| n <= 1),
        "{v:?}"
    );
    let st = d.c.wait_terminal(&d.alice, &message_id(&p), WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    // Ended: retrying it is a conflict, on every host.
    let mut q = Object::new();
    q.insert("from", d.alice.id().as_str());
    q.insert("message_id", message_id(&p).as_str());
    let (s, v) = d.c.admin_for(&d.a.relay, &alice_id, "delivery.retry", &q);
    assert_eq!((s, code_of(&v).as_str()), (409, "state_conflict"), "{v:?}");
    let back = row(&d.c, false).expect("the destination is still listed");
    assert_eq!(u64_of(&back, "consecutive_failures"), Some(0), "{back:?}");
    assert_eq!(u64_of(&back, "pending"), Some(0), "{back:?}");
    assert!(u64_of(&back, "failing_since").is_none(), "{back:?}");
    assert!(u64_of(&back, "last_success_at").is_some(), "{back:?}");
    assert!(row(&d.c, true).is_none(), "no longer failing");
    // Paused: a message is accepted but not attempted, until resumed.
    // Through relayctl: `relay admin pause`, one line saying what changed.
    let (ok, said) = d.a.relay.relayctl(shard, &["pause", dest.as_str()]);
    assert!(ok, "relay admin pause: {said}");
    assert!(
        said.contains("changed=true") && said.contains("paused=true"),
        "{said}"
    );
    let held = d.c.message(&d.alice, &d.bob, "held", &Msg::default());
    let (s, v) = d.c.send(&d.alice, &held);
    assert_eq!((s, status_of(&v)), (200, "delivering".to_string()), "{v:?}");
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        d.b.proxy.delivers(&message_id(&held)).is_empty(),
        "an attempt to a paused destination"
    );
    let mut pq = Object::new();
    pq.insert("paused", true);
    let (_, v) = d.c.admin_for(&d.a.relay, &alice_id, "destinations", &pq);
    let paused = field(&v, "destinations")
        .and_then(relay_tests::array)
        .unwrap_or_default();
    assert_eq!(paused.len(), 1, "{v:?}");
    let (ok, said) =
        d.a.relay
            .relayctl(shard, &["--json", "resume", dest.as_str()]);
    assert!(ok, "relay admin resume: {said}");
    let v = relay_core::wire::json::parse(said.trim().as_bytes()).expect("--json prints JSON");
    assert_eq!(u64_of(&v, "started"), Some(1), "{v:?}");
    let st = d.c.wait_terminal(&d.alice, &message_id(&held), WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    // Not through the client door.
    let (s, _) = d.c.call_as(&d.alice, "admin.destinations", &Object::new());
    assert!(
        s == 403 || s == 404,
        "a client reached admin.destinations: {s}"
    );
}
every_host!(operators_see_each_destination_fail_and_recover);

/// The host of a third relay C: another host than B's (wasmtime, or Node when B is wasmtime).
fn third_host(kb: Kind) -> Kind {
    if kb == Kind::Wasmtime {
        Kind::Node
    } else {
        Kind::Wasmtime
    }
}

/// Seed, "Switching targets": an account moves from B to C (route revision 2). The source
/// keeps confirming with B while B's answer is unknown, and switches only on B's explicit
/// not_home_relay carrying the higher revision.
fn seed_route_error_switches_to_a_higher_revision_only(ka: Kind, kb: Kind) {
    let kc = third_host(kb);
    let a = proxied(ka, Opts::default());
    let b = proxied(kb, Opts::default());
    let cc = proxied(kc, Opts::default());
    let mut c = Client::new(10);
    let alice = c.register(&a.relay, true);
    let mut bob = c.register(&b.relay, true);
    c.publish(&a.relay, &bob); // A holds revision 1: B.
    c.move_to(&mut bob, &cc.relay, &b.relay); // B learns revision 2: C.
    b.proxy.script(&[Fault::DropRequest, Fault::Delay(2_500)]);
    let p = c.message(&alice, &bob, "follow me", &Msg::default());
    let st = deliver_and_wait(&c, &alice, &p);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let at_b = b.proxy.wait_delivers(&message_id(&p), 3);
    let at_c = cc.proxy.delivers(&message_id(&p));
    assert_eq!(at_b.len(), 3, "confirmed with B until B answered: {at_b:?}");
    assert_eq!(at_b[2].upstream_status, Some(421), "{at_b:?}");
    assert_eq!(at_c.len(), 1, "{at_c:?}");
    assert!(
        at_c[0].at > at_b[2].at,
        "switched only after the route error"
    );
    assert_eq!(received(&c, &bob, &message_id(&p)).len(), 1);
    verify(
        &c,
        &[&alice, &bob],
        &[sent_from(0, 1, &p)],
        &[&a.proxy, &b.proxy, &cc.proxy],
        &[&a.relay, &b.relay, &cc.relay],
        100,
        WAIT,
    );
}
every_pair!(seed_route_error_switches_to_a_higher_revision_only);

/// `u`'s keys as its client uses them at `relay` with `session`: calls go there, and a
/// session.open names it (a former home, while the account lives elsewhere).
fn at_relay(u: &User, relay: &Relay, session: &str) -> User {
    User {
        key: u.key.clone(),
        devices: u.devices.clone(),
        certs: u.certs.clone(),
        sessions: vec![session.to_string()],
        api: relay.api(),
        relay: relay.id(),
        revision: u.revision,
        route: u.route.clone(),
    }
}

/// What a home answered for its account's messages before the account moved.
struct Kept {
    /// The message.send params it accepted.
    sent: Vec<Object>,
    /// Their terminal message.delivery.status.
    statuses: Vec<Value>,
    /// The bytes of an identical message.send of each, once terminal.
    retries: Vec<Vec<u8>>,
    /// `(kind, message_id, text)` of the records it held.
    records: Vec<(String, String, String)>,
}

/// A (former) home, through `u`'s session there, still answers what it answered before:
/// each status, an identical retry byte for byte, the records it holds.
fn keeps_its_results(c: &Client, u: &User, kept: &Kept, when: &str) {
    for ((p, before), bytes) in kept.sent.iter().zip(&kept.statuses).zip(&kept.retries) {
        let id = message_id(p);
        let (s, now) = c.status(u, &id);
        assert_eq!(s, 200, "{when}: message.delivery.status of {id}: {now:?}");
        assert_eq!(&now, before, "{when}: the status of {id} changed");
        let (s, again) = c.send_bytes(u, p);
        assert_eq!(
            (s, String::from_utf8_lossy(&again)),
            (200, String::from_utf8_lossy(bytes)),
            "{when}: an identical message.send of {id} answers the stored result"
        );
    }
    assert_eq!(
        c.texts(u, 0),
        kept.records,
        "{when}: message.timeline.sync returns the records held"
    );
}

/// The highest route a `not_home_relay` answer carries in `data.route`.
fn route_in(v: &Value) -> Value {
    field(v, "error")
        .and_then(|e| field(e, "data"))
        .and_then(|d| field(d, "route"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// `(status, code)` of an answer, and that a `not_home_relay` carries `route`.
fn not_home_with(s: u16, v: &Value, route: &Object, what: &str) {
    assert_eq!(
        (s, code_of(v).as_str()),
        (421, "not_home_relay"),
        "{what}: {v:?}"
    );
    let r = route_in(v);
    assert_eq!(
        (str_of(&r, "relay"), u64_of(&r, "revision")),
        (
            str_of(&Value::Object(route.clone()), "relay"),
            u64_of(&Value::Object(route.clone()), "revision")
        ),
        "{what}: data.route is the highest route held: {v:?}"
    );
    assert_eq!(r, Value::Object(route.clone()), "{what}: data.route");
}

/// A former home refuses what only a home may do: a new message.send (state_conflict for
/// a different one under a message id it holds), device.register, account.update; each
/// `not_home_relay` carries the account's `route` (the new home's).
fn refuses_what_only_a_home_does(
    c: &mut Client,
    u: &User,
    bob: &User,
    kept: &Kept,
    route: &Object,
    when: &str,
) {
    let held = &kept.sent[0];
    let mut other = c.message(u, bob, "the same id, other content", &Msg::default());
    other.insert(
        "envelope",
        held.get("envelope").cloned().unwrap_or(Value::Null),
    );
    let (s, v) = c.send(u, &other);
    assert_eq!(
        (s, code_of(&v).as_str()),
        (409, "state_conflict"),
        "{when}: a different message.send under a held message id: {v:?}"
    );
    let fresh = c.message(u, bob, "new at the former home", &Msg::default());
    let (s, v) = c.send(u, &fresh);
    not_home_with(s, &v, route, &format!("{when}: a new message.send"));
    let (_, cert) = c.new_device(u);
    let mut p = Object::new();
    p.insert("certificate", cert);
    let (s, v) = c.call_as(u, "device.register", &p);
    not_home_with(s, &v, route, &format!("{when}: device.register"));
    let mut p = Object::new();
    p.insert("discoverable", false);
    let (s, v) = c.call_as(u, "account.update", &p);
    not_home_with(s, &v, route, &format!("{when}: account.update"));
}

/// protocol.md, "Home relay changes (account migration)": alice moves from A to B (route
/// revision 2) and back (revision 3); bob lives at C. A delivery towards alice held at A's
/// proxy while she moves is refused by A with `not_home_relay` and the new route, and the
/// source retries the unchanged request at B: accepted once, at B only. A, her former
/// home, keeps its promises: a session opened there before or after the move reads every
/// status A gave as source and the records A holds, an identical message.send answers the
/// stored result byte for byte, a different one under the same id is state_conflict, and a
/// new send, device.register and account.update are `not_home_relay` naming B at revision
/// 2. Moved back, A serves her again with the records from before kept.
fn migration_keeps_results_at_the_former_home(ka: Kind, kb: Kind) {
    let kc = third_host(kb);
    let a = proxied(ka, Opts::default());
    let b = proxied(kb, Opts::default());
    let cc = proxied(kc, Opts::default());
    let mut c = Client::new(31);
    let mut alice = c.register(&a.relay, true);
    let bob = c.register(&cc.relay, true);
    c.publish(&a.relay, &bob);
    c.publish(&b.relay, &bob);
    c.publish(&cc.relay, &alice); // C holds revision 1: A.

    // 1. At home at A: alice sends to bob (one with sender_boxes, so A holds a sent
    // record) and to herself, and bob sends to her.
    let boxed = Msg {
        sender_boxes: true,
        ..Msg::default()
    };
    let sent_at_a = vec![
        c.message(&alice, &bob, "before 1", &boxed),
        c.message(&alice, &bob, "before 2", &Msg::default()),
        c.message(&alice, &alice, "note to self", &Msg::default()),
    ];
    for p in &sent_at_a {
        let st = deliver_and_wait(&c, &alice, p);
        assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    }
    for p in &sent_at_a[..2] {
        assert_eq!(received(&c, &bob, &message_id(p)).len(), 1);
    }
    let from_bob = c.message(&bob, &alice, "to alice at A", &Msg::default());
    let st = deliver_and_wait(&c, &bob, &from_bob);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let kept = Kept {
        statuses: sent_at_a
            .iter()
            .map(|p| {
                let (s, v) = c.status(&alice, &message_id(p));
                assert_eq!(s, 200, "{v:?}");
                v
            })
            .collect(),
        retries: sent_at_a
            .iter()
            .map(|p| {
                let (s, bytes) = c.send_bytes(&alice, p);
                assert_eq!(s, 200, "{}", String::from_utf8_lossy(&bytes));
                bytes
            })
            .collect(),
        records: c.texts(&alice, 0),
        sent: sent_at_a.clone(),
    };
    let rec =
        |kind: &str, p: &Object, text: &str| (kind.to_string(), message_id(p), text.to_string());
    assert_eq!(
        kept.records,
        [
            rec("sent", &sent_at_a[0], "before 1"),
            rec("self", &sent_at_a[2], "note to self"),
            rec("received", &from_bob, "to alice at A"),
        ],
        "A's records before the move"
    );
    let old_at_a = at_relay(&alice, &a.relay, &alice.sessions[0]);

    // 2. A delivery towards alice in flight at the move: A's proxy holds bob's first
    // attempt (past C's attempt timeout) and loses every retry until alice has moved.
    const HOLD: u64 = 6_000;
    a.proxy.script(&[Fault::Delay(HOLD)]);
    a.proxy.chaos(LOSE_ALL, 31);
    let in_flight = c.message(&bob, &alice, "in flight at the move", &Msg::default());
    let id_in = message_id(&in_flight);
    let (s, v) = c.send(&bob, &in_flight);
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
    // A lost retry: the first attempt is held, its outcome unknown to C.
    let lost = a.proxy.wait_delivers(&id_in, 1);
    assert!(
        !lost.is_empty() && lost.iter().all(|h| h.fault == Fault::DropRequest),
        "C retried at A while the first attempt was held: {lost:?}"
    );
    c.move_to(&mut alice, &b.relay, &a.relay); // A learns revision 2: B.
    let moved_at = now_ms();
    a.proxy.heal();
    let st = c.wait_terminal(&bob, &id_in, WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    // Every attempt at A is done once the held one is (it reaches A HOLD ms after it came).
    let started = std::time::Instant::now();
    let at_a = loop {
        let hits = a.proxy.delivers(&id_in);
        if hits.iter().any(|h| h.fault == Fault::Delay(HOLD))
            || started.elapsed() > Duration::from_millis(HOLD + 15_000)
        {
            break hits;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let at_b = b.proxy.wait_delivers(&id_in, 1);
    let held = at_a
        .iter()
        .find(|h| h.fault == Fault::Delay(HOLD))
        .unwrap_or_else(|| panic!("the held attempt is done: {at_a:?}"));
    assert!(
        held.at + HOLD > moved_at,
        "the held attempt reached A after the move (the move took too long)"
    );
    for h in &at_a {
        let want = match h.fault {
            Fault::DropRequest => None,
            _ => Some(421),
        };
        assert_eq!(
            h.upstream_status, want,
            "A never accepts it, and refuses it with not_home_relay: {at_a:?}"
        );
    }
    let refused_at = at_a
        .iter()
        .filter(|h| h.fault == Fault::Pass)
        .map(|h| h.at)
        .chain(std::iter::once(held.at + HOLD))
        .min()
        .unwrap_or(u64::MAX);
    assert_eq!(at_b.len(), 1, "{at_b:?}");
    assert_eq!(at_b[0].upstream_status, Some(200), "{at_b:?}");
    assert!(
        at_b[0].at > refused_at,
        "C retried at B only after A's not_home_relay"
    );
    assert_eq!(received(&c, &alice, &id_in).len(), 1, "accepted once, at B");

    // 3. A, now a former home, keeps its results: through the session opened before the
    // move, then through one opened after it.
    let moved_route = alice.route.clone();
    keeps_its_results(&c, &old_at_a, &kept, "a session opened before the move");
    refuses_what_only_a_home_does(
        &mut c,
        &old_at_a,
        &bob,
        &kept,
        &moved_route,
        "a session opened before the move",
    );
    let (s, v) = c.try_open_session(&old_at_a, 0);
    assert_eq!(
        s, 200,
        "session.open at the former home A (its device state frozen at the move): {v:?}"
    );
    let new_at_a = at_relay(&alice, &a.relay, &str_of(&v, "session"));
    keeps_its_results(&c, &new_at_a, &kept, "a session opened after the move");
    refuses_what_only_a_home_does(
        &mut c,
        &new_at_a,
        &bob,
        &kept,
        &moved_route,
        "a session opened after the move",
    );

    // 4. At B: a new message reaches bob, once.
    let from_b = c.message(&alice, &bob, "from B", &boxed);
    let st = deliver_and_wait(&c, &alice, &from_b);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    assert_eq!(received(&c, &bob, &message_id(&from_b)).len(), 1);
    assert_eq!(cc.proxy.delivers(&message_id(&from_b)).len(), 1);
    assert_eq!(
        c.texts(&alice, 0),
        [
            rec("received", &in_flight, "in flight at the move"),
            rec("sent", &from_b, "from B"),
        ],
        "B's records: none from A"
    );
    let old_at_b = at_relay(&alice, &b.relay, &alice.sessions[0]);

    // 5. Back to A (revision 3, registered again there, published at B): A serves her
    // again, with the records from before.
    c.move_to(&mut alice, &a.relay, &b.relay);
    assert_eq!(alice.revision, 3);
    keeps_its_results(&c, &alice, &kept, "back home at A");
    let back = c.message(&alice, &bob, "back at A", &boxed);
    let st = deliver_and_wait(&c, &alice, &back);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    assert_eq!(received(&c, &bob, &message_id(&back)).len(), 1);
    // Towards alice: whichever route C holds, the message is accepted at A, once.
    let to_back = c.message(&bob, &alice, "welcome back", &Msg::default());
    let st = deliver_and_wait(&c, &bob, &to_back);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let accepted = |p: &Proxied| {
        p.proxy
            .delivers(&message_id(&to_back))
            .iter()
            .filter(|h| h.upstream_status == Some(200))
            .count()
    };
    assert_eq!((accepted(&a), accepted(&b)), (1, 0), "accepted at A only");
    let mut records = kept.records.clone();
    records.push(rec("sent", &back, "back at A"));
    records.push(rec("received", &to_back, "welcome back"));
    assert_eq!(
        c.texts(&alice, 0),
        records,
        "A's records, those from before the move kept"
    );

    // 6. Every invariant, alice seen at A (0) and at B (1), bob at C (2).
    let sent: Vec<Sent> = [
        (0, 2, &sent_at_a[0]),
        (0, 2, &sent_at_a[1]),
        (0, 0, &sent_at_a[2]),
        (2, 0, &from_bob),
        (2, 1, &in_flight),
        (1, 2, &from_b),
        (0, 2, &back),
        (2, 0, &to_back),
    ]
    .into_iter()
    .map(|(from, to, p)| sent_from(from, to, p))
    .collect();
    verify(
        &c,
        &[&alice, &old_at_b, &bob],
        &sent,
        &[&a.proxy, &b.proxy, &cc.proxy],
        &[&a.relay, &b.relay, &cc.relay],
        100,
        WAIT,
    );
}
every_pair!(migration_keeps_results_at_the_former_home);

/// protocol.md, "Home relay changes", rule 6 (home spans): alice lives at A, bob at B, and
/// B holds alice's route at revision 1. A's proxy captures bob's first attempt (held in the
/// network, never seen by A) and loses every retry while alice moves to C (revision 2) and
/// back to A (revision 3). Released then, the captured attempt, signed for revision 1, is
/// refused by A with `not_home_relay` and the current route, which names A itself; healed,
/// the source's next attempt is refused the same way and it sends the same body again at
/// once aimed at revision 3, which A accepts, once. A session opened before the moves
/// cannot send after the move back; the one opened at the move back can.
fn home_span_replay(ka: Kind, kb: Kind) {
    let kc = third_host(kb);
    let a = proxied(ka, Opts::default());
    let b = proxied(kb, Opts::default());
    let cc = proxied(kc, Opts::default());
    let mut c = Client::new(43);
    let mut alice = c.register(&a.relay, true);
    let bob = c.register(&b.relay, true);
    c.publish(&b.relay, &alice);
    c.publish(&a.relay, &bob);
    let before_moves = at_relay(&alice, &a.relay, &alice.sessions[0]);
    let mut old_socket = Socket::connect(&before_moves, 0);
    a.proxy.script(&[Fault::Capture]);
    a.proxy.chaos(LOSE_ALL, 43);
    let m = c.message(&bob, &alice, "signed for revision 1", &Msg::default());
    let id = message_id(&m);
    let (s, v) = c.send(&bob, &m);
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
    let early = a.proxy.wait_delivers(&id, 2);
    assert_eq!(early[0].fault, Fault::Capture, "{early:?}");
    assert_eq!(early[0].route_revision.as_deref(), Some("1"), "{early:?}");

    c.move_to(&mut alice, &cc.relay, &a.relay);
    c.move_to(&mut alice, &a.relay, &cc.relay);
    assert_eq!(alice.revision, 3);

    // The held attempt arrives after the move away and back: refused with the current route.
    let released = a.proxy.release();
    assert_eq!(released.len(), 1, "{released:?}");
    let stale = &released[0];
    assert_eq!(stale.route_revision.as_deref(), Some("1"));
    not_home_with(
        stale.status.unwrap_or(0),
        &stale.answer,
        &alice.route,
        "a deliver signed for revision 1, after a move away and back",
    );
    assert!(received(&c, &alice, &id).is_empty(), "A accepted nothing");

    // Healed: the source's next attempt (revision 1) is refused the same way, and the same
    // body goes again at once aimed at revision 3: accepted once, at A.
    a.proxy.heal();
    let st = c.wait_terminal(&bob, &id, WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let passed: Vec<Hit> = a
        .proxy
        .delivers(&id)
        .into_iter()
        .filter(|h| h.fault == Fault::Pass)
        .collect();
    assert!(
        passed.iter().all(|h| h.body == stale.body),
        "every attempt carries the same body: {passed:?}"
    );
    let accepted: Vec<&Hit> = passed
        .iter()
        .filter(|h| h.upstream_status == Some(200))
        .collect();
    assert_eq!(accepted.len(), 1, "accepted once: {passed:?}");
    assert_eq!(accepted[0].route_revision.as_deref(), Some("3"));
    assert!(
        passed
            .iter()
            .any(|h| h.upstream_status == Some(421) && h.route_revision.as_deref() == Some("1")),
        "the source's attempt at revision 1 was refused first: {passed:?}"
    );
    assert_eq!(
        received(&c, &alice, &id).len(),
        1,
        "in alice's timeline once"
    );
    assert!(cc.proxy.delivers(&id).is_empty(), "never sent to C");

    // Sessions: the one from before the moves cannot send, over HTTP or over the WebSocket
    // opened with it then; the one from the move back can.
    let through_old = c.message(
        &before_moves,
        &bob,
        "through an old session",
        &Msg::default(),
    );
    let (s, v) = c.send(&before_moves, &through_old);
    not_home_with(
        s,
        &v,
        &alice.route,
        "a message.send through a session from before the moves",
    );
    let answer = old_socket.call("message.send", &through_old);
    let code = field(&answer, "error").map(|e| str_of(e, "code"));
    assert_eq!(code.as_deref(), Some("not_home_relay"), "{answer:?}");
    assert_eq!(
        route_in(&answer),
        Value::Object(alice.route.clone()),
        "{answer:?}"
    );
    let st = deliver_and_wait(&c, &alice, &through_old);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    assert_eq!(received(&c, &bob, &message_id(&through_old)).len(), 1);
}

every_pair!(home_span_replay);

/// protocol.md §6 "Relay RPC in batches", between two relays of these hosts. A's one slot
/// to B is held (the proxy delays the first attempt), so three more deliveries to one
/// recipient park and leave together in one `message.deliver.batch`; B answers each item as
/// `message.deliver` would (two accepted, one refused by B's own age limit), the answer is
/// lost, and the items sent again are recognized: each message is accepted once, and the
/// refused one fails with B's code.
fn batches_answer_each_item(ka: Kind, kb: Kind) {
    let one_slot = Opts {
        flags: vec!["--max-in-flight-per-destination".into(), "1".into()],
        ..Opts::default()
    };
    let a = proxied(ka, one_slot);
    let b = proxied(
        kb,
        Opts::default().policy("message_delivery_age_limit", 60_000),
    );
    let mut c = Client::new(47);
    let bob = c.register(&a.relay, true);
    let alice = c.register(&b.relay, true);
    c.publish(&a.relay, &alice);
    b.proxy.script(&[Fault::Delay(900), Fault::DropResponse]);
    let first = c.message(&bob, &alice, "holds the slot", &Msg::default());
    let (s, v) = c.send(&bob, &first);
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
    let stale = Msg {
        created_offset: -120_000,
        ..Msg::default()
    };
    let waiting: Vec<Object> = (0..3)
        .map(|i| {
            let m = if i == 1 {
                stale.clone()
            } else {
                Msg::default()
            };
            let p = c.message(&bob, &alice, &format!("waits {i}"), &m);
            let (s, v) = c.send(&bob, &p);
            assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
            p
        })
        .collect();
    let ids: Vec<String> = waiting.iter().map(message_id).collect();
    for id in std::iter::once(message_id(&first)).chain(ids.iter().cloned()) {
        c.wait_terminal(&bob, &id, WAIT);
    }
    let batches = b.proxy.hits_on("/relay/v1/message.deliver.batch");
    assert!(
        !batches.is_empty(),
        "no batch reached B: {:?}",
        b.proxy.log()
    );
    let first_batch = &batches[0];
    assert_eq!(first_batch.fault, Fault::DropResponse, "{batches:?}");
    assert_eq!(
        first_batch.route_revision, None,
        "a batch carries no Relay-Route-Revision"
    );
    let body = relay_core::wire::json::parse(&first_batch.body).expect("a JSON body");
    let items = match field(&body, "items") {
        Some(Value::Array(items)) => items.clone(),
        other => panic!("not a batch body: {other:?}"),
    };
    let carried: Vec<String> = items
        .iter()
        .map(|i| {
            let env = field(i, "params").and_then(|p| field(p, "envelope"));
            env.map(|e| str_of(e, "message_id")).unwrap_or_default()
        })
        .collect();
    let mut sorted = carried.clone();
    sorted.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sorted, want, "the three that waited, in one exchange");
    // Each answered on its own: the stale one refused by B, the others accepted once.
    for (i, id) in ids.iter().enumerate() {
        let (_, st) = c.status(&bob, id);
        if i == 1 {
            assert_eq!(
                (status_of(&st).as_str(), code_of(&st).as_str()),
                ("failed", "message_expired"),
                "{st:?}"
            );
            assert!(received(&c, &alice, id).is_empty());
        } else {
            assert_eq!(status_of(&st), "target_accepted", "{st:?}");
            assert_eq!(received(&c, &alice, id).len(), 1, "accepted once");
        }
    }
    // Sent again after the lost answer, whether alone or in a batch, and recognized.
    let again: usize = b
        .proxy
        .log()
        .iter()
        .filter(|h| h.at > first_batch.at && h.path.starts_with("/relay/v1/message.deliver"))
        .count();
    assert!(again >= 1, "the items were sent again: {:?}", b.proxy.log());
    assert_eq!(received(&c, &alice, &message_id(&first)).len(), 1);
}

every_pair!(batches_answer_each_item);

/// The body limit of relay RPC in batches is `max_batch_bytes` (1 MiB), not
/// `max_request_bytes` (256 KiB): a host reads a 300 KB batch whole (and the core refuses it
/// for want of relay authentication), and refuses one declared at 1.1 MB before reading it;
/// every other path keeps `max_request_bytes`.
fn a_batch_has_its_own_body_limit(k: Kind) {
    let r = Relay::start(k, Opts::default());
    let c = Client::new(48);
    let url = format!("{}/relay/v1/message.deliver.batch", r.api());
    let body = format!(r#"{{"items":[],"pad":"{}"}}"#, "x".repeat(300_000));
    let (s, v) = c.http.post(&url, None, body.as_bytes());
    assert_eq!((s, code_of(&v).as_str()), (401, "unauthenticated"), "{v:?}");
    // Only the head is sent: the answer comes from the declared length alone (a client
    // still writing a body may find the connection closed under it).
    for (path, len) in [
        ("/relay/v1/message.deliver.batch", 1_100_000),
        ("/relay/v1/message.deliver", 300_000),
    ] {
        let answer = head_only(&r.api(), path, len);
        assert!(
            answer.starts_with("HTTP/1.1 413") && answer.contains("payload_too_large"),
            "{path} of {len} bytes: {answer}"
        );
    }
}

every_host!(a_batch_has_its_own_body_limit);

/// The answer to a POST of `path` on `api` whose head declares `len` bytes and whose body
/// never comes, as text.
fn head_only(api: &str, path: &str, len: usize) -> String {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write the head");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&out).contains("payload_too_large") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Seed, "The source's responsibility ... survives relay restarts": both relays killed
/// (SIGKILL) while a delivery is pending; started again over their SQLite data, the source
/// finishes it, once.
fn seed_delivery_finishes_after_restart(ka: Kind, kb: Kind) {
    let d = duo(ka, kb, Opts::default(), Opts::default(), 11);
    let Duo {
        mut a,
        mut b,
        mut c,
        alice,
        bob,
    } = d;
    b.relay.kill();
    let p = c.message(&alice, &bob, "after the storm", &Msg::default());
    let (s, v) = c.send(&alice, &p);
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
    std::thread::sleep(Duration::from_millis(600));
    a.relay.kill();
    b.relay.restart();
    a.relay.restart();
    let st = c.wait_terminal(&alice, &message_id(&p), WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    assert_eq!(u64_of(&st, "accepted_at"), u64_of(&v, "accepted_at"));
    assert_eq!(received(&c, &bob, &message_id(&p)).len(), 1);
    verify_pair(&c, (&alice, &bob), &a, &b, &[&p]);
}
every_pair!(seed_delivery_finishes_after_restart);

/// Seed, "Delivery Result Confirmation" across a restart ("the source's responsibility ...
/// survives relay restarts"): an attempt in flight when the source's process dies gets no
/// answer. The restarted source takes its outcome as unknown at once and retries the
/// unchanged message.deliver to the same target, well before the attempt timeout (120 s
/// here, beyond this test's wait). The source's host decides it, so once per host.
fn an_attempt_in_flight_at_a_crash_is_retried_at_the_next_start(k: Kind) {
    let slow = Opts {
        attempt_timeout: 120_000,
        ..Opts::default()
    };
    let mut d = duo(k, k, slow, Opts::default(), 23);
    d.b.proxy.script(&[Fault::Delay(3_000)]);
    let p =
        d.c.message(&d.alice, &d.bob, "in flight at the crash", &Msg::default());
    let (s, v) = d.c.send(&d.alice, &p);
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");
    // The proxy holds the first attempt; the source dies with it in flight.
    std::thread::sleep(Duration::from_millis(500));
    d.a.relay.restart();
    let st = d.c.wait_terminal(&d.alice, &message_id(&p), WAIT);
    assert_eq!(status_of(&st), "target_accepted", "{st:?}");
    let hits = d.b.proxy.wait_delivers(&message_id(&p), 2);
    assert_eq!(
        hits.len(),
        2,
        "one attempt lost with the process, one retry"
    );
    retried_unchanged_and_accepted_once(&d, &p, &hits);
}
every_host!(an_attempt_in_flight_at_a_crash_is_retried_at_the_next_start);

// ---------------------------------------------------------------- faults

/// Random faults between two relays in both directions (lost requests and answers, delays
/// past the timeout, 429 with Retry-After, 503, resets), duplicate client sends and a
/// destination restart; after healing, every invariant of the simulation holds on the
/// real relays' data.
fn faults_between_relays_keep_every_invariant(ka: Kind, kb: Kind) {
    let (a, mut b) = (proxied(ka, Opts::default()), proxied(kb, Opts::default()));
    let mut c = Client::new(12);
    let users = [
        c.register(&a.relay, true),
        c.register(&a.relay, true),
        c.register(&b.relay, true),
        c.register(&b.relay, true),
    ];
    for u in &users {
        c.publish(&a.relay, u);
        c.publish(&b.relay, u);
    }
    let chaos = Chaos {
        drop_request: 70,
        drop_response: 70,
        delay: 40,
        delay_ms: 2_000,
        rate_limited: 60,
        retry_after_ms: 300,
        unavailable: 70,
        reset: 50,
    };
    a.proxy.chaos(chaos, 100);
    b.proxy.chaos(chaos, 200);
    let mut sent = Vec::new();
    for round in 0..6 {
        for (from, to) in [(0, 2), (1, 3), (2, 0), (3, 1), (0, 3), (2, 1)] {
            let m = Msg {
                sender_boxes: round % 2 == 0,
                ..Msg::default()
            };
            let p = c.message(
                &users[from],
                &users[to],
                &format!("r{round} {from}>{to}"),
                &m,
            );
            let (s, v) = c.send(&users[from], &p);
            assert_eq!(s, 200, "{v:?}");
            if round % 3 == 1 {
                // A client that lost the answer retries the unchanged request.
                let (s, again) = c.send(&users[from], &p);
                assert_eq!(s, 200);
                assert_eq!(u64_of(&again, "accepted_at"), u64_of(&v, "accepted_at"));
            }
            sent.push(sent_from(from, to, &p));
        }
        if round == 3 {
            b.relay.restart();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    a.proxy.heal();
    b.proxy.heal();
    let refs: Vec<&User> = users.iter().collect();
    let summary = verify(
        &c,
        &refs,
        &sent,
        &[&a.proxy, &b.proxy],
        &[&a.relay, &b.relay],
        0,
        Duration::from_secs(60),
    );
    eprintln!("   {summary:?}");
    assert_eq!(summary.target_accepted, sent.len(), "{summary:?}");
    let faulted: usize = summary
        .faults
        .iter()
        .filter(|(k, _)| k.as_str() != "Pass")
        .map(|(_, n)| n)
        .sum();
    assert!(
        faulted >= 10,
        "the proxies injected too few faults: {summary:?}"
    );
    // Each message is in its recipient's timeline, decrypted, exactly once.
    for m in &sent {
        assert_eq!(received(&c, &users[m.to], &m.id).len(), 1);
    }
}
every_pair!(faults_between_relays_keep_every_invariant);
