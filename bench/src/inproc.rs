//! The in-process runs: the native engine and the wasmtime component, over memory and SQLite.

use crate::fixture::{self, Fixture, PAGE, PEER_RELAY};
use crate::report::Sample;
use rand::SeedableRng;
use relay_core::engine::{Caller, Config, Engine, Entropy, MemoryStore, Storage};
use relay_core::wire::identity::RelayId;
use relay_host_wasmtime::guest::{self, Core};
use relay_host_wasmtime::now_ms;
use relay_host_wasmtime::store::{AnyStore, SqliteStore};
use std::path::Path;
use std::time::Instant;

/// Who is called, as the bench sees it.
pub enum As<'a> {
    Anonymous,
    Session(&'a str),
    Relay(&'a str),
}

/// Something that answers protocol calls in-process.
pub trait Target {
    /// Calls `method`; the HTTP status and the body.
    fn call(&mut self, caller: As<'_>, method: &str, params: &[u8]) -> (u16, Vec<u8>);
    /// Wasm fuel spent so far, where the target counts it.
    fn fuel(&self) -> Option<u64> {
        None
    }
}

/// The configuration every in-process relay runs with: no rate limits (the bench measures throughput).
pub fn config() -> Config {
    let mut cfg = Config::new(
        RelayId::parse(fixture::INPROC_RELAY).expect("relay id"),
        fixture::NET,
    );
    cfg.policies.send_rate = 0;
    cfg.policies.deliver_rate = 0;
    cfg.policies.deliver_rate_per_account = 0;
    cfg.policies.deliver_rate_per_sender = 0;
    cfg.policies.account_request_rate = 0;
    cfg.policies.anonymous_rate = 0;
    cfg
}

/// Seeded entropy: the bench is reproducible.
pub struct Seeded(rand_chacha::ChaCha20Rng);

impl Entropy for Seeded {
    fn fill(&mut self, buf: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut self.0, buf)
    }
}

/// Seeded entropy from `seed`.
pub fn seeded(seed: u64) -> Seeded {
    Seeded(rand_chacha::ChaCha20Rng::seed_from_u64(seed))
}

/// The native engine (owned, or borrowed with `&mut`).
pub struct Native<E>(E);

impl<S: Storage> Native<Engine<S, Seeded>> {
    /// A native engine over `store`.
    pub fn new(store: S) -> Native<Engine<S, Seeded>> {
        Native(Engine::new(config(), store, seeded(8)))
    }
}

impl<'a, S: Storage> Native<&'a mut Engine<S, Seeded>> {
    /// Calls through an engine the caller keeps.
    pub fn from_engine(e: &'a mut Engine<S, Seeded>) -> Self {
        Native(e)
    }
}

fn native_call<S: Storage>(
    e: &mut Engine<S, Seeded>,
    caller: As<'_>,
    method: &str,
    params: &[u8],
) -> (u16, Vec<u8>) {
    let c = match caller {
        As::Anonymous => Caller::Anonymous,
        As::Session(t) => Caller::Session(t.to_string()),
        As::Relay(r) => Caller::relay_at(
            RelayId::parse(r).expect("relay id"),
            Some(crate::fixture::ROUTE_REVISION),
        ),
    };
    let r = e.call(&c, method, params, now_ms());
    (r.http_status(), r.body())
}

impl<S: Storage> Target for Native<Engine<S, Seeded>> {
    fn call(&mut self, caller: As<'_>, method: &str, params: &[u8]) -> (u16, Vec<u8>) {
        native_call(&mut self.0, caller, method, params)
    }
}

impl<S: Storage> Target for Native<&mut Engine<S, Seeded>> {
    fn call(&mut self, caller: As<'_>, method: &str, params: &[u8]) -> (u16, Vec<u8>) {
        native_call(self.0, caller, method, params)
    }
}

/// The wasmtime component, as the `relay` binary runs it (epochs on), or metered (fuel counted).
pub struct Wasm {
    core: Core,
    metered: bool,
}

impl Wasm {
    /// Loads the component at `path` over `store` on the relay's engine.
    pub fn load(path: &Path, store: AnyStore) -> anyhow::Result<Wasm> {
        Wasm::on(false, path, store)
    }

    /// Loads it on an engine that meters fuel (for the fuel column; slower, so never timed).
    pub fn load_metered(path: &Path, store: AnyStore) -> anyhow::Result<Wasm> {
        Wasm::on(true, path, store)
    }

    fn on(metered: bool, path: &Path, store: AnyStore) -> anyhow::Result<Wasm> {
        let engine = if metered {
            guest::metered_engine()
        } else {
            guest::wasm_engine()
        };
        let engine = engine.map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let cfg = String::from_utf8(config().to_json())?;
        let core = Core::load(&engine, path, store, cfg, [7u8; 32], None)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
        Ok(Wasm { core, metered })
    }
}

impl Target for Wasm {
    fn call(&mut self, caller: As<'_>, method: &str, params: &[u8]) -> (u16, Vec<u8>) {
        let c = match caller {
            As::Anonymous => guest::Caller::Anonymous,
            As::Session(t) => guest::Caller::Session(t.to_string()),
            As::Relay(r) => guest::Caller::Relay(guest::RelayCaller {
                relay: r.to_string(),
                route_revision: Some(crate::fixture::ROUTE_REVISION),
            }),
        };
        let r = self.core.call(&c, method, params, now_ms());
        (r.status, r.body)
    }
    fn fuel(&self) -> Option<u64> {
        self.metered.then_some(self.core.fuel_spent)
    }
}

/// The wasmtime component reached as the HTTP host reaches it: each call is a whole request
/// record (`POST /v1/{method}`, its headers and body) through the core's transport
/// (`handle`), not the typed export. Relay calls go through `call` (the fixture's deliveries
/// carry no relay signature headers). Beside [`Wasm`] it prices the transport layer.
pub struct WasmHttp(pub Wasm);

impl Target for WasmHttp {
    fn call(&mut self, caller: As<'_>, method: &str, params: &[u8]) -> (u16, Vec<u8>) {
        let token = match caller {
            As::Relay(_) => return self.0.call(caller, method, params),
            As::Anonymous => None,
            As::Session(t) => Some(t),
        };
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        if let Some(t) = token {
            headers.push(("authorization".to_string(), format!("Bearer {t}")));
        }
        let req = guest::HttpRequest {
            listener: guest::Listener::Public,
            method: "POST".to_string(),
            path: format!("/v1/{method}"),
            query: String::new(),
            headers,
            body: params.to_vec(),
            origin: Some("127.0.0.1".to_string()),
        };
        let sending = token.filter(|_| method == "message.send");
        match self.0.core.handle(&req, sending, now_ms()).0 {
            guest::Step::Respond(r) => (r.status, r.body),
            _ => (500, b"not a response".to_vec()),
        }
    }
}

/// Opens a fresh SQLite store at `path`.
pub fn sqlite(path: &Path) -> anyhow::Result<SqliteStore> {
    let _ = std::fs::remove_file(path);
    SqliteStore::open(path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// A fresh memory store behind the host's store type.
pub fn memory() -> MemoryStore {
    MemoryStore::new()
}

/// Operations one target runs before the next takes its turn (see [`run_side_by_side`]).
const SLICE: usize = 50;

/// Latencies, wall time and fuel of one target in one phase.
#[derive(Default)]
struct Phase {
    lat: Vec<std::time::Duration>,
    wall: std::time::Duration,
    fuel: Option<u64>,
}

impl Phase {
    fn sample(self, op: &str) -> Sample {
        Sample::new(op, self.lat, self.wall).with_fuel(self.fuel)
    }
}

/// Runs operation `i` of a phase on target `t` (its index in the run) and checks the answer.
type Step<'a> = dyn FnMut(&mut dyn Target, usize, usize) -> anyhow::Result<()> + 'a;

/// `n` operations on every target, taking turns `SLICE` operations at a time.
fn phase(
    targets: &mut [&mut dyn Target],
    n: usize,
    step: &mut Step<'_>,
) -> anyhow::Result<Vec<Phase>> {
    let mut out: Vec<Phase> = targets
        .iter()
        .map(|t| Phase {
            fuel: t.fuel().map(|_| 0),
            ..Phase::default()
        })
        .collect();
    for from in (0..n).step_by(SLICE) {
        for (ti, t) in targets.iter_mut().enumerate() {
            let fuel = t.fuel();
            let started = Instant::now();
            for i in from..(from + SLICE).min(n) {
                let one = Instant::now();
                step(&mut **t, ti, i)?;
                out[ti].lat.push(one.elapsed());
            }
            out[ti].wall += started.elapsed();
            if let (Some(total), Some(before), Some(after)) =
                (out[ti].fuel.as_mut(), fuel, t.fuel())
            {
                *total += after - before;
            }
        }
    }
    Ok(out)
}

/// Runs registration, then send, deliver and sync over `fx`; one sample per operation.
pub fn run(t: &mut dyn Target, fx: &Fixture, syncs: usize) -> anyhow::Result<Vec<Sample>> {
    let mut all = run_side_by_side(&mut [t], fx, syncs)?;
    Ok(all.remove(0))
}

/// [`run`] on several targets at once, taking turns every `SLICE` operations, so each
/// meets the same machine: on a shared machine, throughput moves by a quarter from
/// minute to minute, and a ratio of two figures measured minutes apart moved with it.
pub fn run_side_by_side(
    targets: &mut [&mut dyn Target],
    fx: &Fixture,
    syncs: usize,
) -> anyhow::Result<Vec<Vec<Sample>>> {
    let mut tokens: Vec<Vec<String>> = Vec::new();
    for t in targets.iter_mut() {
        let mut mine = Vec::new();
        for a in &fx.accounts {
            let (s, b) = t.call(As::Anonymous, "account.register", &a.register);
            anyhow::ensure!(s == 200, "register: {}", String::from_utf8_lossy(&b));
            let (s, b) = t.call(As::Anonymous, "session.open", &a.session_open);
            anyhow::ensure!(s == 200, "session.open: {}", String::from_utf8_lossy(&b));
            mine.push(fixture::token(&b).ok_or_else(|| anyhow::anyhow!("no session"))?);
        }
        tokens.push(mine);
    }
    let send = phase(targets, fx.sends.len(), &mut |t, ti, i| {
        let (s, params) = &fx.sends[i];
        let (st, b) = t.call(As::Session(&tokens[ti][*s]), "message.send", params);
        anyhow::ensure!(
            st == 200 && fixture::status(&b).as_deref() == Some("target_accepted"),
            "message.send: {st} {}",
            String::from_utf8_lossy(&b)
        );
        Ok(())
    })?;
    let deliver = phase(targets, fx.delivers.len(), &mut |t, _, i| {
        let (st, b) = t.call(As::Relay(PEER_RELAY), "message.deliver", &fx.delivers[i]);
        anyhow::ensure!(
            st == 200,
            "message.deliver: {st} {}",
            String::from_utf8_lossy(&b)
        );
        Ok(())
    })?;
    let total = (fx.sends.len() + fx.delivers.len()) as u64;
    let recipient = fx.recipient();
    // Pages are checked after the clock stops: parsing a 100 KB answer with the core's
    // strict parser costs about as much as producing it, and is the client's work, not the relay's.
    let mut pages: Vec<(u16, Vec<u8>)> = Vec::new();
    let sync = phase(targets, syncs, &mut |t, ti, i| {
        let after = (i as u64 * PAGE) % total.saturating_sub(PAGE).max(1);
        let params = format!("{{\"after\":{after},\"limit\":{PAGE}}}");
        pages.push(t.call(
            As::Session(&tokens[ti][recipient]),
            "message.timeline.sync",
            params.as_bytes(),
        ));
        Ok(())
    })?;
    for (st, b) in &pages {
        anyhow::ensure!(
            *st == 200 && fixture::entries(b) == PAGE as usize,
            "message.timeline.sync: {st} {} entries",
            fixture::entries(b)
        );
    }
    drop(pages);
    Ok(send
        .into_iter()
        .zip(deliver)
        .zip(sync)
        .map(|((s, d), y)| {
            vec![
                s.sample("message.send"),
                d.sample("message.deliver"),
                y.sample("message.timeline.sync (50)"),
            ]
        })
        .collect())
}

impl Wasm {
    /// The component's host side (for commit groups).
    pub fn core(&mut self) -> &mut Core {
        &mut self.core
    }
}

/// This process's anonymous resident memory, in KiB.
pub fn rss_kib() -> u64 {
    anon_kib("self").unwrap_or(0)
}

/// Anonymous resident memory (`RssAnon`) of process `pid`, in KiB: the heap, stacks and
/// wasm memory, not file pages such as SQLite's memory map, which the kernel reclaims at will.
pub fn anon_kib(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
