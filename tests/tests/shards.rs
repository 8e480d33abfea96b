//! A sharded relay over its real transports (issue 20): `--shards 4` on the hosts that
//! shard (the wasmtime host: a core per thread; the edge host: a Durable Object per shard).
//!
//! Accounts of one relay land on different shards; every seed rule between them is the
//! conformance suite's business (it runs sharded relays in its pairs too). These scenarios
//! check what only a sharded relay has: delivery from shard to shard, the route a shard
//! learns from its sibling (over HTTP and over a WebSocket), notifications from the
//! recipient's shard, restarts, and the shard count fixed at the first start.

use relay_core::engine::shard::Shard;
use relay_core::wire::json::{Object, Value};
use relay_tests::live::client::*;
use relay_tests::live::host::*;
use relay_tests::Msg;
use std::time::Duration;

const SHARDS: u32 = 4;
const WAIT: Duration = Duration::from_secs(30);

macro_rules! every_sharding_host {
    ($scenario:ident) => {
        mod $scenario {
            use super::Kind::{Edge, Wasmtime};

            #[test]
            fn wasmtime() {
                super::$scenario(Wasmtime);
            }

            #[test]
            fn edge() {
                super::$scenario(Edge);
            }
        }
    };
}

fn sharded(kind: Kind) -> Relay {
    Relay::start(kind, Opts::default().flag("shards", SHARDS))
}

/// Registers accounts at `relay` until there is one on each of `n` different shards.
fn on_different_shards(c: &mut Client, relay: &Relay, n: usize) -> Vec<User> {
    let mut users: Vec<User> = Vec::new();
    while users.len() < n {
        let u = c.register(relay, true);
        let s = Shard::of_account(&u.id(), SHARDS);
        if users
            .iter()
            .all(|o| Shard::of_account(&o.id(), SHARDS) != s)
        {
            users.push(u);
        }
    }
    users
}

fn records(c: &Client, u: &User, id: &str, kind: &str) -> usize {
    c.texts(u, 0)
        .into_iter()
        .filter(|(k, i, _)| k == kind && i == id)
        .count()
}

/// Seed, "Cross-Account Delivery", between shards of one relay: target_accepted, one
/// received record, the recipient's WebSocket told by its own shard, a sent record; a
/// retry answers the stored result; a send over a WebSocket waits for a sibling's route.
fn delivery_between_shards(kind: Kind) {
    let relay = sharded(kind);
    let mut c = Client::new(20);
    let users = on_different_shards(&mut c, &relay, 3);
    let (alice, bob, carol) = (&users[0], &users[1], &users[2]);
    for u in &users {
        let shard = Shard::of_account(&u.id(), SHARDS);
        assert!(
            u.sessions[0].starts_with(&format!("{shard}.")),
            "the session names its shard"
        );
    }
    let mut bob_ws = Socket::connect(bob, 0);
    let p = c.message(
        alice,
        bob,
        "across",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let id = relay_tests::message_id(&p);
    let (s, v) = c.send(alice, &p);
    assert_eq!(s, 200, "{v:?}");
    let done = c.wait_terminal(alice, &id, WAIT);
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    assert_eq!(records(&c, bob, &id, "received"), 1);
    assert_eq!(records(&c, alice, &id, "sent"), 1);
    let n = bob_ws
        .notification(Duration::from_secs(10))
        .expect("message.timeline.changed from the recipient's shard");
    assert_eq!(str_of(&n, "method"), "message.timeline.changed");
    // An identical retry: the stored result, no second delivery.
    let (s, again) = c.send(alice, &p);
    assert_eq!(s, 200);
    assert_eq!(u64_of(&again, "accepted_at"), u64_of(&v, "accepted_at"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(records(&c, bob, &id, "received"), 1);
    // Over Carol's WebSocket, to Bob (a shard whose route hers does not hold yet).
    let mut carol_ws = Socket::connect(carol, 0);
    let p = c.message(carol, bob, "over the socket", &Msg::default());
    let id = relay_tests::message_id(&p);
    let answer = carol_ws.call("message.send", &p);
    let result = relay_tests::field(&answer, "result").cloned();
    assert!(result.is_some(), "{answer:?}");
    let done = c.wait_terminal(carol, &id, WAIT);
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    assert_eq!(records(&c, bob, &id, "received"), 1);
}
every_sharding_host!(delivery_between_shards);

/// A send to an account that no shard serves is `not_found` before acceptance, as on a
/// relay of one shard.
fn unknown_recipient_is_not_found(kind: Kind) {
    let relay = sharded(kind);
    let mut c = Client::new(21);
    let alice = c.register(&relay, true);
    let nobody = loop {
        let u = c.unregistered(&relay);
        if Shard::of_account(&u.id(), SHARDS) != Shard::of_account(&alice.id(), SHARDS) {
            break u;
        }
    };
    let p = c.message(&alice, &nobody, "to nobody", &Msg::default());
    let (s, v) = c.send(&alice, &p);
    assert_eq!((s, code_of(&v).as_str()), (404, "not_found"), "{v:?}");
}
every_sharding_host!(unknown_recipient_is_not_found);

/// Killed (SIGKILL) and started again over the same data, every shard resumes: what was
/// accepted is there, and a delivery between shards after the restart goes through.
fn shards_resume_after_sigkill(kind: Kind) {
    let mut relay = sharded(kind);
    let mut c = Client::new(22);
    let users = on_different_shards(&mut c, &relay, 2);
    let (alice, bob) = (&users[0], &users[1]);
    let p = c.message(alice, bob, "before", &Msg::default());
    let first = relay_tests::message_id(&p);
    assert_eq!(c.send(alice, &p).0, 200);
    c.wait_terminal(alice, &first, WAIT);
    relay.restart();
    let p = c.message(alice, bob, "after", &Msg::default());
    let second = relay_tests::message_id(&p);
    assert_eq!(c.send(alice, &p).0, 200);
    let done = c.wait_terminal(alice, &second, WAIT);
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    for id in [&first, &second] {
        assert_eq!(records(&c, bob, id, "received"), 1, "{id}");
    }
}
every_sharding_host!(shards_resume_after_sigkill);

/// The shard count is fixed at the data's first start: another count is refused, with a
/// message that says so, and the data is left as it was.
fn the_shard_count_cannot_change(kind: Kind) {
    let mut relay = sharded(kind);
    let mut c = Client::new(23);
    let alice = c.register(&relay, true);
    relay.kill();
    relay
        .opts
        .flags
        .retain(|f| f != "--shards" && f != &SHARDS.to_string());
    relay.opts = relay.opts.clone().flag("shards", 2);
    let (status, stderr) = relay.start_expecting_failure(Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("shard"), "{stderr}");
    // Back with its own count, it serves the account as before.
    relay.opts.flags.retain(|f| f != "--shards" && f != "2");
    relay.opts = relay.opts.clone().flag("shards", SHARDS);
    relay.restart();
    let mut p = Object::new();
    p.insert("account", alice.id());
    let (s, v) = c.http.post(
        &format!("{}/v1/route.get", relay.api()),
        None,
        &relay_core::wire::canonical::object_to_vec(&p),
    );
    assert_eq!(s, 200, "{v:?}");
    assert!(matches!(
        relay_tests::field(&v, "route"),
        Some(Value::Object(_))
    ));
}
every_sharding_host!(the_shard_count_cannot_change);
