//! Sessions, accounts, device state and routes (protocol.md §3-4), and atomic operations.

use relay_core::client::{draft, random_id, DeviceKey};
use relay_core::engine::{Caller, Config, Effect, Engine, MemoryStore, Storage, StorageError};
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

fn so(acct: &Account, dev: usize, ts: u64, nonce: &str, relay: &str) -> Object {
    draft::session_open(
        NET,
        relay,
        &acct.key.id(),
        &acct.devices[dev].id(),
        ts,
        nonce,
    )
    .sign(&acct.devices[dev])
}

#[test]
fn session_open_checks_relay_time_nonce_and_device() {
    let mut w = World::new(81);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let now = w.clock(a);
    let nonce = random_id(&mut w.rng);
    let p = so(&alice, 0, now, &nonce, "http://a.test");
    let r = w
        .call(a, &Caller::Anonymous, "session.open", &p)
        .result
        .unwrap();
    assert_eq!(
        field(&r, "expires_at").and_then(Value::as_protocol_int),
        Some(now + 86_400_000)
    );
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "unauthenticated",
        "nonce accepted once"
    );
    let p = so(&alice, 0, now, &random_id(&mut w.rng), "http://b.test");
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "unauthenticated",
        "another relay"
    );
    let p = so(
        &alice,
        0,
        now + 300_001,
        &random_id(&mut w.rng),
        "http://a.test",
    );
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "clock_skew"
    );
    let p = so(
        &alice,
        0,
        now - 300_001,
        &random_id(&mut w.rng),
        "http://a.test",
    );
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "unauthenticated"
    );
    let stranger = DeviceKey::generate(&mut w.rng);
    let p = draft::session_open(
        NET,
        "http://a.test",
        &alice.key.id(),
        &stranger.id(),
        now,
        &random_id(&mut w.rng),
    )
    .sign(&stranger);
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "unauthenticated",
        "unregistered device"
    );
    let mut p = so(&alice, 0, now, &random_id(&mut w.rng), "http://a.test");
    p.insert("ts", now + 1);
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "invalid_signature"
    );
}

#[test]
fn seen_nonces_and_sessions_survive_restarts() {
    let mut w = World::new(82);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let now = w.clock(a);
    let nonce = random_id(&mut w.rng);
    let p = so(&alice, 0, now, &nonce, "http://a.test");
    let r = w
        .call(a, &Caller::Anonymous, "session.open", &p)
        .result
        .unwrap();
    let token = field(&r, "session")
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    w.nodes[a].restart(3);
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "session.open", &p)),
        "unauthenticated"
    );
    let mut q = Object::new();
    q.insert("after", 0u64);
    assert_eq!(
        code_of(&w.call(a, &Caller::Session(token), "message.timeline.sync", &q)),
        "ok"
    );
}

#[test]
fn a_session_expires_at_the_earlier_of_ttl_and_certificate_expiry() {
    let mut w = World::new(83);
    let a = w.relay("a");
    let mut alice = w.account(a, 1, true);
    let d = DeviceKey::generate(&mut w.rng);
    let now = w.clock(a);
    let cert = draft::certificate(NET, &alice.key, &d, &["sync"], now)
        .set("expires_at", now + 5_000)
        .sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", cert.clone());
    w.call(a, &World::session(&alice, 0), "device.register", &p)
        .result
        .unwrap();
    alice.devices.push(d);
    alice.certs.push(cert);
    let tok = w.open_session(&alice, 1).unwrap();
    let mut q = Object::new();
    q.insert("after", 0u64);
    assert_eq!(
        code_of(&w.call(
            a,
            &Caller::Session(tok.clone()),
            "message.timeline.sync",
            &q
        )),
        "ok"
    );
    w.now += 5_000;
    assert_eq!(
        code_of(&w.call(a, &Caller::Session(tok), "message.timeline.sync", &q)),
        "unauthenticated"
    );
}

#[test]
fn device_revoke_ends_sessions_and_the_device_id_is_refused_for_good() {
    let mut w = World::new(84);
    let a = w.relay("a");
    let alice = w.account(a, 2, true);
    let rev = draft::revocation(NET, &alice.key.id(), &alice.devices[1].id(), w.clock(a))
        .sign(&alice.key);
    let r = w.call(a, &World::session(&alice, 0), "device.revoke", &rev);
    assert!(r.effects.contains(&Effect::EndDeviceSessions {
        account: alice.id(),
        device_id: alice.devices[1].id().as_str().to_string()
    }));
    let mut q = Object::new();
    q.insert("after", 0u64);
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 1), "message.timeline.sync", &q)),
        "unauthenticated"
    );
    let newer = draft::certificate(
        NET,
        &alice.key,
        &alice.devices[1],
        &["sync"],
        w.clock(a) + 1,
    )
    .sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", newer);
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.register", &p)),
        "invalid_certificate"
    );
    let mut p = Object::new();
    p.insert("account", alice.id());
    let list = w
        .call(a, &World::session(&alice, 0), "device.list", &p)
        .result
        .unwrap();
    assert_eq!(
        field(&list, "devices").and_then(array).map(|d| d.len()),
        Some(1)
    );
    assert_eq!(
        field(&list, "revoked").and_then(array),
        Some(vec![Value::from(alice.devices[1].id().as_str())])
    );
    // A revocation signed by a device key is not the account's.
    let forged = draft::revocation(NET, &alice.key.id(), &alice.devices[0].id(), w.clock(a))
        .sign(&alice.devices[0]);
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.revoke", &forged)),
        "invalid_signature"
    );
}

#[test]
fn device_register_replaces_only_with_a_later_issued_at_and_respects_max_devices() {
    let mut w = World::new(85);
    let a = w.relay_with("a", |c| c.policies.max_devices = 2);
    let alice = w.account(a, 2, true);
    let older = draft::certificate(
        NET,
        &alice.key,
        &alice.devices[1],
        &["sync"],
        w.clock(a) - 10,
    )
    .sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", older);
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.register", &p)),
        "state_conflict"
    );
    let newer = draft::certificate(
        NET,
        &alice.key,
        &alice.devices[1],
        &["sync"],
        w.clock(a) + 10,
    )
    .sign(&alice.key);
    p.insert("certificate", newer);
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.register", &p)),
        "ok"
    );
    let third = DeviceKey::generate(&mut w.rng);
    p.insert(
        "certificate",
        draft::certificate(NET, &alice.key, &third, &["sync"], w.clock(a)).sign(&alice.key),
    );
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.register", &p)),
        "payload_too_large"
    );
    // Another account's certificate, and a device without manage.
    let bob = w.account(a, 1, true);
    p.insert("certificate", bob.certs[0].clone());
    assert_eq!(
        code_of(&w.call(a, &World::session(&alice, 0), "device.register", &p)),
        "permission_denied"
    );
}

#[test]
fn account_register_needs_a_route_to_this_relay_and_a_manage_certificate() {
    let mut w = World::new(86);
    let a = w.relay("a");
    let key = relay_core::client::AccountKey::generate(&mut w.rng);
    let d = DeviceKey::generate(&mut w.rng);
    let now = w.clock(a);
    let cert = draft::certificate(NET, &key, &d, &["send", "manage"], now).sign(&key);
    let reg = |route: Object, cert: Object| {
        let mut p = Object::new();
        p.insert("route", route);
        p.insert("certificate", cert);
        p
    };
    let elsewhere = draft::route(NET, &key.id(), "http://b.test", 1, now).sign(&key);
    assert_eq!(
        code_of(&w.call(
            a,
            &Caller::Anonymous,
            "account.register",
            &reg(elsewhere, cert.clone())
        )),
        "invalid_params"
    );
    let route = draft::route(NET, &key.id(), "http://a.test", 1, now).sign(&key);
    let no_manage = draft::certificate(NET, &key, &d, &["send"], now).sign(&key);
    assert_eq!(
        code_of(&w.call(
            a,
            &Caller::Anonymous,
            "account.register",
            &reg(route.clone(), no_manage)
        )),
        "permission_denied"
    );
    let r = w
        .call(
            a,
            &Caller::Anonymous,
            "account.register",
            &reg(route.clone(), cert.clone()),
        )
        .result
        .unwrap();
    assert_eq!(
        field(&r, "route_revision").and_then(Value::as_protocol_int),
        Some(1)
    );
    // Registering again with the same objects is idempotent.
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "account.register", &reg(route, cert))),
        "ok"
    );
}

#[test]
fn routes_are_replaced_only_by_a_higher_revision_and_a_same_revision_conflict_changes_nothing() {
    let mut w = World::new(87);
    let a = w.relay("a");
    let key = relay_core::client::AccountKey::generate(&mut w.rng);
    let publish = |w: &mut World, r: Object| {
        let mut p = Object::new();
        p.insert("route", r);
        w.call(a, &Caller::Anonymous, "route.publish", &p)
    };
    let r1 = draft::route(NET, &key.id(), "http://x.test", 1, T0).sign(&key);
    let r2 = draft::route(NET, &key.id(), "http://y.test", 2, T0).sign(&key);
    let r2b = draft::route(NET, &key.id(), "http://z.test", 2, T0).sign(&key);
    assert_eq!(code_of(&publish(&mut w, r2.clone())), "ok");
    let older = publish(&mut w, r1).result.unwrap();
    assert_eq!(
        field(&older, "revision").and_then(Value::as_protocol_int),
        Some(2),
        "the held revision"
    );
    assert_eq!(code_of(&publish(&mut w, r2b)), "state_conflict");
    let mut p = Object::new();
    p.insert("account", key.id().as_str());
    let got = w
        .call(a, &Caller::Anonymous, "route.get", &p)
        .result
        .unwrap();
    assert_eq!(field(&got, "route"), Some(&Value::Object(r2)));
    let forged = draft::route(NET, &key.id(), "http://q.test", 3, T0)
        .sign(&relay_core::client::AccountKey::generate(&mut w.rng));
    assert_eq!(code_of(&publish(&mut w, forged)), "invalid_signature");
    let mut p = Object::new();
    p.insert(
        "account",
        relay_core::client::AccountKey::generate(&mut w.rng)
            .id()
            .as_str(),
    );
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "route.get", &p)),
        "not_found"
    );
}

#[test]
fn oversize_and_malformed_params_are_refused_before_anything_else() {
    let mut w = World::new(88);
    let a = w.relay_with("a", |c| c.policies.max_request_bytes = 64);
    let big = vec![b' '; 65];
    assert_eq!(
        code_of(&w.call_raw(a, &Caller::Anonymous, "message.send", &big)),
        "payload_too_large"
    );
    for bad in [&b"{"[..], b"[]", b"{\"a\":1,\"a\":1}", b"\xff"] {
        assert_eq!(
            code_of(&w.call_raw(a, &Caller::Anonymous, "message.send", bad)),
            "invalid_params"
        );
    }
    assert_eq!(
        code_of(&w.call_raw(a, &Caller::Anonymous, "no.such.method", b"{}")),
        "not_found"
    );
}

/// A store whose commits fail on demand.
struct Flaky {
    inner: MemoryStore,
    fail: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Storage for Flaky {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.get(key)
    }
    fn scan(
        &mut self,
        s: &[u8],
        e: &[u8],
        l: usize,
    ) -> Result<Vec<relay_core::engine::storage::Entry>, StorageError> {
        self.inner.scan(s, e, l)
    }
    fn commit(
        &mut self,
        batch: Vec<relay_core::engine::storage::Write>,
    ) -> Result<(), StorageError> {
        if self.fail.get() {
            return Err(StorageError("disk full".into()));
        }
        self.inner.commit(batch)
    }
}

#[test]
fn an_operation_commits_all_of_its_writes_or_none_and_says_internal() {
    let mut w = World::new(89);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let bob = w.account(a, 1, true);
    let fail = std::rc::Rc::new(std::cell::Cell::new(true));
    let store = w.nodes[a].store.clone();
    let before = store.snapshot();
    let mut eng = Engine::new(
        Config::new(RelayId::parse("http://a.test").unwrap(), NET),
        Flaky {
            inner: store.clone(),
            fail: fail.clone(),
        },
        |b: &mut [u8]| b.fill(9),
    );
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
    let params = relay_core::wire::canonical::object_to_vec(&m);
    let r = eng.call(
        &World::session(&alice, 0),
        "message.send",
        &params,
        w.clock(a),
    );
    assert_eq!(r.result.as_ref().unwrap_err().code.as_str(), "internal");
    assert!(
        r.effects.is_empty(),
        "no effect escapes an uncommitted operation"
    );
    assert_eq!(store.snapshot(), before, "nothing half-written");
    fail.set(false);
    let r = eng.call(
        &World::session(&alice, 0),
        "message.send",
        &params,
        w.clock(a),
    );
    assert_eq!(status_of(&r.result.unwrap()), "target_accepted");
}
