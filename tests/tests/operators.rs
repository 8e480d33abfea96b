//! What operators of federated relays suffer from, avoided by design: head-of-line blocking,
//! slow recovery after an outage, backoff cliffs, and deliveries nobody can see.

use relay_core::engine::{Caller, Outcome};
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

fn setup(cap: u32) -> (World, usize, usize, usize, Account, Account, Account) {
    trio(61, Some(cap), 1_000)
}

/// A relay `a` (seed `seed`) with accounts at a `dead` and a `live` peer: alice at `a`, bob
/// at `dead`, carol at `live`, both routes published at `a`; retries wait `retry_initial` at
/// least, and `cap` attempts may be in flight per destination (default when `None`).
fn trio(
    seed: u64,
    cap: Option<u32>,
    retry_initial: u64,
) -> (World, usize, usize, usize, Account, Account, Account) {
    let mut w = World::new(seed);
    let tune = move |c: &mut relay_core::engine::Config| {
        if let Some(cap) = cap {
            c.max_in_flight_per_destination = cap;
        }
        c.policies.retry_initial = retry_initial;
        c.policies.retry_max = 600_000;
        c.policies.send_rate = 0;
    };
    let a = w.relay_with("a", tune);
    let dead = w.relay_with("dead", tune);
    let live = w.relay_with("live", tune);
    let alice = w.account(a, 1, true);
    let bob = w.account(dead, 1, true);
    let carol = w.account(live, 1, true);
    w.publish_route(a, &bob);
    w.publish_route(a, &carol);
    (w, a, dead, live, alice, bob, carol)
}

/// Carries requests, except those to `down`, which time out (their outcome is never learned).
fn pump_except(w: &mut World, down: usize) -> usize {
    let mut swallowed = 0;
    while !w.outbox.is_empty() {
        let req = w.outbox.remove(0);
        if req.target == w.nodes[down].id {
            swallowed += 1;
            continue;
        }
        w.carry(req);
    }
    swallowed
}

#[test]
fn a_dead_destination_never_delays_deliveries_to_others() {
    let (mut w, a, dead, _, alice, bob, carol) = setup(4);
    for i in 0..50 {
        let m = w.message(&alice, 0, &bob, &format!("to dead {i}"), &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
    }
    pump_except(&mut w, dead);
    let m = w.message(&alice, 0, &carol, "to live", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    pump_except(&mut w, dead);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    // At most `cap` attempts are out to the dead relay; the rest wait in line.
    let listed = w.deliveries(a, Some("pending"));
    let in_flight = listed
        .iter()
        .filter(|d| field(d, "phase").and_then(Value::as_str) == Some("in_flight"))
        .count();
    let parked = listed
        .iter()
        .filter(|d| field(d, "phase").and_then(Value::as_str) == Some("parked"))
        .count();
    assert_eq!(in_flight, 4);
    assert_eq!(parked, 46);
}

#[test]
fn a_destination_that_is_back_gets_its_waiting_deliveries_promptly_and_drains_them() {
    let (mut w, a, dead, _, alice, bob, _) = setup(8);
    let mut ids = Vec::new();
    for i in 0..20 {
        let m = w.message(&alice, 0, &bob, &format!("m{i}"), &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
        ids.push(message_id(&m));
    }
    // Two hours of outage: attempts time out, backoff grows to minutes.
    let end = w.now + 2 * 3_600_000;
    while w.now < end {
        pump_except(&mut w, dead);
        w.advance_without_network(30_000);
    }
    pump_except(&mut w, dead);
    let pending = w.deliveries(a, Some("pending"));
    assert_eq!(pending.len(), 20);
    let latest = pending
        .iter()
        .filter_map(|d| field(d, "next_attempt_at").and_then(Value::as_protocol_int))
        .max()
        .unwrap();
    assert!(
        latest <= w.clock(a) + 600_000,
        "backoff is capped at retry_max: no cliff"
    );
    assert!(latest > w.clock(a) + 60_000, "the backoff did grow");
    // The destination shows it is back: it calls us.
    w.publish_route(a, &bob);
    let mut p = relay_core::wire::json::Object::new();
    p.insert("route", w.route_of(&bob));
    let caller = relay_core::engine::Caller::relay(w.nodes[dead].id.clone());
    w.call(a, &caller, "route.publish", &p).result.unwrap();
    assert!(
        w.nodes[a].wake.is_some_and(|t| t <= w.clock(a)),
        "waiting deliveries are due now"
    );
    w.advance_without_network(0);
    assert!(!w.outbox.is_empty(), "and attempted at once");
    // Waiting deliveries go at once; attempts lost in the outage free their slots at
    // the attempt timeout (30 s) and retry from the initial backoff: all drain within a minute.
    w.run_for(60_000);
    for id in &ids {
        assert_eq!(
            status_of(&w.status(&alice, id).result.unwrap()),
            "target_accepted"
        );
    }
    assert_eq!(w.record_count(dead, &bob), 20);
}

#[test]
fn a_destination_back_still_honours_retry_after() {
    let (mut w, a, dead, _, alice, bob, _) = setup(8);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    w.outcome(
        a,
        &req.task,
        req.attempt,
        Outcome::Error(error_body("rate_limited", Some("{\"retry_after\":120000}"))),
    );
    let caller = relay_core::engine::Caller::relay(w.nodes[dead].id.clone());
    let mut p = relay_core::wire::json::Object::new();
    p.insert("route", w.route_of(&bob));
    w.call(a, &caller, "route.publish", &p).result.unwrap();
    w.advance(1_000);
    assert!(w.outbox.is_empty(), "retry_after still holds");
    w.run_for(130_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn the_operator_lists_pending_and_failed_deliveries_per_destination_with_last_error_and_next_attempt(
) {
    let (mut w, a, dead, live, alice, bob, carol) = setup(8);
    let m1 = w.message(&alice, 0, &bob, "pending", &Msg::default());
    w.send(&alice, 0, &m1).result.unwrap();
    let m2 = w.message(&alice, 0, &carol, "fails", &Msg::default());
    w.send(&alice, 0, &m2).result.unwrap();
    for req in w.take_outbox() {
        let outcome = if req.target == w.nodes[dead].id {
            Outcome::Unknown
        } else {
            Outcome::Error(error_body("device_unknown", None))
        };
        w.outcome(a, &req.task, req.attempt, outcome);
    }
    let pending = w.deliveries(a, Some("pending"));
    assert_eq!(pending.len(), 1);
    let d = &pending[0];
    assert_eq!(
        field(d, "destination").and_then(Value::as_str),
        Some(w.nodes[dead].id.as_str())
    );
    assert_eq!(
        field(d, "last_error").and_then(Value::as_str),
        Some("result_unknown")
    );
    assert!(field(d, "next_attempt_at").is_some());
    let failed = w.deliveries(a, Some("failed"));
    assert_eq!(failed.len(), 1);
    assert_eq!(
        field(&failed[0], "destination").and_then(Value::as_str),
        Some(w.nodes[live].id.as_str())
    );
    assert_eq!(
        field(&failed[0], "last_error").and_then(Value::as_str),
        Some("device_unknown")
    );
    // Per destination.
    let mut p = relay_core::wire::json::Object::new();
    p.insert("destination", w.nodes[live].id.as_str());
    let r = w
        .call(
            a,
            &relay_core::engine::Caller::Operator,
            "admin.deliveries",
            &p,
        )
        .result
        .unwrap();
    assert_eq!(
        field(&r, "deliveries").and_then(array).map(|a| a.len()),
        Some(1)
    );
    // Not for clients.
    let r = w.call(a, &World::session(&alice, 0), "admin.deliveries", &p);
    assert_eq!(code_of(&r), "permission_denied");
}

#[test]
fn a_store_records_its_schema_version_and_one_written_by_a_newer_relay_is_refused() {
    use rand::SeedableRng;
    use relay_core::engine::{Engine, MemoryStore, Storage, SCHEMA_VERSION};
    let cfg = relay_core::engine::Config::new(
        relay_core::wire::identity::RelayId::parse("http://a.test").unwrap(),
        NET,
    );
    let entropy = || TestEntropy(rand_chacha::ChaCha20Rng::seed_from_u64(1));
    let store = MemoryStore::new();
    let mut e = Engine::new(cfg.clone(), store.clone(), entropy());
    e.open_store().expect("a new store");
    assert_eq!(
        store.snapshot().get(b"meta/schema".as_slice()),
        Some(&SCHEMA_VERSION.to_string().into_bytes())
    );
    Engine::new(cfg.clone(), store.clone(), entropy())
        .open_store()
        .expect("the same version again");
    let mut newer = MemoryStore::new();
    newer
        .commit(vec![(b"meta/schema".to_vec(), Some(b"2".to_vec()))])
        .unwrap();
    let err = Engine::new(cfg, newer, entropy()).open_store().unwrap_err();
    assert_eq!(err, relay_core::engine::OpenError::Newer(2));
    assert!(err.to_string().contains("newer relay"), "{err}");
}

/// One page of an operator listing: its rows and its `next`.
fn page(
    w: &mut World,
    n: usize,
    method: &str,
    p: &Object,
    rows: &str,
) -> (Vec<Value>, Option<String>) {
    let r = w
        .call(n, &Caller::Operator, method, p)
        .result
        .expect(method);
    let next = field(&r, "next")
        .and_then(Value::as_str)
        .map(str::to_string);
    (field(&r, rows).and_then(array).unwrap_or_default(), next)
}

/// Every row of a listing, following `next` with pages of `limit`.
fn every(
    w: &mut World,
    n: usize,
    method: &str,
    mut p: Object,
    rows: &str,
    limit: u64,
) -> Vec<Value> {
    p.insert("limit", limit);
    let mut all = Vec::new();
    for _ in 0..1000 {
        let (got, next) = page(w, n, method, &p, rows);
        assert!(got.len() as u64 <= limit, "a page over its limit");
        all.extend(got);
        match next {
            Some(c) => p.insert("after", c.as_str()),
            None => return all,
        }
    }
    panic!("{method}: `next` never ended");
}

fn text_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    field(v, key).and_then(Value::as_str)
}

#[test]
fn the_operator_pages_through_every_destination_with_its_failures_counts_and_last_success() {
    let mut w = World::new(62);
    let tune = |c: &mut relay_core::engine::Config| {
        c.policies.retry_initial = 1_000;
        c.policies.send_rate = 0;
    };
    let a = w.relay_with("a", tune);
    let alice = w.account(a, 1, true);
    // Seven destinations: the first three never answer, the other four accept.
    let sent_at = w.now;
    let mut peers = Vec::new();
    for i in 0..7 {
        let r = w.relay_with(&format!("p{i}"), tune);
        let acct = w.account(r, 1, true);
        w.publish_route(a, &acct);
        let m = w.message(&alice, 0, &acct, "hello", &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
        peers.push((r, acct));
    }
    let down: Vec<String> = peers[..3]
        .iter()
        .map(|(r, _)| w.nodes[*r].id.as_str().to_string())
        .collect();
    for req in w.take_outbox() {
        if down.contains(&req.target.as_str().to_string()) {
            w.outcome(a, &req.task, req.attempt, Outcome::Unknown);
        } else {
            w.carry(req);
        }
    }
    w.pump();
    // Every destination once, in pages of two, in order.
    let all = every(
        &mut w,
        a,
        "admin.destinations",
        Object::new(),
        "destinations",
        2,
    );
    let names: Vec<&str> = all
        .iter()
        .filter_map(|d| text_of(d, "destination"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted, "each destination once, in order");
    assert_eq!(names.len(), 7);
    for d in &all {
        let failing = down
            .iter()
            .any(|x| Some(x.as_str()) == text_of(d, "destination"));
        let failures = field(d, "consecutive_failures").and_then(Value::as_protocol_int);
        if failing {
            assert_eq!(failures, Some(1), "{d:?}");
            assert_eq!(
                field(d, "pending").and_then(Value::as_protocol_int),
                Some(1)
            );
            assert!(field(d, "failing_since").is_some());
            let e = field(d, "last_error").expect("a last error");
            assert_eq!(text_of(e, "code"), Some("result_unknown"), "{d:?}");
            assert!(text_of(e, "message").is_some_and(|m| !m.is_empty()));
            assert!(field(d, "last_success_at").is_none());
            // Its one delivery waits for its retry (backoff of one failure: 1 s to 2 s).
            let next = field(d, "next_attempt_at").and_then(Value::as_protocol_int);
            assert!(
                next.is_some_and(|t| (w.now + 1_000..=w.now + 2_000).contains(&t)),
                "next attempt {next:?} at now {}",
                w.now
            );
            assert_eq!(
                field(d, "oldest_pending_at").and_then(Value::as_protocol_int),
                Some(sent_at)
            );
            assert_eq!(
                field(d, "oldest_pending_age_ms").and_then(Value::as_protocol_int),
                Some(w.now - sent_at)
            );
            assert_eq!(field(d, "failed").and_then(Value::as_protocol_int), Some(0));
        } else {
            assert_eq!(failures, Some(0), "{d:?}");
            assert_eq!(
                field(d, "pending").and_then(Value::as_protocol_int),
                Some(0)
            );
            assert!(field(d, "failing_since").is_none());
            assert!(field(d, "last_success_at").is_some());
            assert!(field(d, "next_attempt_at").is_none(), "{d:?}");
            assert!(field(d, "oldest_pending_at").is_none(), "{d:?}");
        }
    }
    // Only the failing ones, through pages of one.
    let mut p = Object::new();
    p.insert("failing", true);
    let failing = every(&mut w, a, "admin.destinations", p, "destinations", 1);
    let mut names: Vec<String> = failing
        .iter()
        .filter_map(|d| text_of(d, "destination"))
        .map(str::to_string)
        .collect();
    names.sort();
    let mut want = down.clone();
    want.sort();
    assert_eq!(names, want);
    // One comes back: its run of failures ends.
    w.advance_without_network(5_000);
    w.tick(a);
    let back = down[0].clone();
    let mut carried = 0;
    for req in w.take_outbox() {
        if req.target.as_str() == back {
            w.carry(req);
            carried += 1;
        }
    }
    assert_eq!(carried, 1, "the retry to the destination that came back");
    let all = every(
        &mut w,
        a,
        "admin.destinations",
        Object::new(),
        "destinations",
        100,
    );
    let row = all
        .iter()
        .find(|d| text_of(d, "destination") == Some(back.as_str()))
        .unwrap();
    assert_eq!(
        field(row, "consecutive_failures").and_then(Value::as_protocol_int),
        Some(0)
    );
    assert!(field(row, "failing_since").is_none());
    assert!(field(row, "last_success_at").is_some());
    assert!(
        field(row, "next_attempt_at").is_none() && field(row, "oldest_pending_at").is_none(),
        "its one delivery ended: nothing waits, in either index: {row:?}"
    );
}

#[test]
fn admin_deliveries_pages_through_every_delivery_once() {
    let (mut w, a, dead, _, alice, bob, _) = setup(8);
    for i in 0..5 {
        let m = w.message(&alice, 0, &bob, &format!("to dead {i}"), &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
    }
    pump_except(&mut w, dead);
    let one_page = every(
        &mut w,
        a,
        "admin.deliveries",
        Object::new(),
        "deliveries",
        1000,
    );
    assert_eq!(one_page.len(), 5);
    let paged = every(
        &mut w,
        a,
        "admin.deliveries",
        Object::new(),
        "deliveries",
        2,
    );
    assert_eq!(
        paged, one_page,
        "pages of two list the same deliveries, each once"
    );
}

#[test]
fn operator_listings_refuse_bad_cursors_and_limits_and_are_not_for_clients() {
    let (mut w, a, _, _, alice, _, _) = setup(8);
    for method in ["admin.deliveries", "admin.destinations"] {
        for (k, v) in [
            ("limit", Value::from(0u64)),
            ("limit", Value::from(1001u64)),
            ("limit", Value::from("ten")),
            ("after", Value::from("")),
        ] {
            let mut p = Object::new();
            p.insert(k, v.clone());
            let r = w.call(a, &Caller::Operator, method, &p);
            assert_eq!(code_of(&r), "invalid_params", "{method} {k}={v:?}");
        }
        let r = w.call(a, &World::session(&alice, 0), method, &Object::new());
        assert_eq!(code_of(&r), "permission_denied", "{method}");
    }
    let mut p = Object::new();
    p.insert("failing", "yes");
    let r = w.call(a, &Caller::Operator, "admin.destinations", &p);
    assert_eq!(code_of(&r), "invalid_params");
}

/// The trio with retries that wait a minute at least.
fn slow_retries() -> (World, usize, usize, usize, Account, Account, Account) {
    trio(63, None, 60_000)
}

fn retry(w: &mut World, a: usize, method: &str, p: &Object) -> relay_core::engine::Response {
    w.call(a, &Caller::Operator, method, p)
}

#[test]
fn retry_now_makes_a_destinations_waiting_deliveries_due_at_once_but_never_before_retry_after() {
    let (mut w, a, dead, live, alice, bob, carol) = slow_retries();
    for i in 0..3 {
        let m = w.message(&alice, 0, &bob, &format!("to dead {i}"), &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
    }
    let m = w.message(&alice, 0, &carol, "to live", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    // The dead peer's attempts are lost; the live one asks for two minutes.
    for req in w.take_outbox() {
        let outcome = if req.target == w.nodes[dead].id {
            Outcome::Unknown
        } else {
            Outcome::Error(error_body("rate_limited", Some("{\"retry_after\":120000}")))
        };
        w.outcome(a, &req.task, req.attempt, outcome);
    }
    w.advance_without_network(1_000);
    assert!(w.outbox.is_empty(), "nothing is due within a second");
    // Retry now: the dead peer's three deliveries go at once.
    let mut p = Object::new();
    p.insert("destination", w.nodes[dead].id.as_str());
    let r = retry(&mut w, a, "admin.destination.retry", &p)
        .result
        .unwrap();
    assert_eq!(
        field(&r, "brought_forward").and_then(Value::as_protocol_int),
        Some(3)
    );
    w.tick(a);
    let out = w.take_outbox();
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(out
        .iter()
        .all(|r| r.target == w.nodes[dead].id && r.attempt == 2));
    // The live peer's retry_after holds: retry now moves nothing before it.
    let mut p = Object::new();
    p.insert("destination", w.nodes[live].id.as_str());
    let r = retry(&mut w, a, "admin.destination.retry", &p)
        .result
        .unwrap();
    assert_eq!(
        field(&r, "brought_forward").and_then(Value::as_protocol_int),
        Some(0)
    );
    w.tick(a);
    assert!(w.take_outbox().is_empty(), "retry_after was shortened");
    // An unknown destination.
    let mut p = Object::new();
    p.insert("destination", "https://nobody.example");
    assert_eq!(
        code_of(&retry(&mut w, a, "admin.destination.retry", &p)),
        "not_found"
    );
}

#[test]
fn retrying_one_delivery_brings_it_forward_and_an_ended_one_is_a_state_conflict() {
    let (mut w, a, dead, _, alice, bob, carol) = slow_retries();
    let to_dead = w.message(&alice, 0, &bob, "waits", &Msg::default());
    w.send(&alice, 0, &to_dead).result.unwrap();
    let to_live = w.message(&alice, 0, &carol, "arrives", &Msg::default());
    w.send(&alice, 0, &to_live).result.unwrap();
    for req in w.take_outbox() {
        if req.target == w.nodes[dead].id {
            w.outcome(a, &req.task, req.attempt, Outcome::Unknown);
        } else {
            w.carry(req);
        }
    }
    let key = |m: &Object| {
        let mut p = Object::new();
        p.insert("from", alice.id().as_str());
        p.insert("message_id", message_id(m).as_str());
        p
    };
    let r = retry(&mut w, a, "admin.delivery.retry", &key(&to_dead))
        .result
        .unwrap();
    assert_eq!(field(&r, "brought_forward"), Some(&Value::Bool(true)));
    w.tick(a);
    let out = w.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].attempt, 2);
    // In flight now: nothing to bring forward, and no second attempt.
    let r = retry(&mut w, a, "admin.delivery.retry", &key(&to_dead))
        .result
        .unwrap();
    assert_eq!(field(&r, "brought_forward"), Some(&Value::Bool(false)));
    assert_eq!(
        field(&r, "phase").and_then(Value::as_str),
        Some("in_flight")
    );
    w.tick(a);
    assert!(w.take_outbox().is_empty());
    // Ended: its result never changes.
    let r = retry(&mut w, a, "admin.delivery.retry", &key(&to_live));
    assert_eq!(code_of(&r), "state_conflict");
    // Never accepted here.
    let never = w.message(&alice, 0, &carol, "never sent", &Msg::default());
    let r = retry(&mut w, a, "admin.delivery.retry", &key(&never));
    assert_eq!(code_of(&r), "not_found");
    // Not for clients.
    let r = w.call(
        a,
        &World::session(&alice, 0),
        "admin.delivery.retry",
        &key(&to_dead),
    );
    assert_eq!(code_of(&r), "permission_denied");
}

fn hold(w: &mut World, a: usize, dest: usize, method: &str) -> Value {
    let mut p = Object::new();
    p.insert("destination", w.nodes[dest].id.as_str());
    w.call(a, &Caller::Operator, method, &p)
        .result
        .expect(method)
}

#[test]
fn a_paused_destination_gets_no_attempt_until_resumed_and_keeps_taking_messages() {
    let (mut w, a, _, live, alice, _, carol) = setup(8);
    // Known to the relay: one delivery there first.
    let m0 = w.message(&alice, 0, &carol, "before", &Msg::default());
    w.send(&alice, 0, &m0).result.unwrap();
    w.pump();
    let r = hold(&mut w, a, live, "admin.destination.pause");
    assert_eq!(field(&r, "paused"), Some(&Value::Bool(true)));
    let mut ids = Vec::new();
    for i in 0..3 {
        let m = w.message(&alice, 0, &carol, &format!("held {i}"), &Msg::default());
        let st = w.send(&alice, 0, &m).result.unwrap();
        assert_eq!(status_of(&st), "delivering", "accepted while paused");
        ids.push(message_id(&m));
    }
    w.advance_without_network(30_000);
    assert!(w.outbox.is_empty(), "an attempt to a paused destination");
    // Listed as paused, and under the filter.
    let mut p = Object::new();
    p.insert("paused", true);
    let listed = every(&mut w, a, "admin.destinations", p, "destinations", 10);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        text_of(&listed[0], "destination"),
        Some(w.nodes[live].id.as_str())
    );
    assert_eq!(
        field(&listed[0], "pending").and_then(Value::as_protocol_int),
        Some(3)
    );
    // The gauges and the action's count, with no label per destination.
    let text = w.nodes[a].engine.metrics(w.now).unwrap().to_prometheus();
    for line in [
        "relay_destinations_paused 1\n",
        "relay_destinations_failing 0\n",
        "relay_deliveries_pending 3\n",
        "relay_quarantined_entries 0\n",
        "relay_operator_actions_total{action=\"destination.pause\"} 1\n",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    // A restart keeps the pause.
    w.nodes[a].restart(99);
    w.advance_without_network(1_000);
    assert!(w.outbox.is_empty(), "the pause did not survive the restart");
    // Resumed: the three go, and arrive.
    let r = hold(&mut w, a, live, "admin.destination.resume");
    assert_eq!(
        field(&r, "started").and_then(Value::as_protocol_int),
        Some(3)
    );
    // The three waited for one recipient: they go together, in one batch.
    let carried: usize = w.outbox.iter().map(|r| 1 + r.riders.len()).sum();
    assert_eq!(carried, 3);
    w.pump();
    for id in &ids {
        assert_eq!(
            status_of(&w.status(&alice, id).result.unwrap()),
            "target_accepted"
        );
    }
    // The audit trail: each action, what it acted on and how many deliveries it touched
    // (the pause came when nothing was pending; the resume released three). A second
    // resume changes nothing and is still logged, with nothing touched; a refused one
    // (unknown destination) is not an action at all.
    hold(&mut w, a, live, "admin.destination.resume");
    let mut p = Object::new();
    p.insert("destination", "https://nobody.example");
    w.call(a, &Caller::Operator, "admin.destination.resume", &p);
    let dest = w.nodes[live].id.as_str().to_string();
    let seen: Vec<_> = w.nodes[a]
        .audit
        .iter()
        .map(|e| (e.action, e.subject.as_str(), e.touched))
        .collect();
    assert_eq!(
        seen,
        [
            ("destination.pause", dest.as_str(), 0),
            ("destination.resume", dest.as_str(), 3),
            ("destination.resume", dest.as_str(), 0),
        ]
    );
    let text = w.nodes[a].engine.metrics(w.now).unwrap().to_prometheus();
    assert!(
        text.contains("relay_operator_actions_total{action=\"destination.resume\"} 1\n"),
        "only the resume that changed something counts:\n{text}"
    );
}

#[test]
fn a_pause_changes_no_deadline_a_delivery_held_past_it_fails_deadline_exceeded() {
    let mut w = World::new(64);
    let tune = |c: &mut relay_core::engine::Config| {
        c.policies.message_delivery_age_limit = 60_000;
        c.policies.send_rate = 0;
    };
    let a = w.relay_with("a", tune);
    let b = w.relay_with("b", tune);
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m0 = w.message(&alice, 0, &bob, "before", &Msg::default());
    w.send(&alice, 0, &m0).result.unwrap();
    w.pump();
    hold(&mut w, a, b, "admin.destination.pause");
    let m = w.message(&alice, 0, &bob, "held too long", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    w.advance_without_network(61_000);
    assert!(w.outbox.is_empty(), "an attempt to a paused destination");
    let st = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(code_of_status(&st), "deadline_exceeded", "{st:?}");
    let row = destination_row(&mut w, a, b);
    assert_eq!(
        field(&row, "failed").and_then(Value::as_protocol_int),
        Some(1)
    );
    assert_eq!(
        field(&row, "pending").and_then(Value::as_protocol_int),
        Some(0)
    );
    // Resuming later starts nothing for it: its result never changes.
    let r = hold(&mut w, a, b, "admin.destination.resume");
    assert_eq!(
        field(&r, "started").and_then(Value::as_protocol_int),
        Some(0)
    );
    assert!(w.outbox.is_empty());
    // The failed delivery is counted until its result's retention ends, then forgotten.
    w.advance_without_network(w.nodes[a].config.policies.message_retention + 1_000);
    let row = destination_row(&mut w, a, b);
    assert_eq!(
        field(&row, "failed").and_then(Value::as_protocol_int),
        Some(0),
        "{row:?}"
    );
    // Unknown destination, and not for clients.
    let mut p = Object::new();
    p.insert("destination", "https://nobody.example");
    let r = w.call(a, &Caller::Operator, "admin.destination.pause", &p);
    assert_eq!(code_of(&r), "not_found");
    let r = w.call(a, &World::session(&alice, 0), "admin.destination.pause", &p);
    assert_eq!(code_of(&r), "permission_denied");
}

/// Relay `a`'s `admin.destinations` row for relay `dest`.
fn destination_row(w: &mut World, a: usize, dest: usize) -> Value {
    let id = w.nodes[dest].id.as_str().to_string();
    let r = w.call(a, &Caller::Operator, "admin.destinations", &Object::new());
    let list = field(&r.result.unwrap(), "destinations").cloned().unwrap();
    let Value::Array(list) = list else {
        panic!("destinations is an array")
    };
    list.into_iter()
        .find(|d| text_of(d, "destination") == Some(id.as_str()))
        .expect("a row for the destination")
}

fn code_of_status(v: &Value) -> String {
    field(v, "error")
        .and_then(|e| field(e, "code"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_quarantined_entry_is_listed_requeued_and_dropped_one_by_one() {
    use relay_core::engine::Storage;
    let (mut w, a, _, _, alice, bob, _) = slow_retries();
    let m = w.message(&alice, 0, &bob, "goes bad", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    for req in w.take_outbox() {
        w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
    }
    // Its task record goes bad in storage: the tick sets its entry aside.
    let bad = format!("task/{}.{}", alice.id(), message_id(&m));
    w.nodes[a]
        .store
        .commit(vec![(bad.into_bytes(), Some(b"{not a task".to_vec()))])
        .unwrap();
    w.advance_without_network(10 * 60_000);
    let list = |w: &mut World| every(w, a, "admin.quarantine", Object::new(), "quarantined", 10);
    let q = list(&mut w);
    assert_eq!(q.len(), 1, "{q:?}");
    let id = text_of(&q[0], "id").unwrap().to_string();
    assert!(text_of(&q[0], "entry").is_some_and(|e| e.starts_with("due/")));
    let mut p = Object::new();
    p.insert("id", id.as_str());
    // Requeued unrepaired: the tick takes it again and sets it aside again.
    let r = w
        .call(a, &Caller::Operator, "admin.quarantine.requeue", &p)
        .result
        .unwrap();
    assert_eq!(field(&r, "requeued"), Some(&Value::Bool(true)));
    assert!(list(&mut w).is_empty(), "requeued, no longer set aside");
    w.tick(a);
    let again = list(&mut w);
    assert_eq!(again.len(), 1, "set aside again: {again:?}");
    let id = text_of(&again[0], "id").unwrap().to_string();
    // Dropped: gone for good, and counted.
    let mut p = Object::new();
    p.insert("id", id.as_str());
    let r = w
        .call(a, &Caller::Operator, "admin.quarantine.drop", &p)
        .result
        .unwrap();
    assert_eq!(field(&r, "dropped"), Some(&Value::Bool(true)));
    assert!(list(&mut w).is_empty());
    w.tick(a);
    assert!(list(&mut w).is_empty(), "a dropped entry came back");
    let text = w.nodes[a].engine.metrics(w.now).unwrap().to_prometheus();
    for line in [
        "relay_quarantined_entries 0\n",
        "relay_operator_actions_total{action=\"quarantine.drop\"} 1\n",
        "relay_operator_actions_total{action=\"quarantine.requeue\"} 1\n",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    // Gone, a bad id, and not for clients.
    let r = w.call(a, &Caller::Operator, "admin.quarantine.drop", &p);
    assert_eq!(code_of(&r), "not_found");
    let mut bad = Object::new();
    bad.insert("id", "***");
    let r = w.call(a, &Caller::Operator, "admin.quarantine.requeue", &bad);
    assert_eq!(code_of(&r), "invalid_params");
    let r = w.call(
        a,
        &World::session(&alice, 0),
        "admin.quarantine",
        &Object::new(),
    );
    assert_eq!(code_of(&r), "permission_denied");
}
