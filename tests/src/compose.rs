//! message.send params as a client builds them: a signed envelope, the body sealed under a
//! fresh message key, and one key box per chosen device. Shared by the in-process world
//! and the clients that drive real relays, so both send the same shapes.

use crate::{Msg, NET};
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::wire::identity::AccountId;
use relay_core::wire::json::Object;

/// The sending side of a message: the account key and the device that signs.
pub struct Sender<'a> {
    pub key: &'a AccountKey,
    pub devices: &'a [DeviceKey],
    pub device: usize,
}

/// Builds message.send params carrying `text` (sealed, and in clear as the body's `x-test`).
pub fn message(
    rng: &mut ChaCha20Rng,
    from: Sender<'_>,
    to: &AccountId,
    to_devices: &[DeviceKey],
    text: &str,
    created_at: u64,
    m: &Msg,
) -> Object {
    message_on(NET, rng, from, to, to_devices, text, created_at, m)
}

/// [`message`] with its envelope signed for `network`.
#[allow(clippy::too_many_arguments)]
pub fn message_on(
    network: &str,
    rng: &mut ChaCha20Rng,
    from: Sender<'_>,
    to: &AccountId,
    to_devices: &[DeviceKey],
    text: &str,
    created_at: u64,
    m: &Msg,
) -> Object {
    let key = seal::message_key(rng);
    let mut body = seal::seal_body(rng, &key, text.as_bytes());
    body.insert("x-test", text);
    let id = m.message_id.clone().unwrap_or_else(|| random_id(rng));
    let signer = &from.devices[from.device];
    let mut env = draft::envelope(
        network,
        &id,
        &from.key.id(),
        &signer.id(),
        to,
        created_at,
        body,
    );
    if let Some(t) = m.body_expires_at {
        env = env.set("body_expires_at", t);
    }
    let env = env.sign(signer);
    let picks: Vec<usize> = m
        .to_devices
        .clone()
        .unwrap_or_else(|| (0..to_devices.len()).collect());
    let boxes: Vec<Object> = picks
        .iter()
        .map(|&i| seal::seal_key_box(rng, &to_devices[i].id(), &to_devices[i].box_key(), &key))
        .collect();
    let mut p = Object::new();
    p.insert("envelope", env);
    p.insert("recipient_boxes", seal::boxes(boxes));
    if m.sender_boxes {
        let boxes: Vec<Object> = from
            .devices
            .iter()
            .map(|d| seal::seal_key_box(rng, &d.id(), &d.box_key(), &key))
            .collect();
        p.insert("sender_boxes", seal::boxes(boxes));
    }
    if let Some(a) = &m.authorization {
        p.insert("authorization", a.clone());
    }
    if let Some(r) = &m.recipient_route {
        p.insert("recipient_route", r.clone());
    }
    p
}
