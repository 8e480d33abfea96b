//! `serve`: a relay's flags and TOML keys, their defaults, and how the two layer.

use crate::Host;
use relay_core::engine::Policies;
use relay_core::transport::limits::{Limits, LIMITS};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, plus one line per accepted message and per ended delivery.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("log format {s:?}: text or json")),
        }
    }
}

/// Everything needed to start a relay. Serialized (camelCase, limits in the table's order,
/// the policies as given) it is the settings object the JavaScript hosts take.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// The public listener: HTTP, WebSocket and relay RPC.
    #[serde(serialize_with = "display")]
    pub listen: SocketAddr,
    /// The admin listener (`/admin/v1/*`, `/metrics`, health): loopback by default, port
    /// chosen by the system; its URL is written to `DATA/admin.url`.
    #[serde(serialize_with = "display")]
    pub admin_listen: SocketAddr,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// The public relay id; default `http://` (`https://` with TLS) + the listen address.
    pub url: Option<String>,
    /// Data directory (SQLite database, relay key, operator token); `None` keeps
    /// everything in memory.
    pub data: Option<PathBuf>,
    /// The network served.
    pub network: String,
    /// The policies in force (protocol.md §7): the defaults with those given over them.
    #[serde(skip)]
    pub policies: Policies,
    /// The policies given, by name (file, then flags): what a JavaScript host passes on.
    #[serde(rename = "policies")]
    pub policy: BTreeMap<String, u64>,
    /// The core component (wasmtime host); default: next to the binary, then `target/component/`.
    pub component: Option<PathBuf>,
    /// The engine's own options, by the keys of the core's configuration JSON: every host
    /// passes them to the core as they are.
    pub engine: Engine,
    /// Timeouts, connection caps and queue bounds of the transports.
    #[serde(serialize_with = "limits_in_order")]
    pub limits: Limits,
    /// Serve HTTPS and WSS on the public listener with this certificate chain (PEM) ...
    pub tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM files) trusted for outbound https beside the system's roots.
    pub ca: Vec<PathBuf>,
    /// Off `dev`, connect to loopback, private, link-local and other non-public peer addresses too.
    pub allow_private_peers: bool,
    /// Accounts sharded over this many cores (fixed at the data's first start; the core
    /// refuses another count).
    pub shards: u32,
    /// Probe a peer with a bare connect before each fetch (edge host: it tells a refused
    /// connection, not attempted, from a reset one, unknown).
    pub probe_peers: bool,
}

/// The options of the delivery engine a relay's operator sets (`relay_core::engine::Config`'s
/// keys; `None` keeps the engine's default). Serialized with the core's own key names, so a
/// JavaScript host splices them into the configuration it hands the core.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Engine {
    /// How long an outbound delivery attempt may take before its outcome is unknown (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<u64>,
    /// At most this many attempts in flight to one destination relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_destination: Option<u32>,
}

/// The edge host's default `max_in_flight_per_destination`: Cloudflare's six simultaneous
/// outbound connections of a Worker invocation.
pub(crate) const EDGE_MAX_IN_FLIGHT: u32 = 6;

impl Default for Settings {
    fn default() -> Settings {
        Settings::of(Host::Wasmtime)
    }
}

impl Settings {
    /// The defaults on `host`.
    pub fn of(host: Host) -> Settings {
        let data = match host {
            Host::Edge => ".relay-edge",
            Host::Wasmtime | Host::Node => ".relay",
        };
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_format: LogFormat::Text,
            url: None,
            data: Some(PathBuf::from(data)),
            network: "dev".into(),
            policies: Policies::default(),
            policy: BTreeMap::new(),
            component: None,
            engine: match host {
                // A Worker holds at most six outbound connections open at once: each attempt
                // in flight to a destination is one of them (batches carry the rest).
                Host::Edge => Engine {
                    max_in_flight_per_destination: Some(EDGE_MAX_IN_FLIGHT),
                    ..Engine::default()
                },
                Host::Wasmtime | Host::Node => Engine::default(),
            },
            limits: Limits::default(),
            tls_cert: None,
            tls_key: None,
            ca: Vec::new(),
            allow_private_peers: false,
            shards: 1,
            probe_peers: true,
        }
    }

    /// Applies a TOML configuration file over these settings (as the wasmtime host takes it).
    pub fn apply_file(&mut self, text: &str) -> Result<(), String> {
        let file: Layer = toml::from_str(text).map_err(|e| e.to_string())?;
        self.apply(Host::Wasmtime, file, From::File)
    }

    /// Applies one `--policy NAME=VALUE`.
    pub fn apply_policy(&mut self, spec: &str) -> Result<(), String> {
        let (name, value) = policy_spec(spec).map_err(|e| format!("--policy {e}"))?;
        self.set_policy(name, value)
            .map_err(|e| format!("--policy: {e}"))
    }

    /// Checks what only makes sense together: a certificate with its key, a shard count
    /// the core takes.
    pub fn check(&self) -> Result<(), String> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("--tls-cert and --tls-key go together".into());
        }
        relay_core::engine::shard::Shard::new(0, self.shards)
            .map_err(|e| format!("--shards: {e}"))?;
        Ok(())
    }

    fn set_policy(&mut self, name: String, value: u64) -> Result<(), String> {
        self.policies.set(&name, value)?;
        self.policy.insert(name, value);
        Ok(())
    }

    /// Applies one layer (the file, or the flags) over these settings.
    fn apply(&mut self, host: Host, l: Layer, from: From) -> Result<(), String> {
        if let Some(name) = l.given().into_iter().find(|n| !host.takes(n)) {
            return Err(format!(
                "{} does not take {}",
                host.name(),
                from.spell(name)
            ));
        }
        let limits = l.limits();
        if let Some(a) = l.listen {
            self.listen = address(&from.spell("listen"), &a)?;
        }
        if let Some(a) = l.admin_listen {
            self.admin_listen = address(&from.spell("admin_listen"), &a)?;
        }
        if let Some(f) = l.log_format {
            self.log_format = f;
        }
        if l.url.is_some() {
            self.url = l.url;
        }
        if let Some(d) = l.data {
            self.data = Some(PathBuf::from(d));
        }
        if l.memory {
            self.data = None;
        }
        if let Some(n) = l.network {
            self.network = n;
        }
        if let Some(c) = l.component {
            self.component = Some(PathBuf::from(c));
        }
        if l.attempt_timeout.is_some() {
            self.engine.attempt_timeout = l.attempt_timeout;
        }
        if let Some(n) = l.max_in_flight_per_destination {
            if n == 0 {
                let name = from.spell("max_in_flight_per_destination");
                return Err(format!("{name}: must be a positive integer"));
            }
            self.engine.max_in_flight_per_destination = Some(n);
        }
        for (limit, v) in LIMITS.iter().zip(limits) {
            if let Some(v) = v {
                self.limits
                    .set(limit.name, v)
                    .map_err(|e| format!("{}: {e}", from.spell(limit.name)))?;
            }
        }
        if let Some(c) = l.tls_cert {
            self.tls_cert = Some(PathBuf::from(c));
        }
        if let Some(k) = l.tls_key {
            self.tls_key = Some(PathBuf::from(k));
        }
        self.ca.extend(l.ca.into_iter().map(PathBuf::from));
        if l.allow_private_peers {
            self.allow_private_peers = true;
        }
        if let Some(n) = l.shards {
            self.shards = n;
        }
        if l.no_probe_peers {
            self.probe_peers = false;
        }
        for (k, v) in l.policy.into_iter().chain(l.policy_flags) {
            self.set_policy(k, v)
                .map_err(|e| format!("{}: {e}", from.spell("policy")))?;
        }
        Ok(())
    }
}

/// The settings a `serve` command line gives: the defaults, the `--config` file over them,
/// the flags over that.
pub(crate) fn settings(
    host: Host,
    flags: Layer,
    read: impl FnOnce(&Path) -> Result<String, String>,
) -> Result<Settings, String> {
    let mut s = Settings::of(host);
    if let Some(path) = &flags.config {
        if !host.takes("config") {
            return Err(format!("{} does not take --config", host.name()));
        }
        let text = read(Path::new(path)).map_err(|e| format!("--config {path}: {e}"))?;
        let file: Layer = toml::from_str(&text).map_err(|e| format!("--config {path}: {e}"))?;
        s.apply(host, file, From::File)?;
    }
    s.apply(host, flags, From::Flags)?;
    s.check()?;
    Ok(s)
}

/// Where a layer came from, for naming its keys in errors.
#[derive(Clone, Copy)]
enum From {
    File,
    Flags,
}

impl From {
    fn spell(self, name: &str) -> String {
        match self {
            From::File => format!("the key {name}"),
            From::Flags => format!("--{}", name.replace('_', "-")),
        }
    }
}

/// One source of settings, the flags or the TOML file: every key optional, each the flag's
/// name with `_`. The field's doc is the flag's help.
#[derive(clap::Args, Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Layer {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Public relay id (origin URL); default http:// (https:// with TLS) + the listen address.
    #[arg(long)]
    url: Option<String>,
    /// Data directory: the database, relay key and operator token [default: .relay; on
    /// workerd .relay-edge].
    #[arg(long, value_name = "DIR")]
    data: Option<String>,
    /// Keep everything in memory (nothing survives a restart).
    #[arg(long)]
    memory: bool,
    /// Network name [default: dev].
    #[arg(long)]
    network: Option<String>,
    /// A policy of protocol.md §7, NAME=VALUE (repeatable).
    #[arg(long = "policy", id = "policy", value_name = "NAME=VALUE", value_parser = policy_spec)]
    #[serde(skip)]
    policy_flags: Vec<(String, u64)>,
    /// The file's `[policy]` table.
    #[arg(skip)]
    policy: BTreeMap<String, u64>,
    /// A TOML configuration file: the flags' names with `_` as keys, a `[policy]` table
    /// (flags override it).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    config: Option<String>,
    /// The core component to run.
    #[arg(long, value_name = "FILE")]
    component: Option<String>,
    /// How long an outbound delivery attempt may take before its outcome is unknown (ms).
    #[arg(long, value_name = "MS", value_parser = milliseconds)]
    attempt_timeout: Option<u64>,
    /// At most N delivery attempts in flight to one destination relay; more wait their
    /// turn [default: 16].
    #[arg(long, value_name = "N", value_parser = positive_u32)]
    max_in_flight_per_destination: Option<u32>,
    /// The admin listener: the operator API, /metrics and health checks (default
    /// 127.0.0.1:0, loopback on a port the system picks; its URL goes to DATA/admin.url).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// Log lines as text (default) or json: one object per line, plus one line per
    /// accepted message and per ended delivery (ids only).
    #[arg(long, value_name = "text|json")]
    log_format: Option<LogFormat>,
    /// Request line and headers within MS of the connection opening (or of the next
    /// request's first byte), else the connection is closed [default: 10000].
    #[arg(long, value_name = "MS", value_parser = positive)]
    header_timeout: Option<u64>,
    /// The whole request body within MS, else 408 and close [default: 30000].
    #[arg(long, value_name = "MS", value_parser = positive)]
    body_timeout: Option<u64>,
    /// A keep-alive connection idle MS is closed [default: 60000].
    #[arg(long, value_name = "MS", value_parser = positive)]
    idle_timeout: Option<u64>,
    /// Ping every WebSocket every MS; one that sent nothing (no pong) since the last ping
    /// is closed [default: 30000].
    #[arg(long, value_name = "MS", value_parser = positive)]
    ws_ping_interval: Option<u64>,
    /// Open TCP connections at most, per listener; more are closed at accept [default: 1000].
    #[arg(long, value_name = "N", value_parser = positive)]
    max_connections: Option<u64>,
    /// Open TCP connections per peer IP address at most (public listener) [default: 64].
    #[arg(long, value_name = "N", value_parser = positive)]
    max_connections_per_ip: Option<u64>,
    /// Outbound messages queued per WebSocket; a client that does not read past it is
    /// disconnected [default: 256].
    #[arg(long, value_name = "N", value_parser = positive)]
    ws_send_queue: Option<u64>,
    /// Requests in the core or waiting for it at most; beyond it 503 unavailable with
    /// Retry-After: 1 [default: 1024].
    #[arg(long, value_name = "N", value_parser = positive)]
    max_pending: Option<u64>,
    /// Serve HTTPS and WSS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<String>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<String>,
    /// CA certificates (PEM) trusted for outbound https beside the system's roots
    /// (repeatable; in the file, one or a list).
    #[arg(long, value_name = "FILE")]
    #[serde(deserialize_with = "one_or_many")]
    ca: Vec<String>,
    /// Off the dev network, connect to loopback, private, link-local, CGNAT and other
    /// non-public peer addresses too (private deployments).
    #[arg(long)]
    allow_private_peers: bool,
    /// Shard accounts over N cores, each with storage of its own (default 1; fixed at the
    /// data's first start).
    #[arg(long, value_name = "N", value_parser = positive_u32)]
    shards: Option<u32>,
    /// Do not probe a peer with a bare connect before each fetch (every failure then
    /// counts as an unknown outcome; deployed Workers cannot open such sockets).
    #[arg(long)]
    #[serde(skip)]
    no_probe_peers: bool,
}

impl Layer {
    /// The limits given, in the order of the core's table.
    fn limits(&self) -> [Option<u64>; 8] {
        [
            self.header_timeout,
            self.body_timeout,
            self.idle_timeout,
            self.ws_ping_interval,
            self.max_connections,
            self.max_connections_per_ip,
            self.ws_send_queue,
            self.max_pending,
        ]
    }

    /// The names of the settings this layer gives that not every host takes.
    fn given(&self) -> Vec<&'static str> {
        let mut given: Vec<&'static str> = [
            ("memory", self.memory),
            ("config", self.config.is_some()),
            ("component", self.component.is_some()),
            ("log_format", self.log_format.is_some()),
            ("tls_cert", self.tls_cert.is_some()),
            ("tls_key", self.tls_key.is_some()),
            ("ca", !self.ca.is_empty()),
            ("shards", self.shards.is_some()),
            ("no_probe_peers", self.no_probe_peers),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        given.extend(
            LIMITS
                .iter()
                .zip(self.limits())
                .filter_map(|(l, v)| v.map(|_| l.name)),
        );
        given
    }
}

fn address(name: &str, v: &str) -> Result<SocketAddr, String> {
    v.parse()
        .map_err(|_| format!("{name}: an address is HOST:PORT (an IP address and a port), not {v}"))
}

fn positive(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("takes a positive integer, not {v}")),
    }
}

fn positive_u32(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("takes a positive integer, not {v}")),
    }
}

fn milliseconds(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("takes milliseconds (an integer), not {v}"))
}

fn policy_spec(spec: &str) -> Result<(String, u64), String> {
    match spec.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => match v.trim().parse() {
            Ok(v) => Ok((k.trim().to_string(), v)),
            Err(_) => Err(format!("takes NAME=INTEGER, not {spec}")),
        },
        _ => Err(format!("takes NAME=INTEGER, not {spec}")),
    }
}

/// A TOML value that is one string or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

fn display<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// The limits as an object of camelCase names, in the core table's order.
fn limits_in_order<S: Serializer>(limits: &Limits, s: S) -> Result<S::Ok, S::Error> {
    let camel = |name: &str| {
        let mut out = String::new();
        let mut upper = false;
        for c in name.chars() {
            match c {
                '_' => upper = true,
                c if upper => {
                    out.extend(c.to_uppercase());
                    upper = false;
                }
                c => out.push(c),
            }
        }
        out
    };
    s.collect_map(
        LIMITS
            .iter()
            .map(|l| (camel(l.name), limits.get(l.name).unwrap_or(l.default))),
    )
}
