//! Scale checks: a sync page on a small and a large timeline, a tick with few and many
//! pending deliveries, the memory of the component host as accepted messages pile up, and
//! an operator's `admin.destinations` page over many destinations (issue 32).
//!
//! Loading uses commit groups of [`GROUP`] calls (as the hosts do under load), so that
//! building a large store is bound by CPU, not by one fsync per message.

use crate::fixture::{self, Fixture};
use crate::inproc::{self, As, Target, Wasm};
use crate::report::{Report, Sample};
use relay_core::engine::group::Grouped;
use relay_core::engine::storage::{Entry, Write};
use relay_core::engine::{Engine, Storage, StorageError};
use relay_host_wasmtime::guest;
use relay_host_wasmtime::now_ms;
use relay_host_wasmtime::store::{AnyStore, SqliteStore};
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Calls per commit group while loading.
const GROUP: usize = 500;
/// Sends generated (and held in memory) at a time.
const CHUNK: usize = 5_000;

/// Sizes of one scale run.
pub struct Scale {
    /// The small timeline, and the few pending deliveries.
    pub small: usize,
    /// The large timeline (`--scale-large`).
    pub large: usize,
    /// The many pending deliveries of the tick check, and of the destinations check (over
    /// a tenth as many destinations).
    pub pending: usize,
}

/// Deliveries per destination in the destinations check.
const PER_DESTINATION: usize = 10;

/// A grouped SQLite store shared with the bench (the engine owns its store).
#[derive(Clone)]
struct Shared(Rc<RefCell<Grouped<SqliteStore>>>);

impl Storage for Shared {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.0.borrow_mut().get(key)
    }
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        self.0.borrow_mut().scan(start, end, limit)
    }
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        self.0.borrow_mut().commit(batch)
    }
}

fn register(t: &mut dyn Target, fx: &Fixture) -> anyhow::Result<Vec<String>> {
    let mut tokens = Vec::new();
    for a in &fx.accounts {
        let (s, b) = t.call(As::Anonymous, "account.register", &a.register);
        anyhow::ensure!(s == 200, "register: {}", String::from_utf8_lossy(&b));
        let (_, b) = t.call(As::Anonymous, "session.open", &a.session_open);
        tokens.push(fixture::token(&b).ok_or_else(|| anyhow::anyhow!("no session"))?);
    }
    Ok(tokens)
}

/// A cheap deterministic sequence (no rng state shared with the fixture).
fn spread(i: u64, range: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % range.max(1)
}

/// Sends each `(sender, params)` through the component, [`GROUP`] calls per commit group.
fn send_grouped(w: &mut Wasm, tokens: &[String], sends: &[(usize, Vec<u8>)]) -> anyhow::Result<()> {
    for group in sends.chunks(GROUP) {
        w.core().begin_group();
        for (s, p) in group {
            let (st, b) = w.call(As::Session(&tokens[*s]), "message.send", p);
            anyhow::ensure!(st == 200, "send: {}", String::from_utf8_lossy(&b));
        }
        w.core().flush_group().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// Sends until the recipient's timeline holds `until` records, in commit groups.
fn load_timeline(
    w: &mut Wasm,
    fx: &mut Fixture,
    tokens: &[String],
    have: &mut usize,
    until: usize,
) -> anyhow::Result<()> {
    while *have < until {
        let sends = fx.more_sends(CHUNK.min(until - *have), None);
        send_grouped(w, tokens, &sends)?;
        *have += sends.len();
    }
    Ok(())
}

fn syncs(w: &mut Wasm, token: &str, records: usize, n: usize) -> anyhow::Result<Sample> {
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        let after = spread(i as u64, (records as u64).saturating_sub(fixture::PAGE));
        let p = format!("{{\"after\":{after},\"limit\":{}}}", fixture::PAGE);
        let t = Instant::now();
        let (st, b) = w.call(As::Session(token), "message.timeline.sync", p.as_bytes());
        lat.push(t.elapsed());
        anyhow::ensure!(
            st == 200 && fixture::entries(&b) == fixture::PAGE as usize,
            "sync: {st}"
        );
    }
    Ok(Sample::new(
        &format!("sync (50) of {records} records"),
        lat,
        started.elapsed(),
    ))
}

/// Sync page cost and memory on a small and a large timeline, through the wasmtime component.
fn timeline(rep: &mut Report, sc: &Scale, component: &Path, db: &Path) -> anyhow::Result<()> {
    let mut fx = fixture::build(fixture::INPROC_RELAY, 0, 0, 11);
    let mut w = Wasm::load(component, AnyStore::Sqlite(inproc::sqlite(db)?))?;
    let tokens = register(&mut w, &fx)?;
    let token = tokens[fx.recipient()].clone();
    let mut have = 0;
    load_timeline(&mut w, &mut fx, &tokens, &mut have, sc.small)?;
    rep.add(
        "scale: wasmtime component",
        "sqlite",
        None,
        syncs(&mut w, &token, have, 200)?,
    );
    let rss_small = inproc::rss_kib();
    let started = Instant::now();
    // RSS along the way: flat means nothing grows with the accepted messages.
    let step = (sc.large / 10).max(1);
    let mut along = vec![(have, rss_small)];
    while have < sc.large {
        let until = (have + step).min(sc.large);
        load_timeline(&mut w, &mut fx, &tokens, &mut have, until)?;
        along.push((have, inproc::rss_kib()));
        eprintln!("  loaded {have}, anonymous rss {} KiB", inproc::rss_kib());
    }
    let load = started.elapsed();
    let rss_large = inproc::rss_kib();
    rep.add(
        "scale: wasmtime component",
        "sqlite",
        None,
        syncs(&mut w, &token, have, 200)?,
    );
    rep.extra.push((
        format!(
            "scale: bench process anonymous RSS KiB with the component at {} and {have} accepted messages",
            sc.small
        ),
        serde_json::json!([rss_small, rss_large]),
    ));
    rep.extra.push((
        "scale: bench process anonymous RSS KiB along the load, [accepted, KiB]".to_string(),
        serde_json::json!(along),
    ));
    rep.extra.push((
        format!(
            "scale: loading {} messages in groups of {GROUP}, msg/s",
            have - sc.small
        ),
        serde_json::json!((have - sc.small) as f64 / load.as_secs_f64()),
    ));
    Ok(())
}

/// Tick cost with few and many pending deliveries, nothing due, then with the in-flight ones due.
fn ticks(rep: &mut Report, sc: &Scale, db: &Path) -> anyhow::Result<()> {
    let mut fx = fixture::build(fixture::INPROC_RELAY, 0, 0, 12);
    let store = Shared(Rc::new(RefCell::new(Grouped::new(inproc::sqlite(db)?))));
    let cfg = inproc::config();
    let timeout = cfg.attempt_timeout;
    let mut e = Engine::new(cfg, store.clone(), inproc::seeded(9));
    let mut t = inproc::Native::from_engine(&mut e);
    let tokens = register(&mut t, &fx)?;
    let mut pending = 0;
    let mut measure =
        |e: &mut Engine<Shared, inproc::Seeded>, pending: usize, at: u64, label: &str| {
            let n = 50;
            let mut lat = Vec::with_capacity(n);
            let started = Instant::now();
            for _ in 0..n {
                let t = Instant::now();
                // Nothing is due at `at`: the tick must not touch the pending deliveries.
                let _ = e.tick(at);
                lat.push(t.elapsed());
            }
            rep.add(
                "scale: native engine",
                "sqlite",
                None,
                Sample::new(
                    &format!("tick, {pending} pending, {label}"),
                    lat,
                    started.elapsed(),
                ),
            );
        };
    for until in [sc.small, sc.pending] {
        while pending < until {
            let sends = fx.more_sends(CHUNK.min(until - pending), Some("http://127.0.0.3:1"));
            for group in sends.chunks(GROUP) {
                store.0.borrow_mut().begin();
                for (s, p) in group {
                    let r = e.call(
                        &relay_core::engine::Caller::Session(tokens[*s].clone()),
                        "message.send",
                        p,
                        now_ms(),
                    );
                    anyhow::ensure!(r.result.is_ok(), "send: {:?}", r.result);
                }
                store
                    .0
                    .borrow_mut()
                    .flush()
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            pending += sends.len();
        }
        measure(&mut e, pending, now_ms() + 1, "none due");
    }
    // Past the attempt timeout, only the in-flight attempts (max_in_flight_per_destination) are due.
    let t0 = Instant::now();
    let effects = e.tick(now_ms() + timeout + 1);
    let due = t0.elapsed();
    rep.add(
        "scale: native engine",
        "sqlite",
        None,
        Sample::new(
            &format!(
                "tick, {pending} pending, in-flight due ({} effects)",
                effects.len()
            ),
            vec![due],
            due.max(Duration::from_nanos(1)),
        ),
    );
    Ok(())
}

/// `admin.destinations` pages (100 rows, the default) on the wasmtime component over SQLite
/// holding `sc.pending` pending deliveries to a tenth as many destinations: the operator's
/// listing reads each destination's counters and the first key of its two time indexes,
/// never the deliveries, so a page costs the same whatever waits behind it.
fn destinations(rep: &mut Report, sc: &Scale, component: &Path, db: &Path) -> anyhow::Result<()> {
    let mut fx = fixture::build(fixture::INPROC_RELAY, 0, 0, 13);
    let mut w = Wasm::load(component, AnyStore::Sqlite(inproc::sqlite(db)?))?;
    let tokens = register(&mut w, &fx)?;
    let count = (sc.pending / PER_DESTINATION).max(1);
    let peer = |i: usize| format!("https://peer-{i:05}.example");
    let mut sends = Vec::with_capacity(CHUNK);
    for i in 0..count {
        sends.extend(fx.more_sends(PER_DESTINATION, Some(&peer(i))));
        if sends.len() >= CHUNK || i + 1 == count {
            send_grouped(&mut w, &tokens, &sends)?;
            sends.clear();
        }
    }
    let pending = count * PER_DESTINATION;
    let n = 200;
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        // A page from a spread of places, the first one included.
        let after = match i {
            0 => String::new(),
            _ => format!(
                ",\"after\":\"{}\"",
                peer(spread(i as u64, count.saturating_sub(100) as u64) as usize)
            ),
        };
        let p = format!("{{\"limit\":100{after}}}");
        let t = Instant::now();
        let r = w.core().call(
            &guest::Caller::Operator,
            "admin.destinations",
            p.as_bytes(),
            now_ms(),
        );
        lat.push(t.elapsed());
        let rows = relay_core::wire::json::parse(&r.body)
            .ok()
            .and_then(|v| match v {
                relay_core::wire::json::Value::Object(o) => match o.get("destinations") {
                    Some(relay_core::wire::json::Value::Array(l)) => Some(l.len()),
                    _ => None,
                },
                _ => None,
            });
        anyhow::ensure!(
            r.status == 200 && rows == Some(100.min(count)),
            "admin.destinations: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    rep.add(
        "scale: wasmtime component",
        "sqlite",
        None,
        Sample::new(
            &format!("admin.destinations page (100) of {count} destinations, {pending} pending"),
            lat,
            started.elapsed(),
        ),
    );
    Ok(())
}

/// Runs the scale checks.
pub fn run(rep: &mut Report, sc: &Scale, component: &Path, scratch: &Path) -> anyhow::Result<()> {
    eprintln!("scale: timeline {} and {} records", sc.small, sc.large);
    timeline(rep, sc, component, &scratch.join("scale-timeline.sqlite"))?;
    eprintln!("scale: ticks with {} and {} pending", sc.small, sc.pending);
    ticks(rep, sc, &scratch.join("scale-ticks.sqlite"))?;
    eprintln!(
        "scale: admin.destinations over {} pending to {} destinations",
        sc.pending,
        sc.pending / PER_DESTINATION
    );
    destinations(
        rep,
        sc,
        component,
        &scratch.join("scale-destinations.sqlite"),
    )?;
    Ok(())
}
