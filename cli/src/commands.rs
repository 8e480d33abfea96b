//! The commands of relayctl, one function each; `main.rs` only parses arguments into them.

use crate::client::{now_ms, Client, RetryPolicy};
use crate::directory::{self, card_object};
use crate::error::{CallError, CliError};
use crate::profile::{Profile, Store, VERSION};
use crate::send::{self, status_of, Sent};
use crate::timeline;
use crate::transport::Http;
use rand::rngs::OsRng;
use relay_core::client::{draft, random_id, AccountKey, DeviceKey};
use relay_core::wire::base64url;
use relay_core::wire::canonical;
use relay_core::wire::identity::{valid_network, AccountId, RelayId};
use relay_core::wire::json::{Object, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Options every command shares.
#[derive(Clone, Debug)]
pub struct Globals {
    pub profile: Option<PathBuf>,
    /// How long one HTTP call may take before its outcome counts as unknown.
    pub timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for Globals {
    fn default() -> Globals {
        Globals {
            profile: None,
            timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
        }
    }
}

impl Globals {
    fn store(&self) -> Store {
        Store::new(self.profile.clone())
    }
    fn http(&self) -> Http {
        Http::new(self.timeout)
    }
    /// The client of the profile.
    pub fn client(&self) -> Result<Client, CliError> {
        Client::open(self.store(), self.http(), self.retry)
    }
}

fn text(o: &Object) -> String {
    String::from_utf8_lossy(&canonical::object_to_vec(o)).into_owned()
}

/// A relay URL as its relay id: it must already be in canonical form.
fn relay_id(url: &str) -> Result<String, CliError> {
    let id = RelayId::parse(url).map_err(|e| CliError::Usage(format!("relay {url}: {e}")))?;
    Ok(id.as_str().to_string())
}

/// Calls an idempotent method (the same request again changes nothing), retrying lost answers.
fn idempotent(
    policy: RetryPolicy,
    mut call: impl FnMut() -> Result<Object, CallError>,
) -> Result<Object, CliError> {
    let mut backoff = policy.initial_backoff;
    let mut attempt = 1;
    loop {
        match call() {
            Ok(o) => return Ok(o),
            Err(CallError::Transport(t)) if attempt < policy.attempts => {
                eprintln!("{t}; retrying in {} ms", backoff.as_millis());
            }
            Err(CallError::Relay(e))
                if attempt < policy.attempts
                    && matches!(e.code.as_str(), "unavailable" | "internal" | "rate_limited") =>
            {
                eprintln!("{e}; retrying in {} ms", backoff.as_millis());
                if let Some(ms) = e.retry_after() {
                    backoff = backoff.max(Duration::from_millis(ms));
                }
            }
            Err(e) => return Err(e.into()),
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(policy.max_backoff);
        attempt += 1;
    }
}

/// `account.register` of the profile's route and certificate at its relay.
fn register(http: &Http, policy: RetryPolicy, p: &Profile) -> Result<Object, CliError> {
    let mut params = Object::new();
    params.insert("route", p.route()?);
    params.insert("certificate", p.certificate()?);
    params.insert("discoverable", p.discoverable);
    let body = canonical::object_to_vec(&params);
    idempotent(policy, || {
        http.call(&p.relay, "account.register", None, &body)
    })
}

/// What `init` asks for.
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    pub relay: String,
    pub network: Option<String>,
    pub discoverable: bool,
}

/// Creates an account and this device, registers them at the relay, saves the profile.
///
/// The profile is written before `account.register`, so keys are never lost
/// to a failed call; running `init` again finishes a registration that did
/// not complete (registering the same objects again is idempotent).
pub fn init(g: &Globals, o: &InitOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let store = g.store();
    let http = g.http();
    if store.exists() {
        let p = store.load()?;
        if p.registered {
            return Err(CliError::Profile(format!(
                "{} already holds account {} at {}",
                store.path().display(),
                p.account_id()?,
                p.relay
            )));
        }
        register(&http, g.retry, &p)?;
        let (_, p) = store.update(|p| p.registered = true)?;
        return whoami_of(&p, out);
    }
    let relay = relay_id(&o.relay)?;
    let wk = http.well_known(&relay).map_err(CliError::from)?;
    let served = wk.get("relay").and_then(Value::as_str).unwrap_or("");
    if served != relay {
        return Err(CliError::Invalid(format!(
            "{relay} calls itself {served:?}; use that URL"
        )));
    }
    let wk_network = wk.get("network").and_then(Value::as_str).unwrap_or("");
    let network = o.network.clone().unwrap_or_else(|| wk_network.to_string());
    if network != wk_network {
        return Err(CliError::Usage(format!(
            "{relay} is on network {wk_network:?}, not {network:?}"
        )));
    }
    if !valid_network(&network) {
        return Err(CliError::Invalid(format!("bad network name {network:?}")));
    }
    let account = AccountKey::generate(&mut OsRng);
    let device = DeviceKey::generate(&mut OsRng);
    let now = now_ms();
    let cert = draft::certificate(
        &network,
        &account,
        &device,
        &["send", "sync", "manage"],
        now,
    )
    .sign(&account);
    let route = draft::route(&network, &account.id(), &relay, 1, now).sign(&account);
    let (signing, boxk) = device.seeds();
    let p = Profile {
        version: VERSION,
        network,
        relay,
        account_key: base64url::encode(&account.seed()),
        device_signing_key: base64url::encode(&signing),
        device_box_key: base64url::encode(&boxk),
        certificate: text(&cert),
        route: text(&route),
        discoverable: o.discoverable,
        registered: false,
        session: None,
        cursor: 0,
        contacts: Default::default(),
        outbox: Default::default(),
        devices: Vec::new(),
        former_homes: Vec::new(),
    };
    store.create(&p)?;
    register(&http, g.retry, &p)?;
    let (_, p) = store.update(|p| p.registered = true)?;
    whoami_of(&p, out)
}

fn whoami_of(p: &Profile, out: &mut dyn Write) -> Result<(), CliError> {
    let _ = writeln!(out, "account  {}", p.account_id()?);
    let _ = writeln!(out, "device   {}", p.device_id()?);
    let _ = writeln!(out, "relay    {}", p.relay);
    let _ = writeln!(out, "network  {}", p.network);
    let _ = writeln!(out, "route    revision {}", p.route_revision()?);
    for f in &p.former_homes {
        let _ = writeln!(out, "former   {}", f.relay);
    }
    Ok(())
}

/// Prints the account id, device id and relay of the profile.
pub fn whoami(g: &Globals, out: &mut dyn Write) -> Result<(), CliError> {
    whoami_of(&g.store().load()?, out)
}

/// Publishes the profile's current route at another relay (`route.publish`).
pub fn route_publish(g: &Globals, at: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let p = g.store().load()?;
    let at = relay_id(at)?;
    let rev = publish(&g.http(), g.retry, &at, &p.route()?)?;
    let _ = writeln!(out, "{at} holds route revision {rev}");
    Ok(())
}

/// `route.publish` of `route` at `relay`, retrying lost answers; the revision it holds.
fn publish(http: &Http, policy: RetryPolicy, relay: &str, route: &Object) -> Result<u64, CliError> {
    let mut params = Object::new();
    params.insert("route", route.clone());
    let body = canonical::object_to_vec(&params);
    let r = idempotent(policy, || http.call(relay, "route.publish", None, &body))?;
    Ok(r.get("revision")
        .and_then(Value::as_protocol_int)
        .unwrap_or(0))
}

/// The certificates of the account's devices this profile knows of, this device's first:
/// its own, those it added (`device add`), and, when `listed` is given, the valid ones the
/// home lists (`device.list`), less the devices the home lists as revoked.
fn known_devices(p: &Profile, listed: Option<&Object>) -> Result<Vec<Object>, CliError> {
    let me = p.account_id()?;
    let mut certs = vec![p.certificate()?];
    let mut candidates = Vec::new();
    for d in &p.devices {
        candidates.push(crate::profile::object(d, "device")?);
    }
    let mut revoked = Vec::new();
    if let Some(l) = listed {
        if let Some(Value::Array(list)) = l.get("devices") {
            candidates.extend(list.iter().filter_map(Value::as_object).cloned());
        }
        if let Some(Value::Array(list)) = l.get("revoked") {
            revoked.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
        }
    }
    let mut seen = vec![p.device_id()?.as_str().to_string()];
    for c in candidates {
        // Only certificates of this account that verify; one per device.
        let Ok(cert) = directory::verify_certificate(c.clone(), &p.network, &me) else {
            continue;
        };
        let id = cert.device_id.as_str().to_string();
        if !seen.contains(&id) && !revoked.contains(&id) {
            seen.push(id);
            certs.push(c);
        }
    }
    Ok(certs)
}

/// The route `to` holds for the profile's account when it is of a higher revision than the
/// profile's and names `to`: another device of the account moved it there already.
fn moved_already(http: &Http, p: &Profile, to: &str) -> Result<Option<Object>, CliError> {
    let me = p.account_id()?;
    let mut params = Object::new();
    params.insert("account", me.as_str());
    let Ok(r) = http.call(to, "route.get", None, &canonical::object_to_vec(&params)) else {
        return Ok(None);
    };
    let Some(route) = r.get("route").and_then(Value::as_object).cloned() else {
        return Ok(None);
    };
    let Ok(held) = directory::verify_route(route.clone(), &p.network, Some(&me)) else {
        return Ok(None);
    };
    Ok((held.relay.as_str() == to && held.revision > p.route_revision()?).then_some(route))
}

/// Moves the account's home to `to` (protocol.md, "Home relay changes").
///
/// A route of revision + 1 naming `to`; `account.register` there with this
/// device's certificate; `device.register` there of every other device the
/// profile knows of (those it added, and those the old home lists while it
/// still serves the account); `route.publish` of the new route at the old
/// home and at the new one. The old home becomes a former home of the
/// profile: status, retries and sync keep reading what it accepted. Run
/// again with the same URL it finishes a move that stopped half way; run on
/// another device's profile it follows the move that device made.
pub fn move_to(g: &Globals, to: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let to = relay_id(to)?;
    let mut c = g.client()?;
    let http = g.http();
    let old = c.profile.clone();
    let mut adopted = false;
    let (route, from, listed) = if old.relay == to {
        // Finishing an earlier move: the route stays, the old home is the latest former one.
        let Some(from) = old.former_homes.last() else {
            return Err(CliError::Usage(format!("{to} is already the home relay")));
        };
        (old.route()?, from.relay.clone(), None)
    } else if let Some(route) = moved_already(&http, &old, &to)? {
        // Another device of the account made this move: this profile follows it.
        adopted = true;
        (route, old.relay.clone(), None)
    } else {
        let account = old.account_key()?;
        let route = draft::route(
            &old.network,
            &account.id(),
            &to,
            old.route_revision()? + 1,
            now_ms(),
        )
        .sign(&account);
        // The old home still serves the account: it lists the devices to take along.
        let mut params = Object::new();
        params.insert("account", account.id().as_str());
        let listed = match c.call_object("device.list", &params) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!(
                    "warning: the devices at {} could not be listed ({e}); \
                     taking along only those this profile knows of",
                    old.relay
                );
                None
            }
        };
        (route, old.relay.clone(), listed)
    };
    let devices = known_devices(&old, listed.as_ref())?;
    let mut next = old.clone();
    next.relay = to.clone();
    next.route = text(&route);
    match register(&http, g.retry, &next) {
        Ok(_) => {}
        // The device that moved the account may have registered this one (without `manage`
        // it cannot register itself); the session at the new home will tell.
        Err(e) if adopted => eprintln!("warning: registering this device at {to}: {e}"),
        Err(e) => return Err(e),
    }
    let route_text = text(&route);
    c.update(|p| p.rehome(&to, route_text))?;
    let mut registered = vec![format!("{} (this device)", old.device_id()?)];
    let mut incomplete = false;
    for cert in devices.into_iter().skip(1) {
        let id = cert
            .get("device_id")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let mut params = Object::new();
        params.insert("certificate", cert);
        match c.call_object("device.register", &params) {
            Ok(_) => registered.push(id),
            // A newer certificate of that device is registered there already.
            Err(CliError::Relay(e)) if e.code == "state_conflict" => registered.push(id),
            Err(e) => {
                incomplete = true;
                eprintln!("warning: registering device {id} at {to}: {e}");
            }
        }
    }
    // The old home learns the move (from then on it answers only for what it accepted);
    // the new one holds the route already, publishing it there too is harmless.
    for at in [&from, &to] {
        if let Err(e) = publish(&http, g.retry, at, &route) {
            incomplete = true;
            eprintln!("warning: publishing the new route at {at}: {e}");
        }
    }
    whoami_of(&c.profile, out)?;
    let _ = writeln!(out, "devices  {}", registered.join(", "));
    if incomplete {
        eprintln!(
            "the move is not complete: run `relayctl account move --to {to}` again to finish it"
        );
    }
    Ok(())
}

/// Prints a contact card with a signed `contact_invite` (and our route and devices) for senders.
pub fn invite(
    g: &Globals,
    uses: Option<u64>,
    ttl: u64,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut c = g.client()?;
    let account = c.profile.account_key()?;
    let route = c.profile.route()?;
    let now = now_ms();
    let mut d = draft::invite(
        &c.profile.network,
        &random_id(&mut OsRng),
        &account.id(),
        now,
        now.saturating_add(ttl),
    )
    .set("route", route.clone());
    if let Some(n) = uses {
        d = d.set("max_uses", n);
    }
    let inv = d.sign(&account);
    let devices = own_certificates(&mut c)?;
    let card = card_object(&account.id(), route, devices, Some(inv));
    let _ = writeln!(out, "{}", text(&card));
    Ok(())
}

/// Prints a contact card with a `contact_grant` that lets `grantee` deliver to us.
pub fn grant(
    g: &Globals,
    grantee: &str,
    ttl: Option<u64>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let grantee = account_arg(grantee)?;
    let mut c = g.client()?;
    let account = c.profile.account_key()?;
    let route = c.profile.route()?;
    let now = now_ms();
    let mut d = draft::grant(
        &c.profile.network,
        &random_id(&mut OsRng),
        &account.id(),
        &grantee,
        now,
    )
    .set("route", route.clone());
    if let Some(t) = ttl {
        d = d.set("expires_at", now.saturating_add(t));
    }
    let gr = d.sign(&account);
    let devices = own_certificates(&mut c)?;
    let card = card_object(&account.id(), route, devices, Some(gr));
    let _ = writeln!(out, "{}", text(&card));
    Ok(())
}

fn own_certificates(c: &mut Client) -> Result<Vec<Object>, CliError> {
    use relay_core::wire::signature::SignedObject;
    Ok(directory::own_devices(c)?
        .iter()
        .map(|d| d.raw().clone())
        .collect())
}

fn account_arg(s: &str) -> Result<AccountId, CliError> {
    AccountId::parse(s).ok_or_else(|| CliError::Usage(format!("{s:?} is not an account id")))
}

/// What `send` asks for.
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// The recipient; may be left out when a card names it.
    pub to: Option<String>,
    /// A contact card or a bare invite/grant file.
    pub card: Option<PathBuf>,
    /// A relay to ask for the recipient's route (`route.get`).
    pub route_from: Option<String>,
    /// Fetch the recipient's devices even if some are cached.
    pub refresh: bool,
    /// How long to wait for a terminal status after `delivering`.
    pub wait: Duration,
    pub text: String,
}

/// Exit status of a printed DeliveryStatus: 0 unless it failed.
fn print_status(sent: &Sent, out: &mut dyn Write) -> u8 {
    if let Some(old) = &sent.replaced {
        eprintln!("message {old} was replaced by {}", sent.message_id);
    }
    let _ = writeln!(out, "{}", text(&sent.status));
    match status_of(&sent.status) {
        "failed" => 1,
        _ => 0,
    }
}

/// Sends a text message; prints its DeliveryStatus; the exit status.
pub fn send(g: &Globals, o: &SendOptions, out: &mut dyn Write) -> Result<u8, CliError> {
    let mut c = g.client()?;
    let mut to = o.to.as_deref().map(account_arg).transpose()?;
    if let Some(path) = &o.card {
        let bytes =
            std::fs::read(path).map_err(|e| CliError::Input(format!("{}: {e}", path.display())))?;
        let card = directory::parse_card(&bytes, &c.profile.network)?;
        if to.as_ref().is_some_and(|t| t != &card.account) {
            return Err(CliError::Usage(format!(
                "{} is from {}, not {}",
                path.display(),
                card.account,
                o.to.as_deref().unwrap_or("")
            )));
        }
        directory::learn(&mut c, &card)?;
        to = Some(card.account);
    }
    let to =
        to.ok_or_else(|| CliError::Usage("send needs --to ACCOUNT or --invite FILE".into()))?;
    if let Some(at) = &o.route_from {
        directory::fetch_route(&mut c, &to, &relay_id(at)?)?;
    }
    if o.refresh && to != c.profile.account_id()? {
        directory::refresh_devices(&mut c, &to)?;
    }
    let sent = send::send_text(&mut c, &to, &o.text, o.wait)?;
    Ok(print_status(&sent, out))
}

/// Re-sends a stored message unchanged to the relay it first went to; prints its status.
pub fn retry(
    g: &Globals,
    message_id: &str,
    wait: Duration,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let mut c = g.client()?;
    let sent = send::deliver(&mut c, message_id, wait)?;
    Ok(print_status(&sent, out))
}

/// Prints `message.delivery.status` of one of our messages.
pub fn status(g: &Globals, message_id: &str, out: &mut dyn Write) -> Result<u8, CliError> {
    let mut c = g.client()?;
    let s = send::status(&mut c, message_id)?;
    if send::error_code_of(&s) == Some("device_unknown") {
        eprintln!("the recipient has none of the devices it was encrypted for: `relayctl retry {message_id}` sends it anew");
    }
    Ok(print_status(
        &Sent {
            message_id: message_id.to_string(),
            status: s,
            replaced: None,
        },
        out,
    ))
}

/// Lists the outbox: `message_id  state  status  to[  replaced by ID]`.
pub fn outbox(g: &Globals, out: &mut dyn Write) -> Result<(), CliError> {
    let p = g.store().load()?;
    let mut rows: Vec<_> = p.outbox.iter().collect();
    rows.sort_by_key(|(_, e)| e.created_at);
    for (id, e) in rows {
        let st = e
            .status
            .as_deref()
            .and_then(|s| relay_core::wire::json::parse_object(s.as_bytes()).ok())
            .map(|s| status_of(&s).to_string())
            .unwrap_or_else(|| "-".into());
        let state = serde_json::to_string(&e.state).unwrap_or_default();
        let replaced = e
            .replaced_by
            .as_deref()
            .map(|r| format!("  replaced by {r}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{id}  {}  {st}  {}{replaced}",
            state.trim_matches('"'),
            e.to
        );
    }
    Ok(())
}

/// One-shot sync over HTTP; prints the entries.
pub fn sync(g: &Globals, from: Option<u64>, out: &mut dyn Write) -> Result<(), CliError> {
    let mut c = g.client()?;
    timeline::sync(&mut c, from, out)?;
    Ok(())
}

/// Follows the timeline over WebSocket.
pub fn follow(
    g: &Globals,
    from: Option<u64>,
    count: Option<usize>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut c = g.client()?;
    timeline::follow(&mut c, from, count, out)
}

/// Lists an account's valid devices (`device.list`, default our own).
pub fn device_list(
    g: &Globals,
    account: Option<&str>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut c = g.client()?;
    let account = match account {
        Some(a) => account_arg(a)?,
        None => c.profile.account_id()?,
    };
    let mut p = Object::new();
    p.insert("account", account.as_str());
    let r = c.call_object("device.list", &p)?;
    if let Some(Value::Array(list)) = r.get("devices") {
        for d in list.iter().filter_map(Value::as_object) {
            match directory::verify_certificate(d.clone(), &c.profile.network, &account) {
                Ok(cert) => {
                    let perms = cert.permissions;
                    let names: Vec<&str> = [
                        ("send", perms.send),
                        ("sync", perms.sync),
                        ("manage", perms.manage),
                    ]
                    .iter()
                    .filter(|(_, on)| *on)
                    .map(|(n, _)| *n)
                    .collect();
                    let _ = writeln!(out, "{}  active  {}", cert.device_id, names.join(","));
                }
                Err(e) => {
                    let _ = writeln!(out, "UNVERIFIED device: {e}");
                }
            }
        }
    }
    if let Some(Value::Array(list)) = r.get("revoked") {
        for d in list.iter().filter_map(Value::as_str) {
            let _ = writeln!(out, "{d}  revoked");
        }
    }
    Ok(())
}

/// Adds a device to the account (`device.register`) and writes its own profile at `path`.
pub fn device_add(
    g: &Globals,
    path: PathBuf,
    permissions: &[String],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut c = g.client()?;
    let target = Store::new(Some(path));
    if target.exists() {
        return Err(CliError::Usage(format!(
            "{} already exists",
            target.path().display()
        )));
    }
    let account = c.profile.account_key()?;
    let device = DeviceKey::generate(&mut OsRng);
    let perms: Vec<&str> = permissions.iter().map(String::as_str).collect();
    let cert =
        draft::certificate(&c.profile.network, &account, &device, &perms, now_ms()).sign(&account);
    let (signing, boxk) = device.seeds();
    let mut p = c.profile.clone();
    p.device_signing_key = base64url::encode(&signing);
    p.device_box_key = base64url::encode(&boxk);
    p.certificate = text(&cert);
    p.registered = false;
    p.session = None;
    p.cursor = 0;
    p.outbox = Default::default();
    // The new device knows the one that added it (and what that one knew), so either can
    // take the other along when the account moves.
    p.devices.push(c.profile.certificate.clone());
    // It is registered at the current home only: a former home has no records for it.
    p.former_homes = Vec::new();
    target.create(&p)?;
    let cert_text = text(&cert);
    let mut params = Object::new();
    params.insert("certificate", cert);
    c.call_object("device.register", &params)?;
    c.update(|p| p.devices.push(cert_text))?;
    let (_, p) = target.update(|p| p.registered = true)?;
    whoami_of(&p, out)
}

/// Revokes a device of the account for good (`device.revoke`, signed by the account key).
pub fn device_revoke(g: &Globals, device_id: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let mut c = g.client()?;
    let device = relay_core::wire::identity::DeviceId::parse(device_id)
        .ok_or_else(|| CliError::Usage(format!("{device_id:?} is not a device id")))?;
    let account = c.profile.account_key()?;
    let rev =
        draft::revocation(&c.profile.network, &account.id(), &device, now_ms()).sign(&account);
    let r = c.call_object("device.revoke", &rev)?;
    // A revoked device is never taken along to a new home.
    c.update(|p| {
        p.devices.retain(|d| {
            crate::profile::object(d, "device")
                .ok()
                .and_then(|o| {
                    o.get("device_id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .is_none_or(|id| id != device.as_str())
        })
    })?;
    let _ = writeln!(
        out,
        "revoked {}",
        r.get("device_id")
            .and_then(Value::as_str)
            .unwrap_or(device_id)
    );
    Ok(())
}
