//! Seed "Receiving Validation Rules" 1 to 5, in order, through message.deliver; a rejection appends nothing.

use relay_core::client::{draft, random_id, seal, DeviceKey};
use relay_core::engine::Caller;
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

const SRC: &str = "http://source.test";

struct Dest {
    w: World,
    d: usize,
    alice: Account,
    bob: Account,
}

/// alice's home is relay s; bob (2 devices) lives at d; we play the source relay by hand.
fn dest(bob_discoverable: bool) -> Dest {
    let mut w = World::new(21);
    let s = w.relay("source");
    let d = w.relay("dest");
    let alice = w.account(s, 1, true);
    let bob = w.account(d, 2, bob_discoverable);
    Dest { w, d, alice, bob }
}

fn params(x: &mut Dest, m: &Msg) -> Object {
    let send = x.w.message(&x.alice, 0, &x.bob, "hi", m);
    World::deliver_params(&x.alice, 0, &send)
}

fn assert_rejected(x: &mut Dest, p: &Object, code: &str) {
    let before = x.w.nodes[x.d].notifications.len();
    let r = x.w.deliver(x.d, SRC, p);
    assert_eq!(code_of(&r), code, "{:?}", r.result);
    assert_eq!(x.w.record_count(x.d, &x.bob), 0, "no received record");
    assert_eq!(
        x.w.nodes[x.d].notifications.len(),
        before,
        "no notification"
    );
}

fn set_env(p: &mut Object, key: &str, v: Value, signer: &DeviceKey) {
    let mut env = p.get("envelope").unwrap().as_object().unwrap().clone();
    env.insert(key, v);
    env.remove("sig");
    let d = env
        .iter()
        .fold(draft::Draft::new("message_envelope"), |d, (k, v)| {
            d.set(k, v.clone())
        });
    p.insert("envelope", d.sign(signer));
}

#[test]
fn message_deliver_needs_relay_authentication() {
    let mut x = dest(true);
    let p = params(&mut x, &Msg::default());
    let r = x.w.call(x.d, &Caller::Anonymous, "message.deliver", &p);
    assert_eq!(code_of(&r), "unauthenticated");
    let r =
        x.w.call(x.d, &World::session(&x.bob, 0), "message.deliver", &p);
    assert_eq!(code_of(&r), "unauthenticated");
}

#[test]
fn valid_delivery_is_accepted_and_appended_for_authorized_devices() {
    let mut x = dest(true);
    let p = params(&mut x, &Msg::default());
    let r = x.w.deliver(x.d, SRC, &p).result.unwrap();
    assert_eq!(status_of(&r), "target_accepted");
    assert_eq!(x.w.record_count(x.d, &x.bob), 1);
    assert_eq!(x.w.nodes[x.d].notifications.last(), Some(&(x.bob.id(), 1)));
}

#[test]
fn rule_1_destination_must_be_the_home_designated_by_the_current_route() {
    let mut x = dest(true);
    let p = params(&mut x, &Msg::default());
    // A relay that never served bob: not_home_relay, and no route to offer.
    let other = x.w.relay("other");
    let r = x.w.deliver(other, SRC, &p);
    assert_eq!(code_of(&r), "not_home_relay");
    // After bob moves away (route revision 2 published at d), d refuses and points at the new route.
    let mut bob = std::mem::replace(&mut x.bob, x.w.account(other, 1, true));
    x.w.migrate(&mut bob, other);
    x.w.publish_route(x.d, &bob);
    x.bob = bob;
    let r = x.w.deliver(x.d, SRC, &p);
    assert_eq!(code_of(&r), "not_home_relay");
    let data = r.result.unwrap_err().data.expect("data.route");
    let route = field(&data, "route").unwrap();
    assert_eq!(
        field(route, "revision").and_then(Value::as_protocol_int),
        Some(2)
    );
    assert_eq!(
        field(route, "relay").and_then(Value::as_str),
        Some("http://other.test")
    );
}

#[test]
fn rule_2_object_constraints_certificate_and_envelope_signature() {
    let mut x = dest(true);
    // Box list constraints.
    let mut p = params(&mut x, &Msg::default());
    p.insert("recipient_boxes", Value::Array(vec![]));
    assert_rejected(&mut x, &p, "invalid_params");
    // The sending device certificate signed by someone else.
    let mut p = params(&mut x, &Msg::default());
    let now = x.w.clock(0);
    let forged =
        draft::certificate(NET, &x.alice.key, &x.alice.devices[0], &["send"], now).sign(&x.bob.key);
    p.insert("device_certificate", forged);
    assert_rejected(&mut x, &p, "invalid_signature");
    // Identity binding: device_id not derived from device_key.
    let mut p = params(&mut x, &Msg::default());
    let other = DeviceKey::generate(&mut x.w.rng);
    let unbound = draft::certificate(NET, &x.alice.key, &x.alice.devices[0], &["send"], now)
        .set("device_id", other.id().as_str())
        .sign(&x.alice.key);
    p.insert("device_certificate", unbound);
    assert_rejected(&mut x, &p, "invalid_certificate");
    // The certificate does not match from_device_id.
    let mut p = params(&mut x, &Msg::default());
    let other_cert =
        draft::certificate(NET, &x.alice.key, &other, &["send"], now).sign(&x.alice.key);
    p.insert("device_certificate", other_cert);
    assert_rejected(&mut x, &p, "invalid_certificate");
    // The envelope's device signature is invalid.
    let mut p = params(&mut x, &Msg::default());
    let alice_dev = x.alice.devices[0].clone();
    set_env(&mut p, "x", Value::from(1u64), &alice_dev);
    let mut env = p.get("envelope").unwrap().as_object().unwrap().clone();
    env.insert("x", 2u64);
    p.insert("envelope", env);
    assert_rejected(&mut x, &p, "invalid_signature");
    // The certificate was not valid at created_at.
    let mut p = params(&mut x, &Msg::default());
    let late = draft::certificate(
        NET,
        &x.alice.key,
        &x.alice.devices[0],
        &["send"],
        now + 400_000,
    )
    .sign(&x.alice.key);
    p.insert("device_certificate", late);
    assert_rejected(&mut x, &p, "invalid_certificate");
}

#[test]
fn rule_2_a_certificate_expired_now_but_valid_at_created_at_is_accepted() {
    let mut x = dest(true);
    let now = x.w.clock(0);
    let cert = draft::certificate(
        NET,
        &x.alice.key,
        &x.alice.devices[0],
        &["send"],
        now - 10_000,
    )
    .set("expires_at", now + 1_000)
    .sign(&x.alice.key);
    let mut p = params(&mut x, &Msg::default());
    p.insert("device_certificate", cert);
    x.w.now += 60_000; // a retry after the certificate expired
    let r = x.w.deliver(x.d, SRC, &p);
    assert_eq!(status_of(&r.result.unwrap()), "target_accepted");
}

#[test]
fn rule_3_destination_applies_its_own_clock_tolerance_and_age_limit() {
    let mut w = World::new(22);
    let _s = w.relay("source");
    let d = w.relay_with("dest", |c| c.policies.message_delivery_age_limit = 60_000);
    let alice = w.account(0, 1, true);
    let bob = w.account(d, 1, true);
    let mut x = Dest { w, d, alice, bob };
    // Future beyond tolerance.
    let p = params(
        &mut x,
        &Msg {
            created_offset: 300_001,
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &p, "clock_skew");
    // Older than this destination's (shorter) age limit, though the source's is 7 days.
    let p = params(
        &mut x,
        &Msg {
            created_offset: -60_001,
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &p, "message_expired");
    let p = params(
        &mut x,
        &Msg {
            created_offset: -59_000,
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &p).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn rule_4_contact_grant_from_recipient_to_sender_authorizes() {
    let mut x = dest(false);
    let grant = x.w.grant(&x.bob, &x.alice);
    let p = params(
        &mut x,
        &Msg {
            authorization: Some(grant),
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &p).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn rule_4_without_credentials_the_recipient_must_allow_public_discovery() {
    let mut x = dest(false);
    let p = params(&mut x, &Msg::default());
    assert_rejected(&mut x, &p, "discovery_disabled");
    // After the recipient allows discovery, the same request is accepted.
    x.w.call(x.d, &World::session(&x.bob, 0), "account.update", &{
        let mut o = Object::new();
        o.insert("discoverable", true);
        o
    })
    .result
    .unwrap();
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &p).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn rule_4_invalid_credentials_must_not_fall_back_to_public_bootstrapping() {
    let mut x = dest(true);
    // A grant by the sender itself (not the recipient), to a discoverable recipient.
    let bad = x.w.grant(&x.alice, &x.alice);
    let p = params(
        &mut x,
        &Msg {
            authorization: Some(bad),
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &p, "authorization_invalid");
    // A tampered grant.
    let mut g = x.w.grant(&x.bob, &x.alice);
    g.insert("issued_at", 1u64);
    let p = params(
        &mut x,
        &Msg {
            authorization: Some(g),
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &p, "authorization_invalid");
}

#[test]
fn rule_4_revoked_expired_and_used_up_authorizations_are_invalid() {
    let mut x = dest(false);
    let now = x.w.clock(x.d);
    // Revoked grant.
    let grant = x.w.grant(&x.bob, &x.alice);
    let gid = grant
        .get("grant_id")
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    let mut p = Object::new();
    p.insert("grant_id", gid);
    x.w.call(x.d, &World::session(&x.bob, 0), "contact.revoke", &p)
        .result
        .unwrap();
    let dp = params(
        &mut x,
        &Msg {
            authorization: Some(grant),
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &dp, "authorization_invalid");
    // Expired invite.
    let iid = random_id(&mut x.w.rng);
    let inv = draft::invite(NET, &iid, &x.bob.key.id(), now - 10, now - 1).sign(&x.bob.key);
    let dp = params(
        &mut x,
        &Msg {
            authorization: Some(inv),
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &dp, "authorization_invalid");
    // An invite with max_uses 1: the first sender account uses it (again and again), a second is refused.
    let iid = random_id(&mut x.w.rng);
    let inv = draft::invite(NET, &iid, &x.bob.key.id(), now, now + 3_600_000)
        .set("max_uses", 1u64)
        .sign(&x.bob.key);
    let dp = params(
        &mut x,
        &Msg {
            authorization: Some(inv.clone()),
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &dp).result.unwrap()),
        "target_accepted"
    );
    let dp = params(
        &mut x,
        &Msg {
            authorization: Some(inv.clone()),
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &dp).result.unwrap()),
        "target_accepted",
        "same sender again"
    );
    let carol = x.w.account(0, 1, true);
    let send = x.w.message(
        &carol,
        0,
        &x.bob,
        "c",
        &Msg {
            authorization: Some(inv),
            ..Msg::default()
        },
    );
    let dp = World::deliver_params(&carol, 0, &send);
    let r = x.w.deliver(x.d, SRC, &dp);
    assert_eq!(code_of(&r), "authorization_invalid");
}

#[test]
fn rule_5_at_least_one_boxed_device_must_be_valid_and_unavailable_devices_cannot_read() {
    let mut x = dest(true);
    // Only a stranger's box: device_unknown.
    let mut p = params(&mut x, &Msg::default());
    let stranger = DeviceKey::generate(&mut x.w.rng);
    let kb = seal::seal_key_box(&mut x.w.rng, &stranger.id(), &stranger.box_key(), &[7; 32]);
    p.insert(
        "recipient_boxes",
        Value::Array(vec![Value::Object(kb.clone())]),
    );
    assert_rejected(&mut x, &p, "device_unknown");
    // Revoke bob's device 1, then deliver boxes for device 0, device 1 and the stranger: accepted.
    let rev = draft::revocation(NET, &x.bob.key.id(), &x.bob.devices[1].id(), x.w.clock(x.d))
        .sign(&x.bob.key);
    x.w.call(x.d, &World::session(&x.bob, 0), "device.revoke", &rev)
        .result
        .unwrap();
    let mut p = params(&mut x, &Msg::default());
    let mut boxes = match p.get("recipient_boxes") {
        Some(Value::Array(a)) => a.clone(),
        _ => unreachable!(),
    };
    boxes.push(Value::Object(kb));
    p.insert("recipient_boxes", Value::Array(boxes));
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &p).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(x.w.sync_all(&x.bob, 0).len(), 1);
    // Boxes need not cover all current devices: a box for device 0 only is enough.
    let p = params(
        &mut x,
        &Msg {
            to_devices: Some(vec![0]),
            ..Msg::default()
        },
    );
    assert_eq!(
        status_of(&x.w.deliver(x.d, SRC, &p).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn receiving_rules_are_checked_in_order() {
    // A request failing rule 3 (clock_skew) and rule 4 (no credentials, not discoverable) reports rule 3.
    let mut x = dest(false);
    let p = params(
        &mut x,
        &Msg {
            created_offset: 400_000,
            ..Msg::default()
        },
    );
    assert_rejected(&mut x, &p, "clock_skew");
    // Failing rule 2 (box constraints) and rule 4: rule 2.
    let mut p = params(&mut x, &Msg::default());
    p.insert("recipient_boxes", Value::Array(vec![]));
    assert_rejected(&mut x, &p, "invalid_params");
    // Failing rule 4 and rule 5: rule 4.
    let mut p = params(&mut x, &Msg::default());
    let stranger = DeviceKey::generate(&mut x.w.rng);
    let kb = seal::seal_key_box(&mut x.w.rng, &stranger.id(), &stranger.box_key(), &[7; 32]);
    p.insert("recipient_boxes", Value::Array(vec![Value::Object(kb)]));
    assert_rejected(&mut x, &p, "discovery_disabled");
}
