//! Relay RPC in batches (protocol.md §6, `message.deliver.batch`): the destination takes
//! each item as a `message.deliver` of its own, a malformed batch is refused whole, and a
//! source sends together only what waits for one destination, never holding a lone one.

use relay_core::engine::{Caller, Effect, Outcome, PeerMethod};
use relay_core::wire::canonical;
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

const SRC: &str = "http://source.test";

struct Dest {
    w: World,
    d: usize,
    alice: Account,
    bob: Account,
}

fn dest() -> Dest {
    let mut w = World::new(47);
    let s = w.relay("source");
    let d = w.relay("dest");
    let alice = w.account(s, 1, true);
    let bob = w.account(d, 1, true);
    Dest { w, d, alice, bob }
}

fn deliver_params(x: &mut Dest, m: &Msg) -> Object {
    let send = x.w.message(&x.alice, 0, &x.bob, "hi", m);
    World::deliver_params(&x.alice, 0, &send)
}

fn item(params: &Object, revision: u64) -> Value {
    let mut o = Object::new();
    o.insert("params", Value::Object(params.clone()));
    o.insert("route_revision", revision);
    Value::Object(o)
}

fn batch(items: Vec<Value>) -> Object {
    let mut o = Object::new();
    o.insert("items", Value::Array(items));
    o
}

fn source() -> Caller {
    Caller::relay(RelayId::parse(SRC).unwrap())
}

/// The `code` of a batch item's error, or "" for a result.
fn item_code(v: &Value) -> String {
    field(v, "error")
        .and_then(|e| field(e, "code"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn results(r: &relay_core::engine::Response) -> Vec<Value> {
    let v = r.result.as_ref().expect("a batch answer");
    array(field(v, "results").expect("results")).expect("a list")
}

#[test]
fn each_item_is_answered_as_its_own_message_deliver_in_order() {
    let mut x = dest();
    let fresh = deliver_params(&mut x, &Msg::default());
    let again = deliver_params(&mut x, &Msg::default());
    // Delivered alone first: in the batch it is recognized (idempotency), not received twice.
    let alone = x.w.deliver_at(x.d, SRC, &again, 1);
    assert_eq!(status_of(alone.result.as_ref().unwrap()), "target_accepted");
    // Changed after it was signed: refused on its own, the others unaffected.
    let mut stale = deliver_params(&mut x, &Msg::default());
    let mut env = stale.get("envelope").unwrap().as_object().unwrap().clone();
    let mut body = Object::new();
    body.insert("x-test", "changed");
    env.insert("body", Value::Object(body));
    stale.insert("envelope", Value::Object(env));
    let r = x.w.call(
        x.d,
        &source(),
        "message.deliver.batch",
        &batch(vec![item(&fresh, 1), item(&stale, 1), item(&again, 1)]),
    );
    let got = results(&r);
    assert_eq!(got.len(), 3);
    assert_eq!(status_of(&got[0]), "target_accepted");
    assert_eq!(
        field(&got[0], "message_id"),
        fresh.get("envelope").and_then(|e| field(e, "message_id"))
    );
    assert_eq!(item_code(&got[1]), "invalid_signature");
    assert_eq!(status_of(&got[2]), "target_accepted");
    assert_eq!(
        canonical::to_vec(&got[2]),
        alone.body(),
        "a recognized item answers the stored result"
    );
    assert_eq!(x.w.record_count(x.d, &x.bob), 2, "each message once");
}

#[test]
fn rule_6_holds_for_each_item_with_its_own_route_revision() {
    let mut x = dest();
    let p = deliver_params(&mut x, &Msg::default());
    x.bob.route_revision = 2;
    let route = x.w.route_of(&x.bob);
    let mut publish = Object::new();
    publish.insert("route", Value::Object(route));
    let r = x.w.call(x.d, &Caller::Anonymous, "route.publish", &publish);
    assert!(r.result.is_ok(), "{:?}", r.result);
    let r = x.w.call(
        x.d,
        &source(),
        "message.deliver.batch",
        &batch(vec![item(&p, 1)]),
    );
    let got = results(&r);
    assert_eq!(item_code(&got[0]), "not_home_relay");
    let route = field(&got[0], "error")
        .and_then(|e| field(e, "data"))
        .and_then(|d| field(d, "route"))
        .and_then(|r| field(r, "revision"))
        .and_then(Value::as_protocol_int);
    assert_eq!(route, Some(2), "the item's error carries the highest route");
    let r = x.w.call(
        x.d,
        &source(),
        "message.deliver.batch",
        &batch(vec![item(&p, 2)]),
    );
    assert_eq!(status_of(&results(&r)[0]), "target_accepted");
    assert_eq!(x.w.record_count(x.d, &x.bob), 1);
}

#[test]
fn a_malformed_batch_is_refused_whole_and_stores_nothing() {
    let mut x = dest();
    let p = deliver_params(&mut x, &Msg::default());
    let good = item(&p, 1);
    let without = |key: &str| {
        let mut o = good.as_object().unwrap().clone();
        o.remove(key);
        Value::Object(o)
    };
    let max = x.w.nodes[x.d].config.policies.max_batch as usize;
    let mut not_a_list = Object::new();
    not_a_list.insert("items", good.clone());
    for (what, params) in [
        ("items not a list", not_a_list),
        ("no items", batch(Vec::new())),
        ("over max_batch", batch(vec![good.clone(); max + 1])),
        (
            "an item without params",
            batch(vec![good.clone(), without("params")]),
        ),
        (
            "an item without route_revision",
            batch(vec![good.clone(), without("route_revision")]),
        ),
    ] {
        let r = x.w.call(x.d, &source(), "message.deliver.batch", &params);
        assert_eq!(code_of(&r), "invalid_params", "{what}: {:?}", r.result);
        assert_eq!(x.w.record_count(x.d, &x.bob), 0, "{what}: nothing stored");
    }
    // Over max_batch_bytes: refused before it is parsed.
    let limit = x.w.nodes[x.d].config.policies.max_batch_bytes as usize;
    let mut big = canonical::object_to_vec(&batch(vec![good.clone()]));
    big.splice(
        1..1,
        format!("\"pad\":\"{}\",", "x".repeat(limit)).into_bytes(),
    );
    let r = x.w.call_raw(x.d, &source(), "message.deliver.batch", &big);
    assert_eq!(code_of(&r), "payload_too_large");
    assert_eq!(x.w.record_count(x.d, &x.bob), 0);
}

#[test]
fn only_a_relay_calls_it_and_without_a_route_revision() {
    let mut x = dest();
    let p = deliver_params(&mut x, &Msg::default());
    let b = batch(vec![item(&p, 1)]);
    let r =
        x.w.call(x.d, &Caller::Anonymous, "message.deliver.batch", &b);
    assert_eq!(code_of(&r), "unauthenticated");
    let with_revision = Caller::relay_at(RelayId::parse(SRC).unwrap(), Some(1));
    let r = x.w.call(x.d, &with_revision, "message.deliver.batch", &b);
    assert_eq!(code_of(&r), "invalid_params");
    assert_eq!(x.w.record_count(x.d, &x.bob), 0);
}

/// A source whose destination takes one attempt at a time: what waits goes together.
fn one_slot() -> (World, usize, Account, Account) {
    let mut w = World::new(48);
    let s = w.relay_with("source", |c| c.max_in_flight_per_destination = 1);
    let d = w.relay("dest");
    let alice = w.account(s, 1, true);
    let bob = w.account(d, 1, true);
    w.publish_route(s, &bob);
    (w, s, alice, bob)
}

fn send(w: &mut World, alice: &Account, bob: &Account) -> String {
    let m = w.message(alice, 0, bob, "hi", &Msg::default());
    let r = w.send(alice, 0, &m);
    assert_eq!(status_of(r.result.as_ref().unwrap()), "delivering");
    message_id(&m)
}

#[test]
fn a_lone_delivery_goes_at_once_alone_and_what_waits_goes_in_one_batch() {
    let (mut w, _, alice, bob) = one_slot();
    let first = send(&mut w, &alice, &bob);
    let out = w.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].method,
        PeerMethod::Deliver,
        "never held back to fill a batch"
    );
    let waiting: Vec<String> = (0..3).map(|_| send(&mut w, &alice, &bob)).collect();
    assert!(w.take_outbox().is_empty(), "the slot is taken: they wait");
    w.carry(out[0].clone());
    let out = w.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].method, PeerMethod::DeliverBatch);
    assert_eq!(
        out[0].riders.len(),
        2,
        "the three that waited, in one exchange"
    );
    w.carry(out[0].clone());
    for id in std::iter::once(&first).chain(&waiting) {
        let r = w.status(&alice, id);
        assert_eq!(
            status_of(r.result.as_ref().unwrap()),
            "target_accepted",
            "{id}"
        );
    }
    assert_eq!(w.record_count(bob.home, &bob), 4);
}

/// Two deliveries in one batch, in the network: a lone one held the one slot while they
/// waited, and its answer let them go.
struct Batched {
    w: World,
    source: usize,
    alice: Account,
    bob: Account,
    batch: InFlight,
    ids: Vec<String>,
}

fn batch_of_two() -> Batched {
    let (mut w, source, alice, bob) = one_slot();
    send(&mut w, &alice, &bob);
    let lone = w.take_outbox().remove(0);
    let ids = (0..2).map(|_| send(&mut w, &alice, &bob)).collect();
    w.carry(lone);
    let batch = w.take_outbox().remove(0);
    assert_eq!(batch.method, PeerMethod::DeliverBatch);
    Batched {
        w,
        source,
        alice,
        bob,
        batch,
        ids,
    }
}

/// The DeliveryStatus of `id` at its sender's relay.
fn status(w: &mut World, from: &Account, id: &str) -> Value {
    w.status(from, id).result.expect("a status")
}

#[test]
fn a_batch_lost_in_the_network_is_an_unknown_outcome_for_every_item() {
    let Batched {
        mut w,
        source,
        alice,
        bob,
        batch,
        ids,
    } = batch_of_two();
    w.outcome(source, &batch.task, batch.attempt, Outcome::Unknown);
    for id in &ids {
        assert_eq!(status_of(&status(&mut w, &alice, id)), "delivering", "{id}");
    }
    // Each item is retried at the same target (no switch after an unknown outcome), and
    // delivered once.
    w.run_for(120_000);
    for id in &ids {
        assert_eq!(
            status_of(&status(&mut w, &alice, id)),
            "target_accepted",
            "{id}"
        );
    }
    assert_eq!(w.record_count(bob.home, &bob), 3);
}

#[test]
fn a_batch_refused_whole_is_that_answer_for_every_item() {
    let Batched {
        mut w,
        source,
        alice,
        batch,
        ids,
        ..
    } = batch_of_two();
    let refused = error_body("invalid_params", None);
    w.outcome(source, &batch.task, batch.attempt, Outcome::Error(refused));
    for id in &ids {
        let v = status(&mut w, &alice, id);
        assert_eq!(status_of(&v), "failed", "{id}");
        let code = field(&v, "error").and_then(|e| field(e, "code"));
        assert_eq!(code.and_then(Value::as_str), Some("invalid_params"));
    }
    assert!(
        !w.take_outbox()
            .iter()
            .any(|r| matches!(r.method, PeerMethod::Deliver | PeerMethod::DeliverBatch)),
        "nothing is sent again"
    );
}

#[test]
fn the_effect_names_every_item_it_carries() {
    let (mut w, s, alice, bob) = one_slot();
    send(&mut w, &alice, &bob);
    let lone = w.take_outbox().remove(0);
    for _ in 0..2 {
        send(&mut w, &alice, &bob);
    }
    // The lone attempt's answer, as the source's own engine sees it.
    let effects = {
        let t = w.target_node(&lone).unwrap();
        let src = w.nodes[s].id.clone();
        let r = w.call_raw(
            t,
            &Caller::relay_at(src, lone.route_revision),
            "message.deliver",
            &lone.body,
        );
        let now = w.clock(s);
        w.nodes[s]
            .engine
            .outcome(&lone.task, lone.attempt, Outcome::Result(r.body()), now)
    };
    let sends: Vec<&Effect> = effects
        .iter()
        .filter(|e| matches!(e, Effect::Send { .. }))
        .collect();
    assert_eq!(sends.len(), 1);
    let Effect::Send {
        method,
        body,
        riders,
        route_revision,
        ..
    } = sends[0]
    else {
        unreachable!()
    };
    assert_eq!(*method, PeerMethod::DeliverBatch);
    assert_eq!(
        *route_revision, None,
        "a batch carries no Relay-Route-Revision"
    );
    assert_eq!(riders.len(), 1);
    let items = array(field(&parse(body), "items").unwrap()).unwrap();
    assert_eq!(items.len(), 2);
    for i in &items {
        assert_eq!(
            field(i, "route_revision").and_then(Value::as_protocol_int),
            Some(1)
        );
    }
}

#[test]
fn the_item_that_times_out_last_reports_the_batch_so_no_answer_is_lost() {
    let mut w = World::new(49);
    let s = w.relay_with("source", |c| {
        c.max_in_flight_per_destination = 1;
        c.policies.message_delivery_age_limit = 60_000;
    });
    let d = w.relay("dest");
    let alice = w.account(s, 1, true);
    let bob = w.account(d, 1, true);
    w.publish_route(s, &bob);
    w.advance(120_000);
    send(&mut w, &alice, &bob);
    let lone = w.take_outbox().remove(0);
    // The first to wait has 10 s left before its deadline; the next has a minute.
    let near = Msg {
        created_offset: -50_000,
        ..Msg::default()
    };
    let m = w.message(&alice, 0, &bob, "near", &near);
    w.send(&alice, 0, &m).result.unwrap();
    let near_id = message_id(&m);
    let far_id = send(&mut w, &alice, &bob);
    w.carry(lone);
    let b = w.take_outbox().remove(0);
    assert_eq!(b.method, PeerMethod::DeliverBatch);
    assert!(
        b.task.ends_with(&far_id),
        "the later timeout reports: {}",
        b.task
    );
    assert!(b.riders.iter().any(|(t, _)| t.ends_with(&near_id)));
    // Past the near deadline, the answer still reaches the item that waits for it.
    w.advance_without_network(15_000);
    w.carry(b);
    let v = status(&mut w, &alice, &far_id);
    assert_eq!(status_of(&v), "target_accepted", "{v:?}");
    assert_eq!(status_of(&status(&mut w, &alice, &near_id)), "failed");
}
