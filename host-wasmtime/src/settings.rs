//! How a relay is configured: flags, an optional TOML file, and defaults.

use relay_core::engine::Policies;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
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

/// The transport limits: the core's one table of their names and defaults.
pub use relay_core::transport::limits::{Limits, LIMITS};

/// Everything needed to start a relay.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    /// The admin listener (`/admin/v1/*`, `/metrics`, health): loopback by default, port
    /// chosen by the system; its URL is written to `DATA/admin.url`.
    pub admin_listen: SocketAddr,
    pub log_format: LogFormat,
    /// The public relay id; default `http://` + the listen address.
    pub url: Option<String>,
    /// Data directory (SQLite database, relay key); `None` keeps everything in memory.
    pub data: Option<PathBuf>,
    pub network: String,
    pub policies: Policies,
    /// The core component; default: next to the binary, then `target/component/`.
    pub component: Option<PathBuf>,
    /// Engine tunables.
    pub attempt_timeout: Option<u64>,
    pub max_in_flight_per_destination: Option<u32>,
    /// Timeouts, connection caps and queue bounds of the transports.
    pub limits: Limits,
    /// Serve HTTPS and WSS on the public listener with this certificate chain (PEM) ...
    pub tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM files) trusted for outbound https beside the system's roots.
    pub ca: Vec<PathBuf>,
    /// Off `dev`, connect to loopback, private, link-local and other non-public peer addresses too.
    pub allow_private_peers: bool,
    /// Accounts sharded over this many cores, each on a thread of its own with a SQLite
    /// file of its own (fixed at the data's first start; the core refuses another count).
    pub shards: u32,
    /// Storage faults and traps on request (tests of the timer's recovery).
    #[doc(hidden)]
    pub faults: Option<std::sync::Arc<crate::store::Faults>>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_format: LogFormat::Text,
            url: None,
            data: Some(PathBuf::from(".relay")),
            network: "dev".into(),
            policies: Policies::default(),
            component: None,
            attempt_timeout: None,
            max_in_flight_per_destination: None,
            limits: Limits::default(),
            tls_cert: None,
            tls_key: None,
            ca: Vec::new(),
            allow_private_peers: false,
            shards: 1,
            faults: None,
        }
    }
}

/// The TOML file's shape (every key optional; flags override it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub log_format: Option<LogFormat>,
    pub url: Option<String>,
    pub data: Option<String>,
    pub network: Option<String>,
    pub component: Option<String>,
    pub memory: Option<bool>,
    /// How long an outbound delivery attempt may take before its outcome is unknown (ms).
    pub attempt_timeout: Option<u64>,
    pub header_timeout: Option<u64>,
    pub body_timeout: Option<u64>,
    pub idle_timeout: Option<u64>,
    pub ws_ping_interval: Option<u64>,
    pub max_connections: Option<u64>,
    pub max_connections_per_ip: Option<u64>,
    pub ws_send_queue: Option<u64>,
    pub max_pending: Option<u64>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    /// One PEM file or a list of them.
    pub ca: Option<OneOrMany>,
    pub allow_private_peers: Option<bool>,
    /// Cores the accounts are sharded over (fixed at the data's first start).
    pub shards: Option<u32>,
    #[serde(default)]
    pub policy: BTreeMap<String, u64>,
}

/// A TOML value that is one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Settings {
    /// Applies a TOML configuration file.
    pub fn apply_file(&mut self, text: &str) -> anyhow::Result<()> {
        let f: FileSettings = toml::from_str(text)?;
        if let Some(l) = f.listen {
            self.listen = l.parse()?;
        }
        if let Some(l) = f.admin_listen {
            self.admin_listen = l
                .parse()
                .map_err(|e| anyhow::anyhow!("admin_listen {l}: {e}"))?;
        }
        if let Some(f) = f.log_format {
            self.log_format = f;
        }
        if f.url.is_some() {
            self.url = f.url;
        }
        if let Some(d) = f.data {
            self.data = Some(PathBuf::from(d));
        }
        if f.memory == Some(true) {
            self.data = None;
        }
        if f.attempt_timeout.is_some() {
            self.attempt_timeout = f.attempt_timeout;
        }
        if let Some(n) = f.network {
            self.network = n;
        }
        if let Some(c) = f.component {
            self.component = Some(PathBuf::from(c));
        }
        for (name, v) in LIMITS.map(|l| l.name).iter().zip([
            f.header_timeout,
            f.body_timeout,
            f.idle_timeout,
            f.ws_ping_interval,
            f.max_connections,
            f.max_connections_per_ip,
            f.ws_send_queue,
            f.max_pending,
        ]) {
            if let Some(v) = v {
                self.limits.set(name, v).map_err(anyhow::Error::msg)?;
            }
        }
        if let Some(c) = f.tls_cert {
            self.tls_cert = Some(PathBuf::from(c));
        }
        if let Some(k) = f.tls_key {
            self.tls_key = Some(PathBuf::from(k));
        }
        match f.ca {
            Some(OneOrMany::One(c)) => self.ca.push(PathBuf::from(c)),
            Some(OneOrMany::Many(cs)) => self.ca.extend(cs.into_iter().map(PathBuf::from)),
            None => {}
        }
        if let Some(a) = f.allow_private_peers {
            self.allow_private_peers = a;
        }
        if let Some(n) = f.shards {
            self.shards = n;
        }
        for (k, v) in f.policy {
            self.policies.set(&k, v).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    /// Checks what only makes sense together: a certificate with its key.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.tls_cert.is_some() == self.tls_key.is_some(),
            "--tls-cert and --tls-key go together"
        );
        relay_core::engine::shard::Shard::new(0, self.shards)
            .map_err(|e| anyhow::anyhow!("--shards: {e}"))?;
        Ok(())
    }

    /// Applies one `--policy NAME=VALUE`.
    pub fn apply_policy(&mut self, spec: &str) -> anyhow::Result<()> {
        let (k, v) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--policy takes NAME=VALUE"))?;
        let v: u64 = v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("--policy {k}: value must be an integer"))?;
        self.policies.set(k.trim(), v).map_err(anyhow::Error::msg)
    }

    /// The component to load.
    pub fn component_path(&self) -> PathBuf {
        if let Some(p) = &self.component {
            return p.clone();
        }
        if let Ok(p) = std::env::var("RELAY_COMPONENT") {
            return PathBuf::from(p);
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("../component/relay_core.wasm")));
        match beside {
            Some(p) if p.exists() => p,
            _ => PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/component/relay_core.wasm"
            )),
        }
    }
}
