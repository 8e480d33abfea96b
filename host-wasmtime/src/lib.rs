//! The wasmtime host: runs the relay core component and does the I/O it asks for.
//!
//! One thread owns the component instance and its storage; every call is a
//! job on that thread, so the core's operations are serialized exactly as
//! the engine expects. The async side (axum, tokio) moves bytes, keeps time,
//! runs timers and executes effects. No protocol logic lives here.

pub mod group;
pub mod guest;
mod hub;
pub mod net;
pub mod ops;
mod outbound;
pub mod preverify;
mod server;
pub mod settings;
pub mod store;

use anyhow::Context;
use guest::{Core, Effect, Reply};
use relay_core::engine::{Config, MemoryStore};
use relay_core::wire::identity::RelayId;
use settings::Settings;
use std::net::SocketAddr;
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

/// What a call answers when its group's commit failed: nothing it did was accepted.
pub trait Uncommitted {
    /// The answer of a call whose writes were undone.
    fn uncommitted() -> Self;
}

impl Uncommitted for Reply {
    fn uncommitted() -> Reply {
        guest::internal_reply()
    }
}
impl<T> Uncommitted for Vec<T> {
    fn uncommitted() -> Vec<T> {
        Vec::new()
    }
}
impl<T> Uncommitted for Option<T> {
    fn uncommitted() -> Option<T> {
        None
    }
}
impl<T> Uncommitted for Result<T, Reply> {
    fn uncommitted() -> Result<T, Reply> {
        Err(guest::internal_reply())
    }
}
impl<A: Uncommitted, B: Uncommitted> Uncommitted for (A, B) {
    fn uncommitted() -> (A, B) {
        (A::uncommitted(), B::uncommitted())
    }
}

/// A handle to the thread that owns the core.
#[derive(Clone)]
pub struct CoreHandle {
    tx: std::sync::mpsc::Sender<Job>,
}

impl CoreHandle {
    /// Runs `f` on the core thread and waits for its answer, which leaves only after its commit is durable.
    pub async fn run<R: Uncommitted + Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> R {
        let (otx, orx) = oneshot::channel();
        let job = Job::Call(Box::new(move |core| {
            let r = f(core);
            Box::new(move |durable| {
                let _ = otx.send(if durable { r } else { R::uncommitted() });
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

/// Shared state of a running relay.
pub struct App {
    pub core: CoreHandle,
    pub relay: RelayId,
    pub network: String,
    pub max_request_bytes: usize,
    pub admin_token: String,
    /// The host's own metrics (the core counts the rest).
    pub metrics: Arc<ops::HostMetrics>,
    /// What `/readyz` answers from.
    pub health: Arc<ops::Health>,
    /// One structured log line per accepted message and per ended delivery (`--log-format json`).
    pub log_events: bool,
    hub: hub::Hub,
    wake: watch::Sender<Option<u64>>,
    peers: outbound::Peers,
    /// Calls that entered the core (for tests that prove a request never reached it).
    pub core_calls: std::sync::atomic::AtomicU64,
    /// Envelope signatures verified on the HTTP workers (`None` with `RELAY_PREVERIFY=0`).
    pub preverify: Option<Arc<preverify::Preverify>>,
}

impl App {
    /// Executes a call's effects: outbound deliveries, timers, notifications, session ends.
    pub fn dispatch(self: &Arc<App>, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Send(req) => {
                    let app = self.clone();
                    tokio::spawn(async move { outbound::attempt(app, req).await });
                }
                Effect::WakeAt(at) => {
                    self.wake.send_if_modified(|w| {
                        let changed = *w != Some(at);
                        *w = Some(at);
                        changed
                    });
                }
                Effect::Notify(n) => self.hub.notify(&n.account, n.latest_seq),
                Effect::EndDeviceSessions(d) => self.hub.end_device(&d.account, &d.device_id),
                Effect::DeliveryEnded(d) => {
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
            }
        }
    }

    /// Logs an accepted message from the DeliveryStatus its call answered (ids only).
    fn log_accepted(method: &'static str, body: &[u8]) {
        let Ok(v) = relay_core::wire::json::parse(body) else {
            return;
        };
        let Some(o) = v.as_object() else {
            return;
        };
        let field = |k: &str| o.get(k).and_then(relay_core::wire::json::Value::as_str);
        tracing::info!(
            target: "relay::event",
            event = "accepted",
            method,
            message_id = field("message_id"),
            from = field("from"),
            to = field("to"),
            status = field("status"),
        );
    }

    /// Calls a method for a caller that connected from `origin` (the peer's IP address) and
    /// executes its effects; the reply goes back to the caller.
    pub async fn call(
        self: &Arc<App>,
        caller: guest::Caller,
        origin: Option<String>,
        method: String,
        params: Vec<u8>,
    ) -> Reply {
        let logged = match method.as_str() {
            "message.send" if self.log_events => Some("message.send"),
            "message.deliver" if self.log_events => Some("message.deliver"),
            _ => None,
        };
        let mut reply = self
            .core
            .run(move |c| c.call_from(&caller, origin.as_deref(), &method, &params, now_ms()))
            .await;
        if let (Some(m), 200) = (logged, reply.status) {
            App::log_accepted(m, &reply.body);
        }
        self.dispatch(std::mem::take(&mut reply.effects));
        reply
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
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// Writes `text` to `path` whole (a reader sees the old file or the new one), mode 0600.
fn write_whole(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let mut f = open
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn load_or_create_secret(path: &std::path::Path, len: usize) -> anyhow::Result<Vec<u8>> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let bytes = relay_core::wire::base64url::decode(text.trim())
            .with_context(|| format!("{} is not base64url", path.display()))?;
        anyhow::ensure!(
            bytes.len() == len,
            "{} must hold {len} bytes",
            path.display()
        );
        return Ok(bytes);
    }
    let mut b = vec![0u8; len];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("OS random source: {e}"))?;
    std::fs::write(path, relay_core::wire::base64url::encode(&b))?;
    Ok(b)
}

/// Starts a relay: loads the component, opens storage, binds the port, serves until stopped.
///
/// If the core traps and no fresh instance can be made over the storage, the relay does not
/// go on: it logs why and exits the process with status 70.
pub async fn start(settings: Settings) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let admin_listener = tokio::net::TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener {}", settings.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let admin_url = local_url(admin_addr);
    let url = settings
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    let relay = RelayId::parse(&url).map_err(|e| anyhow::anyhow!("--url {url}: {e}"))?;
    let mut config = Config::new(relay.clone(), &settings.network);
    config.policies = settings.policies.clone();
    if let Some(t) = settings.attempt_timeout {
        config.attempt_timeout = t;
    }
    if let Some(m) = settings.max_in_flight_per_destination {
        config.max_in_flight_per_destination = m;
    }
    let (seed, admin_token, store_path) = match &settings.data {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
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
    let component = settings.component_path();
    let config_json = String::from_utf8(config.to_json())?;

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
        .then(|| Arc::new(preverify::Preverify::default()));
    let core_pre = pre.clone();
    let metrics = Arc::new(ops::HostMetrics::default());
    let health = Arc::new(ops::Health::default());
    let (core_metrics, core_health) = (metrics.clone(), health.clone());
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    std::thread::Builder::new()
        .name("relay-core".into())
        .spawn(move || {
            let store = match &store_path {
                Some(p) => SqliteStore::open(p)
                    .map(AnyStore::Sqlite)
                    .map_err(|e| anyhow::anyhow!("{e}")),
                None => Ok(AnyStore::Memory(MemoryStore::new())),
            };
            let core = store.and_then(|s| {
                Core::load(&engine, &component, s, config_json, seed)
                    .map_err(|e| anyhow::anyhow!("loading {}: {e:#}", component.display()))
            });
            let mut core = match core {
                Ok(mut c) => {
                    c.set_preverify(core_pre);
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
                            &mut core,
                            first,
                            &rx,
                            max_group,
                            &core_metrics,
                            &core_health,
                        );
                        if let Some(f) = alone {
                            f(&mut core);
                        }
                    }
                    Job::Alone(f) => f(&mut core),
                }
                if core.traps != traps || core.restarts != restarts {
                    core_metrics.traps.inc_by(core.traps - traps);
                    core_metrics.restarts.inc_by(core.restarts - restarts);
                    (traps, restarts) = (core.traps, core.restarts);
                }
                if core.failed() {
                    core_health.set_core_failed();
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

    let (wake_tx, wake_rx) = watch::channel(None);
    let app = Arc::new(App {
        core: CoreHandle { tx },
        relay: relay.clone(),
        network: settings.network.clone(),
        max_request_bytes: settings.policies.max_request_bytes as usize,
        admin_token,
        metrics,
        health,
        log_events: settings.log_format == settings::LogFormat::Json,
        hub: hub::Hub::default(),
        wake: wake_tx,
        peers: outbound::Peers::for_attempts(config.attempt_timeout),
        core_calls: std::sync::atomic::AtomicU64::new(0),
        preverify: pre,
    });
    let first = app.core.run(|c| c.next_wake()).await;
    app.wake.send_replace(first);
    tokio::spawn(timer(app.clone(), wake_rx));

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
    for (listener, router, what) in [
        (listener, server::router(app.clone()), "server"),
        (
            admin_listener,
            server::admin_router(app.clone()),
            "admin server",
        ),
    ] {
        let listener = net::Counting::new(listener, app.metrics.open_connections.clone());
        let mut stop = stop_rx.clone();
        done.push(tokio::spawn(async move {
            let serve = axum::serve(
                listener,
                router.into_make_service_with_connect_info::<net::PeerAddr>(),
            )
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
            if let Err(e) = serve.await {
                tracing::error!("{what}: {e}");
            }
        }));
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
    metrics: &ops::HostMetrics,
    health: &ops::Health,
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
            false
        }
    };
    if let Some(t) = started {
        metrics.commit_duration.observe(t.elapsed().as_secs_f64());
        metrics.commit_group_size.observe(releases.len() as f64);
        health.set_storage_ok(durable);
    }
    for r in releases {
        r(durable);
    }
    alone
}

/// Sleeps until the core's next wake-up, ticks it, and repeats.
async fn timer(app: Arc<App>, mut wake: watch::Receiver<Option<u64>>) {
    loop {
        let next = *wake.borrow_and_update();
        let sleep = async {
            match next {
                Some(at) => {
                    let now = now_ms();
                    // A wake-up already due still waits a millisecond, so a stuck core cannot spin.
                    tokio::time::sleep(std::time::Duration::from_millis(
                        at.saturating_sub(now).max(1),
                    ))
                    .await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = sleep => {
                let metrics = app.metrics.clone();
                let (effects, next) = app.core.run(move |c| {
                    let started = std::time::Instant::now();
                    let e = c.tick(now_ms());
                    metrics.tick_duration.observe(started.elapsed().as_secs_f64());
                    (e, c.next_wake())
                }).await;
                app.wake.send_replace(next);
                app.dispatch(effects);
            }
            changed = wake.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// A small HTTP client for tools and tests (plain HTTP, no redirects).
pub struct AdminClient(outbound::Peers);

impl AdminClient {
    /// POSTs `body` to `url`; returns the status and body.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        match self
            .0
            .exchange(hyper::Method::POST, url, headers, body)
            .await
        {
            outbound::Exchange::Answered(s, b) => Ok((s, b)),
            outbound::Exchange::NotSent(e) | outbound::Exchange::Unknown(e) => {
                anyhow::bail!("{url}: {e}")
            }
        }
    }

    /// GETs `url`.
    pub async fn get(&self, url: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        match self
            .0
            .exchange(hyper::Method::GET, url, &[], Vec::new())
            .await
        {
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
