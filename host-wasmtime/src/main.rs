//! `relay`: a relay server running the core component in wasmtime.

use clap::{Parser, Subcommand};
use relay_host_wasmtime::settings::Settings;
use std::path::PathBuf;

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
    /// Serve a relay (HTTP, WebSocket and relay RPC on one port).
    Serve(ServeArgs),
    /// Operator tools against a running relay.
    Admin {
        /// The relay's data directory (holds admin.token).
        #[arg(long, default_value = ".relay")]
        data: PathBuf,
        /// The relay's URL.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// `deliveries [pending|failed]`
        #[arg(trailing_var_arg = true)]
        what: Vec<String>,
    },
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
    for p in &a.policies {
        s.apply_policy(p)?;
    }
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RELAY_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Serve(a) => {
            let running = relay_host_wasmtime::start(settings(a)?).await?;
            println!("relay listening on {} as {}", running.addr, running.url);
            shutdown_signal().await;
            tracing::info!("shutting down: finishing in-flight requests");
            running.stop().await;
            Ok(())
        }
        Command::Admin { data, url, what } => {
            let token = std::fs::read_to_string(data.join("admin.token"))?;
            let mut params = relay_core::wire::json::Object::new();
            match what
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice()
            {
                ["deliveries"] => {}
                ["deliveries", state] => params.insert("state", *state),
                _ => anyhow::bail!("usage: relay admin deliveries [pending|failed]"),
            }
            let peers = relay_host_wasmtime::admin_client();
            let body = relay_core::wire::canonical::object_to_vec(&params);
            let auth = format!("Bearer {}", token.trim());
            let (status, text) = peers
                .post(
                    &format!("{url}/admin/v1/deliveries"),
                    &[("authorization", &auth)],
                    body,
                )
                .await?;
            println!("{}", String::from_utf8_lossy(&text));
            anyhow::ensure!(status == 200, "status {status}");
            Ok(())
        }
    }
}
