//! protocol.md, "Home relay changes", rule 6 (home spans): nothing signed or opened before
//! a move is accepted after a move back. Each part of the rule has a test that names it,
//! over in-memory engines; the conformance suite replays the same scenario against every
//! host pair over HTTP, and the simulation delays requests past moves and moves back.

use relay_core::engine::{Caller, Outcome, Response};
use relay_core::wire::json::Object;
use relay_tests::*;

/// Two relays: alice at `a`, bob at `b`, each knowing the other's route; `c` empty.
struct Span {
    w: World,
    a: usize,
    b: usize,
    c: usize,
    alice: Account,
    bob: Account,
}

fn span(seed: u64) -> Span {
    let mut w = World::new(seed);
    let a = w.relay("a");
    let b = w.relay("b");
    let c = w.relay("c");
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    w.publish_route(b, &alice);
    Span {
        w,
        a,
        b,
        c,
        alice,
        bob,
    }
}

/// Moves `acct` to `to` and tells its old home, as a client's `account move` does.
fn move_to(w: &mut World, acct: &mut Account, to: usize) {
    let old = acct.home;
    w.migrate(acct, to);
    w.publish_route(old, acct);
}

/// Relay `n`'s count of home span event `event`.
fn span_events(w: &mut World, n: usize, event: &str) -> u64 {
    let now = w.clock(n);
    let m = w.nodes[n].engine.metrics(now).expect("metrics");
    m.counters.home_spans.get(event).copied().unwrap_or(0)
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

#[test]
fn rule_6_a_deliver_aimed_at_an_older_revision_is_refused_with_the_current_route_even_naming_this_relay(
) {
    let Span {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = span(61);
    let m = w.message(&alice, 0, &bob, "signed for revision 1", &Msg::default());
    let deliver = World::deliver_params(&alice, 0, &m);
    move_to(&mut w, &mut bob, c);
    move_to(&mut w, &mut bob, b);
    assert_eq!(bob.route_revision, 3);
    let source = w.nodes[a].id.as_str().to_string();
    let stale = w.deliver_at(b, &source, &deliver, 1);
    assert_eq!(code_of(&stale), "not_home_relay");
    assert_eq!(
        route_in(&stale),
        Some((3, w.nodes[b].id.as_str().to_string())),
        "refused with the current route, which names this relay"
    );
    assert_eq!(w.record_count(b, &bob), 0, "nothing stored");
    // The same body aimed at the current revision is accepted, once.
    let ok = w.deliver_at(b, &source, &deliver, 3);
    assert_eq!(status_of(&ok.result.unwrap()), "target_accepted");
    let again = w.deliver_at(b, &source, &deliver, 3);
    assert_eq!(status_of(&again.result.unwrap()), "target_accepted");
    assert_eq!(w.record_count(b, &bob), 1);
}

#[test]
fn rule_6_a_recognized_deliver_gets_its_stored_result_whatever_revision_it_names() {
    let Span {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = span(62);
    let m = w.message(
        &alice,
        0,
        &bob,
        "accepted before the moves",
        &Msg::default(),
    );
    let deliver = World::deliver_params(&alice, 0, &m);
    let source = w.nodes[a].id.as_str().to_string();
    let first = w.deliver_at(b, &source, &deliver, 1).result.unwrap();
    move_to(&mut w, &mut bob, c);
    move_to(&mut w, &mut bob, b);
    let retry = w.deliver_at(b, &source, &deliver, 1).result.unwrap();
    assert_eq!(retry, first, "processing step 3 comes before rule 6");
    assert_eq!(w.record_count(b, &bob), 1);
}

#[test]
fn rule_6_a_source_refused_with_a_higher_route_naming_the_same_relay_retries_at_once_with_it() {
    let Span {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = span(63);
    // Bob moves away and back before alice's relay hears of it: it targets b at revision 1.
    move_to(&mut w, &mut bob, c);
    move_to(&mut w, &mut bob, b);
    let m = w.message(&alice, 0, &bob, "aimed at revision 1", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let first = w.take_outbox().pop().unwrap();
    assert_eq!(first.route_revision, Some(1));
    w.carry(first.clone());
    // Refused with revision 3 naming b: the unchanged body goes again at once, to b, at 3.
    let again = w.take_outbox().pop().expect("a retry at once");
    assert_eq!(again.target, w.nodes[b].id, "not a switch");
    assert_eq!(again.body, first.body, "the same body");
    assert_eq!(again.route_revision, Some(3));
    w.carry(again);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(b, &bob), 1);
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
    // The world the simulation's soak found (docs/protocol.md): the first attempt to b is
    // delayed in the network, its retry is refused by b once bob moved to c, the source
    // switches to c, c accepts; bob moves back to b, and the delayed attempt arrives.
    let Span {
        mut w,
        a,
        b,
        c,
        alice,
        mut bob,
    } = span(64);
    let m = w.message(&alice, 0, &bob, "delayed", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let delayed = w.take_outbox().pop().unwrap();
    w.outcome(a, &delayed.task, delayed.attempt, Outcome::Unknown);
    move_to(&mut w, &mut bob, c);
    w.run_for(5 * 60_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(c, &bob), 1, "accepted at c");
    move_to(&mut w, &mut bob, b);
    let before = span_events(&mut w, b, "stale_delivery");
    w.carry(delayed);
    assert_eq!(w.record_count(b, &bob), 0, "never accepted at b too");
    let after = span_events(&mut w, b, "stale_delivery");
    assert_eq!(after, before + 1, "refused as stale");
}

#[test]
fn rule_6_a_session_from_before_a_move_cannot_send_after_the_move_back_and_a_fresh_one_can() {
    let Span {
        mut w,
        a,
        c,
        mut alice,
        bob,
        ..
    } = span(65);
    let old = alice.sessions[0].clone();
    let sent = w.message(&alice, 0, &bob, "before the move", &Msg::default());
    w.send(&alice, 0, &sent).result.unwrap();
    move_to(&mut w, &mut alice, c);
    // A session opened at the former home while away is a former account's session too.
    let while_away = w.open_session_at(&alice, 0, a).unwrap();
    move_to(&mut w, &mut alice, a);
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
    let Span {
        mut w,
        a,
        b,
        alice,
        bob,
        ..
    } = span(66);
    let m = w.message(&alice, 0, &bob, "no revision", &Msg::default());
    let deliver = World::deliver_params(&alice, 0, &m);
    let caller = Caller::relay(w.nodes[a].id.clone());
    let r = w.call(b, &caller, "message.deliver", &deliver);
    assert_eq!(code_of(&r), "invalid_params");
    assert_eq!(w.record_count(b, &bob), 0);
}
