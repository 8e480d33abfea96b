//! Load generator: message.send with local delivery, over loopback HTTP against a `relay`
//! process, beside the native in-process engine doing the same operation.
//!
//! `cargo run --release -p relay-host-wasmtime --example loadgen -- [MESSAGES] [CONCURRENCY...]`
//! (build `relay` and the component first: `./x serve --help` does both).

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::engine::{Caller, Config, Engine, MemoryStore, Storage};
use relay_core::wire::canonical;
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{Object, Value};
use relay_host_wasmtime::store::SqliteStore;
use relay_host_wasmtime::{admin_client, now_ms};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NET: &str = "dev";
const SENDERS: usize = 16;

struct Account {
    key: AccountKey,
    device: DeviceKey,
    cert: Object,
}

fn account(rng: &mut ChaCha20Rng) -> Account {
    let key = AccountKey::generate(rng);
    let device = DeviceKey::generate(rng);
    let cert = draft::certificate(
        NET,
        &key,
        &device,
        &["send", "sync", "manage"],
        now_ms() - 1000,
    )
    .sign(&key);
    Account { key, device, cert }
}

fn register(a: &Account, relay: &str) -> Vec<u8> {
    let mut p = Object::new();
    p.insert(
        "route",
        draft::route(NET, &a.key.id(), relay, 1, now_ms()).sign(&a.key),
    );
    p.insert("certificate", a.cert.clone());
    p.insert("discoverable", true);
    canonical::object_to_vec(&p)
}

fn session_open(a: &Account, relay: &str, rng: &mut ChaCha20Rng) -> Vec<u8> {
    canonical::object_to_vec(
        &draft::session_open(
            NET,
            relay,
            &a.key.id(),
            &a.device.id(),
            now_ms(),
            &random_id(rng),
        )
        .sign(&a.device),
    )
}

/// Pre-signed message.send bodies, round-robin over the senders, all to `to`.
fn messages(
    senders: &[Account],
    to: &Account,
    n: usize,
    rng: &mut ChaCha20Rng,
) -> Vec<(usize, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let s = i % senders.len();
            let from = &senders[s];
            let key = seal::message_key(rng);
            let body = seal::seal_body(rng, &key, &[b'x'; 900]);
            let env = draft::envelope(
                NET,
                &random_id(rng),
                &from.key.id(),
                &from.device.id(),
                &to.key.id(),
                now_ms(),
                body,
            )
            .sign(&from.device);
            let kb = seal::seal_key_box(rng, &to.device.id(), &to.device.box_key(), &key);
            let mut p = Object::new();
            p.insert("envelope", env);
            p.insert("recipient_boxes", seal::boxes(vec![kb]));
            (s, canonical::object_to_vec(&p))
        })
        .collect()
}

fn token(v: &[u8]) -> String {
    let o = relay_core::wire::json::parse_object(v).expect("session");
    o.get("session")
        .and_then(Value::as_str)
        .expect("session")
        .to_string()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// The native engine in-process over `store`: messages per second.
fn native<S: Storage>(store: S, n: usize) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let relay = "http://127.0.0.1:1";
    let mut cfg = Config::new(RelayId::parse(relay).unwrap(), NET);
    cfg.policies.send_rate = 0;
    cfg.policies.deliver_rate_per_account = 0;
    let mut entropy = ChaCha20Rng::seed_from_u64(8);
    let mut e = Engine::new(cfg, store, move |b: &mut [u8]| {
        rand::RngCore::fill_bytes(&mut entropy, b)
    });
    let senders: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
    let to = account(&mut rng);
    let now = now_ms();
    let mut tokens = Vec::new();
    for a in senders.iter().chain(std::iter::once(&to)) {
        e.call(
            &Caller::Anonymous,
            "account.register",
            &register(a, relay),
            now,
        )
        .result
        .expect("register");
        tokens.push(token(
            &e.call(
                &Caller::Anonymous,
                "session.open",
                &session_open(a, relay, &mut rng),
                now,
            )
            .body(),
        ));
    }
    let msgs = messages(&senders, &to, n, &mut rng);
    let t = Instant::now();
    for (s, body) in &msgs {
        let r = e.call(
            &Caller::Session(tokens[*s].clone()),
            "message.send",
            body,
            now,
        );
        assert!(r.result.is_ok(), "{:?}", r.result);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let concurrencies: Vec<usize> = if args.len() > 1 {
        args[1..].iter().filter_map(|a| a.parse().ok()).collect()
    } else {
        vec![1, 8, 32]
    };
    let dir = std::env::temp_dir().join(format!("relay-loadgen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let exe = std::env::current_exe()?.parent().unwrap().join("../relay");
    let mut child = std::process::Command::new(&exe)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(&dir)
        .args([
            "--policy",
            "send_rate=0",
            "--policy",
            "deliver_rate_per_account=0",
        ])
        .env("RELAY_LOG", "warn")
        .spawn()
        .map_err(|e| anyhow::anyhow!("{}: {e}", exe.display()))?;
    let http = Arc::new(admin_client());
    for _ in 0..200 {
        if http.get(&format!("{url}/.well-known/relay")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let senders: Vec<Account> = (0..SENDERS).map(|_| account(&mut rng)).collect();
    let to = account(&mut rng);
    let mut tokens = Vec::new();
    for a in senders.iter().chain(std::iter::once(&to)) {
        http.post(
            &format!("{url}/v1/account.register"),
            &[],
            register(a, &url),
        )
        .await?;
        let (_, s) = http
            .post(
                &format!("{url}/v1/session.open"),
                &[],
                session_open(a, &url, &mut rng),
            )
            .await?;
        tokens.push(format!("Bearer {}", token(&s)));
    }
    let tokens = Arc::new(tokens);
    println!(
        "message.send with local delivery, {n} messages of ~1.6 KB, SQLite (WAL, synchronous=FULL)"
    );
    println!(
        "{:<34} {:>10} {:>9} {:>9}",
        "setup", "msg/s", "p50 ms", "p99 ms"
    );
    let mut best = 0.0f64;
    for &c in &concurrencies {
        let msgs = Arc::new(messages(&senders, &to, n, &mut rng));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..c {
            let (http, msgs, next, tokens, url) = (
                http.clone(),
                msgs.clone(),
                next.clone(),
                tokens.clone(),
                url.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= msgs.len() {
                        return lat;
                    }
                    let (s, body) = &msgs[i];
                    let t = Instant::now();
                    let (status, b) = http
                        .post(
                            &format!("{url}/v1/message.send"),
                            &[("authorization", &tokens[*s])],
                            body.clone(),
                        )
                        .await
                        .expect("send");
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
                    lat.push(t.elapsed());
                }
            }));
        }
        let mut lat = Vec::new();
        for w in workers {
            lat.extend(w.await?);
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        best = best.max(rate);
        lat.sort();
        println!(
            "{:<34} {:>10.0} {:>9.2} {:>9.2}",
            format!("wasmtime host, HTTP, concurrency {c}"),
            rate,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99)
        );
    }
    child.kill()?;
    let _ = child.wait();
    let mem = native(MemoryStore::new(), n);
    let db = dir.join("native.sqlite");
    let sql = native(
        SqliteStore::open(&db).map_err(|e| anyhow::anyhow!("{e}"))?,
        n,
    );
    println!("{:<34} {:>10.0}", "native engine in-process, memory", mem);
    println!("{:<34} {:>10.0}", "native engine in-process, SQLite", sql);
    println!(
        "ratio wasmtime HTTP (best) / native SQLite: {:.2}",
        best / sql
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
