//! What an operator sees (issue 21): the metrics agree with what happened, health checks on
//! both listeners, and the admin API only on the admin listener, with the operator token.

mod common;
use common::*;
use relay_core::wire::json::Object;
use relay_host_wasmtime::Running;
use relay_tests::live::host::free_port;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The core's metric families: every sample of these is compared exactly.
const CORE_FAMILIES: &[&str] = &[
    "relay_messages_accepted_total",
    "relay_messages_rejected_total",
    "relay_delivery_attempts_total",
    "relay_deliveries_delivered_total",
    "relay_deliveries_failed_total",
    "relay_rate_limited_total",
    "relay_tick_entries_quarantined_total",
    "relay_deliveries_pending",
    "relay_in_flight_attempts",
];

/// The samples of a Prometheus text exposition: `name{labels}` to value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (k.to_string(), v.parse().unwrap_or_else(|_| panic!("{l:?}")))
        })
        .collect()
}

/// The samples of the core's families.
fn core_samples(all: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    all.iter()
        .filter(|(k, _)| {
            let name = k.split('{').next().unwrap_or_default();
            CORE_FAMILIES.contains(&name)
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

async fn scrape(c: &Client, r: &Running) -> BTreeMap<String, f64> {
    let (s, body) = c
        .http
        .get(&format!("{}/metrics", r.admin_url))
        .await
        .expect("scrape");
    let text = String::from_utf8(body).expect("utf-8");
    assert_eq!(s, 200, "{text}");
    samples(&text)
}

/// Scrapes until `ready` holds (or panics after `within`).
async fn scrape_until(
    c: &Client,
    r: &Running,
    within: Duration,
    ready: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let started = Instant::now();
    loop {
        let m = scrape(c, r).await;
        if ready(&m) {
            return m;
        }
        assert!(
            started.elapsed() < within,
            "metrics never got there: {m:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_agree_with_a_known_mix_of_messages() {
    const AGE_LIMIT: u64 = 8_000;
    let a = relay(|s| {
        // Four sends a minute; a retry would come only after the deadline, so the dead
        // destination gets exactly one attempt and then fails at its deadline.
        for p in [
            "send_rate=4",
            "retry_max=60000",
            "retry_initial=60000",
            &format!("message_delivery_age_limit={AGE_LIMIT}"),
        ] {
            s.apply_policy(p).unwrap();
        }
    })
    .await;
    let b = relay(|_| {}).await;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut c = Client::new(2101);
    let alice = c.register(&a.url, true).await;
    let carol = c.register(&a.url, true).await;
    let bob = c.register(&b.url, true).await;
    let dan = c.user(&dead);
    c.publish(&a.url, &bob).await;
    c.publish(&a.url, &dan).await;

    // Accepted: self, local, cross, and cross to a destination that is down.
    let sent_at = Instant::now();
    let mut cross = String::new();
    for (to, text) in [
        (&alice, "note"),
        (&carol, "local"),
        (&bob, "cross"),
        (&dan, "down"),
    ] {
        let m = c.message(&alice, to, text);
        let (s, v) = c.send(&alice, &m).await;
        assert_eq!(s, 200, "{text}: {v:?}");
        if text == "cross" {
            cross = message_id(&m);
        }
    }
    // Refused: a shape the core refuses (invalid_params), then the fifth send of the minute.
    let mut bad = c.message(&alice, &bob, "bad");
    bad.remove("recipient_boxes");
    let (s, _) = c.send(&alice, &bad).await;
    assert_eq!(s, 400);
    let m = c.message(&alice, &bob, "one too many");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 429, "{v:?}");
    let done = c.wait_terminal(&alice, &cross, 100).await;
    assert_eq!(status_of(&done), "target_accepted");

    // One WebSocket open.
    let ws_url = format!(
        "{}/v1/ws?session={}",
        a.url.replace("http://", "ws://"),
        carol.session
    );
    let (ws, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("ws connects");

    let attempt_to_dead = "relay_delivery_attempts_total{outcome=\"not_attempted\"}";
    let m = scrape_until(&c, &a, Duration::from_secs(10), |m| {
        m.get(attempt_to_dead) == Some(&1.0) && m.get("relay_open_websockets") == Some(&1.0)
    })
    .await;
    assert!(
        sent_at.elapsed() < Duration::from_millis(AGE_LIMIT),
        "the scrape came after the dead delivery's deadline: the machine is too slow for this test"
    );
    // Per-destination detail is `admin.destinations`; the gauges carry no destination label.
    let pending = "relay_deliveries_pending";
    let in_flight = "relay_in_flight_attempts";
    let before = core_samples(&m);
    assert_eq!(
        before,
        expect(&[
            ("relay_messages_accepted_total{kind=\"self\"}", 1.0),
            ("relay_messages_accepted_total{kind=\"local\"}", 1.0),
            ("relay_messages_accepted_total{kind=\"cross\"}", 2.0),
            (
                "relay_messages_rejected_total{code=\"invalid_params\"}",
                1.0
            ),
            ("relay_messages_rejected_total{code=\"rate_limited\"}", 1.0),
            ("relay_delivery_attempts_total{outcome=\"accepted\"}", 1.0),
            (attempt_to_dead, 1.0),
            ("relay_deliveries_delivered_total", 2.0),
            ("relay_rate_limited_total{method=\"message.send\"}", 1.0),
            ("relay_tick_entries_quarantined_total", 0.0),
            (pending, 1.0),
            (in_flight, 0.0),
        ])
    );
    // The host's own.
    let host = |name: &str| *m.get(name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(host("relay_open_websockets"), 1.0);
    assert_eq!(host("relay_guest_traps_total"), 0.0);
    assert_eq!(host("relay_core_restarts_total"), 0.0);
    assert!(host("relay_open_connections") >= 1.0);
    for (outcome, n) in [
        ("answered", 1.0),
        ("rejected", 0.0),
        ("unknown", 0.0),
        ("not_attempted", 1.0),
    ] {
        assert_eq!(
            host(&format!(
                "relay_attempt_duration_seconds_count{{outcome=\"{outcome}\"}}"
            )),
            n,
            "{outcome}"
        );
    }
    let groups = host("relay_commit_group_size_count");
    assert!(groups >= 1.0);
    assert_eq!(host("relay_commit_duration_seconds_count"), groups);
    // Every write went through some group: at least the registrations, sessions, routes
    // and sends, each at most once.
    assert!(host("relay_commit_group_size_sum") >= 10.0);

    // The receiving relay counted one receipt and nothing else.
    let at_b = scrape(&c, &b).await;
    assert_eq!(
        core_samples(&at_b),
        expect(&[
            ("relay_messages_accepted_total{kind=\"received\"}", 1.0),
            ("relay_deliveries_delivered_total", 0.0),
            ("relay_tick_entries_quarantined_total", 0.0),
            ("relay_deliveries_pending", 0.0),
            ("relay_in_flight_attempts", 0.0),
        ])
    );
    assert_eq!(at_b["relay_open_websockets"], 0.0);

    // At its deadline the delivery to the dead destination fails, without another attempt.
    let failed = "relay_deliveries_failed_total{code=\"deadline_exceeded\"}";
    let m = scrape_until(&c, &a, Duration::from_millis(AGE_LIMIT + 10_000), |m| {
        m.get(failed) == Some(&1.0)
    })
    .await;
    // The same counts as before, the failure added, and nothing pending any more.
    let mut want = before.clone();
    want.insert(pending.to_string(), 0.0);
    want.insert(failed.to_string(), 1.0);
    assert_eq!(core_samples(&m), want);
    assert_eq!(
        m["relay_attempt_duration_seconds_count{outcome=\"not_attempted\"}"],
        1.0
    );
    assert!(
        m["relay_tick_duration_seconds_count"] >= 1.0,
        "the deadline came with a tick"
    );
    drop(ws);
    let m = scrape_until(&c, &a, Duration::from_secs(5), |m| {
        m.get("relay_open_websockets") == Some(&0.0)
    })
    .await;
    assert_eq!(m["relay_guest_traps_total"], 0.0);
    a.stop().await;
    b.stop().await;
}

async fn get(c: &Client, url: &str) -> (u16, String) {
    let (s, b) = c.http.get(url).await.expect("GET");
    (s, String::from_utf8_lossy(&b).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_on_both_listeners_and_the_admin_api_only_on_the_admin_listener_with_the_token() {
    let a = relay(|_| {}).await;
    let c = Client::new(2102);
    assert_ne!(a.admin_addr.port(), a.addr.port());
    assert!(a.admin_addr.ip().is_loopback(), "loopback by default");
    for base in [&a.url, &a.admin_url] {
        assert_eq!(
            get(&c, &format!("{base}/healthz")).await,
            (200, "ok\n".into())
        );
        assert_eq!(get(&c, &format!("{base}/readyz")).await.0, 200, "{base}");
    }
    // Metrics are not on the public port, and the admin API is not either.
    assert_eq!(get(&c, &format!("{}/metrics", a.url)).await.0, 404);
    let token = format!("Bearer {}", a.app.admin_token);
    let admin = |base: &str| format!("{base}/admin/v1/deliveries");
    let body = b"{}".to_vec();
    let (s, _) = c
        .http
        .post(&admin(&a.url), &[("authorization", &token)], body.clone())
        .await
        .unwrap();
    assert_eq!(s, 404, "no admin API on the public port, token or not");
    for wrong in [
        String::new(),
        "Bearer ".into(),
        "Bearer nope".into(),
        format!("{token}x"),
        token[..token.len() - 1].to_string(),
    ] {
        let headers: Vec<(&str, &str)> = if wrong.is_empty() {
            vec![]
        } else {
            vec![("authorization", wrong.as_str())]
        };
        let (s, b) = c
            .http
            .post(&admin(&a.admin_url), &headers, body.clone())
            .await
            .unwrap();
        assert_eq!(s, 401, "{wrong:?}: {}", String::from_utf8_lossy(&b));
    }
    let (s, b) = c
        .http
        .post(&admin(&a.admin_url), &[("authorization", &token)], body)
        .await
        .unwrap();
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    // An in-memory relay has no database to back up.
    let mut p = Object::new();
    p.insert("path", "/tmp/never-written.sqlite");
    let (s, b) = c
        .http
        .post(
            &format!("{}/admin/v1/backup", a.admin_url),
            &[("authorization", &token)],
            relay_core::wire::canonical::object_to_vec(&p),
        )
        .await
        .unwrap();
    assert_eq!(s, 500);
    assert!(String::from_utf8_lossy(&b).contains("in memory"));

    // Shutting down: no longer ready, still live.
    a.app.health.set_stopping();
    for base in [&a.url, &a.admin_url] {
        assert_eq!(get(&c, &format!("{base}/healthz")).await.0, 200);
        let (s, why) = get(&c, &format!("{base}/readyz")).await;
        assert_eq!((s, why.as_str()), (503, "not ready: shutting down\n"));
    }
    a.stop().await;
}

/// Every metric name an expression of `v` (a JSON document, walked whole) mentions:
/// identifiers starting `relay_` in any string under an `expr` key.
fn metric_names(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                if let (true, serde_json::Value::String(expr)) = (k == "expr", x) {
                    let mut rest = expr.as_str();
                    while let Some(i) = rest.find("relay_") {
                        let name: String = rest[i..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        rest = &rest[i + name.len()..];
                        out.insert(name);
                    }
                }
                metric_names(x, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| metric_names(x, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_rules_and_the_dashboard_name_only_metrics_a_live_relay_exposes() {
    let a = relay(|_| {}).await;
    let c = Client::new(2103);
    let (s, text) = get(&c, &format!("{}/metrics", a.admin_url)).await;
    assert_eq!(s, 200);
    let families: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring");
    for file in ["relay-alerts.json", "relay-dashboard.json"] {
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(docs.join(file)).expect(file)).expect(file);
        let mut names = std::collections::BTreeSet::new();
        metric_names(&doc, &mut names);
        assert!(names.len() >= 5, "{file} names {names:?}");
        for name in &names {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|base| families.contains(base))
                .unwrap_or(name);
            assert!(
                families.contains(family),
                "{file} names {name}, which /metrics does not expose"
            );
        }
    }
    // The alert file is Prometheus' rule format: groups of rules, each alert with an expr.
    let alerts: serde_json::Value =
        serde_json::from_slice(&std::fs::read(docs.join("relay-alerts.json")).unwrap()).unwrap();
    for rule in alerts["groups"][0]["rules"].as_array().expect("rules") {
        assert!(
            rule["alert"].is_string() && rule["expr"].is_string(),
            "{rule}"
        );
    }
    a.stop().await;
}
