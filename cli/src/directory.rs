//! What a sender knows of a recipient: its route, device certificates and authorization.
//!
//! A sender learns these from a *contact card* the recipient hands over
//! (`relayctl invite` / `relayctl grant` print one), from `route.get` at any
//! relay, and from `device.list` at the recipient's home relay. `device.list`
//! needs a session at that relay, so a sender on another relay depends on
//! the card for the certificates. Everything learned is verified before it
//! is kept: certificates and routes are signed by the account key that is
//! the account id, so any channel may carry them.

use crate::client::{now_ms, Client};
use crate::error::{CallError, CliError};
use crate::profile::{object, Contact};
use relay_core::wire::authorization::Authorization;
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::identity::AccountId;
use relay_core::wire::json::{self, Object, Value};
use relay_core::wire::route::Route;
use relay_core::wire::signature::SignedObject;

/// The `type` of a contact card (a relayctl file format, not a protocol object).
pub const CARD_TYPE: &str = "relayctl_contact";

/// The default clock tolerance (protocol.md §7), for checks made on the client.
pub const CLOCK_TOLERANCE: u64 = 300_000;

/// A verified contact card.
#[derive(Clone, Debug)]
pub struct Card {
    pub account: AccountId,
    pub route: Option<Route>,
    pub devices: Vec<DeviceCertificate>,
    pub authorization: Option<Authorization>,
}

fn text(o: &Object) -> String {
    String::from_utf8_lossy(&canonical::object_to_vec(o)).into_owned()
}

/// Builds a card object: `{type, account, route, devices, authorization?}`.
pub fn card_object(
    account: &AccountId,
    route: Object,
    devices: Vec<Object>,
    authorization: Option<Object>,
) -> Object {
    let mut o = Object::new();
    o.insert("type", CARD_TYPE);
    o.insert("account", account.as_str());
    o.insert("route", route);
    o.insert(
        "devices",
        Value::Array(devices.into_iter().map(Value::Object).collect()),
    );
    if let Some(a) = authorization {
        o.insert("authorization", a);
    }
    o
}

/// Verifies a route of `account` on `network`.
pub fn verify_route(
    o: Object,
    network: &str,
    account: Option<&AccountId>,
) -> Result<Route, CliError> {
    let r = Route::parse(o).map_err(|e| CliError::Invalid(format!("route: {e}")))?;
    r.verify(network)
        .map_err(|e| CliError::Invalid(format!("route: {e}")))?;
    if account.is_some_and(|a| a != &r.account) {
        return Err(CliError::Invalid("route is for another account".into()));
    }
    Ok(r)
}

/// Verifies a device certificate of `account` on `network` (signature and identity binding).
pub fn verify_certificate(
    o: Object,
    network: &str,
    account: &AccountId,
) -> Result<DeviceCertificate, CliError> {
    let c =
        DeviceCertificate::parse(o).map_err(|e| CliError::Invalid(format!("certificate: {e}")))?;
    c.verify(network)
        .map_err(|e| CliError::Invalid(format!("certificate: {e}")))?;
    if &c.account != account {
        return Err(CliError::Invalid(
            "certificate is for another account".into(),
        ));
    }
    Ok(c)
}

/// Reads a card, or a bare `contact_invite` / `contact_grant`, and verifies what it holds.
pub fn parse_card(bytes: &[u8], network: &str) -> Result<Card, CliError> {
    let o = json::parse_object(bytes).map_err(|e| CliError::Input(format!("contact card: {e}")))?;
    let (auth, route, devices) = match o.get("type").and_then(Value::as_str) {
        Some(CARD_TYPE) => (
            o.get("authorization").and_then(Value::as_object).cloned(),
            o.get("route").and_then(Value::as_object).cloned(),
            match o.get("devices") {
                Some(Value::Array(a)) => a.clone(),
                _ => Vec::new(),
            },
        ),
        Some("contact_invite" | "contact_grant") => (Some(o.clone()), None, Vec::new()),
        _ => {
            return Err(CliError::Input(
                "expected a relayctl contact card, a contact_invite or a contact_grant".into(),
            ))
        }
    };
    let authorization = match auth {
        Some(a) => {
            let a = Authorization::parse(a)
                .map_err(|e| CliError::Invalid(format!("authorization: {e}")))?;
            let sig = match &a {
                Authorization::Grant(g) => g.verify_signature(g.grantor.key()),
                Authorization::Invite(i) => i.verify_signature(i.issuer.key()),
            };
            sig.map_err(|e| CliError::Invalid(format!("authorization: {e}")))?;
            Some(a)
        }
        None => None,
    };
    let account = match (&authorization, o.get("account").and_then(Value::as_str)) {
        (Some(a), _) => a.issuer().clone(),
        (None, Some(s)) => AccountId::parse(s)
            .ok_or_else(|| CliError::Invalid("card account is not an account id".into()))?,
        (None, None) => return Err(CliError::Invalid("card names no account".into())),
    };
    let embedded = match &authorization {
        Some(Authorization::Grant(g)) => g.route.clone(),
        Some(Authorization::Invite(i)) => i.route.clone(),
        None => None,
    };
    let mut best = match embedded {
        Some(r) => Some(verify_route(r.raw().clone(), network, Some(&account))?),
        None => None,
    };
    if let Some(r) = route {
        let r = verify_route(r, network, Some(&account))?;
        if best.as_ref().is_none_or(|b| r.revision > b.revision) {
            best = Some(r);
        }
    }
    let mut certs = Vec::new();
    for (i, d) in devices.into_iter().enumerate() {
        let d = d
            .as_object()
            .cloned()
            .ok_or_else(|| CliError::Invalid(format!("devices[{i}] is not an object")))?;
        certs.push(verify_certificate(d, network, &account)?);
    }
    Ok(Card {
        account,
        route: best,
        devices: certs,
        authorization,
    })
}

/// Keeps what a card says in the profile's contacts (a route only if of higher revision).
pub fn learn(client: &mut Client, card: &Card) -> Result<(), CliError> {
    let route = card.route.as_ref().map(|r| (r.revision, text(r.raw())));
    let devices: Vec<String> = card.devices.iter().map(|c| text(c.raw())).collect();
    let auth = card.authorization.as_ref().map(|a| text(a.raw()));
    let account = card.account.as_str().to_string();
    client.update(move |p| {
        let c = p.contacts.entry(account).or_default();
        if let Some((rev, r)) = route {
            if stored_revision(c).is_none_or(|held| rev > held) {
                c.route = Some(r);
            }
        }
        if !devices.is_empty() {
            c.devices = devices;
        }
        if auth.is_some() {
            c.authorization = auth;
        }
    })
}

fn stored_revision(c: &Contact) -> Option<u64> {
    let r = c.route.as_deref()?;
    json::parse_object(r.as_bytes())
        .ok()?
        .get("revision")
        .and_then(Value::as_protocol_int)
}

/// `route.get` for `account` at `relay` (anyone may ask); keeps the route if it is newer.
pub fn fetch_route(
    client: &mut Client,
    account: &AccountId,
    relay: &str,
) -> Result<Route, CliError> {
    let mut p = Object::new();
    p.insert("account", account.as_str());
    let r = client
        .http
        .call(relay, "route.get", None, &canonical::object_to_vec(&p))?;
    let route = r
        .get("route")
        .and_then(Value::as_object)
        .cloned()
        .ok_or_else(|| CliError::Invalid("route.get answered without a route".into()))?;
    let route = verify_route(route, &client.profile.network, Some(account))?;
    learn(
        client,
        &Card {
            account: account.clone(),
            route: Some(route.clone()),
            devices: Vec::new(),
            authorization: None,
        },
    )?;
    Ok(route)
}

/// The relay that serves `account`, as far as this device knows.
pub fn home_of(client: &Client, account: &AccountId) -> Result<String, CliError> {
    if account.as_str() == client.profile.account_id()?.as_str() {
        return Ok(client.profile.relay.clone());
    }
    match client
        .profile
        .contacts
        .get(account.as_str())
        .and_then(|c| c.route.as_deref())
    {
        Some(r) => Ok(verify_route(
            object(r, "contact route")?,
            &client.profile.network,
            Some(account),
        )?
        .relay
        .as_str()
        .to_string()),
        // No route known: the only relay we can ask is our own.
        None => Ok(client.profile.relay.clone()),
    }
}

/// Asks the home relay for `account`'s valid devices (`device.list`) and keeps them.
///
/// Possible only when the account is served by our own relay, where this
/// device has a session; otherwise the devices must come from a fresh card.
pub fn refresh_devices(
    client: &mut Client,
    account: &AccountId,
) -> Result<Vec<DeviceCertificate>, CliError> {
    let home = home_of(client, account)?;
    if home != client.profile.relay {
        return Err(CliError::Input(format!(
            "the devices of {account} are listed only by its home relay {home}, where this \
             device has no session; ask them for a fresh contact card (`relayctl invite`) \
             and pass it with --invite"
        )));
    }
    let mut p = Object::new();
    p.insert("account", account.as_str());
    let r = match client.call_object("device.list", &p) {
        Err(CliError::Relay(e)) if e.code == "not_home_relay" => {
            return Err(CliError::Relay(e));
        }
        other => other?,
    };
    let mut certs = Vec::new();
    if let Some(Value::Array(list)) = r.get("devices") {
        for d in list {
            if let Some(o) = d.as_object() {
                // A certificate that does not verify is skipped, never used to encrypt.
                match verify_certificate(o.clone(), &client.profile.network, account) {
                    Ok(c) if c.check_current(now_ms(), CLOCK_TOLERANCE).is_ok() => certs.push(c),
                    Ok(_) => {}
                    Err(e) => eprintln!("warning: skipping a device of {account}: {e}"),
                }
            }
        }
    }
    let devices: Vec<String> = certs.iter().map(|c| text(c.raw())).collect();
    let key = account.as_str().to_string();
    client.update(move |p| p.contacts.entry(key).or_default().devices = devices)?;
    Ok(certs)
}

/// `account`'s devices: the cached list, or a fresh one when there is none or `refresh` is set.
pub fn devices(
    client: &mut Client,
    account: &AccountId,
    refresh: bool,
) -> Result<Vec<DeviceCertificate>, CliError> {
    if !refresh {
        let cached = client
            .profile
            .contacts
            .get(account.as_str())
            .map(|c| c.devices.clone())
            .unwrap_or_default();
        if !cached.is_empty() {
            let mut out = Vec::new();
            for d in &cached {
                out.push(verify_certificate(
                    object(d, "contact device")?,
                    &client.profile.network,
                    account,
                )?);
            }
            return Ok(out);
        }
    }
    refresh_devices(client, account)
}

/// `device.list` for our own account (for sender boxes); falls back to this device alone.
pub fn own_devices(client: &mut Client) -> Result<Vec<DeviceCertificate>, CliError> {
    let me = client.profile.account_id()?;
    let mut p = Object::new();
    p.insert("account", me.as_str());
    let mut certs = Vec::new();
    match client.call("device.list", &canonical::object_to_vec(&p)) {
        Ok(r) => {
            if let Some(Value::Array(list)) = r.get("devices") {
                for d in list.iter().filter_map(Value::as_object) {
                    if let Ok(c) = verify_certificate(d.clone(), &client.profile.network, &me) {
                        certs.push(c);
                    }
                }
            }
        }
        Err(CallError::Relay(e)) => return Err(CliError::Relay(e)),
        Err(CallError::Transport(t)) => return Err(CliError::Transport(t)),
    }
    let mine = client.profile.device_id()?;
    if !certs.iter().any(|c| c.device_id == mine) {
        certs.push(verify_certificate(
            client.profile.certificate()?,
            &client.profile.network,
            &me,
        )?);
    }
    Ok(certs)
}

/// The authorization kept for `account`, if any.
pub fn authorization(client: &Client, account: &AccountId) -> Result<Option<Object>, CliError> {
    match client
        .profile
        .contacts
        .get(account.as_str())
        .and_then(|c| c.authorization.as_deref())
    {
        Some(a) => Ok(Some(object(a, "contact authorization")?)),
        None => Ok(None),
    }
}

/// The route kept for `account`, if any.
pub fn route(client: &Client, account: &AccountId) -> Result<Option<Object>, CliError> {
    match client
        .profile
        .contacts
        .get(account.as_str())
        .and_then(|c| c.route.as_deref())
    {
        Some(r) => Ok(Some(object(r, "contact route")?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use relay_core::client::{draft, random_id, AccountKey, DeviceKey};

    fn card_bytes(tamper: impl FnOnce(&mut Object)) -> (AccountKey, Vec<u8>) {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let bob = AccountKey::generate(&mut rng);
        let dev = DeviceKey::generate(&mut rng);
        let route = draft::route("dev", &bob.id(), "http://127.0.0.1:9", 2, 1_000).sign(&bob);
        let cert = draft::certificate("dev", &bob, &dev, &["send", "sync"], 1_000).sign(&bob);
        let inv = draft::invite("dev", &random_id(&mut rng), &bob.id(), 1_000, 5_000)
            .set("route", route.clone())
            .sign(&bob);
        let mut card = card_object(&bob.id(), route, vec![cert], Some(inv));
        tamper(&mut card);
        (bob, canonical::object_to_vec(&card))
    }

    #[test]
    fn a_card_yields_the_verified_route_devices_and_invite() {
        let (bob, bytes) = card_bytes(|_| {});
        let c = parse_card(&bytes, "dev").unwrap();
        assert_eq!(c.account, bob.id());
        assert_eq!(c.route.unwrap().revision, 2);
        assert_eq!(c.devices.len(), 1);
        assert!(matches!(c.authorization, Some(Authorization::Invite(_))));
        // Another network is refused.
        assert!(parse_card(&bytes, "main").is_err());
    }

    #[test]
    fn a_card_with_a_foreign_or_tampered_part_is_refused() {
        // A device certificate of someone else's account.
        let (_, bytes) = card_bytes(|card| {
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(4);
            let eve = AccountKey::generate(&mut rng);
            let dev = DeviceKey::generate(&mut rng);
            let cert = draft::certificate("dev", &eve, &dev, &["send"], 1_000).sign(&eve);
            card.insert("devices", Value::Array(vec![Value::Object(cert)]));
        });
        assert!(parse_card(&bytes, "dev").is_err());
        // A route redirected to another relay without the account's signature.
        let (_, bytes) = card_bytes(|card| {
            let mut r = card
                .get("route")
                .and_then(Value::as_object)
                .cloned()
                .unwrap();
            r.insert("relay", "http://127.0.0.1:10");
            card.insert("route", r);
        });
        assert!(parse_card(&bytes, "dev").is_err());
        // An invite whose signature does not cover its content.
        let (_, bytes) = card_bytes(|card| {
            let mut a = card
                .get("authorization")
                .and_then(Value::as_object)
                .cloned()
                .unwrap();
            a.insert("expires_at", 6_000u64);
            card.insert("authorization", a);
        });
        assert!(parse_card(&bytes, "dev").is_err());
    }
}
