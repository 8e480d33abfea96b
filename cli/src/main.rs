//! relayctl: the command-line client for relay. This file only parses arguments (clap, as the
//! relay's own command line does) and hands them to `relay_cli::commands`.

use clap::{Args, CommandFactory, Parser, Subcommand};
use relay_cli::commands::{self, Globals, InitOptions, SendOptions};
use relay_cli::inspect::{self, VerifyOptions};
use relay_cli::CliError;
use relay_core::wire::json;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What the exit status and timeline lines mean, under every help text.
const AFTER_HELP: &str = "\
Timeline lines are `SEQ  KIND  FROM  TEXT`, or `UNVERIFIED SEQ  KIND  REASON`.
Exit status: 0 done, 1 refused/invalid/failed, 2 usage or local input, 3 outcome unknown.";

/// relayctl: the relay command-line client
#[derive(Parser, Debug)]
#[command(name = "relayctl", version, after_help = AFTER_HELP, disable_help_subcommand = true)]
struct Cli {
    /// The profile (default $RELAYCTL_PROFILE, else ./relayctl.json)
    #[arg(long, global = true, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// One HTTP call's limit before its outcome counts as unknown (default 30)
    #[arg(long, global = true, value_name = "SECS")]
    timeout: Option<u64>,
    /// Attempts of one request on timeouts and lost answers (default 5)
    #[arg(long, global = true, value_name = "N")]
    attempts: Option<u32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// New account + device, registered at URL; saves the profile
    Init {
        #[arg(long, value_name = "URL")]
        relay: String,
        #[arg(long, value_name = "NAME")]
        network: Option<String>,
        /// Others may find the account by its id without an invite
        #[arg(long)]
        discoverable: bool,
    },
    /// Account id, device id, relay of the profile
    Whoami,
    /// The profile's route
    #[command(subcommand)]
    Route(RouteCommand),
    /// The account's home relay
    #[command(subcommand)]
    Account(AccountCommand),
    /// The same as `account move`
    #[command(hide = true)]
    Move(MoveArgs),
    /// The account's devices
    #[command(subcommand)]
    Device(DeviceCommand),
    /// Print a contact card with a signed contact_invite, for senders to pass to `send --invite`
    Invite {
        /// How many senders may use it (default: any)
        #[arg(long, value_name = "N")]
        uses: Option<u64>,
        /// Its lifetime (default 7 days)
        #[arg(long, value_name = "MS", default_value_t = 7 * 24 * 3600 * 1000)]
        ttl: u64,
    },
    /// Print a contact card with a contact_grant for ACCOUNT
    Grant {
        #[arg(allow_hyphen_values = true)]
        account: String,
        #[arg(long, value_name = "MS")]
        ttl: Option<u64>,
    },
    /// Encrypt and send TEXT; prints the DeliveryStatus
    Send {
        /// The recipient account (default: the card's)
        #[arg(long, value_name = "ACCOUNT", allow_hyphen_values = true)]
        to: Option<String>,
        /// A contact card with an invite
        #[arg(long, value_name = "FILE", conflicts_with = "grant")]
        invite: Option<PathBuf>,
        /// A contact card with a grant
        #[arg(long, value_name = "FILE")]
        grant: Option<PathBuf>,
        /// Ask this relay for the recipient's route
        #[arg(long, value_name = "URL")]
        route_from: Option<String>,
        /// Fetch the recipient's route and devices again first
        #[arg(long)]
        refresh: bool,
        /// Wait up to SECS while it is delivering
        #[arg(long, value_name = "SECS", default_value_t = 5)]
        wait: u64,
        #[arg(allow_hyphen_values = true)]
        text: String,
    },
    /// Re-send a stored message unchanged to the relay that took it
    Retry {
        #[arg(allow_hyphen_values = true)]
        message_id: String,
        #[arg(long, value_name = "SECS", default_value_t = 5)]
        wait: u64,
    },
    /// message.delivery.status, asked of the relay that took it
    Status {
        #[arg(allow_hyphen_values = true)]
        message_id: String,
    },
    /// Sent messages: id, local state, last status, recipient
    Outbox,
    /// Print new timeline entries (HTTP, one shot) and exit: first those still kept at former
    /// homes, then the home's (SEQ applies to each relay's own sequence)
    Sync {
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
    },
    /// Former homes' entries once, then follow the home's timeline over WebSocket
    Follow {
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// Exit after N entries
        #[arg(long, value_name = "N")]
        count: Option<usize>,
    },
    /// JSON on stdin, RFC 8785 canonical form on stdout
    Canonicalize,
    /// A signed object on stdin: `valid` or the failing check
    Verify {
        #[arg(long, value_name = "FILE")]
        certificate: Option<String>,
        #[arg(long, value_name = "NAME")]
        network: Option<String>,
        #[arg(long, value_name = "MS")]
        at: Option<u64>,
    },
    /// A running relay of any host, through its admin listener (`relayctl admin --help`)
    #[command(disable_help_flag = true)]
    Admin {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell)
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand, Debug)]
enum RouteCommand {
    /// Publish the profile's current route at another relay
    Publish {
        #[arg(long, value_name = "URL")]
        at: String,
    },
}

#[derive(Subcommand, Debug)]
enum AccountCommand {
    /// Make URL the account's home: route revision + 1, registered there with this device and
    /// the account's other devices this profile knows of (those it added with `device add`,
    /// and those the old home lists), published at the old home and at URL; the old home stays
    /// a former home that status, retry and sync still read from. On another device's profile
    /// it follows the move already made to URL
    Move(MoveArgs),
}

/// The new home of `account move --to URL` (or its older spelling `--relay URL`).
#[derive(Args, Debug)]
struct MoveArgs {
    #[arg(
        long,
        value_name = "URL",
        required_unless_present = "relay",
        conflicts_with = "relay"
    )]
    to: Option<String>,
    #[arg(long, value_name = "URL", hide = true)]
    relay: Option<String>,
}

impl MoveArgs {
    fn target(&self) -> &str {
        // clap requires exactly one of them.
        self.to
            .as_deref()
            .or(self.relay.as_deref())
            .unwrap_or_default()
    }
}

#[derive(Subcommand, Debug)]
enum DeviceCommand {
    /// Valid and revoked devices (default: our own account)
    List {
        #[arg(allow_hyphen_values = true)]
        account: Option<String>,
    },
    /// Register a new device of this account; its profile goes to FILE
    Add {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        #[arg(long, value_name = "LIST", default_value = "send,sync,manage")]
        permissions: String,
    },
    /// Revoke a device of this account for good
    Revoke {
        #[arg(allow_hyphen_values = true)]
        device_id: String,
    },
}

/// The global options as the commands take them.
fn globals(cli: &Cli) -> Globals {
    let mut g = Globals {
        profile: cli.profile.clone(),
        ..Globals::default()
    };
    if let Some(s) = cli.timeout {
        g.timeout = Duration::from_secs(s.max(1));
    }
    if let Some(n) = cli.attempts {
        g.retry.attempts = n.max(1);
    }
    g
}

fn run(cli: Cli) -> Result<u8, CliError> {
    let g = globals(&cli);
    let stdout = std::io::stdout();
    let out = &mut stdout.lock();
    match cli.command {
        Command::Init {
            relay,
            network,
            discoverable,
        } => {
            let o = InitOptions {
                relay,
                network,
                discoverable,
            };
            commands::init(&g, &o, out)?;
        }
        Command::Whoami => commands::whoami(&g, out)?,
        Command::Route(RouteCommand::Publish { at }) => commands::route_publish(&g, &at, out)?,
        Command::Account(AccountCommand::Move(m)) | Command::Move(m) => {
            commands::move_to(&g, m.target(), out)?
        }
        Command::Device(DeviceCommand::List { account }) => {
            commands::device_list(&g, account.as_deref(), out)?
        }
        Command::Device(DeviceCommand::Add {
            out: file,
            permissions,
        }) => {
            let perms: Vec<String> = permissions
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            commands::device_add(&g, file, &perms, out)?
        }
        Command::Device(DeviceCommand::Revoke { device_id }) => {
            commands::device_revoke(&g, &device_id, out)?
        }
        Command::Invite { uses, ttl } => commands::invite(&g, uses, ttl, out)?,
        Command::Grant { account, ttl } => commands::grant(&g, &account, ttl, out)?,
        Command::Send {
            to,
            invite,
            grant,
            route_from,
            refresh,
            wait,
            text,
        } => {
            let o = SendOptions {
                to,
                card: invite.or(grant),
                route_from,
                refresh,
                wait: Duration::from_secs(wait),
                text,
            };
            return commands::send(&g, &o, out);
        }
        Command::Retry { message_id, wait } => {
            return commands::retry(&g, &message_id, Duration::from_secs(wait), out)
        }
        Command::Status { message_id } => return commands::status(&g, &message_id, out),
        Command::Outbox => commands::outbox(&g, out)?,
        Command::Sync { from } => commands::sync(&g, from, out)?,
        Command::Follow { from, count } => commands::follow(&g, from, count, out)?,
        Command::Canonicalize => {
            let input = read_stdin()?;
            let c = inspect::canonicalize(&input).map_err(|e| CliError::Input(e.to_string()))?;
            let _ = out.write_all(&c);
            let _ = out.flush();
        }
        Command::Verify {
            certificate,
            network,
            at,
        } => {
            let opts = VerifyOptions {
                certificate,
                network,
                at,
            };
            let input = read_stdin()?;
            let object = json::parse_object(&input).map_err(|e| CliError::Input(e.to_string()))?;
            match inspect::check(object, &opts) {
                Ok(what) => {
                    let _ = writeln!(out, "valid: {what}");
                }
                Err(e) => {
                    let _ = writeln!(out, "invalid: {}: {}", e.code, e.message);
                    return Ok(1);
                }
            }
        }
        Command::Admin { args } => return Ok(admin(&args)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "relayctl", out);
        }
    }
    Ok(0)
}

fn read_stdin() -> Result<Vec<u8>, CliError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .map_err(|e| CliError::Input(format!("reading stdin: {e}")))?;
    Ok(buf)
}

/// `relayctl admin ...`: the operator's calls (`relay admin`'s, from the definition every
/// host shares), through the admin listener of a relay of any host: a table for a
/// listing, a line for an action, or the answer as it came with `--json`. The exit code:
/// 0 on a 200 answer, 1 on another answer or none, 2 on a command line it cannot take.
fn admin(argv: &[String]) -> u8 {
    use relay_settings::Parsed;
    let a = match relay_settings::parse_admin("relayctl admin", argv.iter().cloned()) {
        Ok(Parsed::Admin(a)) => a,
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            return 0;
        }
        Ok(Parsed::Serve(_)) => return 2,
        Err(e) => {
            eprint!("{e}");
            return 2;
        }
    };
    let read = |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| e.to_string());
    let cwd = std::env::current_dir().unwrap_or_default();
    let call = match a.call(read, &cwd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("relayctl admin: {e}");
            return 1;
        }
    };
    let http = relay_cli::transport::Http::new(std::time::Duration::from_secs(60));
    match http.admin(
        call.method,
        &call.url,
        call.authorization.as_deref(),
        &call.body,
    ) {
        Ok((200, body)) => {
            print!("{}", relay_settings::render(call.view, &body));
            0
        }
        Ok((status, body)) => {
            eprintln!(
                "relayctl admin: status {status}: {}",
                String::from_utf8_lossy(&body).trim_end()
            );
            1
        }
        Err(e) => {
            eprintln!("relayctl admin: {e}");
            1
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // `relayctl admin ...` is the shared operator command line, with its own help and flags
    // (`relay admin`'s): everything after `admin` is its own.
    if args.get(1).is_some_and(|a| a == "admin") {
        return ExitCode::from(admin(&args[2..]));
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version print to stdout and exit 0; a usage error to stderr, exit 2.
            let _ = e.print();
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("relayctl").chain(s.split_whitespace()))
    }

    fn target(s: &str) -> Option<String> {
        match parse(s).ok()?.command {
            Command::Account(AccountCommand::Move(m)) | Command::Move(m) => {
                Some(m.target().to_string())
            }
            _ => None,
        }
    }

    #[test]
    fn move_takes_to_or_its_older_spelling_relay_but_not_both() {
        let url = Some("http://127.0.0.1:9".to_string());
        assert_eq!(target("account move --to http://127.0.0.1:9"), url);
        assert_eq!(target("move --to http://127.0.0.1:9"), url);
        assert_eq!(target("move --relay http://127.0.0.1:9"), url);
        for bad in [
            "move --to http://127.0.0.1:9 --relay http://127.0.0.1:10",
            "move",
            "move --to",
            "move --at http://127.0.0.1:9",
            "account",
            "account moves --to http://127.0.0.1:9",
            "account move x --to http://127.0.0.1:9",
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}: a usage error");
        }
    }

    #[test]
    fn globals_may_stand_anywhere_and_suggestions_name_the_near_command() {
        let cli =
            parse("account --profile p.json move --timeout 3 --to http://127.0.0.1:9").unwrap();
        let g = globals(&cli);
        assert_eq!(g.profile, Some(PathBuf::from("p.json")));
        assert_eq!(g.timeout, Duration::from_secs(3));
        assert_eq!(g.retry.attempts, Globals::default().retry.attempts);
        let e = parse("sned hello").unwrap_err().to_string();
        assert!(e.contains("send"), "{e}");
        // Without a profile the command fails on the profile, after parsing.
        let r = run(
            parse("--profile /nonexistent/p.json account move --relay http://127.0.0.1:9").unwrap(),
        );
        assert!(matches!(r, Err(CliError::Profile(_))), "{r:?}");
        // Ids are base64url, so one may start with a dash: it is still the id, not a flag.
        match parse("status -eXb2 --timeout 3").unwrap().command {
            Command::Status { message_id } => assert_eq!(message_id, "-eXb2"),
            c => panic!("{c:?}"),
        }
        match parse("send --to -acc -1").unwrap().command {
            Command::Send { to, text, .. } => {
                assert_eq!((to.as_deref(), text.as_str()), (Some("-acc"), "-1"))
            }
            c => panic!("{c:?}"),
        }
        let e = parse("send --to acc one two").unwrap_err();
        assert_eq!(e.exit_code(), 2, "one TEXT: {e}");
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
