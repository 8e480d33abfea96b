//! Real relay processes: the wasmtime host (`target/release/relay`), the Node host
//! (`host-node/bin/relay-node.js`) and the edge host (`host-edge/bin/relay-edge`: workerd,
//! one Durable Object per shard), each on a loopback port over its own SQLite data,
//! started, killed (SIGKILL) and restarted by the suite.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Which host runs a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Wasmtime,
    Node,
    Edge,
}

impl Kind {
    /// Every host.
    pub const ALL: [Kind; 3] = [Kind::Wasmtime, Kind::Node, Kind::Edge];

    /// Every ordered pair (source, destination): each host with itself and every mixed pair.
    pub const PAIRS: [(Kind, Kind); 9] = [
        (Kind::Wasmtime, Kind::Wasmtime),
        (Kind::Node, Kind::Node),
        (Kind::Wasmtime, Kind::Node),
        (Kind::Node, Kind::Wasmtime),
        (Kind::Edge, Kind::Edge),
        (Kind::Edge, Kind::Wasmtime),
        (Kind::Edge, Kind::Node),
        (Kind::Wasmtime, Kind::Edge),
        (Kind::Node, Kind::Edge),
    ];

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Wasmtime => "wasmtime",
            Kind::Node => "node",
            Kind::Edge => "edge",
        }
    }
}

/// How a relay is started: its policies and engine tunables.
#[derive(Clone, Debug)]
pub struct Opts {
    /// `--policy NAME=VALUE` pairs (protocol.md §7).
    pub policies: Vec<(&'static str, u64)>,
    /// `--attempt-timeout` (ms).
    pub attempt_timeout: u64,
    /// The public relay id, when it differs from the listen address (a proxy in front).
    pub url: Option<String>,
    /// `--network NAME` (the hosts' default, `dev`, when `None`).
    pub network: Option<String>,
    /// Further flags, passed as given (issue 18's limits: `--header-timeout 500`,
    /// `--max-connections 20`, `--allow-private-peers`, ...).
    pub flags: Vec<String>,
    /// `--ca FILE`: an extra trusted root (PEM) for outbound https; with `tls`, the
    /// harness's own clients trust it too.
    pub ca: Option<PathBuf>,
    /// `--tls-cert FILE --tls-key FILE`: serve HTTPS and WSS; clients reach the relay at
    /// `https://127.0.0.1:PORT` (the certificate names 127.0.0.1), trusting `ca`.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for Opts {
    /// Fast retries and a short attempt timeout, so faults resolve in seconds.
    fn default() -> Opts {
        Opts {
            policies: vec![("retry_initial", 100), ("retry_max", 400)],
            attempt_timeout: 1500,
            url: None,
            network: None,
            flags: Vec::new(),
            ca: None,
            tls: None,
        }
    }
}

impl Opts {
    /// Sets (or replaces) one policy.
    pub fn policy(mut self, name: &'static str, value: u64) -> Opts {
        self.policies.retain(|(n, _)| *n != name);
        self.policies.push((name, value));
        self
    }

    /// Adds `--name value` (or a bare `--name` when `value` is empty).
    pub fn flag(mut self, name: &str, value: impl ToString) -> Opts {
        self.flags.push(format!("--{name}"));
        let v = value.to_string();
        if !v.is_empty() {
            self.flags.push(v);
        }
        self
    }
}

/// The harness's HTTP agent for a relay started with `opts`: plain, or trusting
/// `opts.ca` when the relay serves TLS.
pub fn agent_for(opts: &Opts, timeout: Duration) -> ureq::Agent {
    let mut b = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout));
    if opts.tls.is_some() {
        let ca = opts
            .ca
            .as_deref()
            .expect("a TLS relay needs Opts::ca for its clients");
        b = b.tls_config(tls_trusting(ca));
    }
    b.build().into()
}

/// ureq's TLS settings trusting only the PEM roots in `ca`.
pub fn tls_trusting(ca: &Path) -> ureq::tls::TlsConfig {
    let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
    let roots: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    assert!(!roots.is_empty(), "{}: no certificate", ca.display());
    ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(roots)))
        .build()
}

/// A relay process with its data directory; dropped, it is killed and its data removed.
pub struct Relay {
    pub kind: Kind,
    pub port: u16,
    pub data: PathBuf,
    pub opts: Opts,
    child: Option<Child>,
}

/// The workspace root (the suite runs from `tests/`).
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// A loopback port nobody listens on right now, and one the system will not hand out
/// meanwhile: it is below the range the system picks from for port 0 and for outgoing
/// connections. A port from that range could be taken by another test's connection
/// between this check and the relay's bind (a workerd relay lost that race). Successive
/// calls walk the ports from a start that differs per process, so no two tests here pick
/// the same one.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (first, span) = (
        lo.saturating_sub(12288).max(1024),
        12288.min(lo.saturating_sub(1024)),
    );
    if span > 0 {
        let start = std::process::id().wrapping_mul(7919) % span;
        for _ in 0..256 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (first + (start + n) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn fresh_dir(kind: Kind) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "relay-conformance-{}-{}-{}",
        std::process::id(),
        kind.name(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("data directory");
    // As a relay creates its own (issue 18): its owner's only.
    let _ = std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    dir
}

impl Relay {
    /// Starts a relay of `kind` and waits until it answers `/.well-known/relay`.
    pub fn start(kind: Kind, opts: Opts) -> Relay {
        Relay::start_at(kind, free_port(), opts)
    }

    /// [`Relay::start`] on a port chosen by the caller (whose relay id names it).
    pub fn start_at(kind: Kind, port: u16, opts: Opts) -> Relay {
        let mut r = Relay {
            kind,
            port,
            data: fresh_dir(kind),
            opts,
            child: None,
        };
        r.spawn();
        r
    }

    /// Where clients reach it (always direct, never through a proxy).
    pub fn api(&self) -> String {
        if self.opts.tls.is_some() {
            format!("https://127.0.0.1:{}", self.port)
        } else {
            format!("http://127.0.0.1:{}", self.port)
        }
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process has exited (its status), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Its relay id (the proxy in front of it, if any).
    pub fn id(&self) -> String {
        self.opts.url.clone().unwrap_or_else(|| self.api())
    }

    /// Where its admin listener is (the operator API, `/metrics`, health checks): the URL
    /// the relay wrote to `admin.url` in its data directory. A relay that writes none
    /// serves the admin API on its public port, so that is the fallback.
    pub fn admin_api(&self) -> String {
        match std::fs::read_to_string(self.data.join("admin.url")) {
            Ok(url) if !url.trim().is_empty() => url.trim().trim_end_matches('/').to_string(),
            _ => self.api(),
        }
    }

    /// Its shard count: `--shards N` among its flags, else `RELAY_SHARDS` for the hosts
    /// that shard (as the command line it runs with is made), else 1.
    pub fn shards(&self) -> u32 {
        let flag = self
            .opts
            .flags
            .iter()
            .position(|f| f == "--shards")
            .and_then(|i| self.opts.flags.get(i + 1))
            .and_then(|n| n.parse().ok());
        let env = matches!(self.kind, Kind::Wasmtime | Kind::Edge)
            .then(|| std::env::var("RELAY_SHARDS").ok()?.parse().ok())
            .flatten();
        flag.or(env).unwrap_or(1)
    }

    /// Runs the operator's command line, `relayctl admin --data DATA --shard K ARGS`
    /// (which reaches a relay of any host through the admin.url and admin.token it
    /// wrote): whether it succeeded, and what it printed.
    pub fn relayctl(&self, shard: u32, args: &[&str]) -> (bool, String) {
        let bin = target_dir().join("release/relayctl");
        assert!(
            bin.exists(),
            "{} is missing: build it with `./x test` (or `cargo build --release -p relay-cli`)",
            bin.display()
        );
        let out = Command::new(&bin)
            .arg("admin")
            .arg("--data")
            .arg(&self.data)
            .arg("--shard")
            .arg(shard.to_string())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// The operator token it keeps in its data directory.
    pub fn admin_token(&self) -> String {
        // Both hosts keep the token's bytes as base64url text; the bearer is that text.
        let raw = std::fs::read(self.data.join("admin.token")).expect("admin.token");
        String::from_utf8_lossy(&raw).trim().to_string()
    }

    fn command(&self) -> Command {
        let mut c = match self.kind {
            Kind::Wasmtime => {
                let bin = target_dir().join("release/relay");
                assert!(
                    bin.exists(),
                    "{} is missing: build it with `./x test` (or `cargo build --release -p relay-host-wasmtime`)",
                    bin.display()
                );
                let mut c = Command::new(bin);
                c.arg("serve")
                    .arg("--component")
                    .arg(target_dir().join("component/relay_core.wasm"));
                c
            }
            Kind::Node => {
                let cli = workspace().join("host-node/bin/relay-node.js");
                assert!(
                    workspace().join("host-node/pkg/relay_wasm.js").exists(),
                    "host-node/pkg is missing: build it with `./x test` (xtask bindgen)"
                );
                let mut c = Command::new("node");
                c.arg(cli).arg("serve");
                c
            }
            Kind::Edge => {
                // A shell script that writes workerd's config and then becomes workerd (exec):
                // the child is the relay, so `kill` is a SIGKILL of workerd itself.
                for (file, how) in [
                    ("host-node/pkg/web/relay_wasm.js", "xtask bindgen-edge"),
                    ("host-edge/node_modules/workerd", "npm ci in host-edge"),
                ] {
                    assert!(
                        workspace().join(file).exists(),
                        "{file} is missing: build it with `./x test` ({how})"
                    );
                }
                let mut c = Command::new(workspace().join("host-edge/bin/relay-edge"));
                c.arg("serve");
                c
            }
        };
        c.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--url")
            .arg(self.id())
            .arg("--data")
            .arg(&self.data)
            .arg("--attempt-timeout")
            .arg(self.opts.attempt_timeout.to_string());
        for (k, v) in &self.opts.policies {
            c.arg("--policy").arg(format!("{k}={v}"));
        }
        if let Some(n) = &self.opts.network {
            c.arg("--network").arg(n);
        }
        if let Some(ca) = &self.opts.ca {
            c.arg("--ca").arg(ca);
        }
        if let Some((cert, key)) = &self.opts.tls {
            c.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        c.args(&self.opts.flags);
        // RELAY_SHARDS=N runs the hosts that shard (wasmtime, edge) with `--shards N`, so the
        // suite can be run again over sharded relays.
        if let Ok(n) = std::env::var("RELAY_SHARDS") {
            if matches!(self.kind, Kind::Wasmtime | Kind::Edge)
                && !self.opts.flags.iter().any(|f| f == "--shards")
            {
                c.arg("--shards").arg(n);
            }
        }
        c.env("RELAY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        c
    }

    fn spawn(&mut self) {
        let child = self.command().spawn().unwrap_or_else(|e| {
            panic!("starting the {} relay: {e}", self.kind.name());
        });
        self.child = Some(child);
        self.wait_up();
    }

    fn wait_up(&mut self) {
        let started = Instant::now();
        let url = format!("{}/.well-known/relay", self.api());
        let agent = agent_for(&self.opts, Duration::from_secs(5));
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("the {} relay exited at start: {status}", self.kind.name());
                }
            }
            if let Ok(r) = agent.get(&url).header("connection", "close").call() {
                if r.status() == 200 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the {} relay at {} did not come up",
            self.kind.name(),
            self.api()
        );
    }

    /// Kills the process outright (SIGKILL): no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it (again, on the same port and data) expecting the start to fail: waits up
    /// to `within` for the process to exit and gives its status and what it wrote to
    /// stderr. Panics if it is still running then (it is killed first) or came up.
    pub fn start_expecting_failure(&mut self, within: Duration) -> (ExitStatus, String) {
        self.kill();
        let mut cmd = self.command();
        cmd.stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("starting the {} relay: {e}", self.kind.name());
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            s
        });
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = reader.join().unwrap_or_default();
                return (status, text);
            }
            if started.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                let text = reader.join().unwrap_or_default();
                panic!(
                    "the {} relay was still running {within:?} after a start that had to fail; stderr:\n{text}",
                    self.kind.name()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is running.
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
