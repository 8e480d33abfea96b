//! Accounts sharded over engines (issue 20): a relay of several shards keeps every rule of
//! the seed between accounts of different shards, and answers as a relay of one shard does.
//!
//! Each shard is an engine with storage of its own; the world hands a request that names a
//! sibling shard to that shard's engine, and answers a shard's wait for a sibling's route
//! with `route.get` there, as the sharded hosts do.

use relay_core::engine::shard::{Shard, SiblingRoute};
use relay_core::engine::{Config, Engine, MemoryStore, OpenError};
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

const SHARDS: u32 = 4;

/// A relay of [`SHARDS`] shards with two accounts on different shards; `bob` has two devices.
struct Pair {
    w: World,
    alice: Account,
    bob: Account,
}

fn pair(seed: u64, discoverable: bool) -> Pair {
    let mut w = World::new(seed);
    let r = w.sharded_relay("s", SHARDS);
    let alice = w.account(r, 1, true);
    let bob = loop {
        let b = w.account(r, 2, discoverable);
        if b.home != alice.home {
            break b;
        }
    };
    Pair { w, alice, bob }
}

fn kinds(entries: &[Object]) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            e.get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

thread_local! {
    /// Signature verifications the counting verifier saw on this test's thread.
    static VERIFIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A host verifier that counts and leaves every verdict to the core.
fn counting(
    _: &[u8; 32],
    _: &[u8],
    _: &[u8; 64],
) -> Option<Result<(), relay_core::wire::signature::SignatureError>> {
    VERIFIED.with(|v| v.set(v.get() + 1));
    None
}

#[test]
fn a_delivery_between_shards_is_a_trusted_step_that_verifies_no_signature_again() {
    let Pair {
        mut w, alice, bob, ..
    } = pair(12, true);
    let other = w.relay("o");
    let carol = w.account(other, 3, true);
    let target = bob.home;
    w.nodes[target]
        .engine
        .set_crypto(relay_core::wire::crypto::Crypto::with_host(
            Some(counting),
            None,
        ));
    let count = || VERIFIED.with(|v| v.get());
    // From a sibling shard: rule 2's signatures were verified when alice's shard accepted it.
    let m = w.message(&alice, 0, &bob, "from a sibling", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let before = count();
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(
        count(),
        before,
        "bob's shard verified a sibling's delivery again"
    );
    // From another relay: the same rules verify the certificate and the envelope.
    let route = w.route_of(&bob);
    let m = w.message(
        &carol,
        0,
        &bob,
        "from afar",
        &Msg {
            recipient_route: Some(route),
            ..Msg::default()
        },
    );
    w.send(&carol, 0, &m).result.unwrap();
    let before = count();
    w.pump();
    let s = w.status(&carol, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert!(count() > before, "a foreign delivery was not verified");
    assert_eq!(
        kinds(&w.sync_all(&bob, 0)),
        ["received", "received"],
        "each once in the timeline"
    );
}

#[test]
fn accounts_live_on_the_shard_their_id_hashes_to_and_sessions_name_it() {
    let Pair { w, alice, bob } = pair(1, true);
    for a in [&alice, &bob] {
        let shard = w.nodes[a.home].config.shard;
        assert_eq!(shard.index, Shard::of_account(&a.id(), SHARDS));
        assert!(
            a.sessions[0].starts_with(&format!("{}.", shard.index)),
            "session token {} names its shard",
            a.sessions[0]
        );
        // Only that shard serves it: the others hold nothing of it.
        for (n, node) in w.nodes.iter().enumerate() {
            let records = w.record_count(n, a);
            if n != a.home {
                assert_eq!(
                    records,
                    0,
                    "shard {} holds records of {}",
                    node.config.shard.index,
                    a.id()
                );
            }
        }
    }
}

#[test]
fn seed_cross_account_delivery_between_shards_is_target_accepted_once_in_each_timeline() {
    let Pair {
        mut w, alice, bob, ..
    } = pair(2, true);
    let m = w.message(
        &alice,
        0,
        &bob,
        "across shards",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let r = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(status_of(&r), "delivering");
    assert_eq!(
        w.route_requests, 1,
        "the sender's shard asked the recipient's for its route"
    );
    assert_eq!(w.outbox.len(), 1);
    assert_eq!(
        w.outbox[0].shard,
        Some(w.nodes[bob.home].config.shard.index)
    );
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert!(field(&s, "target_accepted_at").is_some());
    let got = w.sync_all(&bob, 0);
    assert_eq!(kinds(&got), ["received"]);
    assert_eq!(entry_text(&got[0]), "across shards");
    assert_eq!(
        kinds(&w.sync_all(&bob, 1)),
        ["received"],
        "every boxed device sees it"
    );
    assert_eq!(kinds(&w.sync_all(&alice, 0)), ["sent"]);
    // The route is held now: a second send asks no sibling.
    let m2 = w.message(&alice, 0, &bob, "again", &Msg::default());
    w.send(&alice, 0, &m2).result.unwrap();
    assert_eq!(w.route_requests, 1);
}

#[test]
fn seed_a_send_to_an_account_no_shard_serves_is_not_found_before_acceptance() {
    let mut w = World::new(3);
    let r = w.sharded_relay("s", SHARDS);
    let alice = w.account(r, 1, true);
    // An account whose registration went to another relay: nobody here holds its route.
    let elsewhere = w.relay("elsewhere");
    let stranger = loop {
        let s = w.account(elsewhere, 1, true);
        let home = w.node_serving(&w.nodes[r].id.clone(), &s.id()).unwrap();
        if home != alice.home {
            break s;
        }
    };
    let m = w.message(&alice, 0, &stranger, "to nobody", &Msg::default());
    let e = w.send(&alice, 0, &m).result.unwrap_err();
    assert_eq!(e.code.as_str(), "not_found");
    assert!(w.outbox.is_empty());
    // Nothing was accepted: the status is unknown too.
    assert_eq!(code_of(&w.status(&alice, &message_id(&m))), "not_found");
}

#[test]
fn seed_identical_retries_across_shards_return_the_stored_result_and_deliver_once() {
    let Pair {
        mut w, alice, bob, ..
    } = pair(4, true);
    let m = w.message(&alice, 0, &bob, "once", &Msg::default());
    let first = w.send(&alice, 0, &m).result.unwrap();
    let again = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(field(&first, "accepted_at"), field(&again, "accepted_at"));
    assert_eq!(
        w.outbox.len(),
        1,
        "a recognized retry starts no second delivery"
    );
    // The network repeats the deliver request: the destination shard answers it again.
    let req = w.outbox[0].clone();
    w.carry(req.clone());
    w.carry(req);
    assert_eq!(
        kinds(&w.sync_all(&bob, 0)),
        ["received"],
        "one record, however often delivered"
    );
    // The same message_id with other content conflicts.
    let mut conflicting = m.clone();
    conflicting.insert("sender_boxes", m.get("recipient_boxes").cloned().unwrap());
    assert_eq!(code_of(&w.send(&alice, 0, &conflicting)), "state_conflict");
}

#[test]
fn seed_receiving_rules_run_on_the_recipients_shard() {
    // Bob is not discoverable and Alice holds no grant: the destination shard refuses.
    let Pair {
        mut w, alice, bob, ..
    } = pair(5, false);
    let m = w.message(&alice, 0, &bob, "unasked", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    let code = field(&s, "error")
        .and_then(|e| field(e, "code"))
        .and_then(Value::as_str);
    assert_eq!(code, Some("discovery_disabled"));
    assert!(w.sync_all(&bob, 0).is_empty());
    // With Bob's grant the same path accepts.
    let grant = w.grant(&bob, &alice);
    let m2 = w.message(
        &alice,
        0,
        &bob,
        "granted",
        &Msg {
            authorization: Some(grant),
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m2).result.unwrap();
    w.pump();
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m2)).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn seed_a_sibling_that_does_not_answer_is_retried_until_the_deadline() {
    let Pair {
        mut w,
        mut alice,
        mut bob,
    } = pair(6, true);
    let m = w.message(&alice, 0, &bob, "late", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    // Every attempt is lost on the way (unknown outcome); retries go to the same shard
    // with the same bytes, until the age limit ends the delivery.
    let mut bodies = Vec::new();
    let limit = Config::new(RelayId::parse("http://s.test").unwrap(), NET)
        .policies
        .message_delivery_age_limit;
    let end = w.now + limit + 60_000;
    while w.now < end {
        for req in w.take_outbox() {
            bodies.push(req.body.clone());
            assert_eq!(req.shard, Some(w.nodes[bob.home].config.shard.index));
        }
        w.advance_without_network(10_000);
    }
    assert!(bodies.len() >= 2, "retried: {} attempts", bodies.len());
    assert!(
        bodies.windows(2).all(|p| p[0] == p[1]),
        "every retry sends the same bytes"
    );
    // The sessions expired meanwhile.
    alice.sessions[0] = w.open_session(&alice, 0).unwrap();
    bob.sessions[0] = w.open_session(&bob, 0).unwrap();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert!(w.sync_all(&bob, 0).is_empty());
}

#[test]
fn seed_a_delivery_between_shards_finishes_after_both_restart() {
    let Pair {
        mut w, alice, bob, ..
    } = pair(7, true);
    let m = w.message(&alice, 0, &bob, "survives", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    // The attempt in flight is lost with the processes.
    w.take_outbox();
    let (a, b) = (alice.home, bob.home);
    w.nodes[a].restart(70);
    w.nodes[b].restart(71);
    w.run_for(10 * 60_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(kinds(&w.sync_all(&bob, 0)), ["received"]);
}

#[test]
fn a_sharded_relay_answers_as_a_relay_of_one_shard() {
    // The same accounts and messages, on a relay of one shard and one of four: every
    // delivery ends the same, and every timeline holds the same records. Two differences
    // are the protocol's own latitude: a relay of one shard runs a local delivery's first
    // step inside the send (so the send may answer its end at once) where a sibling shard
    // is reached by an attempt (the send answers `delivering`); and records arrive in the
    // order deliveries end.
    fn run(shards: u32) -> (Vec<String>, Vec<String>) {
        let mut w = World::new(8);
        let r = if shards == 1 {
            w.relay("s")
        } else {
            w.sharded_relay("s", shards)
        };
        let accounts: Vec<Account> = (0..6).map(|i| w.account(r, 1, i % 2 == 0)).collect();
        let mut seen = Vec::new();
        let mut sends = Vec::new();
        let mut sent = Vec::new();
        for (i, from) in accounts.iter().enumerate() {
            for (j, to) in accounts.iter().enumerate() {
                let m = w.message(from, 0, to, &format!("{i}->{j}"), &Msg::default());
                let r = w.send(from, 0, &m);
                let answer = match &r.result {
                    Ok(v) => status_of(v).to_string(),
                    Err(e) => e.code.as_str().to_string(),
                };
                sends.push(answer);
                sent.push((i, message_id(&m)));
            }
        }
        w.run_for(60_000);
        for (i, id) in sent {
            let s = w.status(&accounts[i], &id).result.unwrap();
            let code = field(&s, "error")
                .and_then(|e| field(e, "code"))
                .and_then(Value::as_str)
                .unwrap_or("");
            seen.push(format!("status {i}: {} {code}", status_of(&s)));
        }
        for (i, a) in accounts.iter().enumerate() {
            let mut t: Vec<String> = w
                .sync_all(a, 0)
                .iter()
                .map(|e| {
                    let kind = e.get("kind").and_then(Value::as_str).unwrap_or("");
                    format!("{kind}:{}", entry_text(e))
                })
                .collect();
            t.sort();
            seen.push(format!("timeline {i}: {t:?}"));
        }
        (sends, seen)
    }
    let (sends_one, one) = run(1);
    let (sends_four, four) = run(SHARDS);
    assert_eq!(one, four);
    for (a, b) in sends_one.iter().zip(&sends_four) {
        assert!(
            a == b || b == "delivering",
            "one shard answered {a}, four answered {b}"
        );
    }
    // Both kinds of end were compared: accepted, and refused by the receiving rules.
    assert!(one.iter().any(|l| l.contains("target_accepted")));
    assert!(one.iter().any(|l| l.contains("discovery_disabled")));
}

#[test]
fn the_shard_count_is_fixed_at_the_first_start() {
    let id = RelayId::parse("http://s.test").unwrap();
    let store = MemoryStore::new();
    let mut config = Config::new(id.clone(), NET);
    let mut e = Engine::new(config.clone(), store.clone(), |b: &mut [u8]| b.fill(1));
    e.open_store().unwrap();
    // Started again as one of four, or as another shard: refused, nothing read.
    config.shard = Shard::new(0, 4).unwrap();
    let mut e = Engine::new(config.clone(), store.clone(), |b: &mut [u8]| b.fill(1));
    assert_eq!(
        e.open_store(),
        Err(OpenError::Shard {
            held: "0/1".into(),
            asked: "0/4".into()
        })
    );
    let store4 = MemoryStore::new();
    let mut e = Engine::new(config.clone(), store4.clone(), |b: &mut [u8]| b.fill(1));
    e.open_store().unwrap();
    config.shard = Shard::new(2, 4).unwrap();
    let mut e = Engine::new(config, store4, |b: &mut [u8]| b.fill(1));
    assert!(matches!(e.open_store(), Err(OpenError::Shard { .. })));
}

#[test]
fn a_sibling_shard_is_limited_as_a_local_delivery_is_not_as_a_foreign_relay() {
    // deliver_rate limits each foreign source relay; deliveries between shards of one relay
    // are limited as local deliveries are: by the recipient's own buckets only.
    let mut w = World::new(9);
    let r = w.sharded_relay("s", SHARDS);
    for n in 0..SHARDS as usize {
        w.nodes[r + n].config.policies.deliver_rate = 1;
        let seed = 90 + n as u64;
        w.nodes[r + n].restart(seed);
    }
    let alice = w.account(r, 1, true);
    let mut bobs = Vec::new();
    while bobs.len() < 3 {
        let b = w.account(r, 1, true);
        if b.home != alice.home && bobs.iter().all(|o: &Account| o.home == b.home) {
            bobs.push(b);
        }
    }
    let mut ids = Vec::new();
    for b in &bobs {
        let m = w.message(&alice, 0, b, "x", &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
        ids.push(message_id(&m));
    }
    w.pump();
    for id in ids {
        let s = w.status(&alice, &id).result.unwrap();
        assert_eq!(status_of(&s), "target_accepted", "{s:?}");
    }
}

#[test]
fn seed_a_sibling_that_cannot_be_asked_leaves_the_send_unavailable_and_unaccepted() {
    // The host could not reach the recipient's shard for its route: the send is answered
    // `unavailable` with a retry_after, nothing is accepted or written, and the client's
    // identical retry (the sibling reachable again) is accepted as a first submission.
    let Pair {
        mut w, alice, bob, ..
    } = pair(10, true);
    let m = w.message(&alice, 0, &bob, "later", &Msg::default());
    let params = relay_core::wire::canonical::object_to_vec(&m);
    let caller = World::session(&alice, 0);
    let a = alice.home;
    let now = w.clock(a);
    let first = w.nodes[a]
        .engine
        .call(&caller, "message.send", &params, now);
    assert_eq!(code_of(&first), "unavailable");
    assert_eq!(w.nodes[a].engine.wanted_route(), Some(bob.id()));
    let before = w.nodes[a].store.snapshot();
    w.nodes[a]
        .engine
        .sibling_route(&bob.id(), SiblingRoute::Failed);
    let again = w.nodes[a]
        .engine
        .call(&caller, "message.send", &params, now);
    let e = again.result.as_ref().unwrap_err();
    assert_eq!(e.code.as_str(), "unavailable");
    let wait = e
        .data
        .as_ref()
        .and_then(|d| field(d, "retry_after"))
        .and_then(Value::as_protocol_int);
    assert!(wait.is_some_and(|ms| ms > 0), "retry_after: {:?}", e.data);
    assert_eq!(w.nodes[a].engine.wanted_route(), None, "it asks no more");
    assert!(again.effects.is_empty());
    assert!(w.nodes[a].store.snapshot() == before, "nothing was written");
    assert_eq!(code_of(&w.status(&alice, &message_id(&m))), "not_found");
    // The retry: the route is fetched again, and the send is accepted and delivered once.
    let r = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(status_of(&r), "delivering");
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(kinds(&w.sync_all(&bob, 0)), ["received"]);
}

/// A relay `s` of one shard or of [`SHARDS`], a relay `o` with Carol, and two senders of `s`
/// on shards other than each other's and than the one Carol's id hashes to (with `s`'s
/// policies as `tune` gives them).
struct Senders {
    w: World,
    s: usize,
    carol: Account,
    alice: Account,
    dave: Account,
}

fn senders(shards: u32, tune: impl Fn(&mut Config)) -> Senders {
    let mut w = World::new(11);
    let s = if shards == 1 {
        w.relay_with("s", &tune)
    } else {
        w.sharded_relay_with("s", shards, &tune)
    };
    let o = w.relay_with("o", &tune);
    let carol = w.account(o, 1, true);
    let id = w.nodes[s].id.clone();
    let owner = w.node_serving(&id, &carol.id()).unwrap();
    let alice = loop {
        let a = w.account(s, 1, true);
        if shards == 1 || a.home != owner {
            break a;
        }
    };
    let dave = loop {
        let d = w.account(s, 1, true);
        if shards == 1 || (d.home != owner && d.home != alice.home) {
            break d;
        }
    };
    Senders {
        w,
        s,
        carol,
        alice,
        dave,
    }
}

#[test]
fn a_route_the_relay_learned_from_a_recipient_route_is_known_to_every_shard() {
    // Alice's send passes Carol's route (recipient_route): a relay of one shard holds it
    // from then on, and Dave's send without one finds it. A sharded relay holds it in
    // Alice's shard, which shares it with Carol's shard (a shard call); Dave's shard asks
    // Carol's and finds it too.
    fn run(shards: u32) -> String {
        let Senders {
            mut w,
            carol,
            alice,
            dave,
            ..
        } = senders(shards, |_| {});
        let route = w.route_of(&carol);
        let with_route = Msg {
            recipient_route: Some(route),
            ..Msg::default()
        };
        let m = w.message(&alice, 0, &carol, "with the route", &with_route);
        w.send(&alice, 0, &m).result.unwrap();
        let m = w.message(&dave, 0, &carol, "without", &Msg::default());
        code_of(&w.send(&dave, 0, &m)).to_string()
    }
    assert_eq!(run(1), "ok");
    assert_eq!(run(SHARDS), "ok", "a sharded relay forgot a route it holds");
}

#[test]
fn a_published_route_in_use_is_kept_for_every_shard() {
    // Carol's route is published to `s` and used by Alice's sends; a relay of one shard
    // touches it with each use (every half retention) and keeps it, so Dave's first send,
    // after the retention since the publish, still finds it. In a sharded relay Alice's
    // sends touch her shard's copy, and each touch is shared with Carol's shard (publishing
    // the held route again is a use), so Carol's shard keeps it and Dave's shard finds it.
    const RETENTION: u64 = 10 * 60_000;
    fn run(shards: u32) -> String {
        let Senders {
            mut w,
            s,
            carol,
            alice,
            dave,
        } = senders(shards, |c| {
            c.policies.message_retention = RETENTION;
            c.policies.message_delivery_age_limit = RETENTION / 2;
        });
        let id = w.nodes[s].id.clone();
        let owner = w.node_serving(&id, &carol.id()).unwrap();
        w.publish_route(owner, &carol);
        for i in 0..2 {
            let m = w.message(&alice, 0, &carol, &format!("use {i}"), &Msg::default());
            w.send(&alice, 0, &m).result.unwrap();
            w.run_for(RETENTION * 6 / 10);
        }
        let m = w.message(&dave, 0, &carol, "first from dave", &Msg::default());
        code_of(&w.send(&dave, 0, &m)).to_string()
    }
    assert_eq!(run(1), "ok");
    assert_eq!(run(SHARDS), "ok", "a sharded relay forgot a route in use");
}
