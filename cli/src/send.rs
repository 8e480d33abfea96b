//! Sending a text message: encrypt, sign, keep in the outbox, submit under the seed's rules.
//!
//! The one case where relayctl makes a *new* message on its own is the
//! seed's: an explicit `device_unknown` (a rejection before acceptance, or a
//! delivery that ended `failed` with it, which the destination's explicit
//! rejection is). Then the recipient's devices are refreshed and a new
//! envelope, new key boxes and a new message id are made, once. A timeout or
//! lost answer never leads to a new id: only to `relayctl retry`.

use crate::client::{now_ms, Client};
use crate::directory;
use crate::error::CliError;
use crate::outbox::{self, OutboxEntry, State};
use rand::rngs::OsRng;
use relay_core::client::{draft, random_id, seal};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::identity::AccountId;
use relay_core::wire::json::{Object, Value};
use std::time::{Duration, Instant};

/// The relay's default `max_boxes` (protocol.md §7).
const MAX_BOXES: usize = 64;

/// What a send ended with.
#[derive(Clone, Debug)]
pub struct Sent {
    pub message_id: String,
    /// The latest DeliveryStatus.
    pub status: Object,
    /// The message id this one replaced after `device_unknown`.
    pub replaced: Option<String>,
}

/// The `status` member of a DeliveryStatus.
pub fn status_of(status: &Object) -> &str {
    status.get("status").and_then(Value::as_str).unwrap_or("")
}

/// The `error.code` of a failed DeliveryStatus.
pub fn error_code_of(status: &Object) -> Option<&str> {
    status
        .get("error")
        .and_then(Value::as_object)
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
}

fn boxes_for(devices: &[DeviceCertificate], key: &[u8; 32]) -> Result<Value, CliError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for d in devices {
        if seen.insert(d.device_id.as_str().to_string()) {
            out.push(seal::seal_key_box(
                &mut OsRng,
                &d.device_id,
                &d.box_key,
                key,
            ));
        }
    }
    if out.is_empty() {
        return Err(CliError::Input("no devices to encrypt for".into()));
    }
    if out.len() > MAX_BOXES {
        return Err(CliError::Input(format!(
            "{} devices: more key boxes than a relay takes ({MAX_BOXES})",
            out.len()
        )));
    }
    Ok(seal::boxes(out))
}

/// Builds `message.send` params: the body sealed under a fresh key, boxed for each device.
pub fn compose(
    client: &Client,
    to: &AccountId,
    text: &str,
    recipients: &[DeviceCertificate],
    own: &[DeviceCertificate],
) -> Result<(String, Object), CliError> {
    let p = &client.profile;
    let me = p.account_id()?;
    let device = p.device_key()?;
    let key = seal::message_key(&mut OsRng);
    let body = seal::seal_body(&mut OsRng, &key, text.as_bytes());
    let message_id = random_id(&mut OsRng);
    let envelope = draft::envelope(
        &p.network,
        &message_id,
        &me,
        &device.id(),
        to,
        now_ms(),
        body,
    )
    .sign(&device);
    let mut params = Object::new();
    params.insert("envelope", envelope);
    if to == &me {
        // Self-delivery: one record with boxes for our devices; nothing else is allowed.
        params.insert("recipient_boxes", boxes_for(own, &key)?);
    } else {
        params.insert("recipient_boxes", boxes_for(recipients, &key)?);
        params.insert("sender_boxes", boxes_for(own, &key)?);
        if let Some(a) = directory::authorization(client, to)? {
            params.insert("authorization", a);
        }
        if let Some(r) = directory::route(client, to)? {
            params.insert("recipient_route", r);
        }
    }
    Ok((message_id, params))
}

/// The relay that accepted `message_id` (the outbox's record), else the current home.
pub fn accepting_relay(client: &Client, message_id: &str) -> String {
    let home = client.profile.relay.as_str();
    client
        .profile
        .outbox
        .get(message_id)
        .map_or(home, |e| e.relay_or(home))
        .to_string()
}

/// `message.delivery.status` for one of our messages, asked of the relay that accepted it
/// (a former home after a move, with a session opened there); recorded in the outbox.
pub fn status(client: &mut Client, message_id: &str) -> Result<Object, CliError> {
    let mut p = Object::new();
    p.insert("message_id", message_id);
    let relay = accepting_relay(client, message_id);
    let s = client.call_at(
        &relay,
        "message.delivery.status",
        &canonical::object_to_vec(&p),
    )?;
    outbox::record_status(client, message_id, &s)?;
    Ok(s)
}

/// Polls the status while it is `delivering`, for at most `wait`.
fn settle(
    client: &mut Client,
    message_id: &str,
    mut s: Object,
    wait: Duration,
) -> Result<Object, CliError> {
    let until = Instant::now() + wait;
    let mut pause = Duration::from_millis(100);
    while status_of(&s) == "delivering" && Instant::now() < until {
        std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_secs(1));
        s = status(client, message_id)?;
    }
    Ok(s)
}

fn recipients(
    client: &mut Client,
    to: &AccountId,
    refresh: bool,
) -> Result<(Vec<DeviceCertificate>, Vec<DeviceCertificate>), CliError> {
    let own = directory::own_devices(client)?;
    if to == &client.profile.account_id()? {
        return Ok((own.clone(), own));
    }
    Ok((directory::devices(client, to, refresh)?, own))
}

fn new_message(
    client: &mut Client,
    to: &AccountId,
    text: &str,
    refresh: bool,
) -> Result<String, CliError> {
    let (devices, own) = recipients(client, to, refresh)?;
    let (id, params) = compose(client, to, text, &devices, &own)?;
    let entry = OutboxEntry {
        to: to.as_str().to_string(),
        relay: client.profile.relay.clone(),
        body: String::from_utf8_lossy(&canonical::object_to_vec(&params)).into_owned(),
        text: text.to_string(),
        created_at: now_ms(),
        state: State::Pending,
        status: None,
        error: None,
        replaced_by: None,
    };
    outbox::store(client, &id, entry)?;
    Ok(id)
}

/// Whether a result is the seed's `device_unknown` case (an explicit, known rejection).
fn device_unknown(r: &Result<Object, CliError>) -> bool {
    match r {
        Ok(s) => status_of(s) == "failed" && error_code_of(s) == Some("device_unknown"),
        Err(CliError::Relay(e)) => e.code == "device_unknown",
        Err(_) => false,
    }
}

/// Submits the stored message `message_id`; on `device_unknown` makes one replacement.
pub fn deliver(client: &mut Client, message_id: &str, wait: Duration) -> Result<Sent, CliError> {
    let r = outbox::transmit(client, message_id).and_then(|s| settle(client, message_id, s, wait));
    if !device_unknown(&r) {
        return r.map(|status| Sent {
            message_id: message_id.to_string(),
            status,
            replaced: None,
        });
    }
    let entry = client.profile.sent(message_id)?;
    if let Some(newer) = &entry.replaced_by {
        // Already answered once with a new message: never a second replacement.
        return Err(CliError::Input(format!(
            "message {message_id} failed with device_unknown and was replaced by {newer}"
        )));
    }
    let to = AccountId::parse(&entry.to)
        .ok_or_else(|| CliError::Profile(format!("outbox {message_id}: bad recipient")))?;
    eprintln!("device_unknown for {message_id}: refreshing the recipient's devices and sending a new message");
    let new_id = new_message(client, &to, &entry.text, true)?;
    let replaced = new_id.clone();
    client.update(|p| {
        if let Some(e) = p.outbox.get_mut(message_id) {
            e.replaced_by = Some(replaced);
        }
    })?;
    let status =
        outbox::transmit(client, &new_id).and_then(|s| settle(client, &new_id, s, wait))?;
    Ok(Sent {
        message_id: new_id,
        status,
        replaced: Some(message_id.to_string()),
    })
}

/// Sends `text` to `to`: a new message, kept in the outbox, submitted by [`deliver`].
pub fn send_text(
    client: &mut Client,
    to: &AccountId,
    text: &str,
    wait: Duration,
) -> Result<Sent, CliError> {
    let id = new_message(client, to, text, false)?;
    deliver(client, &id, wait)
}
