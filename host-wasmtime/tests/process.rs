//! A relay process killed mid-delivery (SIGKILL, not a flag) and started again over its
//! SQLite data finishes the delivery, with no duplicate record.

mod common;
use common::*;
use relay_tests::live::host::free_port;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(port: u16, data: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(data)
        .args([
            "--policy",
            "retry_initial=200",
            "--policy",
            "retry_max=1000",
        ])
        .env("RELAY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("relay starts")
}

async fn wait_up(c: &Client, url: &str) {
    for _ in 0..200 {
        if let Ok((200, _)) = c.http.get(&format!("{url}/.well-known/relay")).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} did not come up");
}

fn kill(mut p: Child) {
    p.kill().expect("SIGKILL");
    let _ = p.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_delivery_finishes_it_after_restart_without_duplicates() {
    let dir = std::env::temp_dir().join(format!("relay-kill-{}", std::process::id()));
    let (da, db) = (dir.join("a"), dir.join("b"));
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let mut c = Client::new(9);
    let a = spawn(pa, &da);
    let b = spawn(pb, &db);
    wait_up(&c, &ua).await;
    wait_up(&c, &ub).await;
    let alice = c.register(&ua, true).await;
    let mut bob = c.register(&ub, true).await;
    c.publish(&ua, &bob).await;
    // The destination dies; the source accepts and keeps trying.
    kill(b);
    let m = c.message(&alice, &bob, "survives kill -9");
    let (s, v) = c.send(&alice, &m).await;
    assert_eq!(s, 200, "{v:?}");
    assert_eq!(status_of(&v), "delivering");
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The source dies in the middle of its retries.
    kill(a);
    let b = spawn(pb, &db);
    let a = spawn(pa, &da);
    wait_up(&c, &ua).await;
    wait_up(&c, &ub).await;
    let done = c.wait_terminal(&alice, &message_id(&m), 150).await;
    assert_eq!(status_of(&done), "target_accepted", "{done:?}");
    // The same request again: the stored result, no second record.
    let (_, again) = c.send(&alice, &m).await;
    assert_eq!(status_of(&again), "target_accepted");
    bob.session = c.open_session(&bob).await;
    assert_eq!(c.texts(&bob).await, vec!["survives kill -9"]);
    kill(a);
    kill(b);
    let _ = std::fs::remove_dir_all(dir);
}
