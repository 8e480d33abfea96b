//! Account message timeline (protocol.md §4): sequences, visibility fixed at acceptance, own key box, paging, expiry.

use relay_core::client::draft;
use relay_core::engine::{Caller, Effect};
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

fn seqs(entries: &[Object]) -> Vec<u64> {
    entries
        .iter()
        .map(|e| e.get("seq").and_then(Value::as_protocol_int).unwrap())
        .collect()
}

#[test]
fn sequences_start_at_1_per_account_and_strictly_increase_with_a_notification_per_append() {
    let mut w = World::new(71);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 1, true);
    let mut notes = Vec::new();
    for i in 0..5 {
        let m = w.message(
            &alice,
            0,
            &bob,
            &format!("m{i}"),
            &Msg {
                sender_boxes: true,
                ..Msg::default()
            },
        );
        let r = w.send(&alice, 0, &m);
        notes.extend(r.effects.into_iter().filter_map(|e| match e {
            Effect::Notify {
                account,
                latest_seq,
            } => Some((account, latest_seq)),
            _ => None,
        }));
    }
    assert_eq!(seqs(&w.sync_all(&bob, 0)), vec![1, 2, 3, 4, 5]);
    assert_eq!(seqs(&w.sync_all(&alice, 0)), vec![1, 2, 3, 4, 5]);
    let bob_notes: Vec<u64> = notes
        .iter()
        .filter(|(acc, _)| *acc == bob.id())
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(bob_notes, vec![1, 2, 3, 4, 5]);
}

#[test]
fn sync_returns_only_the_calling_devices_own_key_box_and_the_sending_certificate() {
    let mut w = World::new(72);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 3, true);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    for d in 0..3 {
        let e = w.sync_all(&bob, d);
        let kb = e[0].get("key_box").unwrap();
        assert_eq!(
            field(kb, "device_id").and_then(Value::as_str),
            Some(bob.devices[d].id().as_str())
        );
        let key = relay_core::client::seal::open_key_box(kb.as_object().unwrap(), &bob.devices[d])
            .expect("opens");
        let body = field(e[0].get("envelope").unwrap(), "body")
            .unwrap()
            .as_object()
            .unwrap();
        assert_eq!(
            relay_core::client::seal::open_body(body, &key).as_deref(),
            Some(&b"x"[..])
        );
        assert_eq!(
            e[0].get("device_certificate"),
            Some(&Value::Object(alice.certs[0].clone()))
        );
    }
}

#[test]
fn a_sync_answer_is_canonical_json_with_each_signed_object_as_it_was_accepted() {
    let mut w = World::new(76);
    let a = w.relay("a");
    let b = w.relay("b");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 2, true);
    let carol = w.account(b, 1, true);
    w.publish_route(b, &bob);
    let local = w.message(&alice, 0, &bob, "local", &Msg::default());
    w.send(&alice, 0, &local).result.unwrap();
    let remote = w.message(&carol, 0, &bob, "remote", &Msg::default());
    w.send(&carol, 0, &remote).result.unwrap();
    w.pump();
    let mut q = Object::new();
    q.insert("after", 0u64);
    let r = w.call(a, &World::session(&bob, 1), "message.timeline.sync", &q);
    let body = r.body();
    let page = parse(&body);
    // The stored texts go out verbatim; the whole answer is still RFC 8785 canonical.
    assert_eq!(relay_core::wire::canonical::to_vec(&page), body);
    let entries = field(&page, "entries").and_then(array).unwrap();
    assert_eq!(entries.len(), 2);
    for (e, (sent, sender)) in entries.iter().zip([(&local, &alice), (&remote, &carol)]) {
        assert_eq!(field(e, "envelope"), sent.get("envelope"));
        assert_eq!(
            field(e, "device_certificate"),
            Some(&Value::Object(sender.certs[0].clone()))
        );
        assert_eq!(
            field(e, "key_box")
                .and_then(|k| field(k, "device_id"))
                .and_then(Value::as_str),
            Some(bob.devices[1].id().as_str())
        );
    }
    // The result value compares equal to the parsed answer, verbatim texts included.
    assert_eq!(r.result.unwrap(), page);
}

#[test]
fn visibility_is_fixed_at_acceptance_and_never_recomputed() {
    let mut w = World::new(73);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let mut bob = w.account(a, 1, true);
    // bob's second device has a certificate that is not yet valid when the message is accepted.
    let tablet = relay_core::client::DeviceKey::generate(&mut w.rng);
    let now = w.clock(a);
    let cert = draft::certificate(NET, &bob.key, &tablet, &["sync"], now)
        .set("expires_at", now + 10)
        .sign(&bob.key);
    let mut p = Object::new();
    p.insert("certificate", cert.clone());
    w.call(a, &World::session(&bob, 0), "device.register", &p)
        .result
        .unwrap();
    bob.devices.push(tablet.clone());
    bob.certs.push(cert);
    bob.sessions.push(String::new());
    w.now += 20; // the tablet's certificate has expired
    let m = w.message(&alice, 0, &bob, "while expired", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    // A renewed certificate for the tablet, then a session.
    let renewed = draft::certificate(NET, &bob.key, &tablet, &["sync"], w.clock(a)).sign(&bob.key);
    let mut p = Object::new();
    p.insert("certificate", renewed);
    w.call(a, &World::session(&bob, 0), "device.register", &p)
        .result
        .unwrap();
    bob.sessions[1] = w.open_session(&bob, 1).unwrap();
    let m2 = w.message(&alice, 0, &bob, "after renewal", &Msg::default());
    w.send(&alice, 0, &m2).result.unwrap();
    let tablet_view: Vec<String> = w.sync_all(&bob, 1).iter().map(entry_text).collect();
    assert_eq!(
        tablet_view,
        vec!["after renewal"],
        "not valid at acceptance: never visible"
    );
    assert_eq!(w.sync_all(&bob, 0).len(), 2);
}

#[test]
fn paging_by_cursor_with_limit_next_and_has_more() {
    let mut w = World::new(74);
    let a = w.relay_with("a", |c| c.policies.send_rate = 0);
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 2, true);
    for i in 0..30 {
        // Only every third message is boxed for device 1.
        let to = if i % 3 == 0 { None } else { Some(vec![0]) };
        let m = w.message(
            &alice,
            0,
            &bob,
            &format!("m{i}"),
            &Msg {
                to_devices: to,
                ..Msg::default()
            },
        );
        w.send(&alice, 0, &m).result.unwrap();
    }
    let p = w.sync(&bob, 0, 0, Some(7)).unwrap();
    assert_eq!(
        seqs(
            &p.get("entries")
                .and_then(array)
                .unwrap()
                .iter()
                .map(|e| e.as_object().unwrap().clone())
                .collect::<Vec<_>>()
        ),
        (1..=7).collect::<Vec<_>>()
    );
    assert_eq!(p.get("next").and_then(Value::as_protocol_int), Some(7));
    assert_eq!(p.get("has_more"), Some(&Value::Bool(true)));
    // Device 1 with limit 1: the relay scans at most 10 records per call.
    let p = w.sync(&bob, 1, 1, Some(1)).unwrap();
    assert_eq!(p.get("entries").and_then(array).map(|e| e.len()), Some(1));
    assert_eq!(p.get("next").and_then(Value::as_protocol_int), Some(4));
    assert_eq!(w.sync_all(&bob, 1).len(), 10);
    // Past the end: empty, next = after, no more.
    let p = w.sync(&bob, 0, 30, None).unwrap();
    assert_eq!(p.get("entries").and_then(array).map(|e| e.len()), Some(0));
    assert_eq!(p.get("next").and_then(Value::as_protocol_int), Some(30));
    assert_eq!(p.get("has_more"), Some(&Value::Bool(false)));
    // An empty page with has_more is legal: 10 records scanned, none for this device.
    let stranger_only: Vec<_> = (0..12).map(|_| ()).collect();
    for _ in stranger_only {
        let m = w.message(
            &alice,
            0,
            &bob,
            "dev0 only",
            &Msg {
                to_devices: Some(vec![0]),
                ..Msg::default()
            },
        );
        w.send(&alice, 0, &m).result.unwrap();
    }
    let p = w.sync(&bob, 1, 30, Some(1)).unwrap();
    assert_eq!(p.get("entries").and_then(array).map(|e| e.len()), Some(0));
    assert_eq!(p.get("next").and_then(Value::as_protocol_int), Some(40));
    assert_eq!(p.get("has_more"), Some(&Value::Bool(true)));
    for (after, limit) in [(0, 0), (0, 501)] {
        assert_eq!(
            code_of(
                &w.call(a, &World::session(&bob, 0), "message.timeline.sync", &{
                    let mut o = Object::new();
                    o.insert("after", after as u64);
                    o.insert("limit", limit as u64);
                    o
                })
            ),
            "invalid_params"
        );
    }
}

#[test]
fn body_expiry_hides_entries_and_retention_expiry_collects_records_on_tick() {
    let mut w = World::new(75);
    let a = w.relay_with("a", |c| c.policies.message_retention = 100_000);
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 1, true);
    let m = w.message(
        &alice,
        0,
        &bob,
        "short-lived",
        &Msg {
            body_expires_at: Some(T0 + 1_000),
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m).result.unwrap();
    let m2 = w.message(&alice, 0, &bob, "kept", &Msg::default());
    w.send(&alice, 0, &m2).result.unwrap();
    assert_eq!(w.sync_all(&bob, 0).len(), 2);
    w.now += 1_000;
    let view: Vec<String> = w.sync_all(&bob, 0).iter().map(entry_text).collect();
    assert_eq!(view, vec!["kept"]);
    assert_eq!(
        w.record_count(a, &bob),
        2,
        "the stored envelope is never altered"
    );
    w.run_for(100_000);
    assert_eq!(w.record_count(a, &bob), 0, "collected after retention");
    assert_eq!(w.sync_all(&bob, 0).len(), 0);
}

#[test]
fn sync_needs_the_sync_permission() {
    let mut w = World::new(76);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let writer = relay_core::client::DeviceKey::generate(&mut w.rng);
    let cert = draft::certificate(NET, &alice.key, &writer, &["send"], w.clock(a)).sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", cert);
    w.call(a, &World::session(&alice, 0), "device.register", &p)
        .result
        .unwrap();
    let acct = Account {
        key: alice.key.clone(),
        devices: vec![writer],
        certs: vec![],
        sessions: vec![],
        home: a,
        route_revision: 1,
    };
    let s = w.open_session(&acct, 0).unwrap();
    let mut p = Object::new();
    p.insert("after", 0u64);
    assert_eq!(
        code_of(&w.call(a, &Caller::Session(s), "message.timeline.sync", &p)),
        "permission_denied"
    );
}
