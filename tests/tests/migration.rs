//! protocol.md, "Home relay changes (account migration)": each of its six rules, with a
//! test that names it (rule 6, home spans: each of its parts), over in-memory engines (the
//! live hosts run the same rules in the conformance suite's migration and home span
//! scenarios). And the fixes found reading the seed against
//! the code (issue 31): self-delivery's receiving rule 2, the order of `message.deliver`'s
//! limits, promises kept over a policy shrink, the acceptance-time certificate after a
//! rotation, forged routes, and a repeated `account.register`.

use relay_core::client::{draft, DeviceKey};
use relay_core::engine::{Caller, Outcome, Response};
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

const HOUR: u64 = 3_600_000;

/// Three relays with a one-hour retention: alice (2 devices) at `a`, bob at `c`, `b` empty.
struct Three {
    w: World,
    a: usize,
    b: usize,
    c: usize,
    alice: Account,
    bob: Account,
}

fn three(seed: u64) -> Three {
    let mut w = World::new(seed);
    let tune = |c: &mut relay_core::engine::Config| {
        c.policies.message_retention = HOUR;
        c.policies.message_delivery_age_limit = 20 * 60_000;
    };
    let a = w.relay_with("a", tune);
    let b = w.relay_with("b", tune);
    let c = w.relay_with("c", tune);
    let alice = w.account(a, 2, true);
    let bob = w.account(c, 1, true);
    w.publish_route(a, &bob);
    w.publish_route(c, &alice);
    Three {
        w,
        a,
        b,
        c,
        alice,
        bob,
    }
}

/// Moves `acct` from its home to `to` and tells the old home (route.publish there).
fn move_account(w: &mut World, acct: &mut Account, to: usize) {
    let old = acct.home;
    w.migrate(acct, to);
    w.publish_route(old, acct);
}

fn call(w: &mut World, n: usize, token: &str, method: &str, p: &Object) -> Response {
    w.call(n, &Caller::Session(token.to_string()), method, p)
}

fn status_at(w: &mut World, n: usize, token: &str, id: &str) -> Response {
    let mut p = Object::new();
    p.insert("message_id", id);
    call(w, n, token, "message.delivery.status", &p)
}

/// The revision and relay of the route in a `not_home_relay` answer's `data.route`.
fn route_in(r: &Response) -> Option<(u64, String)> {
    let e = r.result.as_ref().err()?;
    let route = field(e.data.as_ref()?, "route")?;
    Some((
        field(route, "revision")?.as_protocol_int()?,
        field(route, "relay")?.as_str()?.to_string(),
    ))
}

/// Relay `n`'s count of home span event `event` (`Counters::home_spans`).
fn span_events(w: &mut World, n: usize, event: &str) -> u64 {
    let now = w.clock(n);
    let m = w.nodes[n].engine.metrics(now).expect("metrics");
    m.counters.home_spans.get(event).copied().unwrap_or(0)
}

fn keys_with(w: &World, n: usize, prefix: &str) -> usize {
    w.nodes[n]
        .store
        .snapshot()
        .keys()
        .filter(|k| k.starts_with(prefix.as_bytes()))
        .count()
}

fn sync_at(w: &mut World, n: usize, token: &str) -> Result<Vec<Object>, relay_core::Error> {
    sync_after(w, n, token, 0)
}

/// The timeline entries after sequence `after` (one page of up to 500).
fn sync_after(
    w: &mut World,
    n: usize,
    token: &str,
    after: u64,
) -> Result<Vec<Object>, relay_core::Error> {
    let mut p = Object::new();
    p.insert("after", after);
    p.insert("limit", 500u64);
    let r = call(w, n, token, "message.timeline.sync", &p);
    let body = r.body();
    r.result?;
    let page = parse(&body);
    Ok(field(&page, "entries")
        .and_then(array)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.as_object().cloned())
        .collect())
}

#[test]
fn rule_1_a_higher_route_naming_another_relay_makes_the_account_former_and_refuses_changes() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        ..
    } = three(1);
    let old = alice.sessions[0].clone();
    move_account(&mut w, &mut alice, b);
    let mut cert = Object::new();
    cert.insert("certificate", alice.certs[1].clone());
    let mut disc = Object::new();
    disc.insert("discoverable", false);
    let mut grant = Object::new();
    grant.insert("grant_id", relay_core::client::random_id(&mut w.rng));
    let revocation =
        draft::revocation(NET, &alice.key.id(), &alice.devices[1].id(), w.now).sign(&alice.key);
    let mut list = Object::new();
    list.insert("account", alice.id());
    for (method, p) in [
        ("device.register", &cert),
        ("account.update", &disc),
        ("contact.revoke", &grant),
        ("device.revoke", &revocation),
        ("device.list", &list),
    ] {
        let r = call(&mut w, a, &old, method, p);
        assert_eq!(code_of(&r), "not_home_relay", "{method}: {r:?}");
        assert_eq!(
            route_in(&r),
            Some((2, w.nodes[b].id.as_str().to_string())),
            "{method} carries the highest route held"
        );
    }
    // A relay asking for the devices of a former account is pointed on too.
    let peer = Caller::relay(w.nodes[b].id.clone());
    assert_eq!(
        code_of(&w.call(a, &peer, "device.list", &list)),
        "not_home_relay"
    );
}

#[test]
fn rule_2_a_recognized_send_at_the_former_home_answers_its_stored_result_byte_for_byte() {
    let Three {
        mut w,
        a,
        b,
        c,
        mut alice,
        bob,
    } = three(2);
    let cross = w.message(
        &alice,
        0,
        &bob,
        "before the move",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let own = w.message(&alice, 0, &alice, "a note to self", &Msg::default());
    w.send(&alice, 0, &cross).result.unwrap();
    w.send(&alice, 0, &own).result.unwrap();
    w.run_for(10_000);
    let before_cross = w.send(&alice, 0, &cross).body();
    let before_own = w.send(&alice, 0, &own).body();
    assert_eq!(status_of(&parse(&before_cross)), "target_accepted");
    let old = alice.sessions[0].clone();
    move_account(&mut w, &mut alice, b);
    let fresh = w
        .open_session_at(&alice, 0, a)
        .expect("session.open at the former home");
    for token in [&old, &fresh] {
        assert_eq!(
            call(&mut w, a, token, "message.send", &cross).body(),
            before_cross
        );
        assert_eq!(
            call(&mut w, a, token, "message.send", &own).body(),
            before_own
        );
    }
    // A conflicting reuse of the key is still state_conflict.
    let other = w.message(
        &alice,
        0,
        &bob,
        "other content",
        &Msg {
            message_id: Some(message_id(&cross)),
            ..Msg::default()
        },
    );
    assert_eq!(
        code_of(&call(&mut w, a, &fresh, "message.send", &other)),
        "state_conflict"
    );
    // Nothing new was accepted anywhere.
    assert_eq!(w.record_count(c, &bob), 1);
    assert_eq!(w.record_count(b, &alice), 0);
}

#[test]
fn rule_2_status_and_sync_at_the_former_home_through_a_session_opened_after_the_move() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        bob,
        ..
    } = three(3);
    let m = w.message(
        &alice,
        0,
        &bob,
        "kept at a",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let first = w.send(&alice, 0, &m).result.unwrap();
    w.run_for(10_000);
    let before = w.status(&alice, &message_id(&m)).body();
    let records = w.sync_all(&alice, 1);
    assert_eq!(records.len(), 1);
    move_account(&mut w, &mut alice, b);
    // Each device opens a session at the former home, checked against its device state.
    let t1 = w
        .open_session_at(&alice, 1, a)
        .expect("session.open at the former home");
    let t0 = w
        .open_session_at(&alice, 0, a)
        .expect("session.open at the former home");
    assert_eq!(status_at(&mut w, a, &t0, &message_id(&m)).body(), before);
    let s = parse(&before);
    assert_eq!(field(&s, "accepted_at"), field(&first, "accepted_at"));
    let kept = sync_at(&mut w, a, &t1).expect("sync at the former home");
    assert_eq!(kept, records, "the records a holds, unchanged");
    // The new home holds none of them: records are not transferred.
    assert!(w.sync_all(&alice, 1).is_empty());
}

#[test]
fn rule_2_session_open_at_the_former_home_uses_the_device_state_frozen_at_the_move() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        ..
    } = three(4);
    move_account(&mut w, &mut alice, b);
    // A device registered at the new home after the move is unknown at the former one.
    let d = DeviceKey::generate(&mut w.rng);
    let cert = draft::certificate(NET, &alice.key, &d, &["send", "sync"], w.now).sign(&alice.key);
    let mut p = Object::new();
    p.insert("certificate", cert.clone());
    let at_b = alice.sessions[0].clone();
    call(&mut w, b, &at_b, "device.register", &p)
        .result
        .expect("device.register at the new home");
    alice.devices.push(d);
    alice.certs.push(cert);
    let r = w.open_session_at(&alice, 2, a);
    assert_eq!(
        r.map_err(|e| e.code.as_str()),
        Err("unauthenticated"),
        "not registered at a"
    );
    // ...and cannot be registered there.
    let t0 = w
        .open_session_at(&alice, 0, a)
        .expect("device 0 is still valid at a");
    assert_eq!(
        code_of(&call(&mut w, a, &t0, "device.register", &p)),
        "not_home_relay"
    );
    // A session at a former home of an account it never served: not_home_relay.
    let stranger = w.account(b, 1, true);
    let r = w.open_session_at(&stranger, 0, a);
    assert_eq!(r.map_err(|e| e.code.as_str()), Err("not_home_relay"));
}

#[test]
fn rule_2_an_unrecognized_send_or_deliver_at_the_former_home_is_not_home_relay_before_any_limit() {
    let mut w = World::new(5);
    let tight = |c: &mut relay_core::engine::Config| {
        c.policies.send_rate = 1;
        c.policies.deliver_rate = 1;
        c.policies.deliver_rate_per_account = 1;
        c.policies.deliver_rate_per_sender = 1;
    };
    let a = w.relay_with("a", tight);
    let b = w.relay_with("b", tight);
    let c = w.relay_with("c", tight);
    let mut alice = w.account(a, 1, true);
    let bob = w.account(c, 1, true);
    w.publish_route(a, &bob);
    let old = alice.sessions[0].clone();
    // Spend a's send bucket and its deliver buckets for c and for alice.
    let m = w.message(&alice, 0, &bob, "spends the send bucket", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let spent = w.message(
        &bob,
        0,
        &alice,
        "spends the deliver buckets",
        &Msg::default(),
    );
    let p = World::deliver_params(&bob, 0, &spent);
    let c_id = w.nodes[c].id.as_str().to_string();
    w.deliver(a, &c_id, &p).result.unwrap();
    move_account(&mut w, &mut alice, b);
    let new = w.message(&alice, 0, &bob, "new", &Msg::default());
    let r = call(&mut w, a, &old, "message.send", &new);
    assert_eq!(code_of(&r), "not_home_relay", "{r:?}");
    assert_eq!(route_in(&r).map(|r| r.0), Some(2));
    let again = w.message(&bob, 0, &alice, "new deliver", &Msg::default());
    let p = World::deliver_params(&bob, 0, &again);
    let r = w.deliver(a, &c_id, &p);
    assert_eq!(code_of(&r), "not_home_relay", "{r:?}");
    assert_eq!(route_in(&r).map(|r| r.0), Some(2));
}

#[test]
fn rule_3_a_move_of_the_sender_changes_neither_target_nor_deadline() {
    let Three {
        mut w,
        a,
        b,
        c,
        mut alice,
        bob,
    } = three(6);
    let m = w.message(&alice, 0, &bob, "in flight", &Msg::default());
    let accepted = w.send(&alice, 0, &m).result.unwrap();
    // c does not answer the first attempt.
    let first = w.take_outbox().pop().expect("an attempt");
    w.outcome(a, &first.task, first.attempt, Outcome::NotAttempted);
    move_account(&mut w, &mut alice, b);
    w.run_for(5 * 60_000);
    let t = w.open_session_at(&alice, 0, a).unwrap();
    let s = status_at(&mut w, a, &t, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(field(&s, "deadline"), field(&accepted, "deadline"));
    assert_eq!(w.record_count(c, &bob), 1);
    assert!(w.deliveries(b, None).is_empty(), "b took over nothing");
}

#[test]
fn rule_3_an_unknown_outcome_at_the_old_home_is_confirmed_there_before_any_switch() {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(7);
    // The attempt reached c and was accepted; its answer was lost.
    let m = w.message(
        &alice,
        0,
        &bob,
        "accepted at c, answer lost",
        &Msg::default(),
    );
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    let source = Caller::relay_at(w.nodes[a].id.clone(), req.route_revision);
    w.call_raw(c, &source, "message.deliver", &req.body)
        .result
        .unwrap();
    w.outcome(a, &req.task, req.attempt, Outcome::Unknown);
    // Then bob moves to b; c and the source both learn it.
    move_account(&mut w, &mut bob, b);
    w.publish_route(a, &bob);
    w.run_for(5 * 60_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(c, &bob), 1, "confirmed at c");
    assert_eq!(w.record_count(b, &bob), 0, "never accepted at b too");
}

#[test]
fn rule_3_an_attempt_the_old_home_never_processed_is_retried_there_then_switched_on_its_route_error(
) {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(8);
    let m = w.message(&alice, 0, &bob, "lost on the way to c", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    w.outcome(a, &req.task, req.attempt, Outcome::Unknown);
    move_account(&mut w, &mut bob, b);
    w.publish_route(a, &bob);
    // The retry goes to c again (unknown outcome), unchanged.
    for _ in 0..300 {
        if !w.outbox.is_empty() {
            break;
        }
        w.advance_without_network(1_000);
    }
    let retry = w.take_outbox();
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].target, w.nodes[c].id);
    assert_eq!(retry[0].body, req.body);
    w.carry(retry[0].clone());
    w.run_for(5 * 60_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(c, &bob), 0);
    assert_eq!(w.record_count(b, &bob), 1);
}

#[test]
fn rule_4_moving_back_serves_the_account_again_with_what_the_former_home_kept() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        bob,
        ..
    } = three(9);
    let m = w.message(
        &alice,
        0,
        &bob,
        "first stay at a",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m).result.unwrap();
    w.run_for(10_000);
    let kept = w.sync_all(&alice, 0);
    move_account(&mut w, &mut alice, b);
    let at_b = w.message(&alice, 0, &alice, "while at b", &Msg::default());
    assert_eq!(
        status_of(&w.send(&alice, 0, &at_b).result.unwrap()),
        "target_accepted"
    );
    move_account(&mut w, &mut alice, a);
    assert_eq!(alice.route_revision, 3);
    // Served again: the records from before are there, and new ones follow them.
    let back = w.message(&alice, 1, &alice, "back at a", &Msg::default());
    assert_eq!(
        status_of(&w.send(&alice, 1, &back).result.unwrap()),
        "target_accepted"
    );
    let now = w.sync_all(&alice, 0);
    assert_eq!(now.len(), kept.len() + 1);
    assert_eq!(&now[..kept.len()], &kept[..]);
    let seq = |e: &Object| e.get("seq").and_then(Value::as_protocol_int).unwrap();
    assert!(seq(&now[kept.len()]) > seq(&kept[kept.len() - 1]));
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    // Device changes work again at a, and b is now the former home.
    let revocation =
        draft::revocation(NET, &alice.key.id(), &alice.devices[1].id(), w.now).sign(&alice.key);
    call(
        &mut w,
        a,
        &alice.sessions[0].clone(),
        "device.revoke",
        &revocation,
    )
    .result
    .expect("device.revoke at the home again");
    let tb = w.open_session_at(&alice, 0, b).unwrap();
    assert_eq!(
        status_of(
            &status_at(&mut w, b, &tb, &message_id(&at_b))
                .result
                .unwrap()
        ),
        "target_accepted"
    );
    // Long after the first move's retention, a is still the home: nothing is forgotten.
    w.run_for(3 * HOUR);
    alice.sessions[0] = w.open_session(&alice, 0).expect("served at a");
    let later = w.message(&alice, 0, &alice, "hours later", &Msg::default());
    assert_eq!(
        status_of(&w.send(&alice, 0, &later).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn rule_5_after_retention_the_former_home_forgets_the_account_but_answers_with_its_route() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        bob,
        ..
    } = three(10);
    let m = w.message(
        &alice,
        0,
        &bob,
        "the last promise",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    w.send(&alice, 0, &m).result.unwrap();
    w.run_for(10_000);
    let accepted = w.now - 10_000;
    move_account(&mut w, &mut alice, b);
    let prefix = format!("acct/{}", alice.id());
    // Until the result's retention ends, the former home keeps it and opens sessions.
    w.run_for(accepted + HOUR - 1_000 - w.now);
    let t = w.open_session_at(&alice, 0, a).unwrap();
    assert_eq!(
        status_of(&status_at(&mut w, a, &t, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(keys_with(&w, a, &prefix), 1);
    // Then (its check is due a retention after the move) it forgets the account and its devices...
    w.run_for(15_000);
    assert_eq!(keys_with(&w, a, &prefix), 0);
    assert_eq!(keys_with(&w, a, &format!("dev/{}/", alice.id())), 0);
    assert_eq!(w.record_count(a, &alice), 0);
    let r = w.open_session_at(&alice, 0, a);
    assert_eq!(r.map_err(|e| e.code.as_str()), Err("not_home_relay"));
    // ...but keeps answering with its route for message_retention more.
    let forgot = w.now;
    let mut q = Object::new();
    q.insert("account", alice.id());
    w.run_for(HOUR - 10_000);
    assert!(w.now < forgot + HOUR);
    let r = w.call(a, &Caller::Anonymous, "route.get", &q);
    assert_eq!(
        field(&r.result.unwrap(), "route")
            .and_then(|r| field(r, "revision"))
            .and_then(Value::as_protocol_int),
        Some(2)
    );
    let stale = w.message(&alice, 0, &bob, "to the old home", &Msg::default());
    let r = call(&mut w, a, &t, "message.send", &stale);
    assert_eq!(code_of(&r), "unauthenticated", "its sessions ended with it");
    // Once unused for a retention, the route goes as any other unused route.
    w.run_for(HOUR);
    assert_eq!(
        code_of(&w.call(a, &Caller::Anonymous, "route.get", &q)),
        "not_found"
    );
}

#[test]
fn rule_4_moving_back_after_the_former_home_forgot_the_account_continues_its_sequence() {
    let Three {
        mut w,
        a,
        b,
        mut alice,
        ..
    } = three(12);
    for text in ["one", "two", "three"] {
        let m = w.message(&alice, 0, &alice, text, &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
    }
    let seq = |e: &Object| e.get("seq").and_then(Value::as_protocol_int).unwrap();
    let before = w.sync_all(&alice, 0);
    let last = before.iter().map(seq).max().expect("records at a");
    move_account(&mut w, &mut alice, b);
    w.run_for(HOUR + 60_000);
    assert_eq!(
        keys_with(&w, a, &format!("acct/{}", alice.id())),
        0,
        "a forgot alice"
    );
    // Within the time a keeps her route, she moves back: a client's cursor from her first
    // stay must not hide what is accepted now (sequences are not reused).
    move_account(&mut w, &mut alice, a);
    let m = w.message(&alice, 0, &alice, "back", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let t = alice.sessions[0].clone();
    let entries = sync_after(&mut w, a, &t, last).unwrap();
    assert!(
        !entries.is_empty(),
        "the new record is after the old cursor"
    );
    assert!(entries.iter().all(|e| seq(e) > last));
}

#[test]
fn a_promise_made_under_a_longer_retention_is_kept_after_the_policy_shrinks_and_the_account_moves()
{
    let Three {
        mut w,
        a,
        b,
        mut alice,
        ..
    } = three(11);
    let mut long = w.nodes[a].config.policies.clone();
    long.message_retention = 2 * HOUR;
    w.nodes[a].engine.set_policies(long);
    let m = w.message(&alice, 0, &alice, "kept two hours", &Msg::default());
    let accepted_at = w.now;
    w.send(&alice, 0, &m).result.unwrap();
    let mut short = w.nodes[a].config.policies.clone();
    short.message_retention = HOUR;
    w.nodes[a].engine.set_policies(short);
    move_account(&mut w, &mut alice, b);
    w.run_for(HOUR + HOUR / 2);
    let t = w
        .open_session_at(&alice, 0, a)
        .expect("still a former home");
    let s = status_at(&mut w, a, &t, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    let records = sync_at(&mut w, a, &t).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0]
            .get("expires_at")
            .and_then(Value::as_protocol_int),
        Some(accepted_at + 2 * HOUR),
        "expires_at as promised at acceptance"
    );
    w.run_for(HOUR);
    assert_eq!(w.record_count(a, &alice), 0);
    assert_eq!(
        w.open_session_at(&alice, 0, a).map_err(|e| e.code.as_str()),
        Err("not_home_relay"),
        "forgotten once the last promise expired"
    );
}

#[test]
fn moves_between_relays_of_different_shard_counts_follow_the_same_rules() {
    let mut w = World::new(12);
    let a = w.relay("a");
    let b = w.sharded_relay("b", 4);
    let c = w.relay("c");
    let d = w.sharded_relay("d", 2);
    let mut alice = w.account(a, 1, true);
    let bob = w.account(c, 1, true);
    for n in [a, b, d] {
        w.publish_route(n, &bob);
    }
    w.publish_route(c, &alice);
    let at_a = w.message(&alice, 0, &bob, "from a, one shard", &Msg::default());
    w.send(&alice, 0, &at_a).result.unwrap();
    w.run_for(10_000);
    // a (1 shard) -> b (4 shards); b's shard 0 may not be alice's: it is told all the same.
    move_account(&mut w, &mut alice, b);
    w.publish_route(b, &alice);
    // bob's relay still holds revision 1: its delivery follows the route error to b.
    let to_alice = w.message(
        &bob,
        0,
        &alice,
        "to alice, wherever she is",
        &Msg::default(),
    );
    w.send(&bob, 0, &to_alice).result.unwrap();
    w.run_for(60_000);
    assert_eq!(
        status_of(&w.status(&bob, &message_id(&to_alice)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(w.record_count(alice.home, &alice), 1);
    assert_eq!(w.record_count(a, &alice), 0);
    let at_b = w.message(&alice, 0, &bob, "from b, four shards", &Msg::default());
    w.send(&alice, 0, &at_b).result.unwrap();
    w.run_for(10_000);
    let b_home = alice.home;
    // b (4 shards) -> d (2 shards), told at b's shard 0 as a client would.
    w.migrate(&mut alice, d);
    w.publish_route(b, &alice);
    let ta = w.open_session_at(&alice, 0, a).unwrap();
    let tb = w.open_session_at(&alice, 0, b_home).unwrap();
    for (n, t, m, held) in [(a, &ta, &at_a, 2), (b_home, &tb, &at_b, 3)] {
        let s = status_at(&mut w, n, t, &message_id(m)).result.unwrap();
        assert_eq!(status_of(&s), "target_accepted");
        let r = call(&mut w, n, t, "message.send", m);
        assert_eq!(status_of(&r.result.unwrap()), "target_accepted");
        let new = w.message(&alice, 0, &bob, "not here", &Msg::default());
        let r = call(&mut w, n, t, "message.send", &new);
        assert_eq!(code_of(&r), "not_home_relay");
        assert_eq!(
            route_in(&r).map(|r| r.0),
            Some(held),
            "the highest route it holds"
        );
    }
    assert_eq!(sync_at(&mut w, b_home, &tb).unwrap().len(), 1);
    let at_d = w.message(&alice, 0, &bob, "from d, two shards", &Msg::default());
    w.send(&alice, 0, &at_d).result.unwrap();
    w.run_for(10_000);
    assert_eq!(w.record_count(c, &bob), 3, "each message once");
}

#[test]
fn self_delivery_applies_receiving_rule_2_the_certificate_valid_at_created_at() {
    let mut w = World::new(13);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    let tol = w.nodes[a].config.policies.clock_tolerance as i64;
    let early = Msg {
        created_offset: -(tol + 60_000),
        ..Msg::default()
    };
    let m = w.message(&alice, 0, &alice, "before the certificate", &early);
    let r = w.send(&alice, 0, &m);
    assert_eq!(code_of(&r), "invalid_certificate", "{r:?}");
    assert_eq!(w.record_count(a, &alice), 0);
    // The same to another account is rejected by its destination the same way.
    let bob = w.account(a, 1, true);
    let m = w.message(&alice, 0, &bob, "before the certificate", &early);
    let s = w.send(&alice, 0, &m).result.unwrap();
    w.run_for(10_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap_or(s);
    assert_eq!(status_of(&s), "failed");
    assert_eq!(
        field(&s, "error")
            .and_then(|e| field(e, "code"))
            .and_then(Value::as_str),
        Some("invalid_certificate")
    );
}

#[test]
fn a_recognized_deliver_retry_is_answered_even_when_every_limit_is_spent() {
    let mut w = World::new(14);
    let tight = |c: &mut relay_core::engine::Config| {
        c.policies.deliver_rate = 1;
        c.policies.deliver_rate_per_account = 1;
        c.policies.deliver_rate_per_sender = 1;
    };
    let a = w.relay("a");
    let c = w.relay_with("c", tight);
    let alice = w.account(a, 1, true);
    let bob = w.account(c, 1, true);
    let m = w.message(&alice, 0, &bob, "once", &Msg::default());
    let p = World::deliver_params(&alice, 0, &m);
    let a_id = w.nodes[a].id.as_str().to_string();
    let first = w.deliver(c, &a_id, &p);
    assert_eq!(status_of(&first.result.clone().unwrap()), "target_accepted");
    // Every bucket is empty now: a new delivery is refused...
    let m2 = w.message(&alice, 0, &bob, "twice", &Msg::default());
    let p2 = World::deliver_params(&alice, 0, &m2);
    assert_eq!(code_of(&w.deliver(c, &a_id, &p2)), "rate_limited");
    // ...but the recognized retry is answered with its stored result (step 3 first).
    assert_eq!(w.deliver(c, &a_id, &p).body(), first.body());
}

#[test]
fn a_forged_higher_revision_route_in_a_route_error_is_ignored() {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        bob,
    } = three(15);
    let m = w.message(&alice, 0, &bob, "not to be diverted", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    // A route for bob naming b at revision 9, signed by a key that is not bob's.
    let mallory = relay_core::client::AccountKey::generate(&mut w.rng);
    let forged = draft::route(NET, &bob.key.id(), w.nodes[b].id.as_str(), 9, w.now).sign(&mallory);
    let body = format!(
        "{{\"error\":{{\"code\":\"not_home_relay\",\"message\":\"moved\",\"data\":{{\"route\":{}}}}}}}",
        relay_core::wire::canonical::to_string(&Value::Object(forged))
    );
    w.outcome(a, &req.task, req.attempt, Outcome::Error(body.into_bytes()));
    w.run_for(60_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed", "no switch on a forged route");
    assert_eq!(w.record_count(b, &bob), 0);
    assert_eq!(w.record_count(c, &bob), 0);
    let mut q = Object::new();
    q.insert("account", bob.id());
    let held = w
        .call(a, &Caller::Anonymous, "route.get", &q)
        .result
        .unwrap();
    assert_eq!(
        field(&held, "route")
            .and_then(|r| field(r, "revision"))
            .and_then(Value::as_protocol_int),
        Some(1),
        "the forged route was not learned"
    );
}

#[test]
fn account_register_repeated_with_different_content_is_state_conflict() {
    let mut w = World::new(16);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    // The same revision, another route (another issued_at): state_conflict.
    let other =
        draft::route(NET, &alice.key.id(), w.nodes[a].id.as_str(), 1, w.now + 1).sign(&alice.key);
    let mut p = Object::new();
    p.insert("route", other);
    p.insert("certificate", alice.certs[0].clone());
    let r = w.call(a, &Caller::Anonymous, "account.register", &p);
    assert_eq!(code_of(&r), "state_conflict", "{r:?}");
    // The same content again is answered as before.
    let mut same = Object::new();
    same.insert("route", w.route_of(&alice));
    same.insert("certificate", alice.certs[0].clone());
    let r = w.call(a, &Caller::Anonymous, "account.register", &same);
    assert_eq!(code_of(&r), "ok", "{r:?}");
}

#[test]
fn the_acceptance_time_certificate_is_kept_for_status_and_sync_after_a_rotation() {
    let Three {
        mut w,
        a,
        alice,
        bob,
        c,
        ..
    } = three(17);
    let m = w.message(
        &bob,
        0,
        &alice,
        "signed before the rotation",
        &Msg::default(),
    );
    w.send(&bob, 0, &m).result.unwrap();
    w.run_for(10_000);
    let before = w.status(&bob, &message_id(&m)).body();
    // bob's device gets a newer certificate at c (same device, later issued_at).
    w.now += 60_000;
    let rotated = draft::certificate(
        NET,
        &bob.key,
        &bob.devices[0],
        &["send", "sync", "manage"],
        w.now,
    )
    .sign(&bob.key);
    let mut p = Object::new();
    p.insert("certificate", rotated.clone());
    w.call(c, &World::session(&bob, 0), "device.register", &p)
        .result
        .expect("rotation");
    assert_eq!(w.status(&bob, &message_id(&m)).body(), before);
    let entries = w.sync_all(&alice, 0);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].get("device_certificate"),
        Some(&Value::Object(bob.certs[0].clone())),
        "the certificate as it was at acceptance"
    );
    assert_ne!(bob.certs[0], rotated);
    let _ = a;
}

#[test]
fn rule_6_a_deliver_aimed_at_an_older_revision_is_refused_with_the_current_route_even_naming_this_relay(
) {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(61);
    let m = w.message(&alice, 0, &bob, "signed for revision 1", &Msg::default());
    let deliver = World::deliver_params(&alice, 0, &m);
    move_account(&mut w, &mut bob, b);
    move_account(&mut w, &mut bob, c);
    assert_eq!(bob.route_revision, 3);
    let source = w.nodes[a].id.as_str().to_string();
    let stale = w.deliver_at(c, &source, &deliver, 1);
    assert_eq!(code_of(&stale), "not_home_relay");
    assert_eq!(
        route_in(&stale),
        Some((3, w.nodes[c].id.as_str().to_string())),
        "refused with the current route, which names this relay"
    );
    assert_eq!(w.record_count(c, &bob), 0, "nothing stored");
    // The same body aimed at the current revision is accepted, once.
    let ok = w.deliver_at(c, &source, &deliver, 3);
    assert_eq!(status_of(&ok.result.unwrap()), "target_accepted");
    let again = w.deliver_at(c, &source, &deliver, 3);
    assert_eq!(status_of(&again.result.unwrap()), "target_accepted");
    assert_eq!(w.record_count(c, &bob), 1);
}

#[test]
fn rule_6_a_recognized_deliver_gets_its_stored_result_whatever_revision_it_names() {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(62);
    let m = w.message(
        &alice,
        0,
        &bob,
        "accepted before the moves",
        &Msg::default(),
    );
    let deliver = World::deliver_params(&alice, 0, &m);
    let source = w.nodes[a].id.as_str().to_string();
    let first = w.deliver_at(c, &source, &deliver, 1).result.unwrap();
    move_account(&mut w, &mut bob, b);
    move_account(&mut w, &mut bob, c);
    let retry = w.deliver_at(c, &source, &deliver, 1).result.unwrap();
    assert_eq!(retry, first, "processing step 3 comes before rule 6");
    assert_eq!(w.record_count(c, &bob), 1);
}

#[test]
fn rule_6_a_source_refused_with_a_higher_route_naming_the_same_relay_retries_at_once_with_it() {
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(63);
    // Bob moves away and back before alice's relay hears of it: it targets c at revision 1.
    move_account(&mut w, &mut bob, b);
    move_account(&mut w, &mut bob, c);
    let m = w.message(&alice, 0, &bob, "aimed at revision 1", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let first = w.take_outbox().pop().unwrap();
    assert_eq!(first.route_revision, Some(1));
    w.carry(first.clone());
    // Refused with revision 3 naming c: the unchanged body goes again at once, to c, at 3.
    let again = w.take_outbox().pop().expect("a retry at once");
    assert_eq!(again.target, w.nodes[c].id, "not a switch");
    assert_eq!(again.body, first.body, "the same body");
    assert_eq!(again.route_revision, Some(3));
    w.carry(again);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(c, &bob), 1);
    assert_eq!(span_events(&mut w, a, "revision_retry"), 1);
    let now = w.clock(a);
    let text = w.nodes[a].engine.metrics(now).unwrap().to_prometheus();
    assert!(
        text.contains("relay_home_span_events_total{event=\"revision_retry\"} 1"),
        "{text}"
    );
}

#[test]
fn rule_6_an_attempt_delayed_past_a_move_and_a_move_back_is_never_accepted_at_a_second_home() {
    // The world the simulation's soak found (docs/protocol.md): the first attempt to c is
    // delayed in the network, its retry is refused by c once bob moved to b, the source
    // switches to b, b accepts; bob moves back to c, and the delayed attempt arrives.
    let Three {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = three(64);
    let m = w.message(&alice, 0, &bob, "delayed", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let delayed = w.take_outbox().pop().unwrap();
    w.outcome(a, &delayed.task, delayed.attempt, Outcome::Unknown);
    move_account(&mut w, &mut bob, b);
    w.run_for(5 * 60_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(b, &bob), 1, "accepted at b");
    move_account(&mut w, &mut bob, c);
    let before = span_events(&mut w, c, "stale_delivery");
    w.carry(delayed);
    assert_eq!(w.record_count(c, &bob), 0, "never accepted at c too");
    let after = span_events(&mut w, c, "stale_delivery");
    assert_eq!(after, before + 1, "refused as stale");
}

#[test]
fn rule_6_a_session_from_before_a_move_cannot_send_after_the_move_back_and_a_fresh_one_can() {
    let Three {
        mut w,
        a,
        c,
        mut alice,
        bob,
        ..
    } = three(65);
    let old = alice.sessions[0].clone();
    let sent = w.message(&alice, 0, &bob, "before the move", &Msg::default());
    w.send(&alice, 0, &sent).result.unwrap();
    move_account(&mut w, &mut alice, c);
    // A session opened at the former home while away is a former account's session too.
    let while_away = w.open_session_at(&alice, 0, a).unwrap();
    move_account(&mut w, &mut alice, a);
    for token in [&old, &while_away] {
        let m = w.message(&alice, 0, &bob, "through an old session", &Msg::default());
        let r = w.call(a, &Caller::Session(token.clone()), "message.send", &m);
        assert_eq!(code_of(&r), "not_home_relay", "message.send");
        assert_eq!(route_in(&r).map(|(rev, _)| rev), Some(3));
        let mut p = Object::new();
        p.insert("discoverable", false);
        let r = w.call(a, &Caller::Session(token.clone()), "account.update", &p);
        assert_eq!(code_of(&r), "not_home_relay", "account.update");
        // Rule 2's three methods stay: a recognized send, status and sync.
        let r = w.call(a, &Caller::Session(token.clone()), "message.send", &sent);
        assert!(r.result.is_ok(), "a recognized send: {:?}", r.result);
        let mut p = Object::new();
        p.insert("message_id", message_id(&sent));
        let r = w.call(
            a,
            &Caller::Session(token.clone()),
            "message.delivery.status",
            &p,
        );
        assert!(r.result.is_ok(), "status: {:?}", r.result);
    }
    // The session opened at the move back (World::migrate) sends.
    let m = w.message(&alice, 0, &bob, "through a fresh session", &Msg::default());
    let r = w.send(&alice, 0, &m);
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert_eq!(span_events(&mut w, a, "old_session"), 4);
}

#[test]
fn rule_6_a_deliver_from_another_relay_without_a_route_revision_is_invalid_params() {
    let Three {
        mut w,
        a,
        c,
        alice,
        bob,
        ..
    } = three(66);
    let m = w.message(&alice, 0, &bob, "no revision", &Msg::default());
    let deliver = World::deliver_params(&alice, 0, &m);
    let caller = Caller::relay(w.nodes[a].id.clone());
    let r = w.call(c, &caller, "message.deliver", &deliver);
    assert_eq!(code_of(&r), "invalid_params");
    assert_eq!(w.record_count(c, &bob), 0);
}
