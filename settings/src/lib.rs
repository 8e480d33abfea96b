//! The relay's command line and configuration file, written once for every host.
//!
//! `relay serve`, `relay-node serve` and `relay-edge serve` take the same flags, the same
//! TOML keys and the same defaults, checked the same way; `relay admin` and
//! `relay-node admin` the same operator calls. This crate is that one definition. It is
//! pure: the host hands it argv and a way to read the `--config` file, and gets back the
//! settings, the admin call to make, or the text to print (help, version, an error). The
//! wasmtime host links it natively; the Node and edge hosts reach it through the
//! wasm-bindgen module of their own (`settings/js/`, `parseCommand`), which no core loads.
//!
//! Each host takes the flags that mean something on it ([`Host::takes`]): a TLS flag on
//! workerd, whose sockets are the platform's, is refused rather than ignored.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod admin;
mod serve;
mod table;
pub mod tuning;

pub use admin::{Admin, AdminCall, AdminCommand, DeliveryState};
pub use serve::{Engine, LogFormat, Settings};
pub use table::{render, View};
pub use tuning::{tuning, Tuning, KNOBS};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::Path;

/// Which host is parsing: each takes the flags that mean something on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// `relay`: the wasmtime host.
    Wasmtime,
    /// `relay-node`: the Node host.
    Node,
    /// `relay-edge`: the workerd host.
    Edge,
}

impl Host {
    /// The host by its binary's name (`relay`, `relay-node`, `relay-edge`).
    pub fn named(name: &str) -> Option<Host> {
        Some(match name {
            "relay" => Host::Wasmtime,
            "relay-node" => Host::Node,
            "relay-edge" => Host::Edge,
            _ => return None,
        })
    }

    /// The binary's name, as usage lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            Host::Wasmtime => "relay",
            Host::Node => "relay-node",
            Host::Edge => "relay-edge",
        }
    }

    /// Whether this host takes the `serve` flag (or TOML key) `flag`, spelled with `_`.
    ///
    /// The component is the wasmtime host's alone; shards run on wasmtime threads and
    /// Durable Objects (the Node host is one thread of one core); on workerd the sockets,
    /// TLS, logs and storage are the platform's, and only it probes peers before a fetch.
    pub fn takes(self, flag: &str) -> bool {
        let edge_lacks = [
            "memory",
            "config",
            "component",
            "log_format",
            "tls_cert",
            "tls_key",
            "ca",
        ];
        match self {
            Host::Wasmtime => flag != "no_probe_peers",
            Host::Node => !matches!(flag, "component" | "shards" | "no_probe_peers"),
            Host::Edge => {
                !edge_lacks.contains(&flag)
                    && !relay_core::transport::limits::LIMITS
                        .iter()
                        .any(|l| l.name == flag)
            }
        }
    }
}

/// What a command line asks of a host.
#[derive(Debug)]
pub enum Parsed {
    /// Serve a relay with these settings.
    Serve(Box<Settings>),
    /// Make one call to a running relay's admin listener.
    Admin(Admin),
    /// Print this (help or version) to stdout and exit with status 0.
    Print(String),
}

/// A command line or configuration file that cannot be taken: the text to print to stderr
/// (it names the flag or key, and carries the usage line), and exit with status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

#[derive(Parser)]
#[command(version, about = "A relay server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a relay (HTTP, WebSocket and relay RPC on one port; the admin API, metrics
    /// and health checks on the admin listener).
    #[command(allow_negative_numbers = true)]
    Serve(Box<serve::Layer>),
    /// Operator tools against a running relay, through its admin listener.
    Admin(admin::AdminArgs),
}

/// Parses a command line (without the program name) for `host`; `read` reads the
/// `--config` file when one is named.
pub fn parse<I, S>(
    host: Host,
    argv: I,
    read: impl FnOnce(&Path) -> Result<String, String>,
) -> Result<Parsed, Error>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut command = Cli::command().name(host.name()).bin_name(host.name());
    command = command.mut_subcommand("serve", |serve| {
        let hidden: Vec<String> = serve
            .get_arguments()
            .map(|a| a.get_id().as_str().to_string())
            .filter(|id| !host.takes(id))
            .collect();
        hidden
            .iter()
            .fold(serve, |c, id| c.mut_arg(id, |a| a.hide(true)))
    });
    let words = std::iter::once(host.name().to_string()).chain(argv.into_iter().map(Into::into));
    let matches = match command.try_get_matches_from_mut(words) {
        Ok(m) => m,
        Err(e) => return clap_outcome(e),
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Error(e.render().to_string()))?;
    match cli.command {
        Command::Serve(layer) => {
            let usage = command
                .find_subcommand_mut("serve")
                .map(|c| c.render_usage().to_string())
                .unwrap_or_default();
            serve::settings(host, *layer, read)
                .map(|s| Parsed::Serve(Box::new(s)))
                .map_err(|e| Error(format!("error: {e}\n\n{usage}")))
        }
        Command::Admin(args) => Ok(Parsed::Admin(args.into())),
    }
}

/// `admin` alone, under another binary's name (`relayctl admin`): the same operator calls,
/// flags and checks as `relay admin`, for the client's command line. `argv` follows `admin`.
pub fn parse_admin<I, S>(bin: &'static str, argv: I) -> Result<Parsed, Error>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    /// Operator tools against a running relay of any host, through its admin listener.
    #[derive(Parser)]
    struct AdminOnly {
        #[command(flatten)]
        args: admin::AdminArgs,
    }
    let mut command = AdminOnly::command().name(bin).bin_name(bin);
    let words = std::iter::once(bin.to_string()).chain(argv.into_iter().map(Into::into));
    let matches = match command.try_get_matches_from_mut(words) {
        Ok(m) => m,
        Err(e) => return clap_outcome(e),
    };
    let only = AdminOnly::from_arg_matches(&matches).map_err(|e| Error(e.render().to_string()))?;
    Ok(Parsed::Admin(only.args.into()))
}

/// Help and version are printed and succeed; every other clap error is a usage error.
fn clap_outcome(e: clap::Error) -> Result<Parsed, Error> {
    use clap::error::ErrorKind;
    let mut text = e.render().to_string();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Ok(Parsed::Print(text)),
        _ => Err(Error(text)),
    }
}

#[cfg(test)]
mod tests;
