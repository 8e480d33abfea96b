//! A client that talks to relays over real HTTP, as a person's client would.
#![allow(dead_code)]

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::json::{self, Object, Value};
use relay_host_wasmtime::settings::Settings;
use relay_host_wasmtime::{admin_client, now_ms, AdminClient, Running};

pub const NET: &str = "dev";

/// Starts an in-memory relay on an ephemeral loopback port.
pub async fn relay(tune: impl FnOnce(&mut Settings)) -> Running {
    let mut s = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data: None,
        ..Settings::default()
    };
    tune(&mut s);
    relay_host_wasmtime::start(s).await.expect("relay starts")
}

/// An account with one device, registered at a relay over HTTP.
pub struct User {
    pub key: AccountKey,
    pub device: DeviceKey,
    pub cert: Object,
    pub relay: String,
    pub session: String,
}

pub struct Client {
    pub http: AdminClient,
    pub rng: ChaCha20Rng,
    /// The network the client's objects name (`dev` unless set).
    pub net: String,
}

impl Client {
    pub fn new(seed: u64) -> Client {
        Client {
            http: admin_client(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            net: NET.to_string(),
        }
    }

    pub async fn post(&self, url: &str, session: Option<&str>, body: &Object) -> (u16, Value) {
        let auth = session.map(|s| format!("Bearer {s}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        let (status, body) = self
            .http
            .post(url, &headers, canonical::object_to_vec(body))
            .await
            .expect("http");
        (status, json::parse(&body).unwrap_or(Value::Null))
    }

    pub fn route(&self, user_key: &AccountKey, relay: &str, revision: u64) -> Object {
        draft::route(&self.net, &user_key.id(), relay, revision, now_ms()).sign(user_key)
    }

    /// Registers an account at `relay` and opens a session.
    pub async fn register(&mut self, relay: &str, discoverable: bool) -> User {
        let u = self.user(relay);
        self.register_user(u, discoverable).await
    }

    /// A user homed at `relay` with fresh keys, not registered anywhere yet (no session).
    pub fn user(&mut self, relay: &str) -> User {
        let key = AccountKey::generate(&mut self.rng);
        let device = DeviceKey::generate(&mut self.rng);
        let cert = draft::certificate(
            &self.net,
            &key,
            &device,
            &["send", "sync", "manage"],
            now_ms(),
        )
        .sign(&key);
        User {
            key,
            device,
            cert,
            relay: relay.to_string(),
            session: String::new(),
        }
    }

    /// Registers `u` at its relay and opens a session.
    pub async fn register_user(&mut self, mut u: User, discoverable: bool) -> User {
        let mut p = Object::new();
        p.insert("route", self.route(&u.key, &u.relay, 1));
        p.insert("certificate", u.cert.clone());
        p.insert("discoverable", discoverable);
        let (s, v) = self
            .post(&format!("{}/v1/account.register", u.relay), None, &p)
            .await;
        assert_eq!(s, 200, "{v:?}");
        u.session = self.open_session(&u).await;
        u
    }

    pub async fn open_session(&mut self, u: &User) -> String {
        let so = draft::session_open(
            &self.net,
            &u.relay,
            &u.key.id(),
            &u.device.id(),
            now_ms(),
            &random_id(&mut self.rng),
        )
        .sign(&u.device);
        let (s, v) = self
            .post(&format!("{}/v1/session.open", u.relay), None, &so)
            .await;
        assert_eq!(s, 200, "{v:?}");
        v.as_object()
            .and_then(|o| o.get("session"))
            .and_then(Value::as_str)
            .unwrap()
            .to_string()
    }

    /// Publishes `u`'s route at another relay.
    pub async fn publish(&self, at: &str, u: &User) {
        let mut p = Object::new();
        p.insert("route", self.route(&u.key, &u.relay, 1));
        let (s, v) = self.post(&format!("{at}/v1/route.publish"), None, &p).await;
        assert_eq!(s, 200, "{v:?}");
    }

    /// message.send params from `from` to `to` with `text`.
    pub fn message(&mut self, from: &User, to: &User, text: &str) -> Object {
        let key = seal::message_key(&mut self.rng);
        let body = seal::seal_body(&mut self.rng, &key, text.as_bytes());
        let env = draft::envelope(
            &self.net,
            &random_id(&mut self.rng),
            &from.key.id(),
            &from.device.id(),
            &to.key.id(),
            now_ms(),
            body,
        )
        .sign(&from.device);
        let kb = seal::seal_key_box(&mut self.rng, &to.device.id(), &to.device.box_key(), &key);
        let mut p = Object::new();
        p.insert("envelope", env);
        p.insert("recipient_boxes", seal::boxes(vec![kb]));
        p
    }

    pub async fn send(&self, from: &User, params: &Object) -> (u16, Value) {
        self.post(
            &format!("{}/v1/message.send", from.relay),
            Some(&from.session),
            params,
        )
        .await
    }

    pub async fn status(&self, from: &User, message_id: &str) -> (u16, Value) {
        let mut p = Object::new();
        p.insert("message_id", message_id);
        self.post(
            &format!("{}/v1/message.delivery.status", from.relay),
            Some(&from.session),
            &p,
        )
        .await
    }

    /// The decrypted texts in `u`'s timeline.
    pub async fn texts(&self, u: &User) -> Vec<String> {
        let mut p = Object::new();
        p.insert("after", 0u64);
        let (s, v) = self
            .post(
                &format!("{}/v1/message.timeline.sync", u.relay),
                Some(&u.session),
                &p,
            )
            .await;
        assert_eq!(s, 200, "{v:?}");
        let entries = match v.as_object().and_then(|o| o.get("entries")) {
            Some(Value::Array(a)) => a.clone(),
            _ => vec![],
        };
        entries
            .iter()
            .map(|e| {
                let e = e.as_object().unwrap();
                let kb = e.get("key_box").and_then(Value::as_object).unwrap();
                let key = seal::open_key_box(kb, &u.device).expect("key box opens");
                let body = e
                    .get("envelope")
                    .and_then(Value::as_object)
                    .and_then(|o| o.get("body"))
                    .and_then(Value::as_object)
                    .unwrap();
                String::from_utf8(seal::open_body(body, &key).expect("body opens")).unwrap()
            })
            .collect()
    }

    /// Polls the status until it is terminal (or `tries` run out).
    pub async fn wait_terminal(&self, from: &User, message_id: &str, tries: u32) -> Value {
        for _ in 0..tries {
            let (_, v) = self.status(from, message_id).await;
            let st = v
                .as_object()
                .and_then(|o| o.get("status"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if st == "target_accepted" || st == "failed" {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("message {message_id} did not finish");
    }
}

pub fn message_id(p: &Object) -> String {
    p.get("envelope")
        .and_then(Value::as_object)
        .and_then(|e| e.get("message_id"))
        .and_then(Value::as_str)
        .unwrap()
        .to_string()
}

pub fn status_of(v: &Value) -> String {
    v.as_object()
        .and_then(|o| o.get("status"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// An empty directory of its own under the system's temporary directory.
pub fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("relay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// `relay serve ARGS... --listen 127.0.0.1:PORT` (stdout discarded, stderr as `stderr`
/// says), once it answers `/readyz`; panics if it never does.
pub async fn serve_process(
    args: &[&std::ffi::OsStr],
    port: u16,
    stderr: std::process::Stdio,
) -> std::process::Child {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .arg("serve")
        .args(args)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RELAY_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("relay starts");
    let http = admin_client();
    let url = format!("http://127.0.0.1:{port}/readyz");
    for _ in 0..400 {
        if let Ok((200, _)) = http.get(&url).await {
            return child;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the relay did not come up");
}

/// `relay admin --data DATA ARGS...`: whether it succeeded, and what it printed (stdout,
/// then stderr).
pub fn relay_admin<S: AsRef<std::ffi::OsStr>>(
    data: &std::path::Path,
    args: &[S],
) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .arg("admin")
        .arg("--data")
        .arg(data)
        .args(args)
        .output()
        .expect("relay admin runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}
