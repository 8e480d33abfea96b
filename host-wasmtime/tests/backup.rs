//! Backup and restore of a running relay process (issue 21), and a store written by a
//! newer relay refused at start.

mod common;
use common::*;
use relay_core::engine::Storage;
use relay_core::wire::json::{Object, Value};
use relay_tests::live::host::free_port;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A relay process, killed when dropped (a failing test leaves none behind).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(port: u16, data: &Path) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
            .arg(data)
            .args([
                // No `--attempt-timeout`: an attempt in flight when the backup is taken
                // (likelier on a busy machine) is restored in flight with no process carrying
                // it, and the restored relay's orphan sweep retries it at its first tick
                // rather than after the 30 s default timeout, which is past this test's wait.
                "--policy",
                "retry_initial=200",
                "--policy",
                "retry_max=1000",
                // No rate limits: every local send is delivered into the timeline at once.
                "--policy",
                "send_rate=0",
                "--policy",
                "deliver_rate_per_account=0",
                "--policy",
                "deliver_rate_per_sender=0",
            ])
            .env("RELAY_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("relay starts"),
    )
}

async fn wait_ready(c: &Client, url: &str) {
    for _ in 0..400 {
        if let Ok((200, _)) = c.http.get(&format!("{url}/readyz")).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} did not come up");
}

fn kill(p: Proc) {
    drop(p);
}

/// The message ids in `u`'s timeline, every page of it, in order.
async fn timeline_ids(c: &Client, u: &User) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after = 0u64;
    loop {
        let mut p = Object::new();
        p.insert("after", after);
        let (s, v) = c
            .post(
                &format!("{}/v1/message.timeline.sync", u.relay),
                Some(&u.session),
                &p,
            )
            .await;
        assert_eq!(s, 200, "{v:?}");
        let o = v.as_object().expect("a page");
        if let Some(Value::Array(entries)) = o.get("entries") {
            for e in entries {
                let id = e
                    .as_object()
                    .and_then(|e| e.get("envelope"))
                    .and_then(Value::as_object)
                    .and_then(|e| e.get("message_id"))
                    .and_then(Value::as_str)
                    .expect("message_id");
                ids.push(id.to_string());
            }
        }
        after = o.get("next").and_then(Value::as_protocol_int).unwrap_or(0);
        if o.get("has_more") != Some(&Value::Bool(true)) {
            return ids;
        }
    }
}

/// A message accepted (answered 200) by the relay, and when the answer arrived.
struct Accepted {
    params: Object,
    id: String,
    answered: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_every_message_accepted_before_it_and_resumes_deliveries() {
    let dir = scratch("backup");
    let (da, db, restored) = (dir.join("a"), dir.join("b"), dir.join("a-restored"));
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let mut c = Client::new(2103);
    let a = spawn(pa, &da);
    let b = spawn(pb, &db);
    wait_ready(&c, &ua).await;
    wait_ready(&c, &ub).await;
    let alice = Arc::new(c.register(&ua, true).await);
    let bob = Arc::new(c.register(&ua, true).await);
    let mut carol = c.register(&ub, true).await;
    c.publish(&ua, &carol).await;

    // A delivery pending at the backup: its destination is down.
    kill(b);
    let pending = c.message(&alice, &carol, "pending across a restore");
    let (s, v) = c.send(&alice, &pending).await;
    assert_eq!((s, status_of(&v).as_str()), (200, "delivering"), "{v:?}");

    // Load: three clients keep sending alice -> bob, noting each message answered 200.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(Mutex::new(Vec::<Accepted>::new()));
    let mut load = Vec::new();
    for seed in 0..3 {
        let (alice, bob, stop, accepted) =
            (alice.clone(), bob.clone(), stop.clone(), accepted.clone());
        load.push(tokio::spawn(async move {
            let mut c = Client::new(7000 + seed);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let m = c.message(&alice, &bob, &format!("load {seed}.{n}"));
                n += 1;
                let (s, v) = c.send(&alice, &m).await;
                assert_eq!(s, 200, "{v:?}");
                accepted.lock().unwrap().push(Accepted {
                    id: message_id(&m),
                    params: m,
                    answered: Instant::now(),
                });
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The backup, through the CLI, while the load goes on.
    let file = dir.join("backup.sqlite");
    let began = Instant::now();
    let cli = {
        let (da, file) = (da.clone(), file.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_relay"))
                .args(["admin", "backup", "--data"])
                .arg(&da)
                .arg(&file)
                .output()
                .expect("relay admin backup runs")
        })
        .await
        .unwrap()
    };
    let finished = Instant::now();
    assert!(
        cli.status.success(),
        "relay admin backup: {}{}",
        String::from_utf8_lossy(&cli.stdout),
        String::from_utf8_lossy(&cli.stderr)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the backup is the operator's alone");
    }
    let accepted = std::mem::take(&mut *accepted.lock().unwrap());
    let before: Vec<&Accepted> = accepted.iter().filter(|m| m.answered < began).collect();
    let after: Vec<&Accepted> = accepted.iter().filter(|m| m.answered > finished).collect();
    assert!(
        before.len() >= 10 && !after.is_empty(),
        "the load ran on both sides of the backup ({} before, {} after)",
        before.len(),
        after.len()
    );

    // Restore: a new data directory with the backup as its database and the relay's key,
    // on the same port (so the same relay id).
    kill(a);
    std::fs::create_dir_all(&restored).unwrap();
    std::fs::copy(&file, restored.join("relay.sqlite")).unwrap();
    std::fs::copy(da.join("relay.key"), restored.join("relay.key")).unwrap();
    std::fs::copy(da.join("admin.token"), restored.join("admin.token")).unwrap();
    let a = spawn(pa, &restored);
    wait_ready(&c, &ua).await;

    // Every message answered before the backup began is there.
    let ids: BTreeSet<String> = timeline_ids(&c, &bob).await.into_iter().collect();
    for m in &before {
        assert!(
            ids.contains(&m.id),
            "{} was accepted before the backup and is missing",
            m.id
        );
    }
    // One accepted after the backup, sent again unchanged, is accepted (again or for the
    // first time): what a client's retry does after a restore. It is there once.
    let late = after.last().unwrap();
    let (s, v) = c.send(&alice, &late.params).await;
    assert_eq!(s, 200, "{v:?}");
    let timeline = timeline_ids(&c, &bob).await;
    assert_eq!(timeline.iter().filter(|i| **i == late.id).count(), 1);
    let unique: BTreeSet<&String> = timeline.iter().collect();
    assert_eq!(unique.len(), timeline.len(), "no message twice");

    // The pending delivery resumes once its destination is back.
    let b = spawn(pb, &db);
    wait_ready(&c, &ub).await;
    let done = c.wait_terminal(&alice, &message_id(&pending), 200).await;
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    carol.session = c.open_session(&carol).await;
    assert_eq!(c.texts(&carol).await, vec!["pending across a restore"]);
    kill(a);
    kill(b);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_written_by_a_newer_relay_stops_the_start_with_a_clear_message() {
    let dir = scratch("newer-store");
    {
        let mut db = relay_host_wasmtime::store::SqliteStore::open(&dir.join("relay.sqlite"))
            .expect("a store");
        db.commit(vec![(b"meta/schema".to_vec(), Some(b"2".to_vec()))])
            .expect("schema version 2");
    }
    let mut relay = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&dir)
        .env("RELAY_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("relay starts");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = relay.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            relay.kill().unwrap();
            panic!("the relay served a store written by a newer relay");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(relay.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{status}");
    assert!(
        stderr.contains("written by a newer relay (schema version 2"),
        "{stderr}"
    );
    assert!(
        !dir.join("admin.url").exists(),
        "nothing was served, so no admin listener was announced"
    );
    let _ = std::fs::remove_dir_all(dir);
}
