//! The engine's own counts (issue 21): a known mix of messages, and every counter's exact value.

use relay_core::engine::metrics::Destinations;
use relay_core::engine::Outcome;
use relay_tests::*;
use std::collections::BTreeMap;

#[test]
fn the_engine_counts_exactly_what_it_accepted_refused_attempted_and_delivered() {
    let mut w = World::new(2101);
    let a = w.relay_with("a", |c| c.policies.send_rate = 4);
    let b = w.relay("b");
    let c = w.relay("c");
    let alice = w.account(a, 1, true);
    let carol = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    let dan = w.account(c, 1, true);
    w.publish_route(a, &bob);
    w.publish_route(a, &dan);

    // Accepted: one of each kind, and one more cross to a destination that is down.
    let m = w.message(&alice, 0, &alice, "note", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let m = w.message(&alice, 0, &carol, "local", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let m = w.message(&alice, 0, &bob, "cross", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let m = w.message(&alice, 0, &dan, "down", &Msg::default());
    let down_at = w.now;
    w.send(&alice, 0, &m).result.unwrap();
    for req in w.take_outbox() {
        if req.target == w.nodes[c].id {
            w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
        } else {
            w.carry(req);
        }
    }
    // Refused: shape, age, and the send rate (4 acceptances took its 4 tokens).
    let mut bad = w.message(&alice, 0, &bob, "bad", &Msg::default());
    bad.remove("recipient_boxes");
    assert_eq!(code_of(&w.send(&alice, 0, &bad)), "invalid_params");
    let old = Msg {
        created_offset: -(w.nodes[a].config.policies.message_delivery_age_limit as i64) - 1,
        ..Msg::default()
    };
    let m = w.message(&alice, 0, &bob, "old", &old);
    assert_eq!(code_of(&w.send(&alice, 0, &m)), "message_expired");
    let m = w.message(&alice, 0, &bob, "one too many", &Msg::default());
    assert_eq!(code_of(&w.send(&alice, 0, &m)), "rate_limited");

    // Read 5 s later: the oldest pending delivery (the one to c) has waited since it was sent.
    let got = w.nodes[a].engine.metrics(w.now + 5_000).expect("metrics");
    let c_ = &got.counters;
    let map = |pairs: &[(&'static str, u64)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
    assert_eq!(c_.accepted, map(&[("cross", 2), ("local", 1), ("self", 1)]));
    assert_eq!(
        c_.rejected,
        map(&[
            ("invalid_params", 1),
            ("message_expired", 1),
            ("rate_limited", 1)
        ])
    );
    assert_eq!(c_.attempts, map(&[("accepted", 1), ("not_attempted", 1)]));
    assert_eq!(c_.delivered, 2, "the local and the cross delivery to b");
    assert!(c_.failed.is_empty());
    assert_eq!(
        c_.rate_limited,
        [("message.send".to_string(), 1)].into_iter().collect()
    );
    assert_eq!(c_.quarantined, 0);
    assert_eq!(
        got.destinations,
        Destinations {
            failing: 1,
            paused: 0,
            pending: 1,
            quarantined: 0,
            in_flight: 0,
            oldest_pending_age_ms: w.now + 5_000 - down_at,
        },
        "the one delivery to c, which c never took"
    );
    let at_b = w.nodes[b].engine.metrics(w.now).expect("metrics");
    assert_eq!(at_b.counters.accepted, map(&[("received", 1)]));
    // The exposition carries the same figures.
    let text = got.to_prometheus();
    assert!(
        text.contains("relay_messages_accepted_total{kind=\"cross\"} 2\n"),
        "{text}"
    );
    assert!(text.contains("relay_deliveries_delivered_total 2\n"));
    assert!(text.contains(&format!(
        "relay_oldest_pending_delivery_age_seconds {}\n",
        (w.now + 5_000 - down_at) as f64 / 1000.0
    )));

    // At its deadline the delivery to the dead destination fails, and is counted so.
    w.now += w.nodes[a].config.policies.message_delivery_age_limit + 1;
    w.advance_without_network(0);
    for _ in 0..3 {
        w.take_outbox();
        w.tick(a);
    }
    let got = w.nodes[a].engine.metrics(w.now).expect("metrics");
    assert_eq!(
        got.counters.failed,
        [("deadline_exceeded".to_string(), 1)].into_iter().collect()
    );
    assert_eq!(got.destinations.pending, 0);
    assert_eq!(
        got.destinations.oldest_pending_age_ms, 0,
        "nothing waits any more"
    );
}
