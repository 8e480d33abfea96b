//! Seed "Delivery Flow": cross-account delivery, account self-delivery, local delivery.

use relay_core::engine::{Caller, Effect, PeerMethod};
use relay_core::wire::json::{self, Object, Value};
use relay_tests::*;

struct Two {
    w: World,
    a: usize,
    b: usize,
    alice: Account,
    bob: Account,
}

fn two() -> Two {
    let mut w = World::new(11);
    let a = w.relay("a");
    let b = w.relay("b");
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 2, true);
    w.publish_route(a, &bob);
    w.publish_route(b, &alice);
    Two {
        w,
        a,
        b,
        alice,
        bob,
    }
}

#[test]
fn cross_account_send_returns_delivering_and_status_becomes_target_accepted_after_destination_accepts(
) {
    let Two {
        mut w, alice, bob, ..
    } = two();
    let m = w.message(&alice, 0, &bob, "hello", &Msg::default());
    let r = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(status_of(&r), "delivering");
    assert!(
        field(&r, "deadline").is_some(),
        "source answers carry the deadline"
    );
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "delivering"
    );
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(
        field(&s, "accepted_at"),
        field(&r, "accepted_at"),
        "accepted_at unchanged"
    );
    assert!(field(&s, "target_accepted_at").is_some());
    let got = w.sync_all(&bob, 0);
    assert_eq!(got.len(), 1);
    assert_eq!(entry_text(&got[0]), "hello");
    assert_eq!(got[0].get("kind").and_then(Value::as_str), Some("received"));
}

#[test]
fn cross_account_sent_record_enters_the_timeline_only_when_sender_boxes_is_supplied() {
    let Two {
        mut w, alice, bob, ..
    } = two();
    let with = w.message(
        &alice,
        0,
        &bob,
        "with",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let without = w.message(&alice, 0, &bob, "without", &Msg::default());
    w.send(&alice, 0, &with).result.unwrap();
    w.send(&alice, 0, &without).result.unwrap();
    w.pump();
    let sent = w.sync_all(&alice, 0);
    assert_eq!(sent.len(), 1);
    assert_eq!(entry_text(&sent[0]), "with");
    assert_eq!(sent[0].get("kind").and_then(Value::as_str), Some("sent"));
    assert_eq!(w.sync_all(&bob, 0).len(), 2);
}

#[test]
fn cross_account_deliver_carries_original_envelope_recipient_boxes_certificate_and_authorization_and_never_sender_boxes(
) {
    let Two {
        mut w,
        a,
        b,
        alice,
        bob,
    } = two();
    let grant = w.grant(&bob, &alice);
    let m = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            sender_boxes: true,
            authorization: Some(grant.clone()),
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m).result.unwrap();
    let out = w.take_outbox();
    assert_eq!(out.len(), 1);
    let req = &out[0];
    assert_eq!(req.source, a);
    assert_eq!(req.target, w.nodes[b].id);
    assert_eq!(req.method, PeerMethod::Deliver);
    let body = json::parse_object(&req.body).unwrap();
    assert_eq!(body.get("envelope"), m.get("envelope"));
    assert_eq!(body.get("recipient_boxes"), m.get("recipient_boxes"));
    assert_eq!(
        body.get("device_certificate"),
        Some(&Value::Object(alice.certs[0].clone()))
    );
    assert_eq!(body.get("authorization"), Some(&Value::Object(grant)));
    assert!(
        body.get("sender_boxes").is_none(),
        "sender key boxes remain at the source"
    );
    assert_eq!(body.len(), 4);
}

#[test]
fn each_record_accepted_at_is_its_own_relay_acceptance_time() {
    let Two {
        mut w,
        b,
        alice,
        bob,
        ..
    } = two();
    w.nodes[b].skew = 1234;
    let m = w.message(
        &alice,
        0,
        &bob,
        "t",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m).result.unwrap();
    w.pump();
    let sent = w.sync_all(&alice, 0);
    let recv = w.sync_all(&bob, 0);
    let at = |e: &Object| {
        e.get("accepted_at")
            .and_then(Value::as_protocol_int)
            .unwrap()
    };
    assert_eq!(at(&sent[0]), T0);
    assert_eq!(at(&recv[0]), T0 + 1234);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(
        field(&s, "accepted_at").and_then(Value::as_protocol_int),
        Some(T0)
    );
    assert_eq!(
        field(&s, "target_accepted_at").and_then(Value::as_protocol_int),
        Some(T0 + 1234)
    );
}

#[test]
fn delivery_failure_after_acceptance_does_not_remove_the_sent_record() {
    let Two { mut w, alice, .. } = two();
    // carol is not discoverable: without credentials the destination rejects.
    let b = 1;
    let carol = w.account(b, 1, false);
    w.publish_route(0, &carol);
    let m = w.message(
        &alice,
        0,
        &carol,
        "no",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&w.send(&alice, 0, &m).result.unwrap()),
        "delivering"
    );
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert_eq!(
        field(&s, "error")
            .and_then(|e| field(e, "code"))
            .and_then(Value::as_str),
        Some("discovery_disabled")
    );
    assert_eq!(w.sync_all(&alice, 0).len(), 1, "the sent record stays");
    assert_eq!(w.record_count(b, &carol), 0);
}

#[test]
fn local_delivery_when_this_relay_also_serves_the_recipient_needs_no_message_deliver() {
    let mut w = World::new(3);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 1, true);
    let m = w.message(&alice, 0, &bob, "local", &Msg::default());
    let r = w.send(&alice, 0, &m);
    assert!(
        w.outbox.is_empty(),
        "no inter-relay request for local delivery"
    );
    let v = r.result.unwrap();
    assert_eq!(status_of(&v), "target_accepted");
    assert_eq!(w.sync_all(&bob, 0).len(), 1);
    assert!(r
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { account, latest_seq: 1 } if *account == bob.id())));
}

#[test]
fn local_delivery_rejection_by_receiving_rules_ends_failed_with_that_error() {
    let mut w = World::new(4);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 1, false);
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
    let v = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(
        status_of(&v),
        "failed",
        "accepted, then the delivery's first step rejected it"
    );
    assert_eq!(
        field(&v, "error")
            .and_then(|e| field(e, "code"))
            .and_then(Value::as_str),
        Some("discovery_disabled")
    );
    assert_eq!(w.record_count(a, &bob), 0);
    assert_eq!(w.sync_all(&alice, 0).len(), 1);
}

#[test]
fn self_delivery_appends_one_record_with_complete_recipient_boxes_and_returns_target_accepted() {
    let mut w = World::new(5);
    let a = w.relay("a");
    let alice = w.account(a, 3, false);
    let m = w.message(&alice, 0, &alice, "note to self", &Msg::default());
    let r = w.send(&alice, 0, &m);
    assert!(
        w.outbox.is_empty(),
        "self-delivery never initiates message.deliver"
    );
    let v = r.result.unwrap();
    assert_eq!(status_of(&v), "target_accepted");
    assert_eq!(w.record_count(a, &alice), 1, "exactly one record");
    for d in 0..3 {
        let e = w.sync_all(&alice, d);
        assert_eq!(e.len(), 1, "device {d}");
        assert_eq!(e[0].get("kind").and_then(Value::as_str), Some("self"));
        let kb = e[0].get("key_box").unwrap();
        assert_eq!(
            field(kb, "device_id").and_then(Value::as_str),
            Some(alice.devices[d].id().as_str())
        );
    }
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(
        status_of(&s),
        "target_accepted",
        "status is available for self-delivery"
    );
}

#[test]
fn self_delivery_must_not_carry_sender_boxes_authorization_or_recipient_route() {
    let mut w = World::new(6);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    let route = w.route_of(&alice);
    let grant = w.grant(&alice, &alice);
    for m in [
        Msg {
            sender_boxes: true,
            ..Msg::default()
        },
        Msg {
            authorization: Some(grant),
            ..Msg::default()
        },
        Msg {
            recipient_route: Some(route),
            ..Msg::default()
        },
    ] {
        let p = w.message(&alice, 0, &alice, "x", &m);
        let r = w.send(&alice, 0, &p);
        assert_eq!(code_of(&r), "invalid_params");
    }
    assert_eq!(w.record_count(a, &alice), 0);
}

#[test]
fn self_delivery_is_never_accepted_through_message_deliver() {
    let mut w = World::new(7);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let m = w.message(&alice, 0, &alice, "x", &Msg::default());
    let p = World::deliver_params(&alice, 0, &m);
    let r = w.deliver(a, "http://other.test", &p);
    assert_eq!(code_of(&r), "invalid_params");
    assert_eq!(w.record_count(a, &alice), 0);
}

#[test]
fn self_delivery_is_submitted_only_to_the_current_home_relay() {
    let mut w = World::new(8);
    let a = w.relay("a");
    let b = w.relay("b");
    let mut alice = w.account(a, 1, false);
    let old_session = alice.sessions[0].clone();
    w.migrate(&mut alice, b);
    w.publish_route(a, &alice);
    let m = w.message(&alice, 0, &alice, "x", &Msg::default());
    // The old home no longer is the home: it refuses, pointing at the new route.
    let r = w.call(a, &Caller::Session(old_session), "message.send", &m);
    assert_eq!(code_of(&r), "not_home_relay");
    let data = r.result.unwrap_err().data.unwrap();
    assert_eq!(
        field(&data, "route")
            .and_then(|r| field(r, "revision"))
            .and_then(Value::as_protocol_int),
        Some(2)
    );
    let r = w.send(&alice, 0, &m);
    assert_eq!(status_of(&r.result.unwrap()), "target_accepted");
}

#[test]
fn self_delivery_with_every_recipient_device_unavailable_is_rejected_with_device_unknown() {
    let mut w = World::new(9);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    let mut m = w.message(&alice, 0, &alice, "x", &Msg::default());
    let stranger = relay_core::client::DeviceKey::generate(&mut w.rng);
    let kb = relay_core::client::seal::seal_key_box(
        &mut w.rng,
        &stranger.id(),
        &stranger.box_key(),
        &[1; 32],
    );
    m.insert("recipient_boxes", Value::Array(vec![Value::Object(kb)]));
    let r = w.send(&alice, 0, &m);
    assert_eq!(code_of(&r), "device_unknown");
    assert_eq!(w.record_count(a, &alice), 0);
    // Rejected before acceptance: no result is kept.
    assert_eq!(code_of(&w.status(&alice, &message_id(&m))), "not_found");
}

#[test]
fn message_send_source_validation_rejects_with_the_right_codes() {
    let Two {
        mut w,
        a,
        alice,
        bob,
        ..
    } = two();
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    // No session.
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "message.send", &m)),
        "unauthenticated"
    );
    assert_eq!(
        code_of(&w.call(a, &Caller::Session("nope".into()), "message.send", &m)),
        "unauthenticated"
    );
    // A session of another account.
    let carol = w.account(a, 1, true);
    assert_eq!(code_of(&w.send(&carol, 0, &m)), "permission_denied");
    // A device without "send".
    let reader = relay_core::client::DeviceKey::generate(&mut w.rng);
    let cert =
        relay_core::client::draft::certificate(NET, &alice.key, &reader, &["sync"], w.clock(a))
            .sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", cert);
    w.call(a, &World::session(&alice, 0), "device.register", &p)
        .result
        .unwrap();
    let mut alice2 = Account {
        key: alice.key.clone(),
        devices: vec![reader],
        certs: vec![],
        sessions: vec![],
        home: a,
        route_revision: 1,
    };
    let tok = w.open_session(&alice2, 0).unwrap();
    alice2.sessions.push(tok);
    let m2 = w.message(&alice2, 0, &bob, "x", &Msg::default());
    assert_eq!(code_of(&w.send(&alice2, 0, &m2)), "permission_denied");
    // Envelope signed by another key.
    let mut forged = m.clone();
    let mut env = forged.get("envelope").unwrap().as_object().unwrap().clone();
    env.insert("created_at", T0 + 1);
    forged.insert("envelope", env);
    assert_eq!(code_of(&w.send(&alice, 0, &forged)), "invalid_signature");
    // Malformed envelope.
    let mut bad = m.clone();
    bad.insert("envelope", "text");
    assert_eq!(code_of(&w.send(&alice, 0, &bad)), "invalid_params");
    // created_at in the future / too old.
    let future = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            created_offset: 300_001,
            ..Msg::default()
        },
    );
    assert_eq!(code_of(&w.send(&alice, 0, &future)), "clock_skew");
    let old = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            created_offset: -604_800_001,
            ..Msg::default()
        },
    );
    assert_eq!(code_of(&w.send(&alice, 0, &old)), "message_expired");
    // A grant not from the recipient.
    let grant = w.grant(&carol, &alice);
    let g = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            authorization: Some(grant),
            ..Msg::default()
        },
    );
    assert_eq!(code_of(&w.send(&alice, 0, &g)), "authorization_invalid");
    // No route known for the recipient.
    let mut w3 = World::new(1);
    let x = w3.relay("x");
    let y = w3.relay("y");
    let u = w3.account(x, 1, true);
    let v = w3.account(y, 1, true);
    let m = w3.message(&u, 0, &v, "x", &Msg::default());
    assert_eq!(code_of(&w3.send(&u, 0, &m)), "not_found");
    // With the recipient's route given by the client it is accepted.
    let m = w3.message(
        &u,
        0,
        &v,
        "x",
        &Msg {
            recipient_route: Some(w3.route_of(&v)),
            ..Msg::default()
        },
    );
    assert_eq!(status_of(&w3.send(&u, 0, &m).result.unwrap()), "delivering");
    assert!(
        w.outbox.is_empty() && w.nodes[a].notifications.is_empty(),
        "nothing was accepted at a"
    );
}

#[test]
fn message_send_at_a_relay_that_is_not_the_senders_home_is_not_home_relay() {
    let Two {
        mut w,
        a,
        b,
        mut alice,
        bob,
    } = two();
    let s = alice.sessions[0].clone();
    w.migrate(&mut alice, b);
    w.publish_route(a, &alice);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let r = w.call(a, &Caller::Session(s), "message.send", &m);
    assert_eq!(code_of(&r), "not_home_relay");
}
