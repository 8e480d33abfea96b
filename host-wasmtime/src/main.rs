//! `relay`: a relay server running the core component in wasmtime.

use clap::{Parser, Subcommand};
use relay_host_wasmtime::settings::{LogFormat, Settings};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "relay",
    version,
    about = "A relay server: the relay core component in wasmtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a relay (HTTP, WebSocket and relay RPC on one port; the admin API, metrics
    /// and health checks on the admin listener).
    Serve(Box<ServeArgs>),
    /// Operator tools against a running relay, through its admin listener.
    Admin(AdminArgs),
}

#[derive(clap::Args)]
struct AdminArgs {
    /// The relay's data directory: holds admin.token, and admin.url (the admin listener's
    /// address, written by the running relay).
    #[arg(long, global = true, default_value = ".relay")]
    data: PathBuf,
    /// The admin listener's URL, instead of the one in DATA/admin.url.
    #[arg(long, global = true)]
    url: Option<String>,
    /// On a relay started with --shards: the shard asked (deliveries and backups are per
    /// shard; shard k's database is relay-shard-k.sqlite, shard 0's relay.sqlite).
    #[arg(long, global = true, default_value_t = 0)]
    shard: u32,
    #[command(subcommand)]
    what: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// List deliveries this relay is responsible for (and quarantined tick entries).
    Deliveries {
        /// pending or failed (default: both).
        state: Option<String>,
    },
    /// Copy the running relay's database to FILE, consistently, without stopping it.
    ///
    /// The relay writes the copy itself (SQLite's online backup over its own connection,
    /// between two commit groups), so FILE holds exactly the operations committed before
    /// the backup began. FILE is written whole with mode 0600 and replaces any file there;
    /// it is a path on the relay's machine.
    ///
    /// To restore: stop the relay; make a new data directory holding FILE as relay.sqlite
    /// and the original relay.key (and admin.token, to keep the operator token); start the
    /// relay on it with the same --url. Deliveries pending in the backup resume. Messages
    /// accepted after the backup began are not in it: clients retry them unchanged, and
    /// the protocol's idempotency makes the retry safe.
    Backup {
        /// Where to write the copy.
        file: PathBuf,
    },
    /// Print the relay's metrics (the Prometheus text of GET /metrics).
    Metrics,
}
#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long)]
    listen: Option<String>,
    /// Public relay id (origin URL); default http:// + the listen address.
    #[arg(long)]
    url: Option<String>,
    /// Data directory: SQLite database and relay key.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Keep everything in memory (nothing survives a restart).
    #[arg(long)]
    memory: bool,
    /// Network name.
    #[arg(long)]
    network: Option<String>,
    /// A policy of protocol.md §7, NAME=VALUE (repeatable).
    #[arg(long = "policy")]
    policies: Vec<String>,
    /// A TOML configuration file (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The core component to run.
    #[arg(long)]
    component: Option<PathBuf>,
    /// How long an outbound delivery attempt may take before its outcome is unknown (ms).
    #[arg(long)]
    attempt_timeout: Option<u64>,
    /// The admin listener: the operator API, /metrics and health checks (default
    /// 127.0.0.1:0, loopback on a port the system picks; its URL goes to DATA/admin.url).
    #[arg(long)]
    admin_listen: Option<String>,
    /// Log lines as text (default) or json: one object per line, plus one line per
    /// accepted message and per ended delivery (ids only).
    #[arg(long)]
    log_format: Option<LogFormat>,
    /// Request line and headers within MS of the connection opening (or of the next
    /// request's first byte), else the connection is closed [default: 10000].
    #[arg(long, value_name = "MS")]
    header_timeout: Option<u64>,
    /// The whole request body within MS, else 408 and close [default: 30000].
    #[arg(long, value_name = "MS")]
    body_timeout: Option<u64>,
    /// A keep-alive connection idle MS is closed [default: 60000].
    #[arg(long, value_name = "MS")]
    idle_timeout: Option<u64>,
    /// Ping every WebSocket every MS; one that sent nothing (no pong) since the last ping
    /// is closed [default: 30000].
    #[arg(long, value_name = "MS")]
    ws_ping_interval: Option<u64>,
    /// Open TCP connections at most, per listener; more are closed at accept [default: 1000].
    #[arg(long, value_name = "N")]
    max_connections: Option<u64>,
    /// Open TCP connections per peer IP address at most (public listener) [default: 64].
    #[arg(long, value_name = "N")]
    max_connections_per_ip: Option<u64>,
    /// Outbound messages queued per WebSocket; a client that does not read past it is
    /// disconnected [default: 256].
    #[arg(long, value_name = "N")]
    ws_send_queue: Option<u64>,
    /// Requests in the core or waiting for it at most; beyond it 503 unavailable with
    /// Retry-After: 1 [default: 1024].
    #[arg(long, value_name = "N")]
    max_pending: Option<u64>,
    /// Serve HTTPS and WSS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA certificates (PEM) trusted for outbound https beside the system's roots (repeatable).
    #[arg(long, value_name = "FILE")]
    ca: Vec<PathBuf>,
    /// Off the dev network, connect to loopback, private, link-local, CGNAT and other
    /// non-public peer addresses too (private deployments).
    #[arg(long)]
    allow_private_peers: bool,
    /// Shard accounts over N cores, each on a thread with a SQLite file of its own
    /// (default 1; fixed at the data's first start).
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
}

fn settings(a: ServeArgs) -> anyhow::Result<Settings> {
    let mut s = Settings::default();
    if let Some(c) = &a.config {
        let text =
            std::fs::read_to_string(c).map_err(|e| anyhow::anyhow!("{}: {e}", c.display()))?;
        s.apply_file(&text)?;
    }
    if let Some(l) = a.listen {
        s.listen = l
            .parse()
            .map_err(|e| anyhow::anyhow!("--listen {l}: {e}"))?;
    }
    if let Some(l) = a.admin_listen {
        s.admin_listen = l
            .parse()
            .map_err(|e| anyhow::anyhow!("--admin-listen {l}: {e}"))?;
    }
    if let Some(f) = a.log_format {
        s.log_format = f;
    }
    if a.url.is_some() {
        s.url = a.url;
    }
    if let Some(d) = a.data {
        s.data = Some(d);
    }
    if a.memory {
        s.data = None;
    }
    if let Some(n) = a.network {
        s.network = n;
    }
    if a.component.is_some() {
        s.component = a.component;
    }
    if a.attempt_timeout.is_some() {
        s.attempt_timeout = a.attempt_timeout;
    }
    if let Some(n) = a.shards {
        s.shards = n;
    }
    for p in &a.policies {
        s.apply_policy(p)?;
    }
    let names = relay_host_wasmtime::settings::LIMITS.map(|l| l.name);
    for (name, v) in names.iter().zip([
        a.header_timeout,
        a.body_timeout,
        a.idle_timeout,
        a.ws_ping_interval,
        a.max_connections,
        a.max_connections_per_ip,
        a.ws_send_queue,
        a.max_pending,
    ]) {
        if let Some(v) = v {
            s.limits
                .set(name, v)
                .map_err(|e| anyhow::anyhow!("--{}: {e}", name.replace('_', "-")))?;
        }
    }
    if a.tls_cert.is_some() {
        s.tls_cert = a.tls_cert;
    }
    if a.tls_key.is_some() {
        s.tls_key = a.tls_key;
    }
    s.ca.extend(a.ca);
    if a.allow_private_peers {
        s.allow_private_peers = true;
    }
    s.check()?;
    Ok(s)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn init_logs(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("RELAY_LOG").unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        // Fields at the top level: {"timestamp","level","event":"accepted","message_id",..,"target"}.
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// The admin listener's URL: `--url`, else what the running relay wrote to DATA/admin.url.
fn admin_url(data: &Path, url: Option<String>) -> anyhow::Result<String> {
    if let Some(u) = url {
        return Ok(u.trim_end_matches('/').to_string());
    }
    let file = data.join("admin.url");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (is a relay running on this data directory? or pass --url)",
            file.display()
        )
    })?;
    Ok(text.trim().trim_end_matches('/').to_string())
}

async fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let url = admin_url(&args.data, args.url)?;
    let client = relay_host_wasmtime::admin_client();
    if let AdminCommand::Metrics = args.what {
        let (status, text) = client.get(&format!("{url}/metrics")).await?;
        print!("{}", String::from_utf8_lossy(&text));
        anyhow::ensure!(status == 200, "status {status}");
        return Ok(());
    }
    let token_file = args.data.join("admin.token");
    let token = std::fs::read_to_string(&token_file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", token_file.display()))?;
    let mut params = relay_core::wire::json::Object::new();
    let method = match args.what {
        AdminCommand::Deliveries { state } => {
            if let Some(s) = state {
                params.insert("state", s.as_str());
            }
            "deliveries"
        }
        AdminCommand::Backup { file } => {
            // The relay writes the file: name it absolutely, from here.
            let file = if file.is_absolute() {
                file
            } else {
                std::env::current_dir()?.join(file)
            };
            params.insert("path", file.display().to_string());
            "backup"
        }
        AdminCommand::Metrics => unreachable!("answered above"),
    };
    let body = relay_core::wire::canonical::object_to_vec(&params);
    let auth = format!("Bearer {}", token.trim());
    let (status, text) = client
        .post(
            &format!("{url}/admin/v1/{method}?shard={}", args.shard),
            &[("authorization", &auth)],
            body,
        )
        .await?;
    println!("{}", String::from_utf8_lossy(&text));
    anyhow::ensure!(status == 200, "status {status}");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(a) => {
            let settings = settings(*a)?;
            init_logs(settings.log_format);
            let running = relay_host_wasmtime::start(settings).await?;
            println!(
                "relay listening on {} as {}; admin on {}",
                running.addr, running.url, running.admin_url
            );
            shutdown_signal().await;
            tracing::info!("shutting down: finishing in-flight requests");
            running.stop().await;
            Ok(())
        }
        Command::Admin(a) => {
            init_logs(LogFormat::Text);
            admin(a).await
        }
    }
}
