//! The running relay: its shared state (the shards' cores, limits, health, metrics, the
//! WebSocket hub, outbound peers), how it starts (listeners, data directory, cores, timers)
//! and stops.

use crate::guest::Event;
use crate::process::{
    create_data_dir, load_or_create_secret, raise_descriptor_limit, warn_open, write_whole,
};
use crate::settings::{self, Settings};
use crate::shard::{spawn_core, CoreHandle, CoreStart, ShardCore, Slot, SlotPlace};
use crate::store;
use crate::timer::timer;
use crate::{guest, hub, net, now_ms, ops, outbound, server, tls};
use anyhow::Context;
use relay_core::engine::Config;
use relay_core::transport::alarm::Alarm;
use relay_core::transport::host_metrics::HostMetrics;
use relay_core::wire::identity::RelayId;
use relay_core::wire::preverify::Memory as Preverify;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Shared state of a running relay.
pub struct App {
    /// The relay's cores, one per shard (`--shards`, one by default): the core placement
    /// picks serves a request, and each core's events are executed for that core.
    pub shards: Vec<ShardCore>,
    pub max_request_bytes: usize,
    /// The relay's policies: the core's body limit of each path (`Policies::body_limit`).
    pub policies: relay_core::engine::Policies,
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
    pub(crate) hub: hub::Hub,
    pub(crate) peers: outbound::Peers,
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
    let pre = relay_settings::tuning()
        .preverify
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
        policies: settings.policies.clone(),
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
