//! `relay`: a relay server running the core component in wasmtime. Its command line is the
//! one every host shares (relay-settings); this file runs what it asks.

use relay_host_wasmtime::settings::LogFormat;
use relay_settings::{Admin, Host, Parsed};

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

/// Logs to stderr, filtered by `RELAY_LOG` (default `info`).
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

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

/// Makes an admin call and prints the answer: its body, and its status when not 200.
async fn admin(a: Admin) -> anyhow::Result<()> {
    let call = a.call(read, &std::env::current_dir()?)?;
    let client = relay_host_wasmtime::admin_client();
    let (status, text) = match &call.authorization {
        None => client.get(&call.url).await?,
        Some(auth) => {
            let headers = [("authorization", auth.as_str())];
            client.post(&call.url, &headers, call.body).await?
        }
    };
    if status == 200 {
        print!("{}", relay_settings::render(call.view, &text));
        return Ok(());
    }
    let text = String::from_utf8_lossy(&text);
    eprint!("{text}{}", if text.ends_with('\n') { "" } else { "\n" });
    anyhow::bail!("status {status}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match relay_settings::parse(Host::Wasmtime, std::env::args().skip(1), read) {
        Err(e) => {
            eprint!("{e}");
            std::process::exit(2)
        }
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            Ok(())
        }
        Ok(Parsed::Serve(settings)) => {
            // The environment knobs (README: "Environment knobs"): a malformed one stops the start.
            if let Err(e) = relay_settings::Tuning::from_env() {
                eprintln!("relay: {e}");
                std::process::exit(2)
            }
            init_logs(settings.log_format);
            let running = relay_host_wasmtime::start(*settings).await?;
            println!(
                "relay listening on {} as {}; admin on {}",
                running.addr, running.url, running.admin_url
            );
            shutdown_signal().await;
            tracing::info!("shutting down: finishing in-flight requests");
            running.stop().await;
            Ok(())
        }
        Ok(Parsed::Admin(a)) => {
            init_logs(LogFormat::Text);
            admin(a).await
        }
    }
}
