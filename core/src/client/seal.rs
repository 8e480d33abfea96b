//! Reference client encryption: message bodies and key boxes.
//!
//! A message key (32 random bytes) encrypts the body with
//! XChaCha20-Poly1305. Each key box seals that key to one device's X25519
//! box key: an ephemeral key pair (`enc`), HKDF-SHA256 over the shared
//! secret with salt `enc || box_key` and info `relay-v1:key_box`, giving the
//! AEAD key and nonce; the device id is the associated data, so a box cannot
//! be relabelled for another device. The relay never runs any of this.

use super::keys::DeviceKey;
use crate::wire::base64url;
use crate::wire::field::Fields;
use crate::wire::identity::DeviceId;
use crate::wire::json::{Object, Value};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use rand_core::CryptoRngCore;
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

/// The body algorithm name of the reference client.
pub const BODY_ALG: &str = "xchacha20poly1305";
const BOX_INFO: &[u8] = b"relay-v1:key_box";

/// A fresh random message key.
pub fn message_key(rng: &mut impl CryptoRngCore) -> [u8; 32] {
    let mut k = [0u8; 32];
    rng.fill_bytes(&mut k);
    k
}

/// Encrypts `plaintext` under `key` as a body object `{alg, nonce, ciphertext}`.
pub fn seal_body(rng: &mut impl CryptoRngCore, key: &[u8; 32], plaintext: &[u8]) -> Object {
    let mut nonce = [0u8; 24];
    rng.fill_bytes(&mut nonce);
    let ct = XChaCha20Poly1305::new(key.into())
        .encrypt(XNonce::from_slice(&nonce), plaintext)
        .unwrap_or_default();
    let mut o = Object::new();
    o.insert("alg", BODY_ALG);
    o.insert("nonce", base64url::encode(&nonce));
    o.insert("ciphertext", base64url::encode(&ct));
    o
}

/// Decrypts a body object; `None` if it is not the reference format or does not authenticate.
pub fn open_body(body: &Object, key: &[u8; 32]) -> Option<Vec<u8>> {
    let f = Fields::new(body);
    if f.str("alg").ok()? != BODY_ALG {
        return None;
    }
    let nonce = f.fixed::<24>("nonce").ok()?;
    let ct = base64url::decode(f.str("ciphertext").ok()?)?;
    XChaCha20Poly1305::new(key.into())
        .decrypt(XNonce::from_slice(&nonce), ct.as_slice())
        .ok()
}

fn box_cipher(
    shared: &[u8; 32],
    enc: &[u8; 32],
    box_key: &[u8; 32],
) -> (XChaCha20Poly1305, [u8; 24]) {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(enc);
    salt[32..].copy_from_slice(box_key);
    let hk = Hkdf::<Sha256>::new(Some(&salt), shared);
    let mut okm = [0u8; 56];
    // 56 bytes is far below HKDF-SHA256's 8160-byte limit.
    let _ = hk.expand(BOX_INFO, &mut okm);
    let mut nonce = [0u8; 24];
    nonce.copy_from_slice(&okm[32..]);
    let key: [u8; 32] = okm[..32].try_into().unwrap_or([0; 32]);
    (XChaCha20Poly1305::new(&key.into()), nonce)
}

/// Seals `message_key` to the device `device_id` whose box key is `box_key`.
pub fn seal_key_box(
    rng: &mut impl CryptoRngCore,
    device_id: &DeviceId,
    box_key: &[u8; 32],
    message_key: &[u8; 32],
) -> Object {
    let mut seed = [0u8; 32];
    rng.fill_bytes(&mut seed);
    let eph = StaticSecret::from(seed);
    let enc = PublicKey::from(&eph).to_bytes();
    let shared = eph.diffie_hellman(&PublicKey::from(*box_key)).to_bytes();
    let (cipher, nonce) = box_cipher(&shared, &enc, box_key);
    let ct = cipher
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: message_key,
                aad: device_id.as_str().as_bytes(),
            },
        )
        .unwrap_or_default();
    let mut o = Object::new();
    o.insert("device_id", device_id.as_str());
    o.insert("enc", base64url::encode(&enc));
    o.insert("ciphertext", base64url::encode(&ct));
    o
}

/// Opens a key box addressed to `device`; `None` if it is not for it or does not authenticate.
pub fn open_key_box(key_box: &Object, device: &DeviceKey) -> Option<[u8; 32]> {
    let f = Fields::new(key_box);
    let device_id = f.device_id("device_id").ok()?;
    if device_id != device.id() {
        return None;
    }
    let enc = f.fixed::<32>("enc").ok()?;
    let ct = base64url::decode(f.str("ciphertext").ok()?)?;
    let shared = device.box_agree(&enc)?;
    let (cipher, nonce) = box_cipher(&shared, &enc, &device.box_key());
    let pt = cipher
        .decrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: &ct,
                aad: device_id.as_str().as_bytes(),
            },
        )
        .ok()?;
    pt.try_into().ok()
}

/// A key-box list as a JSON array value.
pub fn boxes(items: Vec<Object>) -> Value {
    Value::Array(items.into_iter().map(Value::Object).collect())
}
