//! Bounded work per operation, abuse-proof anonymous writes and a backoff that cannot
//! collapse: one test per defect, each of which failed on the engine before it was fixed.

use relay_core::engine::{Caller, Config, Outcome};
use relay_core::wire::json::{self, Object, Value};
use relay_tests::*;
use std::collections::BTreeMap;

/// How many keys differ between two snapshots of a store (what one operation wrote).
fn changed_keys(before: &BTreeMap<Vec<u8>, Vec<u8>>, after: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    let mut n = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .count();
    n += before.keys().filter(|k| !after.contains_key(*k)).count();
    n
}

fn error_code_of_status(v: &Value) -> String {
    field(v, "error")
        .and_then(|e| field(e, "code"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn unlimited(c: &mut Config) {
    c.policies.send_rate = 0;
    c.policies.deliver_rate = 0;
    c.policies.deliver_rate_per_account = 0;
    c.policies.deliver_rate_per_sender = 0;
    c.policies.account_request_rate = 0;
}

#[test]
fn a_stranger_registering_an_accounts_public_objects_again_cannot_switch_its_public_discovery() {
    let mut w = World::new(1901);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    let bob = w.account(a, 1, false);
    // Everything account.register needs is public: the route (route.get) and a manage
    // certificate (device.list).
    let mut p = Object::new();
    p.insert("route", w.route_of(&bob));
    p.insert("certificate", bob.certs[0].clone());
    p.insert("discoverable", true);
    let r = w.call(a, &Caller::Anonymous, "account.register", &p);
    assert_eq!(code_of(&r), "permission_denied");
    // Rule 4: without credentials, a recipient that does not allow discovery refuses.
    let m = w.message(&alice, 0, &bob, "hello", &Msg::default());
    let s = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert_eq!(error_code_of_status(&s), "discovery_disabled");

    // The same objects again, discoverable omitted: accepted, and nothing changes.
    p.remove("discoverable");
    let before = w.nodes[a].store.snapshot();
    w.call(a, &Caller::Anonymous, "account.register", &p)
        .result
        .expect("idempotent re-registration");
    assert_eq!(changed_keys(&before, &w.nodes[a].store.snapshot()), 0);

    // The account's own manage session may change it.
    p.insert("discoverable", true);
    w.call(a, &World::session(&bob, 0), "account.register", &p)
        .result
        .expect("the owner's change");
    let m = w.message(&alice, 0, &bob, "hello again", &Msg::default());
    let s = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
}

#[test]
fn a_message_the_destination_keeps_refusing_backs_off_by_its_own_count_while_others_succeed() {
    let mut w = World::new(1902);
    let a = w.relay_with("a", unlimited);
    let b = w.relay_with("b", unlimited);
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let stuck = w.message(&alice, 0, &bob, "refused", &Msg::default());
    let stuck_id = message_id(&stuck);
    w.send(&alice, 0, &stuck).result.unwrap();
    let mut attempts: Vec<u64> = Vec::new();
    let mut others = 0;
    let end = w.now + 30 * 60_000;
    while w.now < end && attempts.len() < 12 {
        if w.now.is_multiple_of(2_000) {
            let m = w.message(&alice, 0, &bob, "fine", &Msg::default());
            w.send(&alice, 0, &m).result.unwrap();
            others += 1;
        }
        for req in w.take_outbox() {
            if req.task.ends_with(&stuck_id) {
                attempts.push(w.clock(a));
                w.outcome(
                    a,
                    &req.task,
                    req.attempt,
                    Outcome::Error(error_body("unavailable", None)),
                );
            } else {
                w.carry(req);
            }
        }
        w.advance_without_network(500);
    }
    assert!(others > 100, "other messages kept succeeding meanwhile");
    assert!(attempts.len() >= 8, "{attempts:?}");
    for pair in attempts.windows(2) {
        assert!(
            pair[1] - pair[0] >= 1_000,
            "no attempt follows the last sooner than retry_initial: {attempts:?}"
        );
    }
    // Full jitter in windows doubling from 1 s: the later gaps reach minutes.
    let late_gap = attempts
        .windows(2)
        .map(|p| p[1] - p[0])
        .skip(5)
        .max()
        .unwrap();
    assert!(late_gap >= 16_000, "the backoff grew: {attempts:?}");
}

#[test]
fn a_backlog_of_ten_thousand_large_tasks_meets_a_destination_that_comes_back_in_bounded_steps() {
    let mut w = World::new(1903);
    let a = w.relay_with("a", unlimited);
    let b = w.relay_with("b", unlimited);
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let text = "x".repeat(4_096);
    let mut ids = Vec::new();
    for _ in 0..10_000 {
        let m = w.message(&alice, 0, &bob, &text, &Msg::default());
        ids.push(message_id(&m));
        w.send(&alice, 0, &m).result.unwrap();
        // The destination is down: nothing reaches it.
        for req in w.take_outbox() {
            w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
        }
    }
    // An hour of outage: every task fails over and over, and waits on its own backoff.
    let end = w.now + 3_600_000;
    while w.now < end {
        w.advance_without_network(10_000);
        for req in w.take_outbox() {
            w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
        }
    }
    // It calls us: the call brings forward a bounded batch, not the whole backlog.
    let before = w.nodes[a].store.snapshot();
    let mut p = Object::new();
    p.insert("route", w.route_of(&bob));
    let caller = Caller::relay(w.nodes[b].id.clone());
    w.call(a, &caller, "route.publish", &p).result.unwrap();
    let written = changed_keys(&before, &w.nodes[a].store.snapshot());
    let batch = w.nodes[a].config.revive_batch;
    // Each task brought forward costs six writes (its outage entry, its due entry moved,
    // its retry entry moved, its record): a bound of the batch, not of the backlog.
    assert!(
        written <= 6 * batch + 8,
        "route.publish rewrote {written} keys for a batch of {batch}"
    );
    drop(before);
    // And the backlog drains: every message is delivered once, none lost.
    w.run_for(20 * 60_000);
    for id in &ids {
        assert_eq!(
            status_of(&w.status(&alice, id).result.unwrap()),
            "target_accepted"
        );
    }
    assert_eq!(w.record_count(b, &bob), 10_000);
}

#[test]
fn revoking_a_device_with_a_hundred_thousand_sessions_costs_what_revoking_one_does() {
    let mut w = World::new(1904);
    let a = w.relay_with("a", unlimited);
    let bob = w.account(a, 2, true);
    let mut tokens = Vec::new();
    for _ in 0..100_000 {
        tokens.push(w.open_session(&bob, 1).expect("session.open"));
    }
    let revocation =
        relay_core::client::draft::revocation(NET, &bob.key.id(), &bob.devices[1].id(), w.clock(a))
            .sign(&bob.key);
    let before = w.nodes[a].store.snapshot();
    w.call(a, &World::session(&bob, 0), "device.revoke", &revocation)
        .result
        .expect("device.revoke");
    let written = changed_keys(&before, &w.nodes[a].store.snapshot());
    assert!(written <= 2, "revocation wrote {written} keys");
    assert_eq!(w.nodes[a].ended.len(), 1, "the host closes its WebSockets");
    for t in [&tokens[0], &tokens[50_000], &tokens[99_999]] {
        let r = w.call(a, &Caller::Session(t.clone()), "device.list", &{
            let mut p = Object::new();
            p.insert("account", bob.id());
            p
        });
        assert_eq!(code_of(&r), "unauthenticated", "its sessions end at once");
    }
}

#[test]
fn a_sync_page_over_a_large_timeline_stays_within_its_byte_budget_and_reads_a_bounded_amount() {
    let mut w = World::new(1905);
    let a = w.relay_with("a", unlimited);
    let alice = w.account(a, 2, true);
    let text = "y".repeat(60_000);
    // 300 records of about 80 kB for device 0 only; device 1 can read none of them.
    for _ in 0..300 {
        let only_0 = Msg {
            to_devices: Some(vec![0]),
            ..Msg::default()
        };
        let m = w.message(&alice, 0, &alice, &text, &only_0);
        w.send(&alice, 0, &m).result.unwrap();
    }
    let budget = w.nodes[a].config.policies.max_sync_bytes as usize;
    let (mut after, mut seen) = (0, 0);
    loop {
        let mut p = Object::new();
        p.insert("after", after);
        p.insert("limit", 500u64);
        let r = w.call(a, &World::session(&alice, 0), "message.timeline.sync", &p);
        let body = r.body();
        assert!(
            body.len() <= budget + 100_000,
            "page of {} bytes",
            body.len()
        );
        let page = parse(&body);
        let n = field(&page, "entries").and_then(array).unwrap().len();
        assert!(n >= 1 || field(&page, "has_more") == Some(&Value::Bool(false)));
        seen += n;
        after = field(&page, "next")
            .and_then(Value::as_protocol_int)
            .unwrap();
        if field(&page, "has_more") != Some(&Value::Bool(true)) {
            break;
        }
    }
    assert_eq!(seen, 300, "every record, across pages");
    // A device that can read none: each call examines a bounded amount and says has_more.
    let mut p = Object::new();
    p.insert("after", 0u64);
    p.insert("limit", 500u64);
    let r = w.call(a, &World::session(&alice, 1), "message.timeline.sync", &p);
    let page = parse(&r.body());
    let next = field(&page, "next")
        .and_then(Value::as_protocol_int)
        .unwrap();
    assert!(
        next >= 1 && next <= (4 * budget / 60_000 + 1) as u64,
        "next {next}"
    );
    assert_eq!(field(&page, "has_more"), Some(&Value::Bool(true)));
}

#[test]
fn a_tick_entry_that_cannot_be_processed_is_quarantined_and_deliveries_go_on() {
    use relay_core::engine::Storage;
    let mut w = World::new(1906);
    let a = w.relay_with("a", unlimited);
    let b = w.relay_with("b", unlimited);
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m1 = w.message(&alice, 0, &bob, "one", &Msg::default());
    let m2 = w.message(&alice, 0, &bob, "two", &Msg::default());
    w.send(&alice, 0, &m1).result.unwrap();
    w.send(&alice, 0, &m2).result.unwrap();
    for req in w.take_outbox() {
        w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
    }
    // One task's record goes bad in storage.
    let bad = format!("task/{}.{}", alice.id(), message_id(&m1));
    w.nodes[a]
        .store
        .commit(vec![(bad.into_bytes(), Some(b"{not a task".to_vec()))])
        .unwrap();
    w.run_for(10 * 60_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m2)).result.unwrap()),
        "target_accepted",
        "the other delivery went on"
    );
    let r = w
        .call(a, &Caller::Operator, "admin.deliveries", &Object::new())
        .result
        .unwrap();
    let q = field(&r, "quarantined").and_then(array).unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
    let entry = field(&q[0], "entry").and_then(Value::as_str).unwrap();
    assert!(entry.starts_with("due/") && entry.ends_with(&message_id(&m1)));
    assert_eq!(
        field(&q[0], "code").and_then(Value::as_str),
        Some("internal")
    );
}

#[test]
fn an_identical_send_retried_from_another_device_of_the_account_gets_the_stored_result() {
    let mut w = World::new(1907);
    let a = w.relay("a");
    let alice = w.account(a, 2, true);
    let bob = w.account(a, 1, true);
    let m = w.message(&alice, 0, &bob, "once", &Msg::default());
    let first = w.send(&alice, 0, &m).result.unwrap();
    let again = w
        .send(&alice, 1, &m)
        .result
        .expect("nothing else is checked");
    assert_eq!(first, again);
    // A new request from a device that is not the envelope's signer is still refused.
    let other = w.message(&alice, 0, &bob, "new", &Msg::default());
    assert_eq!(code_of(&w.send(&alice, 1, &other)), "permission_denied");
}

#[test]
fn an_error_code_the_source_does_not_know_is_an_unknown_outcome_so_no_later_refusal_switches_target(
) {
    let mut w = World::new(1908);
    let a = w.relay_with("a", unlimited);
    let b = w.relay_with("b", unlimited);
    let c = w.relay_with("c", unlimited);
    let alice = w.account(a, 1, true);
    let mut bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().remove(0);
    let strange = Outcome::Error(error_body("a_code_from_the_future", None));
    w.outcome(a, &req.task, req.attempt, strange);
    // Bob moves; a learns the higher route; the next attempt is known not attempted.
    w.migrate(&mut bob, c);
    w.publish_route(a, &bob);
    let retry = loop {
        w.advance_without_network(1_000);
        if let Some(r) = w.take_outbox().into_iter().find(|r| r.task == req.task) {
            break r;
        }
    };
    assert_eq!(retry.target, w.nodes[b].id);
    w.outcome(a, &retry.task, retry.attempt, Outcome::NotAttempted);
    let next = loop {
        w.advance_without_network(1_000);
        if let Some(r) = w.take_outbox().into_iter().find(|r| r.task == req.task) {
            break r;
        }
    };
    assert_eq!(
        next.target, w.nodes[b].id,
        "an earlier attempt's outcome is unknown: the target stays"
    );
}

#[test]
fn a_message_with_no_time_left_before_its_deadline_is_refused_not_failed_unattempted() {
    let mut w = World::new(1909);
    let a = w.relay("a");
    let b = w.relay("b");
    let mut alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let limit = w.nodes[a].config.policies.message_delivery_age_limit as i64;
    // The sending certificate must be valid at created_at (receiving rule 2, which
    // self-delivery applies too): the clock moves a whole age limit past its issue first.
    w.now += limit as u64;
    alice.sessions[0] = w.open_session(&alice, 0).expect("session");
    let at_limit = Msg {
        created_offset: -limit,
        ..Msg::default()
    };
    let m = w.message(&alice, 0, &bob, "late", &at_limit);
    assert_eq!(code_of(&w.send(&alice, 0, &m)), "message_expired");
    assert!(w.take_outbox().is_empty());
    // Self-delivery completes at once, so the limit itself still admits it.
    let m = w.message(&alice, 0, &alice, "late note", &at_limit);
    assert_eq!(
        status_of(&w.send(&alice, 0, &m).result.unwrap()),
        "target_accepted"
    );
}

/// A JSON array nested `levels` deep (1: `[]`).
fn nested(levels: usize) -> Value {
    let mut v = Value::Array(Vec::new());
    for _ in 1..levels {
        v = Value::Array(vec![v]);
    }
    v
}

#[test]
fn a_key_box_is_accepted_only_as_deep_as_every_answer_carrying_it_may_nest() {
    let mut w = World::new(1910);
    let a = w.relay("a");
    let alice = w.account(a, 1, true);
    let with_extra = |w: &mut World, levels: usize| {
        let mut m = w.message(&alice, 0, &alice, "deep", &Msg::default());
        let Some(Value::Array(boxes)) = m.get("recipient_boxes").cloned() else {
            panic!("boxes")
        };
        let mut b = boxes[0].as_object().unwrap().clone();
        b.insert("extension", nested(levels));
        m.insert("recipient_boxes", Value::Array(vec![Value::Object(b)]));
        m
    };
    // The box itself is one level: 29 in all is the most a sync page can carry.
    let ok = with_extra(&mut w, json::MAX_EMBEDDED_DEPTH - 1);
    w.send(&alice, 0, &ok).result.expect("depth 29");
    let too_deep = with_extra(&mut w, json::MAX_EMBEDDED_DEPTH);
    assert_eq!(code_of(&w.send(&alice, 0, &too_deep)), "invalid_params");
    // The page with the deepest box still parses under the strict limit.
    let page = w.sync(&alice, 0, 0, None).expect("sync");
    assert_eq!(page.get("entries").and_then(array).unwrap().len(), 1);
}

#[test]
fn anonymous_calls_are_limited_per_network_address() {
    let mut w = World::new(1911);
    let a = w.relay_with("a", |c| c.policies.anonymous_rate = 3);
    let bob = w.account(a, 1, true);
    let mut p = Object::new();
    p.insert("account", bob.id());
    let params = relay_core::wire::canonical::object_to_vec(&p);
    let now = w.clock(a);
    let call = |w: &mut World, origin: &str| {
        w.nodes[a]
            .engine
            .call_from(&Caller::Anonymous, Some(origin), "route.get", &params, now)
    };
    for _ in 0..3 {
        call(&mut w, "192.0.2.1").result.expect("within the rate");
    }
    let r = call(&mut w, "192.0.2.1");
    assert_eq!(code_of(&r), "rate_limited");
    let e = r.result.unwrap_err();
    assert!(field(e.data.as_ref().unwrap(), "retry_after").is_some());
    // IPv4-mapped IPv6 is the same address; another address has its own allowance.
    assert_eq!(code_of(&call(&mut w, "::ffff:192.0.2.1")), "rate_limited");
    call(&mut w, "192.0.2.2").result.expect("another address");
    // A caller inside the host (no address) is not limited by it.
    w.call(a, &Caller::Anonymous, "route.get", &p)
        .result
        .expect("no address");
}

#[test]
fn one_sender_cannot_use_up_a_recipients_delivery_allowance() {
    let mut w = World::new(1912);
    let a = w.relay_with("a", |c| {
        c.policies.send_rate = 0;
        c.policies.deliver_rate_per_sender = 3;
    });
    let flooder = w.account(a, 1, true);
    let friend = w.account(a, 1, true);
    let bob = w.account(a, 1, true);
    let mut last = Value::Null;
    for i in 0..4 {
        let m = w.message(&flooder, 0, &bob, &format!("{i}"), &Msg::default());
        last = w.send(&flooder, 0, &m).result.unwrap();
    }
    assert_eq!(status_of(&last), "delivering", "the fourth waits its turn");
    let m = w.message(&friend, 0, &bob, "hi", &Msg::default());
    assert_eq!(
        status_of(&w.send(&friend, 0, &m).result.unwrap()),
        "target_accepted"
    );
    w.run_for(120_000);
    assert_eq!(w.record_count(a, &bob), 5, "and it is delivered later");
}

#[test]
fn a_relay_serves_at_most_max_accounts_and_an_account_at_most_max_device_records() {
    let mut w = World::new(1913);
    let a = w.relay_with("a", |c| {
        c.policies.max_accounts = 2;
        c.policies.max_device_records = 3;
    });
    let alice = w.account(a, 2, true);
    let _bob = w.account(a, 1, true);
    let key = relay_core::client::AccountKey::generate(&mut w.rng);
    let dev = relay_core::client::DeviceKey::generate(&mut w.rng);
    let now = w.clock(a);
    let relay = w.nodes[a].id.as_str().to_string();
    let mut p = Object::new();
    p.insert(
        "route",
        relay_core::client::draft::route(NET, &key.id(), &relay, 1, now).sign(&key),
    );
    p.insert(
        "certificate",
        relay_core::client::draft::certificate(NET, &key, &dev, &["manage"], now).sign(&key),
    );
    let r = w.call(a, &Caller::Anonymous, "account.register", &p);
    assert_eq!(code_of(&r), "unavailable", "a third account");
    // Two devices held; one revocation of an unknown id fits, the next does not.
    let revoke = |w: &mut World| {
        let unknown = relay_core::client::DeviceKey::generate(&mut w.rng);
        let r =
            relay_core::client::draft::revocation(NET, &alice.key.id(), &unknown.id(), w.clock(a))
                .sign(&alice.key);
        w.call(a, &World::session(&alice, 0), "device.revoke", &r)
    };
    revoke(&mut w).result.expect("third record");
    assert_eq!(code_of(&revoke(&mut w)), "payload_too_large");
}

/// A store whose next range read after a commit fails once (SQLite `busy`).
struct BusyAfterCommit {
    inner: relay_core::engine::MemoryStore,
    fail_next_scan: bool,
}

impl relay_core::engine::Storage for BusyAfterCommit {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, relay_core::engine::StorageError> {
        self.inner.get(key)
    }
    fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, relay_core::engine::StorageError> {
        if std::mem::take(&mut self.fail_next_scan) {
            return Err(relay_core::engine::StorageError("busy".into()));
        }
        self.inner.scan(start, end, limit)
    }
    fn commit(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<(), relay_core::engine::StorageError> {
        self.inner.commit(batch)?;
        self.fail_next_scan = true;
        Ok(())
    }
}

#[test]
fn an_operation_that_committed_but_could_not_read_its_next_wake_up_asks_for_a_tick_now() {
    use rand::SeedableRng;
    use relay_core::engine::{Effect, Engine};
    let mut w = World::new(1914);
    let a = w.relay("a");
    let b = w.relay("b");
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let store = BusyAfterCommit {
        inner: w.nodes[a].store.clone(),
        fail_next_scan: false,
    };
    let entropy = TestEntropy(rand_chacha::ChaCha20Rng::seed_from_u64(7));
    let mut e = Engine::new(w.nodes[a].config.clone(), store, entropy);
    let params = relay_core::wire::canonical::object_to_vec(&m);
    let now = w.clock(a);
    let r = e.call(&World::session(&alice, 0), "message.send", &params, now);
    assert!(r.result.is_ok());
    assert!(
        r.effects.contains(&Effect::WakeAt(now)),
        "a tick at once stands in for the wake-up it could not read: {:?}",
        r.effects
    );
}
