//! `--log-format json` (issue 21): every stderr line is one JSON object, with one line per
//! accepted message and per ended delivery, carrying ids and never bodies.

mod common;
use common::*;
use relay_core::wire::json::Value;
use std::io::Read;
use std::process::Stdio;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_a_line_per_accepted_message_and_per_ended_delivery_with_ids_only() {
    let port = relay_tests::live::host::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let json = ["--memory", "--log-format", "json"].map(std::ffi::OsStr::new);
    let mut relay = serve_process(&json, port, Stdio::piped()).await;
    let mut c = Client::new(2104);
    let alice = c.register(&url, true).await;
    let bob = c.register(&url, true).await;
    let m = c.message(&alice, &bob, "a secret text");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 200, "{v:?}");
    let id = message_id(&m);
    // The body's long strings (ciphertext, nonce): none may reach the log.
    let secrets: Vec<String> = m
        .get("envelope")
        .and_then(Value::as_object)
        .and_then(|e| e.get("body"))
        .and_then(Value::as_object)
        .expect("a body")
        .iter()
        .filter_map(|(_, v)| v.as_str())
        .filter(|s| s.len() >= 16)
        .map(str::to_string)
        .collect();
    assert!(!secrets.is_empty());
    relay.kill().unwrap();
    let _ = relay.wait();
    let mut logs = String::new();
    relay
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();

    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    assert!(lines.iter().all(|l| l["level"].is_string()), "{logs}");
    let events = |event: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|l| l["event"] == event).collect()
    };
    let accepted = events("accepted");
    assert_eq!(accepted.len(), 1, "{logs}");
    let a = accepted[0];
    assert_eq!(a["method"], "message.send");
    assert_eq!(a["message_id"], id.as_str());
    assert_eq!(a["from"], alice.key.id().as_str());
    assert_eq!(a["to"], bob.key.id().as_str());
    assert_eq!(a["status"], "target_accepted");
    let ended = events("delivery_ended");
    assert_eq!(ended.len(), 1, "{logs}");
    let e = ended[0];
    assert_eq!(e["message_id"], id.as_str());
    assert_eq!(e["from"], alice.key.id().as_str());
    assert_eq!(e["to"], bob.key.id().as_str());
    assert_eq!(e["status"], "target_accepted");
    assert!(e["error_code"].is_null());
    // Ids only: neither the body nor any session token reaches the log.
    for secret in &secrets {
        assert!(!logs.contains(secret.as_str()), "{logs}");
    }
    assert!(!logs.contains(&alice.session), "{logs}");
}

/// Issue 32's audit trail: every operator action is one structured log line naming who
/// (the admin listener), what, on which destination, and how many deliveries it touched,
/// made here through the operator's command line (`relay admin`, as an operator would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_action_is_an_audit_log_line() {
    let port = relay_tests::live::host::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data = scratch("audit");
    let args = [
        std::ffi::OsStr::new("--log-format"),
        "json".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
    ];
    let mut relay = serve_process(&args, port, Stdio::piped()).await;
    let mut c = Client::new(2105);
    // One delivery to a destination that is down, so the relay knows the destination.
    let dead = format!("http://127.0.0.1:{}", relay_tests::live::host::free_port());
    let alice = c.register(&url, true).await;
    let dan = c.user(&dead);
    c.publish(&url, &dan).await;
    let m = c.message(&alice, &dan, "to a relay that is down");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 200, "{v:?}");
    let relayctl = |args: &[&str]| {
        let (ok, text) = relay_admin(&data, args);
        assert!(ok, "relay admin {args:?}: {text}");
        text
    };
    let said = relayctl(&["pause", &dead]);
    assert!(said.contains("changed=true"), "{said}");
    let said = relayctl(&["pause", &dead]);
    assert!(said.contains("changed=false"), "{said}");
    let said = relayctl(&["resume", &dead]);
    assert!(said.contains("changed=true"), "{said}");
    relay.kill().unwrap();
    let _ = relay.wait();
    let mut logs = String::new();
    relay
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    let audit: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["event"] == "operator_action")
        .collect();
    let seen: Vec<(&str, &str, u64, &str)> = audit
        .iter()
        .map(|l| {
            (
                l["action"].as_str().unwrap_or_default(),
                l["subject"].as_str().unwrap_or_default(),
                l["touched"].as_u64().unwrap_or(u64::MAX),
                l["who"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("destination.pause", dead.as_str(), 1, "admin listener"),
            ("destination.pause", dead.as_str(), 0, "admin listener"),
            ("destination.resume", dead.as_str(), 1, "admin listener"),
        ],
        "{logs}"
    );
    assert!(audit.iter().all(|l| l["level"] == "INFO"), "{logs}");
    let _ = std::fs::remove_dir_all(&data);
}
