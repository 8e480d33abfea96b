//! The runbook's commands work (issue 32): every `relay admin` line of docs/operations.md
//! is run, in the runbook's order, against a live relay holding a delivery to a
//! destination that is down, with the runbook's placeholders replaced by real values. A
//! command the runbook gains and this test cannot run fails it, so the two stay together.

mod common;
use common::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A relay process over `data`, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start(data: &std::path::Path, port: u16) -> Proc {
    let args = [
        std::ffi::OsStr::new("--data"),
        data.as_os_str(),
        "--policy".as_ref(),
        "retry_initial=300".as_ref(),
        "--policy".as_ref(),
        "retry_max=600".as_ref(),
    ];
    Proc(serve_process(&args, port, Stdio::null()).await)
}

/// The `relay admin` lines of the runbook's shell blocks, comments removed, in order.
fn runbook_commands() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations.md"
    ))
    .expect("docs/operations.md");
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        let line = line.split('#').next().unwrap_or_default().trim();
        if in_sh && line.starts_with("relay admin ") {
            out.push(
                line["relay admin ".len()..]
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runbook_command_works_against_a_live_relay() {
    let data = scratch("runbook");
    let port = relay_tests::live::host::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut relay = start(&data, port).await;
    // A delivery to a destination that is down: what the runbook's first section is about.
    let mut c = Client::new(2107);
    let dead = format!("http://127.0.0.1:{}", relay_tests::live::host::free_port());
    let alice = c.register(&url, true).await;
    let dan = c.user(&dead);
    c.publish(&url, &dan).await;
    let m = c.message(&alice, &dan, "to a peer that is down");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 200, "{v:?}");
    let id = message_id(&m);
    let from = alice.key.id().as_str().to_string();

    let commands = runbook_commands();
    let verbs: Vec<&str> = commands.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(
        verbs,
        [
            "destinations",
            "deliveries",
            "retry",
            "retry-delivery",
            "pause",
            "destinations",
            "resume",
            "quarantine",
            "quarantine-requeue",
            "quarantine-drop",
            "backup"
        ],
        "the runbook's commands changed: run the new ones here"
    );
    let mut quarantined = String::new();
    for cmd in commands {
        let verb = cmd[0].clone();
        if verb == "quarantine" {
            // Something to set aside: the delivery's record goes bad in storage while the
            // relay is stopped, and its next due entry cannot be processed.
            drop(relay);
            let db = rusqlite::Connection::open(data.join("relay.sqlite")).expect("the database");
            let changed = db
                .execute(
                    "UPDATE kv SET v = ?1 WHERE k = ?2",
                    (&b"{not a task"[..], format!("task/{from}.{id}").as_bytes()),
                )
                .expect("the task record");
            assert_eq!(
                changed, 1,
                "the delivery's record is stored under task/FROM.ID"
            );
            drop(db);
            relay = start(&data, port).await;
            let began = Instant::now();
            quarantined = loop {
                let (ok, json) = relay_admin(&data, &["--json", "quarantine"]);
                assert!(ok, "{json}");
                let v = relay_core::wire::json::parse(json.trim().as_bytes()).expect("JSON");
                let first = relay_tests::field(&v, "quarantined")
                    .and_then(relay_tests::array)
                    .and_then(|l| l.first().cloned());
                if let Some(e) = first {
                    break relay_tests::field(&e, "id")
                        .and_then(relay_core::wire::json::Value::as_str)
                        .expect("an id")
                        .to_string();
                }
                assert!(
                    began.elapsed() < Duration::from_secs(20),
                    "nothing was set aside"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
        }
        let args: Vec<String> = cmd
            .iter()
            .map(|w| match w.as_str() {
                "https://peer.example" => dead.clone(),
                "ACCOUNT" => from.clone(),
                "MESSAGE_ID" => id.clone(),
                "ID" => quarantined.clone(),
                "/backups/relay.sqlite" => data.join("backup.sqlite").display().to_string(),
                other => other.to_string(),
            })
            .collect();
        let (ok, said) = relay_admin(&data, &args);
        assert!(ok, "relay admin {args:?}: {said}");
        match verb.as_str() {
            "destinations" => assert!(said.contains(&dead), "{args:?}: {said}"),
            "quarantine" => assert!(said.contains(&quarantined), "{said}"),
            "quarantine-requeue" => {
                // Its cause is still there: the tick sets it aside again, with no harm done.
                let began = Instant::now();
                while !relay_admin(&data, &["quarantine"]).1.contains(&quarantined) {
                    assert!(
                        began.elapsed() < Duration::from_secs(20),
                        "not set aside again"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            "quarantine-drop" => {
                let (_, left) = relay_admin(&data, &["quarantine"]);
                assert!(left.contains("(0 entries)"), "{left}");
            }
            "backup" => assert!(data.join("backup.sqlite").exists(), "{said}"),
            _ => {}
        }
    }
    drop(relay);
    let _ = std::fs::remove_dir_all(&data);
}
