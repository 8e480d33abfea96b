//! What operators of federated relays suffer from, avoided by design: head-of-line blocking,
//! slow recovery after an outage, backoff cliffs, and deliveries nobody can see.

use relay_core::engine::Outcome;
use relay_core::wire::json::Value;
use relay_tests::*;

fn setup(cap: u32) -> (World, usize, usize, usize, Account, Account, Account) {
    let mut w = World::new(61);
    let tune = move |c: &mut relay_core::engine::Config| {
        c.max_in_flight_per_destination = cap;
        c.policies.retry_initial = 1_000;
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
    let caller = relay_core::engine::Caller::Relay(w.nodes[dead].id.clone());
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
    let caller = relay_core::engine::Caller::Relay(w.nodes[dead].id.clone());
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
