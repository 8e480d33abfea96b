//! The core component inside wasmtime: instantiation, limits, and recovery from traps.

use crate::store::AnyStore;
use relay_core::engine::group::Grouped;
use relay_core::engine::{Storage, StorageError};
use relay_core::wire::preverify::Memory as Preverify;
use std::path::Path;
use std::sync::Arc;
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceAny};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder};

/// One relay's storage as this host holds it.
pub type RelayStore = Grouped<AnyStore>;

/// What a `store` resource names: a slot of [`HostState`]'s stores. (wasmtime's
/// `ResourceTable` would need the storage to be `Send`, and the in-memory store is not.)
pub struct StoreSlot;

/// The bindings of the `core` world (its struct is named `Core`, as the host's own is).
mod wit {
    wasmtime::component::bindgen!({
        world: "core",
        path: "../wit",
        with: { "relay:core/host.store": super::StoreSlot },
    });
}

pub use relay::core::types::{
    Caller, Close, Delivery, DeliveryEnd, DeliveryState, DeliveryStatus, EntryKind, Error,
    ErrorCode, ErrorObject, Event, Failure, Fetch, HttpRequest, HttpResponse, KeyFetch, Listener,
    Need, Notify, Parked, PeerRequest, RelayCaller, Reply, Resumption, RouteWanted, Step,
    TickReport, TimelineEntry, TimelinePage, Upgrade, WsAnswer,
};

/// A typed call's answer: the record, or why it was refused (nothing committed).
pub type Typed<T> = Result<T, Failure>;

/// Where a parked request's resumptions go: its socket's task waits on the other end.
pub type Waiter = tokio::sync::mpsc::UnboundedSender<Resumption>;
/// What a request parked in the core waits on: its resumptions, the last one final (a
/// closed channel: the core restarted or its commit failed, so nothing was accepted).
pub type Waiting = tokio::sync::mpsc::UnboundedReceiver<Resumption>;
/// A resumption to hand to its waiter once the call that made it is durable.
pub type Handover = (Waiter, Resumption);
use wit::exports::relay::core::relay::GuestRelay;
use wit::relay;
use wit::relay::core::host;
use wit::Core as CoreWorld;

impl From<relay_core::transport::Request> for HttpRequest {
    fn from(r: relay_core::transport::Request) -> HttpRequest {
        HttpRequest {
            listener: match r.listener {
                relay_core::transport::Listener::Public => Listener::Public,
                relay_core::transport::Listener::Admin => Listener::Admin,
            },
            method: r.method,
            path: r.path,
            query: r.query,
            headers: r.headers,
            body: r.body,
            origin: r.origin,
        }
    }
}

/// Fuel for one call of a metered engine: far above any legitimate operation.
const FUEL_PER_CALL: u64 = 20_000_000_000;
/// Linear memory the guest may grow to.
const MEMORY_LIMIT: usize = 512 << 20;

/// What the guest's imports reach.
pub struct HostState {
    /// The stores this host opened, each a `store` resource (its index) a relay holds. A
    /// store stays here when the guest drops its handle: the host takes it back from here.
    stores: Vec<Option<RelayStore>>,
    limits: StoreLimits,
    /// Decline every verification, so the core uses its own (`RELAY_OWN_VERIFY=1`, for measuring).
    own_verify: bool,
    /// Decline every SHA-256, so the core hashes itself (`RELAY_OWN_SHA256=1`, for measuring).
    own_sha256: bool,
    /// Envelope signatures the HTTP workers verified ahead of the core thread.
    pre: Option<Arc<Preverify>>,
    /// The session token of the message.send in progress (what `pre` learns keys for): the
    /// host's hint, from the request's path or the frame it parsed natively.
    sending: Option<String>,
    /// Storage calls that failed (a call that saw one cannot be trusted to have read
    /// everything: `Core::tick` and `Core::fetched` report it as failed).
    storage_errors: u64,
    /// Faults on request (tests): `trap_ticks`.
    faults: Option<Arc<crate::store::Faults>>,
}

impl HostState {
    fn counted<T>(&mut self, r: Result<T, StorageError>) -> Result<T, String> {
        r.map_err(|e| {
            self.storage_errors += 1;
            e.0
        })
    }

    /// Nothing opened yet; memory bounded by `limits`.
    fn new(limits: StoreLimits) -> HostState {
        let tuning = relay_settings::tuning();
        HostState {
            stores: Vec::new(),
            limits,
            own_verify: tuning.own_verify,
            own_sha256: tuning.own_sha256,
            pre: None,
            sending: None,
            storage_errors: 0,
            faults: None,
        }
    }

    /// The store in slot `rep`; an error (never a panic) for a handle this host never made.
    fn store(&mut self, rep: u32) -> Result<&mut RelayStore, StorageError> {
        self.stores
            .get_mut(rep as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| StorageError(format!("no store {rep}")))
    }

    /// Opens a store for a relay: its `store` resource.
    fn open_store(&mut self, store: RelayStore) -> Resource<StoreSlot> {
        self.stores.push(Some(store));
        Resource::new_own((self.stores.len() - 1) as u32)
    }

    /// The storage in slot `rep`, taken back (the instance is done with it).
    fn take_store(mut self, rep: u32) -> RelayStore {
        self.stores
            .get_mut(rep as usize)
            .and_then(Option::take)
            .expect("a store stays in its slot until the host takes it back")
    }
}

impl host::HostStore for HostState {
    fn get(&mut self, store: Resource<StoreSlot>, key: Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        let r = self.store(store.rep()).and_then(|s| s.get(&key));
        self.counted(r)
    }
    fn scan(
        &mut self,
        store: Resource<StoreSlot>,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: u32,
    ) -> Result<Vec<host::Entry>, String> {
        let r = self
            .store(store.rep())
            .and_then(|s| s.scan(&start, &end, limit as usize));
        let r = r.map(|rows| {
            rows.into_iter()
                .map(|(key, value)| host::Entry { key, value })
                .collect()
        });
        self.counted(r)
    }
    fn commit(
        &mut self,
        store: Resource<StoreSlot>,
        writes: Vec<host::Write>,
    ) -> Result<(), String> {
        let batch = writes.into_iter().map(|w| (w.key, w.value)).collect();
        let r = self.store(store.rep()).and_then(|s| s.commit(batch));
        self.counted(r)
    }
    /// The relay let go of its store: the storage stays in its slot, the host's to take back.
    fn drop(&mut self, _store: Resource<StoreSlot>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: host::Level, message: String) {
        match level {
            host::Level::Debug => tracing::debug!(target: "relay::core", "{message}"),
            host::Level::Info => tracing::info!(target: "relay::core", "{message}"),
            host::Level::Warn => tracing::warn!(target: "relay::core", "{message}"),
            host::Level::Error => tracing::error!(target: "relay::core", "{message}"),
        }
    }
    fn verify_ed25519(
        &mut self,
        key: Vec<u8>,
        message: Vec<u8>,
        signature: Vec<u8>,
    ) -> host::Verdict {
        if self.own_verify {
            return host::Verdict::Declined;
        }
        if let Some(p) = &self.pre {
            if p.take(&key, &message, &signature) {
                return host::Verdict::Valid;
            }
        }
        let v = native_verdict(&key, &message, &signature);
        if let (host::Verdict::Valid, Some(p), Some(t)) = (v, &self.pre, &self.sending) {
            p.learn(t, &key, &message);
        }
        v
    }
    fn sha256(&mut self, data: Vec<u8>) -> Option<(u64, u64, u64, u64)> {
        if self.own_sha256 {
            return None;
        }
        Some(native_sha256(&data))
    }
    fn entropy(&mut self, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len.min(4096) as usize];
        // The OS CSPRNG failing is not recoverable; an all-zero token would be worse than a trap.
        getrandom::fill(&mut buf).expect("OS random source");
        buf
    }
}

impl relay::core::types::Host for HostState {}

/// SHA-256 natively (sha2, with the CPU's SHA instructions where present), as the import returns it.
pub fn native_sha256(data: &[u8]) -> (u64, u64, u64, u64) {
    let d = relay_core::wire::digest::sha256_own(data);
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&d[i * 8..i * 8 + 8]);
        u64::from_be_bytes(w)
    };
    (word(0), word(1), word(2), word(3))
}

/// The host's verdict on a signature: the core's own strict verification, compiled natively.
pub fn native_verdict(key: &[u8], message: &[u8], signature: &[u8]) -> host::Verdict {
    use relay_core::wire::signature::{verify_own_slices, SignatureError};
    // Shapes the core never sends are declined: the core decides them with its own code.
    match verify_own_slices(key, message, signature) {
        Some(Ok(())) => host::Verdict::Valid,
        Some(Err(SignatureError::InvalidKey)) => host::Verdict::InvalidKey,
        Some(Err(SignatureError::Mismatch)) => host::Verdict::Mismatch,
        None => host::Verdict::Declined,
    }
}

pub use host::Verdict;

/// An instance of the component, the wasmtime store that holds it (and the storage), and
/// the one relay this host opens in it.
struct Live {
    store: Store<HostState>,
    instance: CoreWorld,
    /// The relay resource `open` returned.
    relay: ResourceAny,
    /// The `store` resource (its table entry) holding the relay's storage.
    store_rep: u32,
}

/// A loaded, initialized core instance.
pub struct Core {
    engine: Engine,
    component: Component,
    linker: Linker<HostState>,
    config_json: String,
    seed: [u8; 32],
    /// The operator token the core opens the admin API to.
    operator_token: Option<String>,
    /// The instance; none once a trapped one could not be replaced ([`Core::failed`]).
    live: Option<Live>,
    /// The storage, held here once no instance holds it: only the open group is still
    /// flushed; nothing enters the guest again.
    orphaned: Option<RelayStore>,
    /// Traps of the guest.
    pub traps: u64,
    /// Fresh instances started over the storage after a trap.
    pub restarts: u64,
    /// Whether the engine meters fuel ([`metered_engine`]); only then is fuel set and read.
    metered: bool,
    /// Fuel spent by all calls so far, on a [`metered_engine`]: wasm work, counted
    /// deterministically (benchmarks report it); 0 on the relay's engine.
    pub fuel_spent: u64,
    /// Signatures verified ahead of the core thread, if the host offers them.
    pre: Option<Arc<Preverify>>,
    /// Faults on request (tests).
    faults: Option<Arc<crate::store::Faults>>,
    /// The requests parked in the guest, by the ticket this host gave each.
    waiting: std::collections::HashMap<u32, Waiter>,
    /// The next ticket.
    next_ticket: u32,
}

/// The wasmtime engine the relay runs: epochs bound every call (`EPOCHS_PER_CALL`).
///
/// Fuel metering is off: it bounds a call no better than epochs do and cost 12% of a
/// send's time in the component (docs/performance.md).
pub fn wasm_engine() -> wasmtime::Result<Engine> {
    engine(false)
}

/// The same engine with fuel metering as well: [`Core::fuel_spent`] then counts the
/// guest's work deterministically (the benchmark's fuel column), at some cost in time.
pub fn metered_engine() -> wasmtime::Result<Engine> {
    engine(true)
}

fn engine(fuel: bool) -> wasmtime::Result<Engine> {
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .consume_fuel(fuel)
        .epoch_interruption(true);
    // `RELAY_PERFMAP=1` names compiled wasm functions for `perf` (/tmp/perf-PID.map).
    if relay_settings::tuning().perfmap {
        cfg.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&cfg)
}

/// A fresh, initialized instance over `store`; on failure, the error and `store` back.
fn instantiate(
    engine: &Engine,
    component: &Component,
    linker: &Linker<HostState>,
    store: RelayStore,
    config_json: &str,
    seed: &[u8; 32],
    operator_token: Option<&str>,
) -> Result<Live, (wasmtime::Error, Box<RelayStore>)> {
    let limits = StoreLimitsBuilder::new()
        .memory_size(MEMORY_LIMIT)
        .instances(16)
        .trap_on_grow_failure(true)
        .build();
    let mut s = Store::new(engine, HostState::new(limits));
    s.limiter(|h| &mut h.limits);
    let handle = s.data_mut().open_store(store);
    let store_rep = handle.rep();
    let start = |s: &mut Store<HostState>| -> wasmtime::Result<(CoreWorld, ResourceAny)> {
        // Metered engines only: elsewhere there is no fuel to set (`get_fuel` says so).
        if s.get_fuel().is_ok() {
            s.set_fuel(FUEL_PER_CALL)?;
        }
        s.set_epoch_deadline(u64::MAX / 2);
        let instance = CoreWorld::instantiate(&mut *s, component, linker)?;
        let relay = instance
            .relay_core_relay()
            .relay()
            .call_open(&mut *s, handle, config_json, seed, operator_token)?
            .map_err(|e| wasmtime::format_err!("core open: {}", init_error(e)))?;
        Ok((instance, relay))
    };
    match start(&mut s) {
        Ok((instance, relay)) => Ok(Live {
            store: s,
            instance,
            relay,
            store_rep,
        }),
        Err(e) => Err((e, Box::new(s.into_data().take_store(store_rep)))),
    }
}

impl Core {
    /// Loads the component at `path` over `store`, with the engine configuration as JSON,
    /// the relay's key seed and the operator token (none: no operator API).
    pub fn load(
        engine: &Engine,
        path: &Path,
        store: AnyStore,
        config_json: String,
        seed: [u8; 32],
        operator_token: Option<String>,
    ) -> wasmtime::Result<Core> {
        let bytes =
            std::fs::read(path).map_err(|e| wasmtime::format_err!("{}: {e}", path.display()))?;
        let component = Component::from_binary(engine, &bytes)?;
        for (name, _) in component.component_type().imports(engine) {
            if !name.starts_with("relay:core/") {
                wasmtime::bail!(
                    "the component imports {name}; a relay core may import only relay:core/*"
                );
            }
        }
        let mut linker = Linker::new(engine);
        CoreWorld::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        let store = Grouped::new(store);
        let live = instantiate(
            engine,
            &component,
            &linker,
            store,
            &config_json,
            &seed,
            operator_token.as_deref(),
        )
        .map_err(|(e, _)| e)?;
        let metered = live.store.get_fuel().is_ok();
        Ok(Core {
            engine: engine.clone(),
            component,
            linker,
            config_json,
            seed,
            operator_token,
            live: Some(live),
            orphaned: None,
            traps: 0,
            restarts: 0,
            waiting: std::collections::HashMap::new(),
            next_ticket: 0,
            metered,
            fuel_spent: 0,
            pre: None,
            faults: None,
        })
    }

    /// Runs one export with a fresh budget; after a trap the instance is replaced over the
    /// same storage. `None` after a trap, and for every call once no instance could be made.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(GuestRelay, ResourceAny, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Option<R> {
        let live = self.live.as_mut()?;
        // Without metering, asking for fuel is an error built per call: not on this path.
        if self.metered {
            let _ = live.store.set_fuel(FUEL_PER_CALL);
        }
        live.store.set_epoch_deadline(crate::EPOCHS_PER_CALL);
        let r = f(
            live.instance.relay_core_relay().relay(),
            live.relay,
            &mut live.store,
        );
        if self.metered {
            let left = live.store.get_fuel().unwrap_or(FUEL_PER_CALL);
            self.fuel_spent += FUEL_PER_CALL.saturating_sub(left);
        }
        match r {
            Ok(r) => Some(r),
            Err(e) => {
                self.traps += 1;
                tracing::error!(
                    "core trapped: {e:#}; starting a fresh instance over the same storage"
                );
                self.recover();
                None
            }
        }
    }

    /// Replaces the trapped instance with a fresh one over the same storage. If none can be
    /// made, the core fails closed: no instance, nothing enters the guest again, and
    /// [`Core::failed`] tells the host to stop. No other storage ever stands in.
    fn recover(&mut self) {
        let Some(old) = self.live.take() else {
            return;
        };
        // The requests parked in the trapped instance are gone with it: their channels close,
        // and each is answered as uncommitted (nothing was accepted).
        self.waiting.clear();
        // The trapped instance (and its memory) goes first; its uncommitted writes died with
        // it, and the storage, with the open group's earlier writes, is intact.
        let store = old.store.into_data().take_store(old.store_rep);
        match instantiate(
            &self.engine,
            &self.component,
            &self.linker,
            store,
            &self.config_json,
            &self.seed,
            self.operator_token.as_deref(),
        ) {
            Ok(mut live) => {
                live.store.data_mut().pre = self.pre.clone();
                live.store.data_mut().faults = self.faults.clone();
                self.live = Some(live);
                self.restarts += 1;
            }
            Err((e, store)) => {
                tracing::error!(
                    "could not start a fresh core instance over the storage after a trap: {e:#}; \
                     the relay stops serving (fail closed)"
                );
                self.orphaned = Some(*store);
            }
        }
    }

    /// Whether the core has failed closed: a trapped instance could not be replaced, so
    /// every call answers `internal` without entering the guest, and the host must stop.
    pub fn failed(&self) -> bool {
        self.live.is_none()
    }

    /// The storage, wherever it is held.
    fn storage(&mut self) -> &mut RelayStore {
        match (&mut self.live, &mut self.orphaned) {
            (Some(live), _) => {
                let rep = live.store_rep;
                live.store
                    .data_mut()
                    .store(rep)
                    .expect("the relay's store stays in its slot")
            }
            (None, Some(store)) => store,
            (None, None) => unreachable!("the storage is held by the instance or the core"),
        }
    }

    /// Opens a commit group: the following calls' commits wait for [`Core::flush_group`].
    pub fn begin_group(&mut self) {
        self.storage().begin();
    }

    /// Whether the open group holds writes (its flush is a transaction).
    pub fn group_has_writes(&mut self) -> bool {
        self.storage().has_writes()
    }

    /// Makes the group's writes durable in one transaction; on error all of them are undone.
    pub fn flush_group(&mut self) -> Result<(), StorageError> {
        self.storage().flush()
    }

    /// Answers the core's envelope verifications from `pre` where its workers verified them.
    pub fn set_preverify(&mut self, pre: Option<Arc<Preverify>>) {
        if let Some(live) = &mut self.live {
            live.store.data_mut().pre = pre.clone();
        }
        self.pre = pre;
    }

    /// Faults on request (tests): storage faults are in the store; this adds traps.
    pub fn set_faults(&mut self, faults: Option<Arc<crate::store::Faults>>) {
        if let Some(live) = &mut self.live {
            live.store.data_mut().faults = faults.clone();
        }
        self.faults = faults;
    }

    /// Calls a protocol method by name for an in-process caller (no network address): the
    /// answer as an HTTP client reads it.
    pub fn call(&mut self, caller: &Caller, method: &str, params: &[u8], now: u64) -> Reply {
        let sending = match caller {
            Caller::Session(t) if method == "message.send" => Some(t.as_str()),
            _ => None,
        };
        self.hinted(sending, |i, r, s| {
            i.call_call(s, r, caller, None, method, params, now)
        })
        .unwrap_or_else(internal_reply)
    }

    /// message.send through the typed export: the DeliveryStatus and its events, or why not.
    pub fn send(&mut self, caller: &Caller, params: &[u8], now: u64) -> Typed<Delivery> {
        let sending = match caller {
            Caller::Session(t) => Some(t.as_str()),
            _ => None,
        };
        self.hinted(sending, |i, r, s| i.call_send(s, r, caller, params, now))
            .unwrap_or_else(|| Err(internal_failure()))
    }

    /// message.deliver through the typed export.
    pub fn deliver(&mut self, caller: &Caller, params: &[u8], now: u64) -> Typed<Delivery> {
        self.guarded(|i, r, s| i.call_deliver(s, r, caller, params, now))
            .unwrap_or_else(|| Err(internal_failure()))
    }

    /// message.delivery.status through the typed export.
    pub fn status(&mut self, caller: &Caller, message_id: &str, now: u64) -> Typed<Delivery> {
        self.guarded(|i, r, s| i.call_status(s, r, caller, message_id, now))
            .unwrap_or_else(|| Err(internal_failure()))
    }

    /// message.timeline.sync through the typed export.
    pub fn sync(
        &mut self,
        caller: &Caller,
        after: u64,
        limit: Option<u32>,
        now: u64,
    ) -> Typed<TimelinePage> {
        self.guarded(|i, r, s| i.call_sync(s, r, caller, after, limit, now))
            .unwrap_or_else(|| Err(internal_failure()))
    }

    /// Runs `f` with the hint that it is `token`'s message.send (`pre` learns its key).
    fn hinted<R>(
        &mut self,
        token: Option<&str>,
        f: impl FnOnce(GuestRelay, ResourceAny, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Option<R> {
        let sending = token.filter(|_| self.pre.is_some()).map(str::to_string);
        if let Some(live) = &mut self.live {
            live.store.data_mut().sending = sending;
        }
        let r = self.guarded(f);
        if let Some(live) = &mut self.live {
            live.store.data_mut().sending = None;
        }
        r
    }

    /// A ticket no parked request holds.
    fn ticket(&mut self) -> u32 {
        loop {
            self.next_ticket = self.next_ticket.wrapping_add(1);
            if !self.waiting.contains_key(&self.next_ticket) {
                return self.next_ticket;
            }
        }
    }

    /// Keeps `ticket`'s waiter if the core parked it, and hands back the other end.
    fn parked(&mut self, ticket: u32, parked: bool) -> Option<Waiting> {
        if !parked {
            return None;
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.waiting.insert(ticket, tx);
        Some(rx)
    }

    /// One HTTP request, to the core: `sending` is the session token when the host saw it
    /// is a message.send. A parked request comes with what to wait on. After a trap, the
    /// `internal` answer: nothing was accepted.
    pub fn handle(
        &mut self,
        req: &HttpRequest,
        sending: Option<&str>,
        now: u64,
    ) -> (Step, Option<Waiting>) {
        let ticket = self.ticket();
        let step = self
            .hinted(sending, |i, r, s| i.call_handle(s, r, req, ticket, now))
            .unwrap_or_else(|| Step::Respond(uncommitted_response()));
        let wait = self.parked(ticket, matches!(step, Step::Parked(_)));
        (step, wait)
    }

    /// One WebSocket text message of `token`'s socket (`sending`: the host saw a
    /// message.send); a parked frame comes with what to wait on.
    pub fn message(
        &mut self,
        token: &str,
        origin: Option<&str>,
        text: &str,
        sending: bool,
        now: u64,
    ) -> (WsAnswer, Option<Waiting>) {
        let ticket = self.ticket();
        let answer = self
            .hinted(sending.then_some(token), |i, r, s| {
                i.call_message(s, r, token, origin, text, ticket, now)
            })
            .unwrap_or_else(|| uncommitted_answer(text));
        let wait = self.parked(ticket, answer.parked.is_some());
        (answer, wait)
    }

    /// A send event of a sibling shard that names this core (its url and body), run as the
    /// relay's own call. After a trap, the `internal` answer: nothing was accepted.
    pub fn sibling(&mut self, url: &str, body: &[u8], now: u64) -> HttpResponse {
        self.guarded(|i, r, s| i.call_sibling(s, r, url, body, now))
            .unwrap_or_else(uncommitted_response)
    }

    /// Reports what became of a key fetch the core named: the parked requests it answers,
    /// for the host to hand over once this call is durable.
    pub fn key_fetched(&mut self, relay: &str, fetch: &Fetch, now: u64) -> Vec<Handover> {
        let resumed = self.guarded(|i, r, s| i.call_key_fetched(s, r, relay, fetch, now));
        self.deliveries(resumed.unwrap_or_default())
    }

    /// Reports what a sibling shard answered to a route fetch the core named; as
    /// [`Core::key_fetched`].
    pub fn route_fetched(&mut self, account: &str, fetch: &Fetch, now: u64) -> Vec<Handover> {
        let resumed = self.guarded(|i, r, s| i.call_route_fetched(s, r, account, fetch, now));
        self.deliveries(resumed.unwrap_or_default())
    }

    /// Each resumption with its waiter; one that is parked again keeps its waiter here too.
    fn deliveries(&mut self, resumed: Vec<relay::core::types::Resumed>) -> Vec<Handover> {
        let mut out = Vec::with_capacity(resumed.len());
        for r in resumed {
            let again = match &r.resumption {
                Resumption::Http(step) => matches!(step, Step::Parked(_)),
                Resumption::Frame(a) => a.parked.is_some(),
            };
            let waiter = if again {
                self.waiting.get(&r.ticket).cloned()
            } else {
                self.waiting.remove(&r.ticket)
            };
            if let Some(w) = waiter {
                out.push((w, r.resumption));
            }
        }
        out
    }

    /// Reports what became of a send; an error if the call trapped or the storage failed
    /// during it (nothing of it was kept: the host may report it again).
    pub fn fetched(
        &mut self,
        task: &str,
        attempt: u32,
        fetch: &Fetch,
        now: u64,
    ) -> Result<Vec<Event>, String> {
        let before = self.storage_errors();
        match self.guarded(|i, r, s| i.call_fetched(s, r, task, attempt, fetch, now)) {
            None => Err("the core trapped".into()),
            Some(_) if self.storage_errors() != before => Err("the storage failed".into()),
            Some(e) => Ok(e),
        }
    }

    /// Runs what is due; `None` if the tick trapped. A storage call that failed during it
    /// is reported as the tick's error (what it read may be incomplete).
    pub fn tick(&mut self, now: u64) -> Option<TickReport> {
        let trap = self
            .faults
            .as_ref()
            .is_some_and(|f| f.trap_ticks.load(std::sync::atomic::Ordering::Relaxed));
        let before = self.storage_errors();
        let mut r = self.guarded(|i, relay, s| {
            if trap {
                // The deadline has passed before the tick starts: a real epoch trap.
                s.set_epoch_deadline(0);
            }
            i.call_tick(s, relay, now)
        })?;
        if self.storage_errors() != before && r.error.is_none() {
            r.error = Some("the storage failed during the tick".into());
        }
        Some(r)
    }

    /// Storage calls that failed so far (this instance's).
    fn storage_errors(&self) -> u64 {
        self.live
            .as_ref()
            .map_or(0, |l| l.store.data().storage_errors)
    }

    /// The engine's own counts in the Prometheus text format; an error if the store could
    /// not be read or the core has failed.
    pub fn metrics(&mut self, now: u64) -> Result<String, String> {
        match self.guarded(|i, r, s| i.call_metrics(s, r, now)) {
            Some(r) => r.map_err(init_error),
            None => Err("the relay core failed".into()),
        }
    }

    /// Copies the SQLite database, as every committed group left it, to `path` (online
    /// backup over the relay's own connection); the bytes written. Only between groups.
    pub fn backup(&mut self, path: &Path) -> Result<u64, String> {
        match self.storage().inner().map(AnyStore::base) {
            Some(AnyStore::Sqlite(db)) => db.backup_to(path),
            Some(_) => {
                Err("this relay keeps its data in memory: there is no database to back up".into())
            }
            None => Err("a commit group is open: a backup runs only between groups".into()),
        }
    }

    /// The `/.well-known/relay` document.
    pub fn well_known(&mut self) -> Vec<u8> {
        self.guarded(|i, r, s| i.call_well_known(s, r))
            .unwrap_or_default()
    }
}

/// The message of a typed error the component returned.
fn init_error(e: Error) -> String {
    match e {
        Error::BadConfig(m) | Error::RefusedStore(m) | Error::Storage(m) => m,
    }
}

/// An in-process call's answer after a trap or a failed group commit: nothing was accepted.
pub fn internal_reply() -> Reply {
    let r = relay_core::transport::Response::uncommitted();
    Reply {
        status: r.status,
        body: r.body,
        error: Some(ErrorCode::Internal),
        events: Vec::new(),
    }
}

/// A typed call's failure after a trap or a failed group commit: nothing was accepted.
pub fn internal_failure() -> Failure {
    let e = relay_core::transport::typed::Failure::uncommitted();
    Failure {
        code: ErrorCode::Internal,
        status: e.status,
        error: ErrorObject {
            code: e.error.code,
            message: e.error.message,
            data: None,
        },
    }
}

/// An HTTP answer after a trap or a failed group commit: nothing was accepted.
pub fn uncommitted_response() -> HttpResponse {
    let r = relay_core::transport::Response::uncommitted();
    HttpResponse {
        status: r.status,
        headers: r
            .headers
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        body: r.body,
        events: Vec::new(),
    }
}

/// An answer frame the host sends for the core, with nothing more to do.
pub fn text_answer(text: String) -> WsAnswer {
    WsAnswer {
        text,
        close: None,
        events: Vec::new(),
        parked: None,
    }
}

/// The answer to WebSocket message `text` after a trap or a failed group commit.
pub fn uncommitted_answer(text: &str) -> WsAnswer {
    text_answer(relay_core::transport::socket::uncommitted_frame(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;
    use rand::SeedableRng;
    use relay_core::client::{draft, AccountKey, DeviceKey};
    use relay_core::wire::canonical;
    use relay_core::wire::json::Object;

    const RELAY: &str = "http://127.0.0.1:1";

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("relay-guest-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    fn load(db: &Path) -> Core {
        let config = relay_core::engine::Config::new(
            relay_core::wire::identity::RelayId::parse(RELAY).unwrap(),
            "dev",
        );
        let component = crate::settings::component_path(&Default::default());
        let store = AnyStore::Sqlite(SqliteStore::open(db).expect("sqlite"));
        Core::load(
            &wasm_engine().unwrap(),
            &component,
            store,
            String::from_utf8(config.to_json()).unwrap(),
            [7; 32],
            None,
        )
        .unwrap_or_else(|e| panic!("{}: {e:#} (build it with `./x test`)", component.display()))
    }

    /// `account.register` params for a fresh account homed here, and its id.
    fn registration() -> (Vec<u8>, String) {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(19);
        let key = AccountKey::generate(&mut rng);
        let device = DeviceKey::generate(&mut rng);
        let now = crate::now_ms();
        let mut p = Object::new();
        p.insert(
            "route",
            draft::route("dev", &key.id(), RELAY, 1, now).sign(&key),
        );
        p.insert(
            "certificate",
            draft::certificate("dev", &key, &device, &["send", "sync", "manage"], now).sign(&key),
        );
        (canonical::object_to_vec(&p), key.id().as_str().to_string())
    }

    fn route_get(core: &mut Core, account: &str) -> u16 {
        let params = format!(r#"{{"account":"{account}"}}"#);
        core.call(
            &Caller::Anonymous,
            "route.get",
            params.as_bytes(),
            crate::now_ms(),
        )
        .status
    }

    /// Makes the next call that grows the guest's memory trap (a real trap, as an
    /// allocation past the memory limit is), and hands it a request that must grow it.
    fn trapping_call(core: &mut Core) -> Reply {
        core.live.as_mut().unwrap().store.data_mut().limits = StoreLimitsBuilder::new()
            .memory_size(0)
            .trap_on_grow_failure(true)
            .build();
        let big = format!(r#"{{"account":"{}"}}"#, "a".repeat(200_000));
        core.call(
            &Caller::Anonymous,
            "route.get",
            big.as_bytes(),
            crate::now_ms(),
        )
    }

    #[test]
    fn a_trap_is_survived_by_a_fresh_instance_over_the_same_storage() {
        let dir = scratch("recovers");
        let mut core = load(&dir.join("relay.sqlite"));
        let (register, account) = registration();
        let r = core.call(
            &Caller::Anonymous,
            "account.register",
            &register,
            crate::now_ms(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(trapping_call(&mut core).status, 500);
        assert_eq!(core.traps, 1);
        assert!(!core.failed());
        assert_eq!(
            route_get(&mut core, &account),
            200,
            "the fresh instance reads the storage"
        );
        drop(core);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Requests parked in an instance that traps end their wait with it (their channels
    /// close: the host answers each as uncommitted), and the fresh instance holds none of them.
    #[test]
    fn a_trap_ends_the_wait_of_every_parked_request() {
        use relay_core::wire::identity::RelayId;
        let dir = scratch("parked-trap");
        let mut core = load(&dir.join("relay.sqlite"));
        let (peer, me) = (
            RelayId::parse("http://127.0.0.1:2").unwrap(),
            RelayId::parse(RELAY).unwrap(),
        );
        let body = br#"{"account":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#;
        let mut waits = Vec::new();
        for n in 0..3u8 {
            let now = crate::now_ms();
            let h = relay_core::wire::relay_request::sign(
                &[9; 32],
                "dev",
                "route.get",
                &peer,
                &me,
                now,
                &[n; 16],
                body,
                None,
            );
            let req = HttpRequest {
                listener: Listener::Public,
                method: "POST".into(),
                path: "/relay/v1/route.get".into(),
                query: String::new(),
                headers: h
                    .pairs()
                    .iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                    .collect(),
                body: body.to_vec(),
                origin: Some("127.0.0.1".into()),
            };
            let (step, wait) = core.handle(&req, None, now);
            match step {
                // One fetch for the three: the first names it, the others wait for it.
                Step::Parked(p) => assert_eq!(p.start.is_some(), n == 0),
                other => panic!("request {n} was not parked: {other:?}"),
            }
            waits.push(wait.expect("a parked request waits"));
        }
        assert_eq!(trapping_call(&mut core).status, 500);
        for mut w in waits {
            assert!(
                matches!(
                    w.try_recv(),
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected)
                ),
                "a parked request of the trapped instance still waits"
            );
        }
        let resumed = core.key_fetched(peer.as_str(), &Fetch::NotSent, crate::now_ms());
        assert!(resumed.is_empty(), "the fresh instance parked nothing");
        drop(core);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_trap_whose_fresh_instance_cannot_start_fails_closed_and_keeps_the_real_storage() {
        let dir = scratch("fails-closed");
        let db = dir.join("relay.sqlite");
        let mut core = load(&db);
        let (register, account) = registration();
        // A group's earlier call (its writes wait in the group), then a trap whose restart fails.
        core.begin_group();
        let r = core.call(
            &Caller::Anonymous,
            "account.register",
            &register,
            crate::now_ms(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        core.config_json = "not a configuration".into();
        assert_eq!(trapping_call(&mut core).status, 500);
        assert_eq!(core.traps, 1);
        assert!(
            core.failed(),
            "no instance could be made: the core has failed closed"
        );
        // Nothing enters a guest again: every call answers internal, and no trap is counted.
        assert_eq!(route_get(&mut core, &account), 500);
        assert!(core.well_known().is_empty());
        assert!(core.tick(crate::now_ms()).is_none());
        assert_eq!(core.traps, 1);
        // The group still flushes to the real storage, never to a stand-in.
        core.flush_group()
            .expect("the group's writes reach the database");
        drop(core);
        let mut again = load(&db);
        assert_eq!(
            route_get(&mut again, &account),
            200,
            "the registration is durable"
        );
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The WIT's `relay` is a resource: one instance holds two relays, each over its own
    /// store with its own config and key, and what one stores the other never sees.
    #[test]
    fn one_instance_holds_two_relays_each_over_its_own_store() {
        let engine = wasm_engine().unwrap();
        let path = crate::settings::component_path(&Default::default());
        let component = Component::from_file(&engine, &path).expect("the built component");
        let mut linker = Linker::new(&engine);
        CoreWorld::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).unwrap();
        let mut s = Store::new(&engine, HostState::new(StoreLimitsBuilder::new().build()));
        s.set_epoch_deadline(u64::MAX / 2);
        let instance = CoreWorld::instantiate(&mut s, &component, &linker).unwrap();
        let api = instance.relay_core_relay().relay();
        let open = |s: &mut Store<HostState>, url: &str, seed: u8| {
            let config = relay_core::engine::Config::new(
                relay_core::wire::identity::RelayId::parse(url).unwrap(),
                "dev",
            );
            let store = s
                .data_mut()
                .open_store(Grouped::new(AnyStore::Memory(Default::default())));
            let config = String::from_utf8(config.to_json()).unwrap();
            api.call_open(&mut *s, store, &config, &[seed; 32], None)
                .unwrap()
                .expect("the relay opens")
        };
        let a = open(&mut s, RELAY, 1);
        let b = open(&mut s, "http://127.0.0.1:2", 2);
        let now = crate::now_ms();
        let call = |s: &mut Store<HostState>, relay, method: &str, params: &[u8]| {
            api.call_call(
                &mut *s,
                relay,
                &Caller::Anonymous,
                None,
                method,
                params,
                now,
            )
            .unwrap()
        };
        let (register, account) = registration();
        assert_eq!(call(&mut s, a, "account.register", &register).status, 200);
        let get = format!(r#"{{"account":"{account}"}}"#);
        assert_eq!(call(&mut s, a, "route.get", get.as_bytes()).status, 200);
        let r = call(&mut s, b, "route.get", get.as_bytes());
        assert_eq!(
            (r.status, r.error),
            (404, Some(ErrorCode::NotFound)),
            "the other relay's store never saw the account"
        );
        let known = |s: &mut Store<HostState>, relay| {
            String::from_utf8(api.call_well_known(&mut *s, relay).unwrap()).unwrap()
        };
        let (ka, kb) = (known(&mut s, a), known(&mut s, b));
        assert!(
            ka.contains("127.0.0.1:1") && kb.contains("127.0.0.1:2"),
            "{ka} {kb}"
        );
        // A bad config is the typed error, and opens nothing.
        let store = s
            .data_mut()
            .open_store(Grouped::new(AnyStore::Memory(Default::default())));
        let e = api
            .call_open(&mut s, store, "{", &[3; 32], None)
            .unwrap()
            .expect_err("a bad config is refused");
        assert!(matches!(e, Error::BadConfig(_)), "{e:?}");
    }

    #[test]
    fn the_typed_exports_answer_with_the_protocols_error_code_and_init_errors_are_typed() {
        let dir = scratch("typed");
        let db = dir.join("relay.sqlite");
        let mut core = load(&db);
        let now = crate::now_ms();
        // The typed exports: a refusal is the protocol's code, status and error object.
        let f = core.send(&Caller::Anonymous, b"{}", now).unwrap_err();
        assert_eq!((f.code, f.status), (ErrorCode::InvalidParams, 400));
        assert_eq!(f.error.code, "invalid_params");
        let f = core.sync(&Caller::Anonymous, 0, Some(10), now).unwrap_err();
        assert_eq!((f.code, f.status), (ErrorCode::Unauthenticated, 401));
        let f = core.status(&Caller::Anonymous, "m", now).unwrap_err();
        assert_eq!(f.code, ErrorCode::Unauthenticated);
        let f = core.deliver(&Caller::Anonymous, b"{}", now).unwrap_err();
        assert!(matches!(
            f.code,
            ErrorCode::InvalidParams | ErrorCode::Unauthenticated
        ));
        // Other methods by name: an account not registered yet is not found, then is.
        let (register, account) = registration();
        let params = format!(r#"{{"account":"{account}"}}"#);
        let r = core.call(&Caller::Anonymous, "route.get", params.as_bytes(), now);
        assert_eq!((r.status, r.error), (404, Some(ErrorCode::NotFound)));
        let r = core.call(&Caller::Anonymous, "account.register", &register, now);
        assert_eq!((r.status, r.error), (200, None));
        let r = core.call(&Caller::Anonymous, "route.get", params.as_bytes(), now);
        assert_eq!((r.status, r.error), (200, None));
        drop(core);
        // A store written by a newer relay: init's typed error says so, and the host refuses it.
        let mut newer = SqliteStore::open(&db).expect("sqlite");
        newer
            .commit(vec![(b"meta/schema".to_vec(), Some(b"99".to_vec()))])
            .unwrap();
        drop(newer);
        let config = relay_core::engine::Config::new(
            relay_core::wire::identity::RelayId::parse(RELAY).unwrap(),
            "dev",
        );
        let e = Core::load(
            &wasm_engine().unwrap(),
            &crate::settings::component_path(&Default::default()),
            AnyStore::Sqlite(SqliteStore::open(&db).expect("sqlite")),
            String::from_utf8(config.to_json()).unwrap(),
            [7; 32],
            None,
        )
        .err()
        .expect("a newer store is refused");
        assert!(format!("{e:#}").contains("newer relay"), "{e:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
