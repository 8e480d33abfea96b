//! Seed "Delivery Deadlines and Retries" and "Delivery Result Confirmation and Destination Relay Switching".

use relay_core::engine::{Caller, Outcome, PeerMethod};
use relay_core::wire::json::{Object, Value};
use relay_tests::*;

const RETRY_INITIAL: u64 = 1_000;
const RETRY_MAX: u64 = 60_000;

fn setup(seed: u64) -> (World, usize, usize, Account, Account) {
    let mut w = World::new(seed);
    let tune = |c: &mut relay_core::engine::Config| {
        c.policies.message_delivery_age_limit = 600_000;
        c.policies.message_retention = 3_600_000;
        c.policies.retry_initial = RETRY_INITIAL;
        c.policies.retry_max = RETRY_MAX;
    };
    let a = w.relay_with("a", tune);
    let b = w.relay_with("b", tune);
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    (w, a, b, alice, bob)
}

fn error_of(v: &Value) -> (String, Option<String>) {
    let e = field(v, "error").expect("error");
    (
        field(e, "code")
            .and_then(Value::as_str)
            .unwrap()
            .to_string(),
        field(e, "data")
            .and_then(|d| field(d, "last_error"))
            .and_then(Value::as_str)
            .map(String::from),
    )
}

/// The next attempt time of the only pending delivery at relay `a`, from the operator's listing.
fn next_attempt(w: &mut World, a: usize) -> Option<u64> {
    let list = w.deliveries(a, Some("pending"));
    list.first()
        .and_then(|d| field(d, "next_attempt_at"))
        .and_then(Value::as_protocol_int)
}

/// Feeds `outcome` to the single request in flight and returns the time of the next attempt.
fn fail_once(w: &mut World, a: usize, outcome: Outcome) -> Option<u64> {
    let req = w.take_outbox().pop().expect("a request in flight");
    w.outcome(a, &req.task, req.attempt, outcome);
    next_attempt(w, a)
}

#[test]
fn the_deadline_is_fixed_at_acceptance_as_the_earlier_of_age_limit_and_retention() {
    let (mut w, a, _, alice, bob) = setup(41);
    let m = w.message(
        &alice,
        0,
        &bob,
        "x",
        &Msg {
            created_offset: -100_000,
            ..Msg::default()
        },
    );
    let r = w.send(&alice, 0, &m).result.unwrap();
    let deadline = field(&r, "deadline")
        .and_then(Value::as_protocol_int)
        .unwrap();
    assert_eq!(
        deadline,
        T0 - 100_000 + 600_000,
        "created_at + age limit is earlier than accepted_at + retention"
    );
    let mut p = w.nodes[a].config.policies.clone();
    p.message_delivery_age_limit = 10_000_000;
    w.nodes[a].engine.set_policies(p);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(
        field(&s, "deadline").and_then(Value::as_protocol_int),
        Some(deadline),
        "never changes"
    );
    // With a long age limit, retention is the earlier bound.
    let (mut w, a, _, alice, bob) = setup(42);
    let mut p = w.nodes[a].config.policies.clone();
    p.message_delivery_age_limit = 10_000_000;
    w.nodes[a].engine.set_policies(p);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let r = w.send(&alice, 0, &m).result.unwrap();
    assert_eq!(
        field(&r, "deadline").and_then(Value::as_protocol_int),
        Some(T0 + 3_600_000)
    );
}

#[test]
fn automatic_retries_back_off_exponentially_with_jitter_and_never_loop_immediately() {
    let (mut w, a, _, alice, bob) = setup(43);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let mut bodies = Vec::new();
    for n in 1..=8u32 {
        let req = w.outbox.last().cloned().unwrap();
        bodies.push(req.body.clone());
        let now = w.clock(a);
        let next = fail_once(&mut w, a, Outcome::Unknown).unwrap();
        let wait = next - now;
        let window = (RETRY_INITIAL << (n - 1)).min(RETRY_MAX);
        assert!(
            wait >= RETRY_INITIAL,
            "attempt {n}: waited {wait} ms, no immediate loop"
        );
        assert!(
            wait <= window,
            "attempt {n}: waited {wait} ms > window {window}"
        );
        w.now = next;
        w.tick(a);
    }
    assert!(
        bodies.windows(2).all(|b| b[0] == b[1]),
        "every retry sends the identical request"
    );
}

#[test]
fn an_unknown_outcome_is_confirmed_by_retrying_the_unchanged_request_to_the_same_target() {
    let (mut w, a, b, alice, mut bob) = setup(44);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    // The destination accepted, but the response was lost.
    let caller = Caller::relay_at(w.nodes[a].id.clone(), req.route_revision);
    w.call_raw(b, &caller, "message.deliver", &req.body)
        .result
        .unwrap();
    w.outcome(a, &req.task, req.attempt, Outcome::Unknown);
    // Meanwhile a higher route for bob becomes known at the source; no switch after an unknown outcome.
    let c = w.relay("c");
    w.migrate(&mut bob, c);
    w.publish_route(a, &bob);
    w.run_for(5_000);
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    // b now answers not_home_relay? No: b still receives the retry with the same key and returns the stored receipt.
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(b, &bob), 1);
    assert_eq!(
        w.record_count(c, &bob),
        0,
        "never delivered to another relay"
    );
}

#[test]
fn rate_limited_with_retry_after_waits_at_least_that_long() {
    let (mut w, a, _, alice, bob) = setup(45);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let now = w.clock(a);
    let next = fail_once(
        &mut w,
        a,
        Outcome::Error(error_body("rate_limited", Some("{\"retry_after\":45000}"))),
    )
    .unwrap();
    assert!(next >= now + 45_000, "waited {} ms", next - now);
    w.now = next - 1;
    w.tick(a);
    assert!(w.outbox.is_empty(), "no attempt before retry_after");
    w.now = next;
    w.tick(a);
    assert_eq!(w.outbox.len(), 1);
    w.pump();
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn a_wait_hint_beyond_the_deadline_ends_delivery_at_the_deadline_without_retrying() {
    let (mut w, a, _, alice, bob) = setup(46);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    let r = w.send(&alice, 0, &m).result.unwrap();
    let deadline = field(&r, "deadline")
        .and_then(Value::as_protocol_int)
        .unwrap();
    let next = fail_once(
        &mut w,
        a,
        Outcome::Error(error_body(
            "rate_limited",
            Some("{\"retry_after\":9000000}"),
        )),
    )
    .unwrap();
    assert_eq!(next, deadline, "woken at the deadline, not after it");
    w.now = deadline;
    w.tick(a);
    assert!(w.outbox.is_empty(), "no attempt at or after the deadline");
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert_eq!(
        error_of(&s),
        ("deadline_exceeded".into(), Some("rate_limited".into()))
    );
}

#[test]
fn at_the_deadline_an_unfinished_delivery_fails_with_deadline_exceeded_and_result_unknown() {
    let (mut w, a, _, alice, bob) = setup(47);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    // Every attempt times out: the network swallows requests.
    let end = T0 + 700_000;
    let mut sends = Vec::new();
    while let Some(next) = next_attempt(&mut w, a) {
        sends.extend(w.take_outbox().into_iter().map(|r| (w.clock(a), r)));
        assert!(next <= end);
        w.now = next.max(w.now + 1);
        w.tick(a);
    }
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert_eq!(
        error_of(&s),
        ("deadline_exceeded".into(), Some("result_unknown".into()))
    );
    let deadline = T0 + 600_000;
    assert!(
        sends.iter().all(|(at, _)| *at < deadline),
        "no deliver after the deadline"
    );
    assert!(sends.len() > 3);
}

#[test]
fn terminal_states_never_change_and_late_responses_do_not_alter_them() {
    let (mut w, a, b, alice, bob) = setup(48);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    w.outcome(
        a,
        &req.task,
        req.attempt,
        Outcome::Error(error_body("device_unknown", None)),
    );
    let failed = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&failed), "failed");
    assert_eq!(
        error_of(&failed).0,
        "device_unknown",
        "the destination's rejection as it came"
    );
    // A late success for the same attempt, and a real acceptance afterwards, change nothing.
    let caller = Caller::relay_at(w.nodes[a].id.clone(), req.route_revision);
    let ok = w.call_raw(b, &caller, "message.deliver", &req.body);
    w.outcome(a, &req.task, req.attempt, Outcome::Result(ok.body()));
    w.run_for(100_000);
    assert_eq!(w.status(&alice, &message_id(&m)).result.unwrap(), failed);
    assert!(w.outbox.is_empty());
}

#[test]
fn a_success_answer_that_is_not_target_accepted_for_this_message_is_an_unknown_outcome() {
    let (mut w, a, _, alice, bob) = setup(49);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let req = w.take_outbox().pop().unwrap();
    w.outcome(
        a,
        &req.task,
        req.attempt,
        Outcome::Result(b"{\"status\":\"target_accepted\"}".to_vec()),
    );
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "delivering"
    );
    w.run_for(5_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
}

#[test]
fn route_error_with_a_higher_revision_switches_the_target() {
    let (mut w, _a, b, alice, mut bob) = setup(50);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let c = w.relay("c");
    w.migrate(&mut bob, c);
    w.publish_route(b, &bob); // the old home learns the account moved
    w.pump();
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(w.record_count(c, &bob), 1);
    assert_eq!(w.record_count(b, &bob), 0);
}

#[test]
fn route_error_without_a_higher_revision_fails_the_delivery() {
    let (mut w, a, _, alice, bob) = setup(51);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let route = canonical_route(&w, &bob);
    let next = fail_once(
        &mut w,
        a,
        Outcome::Error(error_body(
            "not_home_relay",
            Some(&format!("{{\"route\":{route}}}")),
        )),
    );
    let _ = next;
    assert!(w.outbox.is_empty(), "no switch to the same revision");
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "failed");
    assert_eq!(error_of(&s).0, "not_home_relay");
}

fn canonical_route(w: &World, acct: &Account) -> String {
    relay_core::wire::canonical::to_string(&Value::Object(w.route_of(acct)))
}

#[test]
fn route_error_without_data_route_asks_the_old_target_with_route_get() {
    let (mut w, a, b, alice, mut bob) = setup(52);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let c = w.relay("c");
    w.migrate(&mut bob, c);
    w.publish_route(b, &bob);
    let req = w.take_outbox().pop().unwrap();
    w.outcome(
        a,
        &req.task,
        req.attempt,
        Outcome::Error(error_body("not_home_relay", None)),
    );
    let get = w.outbox.last().cloned().expect("a route.get");
    assert_eq!(get.method, PeerMethod::RouteGet);
    assert_eq!(get.target, w.nodes[b].id);
    w.pump();
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(w.record_count(c, &bob), 1);
}

#[test]
fn receipt_known_not_attempted_may_switch_to_a_higher_route() {
    let (mut w, a, _, alice, mut bob) = setup(53);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let c = w.relay("c");
    w.migrate(&mut bob, c);
    w.publish_route(a, &bob);
    let req = w.take_outbox().pop().unwrap();
    w.outcome(a, &req.task, req.attempt, Outcome::NotAttempted);
    let next = w.outbox.last().cloned().expect("attempt at the new target");
    assert_eq!(next.target, w.nodes[c].id);
    assert_eq!(next.body, req.body, "unchanged request");
    w.pump();
    assert_eq!(w.record_count(c, &bob), 1);
}

#[test]
fn responsibility_survives_a_restart_and_resumes_at_the_next_attempt_time() {
    let (mut w, a, b, alice, bob) = setup(54);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    w.take_outbox(); // the process dies before sending
    w.nodes[a].restart(7);
    assert!(
        w.nodes[a].wake.is_some(),
        "the new engine knows when to wake"
    );
    w.run_for(60_000);
    assert_eq!(
        status_of(&w.status(&alice, &message_id(&m)).result.unwrap()),
        "target_accepted"
    );
    assert_eq!(w.record_count(b, &bob), 1);
    let _ = Object::new();
}

/// Seed "Delivery Result Confirmation" across a restart ("the source's responsibility ...
/// survives relay restarts"): an attempt in flight when the relay's process stopped will
/// get no answer. At the new process's first tick (`Config::started_at`, set by every host
/// at start) its outcome is unknown, and the unchanged request is retried to the same target
/// after the usual backoff, not after the attempt timeout. A trap recovery keeps the process
/// (and its attempts, whose answers still come): it leaves them in flight.
#[test]
fn an_attempt_in_flight_when_the_process_stopped_is_an_unknown_outcome_at_the_next_start() {
    let (mut w, a, _, alice, bob) = setup(48);
    let timeout = w.nodes[a].config.attempt_timeout;
    w.nodes[a].config.started_at = Some(w.clock(a));
    w.nodes[a].restart(1);
    let m = w.message(&alice, 0, &bob, "x", &Msg::default());
    w.send(&alice, 0, &m).result.unwrap();
    let lost = w.take_outbox().pop().expect("an attempt in flight");
    let sent = w.clock(a);

    // A trap recovery: a new engine over the same storage, the same process start.
    w.now += 1_000;
    w.nodes[a].restart(2);
    w.tick(a);
    w.now += RETRY_INITIAL;
    w.tick(a);
    assert!(
        w.outbox.is_empty(),
        "an attempt of this process stays in flight"
    );

    // The process restarts: the attempt it carried is an unknown outcome at once.
    w.now += 1_000;
    w.nodes[a].config.started_at = Some(w.clock(a));
    w.nodes[a].restart(3);
    w.tick(a);
    w.now += RETRY_INITIAL;
    w.tick(a);
    let retry = w
        .take_outbox()
        .pop()
        .expect("the orphaned attempt is retried");
    assert!(w.clock(a) < sent + timeout, "before its attempt timeout");
    assert_eq!(
        (&retry.task, retry.attempt, &retry.target, &retry.body),
        (&lost.task, lost.attempt + 1, &lost.target, &lost.body),
        "the unchanged request, to the same target"
    );
    let counted = w.nodes[a]
        .engine
        .metrics(w.now)
        .expect("metrics")
        .counters
        .attempts;
    assert_eq!(
        (counted.get("orphaned"), counted.get("timeout")),
        (Some(&1), None),
        "counted as orphaned by the restart, not as a timeout"
    );
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "delivering");
    // The answer of the lost attempt, were it to come now, is ignored.
    w.outcome(a, &lost.task, lost.attempt, Outcome::Unknown);
    w.carry(retry);
    w.pump();
    let s = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(status_of(&s), "target_accepted");
    assert_eq!(w.record_count(1, &bob), 1);
}

/// The sweep of attempts orphaned by a restart is bounded per tick (`tick_batch` due
/// entries) and goes on past its cursor, tick after tick, until every orphan is taken.
#[test]
fn orphaned_attempts_are_swept_one_page_per_tick_until_none_is_left() {
    let (mut w, a, _, alice, bob) = setup(49);
    w.nodes[a].config.tick_batch = 2;
    w.nodes[a].config.started_at = Some(w.clock(a));
    w.nodes[a].restart(1);
    let mut lost = Vec::new();
    for i in 0..5 {
        let m = w.message(&alice, 0, &bob, &format!("m{i}"), &Msg::default());
        w.send(&alice, 0, &m).result.unwrap();
        lost.extend(w.take_outbox());
    }
    assert_eq!(lost.len(), 5, "five attempts in flight");
    w.now += 1_000;
    w.nodes[a].config.started_at = Some(w.clock(a));
    w.nodes[a].restart(2);
    // Each tick takes at most one page; the sweep asks for the next tick at once.
    for _ in 0..6 {
        w.tick(a);
    }
    assert!(w.outbox.is_empty(), "retries wait for their backoff");
    w.now += RETRY_INITIAL;
    w.tick(a);
    w.tick(a);
    w.tick(a);
    let mut retried: Vec<(String, u32)> = w
        .take_outbox()
        .into_iter()
        .map(|r| (r.task, r.attempt))
        .collect();
    retried.sort();
    let mut want: Vec<(String, u32)> = lost
        .iter()
        .map(|r| (r.task.clone(), r.attempt + 1))
        .collect();
    want.sort();
    assert_eq!(retried, want, "every orphan retried once");
}
