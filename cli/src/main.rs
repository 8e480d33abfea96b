//! relayctl: the command-line client for relay.
//!
//! Today it carries the tools a person debugging signatures needs:
//! `canonicalize` and `verify`. Account, messaging and timeline commands
//! join it as the hosts land.

use relay_core::wire::authorization::{ContactGrant, ContactInvite};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::field::Fields;
use relay_core::wire::json::{self, Object};
use relay_core::wire::route::Route;
use relay_core::wire::session_open::{DeviceRevocation, SessionOpen};
use relay_core::wire::signature::SignedObject;
use relay_core::Error;
use std::io::{Read, Write};
use std::process::ExitCode;

const USAGE: &str = "\
relayctl: the relay command-line client

USAGE:
    relayctl canonicalize            JSON on stdin, RFC 8785 canonical form on stdout
    relayctl verify [OPTIONS]        a signed object on stdin: `valid` or the failing check

VERIFY OPTIONS:
    --certificate FILE   the device certificate that signed a message_envelope or session_open
    --network NAME       the network to check against (default: the object's own)
    --at MS              also check the certificate's validity at this time (ms since epoch)

Exit status: 0 valid / done, 1 invalid object, 2 unreadable input or usage error.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("canonicalize") => canonicalize(),
        Some("verify") => verify(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn read_stdin() -> Result<Vec<u8>, ExitCode> {
    let mut buf = Vec::new();
    std::io::stdin().read_to_end(&mut buf).map_err(|e| {
        eprintln!("error: reading stdin: {e}");
        ExitCode::from(2)
    })?;
    Ok(buf)
}

fn canonicalize() -> ExitCode {
    let input = match read_stdin() {
        Ok(b) => b,
        Err(c) => return c,
    };
    match json::parse(&input) {
        Ok(v) => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&canonical::to_vec(&v));
            let _ = out.flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

struct VerifyOptions {
    certificate: Option<String>,
    network: Option<String>,
    at: Option<u64>,
}

fn parse_verify_options(args: &[String]) -> Result<VerifyOptions, String> {
    let mut o = VerifyOptions {
        certificate: None,
        network: None,
        at: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--certificate" => o.certificate = Some(value()?),
            "--network" => o.network = Some(value()?),
            "--at" => o.at = Some(value()?.parse().map_err(|_| "--at takes milliseconds")?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn verify(args: &[String]) -> ExitCode {
    let opts = match parse_verify_options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let input = match read_stdin() {
        Ok(b) => b,
        Err(c) => return c,
    };
    let object = match json::parse_object(&input) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match check(object, &opts) {
        Ok(what) => {
            println!("valid: {what}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("invalid: {}: {}", e.code, e.message);
            ExitCode::from(1)
        }
    }
}

fn load_certificate(opts: &VerifyOptions, network: &str) -> Result<DeviceCertificate, Error> {
    let path = opts.certificate.as_deref().ok_or_else(|| {
        Error::new(
            relay_core::ErrorCode::InvalidParams,
            "this object is signed by a device key: pass --certificate FILE",
        )
    })?;
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(relay_core::ErrorCode::InvalidParams, format!("{path}: {e}")))?;
    let cert = DeviceCertificate::parse(json::parse_object(&bytes)?)
        .map_err(|e| e.within("certificate"))?;
    cert.verify(network)?;
    Ok(cert)
}

/// Runs every stateless check of the object's type; says who signed it.
fn check(object: Object, opts: &VerifyOptions) -> Result<String, Error> {
    let f = Fields::new(&object);
    let type_ = f.str("type")?.to_string();
    let network = match &opts.network {
        Some(n) => n.clone(),
        None => f.str("network")?.to_string(),
    };
    match type_.as_str() {
        "device_certificate" => {
            let c = DeviceCertificate::parse(object)?;
            c.verify(&network)?;
            if let Some(at) = opts.at {
                c.check_current(at, 0)?;
            }
            Ok(format!(
                "device_certificate for device {} signed by account {}",
                c.device_id, c.account
            ))
        }
        "message_envelope" => {
            let e = MessageEnvelope::parse(object)?;
            if e.network != network {
                return Err(Error::new(
                    relay_core::ErrorCode::InvalidParams,
                    "envelope is for another network",
                ));
            }
            let cert = load_certificate(opts, &network)?;
            e.verify_with(&cert)?;
            cert.check_valid_at(e.created_at, 0)?;
            Ok(format!(
                "message_envelope {} signed by device {} of account {}",
                e.message_id, e.from_device_id, e.from
            ))
        }
        "route" => {
            let r = Route::parse(object)?;
            r.verify(&network)?;
            Ok(format!(
                "route revision {} to {} signed by account {}",
                r.revision, r.relay, r.account
            ))
        }
        "contact_grant" => {
            let g = ContactGrant::parse(object)?;
            g.verify_signature(g.grantor.key())?;
            if let Some(r) = &g.route {
                r.verify(&network)?;
            }
            Ok(format!(
                "contact_grant {} signed by account {} for {}",
                g.grant_id, g.grantor, g.grantee
            ))
        }
        "contact_invite" => {
            let i = ContactInvite::parse(object)?;
            i.verify_signature(i.issuer.key())?;
            if let Some(r) = &i.route {
                r.verify(&network)?;
            }
            Ok(format!(
                "contact_invite {} signed by account {}",
                i.invite_id, i.issuer
            ))
        }
        "session_open" => {
            let s = SessionOpen::parse(object)?;
            let cert = load_certificate(opts, &network)?;
            if cert.device_id != s.device_id || cert.account != s.account {
                return Err(Error::new(
                    relay_core::ErrorCode::InvalidCertificate,
                    "certificate is not for this device",
                ));
            }
            s.verify_signature(&cert.device_key)?;
            Ok(format!("session_open signed by device {}", s.device_id))
        }
        "device_revocation" => {
            let r = DeviceRevocation::parse(object)?;
            r.verify_signature(r.account.key())?;
            Ok(format!(
                "device_revocation of {} signed by account {}",
                r.device_id, r.account
            ))
        }
        other => Err(Error::new(
            relay_core::ErrorCode::InvalidParams,
            format!("unknown object type {other:?}"),
        )),
    }
}
