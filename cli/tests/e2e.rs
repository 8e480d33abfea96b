//! relayctl end to end against real relay processes of both hosts: the wasmtime host
//! (`target/release/relay` with `target/component/`) and the Node host
//! (`host-node/bin/relay-node.js` with `host-node/pkg`), started by the shared kit in
//! `relay_tests::live`. Every test runs against each host (the two-relay test over both
//! mixed pairs) and names the host it failed on.
//!
//! The relays are not built here: `./x test` (or `cargo build --release -p
//! relay-host-wasmtime` and the xtask bindgen) leaves them. A missing one fails the
//! tests; it never skips them.

use relay_tests::live::each;
use relay_tests::live::host::{Kind, Opts, Relay};
use relay_tests::live::proxy::{Fault, Hit, Proxy};
use std::io::{BufRead, BufReader};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A relay of `kind` with the kit's defaults (fast retries, short attempt timeout).
fn relay(kind: Kind) -> Relay {
    Relay::start(kind, Opts::default())
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
    each(&Kind::ALL, |kind| {
        let relay = relay(kind);
        let url = relay.id();
        let dir = Dir::new(&format!("one-{}", kind.name()));
        let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
        let a = account(&alice, &url);
        let b = account(&bob, &url);
        let mode = std::fs::metadata(&alice).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let who = ok(&alice, &["whoami"]);
        assert_eq!(field(&who, "account"), a);
        assert_eq!(field(&who, "relay"), url);

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
        account(&carol, &url);
        let o = ctl(&carol, &["send", "--to", &b, "--refresh", "who am i"]);
        assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
        assert!(o.stdout.contains("discovery_disabled"), "{}", o.stdout);
    });
}

#[test]
fn two_relays_exchange_messages_both_ways() {
    // Alice's relay on one host, carol's on the other, then the reverse.
    let mixed = [(Kind::Wasmtime, Kind::Node), (Kind::Node, Kind::Wasmtime)];
    each(&mixed, |(ka, kc)| {
        let (r1, r2) = (relay(ka), relay(kc));
        let dir = Dir::new(&format!("two-{}-{}", ka.name(), kc.name()));
        let (alice, carol) = (dir.file("alice.json"), dir.file("carol.json"));
        let a = account(&alice, &r1.id());
        let c = account(&carol, &r2.id());
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
    });
}

/// The relay the outbox entry `id` of `profile` names (read from the profile file).
fn outbox_relay(profile: &Path, id: &str) -> String {
    let text = std::fs::read(profile).expect("profile");
    let p = relay_core::wire::json::parse_object(&text).expect("profile is JSON");
    p.get("outbox")
        .and_then(|o| o.as_object())
        .and_then(|o| o.get(id))
        .and_then(|e| e.as_object())
        .and_then(|e| e.get("relay"))
        .and_then(|r| r.as_str())
        .unwrap_or_else(|| panic!("no outbox entry {id} with a relay"))
        .to_string()
}

#[test]
fn a_moved_account_still_reads_what_its_former_home_accepted() {
    each(&Kind::ALL, |kind| {
        let (home_a, home_b) = (relay(kind), relay(kind));
        let (url_a, url_b) = (home_a.id(), home_b.id());
        let dir = Dir::new(&format!("move-{}", kind.name()));
        let (alice, alice2, bob) = (
            dir.file("alice.json"),
            dir.file("alice2.json"),
            dir.file("bob.json"),
        );
        let a = account(&alice, &url_a);
        let b = account(&bob, &url_a);
        // A second device of alice's, added at A before the move: it goes along.
        let second = field(
            &ok(
                &alice,
                &["device", "add", "--out", alice2.to_str().unwrap()],
            ),
            "device",
        );
        let bob_card = card(&bob, &dir, "bob.card");
        let before = ok(
            &alice,
            &[
                "send",
                "--invite",
                bob_card.to_str().unwrap(),
                "before the move",
            ],
        );
        assert_eq!(json_str(&before, "status"), "target_accepted", "{before}");
        let old_id = json_str(&before, "message_id");
        let accepted_at = json_str(&before, "accepted_at");

        let moved = ok(&alice, &["account", "move", "--to", &url_b]);
        assert_eq!(field(&moved, "relay"), url_b, "{moved}");
        assert_eq!(field(&moved, "former"), url_a, "{moved}");
        assert_eq!(field(&moved, "route"), "revision 2", "{moved}");
        assert!(field(&moved, "devices").contains(&second), "{moved}");
        // B serves the account now, with both devices.
        let listed = ok(&alice, &["device", "list"]);
        assert!(listed.contains(&format!("{second}  active")), "{listed}");

        // The old message is A's: status and retry go there (B never saw it) and get A's
        // result, over a session opened at A.
        assert_eq!(outbox_relay(&alice, &old_id), url_a);
        let st = ok(&alice, &["status", &old_id]);
        assert_eq!(json_str(&st, "status"), "target_accepted", "{st}");
        assert_eq!(json_str(&st, "accepted_at"), accepted_at);
        let again = ok(&alice, &["retry", &old_id]);
        assert_eq!(json_str(&again, "message_id"), old_id);
        assert_eq!(json_str(&again, "accepted_at"), accepted_at);

        // sync reads the record A keeps (B holds none yet), each relay from its own cursor.
        let o = ctl(&alice, &["sync"]);
        assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
        assert_eq!(
            lines(&o.stdout),
            vec![format!("1  sent  {a}  before the move")]
        );
        assert!(o.stderr.contains(&url_a), "{}", o.stderr);
        assert!(lines(&ok(&alice, &["sync"])).is_empty());

        // A new message is sent via B, to bob who stays at A.
        let after = ok(
            &alice,
            &["send", "--to", &b, "--wait", "20", "after the move"],
        );
        assert_eq!(json_str(&after, "status"), "target_accepted", "{after}");
        let new_id = json_str(&after, "message_id");
        assert_ne!(new_id, old_id);
        assert_eq!(outbox_relay(&alice, &new_id), url_b);
        assert_eq!(
            lines(&ok(&alice, &["sync"])),
            vec![format!("1  sent  {a}  after the move")]
        );
        // From the start: A's records first, then B's.
        assert_eq!(
            lines(&ok(&alice, &["sync", "--from", "0"])),
            vec![
                format!("1  sent  {a}  before the move"),
                format!("1  sent  {a}  after the move"),
            ]
        );

        // Bob has each message exactly once.
        assert_eq!(
            lines(&ok(&bob, &["sync", "--from", "0"])),
            vec![
                format!("1  received  {a}  before the move"),
                format!("2  received  {a}  after the move"),
            ]
        );

        // The second device follows the move alice made, and reads both homes as well.
        let followed = ok(&alice2, &["account", "move", "--to", &url_b]);
        assert_eq!(field(&followed, "relay"), url_b, "{followed}");
        assert_eq!(field(&followed, "route"), "revision 2", "{followed}");
        assert_eq!(field(&followed, "former"), url_a, "{followed}");
        assert_eq!(
            lines(&ok(&alice2, &["sync"])),
            vec![
                format!("1  sent  {a}  before the move"),
                format!("1  sent  {a}  after the move"),
            ]
        );

        // A former home that cannot be reached is named on stderr; the home is still read.
        drop(home_a);
        let o = ctl(&alice, &["sync", "--from", "0"]);
        assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
        assert!(
            o.stderr
                .contains(&format!("former home {url_a} is unreachable")),
            "{}",
            o.stderr
        );
        assert_eq!(
            lines(&o.stdout),
            vec![format!("1  sent  {a}  after the move")]
        );
    });
}

/// A child process, killed when dropped (so a failed test leaves no follower behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn follow_prints_new_messages_from_the_websocket() {
    each(&Kind::ALL, |kind| {
        let relay = relay(kind);
        let dir = Dir::new(&format!("follow-{}", kind.name()));
        let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
        let a = account(&alice, &relay.id());
        account(&bob, &relay.id());
        let bob_card = card(&bob, &dir, "bob.card");
        ok(
            &alice,
            &["send", "--invite", bob_card.to_str().unwrap(), "before"],
        );

        let mut follower = Killed(
            Command::new(env!("CARGO_BIN_EXE_relayctl"))
                .arg("--profile")
                .arg(&bob)
                .args(["follow", "--count", "2"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("follow starts"),
        );
        let stdout = follower.0.stdout.take().unwrap();
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
        let status = follower.0.wait().expect("follow exits after --count");
        assert!(status.success());
        // follow kept the cursor.
        assert!(lines(&ok(&bob, &["sync"])).is_empty());
    });
}

#[test]
fn device_unknown_refreshes_devices_and_sends_a_new_message_once() {
    each(&Kind::ALL, |kind| {
        let relay = relay(kind);
        let dir = Dir::new(&format!("devices-{}", kind.name()));
        let (alice, bob, bob2) = (
            dir.file("alice.json"),
            dir.file("bob.json"),
            dir.file("bob2.json"),
        );
        let a = account(&alice, &relay.id());
        let b = account(&bob, &relay.id());
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
    });
}

/// Where a client sends messages (the proxy drops answers there, nowhere else).
const SEND: &str = "/v1/message.send";

/// The message.send requests the proxy has seen, once it has seen (at least) `n`.
fn sends(proxy: &Proxy, n: usize) -> Vec<Hit> {
    proxy.wait_hits_on(SEND, n)
}

/// What the proxy did to each request, and what the relay answered.
fn faults(hits: &[Hit]) -> Vec<(Fault, Option<u16>)> {
    hits.iter().map(|h| (h.fault, h.upstream_status)).collect()
}

/// The requests carry one message id and exactly the same bytes.
fn same_request(hits: &[Hit], id: &str) {
    for (i, h) in hits.iter().enumerate() {
        assert_eq!(
            h.message_id.as_deref(),
            Some(id),
            "attempt {i} is not under the message's id"
        );
        assert_eq!(h.body, hits[0].body, "attempt {i} is not byte-identical");
    }
}

/// The relay processed the request and the client never heard its answer.
fn lost_after_processing(h: &Hit) {
    assert_eq!(
        h.fault,
        Fault::DropResponse,
        "{:?}",
        faults(std::slice::from_ref(h))
    );
    assert_eq!(
        h.upstream_status,
        Some(200),
        "the relay did not accept the request whose answer was lost: {:?}",
        String::from_utf8_lossy(&h.answer)
    );
}

#[test]
fn lost_answers_are_retried_with_the_same_bytes_and_never_under_a_new_id() {
    each(&Kind::ALL, |kind| {
        // The relay's id is the proxy's address, so every client request passes the proxy;
        // only the answers of message.send are ever lost.
        let proxy = Proxy::start();
        let relay = Relay::start(
            kind,
            Opts {
                url: Some(proxy.url()),
                ..Opts::default()
            },
        );
        proxy.set_upstream(relay.port);
        proxy.faults_on(SEND);
        let url = relay.id();
        assert_eq!(url, proxy.url());

        let dir = Dir::new(&format!("lossy-{}", kind.name()));
        let (alice, bob) = (dir.file("alice.json"), dir.file("bob.json"));
        let a = account(&alice, &url);
        let b = account(&bob, &url);
        let bob_card = card(&bob, &dir, "bob.card");
        assert!(
            proxy.log().len() > 2,
            "relayctl did not talk to the relay through the proxy"
        );
        assert!(proxy.hits_on(SEND).is_empty());

        // One lost answer: relayctl retries by itself and gets the stored result.
        proxy.script(&[Fault::DropResponse]);
        let o = ctl(
            &alice,
            &["send", "--invite", bob_card.to_str().unwrap(), "once"],
        );
        assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
        assert_eq!(json_str(&o.stdout, "status"), "target_accepted");
        assert!(
            o.stderr.contains("retrying the same request"),
            "relayctl did not retry the lost send; stderr: {:?}",
            o.stderr
        );
        let first = json_str(&o.stdout, "message_id");
        let hits = sends(&proxy, 2);
        assert_eq!(
            hits.len(),
            2,
            "one request and one retry: {:?}",
            faults(&hits)
        );
        lost_after_processing(&hits[0]);
        assert_eq!(hits[1].fault, Fault::Pass);
        same_request(&hits, &first);
        assert_eq!(
            lines(&ok(&bob, &["sync", "--from", "0"])),
            vec![format!("1  received  {a}  once")]
        );

        // Every answer lost: relayctl gives up, says the outcome is unknown, makes no new id.
        proxy.script(&[Fault::DropResponse; 16]);
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
        assert_ne!(id, first);
        let hits = sends(&proxy, 4);
        assert_eq!(
            hits.len(),
            4,
            "two attempts of the second message: {:?}",
            faults(&hits)
        );
        let lost = &hits[2..];
        lost.iter().for_each(lost_after_processing);
        same_request(lost, &id);
        let outbox = ok(&alice, &["outbox"]);
        assert!(outbox.contains(&format!("{id}  unknown")), "{outbox}");

        // The relay is reachable again: `retry` sends the very same request.
        proxy.heal();
        let again = ok(&alice, &["retry", &id]);
        assert_eq!(json_str(&again, "message_id"), id);
        assert_eq!(json_str(&again, "status"), "target_accepted");
        let hits = sends(&proxy, 5);
        assert_eq!(
            hits.len(),
            5,
            "one more request for the retry: {:?}",
            faults(&hits)
        );
        assert_eq!(hits[4].fault, Fault::Pass);
        same_request(&hits[2..], &id);
        assert_eq!(
            lines(&ok(&bob, &["sync", "--from", "0"])),
            vec![
                format!("1  received  {a}  once"),
                format!("2  received  {a}  twice?")
            ],
            "each message is in the timeline exactly once"
        );
    });
}
