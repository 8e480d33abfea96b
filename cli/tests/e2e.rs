//! relayctl end to end against real relay processes.
//!
//! The relay binary is not built here: it is `$RELAY_BIN`, or
//! `<workspace>/target/release/relay` (what the main build leaves). A missing
//! binary fails the tests; it never skips them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

fn relay_bin() -> PathBuf {
    let p = std::env::var_os("RELAY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/relay"));
    assert!(
        p.is_file(),
        "the relay binary {} does not exist: build it (cargo build --release -p relay-host-wasmtime) \
         or point RELAY_BIN at one",
        p.display()
    );
    p
}

/// A relay process, killed when dropped.
struct Relay {
    child: Child,
    url: String,
}

impl Relay {
    fn start() -> Relay {
        Relay::spawn(&["--listen", "127.0.0.1:0"])
    }

    /// A relay listening on `listen` whose relay id is `url` (so clients reach it through a proxy).
    fn behind(listen: u16, url: &str) -> Relay {
        Relay::spawn(&["--listen", &format!("127.0.0.1:{listen}"), "--url", url])
    }

    fn spawn(args: &[&str]) -> Relay {
        let mut child = Command::new(relay_bin())
            .arg("serve")
            .args(args)
            .arg("--memory")
            .env("RELAY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the relay starts");
        let stdout = child.stdout.take().expect("relay stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the relay prints its address");
        let url = line
            .rsplit(" as ")
            .next()
            .expect("`relay listening on ADDR as URL`")
            .trim()
            .to_string();
        assert!(url.starts_with("http://"), "{line}");
        Relay { child, url }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory for profiles, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("relayctl-e2e-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Dir(p)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs relayctl with `profile`.
fn ctl(profile: &Path, args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_relayctl"))
        .arg("--profile")
        .arg(profile)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("relayctl runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs relayctl and insists on exit status 0.
fn ok(profile: &Path, args: &[&str]) -> String {
    let o = ctl(profile, args);
    assert_eq!(
        o.code, 0,
        "relayctl {args:?} failed:\nstdout: {}\nstderr: {}",
        o.stdout, o.stderr
    );
    o.stdout
}

/// `init` and the account id.
fn account(profile: &Path, relay: &str) -> String {
    let out = ok(profile, &["init", "--relay", relay]);
    field(&out, "account")
}

fn field(whoami: &str, name: &str) -> String {
    whoami
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {name} in {whoami}"))
}

/// Writes the contact card of `profile` (an invite) to a file.
fn card(profile: &Path, dir: &Dir, name: &str) -> PathBuf {
    let path = dir.file(name);
    std::fs::write(&path, ok(profile, &["invite"])).expect("card written");
    path
}

/// A member of one-line JSON output, as a string (good enough for the flat DeliveryStatus).
fn json_str(text: &str, key: &str) -> String {
    let v = relay_core::wire::json::parse_object(text.trim().as_bytes())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    match v.get(key) {
        Some(relay_core::wire::json::Value::String(s)) => s.clone(),
        Some(other) => relay_core::wire::canonical::to_string(other),
        None => panic!("no {key} in {text}"),
    }
}

/// Timeline lines (not UNVERIFIED, not empty).
fn lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn one_relay_send_sync_status_and_retry_without_duplicate() {
    let relay = Relay::start();
    let dir = Dir::new("one");
    let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
    let a = account(&alice, &relay.url);
    let b = account(&bob, &relay.url);
    let mode = std::fs::metadata(&alice).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let who = ok(&alice, &["whoami"]);
    assert_eq!(field(&who, "account"), a);
    assert_eq!(field(&who, "relay"), relay.url);

    let bob_card = card(&bob, &dir, "bob.card");
    let sent = ok(
        &alice,
        &["send", "--invite", bob_card.to_str().unwrap(), "hello bob"],
    );
    assert_eq!(json_str(&sent, "status"), "target_accepted", "{sent}");
    assert_eq!(json_str(&sent, "to"), b);
    let id = json_str(&sent, "message_id");
    let accepted_at = json_str(&sent, "accepted_at");

    let got = lines(&ok(&bob, &["sync"]));
    assert_eq!(got, vec![format!("1  received  {a}  hello bob")]);
    // The cursor moved: nothing new.
    assert!(lines(&ok(&bob, &["sync"])).is_empty());

    let st = ok(&alice, &["status", &id]);
    assert_eq!(json_str(&st, "status"), "target_accepted");
    assert_eq!(json_str(&st, "message_id"), id);

    // A session the relay no longer knows is re-opened once, transparently.
    let text = std::fs::read(&alice).unwrap();
    let mut profile = relay_core::wire::json::parse_object(&text).unwrap();
    let mut session = relay_core::wire::json::Object::new();
    session.insert("token", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    session.insert("expires_at", 9_000_000_000_000u64);
    profile.insert("session", session);
    std::fs::write(&alice, relay_core::wire::canonical::object_to_vec(&profile)).unwrap();
    let st = ok(&alice, &["status", &id]);
    assert_eq!(json_str(&st, "accepted_at"), accepted_at);
    let text = String::from_utf8(std::fs::read(&alice).unwrap()).unwrap();
    assert!(
        !text.contains("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        "a new session was kept"
    );

    // A retry re-sends the same bytes: the same result, no second record.
    let again = ok(&alice, &["retry", &id]);
    assert_eq!(json_str(&again, "message_id"), id);
    assert_eq!(json_str(&again, "accepted_at"), accepted_at);
    assert_eq!(lines(&ok(&bob, &["sync", "--from", "0"])).len(), 1);

    // The sender sees its own sent record, decrypted through its sender box.
    let mine = lines(&ok(&alice, &["sync"]));
    assert_eq!(mine, vec![format!("1  sent  {a}  hello bob")]);

    // A later message needs no card: the contact is remembered.
    let second = ok(&alice, &["send", "--to", &b, "again"]);
    assert_eq!(json_str(&second, "status"), "target_accepted");
    assert_eq!(
        lines(&ok(&bob, &["sync"])),
        vec![format!("2  received  {a}  again")]
    );
    // Without an invite a non-discoverable account refuses a stranger.
    let carol = dir.file("carol.json");
    account(&carol, &relay.url);
    let o = ctl(&carol, &["send", "--to", &b, "--refresh", "who am i"]);
    assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("discovery_disabled"), "{}", o.stdout);
}

#[test]
fn two_relays_exchange_messages_both_ways() {
    let (r1, r2) = (Relay::start(), Relay::start());
    let dir = Dir::new("two");
    let (alice, carol) = (dir.file("alice.json"), dir.file("carol.json"));
    let a = account(&alice, &r1.url);
    let c = account(&carol, &r2.url);
    let carol_card = card(&carol, &dir, "carol.card");
    let alice_card = card(&alice, &dir, "alice.card");

    let sent = ok(
        &alice,
        &[
            "send",
            "--invite",
            carol_card.to_str().unwrap(),
            "--wait",
            "20",
            "hi carol",
        ],
    );
    assert_eq!(json_str(&sent, "status"), "target_accepted", "{sent}");
    let reply = ok(
        &carol,
        &[
            "send",
            "--invite",
            alice_card.to_str().unwrap(),
            "--wait",
            "20",
            "hi alice",
        ],
    );
    assert_eq!(json_str(&reply, "status"), "target_accepted", "{reply}");

    let at_carol = lines(&ok(&carol, &["sync", "--from", "0"]));
    assert!(
        at_carol.contains(&format!("1  received  {a}  hi carol")),
        "{at_carol:?}"
    );
    assert!(
        at_carol.contains(&format!("2  sent  {c}  hi alice")),
        "{at_carol:?}"
    );
    let at_alice = lines(&ok(&alice, &["sync", "--from", "0"]));
    assert!(
        at_alice.contains(&format!("1  sent  {a}  hi carol")),
        "{at_alice:?}"
    );
    assert!(
        at_alice.contains(&format!("2  received  {c}  hi alice")),
        "{at_alice:?}"
    );

    let id = json_str(&sent, "message_id");
    let st = ok(&alice, &["status", &id]);
    assert_eq!(json_str(&st, "status"), "target_accepted");
    assert!(st.contains("target_accepted_at"), "{st}");
}

#[test]
fn follow_prints_new_messages_from_the_websocket() {
    let relay = Relay::start();
    let dir = Dir::new("follow");
    let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
    let a = account(&alice, &relay.url);
    account(&bob, &relay.url);
    let bob_card = card(&bob, &dir, "bob.card");
    ok(
        &alice,
        &["send", "--invite", bob_card.to_str().unwrap(), "before"],
    );

    let mut follower = Command::new(env!("CARGO_BIN_EXE_relayctl"))
        .arg("--profile")
        .arg(&bob)
        .args(["follow", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("follow starts");
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The backlog first, then what arrives while following.
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("backlog line");
    assert_eq!(first, format!("1  received  {a}  before"));
    ok(
        &alice,
        &[
            "send",
            "--to",
            &field(&ok(&bob, &["whoami"]), "account"),
            "live",
        ],
    );
    let second = rx.recv_timeout(Duration::from_secs(20)).expect("live line");
    assert_eq!(second, format!("2  received  {a}  live"));
    let status = follower.wait().expect("follow exits after --count");
    assert!(status.success());
    // follow kept the cursor.
    assert!(lines(&ok(&bob, &["sync"])).is_empty());
}

#[test]
fn device_unknown_refreshes_devices_and_sends_a_new_message_once() {
    let relay = Relay::start();
    let dir = Dir::new("devices");
    let (alice, bob, bob2) = (
        dir.file("alice.json"),
        dir.file("bob.json"),
        dir.file("bob2.json"),
    );
    let a = account(&alice, &relay.url);
    let b = account(&bob, &relay.url);
    let bob_card = card(&bob, &dir, "bob.card");
    ok(
        &alice,
        &[
            "send",
            "--invite",
            bob_card.to_str().unwrap(),
            "to the first device",
        ],
    );

    // Bob replaces his device; alice's cached device list is now stale.
    let old_device = field(&ok(&bob, &["whoami"]), "device");
    let new_device = field(
        &ok(&bob, &["device", "add", "--out", bob2.to_str().unwrap()]),
        "device",
    );
    ok(&bob2, &["device", "revoke", &old_device]);
    let list = ok(&bob2, &["device", "list"]);
    assert!(list.contains(&format!("{new_device}  active")), "{list}");
    assert!(list.contains(&format!("{old_device}  revoked")), "{list}");

    let o = ctl(&alice, &["send", "--to", &b, "to the new device"]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(
        json_str(&o.stdout, "status"),
        "target_accepted",
        "{}",
        o.stdout
    );
    assert!(o.stderr.contains("device_unknown"), "{}", o.stderr);
    let new_id = json_str(&o.stdout, "message_id");

    // Exactly one replacement: the outbox holds the failed original and the new message.
    let outbox = lines(&ok(&alice, &["outbox"]));
    assert_eq!(outbox.len(), 3, "{outbox:?}");
    assert!(outbox.iter().any(|l| l.contains("failed")), "{outbox:?}");
    assert!(outbox.iter().any(|l| l.starts_with(&new_id)), "{outbox:?}");

    // Only the new device can read it; the first message was sealed to the revoked one only.
    assert_eq!(
        lines(&ok(&bob2, &["sync", "--from", "0"])),
        vec![format!("2  received  {a}  to the new device")]
    );
}

/// A TCP proxy in front of a relay that can swallow the answers to `message.send`.
struct LossyProxy {
    port: u16,
    /// How many more message.send answers to drop (after the relay processed the request).
    drop_sends: Arc<AtomicUsize>,
    /// Every message.send body that went through.
    send_bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl LossyProxy {
    fn start(listener: TcpListener, upstream: u16) -> LossyProxy {
        let port = listener.local_addr().unwrap().port();
        let drop_sends = Arc::new(AtomicUsize::new(0));
        let send_bodies = Arc::new(Mutex::new(Vec::new()));
        let (d, b) = (drop_sends.clone(), send_bodies.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let (d, b) = (d.clone(), b.clone());
                std::thread::spawn(move || proxy_connection(conn, upstream, &d, &b));
            }
        });
        LossyProxy {
            port,
            drop_sends,
            send_bodies,
        }
    }
}

/// Reads one HTTP/1.1 message (head and Content-Length body); `None` at end of stream.
fn read_message(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn proxy_connection(
    client: TcpStream,
    upstream: u16,
    drop_sends: &AtomicUsize,
    bodies: &Mutex<Vec<Vec<u8>>>,
) {
    let mut from_client = BufReader::new(client.try_clone().unwrap());
    let mut to_client = client;
    let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
    let mut from_server = BufReader::new(server.try_clone().unwrap());
    let mut to_server = server;
    while let Some((head, body)) = read_message(&mut from_client) {
        let is_send = head.starts_with("POST /v1/message.send ");
        if is_send {
            bodies.lock().unwrap().push(body.clone());
        }
        to_server.write_all(head.as_bytes()).unwrap();
        to_server.write_all(&body).unwrap();
        let Some((rhead, rbody)) = read_message(&mut from_server) else {
            return;
        };
        let lose = is_send
            && drop_sends
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if lose {
            // The relay has answered; the client never hears it.
            let _ = to_client.shutdown(std::net::Shutdown::Both);
            return;
        }
        if to_client.write_all(rhead.as_bytes()).is_err() || to_client.write_all(&rbody).is_err() {
            return;
        }
    }
}

fn free_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("a free port")
}

#[test]
fn lost_answers_are_retried_with_the_same_bytes_and_never_under_a_new_id() {
    // The relay's id is the proxy's address, so every client request passes the proxy.
    let proxy_listener = free_listener();
    let proxy_url = format!(
        "http://127.0.0.1:{}",
        proxy_listener.local_addr().unwrap().port()
    );
    let relay_port = {
        let l = free_listener();
        l.local_addr().unwrap().port()
    };
    let _relay = Relay::behind(relay_port, &proxy_url);
    let proxy = LossyProxy::start(proxy_listener, relay_port);
    assert_eq!(
        proxy.port,
        proxy_url
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
    );

    let dir = Dir::new("lossy");
    let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
    let a = account(&alice, &proxy_url);
    let b = account(&bob, &proxy_url);
    let bob_card = card(&bob, &dir, "bob.card");

    // One lost answer: relayctl retries by itself and gets the stored result.
    proxy.drop_sends.store(1, Ordering::SeqCst);
    let o = ctl(
        &alice,
        &["send", "--invite", bob_card.to_str().unwrap(), "once"],
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(json_str(&o.stdout, "status"), "target_accepted");
    assert!(
        o.stderr.contains("retrying the same request"),
        "{}",
        o.stderr
    );
    {
        let bodies = proxy.send_bodies.lock().unwrap();
        assert_eq!(bodies.len(), 2, "one request and one retry");
        assert_eq!(bodies[0], bodies[1], "the retry is byte-identical");
    }
    assert_eq!(
        lines(&ok(&bob, &["sync", "--from", "0"])),
        vec![format!("1  received  {a}  once")]
    );

    // Every answer lost: relayctl gives up, says the outcome is unknown, makes no new id.
    proxy.send_bodies.lock().unwrap().clear();
    proxy.drop_sends.store(usize::MAX, Ordering::SeqCst);
    let o = ctl(&alice, &["--attempts", "2", "send", "--to", &b, "twice?"]);
    assert_eq!(o.code, 3, "{} {}", o.stdout, o.stderr);
    assert!(o.stderr.contains("outcome unknown"), "{}", o.stderr);
    let id = o
        .stderr
        .split("relayctl retry ")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .expect("the error names the message id")
        .to_string();
    {
        let bodies = proxy.send_bodies.lock().unwrap();
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[0], bodies[1]);
    }
    let outbox = ok(&alice, &["outbox"]);
    assert!(outbox.contains(&format!("{id}  unknown")), "{outbox}");

    // The relay is reachable again: `retry` sends the very same request.
    proxy.drop_sends.store(0, Ordering::SeqCst);
    let again = ok(&alice, &["retry", &id]);
    assert_eq!(json_str(&again, "message_id"), id);
    assert_eq!(json_str(&again, "status"), "target_accepted");
    {
        let bodies = proxy.send_bodies.lock().unwrap();
        assert_eq!(bodies.len(), 3);
        assert!(bodies.iter().all(|x| x == &bodies[0]));
    }
    assert_eq!(
        lines(&ok(&bob, &["sync", "--from", "0"])),
        vec![
            format!("1  received  {a}  once"),
            format!("2  received  {a}  twice?")
        ],
        "each message is in the timeline exactly once"
    );
}
