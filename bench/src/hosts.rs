//! The hosts as child processes serving loopback HTTP.

use relay_host_wasmtime::admin_client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Policies every benchmarked relay runs with: no rate limits.
const POLICIES: &[&str] = &[
    "send_rate=0",
    "deliver_rate=0",
    "deliver_rate_per_account=0",
    "deliver_rate_per_sender=0",
    "account_request_rate=0",
    "anonymous_rate=0",
];

/// A host process serving `url`.
pub struct Host {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Host {
    /// Starts `program args... --listen --data --policy...` and waits until it answers.
    async fn start(cmd: Command, dir: &Path) -> anyhow::Result<Host> {
        // Every load generator's connection comes from 127.0.0.1: the per-address cap
        // (64 by default) would refuse the c=128 rows.
        Host::start_with(cmd, dir, &["--max-connections-per-ip", "4096"]).await
    }

    /// [`Host::start`] with these flags after the common ones.
    async fn start_with(mut cmd: Command, dir: &Path, flags: &[&str]) -> anyhow::Result<Host> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--data"])
            .arg(dir);
        for p in POLICIES {
            cmd.args(["--policy", p]);
        }
        cmd.args(flags);
        let child = cmd
            .env("RELAY_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("{cmd:?}: {e}"))?;
        let host = Host {
            child,
            url,
            dir: dir.to_path_buf(),
        };
        let http = admin_client();
        for _ in 0..400 {
            if let Ok((200, _)) = http.get(&format!("{}/.well-known/relay", host.url)).await {
                return Ok(host);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        anyhow::bail!("{cmd:?} did not start serving")
    }

    /// The wasmtime host: `target/release/relay serve`.
    pub async fn wasmtime(exe: &Path, dir: &Path) -> anyhow::Result<Host> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve");
        Host::start(cmd, dir).await
    }

    /// The wasmtime host with these flags besides the common ones.
    pub async fn wasmtime_with(exe: &Path, dir: &Path, flags: &[&str]) -> anyhow::Result<Host> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve");
        let mut all = vec!["--max-connections-per-ip", "4096"];
        all.extend_from_slice(flags);
        Host::start_with(cmd, dir, &all).await
    }

    /// The Node host with these flags besides the common ones.
    pub async fn node_with(root: &Path, dir: &Path, flags: &[&str]) -> anyhow::Result<Host> {
        let mut cmd = Command::new("node");
        cmd.arg(root.join("host-node/bin/relay-node.js"))
            .arg("serve");
        let mut all = vec!["--max-connections-per-ip", "4096"];
        all.extend_from_slice(flags);
        Host::start_with(cmd, dir, &all).await
    }

    /// The edge host of one Durable Object with these flags besides the common ones.
    pub async fn edge_with(root: &Path, dir: &Path, flags: &[&str]) -> anyhow::Result<Host> {
        let mut cmd = Command::new(root.join("host-edge/bin/relay-edge"));
        cmd.arg("serve");
        Host::start_with(cmd, dir, flags).await
    }

    /// The wasmtime host with its accounts sharded over `shards` cores.
    pub async fn wasmtime_sharded(exe: &Path, dir: &Path, shards: u32) -> anyhow::Result<Host> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve").args(["--shards", &shards.to_string()]);
        Host::start(cmd, dir).await
    }

    /// The edge host on workerd (`host-edge/bin/relay-edge serve`), with `shards` Durable
    /// Objects. workerd has no per-address connection cap to lift.
    pub async fn edge(root: &Path, dir: &Path, shards: u32) -> anyhow::Result<Host> {
        let mut cmd = Command::new(root.join("host-edge/bin/relay-edge"));
        cmd.arg("serve").args(["--shards", &shards.to_string()]);
        Host::start_with(cmd, dir, &[]).await
    }

    /// The data directory (its `admin.url` and `admin.token` reach the operator API).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The Node host: `node host-node/bin/relay-node.js serve`.
    pub async fn node(root: &Path, dir: &Path) -> anyhow::Result<Host> {
        let mut cmd = Command::new("node");
        cmd.arg(root.join("host-node/bin/relay-node.js"))
            .arg("serve");
        Host::start(cmd, dir).await
    }

    /// The anonymous resident memory of the host process, in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        crate::inproc::anon_kib(&self.child.id().to_string())
    }

    /// Stops the process as an operator would (SIGTERM: in-flight requests finish, profilers
    /// such as `node --cpu-prof` write their output), killing it after 10 s; removes its data.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..400 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
