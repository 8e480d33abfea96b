//! relayctl: the command-line client for relay. This file only parses arguments.

use relay_cli::commands::{self, Globals, InitOptions, SendOptions};
use relay_cli::inspect::{self, VerifyOptions};
use relay_cli::CliError;
use relay_core::wire::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
relayctl: the relay command-line client

USAGE:
    relayctl [GLOBAL OPTIONS] COMMAND [OPTIONS]

ACCOUNT:
    init --relay URL [--network NAME] [--discoverable]
                                 new account + device, registered at URL; saves the profile
    whoami                       account id, device id, relay of the profile
    route publish --at URL       publish the profile's current route at another relay
    account move --to URL        make URL the account's home: route revision + 1, registered
                                 there with this device and the account's other devices this
                                 profile knows of (those it added with `device add`, and those
                                 the old home lists), published at the old home and at URL;
                                 the old home stays a former home that status, retry and sync
                                 still read from (`move --relay URL` is the same). On another
                                 device's profile it follows the move already made to URL
    device list [ACCOUNT]        valid and revoked devices (default: our own account)
    device add --out FILE [--permissions send,sync,manage]
                                 register a new device of this account; its profile goes to FILE
    device revoke DEVICE_ID      revoke a device of this account for good

CONTACTS:
    invite [--uses N] [--ttl MS] print a contact card with a signed contact_invite
                                 (default ttl 7 days), for senders to pass to `send --invite`
    grant ACCOUNT [--ttl MS]     print a contact card with a contact_grant for ACCOUNT

MESSAGES:
    send [--to ACCOUNT] [--invite FILE | --grant FILE] [--route-from URL] [--refresh]
         [--wait SECS] TEXT      encrypt and send TEXT; prints the DeliveryStatus
                                 (waits up to SECS, default 5, while it is delivering)
    retry MESSAGE_ID [--wait SECS]
                                 re-send a stored message unchanged to the relay that took it
    status MESSAGE_ID            message.delivery.status, asked of the relay that took it
    outbox                       sent messages: id, local state, last status, recipient
    sync [--from SEQ]            print new timeline entries (HTTP, one shot) and exit: first
                                 those still kept at former homes, then the home's (SEQ
                                 applies to each relay's own sequence)
    follow [--from SEQ] [--count N]
                                 former homes' entries once, then follow the home's timeline
                                 over WebSocket (exit after N entries)

TOOLS:
    canonicalize                 JSON on stdin, RFC 8785 canonical form on stdout
    verify [--certificate FILE] [--network NAME] [--at MS]
                                 a signed object on stdin: `valid` or the failing check

OPERATOR (a running relay of any host, through its admin listener; `relayctl admin --help`):
    admin [--data DIR] [--url ADMIN_URL] [--shard K] [--json]
          destinations [--failing] [--paused] | deliveries [pending|failed]
          | retry DESTINATION | retry-delivery FROM MESSAGE_ID | pause|resume DESTINATION
          | quarantine | quarantine-drop ID | quarantine-requeue ID | backup FILE | metrics
                                 a table for a listing, a line for an action (--json: the answer)

GLOBAL OPTIONS:
    --profile FILE   the profile (default $RELAYCTL_PROFILE, else ./relayctl.json)
    --timeout SECS   one HTTP call's limit before its outcome counts as unknown (default 30)
    --attempts N     attempts of one request on timeouts and lost answers (default 5)

Timeline lines are `SEQ  KIND  FROM  TEXT`, or `UNVERIFIED SEQ  KIND  REASON`.
Exit status: 0 done, 1 refused/invalid/failed, 2 usage or local input, 3 outcome unknown.";

/// Command-line options after the command words: `--flag value`, `--switch`, positionals.
struct Args {
    values: BTreeMap<String, String>,
    switches: Vec<String>,
    positional: Vec<String>,
}

impl Args {
    fn parse(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<Args, CliError> {
        let mut a = Args {
            values: BTreeMap::new(),
            switches: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(x) = it.next() {
            if x == "--" {
                a.positional.extend(it.by_ref().cloned());
                break;
            }
            if with_value.contains(&x.as_str()) {
                let v = it
                    .next()
                    .ok_or_else(|| CliError::Usage(format!("{x} needs a value")))?;
                a.values.insert(x.clone(), v.clone());
            } else if switches.contains(&x.as_str()) {
                a.switches.push(x.clone());
            } else if x.starts_with("--") {
                return Err(CliError::Usage(format!("unknown option {x}")));
            } else {
                a.positional.push(x.clone());
            }
        }
        Ok(a)
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.values.get(k).map(String::as_str)
    }

    fn has(&self, k: &str) -> bool {
        self.switches.iter().any(|s| s == k)
    }

    fn number(&self, k: &str) -> Result<Option<u64>, CliError> {
        self.get(k)
            .map(|v| {
                v.parse()
                    .map_err(|_| CliError::Usage(format!("{k} takes a non-negative integer")))
            })
            .transpose()
    }

    fn required(&self, k: &str) -> Result<&str, CliError> {
        self.get(k)
            .ok_or_else(|| CliError::Usage(format!("{k} is required")))
    }

    fn one_positional(&self, what: &str) -> Result<&str, CliError> {
        match self.positional.as_slice() {
            [x] => Ok(x),
            _ => Err(CliError::Usage(format!("expected one {what}"))),
        }
    }

    fn no_positional(&self) -> Result<(), CliError> {
        match self.positional.first() {
            None => Ok(()),
            Some(x) => Err(CliError::Usage(format!("unexpected argument {x:?}"))),
        }
    }
}

/// Takes the global options out of the argument list (they may stand anywhere).
fn globals(args: Vec<String>) -> Result<(Globals, Vec<String>), CliError> {
    let mut g = Globals::default();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| CliError::Usage(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--profile" => g.profile = Some(PathBuf::from(value()?)),
            "--timeout" => {
                let s: u64 = value()?
                    .parse()
                    .map_err(|_| CliError::Usage("--timeout takes seconds".into()))?;
                g.timeout = Duration::from_secs(s.max(1));
            }
            "--attempts" => {
                let n: u32 = value()?
                    .parse()
                    .map_err(|_| CliError::Usage("--attempts takes a number".into()))?;
                g.retry.attempts = n.max(1);
            }
            "--" => {
                rest.push(a);
                rest.extend(it.by_ref());
                break;
            }
            _ => rest.push(a),
        }
    }
    Ok((g, rest))
}

/// The new home of `account move --to URL` (or its older spelling `move --relay URL`).
fn move_target(a: &Args) -> Result<&str, CliError> {
    match (a.get("--to"), a.get("--relay")) {
        (Some(_), Some(_)) => Err(CliError::Usage(
            "pass --to URL (or --relay URL), not both".into(),
        )),
        (Some(url), None) | (None, Some(url)) => Ok(url),
        (None, None) => Err(CliError::Usage("--to URL is required".into())),
    }
}

fn wait_of(a: &Args) -> Result<Duration, CliError> {
    Ok(Duration::from_secs(a.number("--wait")?.unwrap_or(5)))
}

fn run(args: Vec<String>) -> Result<u8, CliError> {
    if args.first().is_some_and(|a| a == "admin") {
        return Ok(admin(&args[1..]));
    }
    let (g, args) = globals(args)?;
    let stdout = std::io::stdout();
    let out = &mut stdout.lock();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => return Err(CliError::Usage("no command".into())),
    };
    match cmd {
        "init" => {
            let a = Args::parse(rest, &["--relay", "--network"], &["--discoverable"])?;
            a.no_positional()?;
            let o = InitOptions {
                relay: a.required("--relay")?.to_string(),
                network: a.get("--network").map(str::to_string),
                discoverable: a.has("--discoverable"),
            };
            commands::init(&g, &o, out)?;
        }
        "whoami" => {
            Args::parse(rest, &[], &[])?.no_positional()?;
            commands::whoami(&g, out)?;
        }
        "route" => {
            let a = Args::parse(rest, &["--at"], &[])?;
            if a.one_positional("subcommand (publish)")? != "publish" {
                return Err(CliError::Usage("route publish --at URL".into()));
            }
            commands::route_publish(&g, a.required("--at")?, out)?;
        }
        "account" => {
            let a = Args::parse(rest, &["--to", "--relay"], &[])?;
            if a.one_positional("subcommand (move)")? != "move" {
                return Err(CliError::Usage("account move --to URL".into()));
            }
            commands::move_to(&g, move_target(&a)?, out)?;
        }
        "move" => {
            let a = Args::parse(rest, &["--to", "--relay"], &[])?;
            a.no_positional()?;
            commands::move_to(&g, move_target(&a)?, out)?;
        }
        "device" => {
            let a = Args::parse(rest, &["--out", "--permissions"], &[])?;
            match a
                .positional
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice()
            {
                ["list"] => commands::device_list(&g, None, out)?,
                ["list", account] => commands::device_list(&g, Some(account), out)?,
                ["add"] => {
                    let perms: Vec<String> = a
                        .get("--permissions")
                        .unwrap_or("send,sync,manage")
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect();
                    commands::device_add(&g, PathBuf::from(a.required("--out")?), &perms, out)?
                }
                ["revoke", id] => commands::device_revoke(&g, id, out)?,
                _ => {
                    return Err(CliError::Usage(
                        "device list [ACCOUNT] | device add --out FILE | device revoke DEVICE_ID"
                            .into(),
                    ))
                }
            }
        }
        "invite" => {
            let a = Args::parse(rest, &["--uses", "--ttl"], &[])?;
            a.no_positional()?;
            let ttl = a.number("--ttl")?.unwrap_or(7 * 24 * 3600 * 1000);
            commands::invite(&g, a.number("--uses")?, ttl, out)?;
        }
        "grant" => {
            let a = Args::parse(rest, &["--ttl"], &[])?;
            commands::grant(&g, a.one_positional("ACCOUNT")?, a.number("--ttl")?, out)?;
        }
        "send" => {
            let a = Args::parse(
                rest,
                &["--to", "--invite", "--grant", "--route-from", "--wait"],
                &["--refresh"],
            )?;
            if a.get("--invite").is_some() && a.get("--grant").is_some() {
                return Err(CliError::Usage("pass --invite or --grant, not both".into()));
            }
            let o = SendOptions {
                to: a.get("--to").map(str::to_string),
                card: a.get("--invite").or(a.get("--grant")).map(PathBuf::from),
                route_from: a.get("--route-from").map(str::to_string),
                refresh: a.has("--refresh"),
                wait: wait_of(&a)?,
                text: a.one_positional("TEXT")?.to_string(),
            };
            return commands::send(&g, &o, out);
        }
        "retry" => {
            let a = Args::parse(rest, &["--wait"], &[])?;
            return commands::retry(&g, a.one_positional("MESSAGE_ID")?, wait_of(&a)?, out);
        }
        "status" => {
            let a = Args::parse(rest, &[], &[])?;
            return commands::status(&g, a.one_positional("MESSAGE_ID")?, out);
        }
        "outbox" => {
            Args::parse(rest, &[], &[])?.no_positional()?;
            commands::outbox(&g, out)?;
        }
        "sync" => {
            let a = Args::parse(rest, &["--from"], &[])?;
            a.no_positional()?;
            commands::sync(&g, a.number("--from")?, out)?;
        }
        "follow" => {
            let a = Args::parse(rest, &["--from", "--count"], &[])?;
            a.no_positional()?;
            let count = a.number("--count")?.map(|n| n as usize);
            commands::follow(&g, a.number("--from")?, count, out)?;
        }
        "canonicalize" => {
            Args::parse(rest, &[], &[])?.no_positional()?;
            let input = read_stdin()?;
            let c = inspect::canonicalize(&input).map_err(|e| CliError::Input(e.to_string()))?;
            let _ = out.write_all(&c);
            let _ = out.flush();
        }
        "verify" => {
            let a = Args::parse(rest, &["--certificate", "--network", "--at"], &[])?;
            a.no_positional()?;
            let opts = VerifyOptions {
                certificate: a.get("--certificate").map(str::to_string),
                network: a.get("--network").map(str::to_string),
                at: a.number("--at")?,
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
        "help" | "-h" | "--help" => {
            let _ = writeln!(out, "{USAGE}");
        }
        other => return Err(CliError::Usage(format!("unknown command {other:?}"))),
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
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, CliError::Usage(_)) {
                eprintln!("\n{USAGE}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn target(args: &str) -> Result<String, CliError> {
        let a = Args::parse(&words(args), &["--to", "--relay"], &[])?;
        move_target(&a).map(str::to_string)
    }

    #[test]
    fn move_takes_to_or_its_older_spelling_relay_but_not_both() {
        assert_eq!(
            target("move --to http://127.0.0.1:9").unwrap(),
            "http://127.0.0.1:9"
        );
        assert_eq!(
            target("--relay http://127.0.0.1:9").unwrap(),
            "http://127.0.0.1:9"
        );
        assert!(matches!(
            target("move --to http://127.0.0.1:9 --relay http://127.0.0.1:10"),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(target("move"), Err(CliError::Usage(_))));
        assert!(matches!(target("move --to"), Err(CliError::Usage(_))));
        assert!(matches!(
            target("move --at http://127.0.0.1:9"),
            Err(CliError::Usage(_))
        ));
    }

    #[test]
    fn account_needs_the_move_subcommand_and_globals_may_stand_anywhere() {
        let (g, rest) = globals(words(
            "account --profile p.json move --timeout 3 --to http://127.0.0.1:9",
        ))
        .unwrap();
        assert_eq!(g.profile, Some(PathBuf::from("p.json")));
        assert_eq!(g.timeout, Duration::from_secs(3));
        assert_eq!(rest, words("account move --to http://127.0.0.1:9"));
        // Without a profile the command fails on the profile, after parsing; a wrong or
        // missing subcommand fails as usage before anything is read.
        for bad in [
            "account",
            "account moves --to http://127.0.0.1:9",
            "account move x --to http://127.0.0.1:9",
        ] {
            let r = run(words(&format!("--profile /nonexistent/p.json {bad}")));
            assert!(matches!(r, Err(CliError::Usage(_))), "{bad}: {r:?}");
        }
        let r = run(words(
            "--profile /nonexistent/p.json account move --relay http://127.0.0.1:9",
        ));
        assert!(matches!(r, Err(CliError::Profile(_))), "{r:?}");
    }
}
