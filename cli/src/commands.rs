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
    let mut params = Object::new();
    params.insert("route", p.route()?);
    let body = canonical::object_to_vec(&params);
    let http = g.http();
    let r = idempotent(g.retry, || http.call(&at, "route.publish", None, &body))?;
    let rev = r
        .get("revision")
        .and_then(Value::as_protocol_int)
        .unwrap_or(0);
    let _ = writeln!(out, "{at} holds route revision {rev}");
    Ok(())
}

/// Moves the account home to another relay: route revision + 1, registered there, published at the old one.
pub fn move_to(g: &Globals, relay: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let store = g.store();
    let old = store.load()?;
    let relay = relay_id(relay)?;
    let account = old.account_key()?;
    let route = draft::route(
        &old.network,
        &account.id(),
        &relay,
        old.route_revision()? + 1,
        now_ms(),
    )
    .sign(&account);
    let mut next = old.clone();
    next.relay = relay.clone();
    next.route = text(&route);
    let http = g.http();
    register(&http, g.retry, &next)?;
    let (_, p) = store.update(|p| {
        p.relay = relay.clone();
        p.route = text(&route);
        p.session = None;
        // The new home's timeline is a new sequence.
        p.cursor = 0;
    })?;
    // Tell the old home, so it redirects deliveries; it is no harm if it is unreachable.
    let mut params = Object::new();
    params.insert("route", route);
    if let Err(e) = http.call(
        &old.relay,
        "route.publish",
        None,
        &canonical::object_to_vec(&params),
    ) {
        eprintln!("warning: publishing the new route at {}: {e:?}", old.relay);
    }
    whoami_of(&p, out)
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
    target.create(&p)?;
    let mut params = Object::new();
    params.insert("certificate", cert);
    c.call_object("device.register", &params)?;
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
    let _ = writeln!(
        out,
        "revoked {}",
        r.get("device_id")
            .and_then(Value::as_str)
            .unwrap_or(device_id)
    );
    Ok(())
}
