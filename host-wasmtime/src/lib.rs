//! The wasmtime host: runs the relay core component and does the I/O it asks for.
//!
//! One thread owns the component instance and its storage; every call is a
//! job on that thread, so the core's operations are serialized exactly as
//! the engine expects. The async side (axum, tokio) moves bytes, keeps time,
//! runs timers and executes effects. No protocol logic lives here.

pub mod guest;
mod hub;
pub mod net;
pub mod ops;
mod outbound;
mod server;
pub mod settings;
pub mod store;
pub mod tls;

pub use outbound::Rules;
pub use relay_core::transport::address::refused as refused_address;

use anyhow::Context;
use guest::{Core, Event};
use relay_core::engine::{Config, MemoryStore};
use relay_core::transport::alarm::Alarm;
use relay_core::transport::host_metrics::HostMetrics;
use relay_core::wire::identity::RelayId;
use relay_core::wire::preverify::Memory as Preverify;
use settings::Settings;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use store::{AnyStore, SqliteStore};
use tokio::sync::{oneshot, watch};

/// Epoch ticks (10 ms each) a single call may run before it is interrupted.
pub const EPOCHS_PER_CALL: u64 = 1_000;

/// Milliseconds since the Unix epoch: the only clock, read by the host and passed in.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Releases a job's answer once its group's commit is known: `true` if it is durable.
type Release = Box<dyn FnOnce(bool) + Send>;
/// Work for the core thread.
enum Job {
    /// A call that joins a commit group; its answer leaves once the group is durable.
    Call(Box<dyn FnOnce(&mut Core) -> Release + Send>),
    /// Work that runs alone between two groups, with nothing uncommitted (a backup).
    Alone(Box<dyn FnOnce(&mut Core) + Send>),
}

/// The most operations one group commit holds.
///
/// Small groups keep the two halves of the relay working at once: while the
/// core thread runs one group, the answers of the group before it are on
/// their way and the HTTP workers parse and pre-verify the next requests.
/// With 256, a level of 128 closed-loop clients formed one group whose
/// answers all left together, and the workers and the core thread took turns
/// (docs/performance.md: 16 gave +20% at c=32 and +4% at c=128 over 256).
pub const MAX_GROUP: usize = 16;

/// A place among the requests in the core or waiting for it (`--max-pending`); the place is
/// given back when the request and every job it queued for the core are done.
#[derive(Clone)]
pub struct Slot(#[allow(dead_code)] Arc<SlotPlace>);

struct SlotPlace(Arc<AtomicUsize>);

impl Drop for SlotPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A handle to the thread that owns the core.
#[derive(Clone)]
pub struct CoreHandle {
    tx: std::sync::mpsc::Sender<Job>,
}

impl CoreHandle {
    /// Runs `f` on the core thread and waits for its answer, which leaves only after its
    /// commit is durable; `None` when the commit failed (nothing it did was accepted).
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> Option<R> {
        self.run_holding(None, f).await
    }

    /// As [`CoreHandle::run`], the job holding `slot` until its answer is released (a request
    /// that went away still counts while its job waits for the core).
    pub async fn run_holding<R: Send + 'static>(
        &self,
        slot: Option<Slot>,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> Option<R> {
        let (otx, orx) = oneshot::channel();
        let job = Job::Call(Box::new(move |core| {
            let r = f(core);
            Box::new(move |durable| {
                // The place is given back before the answer wakes its request, so a caller
                // that saw the answer finds it free.
                drop(slot);
                let _ = otx.send(durable.then_some(r));
            })
        }));
        if self.tx.send(job).is_err() {
            panic!("the core thread has stopped");
        }
        orx.await.expect("the core thread dropped a job")
    }

    /// Runs `f` on the core thread between two commit groups: every call before it has
    /// committed (or been undone), none after it has started.
    pub async fn alone<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> R {
        let (otx, orx) = oneshot::channel();
        let job = Job::Alone(Box::new(move |core| {
            let _ = otx.send(f(core));
        }));
        if self.tx.send(job).is_err() {
            panic!("the core thread has stopped");
        }
        orx.await.expect("the core thread dropped a job")
    }
}

/// One shard of the relay: the thread that owns its core, and its timer's alarm.
pub struct ShardCore {
    /// The core of this shard's accounts.
    pub core: CoreHandle,
    wake: watch::Sender<Alarm>,
}

/// Shared state of a running relay.
pub struct App {
    /// The relay's cores, one per shard (`--shards`, one by default): the core placement
    /// picks serves a request, and each core's events are executed for that core.
    pub shards: Vec<ShardCore>,
    pub max_request_bytes: usize,
    /// The transports' limits.
    pub limits: settings::Limits,
    /// Requests in the core or waiting for it (at most `limits.max_pending`).
    pending: Arc<AtomicUsize>,
    pub admin_token: String,
    /// The host's own metrics (the core counts the rest).
    pub metrics: Arc<HostMetrics>,
    /// What `/readyz` answers from.
    pub health: Arc<ops::Health>,
    /// One structured log line per accepted message and per ended delivery (`--log-format json`).
    pub log_events: bool,
    hub: hub::Hub,
    peers: outbound::Peers,
    /// Calls that entered the core (for tests that prove a request never reached it).
    pub core_calls: std::sync::atomic::AtomicU64,
    /// What the HTTP workers do before the core's thread: the core's answers that need no
    /// state, and envelopes verified ahead (no memory with `RELAY_PREVERIFY=0`).
    pub ahead: relay_core::transport::ahead::Ahead,
}

impl App {
    /// A place for one more request in the core, or `None` when `--max-pending` are there
    /// already (the request is then answered 503 unavailable, counted in `relay_busy_total`).
    pub fn admit(&self) -> Option<Slot> {
        let before = self.pending.fetch_add(1, Ordering::AcqRel);
        if before as u64 >= self.limits.max_pending {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.metrics.busy.inc();
            return None;
        }
        Some(Slot(Arc::new(SlotPlace(self.pending.clone()))))
    }

    /// Requests in the core or waiting for it now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Key fetches (GETs of a peer's `/.well-known/relay`) this host started so far.
    pub fn key_fetches(&self) -> u64 {
        self.peers.key_fetches()
    }

    /// Closes every WebSocket (1001): the relay is stopping.
    pub fn close_websockets(&self) {
        self.hub.close_all();
    }

    /// The core of shard `shard`.
    pub fn core(&self, shard: u32) -> &CoreHandle {
        &self.shards[shard as usize].core
    }

    /// How many shards the relay has.
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// The shard whose core handles `req` (the core's placement; one shard needs none).
    pub fn shard_of(&self, req: &relay_core::transport::Request) -> u32 {
        match self.shard_count() {
            1 => 0,
            n => relay_core::transport::placement::shard_of(req, n),
        }
    }

    /// Executes the events of a call of shard `shard`'s core: outbound requests, timers,
    /// notifications, closes.
    pub fn dispatch(self: &Arc<App>, shard: u32, events: Vec<Event>) {
        for e in events {
            match e {
                Event::Send(req) => {
                    let app = self.clone();
                    tokio::spawn(async move { outbound::attempt(app, shard, req).await });
                }
                Event::WakeAt(at) => {
                    self.shards[shard as usize]
                        .wake
                        .send_if_modified(|a| a.wake_at(at));
                }
                Event::ShardCall(c) => {
                    let app = self.clone();
                    let request = guest::HttpRequest {
                        listener: guest::Listener::Public,
                        method: "POST".into(),
                        path: c.path,
                        query: String::new(),
                        headers: Vec::new(),
                        body: c.body,
                        origin: None,
                    };
                    tokio::spawn(async move { outbound::internal(&app, c.shard, request).await });
                }
                Event::Notify(n) => self.hub.notify(&n.account, &n.frame),
                Event::Close(c) => {
                    self.hub
                        .close_device(&c.account, &c.device_id, c.code, &c.reason)
                }
                Event::Accepted(a) => {
                    if self.log_events {
                        tracing::info!(
                            target: "relay::event",
                            event = "accepted",
                            method = %a.method,
                            message_id = %a.message_id,
                            from = %a.from,
                            to = %a.to,
                            status = %a.status,
                        );
                    }
                }
                Event::DeliveryEnded(d) => {
                    if self.log_events {
                        tracing::info!(
                            target: "relay::event",
                            event = "delivery_ended",
                            message_id = %d.message_id,
                            from = %d.from,
                            to = %d.to,
                            status = %d.status,
                            error_code = d.error_code.as_deref(),
                        );
                    }
                }
                // The audit trail: every operator action, whatever the event setting.
                Event::OperatorAction(a) => {
                    tracing::info!(
                        target: "relay::audit",
                        event = "operator_action",
                        who = "admin listener",
                        action = %a.action,
                        subject = %a.subject,
                        touched = a.touched,
                        "operator action"
                    );
                }
            }
        }
    }
}

/// A relay that is serving.
pub struct Running {
    pub addr: SocketAddr,
    pub url: String,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// The admin listener's base URL (what `DATA/admin.url` holds).
    pub admin_url: String,
    pub app: Arc<App>,
    /// `DATA/admin.url`, removed at a clean stop.
    admin_url_file: Option<std::path::PathBuf>,
    shutdown: Option<watch::Sender<bool>>,
    done: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish, and stops the core after its last commit.
    pub async fn stop(mut self) {
        self.app.health.set_stopping();
        self.app.close_websockets();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(true);
        }
        for d in self.done.drain(..) {
            let _ = d.await;
        }
        if let Some(f) = &self.admin_url_file {
            // Only our own: a newer relay on the same data may have written its address since.
            if std::fs::read_to_string(f).is_ok_and(|t| t.trim() == self.admin_url) {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

/// The base URL a local client reaches a listener bound at `addr` with.
fn local_url(addr: SocketAddr) -> String {
    local_url_scheme("http", addr)
}

fn local_url_scheme(scheme: &str, addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// Writes `text` to `path` whole (a reader sees the old file or the new one), mode 0600.
fn write_whole(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        store::private_file(&tmp, true).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A secret of `len` bytes kept in `path` (base64url): read when the file is there, made
/// (mode 0600, never over an existing file) only when it is absent. Any other failure stops
/// the start with a message naming the file: a relay never replaces its key or token
/// because it could not read them.
pub fn load_or_create_secret(path: &std::path::Path, len: usize) -> anyhow::Result<Vec<u8>> {
    const FIX: &str = "fix it or move it away (a new one is made only when the file is absent)";
    match std::fs::read(path) {
        Ok(raw) => {
            let text = std::str::from_utf8(&raw).unwrap_or("").trim();
            match relay_core::wire::base64url::decode(text) {
                Some(bytes) if bytes.len() == len && !text.is_empty() => Ok(bytes),
                _ => anyhow::bail!(
                    "{}: malformed: it must hold {len} bytes in base64url; {FIX}",
                    path.display()
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            let mut b = vec![0u8; len];
            getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("OS random source: {e}"))?;
            let mut f = store::private_file(path, true)
                .with_context(|| format!("{}: cannot create it", path.display()))?;
            f.write_all(relay_core::wire::base64url::encode(&b).as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("{}: cannot write it", path.display()))?;
            Ok(b)
        }
        Err(e) => anyhow::bail!("{}: cannot read it ({e}); {FIX}", path.display()),
    }
}

/// Warns about a data directory or secret that others can read (made by an older relay, or
/// by hand): new ones are made 0700 and 0600, existing ones are left as they are.
fn warn_open(dir: &std::path::Path) {
    #[cfg(unix)]
    for (name, max) in [
        (".", 0o700),
        ("relay.key", 0o600),
        ("admin.token", 0o600),
        ("relay.sqlite", 0o600),
    ] {
        use std::os::unix::fs::PermissionsExt;
        let file = if name == "." {
            dir.to_path_buf()
        } else {
            dir.join(name)
        };
        if let Ok(m) = std::fs::metadata(&file) {
            let mode = m.permissions().mode() & 0o777;
            if mode & !max & 0o077 != 0 {
                tracing::warn!(
                    "{} is open to others (mode {mode:o}); chmod {max:o} it",
                    file.display()
                );
            }
        }
    }
}

/// Raises the soft limit on open files to the hard one (as Node does at start), and warns
/// when the connection caps do not fit under it: beyond the limit `accept` fails and the
/// relay takes nothing until connections close.
fn raise_descriptor_limit(limits: &settings::Limits) {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                return;
            }
            if l.rlim_cur < l.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: l.rlim_max,
                    rlim_max: l.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    l.rlim_cur = l.rlim_max;
                }
            }
        }
        // Both listeners at their caps, plus outbound connections, the store and the rest.
        let needed = limits.max_connections.saturating_mul(2).saturating_add(256);
        // rlim_t is u64 here, not everywhere.
        #[allow(clippy::unnecessary_cast)]
        let have = l.rlim_cur as u64;
        if have < needed {
            tracing::warn!(
                "open files are limited to {}: with --max-connections {} on each listener the relay may run out of descriptors; lower it or raise the limit (ulimit -n)",
                l.rlim_cur,
                limits.max_connections
            );
        }
    }
}

/// Creates the data directory (and its parents) with mode 0700: it holds the relay's key.
fn create_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Starts a relay: loads the component, opens storage, binds the port, serves until stopped.
///
/// If the core traps and no fresh instance can be made over the storage, the relay does not
/// go on: it logs why and exits the process with status 70.
pub async fn start(settings: Settings) -> anyhow::Result<Running> {
    start_with(settings, None).await
}

/// Starts a relay whose storage and core fail on request (tests of the timer's recovery).
#[doc(hidden)]
pub async fn start_with(
    settings: Settings,
    faults: Option<Arc<store::Faults>>,
) -> anyhow::Result<Running> {
    settings.check().map_err(anyhow::Error::msg)?;
    raise_descriptor_limit(&settings.limits);
    let acceptor = match (&settings.tls_cert, &settings.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let client_tls = tls::client_config(&settings.ca)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let admin_listener = tokio::net::TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener {}", settings.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let admin_url = local_url(admin_addr);
    let url = settings.url.clone().unwrap_or_else(|| {
        format!(
            "{}://{addr}",
            if acceptor.is_some() { "https" } else { "http" }
        )
    });
    let relay = RelayId::parse(&url).map_err(|e| anyhow::anyhow!("--url {url}: {e}"))?;
    let mut config = Config::new(relay.clone(), &settings.network);
    config.policies = settings.policies.clone();
    let e = &settings.engine;
    config.set_options(e.attempt_timeout, e.max_in_flight_per_destination);
    // Attempts in flight before now were carried by a process that is gone; a trap
    // recovery reuses this configuration, so its attempts (still carried) are not.
    config.started_at = Some(now_ms());
    let (seed, admin_token, store_path) = match &settings.data {
        Some(dir) => {
            create_data_dir(dir)?;
            let seed = load_or_create_secret(&dir.join("relay.key"), 32)?;
            let admin = load_or_create_secret(&dir.join("admin.token"), 24)?;
            (
                seed,
                relay_core::wire::base64url::encode(&admin),
                Some(dir.join("relay.sqlite")),
            )
        }
        None => {
            let mut s = vec![0u8; 32];
            let mut a = vec![0u8; 24];
            getrandom::fill(&mut s).map_err(|e| anyhow::anyhow!("{e}"))?;
            getrandom::fill(&mut a).map_err(|e| anyhow::anyhow!("{e}"))?;
            (s, relay_core::wire::base64url::encode(&a), None)
        }
    };
    let seed: [u8; 32] = seed.try_into().map_err(|_| anyhow::anyhow!("relay key"))?;
    let component = settings::component_path(&settings);

    let engine = guest::wasm_engine().map_err(|e| anyhow::anyhow!("wasmtime: {e:#}"))?;
    {
        // Epoch ticker: bounds the wall-clock time of any single call.
        let engine = engine.clone();
        std::thread::Builder::new()
            .name("relay-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(10));
                engine.increment_epoch();
            })?;
    }
    // `RELAY_PREVERIFY=0` leaves every verification to the core thread (to measure what this pays).
    let pre = (std::env::var_os("RELAY_PREVERIFY").is_none_or(|v| v != "0"))
        .then(|| Arc::new(Preverify::default()));
    let metrics = Arc::new(HostMetrics::default());
    let health = Arc::new(ops::Health::default());
    let mut shards = Vec::new();
    let mut timers = Vec::new();
    for index in 0..settings.shards {
        let mut config = config.clone();
        config.shard = relay_core::engine::shard::Shard::new(index, settings.shards)
            .map_err(anyhow::Error::msg)?;
        // Shard 0 keeps the one file a relay of one shard has; the others sit beside it.
        let store_path = store_path.as_ref().map(|p| match index {
            0 => p.clone(),
            k => p.with_file_name(format!("relay-shard-{k}.sqlite")),
        });
        let (wake_tx, wake_rx) = watch::channel(Alarm::new());
        let core = spawn_core(CoreStart {
            index,
            engine: engine.clone(),
            component: component.clone(),
            store_path,
            config_json: String::from_utf8(config.to_json())?,
            seed,
            admin_token: admin_token.clone(),
            preverify: pre.clone(),
            faults: faults.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
            wake: wake_tx.clone(),
        })?;
        shards.push(ShardCore {
            core,
            wake: wake_tx,
        });
        timers.push(wake_rx);
    }
    if let Some(dir) = &settings.data {
        warn_open(dir);
    }

    let app = Arc::new(App {
        shards,
        max_request_bytes: settings.policies.max_request_bytes as usize,
        limits: settings.limits,
        pending: Arc::new(AtomicUsize::new(0)),
        admin_token,
        metrics,
        health,
        log_events: settings.log_format == settings::LogFormat::Json,
        hub: hub::Hub::default(),
        peers: outbound::Peers::for_relay(
            outbound::Rules::on(&settings.network, settings.allow_private_peers),
            client_tls,
        ),
        core_calls: std::sync::atomic::AtomicU64::new(0),
        ahead: relay_core::transport::ahead::Ahead::new(&config, pre),
    });
    // Each core's first tick runs at once: its events end with that core's next wake-up.
    for (index, wake_rx) in timers.into_iter().enumerate() {
        app.shards[index].wake.send_modify(|a| {
            a.wake_at(now_ms());
        });
        tokio::spawn(timer(app.clone(), index as u32, wake_rx));
    }

    // The admin listener's address, for `relay admin` and scripts, before either listener
    // serves: once the public port answers, the file names this process's admin listener.
    let admin_url_file = match &settings.data {
        Some(dir) => {
            let f = dir.join("admin.url");
            write_whole(&f, &format!("{admin_url}\n"))?;
            Some(f)
        }
        None => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut done = Vec::new();
    let public = net::Listen {
        limits: settings.limits,
        per_ip: true,
        tls: acceptor,
        metrics: app.metrics.clone(),
    };
    let admin = net::Listen {
        per_ip: false,
        tls: None,
        ..public.clone()
    };
    for (listener, router, listen) in [
        (listener, server::router(app.clone()), public),
        (admin_listener, server::admin_router(app.clone()), admin),
    ] {
        done.push(tokio::spawn(net::serve(
            listener,
            router,
            listen,
            stop_rx.clone(),
        )));
    }
    tracing::info!(relay = %url, network = %settings.network, admin = %admin_url, "relay serving");
    Ok(Running {
        addr,
        url,
        admin_addr,
        admin_url,
        app,
        admin_url_file,
        shutdown: Some(stop_tx),
        done,
    })
}

/// What one shard's core thread starts from.
struct CoreStart {
    index: u32,
    engine: wasmtime::Engine,
    component: std::path::PathBuf,
    /// Its SQLite file; `None`: in memory.
    store_path: Option<std::path::PathBuf>,
    config_json: String,
    seed: [u8; 32],
    admin_token: String,
    preverify: Option<Arc<Preverify>>,
    faults: Option<Arc<store::Faults>>,
    metrics: Arc<HostMetrics>,
    health: Arc<ops::Health>,
    wake: watch::Sender<Alarm>,
}

/// Starts the thread that owns one shard's core, and returns its handle once the core
/// loaded over its storage (or why it could not).
///
/// If the core traps and no fresh instance can be made over the storage, the relay does not
/// go on: it logs why and exits the process with status 70.
fn spawn_core(s: CoreStart) -> anyhow::Result<CoreHandle> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let name = match s.index {
        0 => "relay-core".to_string(),
        k => format!("relay-core-{k}"),
    };
    std::thread::Builder::new().name(name).spawn(move || {
        let store = match &s.store_path {
            Some(p) => SqliteStore::open(p)
                .map(AnyStore::Sqlite)
                .map_err(|e| anyhow::anyhow!("{e}")),
            None => Ok(AnyStore::Memory(MemoryStore::new())),
        };
        let store = match &s.faults {
            Some(f) => store.map(|st| AnyStore::Faulty(Box::new(st), f.clone())),
            None => store,
        };
        let core = store.and_then(|st| {
            Core::load(
                &s.engine,
                &s.component,
                st,
                s.config_json,
                s.seed,
                Some(s.admin_token),
            )
            .map_err(|e| anyhow::anyhow!("loading {}: {e:#}", s.component.display()))
        });
        let mut core = match core {
            Ok(mut c) => {
                c.set_preverify(s.preverify);
                c.set_faults(s.faults);
                let _ = ready_tx.send(Ok(()));
                c
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        // `RELAY_GROUP_COMMIT=0` commits each call alone and `=N` caps a group at N calls
        // (to measure what grouping and its size pay).
        let max_group = match std::env::var("RELAY_GROUP_COMMIT").map(|v| v.parse::<usize>()) {
            Ok(Ok(n)) => n.max(1),
            _ => MAX_GROUP,
        };
        // Jobs run until every handle is gone; the last group's commit finishes first.
        let (mut traps, mut restarts) = (0, 0);
        while let Ok(job) = rx.recv() {
            match job {
                Job::Call(first) => {
                    let alone = run_group(
                        &mut core, first, &rx, max_group, &s.metrics, &s.health, &s.wake,
                    );
                    if let Some(f) = alone {
                        f(&mut core);
                    }
                }
                Job::Alone(f) => f(&mut core),
            }
            if core.traps != traps || core.restarts != restarts {
                s.metrics.traps.inc_by(core.traps - traps);
                s.metrics.restarts.inc_by(core.restarts - restarts);
                (traps, restarts) = (core.traps, core.restarts);
            }
            if core.failed() {
                s.health.set_core_failed();
                // Fail closed: without an instance over the real storage nothing can be
                // answered truthfully, so the process stops (a supervisor restarts it).
                tracing::error!(
                    "the relay core could not be restarted after a trap; exiting (status 70)"
                );
                std::process::exit(70);
            }
        }
    })?;
    ready_rx.recv().context("the core thread died")??;
    Ok(CoreHandle { tx })
}

type Alone = Box<dyn FnOnce(&mut Core) + Send>;

/// Runs `first` and every call already queued behind it (up to `max` in all) as one commit
/// group; a job that must run alone ends the group and is handed back, to run after it.
///
/// Jobs that queued while the previous group was committing share this
/// group's fsync; a lone job costs what it did before. Answers are released
/// only after the group's transaction is durable.
fn run_group(
    core: &mut Core,
    first: Box<dyn FnOnce(&mut Core) -> Release + Send>,
    rx: &std::sync::mpsc::Receiver<Job>,
    max: usize,
    metrics: &HostMetrics,
    health: &ops::Health,
    wake: &watch::Sender<Alarm>,
) -> Option<Alone> {
    core.begin_group();
    let mut releases = vec![first(core)];
    let mut alone = None;
    while releases.len() < max {
        match rx.try_recv() {
            Ok(Job::Call(job)) => releases.push(job(core)),
            Ok(Job::Alone(f)) => {
                alone = Some(f);
                break;
            }
            Err(_) => break,
        }
    }
    let writes = core.group_has_writes();
    let started = writes.then(std::time::Instant::now);
    let durable = match core.flush_group() {
        Ok(()) => true,
        Err(e) => {
            tracing::error!("group commit of {} calls failed: {e}", releases.len());
            // Whatever the group did is undone, and what it would have scheduled is not
            // known: the timer retries, as after a failed tick.
            wake.send_if_modified(|a| {
                let before = a.deadline();
                a.failed(now_ms());
                a.deadline() != before
            });
            false
        }
    };
    if let Some(t) = started {
        metrics.commit(releases.len(), t.elapsed().as_secs_f64());
        health.set_storage_ok(durable);
    }
    for r in releases {
        r(durable);
    }
    alone
}

/// Sleeps until the core's alarm ([`relay_core::transport::alarm`]), ticks it, and repeats.
async fn timer(app: Arc<App>, shard: u32, mut alarm: watch::Receiver<Alarm>) {
    let wake = &app.shards[shard as usize].wake;
    loop {
        let delay = alarm.borrow_and_update().delay(now_ms());
        let sleep = async {
            match delay {
                Some(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = sleep => {
                wake.send_modify(Alarm::fire);
                let metrics = app.metrics.clone();
                let ran = app.core(shard).run(move |c| {
                    let started = std::time::Instant::now();
                    let r = c.tick(now_ms());
                    metrics.tick_duration.observe(started.elapsed().as_secs_f64());
                    r
                }).await;
                // A group commit that failed armed the retry already (`run_group`).
                let (events, failed) = match ran {
                    None => (Vec::new(), None),
                    Some(None) => (Vec::new(), Some("the tick trapped".to_string())),
                    Some(Some(r)) => {
                        if r.error.is_none() {
                            wake.send_modify(Alarm::succeeded);
                        }
                        (r.events, r.error)
                    }
                };
                if let Some(why) = failed {
                    let mut wait = 0;
                    wake.send_modify(|a| wait = a.failed(now_ms()));
                    tracing::warn!("timer: {why}; ticking again in {wait} ms");
                }
                app.dispatch(shard, events);
            }
            changed = alarm.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// A small HTTP client for tools and tests (http or https, no redirects, any address).
pub struct AdminClient(outbound::Peers);

impl AdminClient {
    /// POSTs `body` to `url`; returns the status and body.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let e = self.0.exchange(hyper::Method::POST, url, headers, body);
        Self::answer(url, e.await)
    }

    /// GETs `url`.
    pub async fn get(&self, url: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let e = self.0.exchange(hyper::Method::GET, url, &[], Vec::new());
        Self::answer(url, e.await)
    }

    fn answer(url: &str, e: outbound::Exchange) -> anyhow::Result<(u16, Vec<u8>)> {
        match e {
            outbound::Exchange::Answered(s, b) => Ok((s, b)),
            outbound::Exchange::NotSent(e) | outbound::Exchange::Unknown(e) => {
                anyhow::bail!("{url}: {e}")
            }
        }
    }
}

/// A client for `relay admin` and tests.
pub fn admin_client() -> AdminClient {
    AdminClient(outbound::Peers::new())
}

/// A client that trusts only the CA certificates in `pem` for https (tests of TLS).
pub fn admin_client_trusting(pem: &[u8]) -> anyhow::Result<AdminClient> {
    Ok(AdminClient(outbound::Peers::build(
        Rules::open(),
        tls::client_config_trusting(pem)?,
        std::time::Duration::from_secs(20),
    )))
}
