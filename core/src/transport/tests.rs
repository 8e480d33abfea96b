//! The transport on its own: two relays in memory, requests as a host would hand them over.

use super::*;
use crate::engine::{Config, MemoryStore, PeerMethod};

type Counter = Box<dyn FnMut(&mut [u8])>;
type Mem = Relay<MemoryStore, Counter>;

const A: &str = "http://a.example";
const B: &str = "http://b.example";
const TOKEN: &str = "operator-token";
const T0: u64 = 1_700_000_000_000;

/// A relay whose entropy is a counter from `seed`: every run replays exactly.
fn relay(id: &str, seed: u8) -> Mem {
    sharded(id, seed, crate::engine::shard::Shard::SINGLE)
}

/// Shard `shard` of relay `id`, as [`relay`] makes one.
fn sharded(id: &str, seed: u8, shard: crate::engine::shard::Shard) -> Mem {
    let mut config = Config::new(RelayId::parse(id).unwrap(), "dev");
    config.shard = shard;
    configured(config, seed)
}

/// A relay of `config` over memory, its entropy a counter from `seed`.
fn configured(config: Config, seed: u8) -> Mem {
    let mut n = seed as u64;
    let entropy: Counter = Box::new(move |buf: &mut [u8]| {
        for b in buf.iter_mut() {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (n >> 56) as u8;
        }
    });
    let mut engine = Engine::new(config, MemoryStore::default(), entropy);
    engine.open_store().unwrap();
    Relay::new(engine, &[seed; 32], Some(TOKEN))
}

fn req(listener: Listener, method: &str, path: &str, body: &[u8]) -> Request {
    Request {
        listener,
        method: method.into(),
        path: path.into(),
        query: String::new(),
        headers: Vec::new(),
        body: body.to_vec(),
        origin: Some("192.0.2.1".into()),
    }
}

/// `GET /v1/ws` asking to become a WebSocket.
fn upgrade_req() -> Request {
    let mut r = req(Listener::Public, "GET", "/v1/ws", b"");
    r.headers.push(("connection".into(), "Upgrade".into()));
    r.headers.push(("upgrade".into(), "websocket".into()));
    r
}

/// Handles a request under ticket 0 (tests that park several name their own).
trait Ask {
    fn ask(&mut self, req: &Request, now: u64) -> Step;
}

impl Ask for Mem {
    fn ask(&mut self, req: &Request, now: u64) -> Step {
        self.handle(req, 0, now)
    }
}

/// The HTTP answers a report handed back, with their tickets.
fn answered(resumed: Vec<Resumed>) -> Vec<(u32, Response)> {
    resumed
        .into_iter()
        .map(|r| match r.resumption {
            Resumption::Step(Step::Respond(a)) => (r.ticket, a),
            other => panic!("expected an answer for {}, got {other:?}", r.ticket),
        })
        .collect()
}

/// The one HTTP answer a report handed back.
fn only(resumed: Vec<Resumed>) -> Response {
    let mut a = answered(resumed);
    assert_eq!(a.len(), 1, "{a:?}");
    a.remove(0).1
}

/// A parked step that starts nothing: a fetch it waits for is under way.
const WAITS: Step = Step::Parked(Parked { start: None });

fn respond(s: Step) -> Response {
    match s {
        Step::Respond(r) => r,
        other => panic!("expected an answer, got {other:?}"),
    }
}

fn code(r: &Response) -> String {
    let v = json::parse(&r.body).unwrap();
    let e = v
        .as_object()
        .unwrap()
        .get("error")
        .unwrap()
        .as_object()
        .unwrap();
    e.get("code").unwrap().as_str().unwrap().to_string()
}

/// A signed relay request from `from` to `to` as `from`'s transport builds it.
fn relay_request(from: &mut Mem, to: &str, method: PeerMethod, body: &[u8], now: u64) -> Request {
    let events = from.events(
        vec![Effect::Send {
            task: "t".into(),
            attempt: 1,
            target: RelayId::parse(to).unwrap(),
            method,
            body: body.to_vec(),
            shard: None,
            route_revision: (method == PeerMethod::Deliver).then_some(1),
            riders: Vec::new(),
        }],
        now,
    );
    let Event::Send(p) = &events[0] else {
        panic!("not a send: {events:?}")
    };
    let path = p.url.strip_prefix(to).unwrap().to_string();
    let mut r = req(Listener::Public, "POST", &path, &p.body);
    r.headers = p
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect();
    r
}

const ROUTE_GET: &[u8] = br#"{"account":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#;

#[test]
fn well_known_and_unknown_endpoints() {
    let mut a = relay(A, 1);
    let r = respond(a.ask(&req(Listener::Public, "GET", "/.well-known/relay", b""), T0));
    assert_eq!(r.status, 200);
    let id = RelayId::parse(A).unwrap();
    assert_eq!(
        relay_request::parse_well_known(&r.body, &id, "dev").unwrap(),
        a.public_key()
    );
    for (m, p) in [
        ("GET", "/v1/message.send"),
        ("POST", "/nowhere"),
        ("POST", "/v1/"),
        ("POST", "/v1/a/b"),
        ("POST", "/admin/v1/deliveries"),
    ] {
        let r = respond(a.ask(&req(Listener::Public, m, p, b"{}"), T0));
        assert_eq!((r.status, code(&r).as_str()), (404, "not_found"), "{m} {p}");
    }
}

#[test]
fn the_body_is_judged_before_the_door() {
    let mut a = relay(A, 1);
    let r = respond(a.ask(
        &req(Listener::Public, "POST", "/v1/route.get", b"{\"a\":"),
        T0,
    ));
    assert_eq!(r.status, 400);
    let r = respond(a.ask(
        &req(Listener::Public, "POST", "/relay/v1/route.get", b"[]"),
        T0,
    ));
    assert_eq!(r.status, 400);
    // The size limit comes before the parser: an over-long body is never parsed.
    let limit = a.engine().config().policies.max_request_bytes as usize;
    let mut long = b"{\"a\":".to_vec();
    long.resize(limit + 1, b'[');
    let r = respond(a.ask(&req(Listener::Public, "POST", "/v1/route.get", &long), T0));
    assert_eq!((r.status, code(&r).as_str()), (413, "payload_too_large"));
}

#[test]
fn admin_methods_only_through_the_operator_door() {
    let mut a = relay(A, 1);
    let r = respond(a.ask(
        &req(Listener::Public, "POST", "/v1/admin.deliveries", b"{}"),
        T0,
    ));
    assert_eq!((r.status, code(&r).as_str()), (404, "not_found"));
    let mut op = req(Listener::Admin, "POST", "/admin/v1/deliveries", b"{}");
    let r = respond(a.ask(&op, T0));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
    op.headers = vec![("authorization".into(), "Bearer wrong".into())];
    assert_eq!(respond(a.ask(&op, T0)).status, 401);
    op.headers = vec![("authorization".into(), format!("Bearer {TOKEN}"))];
    assert_eq!(respond(a.ask(&op, T0)).status, 200);
    let mut backup = req(
        Listener::Admin,
        "POST",
        "/admin/v1/backup",
        br#"{"path":"/tmp/x.db"}"#,
    );
    backup.headers = op.headers.clone();
    assert_eq!(
        a.ask(&backup, T0),
        Step::Backup {
            path: "/tmp/x.db".into()
        }
    );
    backup.body = br#"{"path":"x.db"}"#.to_vec();
    assert_eq!(respond(a.ask(&backup, T0)).status, 400);
    // Client methods are not the operator's.
    let mut other = req(Listener::Admin, "POST", "/admin/v1/message.send", b"{}");
    other.headers = op.headers.clone();
    assert_eq!(respond(a.ask(&other, T0)).status, 404);
}

#[test]
fn requests_waiting_for_a_relays_key_are_parked_and_share_one_fetch() {
    let mut a = relay(A, 1);
    let mut b = relay(B, 2);
    let first = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    let second = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    let fetch = Step::Parked(Parked {
        start: Some(Need::Key {
            relay: A.into(),
            url: format!("{A}/.well-known/relay"),
            timeout_ms: 20_000,
        }),
    });
    assert_eq!(b.handle(&first, 1, T0), fetch);
    // Another request meanwhile waits in the core for the same fetch: nothing to start.
    assert_eq!(b.handle(&second, 2, T0), WAITS);
    assert_eq!((b.key_fetches(), b.parked()), (1, 2));
    // The report answers both, in the order they came: authenticated, so route.get
    // answers (no route here), not 401.
    let resumed = answered(b.key_fetched(A, Fetch::Answered(200, a.well_known()), T0 + 5));
    let seen: Vec<_> = resumed
        .iter()
        .map(|(t, r)| (*t, r.status, code(r)))
        .collect();
    assert_eq!(
        seen,
        [(1, 404, "not_found".into()), (2, 404, "not_found".into())]
    );
    assert_eq!(b.parked(), 0);
    // A replay is refused, and the refusal does not start a fetch within the interval.
    let r = respond(b.ask(&first, T0 + 7));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
    assert_eq!(b.key_fetches(), 1);
}

#[test]
fn a_sibling_shard_is_authenticated_by_the_relays_own_key_and_an_impostor_is_not() {
    use crate::engine::shard::Shard;
    let mut s0 = sharded(A, 1, Shard::new(0, 2).unwrap());
    let mut s1 = sharded(A, 1, Shard::new(1, 2).unwrap());
    let from_sibling = relay_request(&mut s0, A, PeerMethod::RouteGet, ROUTE_GET, T0);
    // No key fetch: the sibling signs with this relay's key.
    let r = respond(s1.ask(&from_sibling, T0));
    assert_eq!((r.status, code(&r).as_str()), (404, "not_found"));
    assert_eq!(s1.key_fetches(), 0);
    // Another key claiming this relay's id is refused, and starts no fetch either.
    let mut impostor = sharded(A, 9, Shard::new(0, 2).unwrap());
    let forged = relay_request(&mut impostor, A, PeerMethod::RouteGet, ROUTE_GET, T0);
    let r = respond(s1.ask(&forged, T0));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
    assert_eq!(s1.key_fetches(), 0);
}

#[test]
fn a_sibling_shards_send_is_unsigned_and_runs_as_the_relays_own_call() {
    use crate::engine::shard::Shard;
    let mut s0 = sharded(A, 1, Shard::new(0, 2).unwrap());
    let mut s1 = sharded(A, 1, Shard::new(1, 2).unwrap());
    let send = |shard| Effect::Send {
        task: "t".into(),
        attempt: 1,
        target: RelayId::parse(A).unwrap(),
        method: PeerMethod::RouteGet,
        body: ROUTE_GET.to_vec(),
        shard,
        route_revision: None,
        riders: Vec::new(),
    };
    // To a sibling: no relay authentication headers (nothing signed, no nonce drawn).
    let events = s0.events(vec![send(Some(1))], T0);
    let Event::Send(p) = &events[0] else {
        panic!("not a send: {events:?}")
    };
    assert!(p.headers.is_empty(), "{:?}", p.headers);
    assert_eq!(p.shard, Some(1));
    // Over the network the same effect is signed.
    let Event::Send(signed) = &s0.events(vec![send(None)], T0)[0] else {
        panic!("not a send")
    };
    assert!(signed.headers.len() > 1);
    // The sibling runs it as the relay's own call: the route.get answer, with no key fetch.
    let r = s1.sibling(&p.url, &p.body, T0);
    assert_eq!((r.status, code(&r).as_str()), (404, "not_found"));
    assert_eq!(s1.key_fetches(), 0);
    // Only this relay's relay methods: another relay's url, a client method, a bad body.
    let other = s1.sibling(&format!("{B}/relay/v1/route.get"), ROUTE_GET, T0);
    assert_eq!((other.status, code(&other).as_str()), (404, "not_found"));
    let client = s1.sibling(&format!("{A}/relay/v1/message.send"), b"{}", T0);
    assert_eq!(client.status, 404);
    let bad = s1.sibling(&p.url, b"{\"account\":", T0);
    assert_eq!((bad.status, code(&bad).as_str()), (400, "invalid_params"));
}

#[test]
fn relay_requests_are_checked_before_any_fetch() {
    let mut a = relay(A, 1);
    let mut b = relay(B, 2);
    let mut r = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    // Not a relay method.
    r.path = "/relay/v1/message.send".into();
    assert_eq!(respond(b.ask(&r, T0)).status, 404);
    // Headers missing.
    let mut bare = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    bare.headers.retain(|(k, _)| k != "relay-nonce");
    assert_eq!(respond(b.ask(&bare, T0)).status, 401);
    // Stale timestamp.
    let old = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    assert_eq!(respond(b.ask(&old, T0 + 3_600_000)).status, 401);
    assert_eq!(b.key_fetches(), 0);
    // Addressed to another relay: only the signature, which covers `to`, can tell.
    let elsewhere = relay_request(
        &mut a,
        "http://c.example",
        PeerMethod::RouteGet,
        ROUTE_GET,
        T0,
    );
    assert!(matches!(b.ask(&elsewhere, T0), Step::Parked(_)));
    let r = only(b.key_fetched(A, Fetch::Answered(200, a.well_known()), T0));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
}

#[test]
fn a_failed_fetch_is_remembered_and_fetches_are_capped() {
    let mut a = relay(A, 1);
    let mut b = relay(B, 2);
    let r1 = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    assert!(matches!(b.ask(&r1, T0), Step::Parked(_)));
    let r = only(b.key_fetched(A, Fetch::NotSent, T0));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
    let r2 = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0 + 2);
    assert_eq!(respond(b.ask(&r2, T0 + 2)).status, 401);
    assert_eq!(b.key_fetches(), 1);
    // A document naming another relay is a failure too.
    let mut c = relay("http://c.example", 3);
    let rc = relay_request(&mut c, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    assert!(matches!(b.ask(&rc, T0), Step::Parked(_)));
    let r = only(b.key_fetched("http://c.example", Fetch::Answered(200, a.well_known()), T0));
    assert_eq!(r.status, 401);
    // Eight relays' fetches in flight: the ninth is told to come back.
    for i in 0..keys::FETCH_CONCURRENCY {
        let id = format!("http://r{i}.example");
        let mut r = relay(&id, 10 + i as u8);
        let q = relay_request(&mut r, B, PeerMethod::RouteGet, ROUTE_GET, T0);
        assert!(matches!(
            b.handle(&q, 10 + i as u32, T0),
            Step::Parked(Parked { start: Some(_) })
        ));
    }
    let mut late = relay("http://late.example", 99);
    let q = relay_request(&mut late, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    let r = respond(b.ask(&q, T0));
    assert_eq!((r.status, code(&r).as_str()), (503, "unavailable"));
    assert!(r.headers.contains(&("retry-after", "1".to_string())));
}

#[test]
fn a_request_waits_at_most_rounds_times_then_is_answered_busy() {
    let mut b = relay(B, 2);
    // A frame whose call waits for a sibling shard's route, every time it runs.
    let frame = r#"{"id":1,"method":"message.timeline.sync","params":{}}"#;
    b.engine.want_route("acc");
    let first = b.message("tok", None, frame, 7, T0);
    let route = Need::Route(RouteWanted {
        account: "acc".into(),
        shard: 0,
    });
    assert_eq!(
        (first.text.as_str(), first.parked),
        (
            "",
            Some(Parked {
                start: Some(route.clone())
            })
        )
    );
    for round in 1..ROUNDS {
        b.engine.want_route("acc");
        let again = b.route_fetched("acc", Fetch::NotSent, T0);
        assert_eq!(again.len(), 1, "round {round}");
        assert_eq!(again[0].ticket, 7);
        let Resumption::Frame(a) = &again[0].resumption else {
            panic!("a frame comes back as a frame")
        };
        // Parked again under the same ticket; its own fetch is over, so it starts another.
        assert_eq!(
            a.parked,
            Some(Parked {
                start: Some(route.clone())
            }),
            "round {round}"
        );
    }
    // Past its rounds: the busy frame, nothing accepted, nothing parked or fetched.
    b.engine.want_route("acc");
    let last = b.route_fetched("acc", Fetch::NotSent, T0);
    let Resumption::Frame(a) = &last[0].resumption else {
        panic!("a frame comes back as a frame")
    };
    assert_eq!((&a.text, &a.parked), (&socket::busy_frame(frame), &None));
    assert_eq!(b.parked(), 0);
    // The same call over HTTP: parked, and a second one waits for the same route.
    let mut sync = req(Listener::Public, "POST", "/v1/message.timeline.sync", b"{}");
    sync.headers
        .push(("authorization".into(), "Bearer tok".into()));
    b.engine.want_route("acc");
    assert_eq!(
        b.handle(&sync, 1, T0),
        Step::Parked(Parked {
            start: Some(route.clone())
        })
    );
    b.engine.want_route("acc");
    assert_eq!(b.handle(&sync, 2, T0), WAITS);
    // The route came (a failure, here): both run again, and answer (the session is unknown).
    let done = answered(b.route_fetched("acc", Fetch::NotSent, T0));
    let seen: Vec<_> = done.iter().map(|(t, r)| (*t, r.status)).collect();
    assert_eq!(seen, [(1, 401), (2, 401)]);
    // What the host hands the sibling shard: route.get of the account, as the core reads it.
    let w = RouteWanted {
        account: "acc".into(),
        shard: 1,
    };
    let ask = w.request();
    assert_eq!(ask.route(), Route::Call(Door::Client, "route.get"));
    assert_eq!(ask.body, br#"{"account":"acc"}"#);
}

#[test]
fn the_parked_requests_are_bounded_and_one_no_report_reached_is_answered_busy() {
    let mut a = relay(A, 1);
    let mut b = relay(B, 2);
    let r = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    assert!(matches!(b.handle(&r, 0, T0), Step::Parked(_)));
    // A ticket already waiting is not parked twice: busy, to the byte.
    assert_eq!(b.handle(&r, 0, T0), Step::Respond(Response::busy()));
    for t in 1..parking::MAX_PARKED as u32 {
        assert_eq!(b.handle(&r, t, T0), WAITS, "ticket {t}");
    }
    assert_eq!(b.parked(), parking::MAX_PARKED);
    // Full: busy, and no fetch started for it.
    let mut c = relay("http://c.example", 3);
    let rc = relay_request(&mut c, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    let t = parking::MAX_PARKED as u32;
    assert_eq!(b.handle(&rc, t, T0), Step::Respond(Response::busy()));
    let frame = r#"{"id":1,"method":"message.timeline.sync","params":{}}"#;
    b.engine.want_route("acc");
    let busy = b.message("tok", None, frame, t + 1, T0);
    assert_eq!((busy.text, busy.parked), (socket::busy_frame(frame), None));
    assert_eq!(b.key_fetches(), 1);
    // No report of A's key came; one of another relay's, late enough, answers them busy.
    let late = T0 + parking::PARK_ABANDONED;
    let resumed = answered(b.key_fetched("http://c.example", Fetch::NotSent, late));
    assert_eq!(resumed.len(), parking::MAX_PARKED);
    assert!(resumed.iter().all(|(_, r)| *r == Response::busy()));
    assert_eq!(b.parked(), 0);
}

#[test]
fn a_key_that_no_longer_verifies_is_refreshed_once_per_interval() {
    let mut a = relay(A, 1);
    let mut b = relay(B, 2);
    let r1 = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    assert!(matches!(b.ask(&r1, T0), Step::Parked(_)));
    let r = only(b.key_fetched(A, Fetch::Answered(200, a.well_known()), T0));
    assert_eq!(r.status, 404);
    // A rotates its key (same id, new seed).
    let mut a2 = relay(A, 7);
    let later = T0 + keys::FETCH_INTERVAL;
    let r2 = relay_request(&mut a2, B, PeerMethod::RouteGet, ROUTE_GET, later);
    assert!(matches!(b.ask(&r2, later), Step::Parked(_)));
    let r = only(b.key_fetched(A, Fetch::Answered(200, a2.well_known()), later));
    assert_eq!(r.status, 404);
    assert_eq!(b.key_fetches(), 2);
}

#[test]
fn outbound_requests_are_signed_and_replay_exactly() {
    let mut a = relay(A, 1);
    let mut a_again = relay(A, 1);
    let send = |r: &mut Mem| {
        r.events(
            vec![Effect::Send {
                task: "task".into(),
                attempt: 3,
                target: RelayId::parse(B).unwrap(),
                method: PeerMethod::Deliver,
                body: b"{}".to_vec(),
                shard: None,
                route_revision: Some(2),
                riders: Vec::new(),
            }],
            T0,
        )
    };
    let one = send(&mut a);
    assert_eq!(one, send(&mut a_again), "same inputs, same bytes");
    let Event::Send(p) = &one[0] else { panic!() };
    assert_eq!(p.url, format!("{B}/relay/v1/message.deliver"));
    assert_eq!(p.timeout_ms, 20_000);
    let names: Vec<_> = p.headers.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        [
            "content-type",
            "Relay-Id",
            "Relay-Timestamp",
            "Relay-Nonce",
            "Relay-Signature",
            "Relay-Route-Revision"
        ]
    );
    assert!(p
        .headers
        .contains(&("Relay-Route-Revision", "2".to_string())));
    // Nonces differ from one request to the next.
    assert_ne!(one, send(&mut a));
}

#[test]
fn websocket_upgrade_and_messages() {
    let mut a = relay(A, 1);
    let r = respond(a.ask(&upgrade_req(), T0));
    assert_eq!((r.status, code(&r).as_str()), (401, "unauthenticated"));
    let mut up = upgrade_req();
    up.query = "session=nope".into();
    assert_eq!(respond(a.ask(&up, T0)).status, 401);

    let garbage = a.message("tok", None, "not json", 0, T0);
    assert!(garbage.text.starts_with(r#"{"error""#) && garbage.text.ends_with(r#""id":null}"#));
    assert_eq!(garbage.close, None);
    let admin = a.message(
        "tok",
        None,
        r#"{"id":1,"method":"admin.deliveries","params":{}}"#,
        0,
        T0,
    );
    assert!(admin.text.contains("not_found"), "{}", admin.text);
    let ended = a.message(
        "tok",
        None,
        r#"{"id":"x","method":"message.timeline.sync","params":{}}"#,
        0,
        T0,
    );
    assert_eq!(ended.close, Some((4401, "session ended")));
    assert!(ended.text.contains(r#""id":"x""#));
}

#[test]
fn a_tick_reports_its_next_wake_up() {
    let mut a = relay(A, 1);
    let t = a.tick(T0);
    assert_eq!(t.error, None);
    assert!(t.quarantined.is_empty());
    assert!(t.events.iter().all(|e| matches!(e, Event::WakeAt(_))));
}

#[test]
fn notifications_and_revocations_become_frames_and_closes() {
    let mut a = relay(A, 1);
    let e = a.events(
        vec![
            Effect::Notify {
                account: "acc".into(),
                latest_seq: 9,
            },
            Effect::EndDeviceSessions {
                account: "acc".into(),
                device_id: "dev".into(),
            },
        ],
        T0,
    );
    assert_eq!(
        e,
        vec![
            Event::Notify {
                account: "acc".into(),
                latest_seq: 9,
                frame: r#"{"method":"message.timeline.changed","params":{"account":"acc","latest_seq":9}}"#.into(),
            },
            Event::Close {
                account: "acc".into(),
                device_id: "dev".into(),
                code: 4401,
                reason: "device revoked",
            },
        ]
    );
}

/// Every exchange a host makes for the core (a send, a key fetch) ends within the time the
/// core names: two thirds of the attempt timeout, so the host's verdict arrives before the
/// core's own timer decides, never above 20 s, never zero.
#[test]
fn the_core_names_the_time_of_every_exchange() {
    use super::{exchange_timeout, MAX_EXCHANGE_MS};
    assert_eq!(exchange_timeout(1_500), 1_000);
    assert_eq!(exchange_timeout(30_000), 20_000);
    assert_eq!(exchange_timeout(90_000), MAX_EXCHANGE_MS);
    assert_eq!(exchange_timeout(0), 1);
    // A key fetch under a short attempt timeout carries that timeout's two thirds.
    let mut config = Config::new(RelayId::parse(B).unwrap(), "dev");
    config.attempt_timeout = 1_500;
    let mut a = relay(A, 1);
    let request = relay_request(&mut a, B, PeerMethod::RouteGet, ROUTE_GET, T0);
    let mut b = configured(config, 2);
    let Step::Parked(Parked {
        start: Some(Need::Key { timeout_ms, .. }),
    }) = b.ask(&request, T0)
    else {
        panic!("an unknown source's key is fetched")
    };
    assert_eq!(timeout_ms, 1_000);
}

/// `Ahead` on a relay of `config`, and that relay.
fn ahead_of(
    config: Config,
    memory: Option<std::sync::Arc<crate::wire::preverify::Memory>>,
) -> (ahead::Ahead, Mem) {
    (ahead::Ahead::new(&config, memory), configured(config, 1))
}

#[test]
fn ahead_answers_only_what_the_core_answers_without_its_state_and_exactly_as_it_does() {
    let mut config = Config::new(RelayId::parse(A).unwrap(), "dev");
    config.policies.max_request_bytes = 64;
    let (ahead, mut a) = ahead_of(config, None);
    let mut answered = vec![
        req(Listener::Public, "POST", "/v1/no/such", b"{}"),
        req(Listener::Public, "GET", "/v1/message.send", b""),
        // `GET /v1/ws` that does not ask to upgrade.
        req(Listener::Public, "GET", "/v1/ws", b""),
        req(Listener::Public, "POST", "/v1/", b"{}"),
        req(Listener::Admin, "POST", "/v1/route.get", ROUTE_GET),
        req(Listener::Public, "POST", "/v1/route.get", &[b' '; 65]),
        req(Listener::Public, "POST", "/v1/message.send", b"{"),
        req(
            Listener::Public,
            "POST",
            "/relay/v1/message.deliver",
            b"{\"a\":1,\"a\":2}",
        ),
        req(Listener::Admin, "POST", "/admin/v1/status", b"[]"),
    ];
    for r in answered.drain(..) {
        let ahead::Verdict::Answer(early) = ahead.request(&r, T0) else {
            panic!("{} {} is answered ahead", r.method, r.path)
        };
        assert_eq!(early, respond(a.ask(&r, T0)), "{} {}", r.method, r.path);
    }
    // What needs the core's state goes on to it, and nothing is verified without a memory.
    for r in [
        req(Listener::Public, "POST", "/v1/route.get", ROUTE_GET),
        req(Listener::Public, "GET", "/.well-known/relay", b""),
        upgrade_req(),
        req(Listener::Admin, "POST", "/admin/v1/status", b"{}"),
    ] {
        assert_eq!(
            ahead.request(&r, T0),
            ahead::Verdict::Core { sending: None },
            "{}",
            r.path
        );
    }
}

#[cfg(feature = "client")]
#[test]
fn ahead_verifies_a_deliver_only_when_its_headers_pass_the_cores_cheap_checks() {
    use crate::client::draft;
    use crate::wire::preverify::Memory;
    let memory = std::sync::Arc::new(Memory::default());
    let (ahead, _) = ahead_of(
        Config::new(RelayId::parse(A).unwrap(), "dev"),
        Some(memory.clone()),
    );
    let mut b = relay(B, 2);
    let (alice, _, phone, env) = draft::signed_test_envelope(Object::new(), 1);
    let mut params = Object::new();
    params.insert("envelope", Value::Object(env));
    params.insert(
        "device_certificate",
        Value::Object(draft::certificate("dev", &alice, &phone, &["send"], 1).sign(&alice)),
    );
    let body = canonical::to_vec(&Value::Object(params));
    let to_a = relay_request(&mut b, A, PeerMethod::Deliver, &body, T0);
    // Stale, or without its signature: the core refuses it unverified, and so is it here.
    let stale = T0 + 600_000;
    assert_eq!(
        ahead.request(&to_a, stale),
        ahead::Verdict::Core { sending: None }
    );
    let mut unsigned = to_a.clone();
    unsigned.headers.retain(|(k, _)| k != "relay-signature");
    ahead.request(&unsigned, T0);
    assert_eq!(memory.waiting(), 0);
    assert_eq!(
        ahead.request(&to_a, T0),
        ahead::Verdict::Core { sending: None }
    );
    assert_eq!(memory.waiting(), 1, "verified ahead");
}

#[cfg(feature = "client")]
#[test]
fn ahead_verifies_each_item_of_a_batch_as_it_does_a_deliver() {
    use crate::client::draft;
    use crate::wire::preverify::Memory;
    let memory = std::sync::Arc::new(Memory::default());
    let (ahead, _) = ahead_of(
        Config::new(RelayId::parse(A).unwrap(), "dev"),
        Some(memory.clone()),
    );
    let mut b = relay(B, 2);
    let items: Vec<Value> = (0..3)
        .map(|i| {
            let (alice, _, phone, env) = draft::signed_test_envelope(Object::new(), i + 1);
            let mut params = Object::new();
            params.insert("envelope", Value::Object(env));
            params.insert(
                "device_certificate",
                Value::Object(draft::certificate("dev", &alice, &phone, &["send"], 1).sign(&alice)),
            );
            let mut item = Object::new();
            item.insert("params", Value::Object(params));
            item.insert("route_revision", 1u64);
            Value::Object(item)
        })
        .collect();
    let mut batch = Object::new();
    batch.insert("items", Value::Array(items));
    let body = canonical::to_vec(&Value::Object(batch));
    let to_a = relay_request(&mut b, A, PeerMethod::DeliverBatch, &body, T0);
    assert_eq!(
        ahead.request(&to_a, T0 + 600_000),
        ahead::Verdict::Core { sending: None }
    );
    assert_eq!(memory.waiting(), 0, "a stale batch costs no verification");
    ahead.request(&to_a, T0);
    assert_eq!(memory.waiting(), 3, "each item verified ahead");
}

#[cfg(feature = "client")]
#[test]
fn ahead_verifies_a_send_under_the_sessions_learned_key_and_names_the_session() {
    use crate::client::draft;
    use crate::client::keys::Signer;
    use crate::wire::envelope::MessageEnvelope;
    use crate::wire::preverify::Memory;
    use crate::wire::signature::SignedObject;
    let memory = std::sync::Arc::new(Memory::default());
    let (ahead, _) = ahead_of(
        Config::new(RelayId::parse(A).unwrap(), "dev"),
        Some(memory.clone()),
    );
    let (_, _, phone, env) = draft::signed_test_envelope(Object::new(), 1);
    let mut params = Object::new();
    params.insert("envelope", Value::Object(env.clone()));
    let body = canonical::to_vec(&Value::Object(params));
    let mut send = req(Listener::Public, "POST", "/v1/message.send", &body);
    let named = ahead::Verdict::Core {
        sending: Some("tok".into()),
    };
    // Anonymous: no session to name, nothing to verify under.
    assert_eq!(
        ahead.request(&send, T0),
        ahead::Verdict::Core { sending: None }
    );
    send.headers
        .push(("authorization".into(), "Bearer tok".into()));
    // The session's key is not known yet: named (so the core's verification teaches it), unverified.
    assert_eq!(ahead.request(&send, T0), named);
    assert_eq!(memory.waiting(), 0);
    let input = MessageEnvelope::parse(env).unwrap().signing_input();
    memory.learn("tok", &phone.public_key(), &input);
    assert_eq!(ahead.request(&send, T0), named);
    assert_eq!(memory.waiting(), 1, "verified ahead");
    // The same over a WebSocket: a message.send frame of the session (a fresh memory, as one
    // success of these exact bytes is remembered once).
    let memory = std::sync::Arc::new(Memory::default());
    let (ahead, _) = ahead_of(
        Config::new(RelayId::parse(A).unwrap(), "dev"),
        Some(memory.clone()),
    );
    memory.learn("tok", &phone.public_key(), &input);
    let frame = format!(
        "{{\"id\":\"1\",\"method\":\"message.send\",\"params\":{}}}",
        String::from_utf8(body).unwrap()
    );
    assert!(
        ahead.frame("other", &frame),
        "a send, under a session whose key is not known"
    );
    assert_eq!(memory.waiting(), 0);
    assert!(ahead.frame("tok", &frame));
    assert_eq!(memory.waiting(), 1);
    assert!(!ahead.frame(
        "tok",
        "{\"id\":\"2\",\"method\":\"message.timeline.sync\",\"params\":{}}"
    ));
    assert!(!ahead.frame("tok", "not json"));
}
