//! Profiling aids for one operation at a time (not part of `./x bench`).
//!
//! `cargo run --release -p relay-bench --example profile -- calls` prints every storage
//! call of one message.send (local delivery) and one message.deliver on the native engine.
//! `cargo run --release -p relay-bench --example profile -- component N` runs N sends and N
//! delivers through the component (`WASM=path` to pick one) on the relay's engine and prints
//! µs per operation (`component N metered`: on a fuel-metered engine, with fuel per
//! operation); under `RELAY_PERFMAP=1 perf record` the wasm functions have names.
//! `... -- native N` does the same on the native engine over memory (no fuel).

// The bench's own fixture, configuration and targets, shared with `./x bench`.
#[path = "../src/fixture.rs"]
#[allow(dead_code)]
mod fixture;
#[path = "../src/inproc.rs"]
#[allow(dead_code)]
mod inproc;
#[path = "../src/report.rs"]
#[allow(dead_code)]
mod report;

use relay_core::engine::storage::{Entry, Write};
use relay_core::engine::{Caller, Engine, MemoryStore, Storage, StorageError};
use relay_core::wire::identity::RelayId;
use relay_host_wasmtime::guest;
use relay_host_wasmtime::now_ms;
use relay_host_wasmtime::store::AnyStore;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// A memory store that logs its calls while `on`.
struct Logged {
    inner: MemoryStore,
    on: Rc<Cell<bool>>,
    log: Rc<RefCell<Vec<String>>>,
}

impl Logged {
    fn note(&self, line: String) {
        if self.on.get() {
            self.log.borrow_mut().push(line);
        }
    }
}

impl Storage for Logged {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let r = self.inner.get(key)?;
        let len = r.as_ref().map_or(0, Vec::len);
        self.note(format!(
            "get {} -> {len} bytes",
            String::from_utf8_lossy(key)
        ));
        Ok(r)
    }
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        let r = self.inner.scan(start, end, limit)?;
        self.note(format!(
            "scan {}.. limit {limit} -> {} rows",
            String::from_utf8_lossy(start),
            r.len()
        ));
        Ok(r)
    }
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        self.note(format!("commit {} writes", batch.len()));
        self.inner.commit(batch)
    }
}

/// Registers the fixture's accounts on a native engine; their session tokens.
fn register<S: Storage>(
    e: &mut Engine<S, inproc::Seeded>,
    fx: &fixture::Fixture,
    now: u64,
) -> Vec<String> {
    let mut tokens = Vec::new();
    for a in &fx.accounts {
        e.call(&Caller::Anonymous, "account.register", &a.register, now);
        let r = e.call(&Caller::Anonymous, "session.open", &a.session_open, now);
        tokens.push(fixture::token(&r.body()).expect("session"));
    }
    tokens
}

fn calls() {
    let fx = fixture::build(fixture::INPROC_RELAY, 8, 1, 1);
    let on = Rc::new(Cell::new(false));
    let log = Rc::new(RefCell::new(Vec::new()));
    let store = Logged {
        inner: MemoryStore::new(),
        on: on.clone(),
        log: log.clone(),
    };
    let mut e = Engine::new(inproc::config(), store, inproc::seeded(1));
    let now = now_ms();
    let tokens = register(&mut e, &fx, now);
    for (i, (s, p)) in fx.sends.iter().enumerate() {
        // The last send is logged, after the others warmed every record it touches.
        on.set(i + 1 == fx.sends.len());
        let r = e.call(&Caller::Session(tokens[*s].clone()), "message.send", p, now);
        assert_eq!(r.http_status(), 200);
    }
    println!("message.send with local delivery:");
    for l in log.borrow_mut().drain(..) {
        println!("  {l}");
    }
    let peer = Caller::relay_at(
        RelayId::parse(fixture::PEER_RELAY).expect("peer"),
        Some(fixture::ROUTE_REVISION),
    );
    let r = e.call(&peer, "message.deliver", &fx.delivers[0], now);
    assert_eq!(r.http_status(), 200);
    on.set(false);
    println!("message.deliver:");
    for l in log.borrow().iter() {
        println!("  {l}");
    }
}

fn component(n: usize, metered: bool) {
    let fx = fixture::build(fixture::INPROC_RELAY, n, n, 1);
    let path = std::env::var("WASM").unwrap_or_else(|_| "target/component/relay_core.wasm".into());
    let store = AnyStore::Memory(MemoryStore::new());
    let file = std::path::Path::new(&path);
    let mut wasm = if metered {
        inproc::Wasm::load_metered(file, store)
    } else {
        inproc::Wasm::load(file, store)
    }
    .unwrap_or_else(|e| panic!("{e:#}"));
    let core = wasm.core();
    let now = now_ms();
    let mut tokens = Vec::new();
    for a in &fx.accounts {
        core.call(
            &guest::Caller::Anonymous,
            "account.register",
            &a.register,
            now,
        );
        let r = core.call(
            &guest::Caller::Anonymous,
            "session.open",
            &a.session_open,
            now,
        );
        tokens.push(fixture::token(&r.body).expect("session"));
    }
    perf_enable();
    let (f0, t) = (core.fuel_spent, Instant::now());
    for (s, p) in &fx.sends {
        let r = core.call(
            &guest::Caller::Session(tokens[*s].clone()),
            "message.send",
            p,
            now,
        );
        assert_eq!(r.status, 200);
    }
    let (send, f1, t) = (t.elapsed(), core.fuel_spent, Instant::now());
    for p in &fx.delivers {
        let peer = guest::Caller::Relay(guest::RelayCaller {
            relay: fixture::PEER_RELAY.into(),
            route_revision: Some(fixture::ROUTE_REVISION),
        });
        let r = core.call(&peer, "message.deliver", p, now);
        assert_eq!(r.status, 200);
    }
    let (deliver, f2) = (t.elapsed(), core.fuel_spent);
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    let engine = if metered {
        "metered"
    } else {
        "the relay's engine"
    };
    println!(
        "message.send {:.1} µs, {} fuel; message.deliver {:.1} µs, {} fuel (per operation, {path}, {engine})",
        per(send),
        (f1 - f0) / n as u64,
        per(deliver),
        (f2 - f1) / n as u64
    );
}

/// N sends and N delivers through the native engine on memory (for `perf record`).
fn native(n: usize) {
    let fx = fixture::build(fixture::INPROC_RELAY, n, n, 1);
    let mut e = Engine::new(inproc::config(), MemoryStore::new(), inproc::seeded(1));
    let now = now_ms();
    let tokens = register(&mut e, &fx, now);
    perf_enable();
    let t = Instant::now();
    for (s, p) in &fx.sends {
        let r = e.call(&Caller::Session(tokens[*s].clone()), "message.send", p, now);
        assert_eq!(r.http_status(), 200);
    }
    let (send, t) = (t.elapsed(), Instant::now());
    let peer = Caller::relay_at(
        RelayId::parse(fixture::PEER_RELAY).expect("peer"),
        Some(fixture::ROUTE_REVISION),
    );
    for p in &fx.delivers {
        let r = e.call(&peer, "message.deliver", p, now);
        assert_eq!(r.http_status(), 200);
    }
    let deliver = t.elapsed();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "native engine, memory: message.send {:.1} µs, message.deliver {:.1} µs (per operation)",
        per(send),
        per(deliver)
    );
}

/// Tells a waiting `perf record --control fifo:PATH -D -1` to start sampling, once the
/// fixture is signed (`PERF_CTL_FIFO=PATH`), so a profile holds the operations only.
fn perf_enable() {
    if let Some(path) = std::env::var_os("PERF_CTL_FIFO") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(path) {
            let _ = f.write_all(b"enable\n");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("calls") => calls(),
        Some("native") => native(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(2000)),
        Some("component") => component(
            args.get(1).and_then(|n| n.parse().ok()).unwrap_or(2000),
            args.get(2).is_some_and(|m| m == "metered"),
        ),
        _ => {
            eprintln!("usage: profile calls | profile native [N] | profile component [N [metered]]")
        }
    }
}
