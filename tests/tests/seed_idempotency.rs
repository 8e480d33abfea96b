//! Seed "Idempotent Message Retries" and "Delivery Result Retention Rules".

use relay_core::engine::{Caller, Effect, Outcome};
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

fn setup(seed: u64) -> (World, usize, usize, Account, Account) {
    let mut w = World::new(seed);
    let a = w.relay_with("a", |c| {
        c.policies.message_retention = 3_600_000;
        c.policies.message_delivery_age_limit = 600_000;
    });
    let b = w.relay_with("b", |c| {
        c.policies.message_retention = 3_600_000;
        c.policies.message_delivery_age_limit = 600_000;
    });
    let alice = w.account(a, 2, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    (w, a, b, alice, bob)
}

fn accepted_at(v: &Value) -> u64 {
    field(v, "accepted_at")
        .and_then(Value::as_protocol_int)
        .unwrap()
}

#[test]
fn identical_send_retry_returns_the_latest_status_with_unchanged_accepted_at_and_adds_nothing() {
    let (mut w, a, b, alice, bob) = setup(31);
    let m = w.message(
        &alice,
        0,
        &bob,
        "once",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let first = w.send(&alice, 0, &m).result.unwrap();
    let sends = w.outbox.len();
    w.now += 5;
    let again = w.send(&alice, 0, &m);
    assert!(again
        .effects
        .iter()
        .all(|e| !matches!(e, Effect::Send { .. } | Effect::Notify { .. })));
    assert_eq!(w.outbox.len(), sends, "no new delivery task");
    assert_eq!(
        accepted_at(&again.result.clone().unwrap()),
        accepted_at(&first)
    );
    w.pump();
    let notes_a = w.nodes[a].notifications.len();
    let notes_b = w.nodes[b].notifications.len();
    w.now += 5;
    let later = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(
        status_of(&later),
        "target_accepted",
        "the latest status known"
    );
    assert_eq!(accepted_at(&later), accepted_at(&first));
    assert_eq!(w.record_count(a, &alice), 1, "no second sent record");
    assert_eq!(w.record_count(b, &bob), 1);
    assert_eq!(
        w.nodes[a].notifications.len(),
        notes_a,
        "no timeline-change notification"
    );
    assert_eq!(w.nodes[b].notifications.len(), notes_b);
    assert!(w.outbox.is_empty(), "finished delivery is not restarted");
}

#[test]
fn identical_content_is_canonical_json_equality_whatever_the_spelling() {
    let (mut w, a, _, alice, bob) = setup(32);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let first = w.send(&alice, 0, &m).result.unwrap();
    // Same members, other order and whitespace.
    let text = canonical::object_to_vec(&m);
    let mut spaced = String::from_utf8(text).unwrap().replace(",\"", ", \"");
    spaced.insert(1, ' ');
    let r = w.call_raw(
        a,
        &World::session(&alice, 0),
        "message.send",
        spaced.as_bytes(),
    );
    assert_eq!(accepted_at(&r.result.unwrap()), accepted_at(&first));
    // Transport details do not participate: a second session of the same device.
    let s2 = w.open_session(&alice, 0).unwrap();
    let r = w.call(a, &Caller::Session(s2), "message.send", &m);
    assert_eq!(accepted_at(&r.result.unwrap()), accepted_at(&first));
}

#[test]
fn same_key_with_different_content_returns_state_conflict_and_keeps_the_original() {
    let (mut w, a, b, alice, _) = setup(33);
    // Two recipient devices, so that the same boxes can come in another order.
    let bob = w.account(b, 2, true);
    w.publish_route(a, &bob);
    let m = w.message(&alice, 0, &bob, "original", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let out = w.take_outbox();
    // An unknown member, a longer box list, the same boxes in another order (array order
    // counts), and a sender_boxes presence each make it different.
    let mut extra = m.clone();
    extra.insert("x-unknown", 1u64);
    let mut sender = m.clone();
    sender.insert("sender_boxes", m.get("recipient_boxes").cloned().unwrap());
    let Some(Value::Array(boxes)) = m.get("recipient_boxes").cloned() else {
        panic!("recipient_boxes");
    };
    assert_eq!(boxes.len(), 2);
    assert_ne!(boxes[0], boxes[1]);
    let mut longer = m.clone();
    longer.insert(
        "recipient_boxes",
        Value::Array(vec![boxes[0].clone(), boxes[1].clone(), boxes[0].clone()]),
    );
    let mut reordered = m.clone();
    reordered.insert(
        "recipient_boxes",
        Value::Array(vec![boxes[1].clone(), boxes[0].clone()]),
    );
    for variant in [extra, sender, longer, reordered] {
        let r = w.send(&alice, 0, &variant);
        assert_eq!(code_of(&r), "state_conflict");
        assert!(r.effects.is_empty());
    }
    assert_eq!(w.record_count(a, &alice), 0);
    // The original request and result are untouched: delivery proceeds with the original bytes.
    assert_eq!(out.len(), 1);
    let body = relay_core::wire::json::parse_object(&out[0].body).unwrap();
    assert_eq!(body.get("recipient_boxes"), m.get("recipient_boxes"));
    for r in out {
        w.carry(r);
    }
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn duplicate_deliver_returns_the_stored_receipt_and_adds_no_record_or_notification() {
    let (mut w, _, b, alice, bob) = setup(34);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let p = World::deliver_params(&alice, 0, &m);
    let first = w.deliver(b, "http://a.test", &p).result.unwrap();
    let notes = w.nodes[b].notifications.len();
    w.now += 1_000;
    let again = w.deliver(b, "http://a.test", &p).result.unwrap();
    assert_eq!(again, first);
    assert_eq!(w.record_count(b, &bob), 1);
    assert_eq!(w.nodes[b].notifications.len(), notes);
    let mut other = p.clone();
    other.insert("x", true);
    assert_eq!(
        code_of(&w.deliver(b, "http://a.test", &other)),
        "state_conflict"
    );
    assert_eq!(w.record_count(b, &bob), 1);
}

#[test]
fn later_expiry_or_device_changes_do_not_retroactively_negate_acceptance() {
    let (mut w, _, b, alice, bob) = setup(35);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let p = World::deliver_params(&alice, 0, &m);
    let first = w.deliver(b, "http://a.test", &p).result.unwrap();
    // bob's only device is revoked and the age limit passes: a duplicate is still the stored acceptance.
    let rev =
        relay_core::client::draft::revocation(NET, &bob.key.id(), &bob.devices[0].id(), w.clock(b))
            .sign(&bob.key);
    w.call(b, &World::session(&bob, 0), "device.revoke", &rev)
        .result
        .unwrap();
    w.now += 700_000;
    assert_eq!(w.deliver(b, "http://a.test", &p).result.unwrap(), first);
    // A message not yet accepted still must meet the receiving conditions.
    let m2 = w.message(
        &alice,
        0,
        &bob,
        "y",
        &Msg {
            created_offset: -1,
            ..Msg::default()
        },
    );
    let p2 = World::deliver_params(&alice, 0, &m2);
    assert_eq!(
        code_of(&w.deliver(b, "http://a.test", &p2)),
        "device_unknown"
    );
}

#[test]
fn idempotency_survives_a_relay_restart() {
    let (mut w, a, _, alice, bob) = setup(36);
    let m = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let first = w.send(&alice, 0, &m).result.unwrap();
    w.nodes[a].restart(1);
    let again = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(accepted_at(&again), accepted_at(&first));
    let mut other = m.clone();
    other.insert("x", 1u64);
    assert_eq!(code_of(&w.send(&alice, 0, &other)), "state_conflict");
    assert_eq!(w.record_count(a, &alice), 1);
}

#[test]
fn identical_requests_one_after_the_other_produce_one_acceptance() {
    // The engine serializes operations, so this is what concurrent requests become inside
    // one engine; the conformance suite sends them truly at once to every live host
    // (`concurrent_identical_sends_are_one_acceptance`).
    let (mut w, a, _, alice, bob) = setup(37);
    let m = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let r1 = w.send(&alice, 0, &m);
    let r2 = w.send(&alice, 0, &m);
    assert_eq!(r1.result, r2.result);
    assert_eq!(w.outbox.len(), 1);
    assert_eq!(w.record_count(a, &alice), 1);
}

#[test]
fn an_explicit_rejection_creates_no_result_and_a_corrected_request_is_accepted() {
    let (mut w, _, _, alice, bob) = setup(38);
    let mut m = w.message(&alice, 0, &bob, "x", &Msg::default());
    m.insert("recipient_boxes", Value::Array(vec![]));
    assert_eq!(code_of(&w.send(&alice, 0, &m)), "invalid_params");
    assert_eq!(code_of(&w.status(&alice, &message_id(&m))), "not_found");
    // Corrected, same message id: accepted, not state_conflict.
    let fixed = w.message(&alice, 0, &bob, "x", &Msg::default());
    let mut corrected = m.clone();
    corrected.insert(
        "recipient_boxes",
        fixed.get("recipient_boxes").cloned().unwrap(),
    );
    assert_eq!(
        status_of(&w.send(&alice, 0, &corrected).result.unwrap()),
        "delivering"
    );
}

#[test]
fn result_retention_keeps_status_until_accepted_at_plus_message_retention_even_if_policy_shrinks() {
    let (mut w, a, _, alice, bob) = setup(39);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    w.pump();
    let selfm = w.message(&alice, 0, &alice, "me", &Msg::default());
    w.send(&alice, 0, &selfm).result.unwrap();
    // The operator shortens retention to one minute; the promise of an hour stands.
    let mut p = w.nodes[a].config.policies.clone();
    p.message_retention = 60_000;
    w.nodes[a].config.policies = p.clone();
    w.nodes[a].engine.set_policies(p);
    w.run_for(3_500_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&selfm)).result.unwrap()),
        "target_accepted"
    );
    // Repeated requests do not extend retention.
    let again = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(accepted_at(&again), T0);
    w.run_for(200_000);
    w.tick(a);
    assert_eq!(
        code_of(&w.status(&alice, &message_id(&m))),
        "not_found",
        "retention ended"
    );
    // The same request after retention and beyond the age limit is message_expired.
    assert_eq!(code_of(&w.send(&alice, 0, &m)), "message_expired");
}

#[test]
fn outcomes_for_unknown_tasks_or_attempts_are_ignored() {
    let (mut w, a, _, alice, bob) = setup(40);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().remove(0);
    w.outcome(a, "nope", 1, Outcome::Unknown);
    w.outcome(
        a,
        &req.task,
        req.attempt + 5,
        Outcome::Result(b"{}".to_vec()),
    );
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "delivering"
    );
    w.carry(req);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    let _ = Object::new();
}

#[test]
fn after_retention_a_logical_key_is_accepted_anew_only_once_its_earlier_delivery_is_cleared() {
    // Seed, result retention: after retention a request that cannot be recognized is
    // handled as not yet accepted, and a relay may answer message_expired when it can tell
    // that retention ended. Expiry runs a few records per tick here, so the sent record
    // goes before the failed delivery that shares its logical key.
    let mut w = World::new(43);
    let a = w.relay_with("a", |c| {
        c.policies.message_retention = 3_600_000;
        c.policies.message_delivery_age_limit = 600_000;
        c.tick_batch = 1;
    });
    let b = w.relay("b");
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m = w.message(&alice, 0, &bob, "first", &Msg::default());
    let id = message_id(&m);
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().remove(0);
    let rejected = Outcome::Error(error_body("permission_denied", None));
    w.outcome(a, &req.task, req.attempt, rejected);
    assert_eq!(w.deliveries(a, Some("failed")).len(), 1);

    // Retention ends; one record expires per tick, the sent record before the delivery.
    w.now += 3_600_001;
    let mut ticks = 0;
    while code_of(&w.status(&alice, &id)) != "not_found" {
        assert!(ticks < 10, "the sent record expires");
        w.tick(a);
        ticks += 1;
    }
    let lingering = |w: &World| {
        w.nodes[a]
            .store
            .snapshot()
            .keys()
            .any(|k| k.starts_with(b"task/"))
    };
    assert!(lingering(&w), "the failed delivery's record lingers");
    let again = Msg {
        message_id: Some(id.clone()),
        ..Msg::default()
    };
    let m2 = w.message(&alice, 0, &bob, "second", &again);
    assert_eq!(
        code_of(&w.send(&alice, 0, &m2)),
        "message_expired",
        "a second delivery under the lingering one's id would be erased by its expiry"
    );

    // Once expiry has cleared it, the same logical key is accepted anew and delivered
    // (bob's route, unused for the retention, was forgotten too: it is published again).
    w.tick(a);
    assert!(!lingering(&w));
    w.publish_route(a, &bob);
    assert_eq!(
        status_of(&w.send(&alice, 0, &m2).result.unwrap()),
        "delivering"
    );
    w.run_for(60_000);
    assert_eq!(
        status_of(&w.status(&alice, &id).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(w.record_count(b, &bob), 1);
}

/// The acceptances a call reported, as `(method, from, to, status)`.
fn acceptances(effects: &[Effect]) -> Vec<(&'static str, String, String, &'static str)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Accepted(a) => Some((a.method, a.from.clone(), a.to.clone(), a.status)),
            _ => None,
        })
        .collect()
}

/// Seed "Idempotent Message Retries": a retry of an accepted message returns the stored
/// result and is no new acceptance, so a host logs one `accepted` line per message, on the
/// sending relay (message.send) and on the receiving one (message.deliver).
#[test]
fn an_identical_retry_is_not_a_second_acceptance() {
    let (mut w, _, b, alice, bob) = setup(37);
    let (from, to) = (
        alice.key.id().as_str().to_string(),
        bob.key.id().as_str().to_string(),
    );
    let m = w.message(&alice, 0, &bob, "once", &Msg::default());
    let first = w.send(&alice, 0, &m);
    assert_eq!(
        acceptances(&first.effects),
        [("message.send", from.clone(), to.clone(), "delivering")]
    );
    w.now += 5;
    assert_eq!(acceptances(&w.send(&alice, 0, &m).effects), []);
    let m2 = w.message(&alice, 0, &bob, "twice", &Msg::default());
    let p = World::deliver_params(&alice, 0, &m2);
    let delivered = w.deliver(b, "http://a.test", &p);
    assert_eq!(
        acceptances(&delivered.effects),
        [("message.deliver", from, to, "target_accepted")]
    );
    w.now += 1_000;
    assert_eq!(acceptances(&w.deliver(b, "http://a.test", &p).effects), []);
}
