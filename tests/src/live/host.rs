//! Real relay processes: the wasmtime host (`target/release/relay`) and the Node host
//! (`host-node/bin/relay-node.js`), each on a loopback port over its own SQLite data,
//! started, killed (SIGKILL) and restarted by the suite.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Which host runs a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Wasmtime,
    Node,
}

impl Kind {
    /// Both hosts.
    pub const ALL: [Kind; 2] = [Kind::Wasmtime, Kind::Node];

    /// Every ordered pair (source, destination): the same host and both mixed pairs.
    pub const PAIRS: [(Kind, Kind); 4] = [
        (Kind::Wasmtime, Kind::Wasmtime),
        (Kind::Node, Kind::Node),
        (Kind::Wasmtime, Kind::Node),
        (Kind::Node, Kind::Wasmtime),
    ];

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Wasmtime => "wasmtime",
            Kind::Node => "node",
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
}

impl Default for Opts {
    /// Fast retries and a short attempt timeout, so faults resolve in seconds.
    fn default() -> Opts {
        Opts {
            policies: vec![("retry_initial", 100), ("retry_max", 400)],
            attempt_timeout: 1500,
            url: None,
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

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
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
    dir
}

impl Relay {
    /// Starts a relay of `kind` and waits until it answers `/.well-known/relay`.
    pub fn start(kind: Kind, opts: Opts) -> Relay {
        let mut r = Relay {
            kind,
            port: free_port(),
            data: fresh_dir(kind),
            opts,
            child: None,
        };
        r.spawn();
        r
    }

    /// Where clients reach it (always direct, never through a proxy).
    pub fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("the {} relay exited at start: {status}", self.kind.name());
                }
            }
            if let Ok(r) = ureq::get(&url).call() {
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
