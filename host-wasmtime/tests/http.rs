//! The wasmtime host over real sockets on 127.0.0.1: delivery between relays, WebSocket
//! notifications, transport limits, and the component's imports.

mod common;
use common::*;
use futures_util::{SinkExt, StreamExt};
use relay_core::wire::json::{self, Object, Value};
use std::sync::atomic::Ordering;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_wasmtime_relays_deliver_a_message_between_accounts_over_http() {
    let a = relay(|_| {}).await;
    let b = relay(|_| {}).await;
    let mut c = Client::new(1);
    let alice = c.register(&a.url, true).await;
    let bob = c.register(&b.url, true).await;
    c.publish(&a.url, &bob).await;
    let m = c.message(&alice, &bob, "hello over http");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 200, "{v:?}");
    assert_eq!(status_of(&v), "delivering");
    let done = c.wait_terminal(&alice, &message_id(&m), 100).await;
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    assert_eq!(c.texts(&bob).await, vec!["hello over http"]);
    // The receiving relay's worker verified the envelope under the certificate it came with.
    let pre = b.app.ahead.memory().cloned().expect("on by default");
    assert_eq!(pre.hits.load(Ordering::Relaxed), 1);
    a.stop().await;
    b.stop().await;
}

/// Sends `text` from `from` to `to` (on the same relay) and expects `target_accepted`; the params.
async fn accepted(c: &mut Client, from: &User, to: &User, text: &str) -> Object {
    let m = c.message(from, to, text);
    let (s, v) = c.send(from, &m).await;
    assert_eq!(
        (s, status_of(&v).as_str()),
        (200, "target_accepted"),
        "{v:?}"
    );
    m
}

/// Once the core has verified a session's envelope, the HTTP workers verify that session's next
/// envelopes ahead of the core thread (natively, off it); a bad signature is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_verified_on_the_workers_are_accepted_and_a_bad_signature_is_still_refused() {
    let a = relay(|_| {}).await;
    let pre = a
        .app
        .ahead
        .memory()
        .cloned()
        .expect("pre-verification is on by default");
    let mut c = Client::new(7);
    let alice = c.register(&a.url, true).await;
    let bob = c.register(&a.url, true).await;
    accepted(&mut c, &alice, &bob, "one").await;
    assert_eq!(pre.hits.load(Ordering::Relaxed), 0, "no key was known yet");
    assert_eq!(
        pre.sessions(),
        1,
        "the core's verification taught the session's key"
    );
    let second = accepted(&mut c, &alice, &bob, "two").await;
    assert_eq!(pre.hits.load(Ordering::Relaxed), 1, "verified on a worker");
    assert_eq!(pre.waiting(), 0);
    // Another envelope's signature on this envelope: the worker's check fails, and so does the core's.
    let mut forged = c.message(&alice, &bob, "three");
    let sig = |m: &Object| {
        m.get("envelope")
            .and_then(Value::as_object)
            .and_then(|e| e.get("sig"))
            .cloned()
            .unwrap()
    };
    let mut env = forged
        .get("envelope")
        .and_then(Value::as_object)
        .cloned()
        .unwrap();
    env.insert("sig", sig(&second));
    forged.insert("envelope", Value::Object(env));
    let (s, v) = c.send(&alice, &forged).await;
    assert_eq!(s, 400, "{v:?}");
    assert_eq!(
        v.as_object()
            .and_then(|o| o.get("error"))
            .and_then(Value::as_object)
            .and_then(|e| e.get("code"))
            .and_then(Value::as_str),
        Some("invalid_signature")
    );
    assert_eq!(pre.hits.load(Ordering::Relaxed), 1);
    assert_eq!(pre.waiting(), 0, "a failure is never remembered");
    assert_eq!(c.texts(&bob).await, vec!["one", "two"]);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_gets_timeline_changed_then_syncs_the_new_entry() {
    let a = relay(|_| {}).await;
    let mut c = Client::new(2);
    let alice = c.register(&a.url, true).await;
    let bob = c.register(&a.url, true).await;
    let ws_url = format!(
        "{}/v1/ws?session={}",
        a.url.replace("http://", "ws://"),
        bob.session
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("ws connects");
    let m = c.message(&alice, &bob, "pushed");
    let (s, _) = c.send(&alice, &m).await;
    assert_eq!(s, 200);
    let note = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next())
        .await
        .expect("notified")
        .unwrap()
        .unwrap();
    let note = json::parse(note.to_text().unwrap().as_bytes()).unwrap();
    let o = note.as_object().unwrap();
    assert_eq!(
        o.get("method").and_then(Value::as_str),
        Some("message.timeline.changed")
    );
    let params = o.get("params").and_then(Value::as_object).unwrap();
    assert_eq!(
        params.get("account").and_then(Value::as_str),
        Some(bob.key.id().as_str())
    );
    assert_eq!(
        params.get("latest_seq").and_then(Value::as_protocol_int),
        Some(1)
    );
    // Sync over the same socket.
    ws.send(Message::Text(
        r#"{"id":"s1","method":"message.timeline.sync","params":{"after":0}}"#.into(),
    ))
    .await
    .unwrap();
    let answer = ws.next().await.unwrap().unwrap();
    let answer = json::parse(answer.to_text().unwrap().as_bytes()).unwrap();
    let o = answer.as_object().unwrap();
    assert_eq!(o.get("id").and_then(Value::as_str), Some("s1"));
    let entries = match o
        .get("result")
        .and_then(|r| r.as_object())
        .and_then(|r| r.get("entries"))
    {
        Some(Value::Array(e)) => e.len(),
        _ => 0,
    };
    assert_eq!(entries, 1);
    // A bad frame gets an error with its id.
    let bad = r#"{"id":7,"method":"message.timeline.sync","params":[]}"#;
    assert_eq!(
        frame_error_code(&mut ws, bad).await.as_deref(),
        Some("invalid_params")
    );
    // Params reach the core as sent: 1.0 is not a protocol integer, over a socket as over HTTP.
    let float = r#"{"id":8,"method":"message.timeline.sync","params":{"after":1.0}}"#;
    assert_eq!(
        frame_error_code(&mut ws, float).await.as_deref(),
        Some("invalid_params")
    );
    a.stop().await;
}

/// Sends a frame and returns the `error.code` of the answer.
async fn frame_error_code<S>(ws: &mut S, frame: &str) -> Option<String>
where
    S: futures_util::Sink<Message>
        + futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
{
    ws.send(Message::Text(frame.into())).await.ok()?;
    let answer = ws.next().await?.ok()?;
    let v = json::parse(answer.to_text().ok()?.as_bytes()).ok()?;
    let e = v
        .as_object()?
        .get("error")?
        .as_object()?
        .get("code")?
        .as_str()?
        .to_string();
    Some(e)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_bodies_get_413_and_malformed_json_400_without_reaching_the_core() {
    let a = relay(|s| s.policies.max_request_bytes = 1024).await;
    let c = Client::new(3);
    let before = a.app.core_calls.load(Ordering::Relaxed);
    let big = vec![b'x'; 2048];
    let (s, body) = c
        .http
        .post(&format!("{}/v1/message.send", a.url), &[], big)
        .await
        .unwrap();
    assert_eq!(s, 413);
    assert!(String::from_utf8_lossy(&body).contains("payload_too_large"));
    for bad in [&b"{"[..], b"{\"a\":1,\"a\":2}", b"[\"\\uD800\"]", b"\xff"] {
        let (s, body) = c
            .http
            .post(&format!("{}/v1/message.send", a.url), &[], bad.to_vec())
            .await
            .unwrap();
        assert_eq!(s, 400);
        assert!(
            String::from_utf8_lossy(&body).contains("invalid_params"),
            "{}",
            String::from_utf8_lossy(&body)
        );
        let (s, _) = c
            .http
            .post(
                &format!("{}/relay/v1/message.deliver", a.url),
                &[],
                bad.to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(s, 400);
    }
    assert_eq!(
        a.app.core_calls.load(Ordering::Relaxed),
        before,
        "none of them reached the core"
    );
    a.stop().await;
}

/// POSTs `body` without credentials; the status, the `Retry-After` header and the body.
async fn post_anonymous(url: &str, body: &Object) -> (u16, Option<String>, Value) {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(
            relay_core::wire::canonical::object_to_vec(body).into(),
        ))
        .unwrap();
    let res = client.request(req).await.expect("http");
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry, json::parse(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_anonymous_call_from_one_address_within_a_minute_gets_429_and_the_relay_goes_on() {
    let a = relay(|s| s.apply_policy("anonymous_rate=3").unwrap()).await;
    let mut c = Client::new(19);
    // account.register and session.open are the address's first two anonymous calls.
    let alice = c.register(&a.url, true).await;
    let mut p = Object::new();
    p.insert("account", alice.key.id().as_str());
    let url = format!("{}/v1/route.get", a.url);
    let (s, _, v) = post_anonymous(&url, &p).await;
    assert_eq!(s, 200, "the third: {v:?}");
    let (s, retry, v) = post_anonymous(&url, &p).await;
    assert_eq!(s, 429, "the fourth: {v:?}");
    let code = v
        .as_object()
        .and_then(|o| o.get("error"))
        .and_then(Value::as_object)
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str);
    assert_eq!(code, Some("rate_limited"), "{v:?}");
    let retry: u64 = retry.expect("a Retry-After header").parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // The relay still answers: a session's call, and its well-known document.
    assert_eq!(c.texts(&alice).await, Vec::<String>::new());
    let (s, _) = c
        .http
        .get(&format!("{}/.well-known/relay", a.url))
        .await
        .unwrap();
    assert_eq!(s, 200);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_rpc_requires_a_valid_relay_signature() {
    let a = relay(|_| {}).await;
    let c = Client::new(4);
    let body = b"{}".to_vec();
    let (s, _) = c
        .http
        .post(
            &format!("{}/relay/v1/message.deliver", a.url),
            &[],
            body.clone(),
        )
        .await
        .unwrap();
    assert_eq!(s, 401);
    let headers = [
        ("Relay-Id", "http://127.0.0.1:1"),
        ("Relay-Timestamp", "1"),
        ("Relay-Nonce", "AAAAAAAAAAAAAAAAAAAAAA"),
        ("Relay-Signature", "x"),
    ];
    let (s, b) = c
        .http
        .post(
            &format!("{}/relay/v1/message.deliver", a.url),
            &headers,
            body,
        )
        .await
        .unwrap();
    assert_eq!(s, 401, "{}", String::from_utf8_lossy(&b));
    a.stop().await;
}

#[test]
fn the_component_imports_only_the_relay_host_interface() {
    let path = relay_host_wasmtime::settings::component_path(&Default::default());
    let engine = relay_host_wasmtime::guest::wasm_engine().unwrap();
    let bytes = std::fs::read(&path).expect("component built by ./x (xtask component)");
    let component = wasmtime::component::Component::from_binary(&engine, &bytes).unwrap();
    let imports: Vec<String> = component
        .component_type()
        .imports(&engine)
        .map(|(n, _)| n.to_string())
        .collect();
    assert!(!imports.is_empty());
    for name in &imports {
        assert!(
            name.starts_with("relay:core/"),
            "unexpected import {name}: no WASI, no ambient authority"
        );
    }
    assert!(
        !bytes.windows(10).any(|w| w == b"__wbindgen"),
        "no wasm-bindgen in the component"
    );
    let _ = Object::new();
}
