//! Account and device key pairs held by clients.

use crate::wire::identity::{AccountId, DeviceId};
use ed25519_dalek::{Signer as _, SigningKey};
use rand_core::CryptoRngCore;
use x25519_dalek::{PublicKey, StaticSecret};

/// Anything that signs by the protocol's signing rule: an account or a device key.
pub trait Signer {
    /// An Ed25519 signature of `msg`.
    fn sign_bytes(&self, msg: &[u8]) -> [u8; 64];
    /// The Ed25519 public key.
    fn public_key(&self) -> [u8; 32];
}

/// An account key pair; the public key is the account id.
#[derive(Clone)]
pub struct AccountKey {
    signing: SigningKey,
}

impl AccountKey {
    /// A fresh random account key.
    pub fn generate(rng: &mut impl CryptoRngCore) -> AccountKey {
        AccountKey {
            signing: SigningKey::generate(rng),
        }
    }

    /// The account key with this 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> AccountKey {
        AccountKey {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The seed, for saving the key in a profile.
    pub fn seed(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// The account id.
    pub fn id(&self) -> AccountId {
        AccountId::from_key(self.signing.verifying_key().to_bytes())
    }
}

impl Signer for AccountKey {
    fn sign_bytes(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }
    fn public_key(&self) -> [u8; 32] {
        self.signing.verifying_key().to_bytes()
    }
}

/// A device: an Ed25519 signing key and an X25519 box key.
#[derive(Clone)]
pub struct DeviceKey {
    signing: SigningKey,
    box_secret: StaticSecret,
}

impl DeviceKey {
    /// A fresh random device.
    pub fn generate(rng: &mut impl CryptoRngCore) -> DeviceKey {
        let mut box_seed = [0u8; 32];
        rng.fill_bytes(&mut box_seed);
        DeviceKey {
            signing: SigningKey::generate(rng),
            box_secret: StaticSecret::from(box_seed),
        }
    }

    /// The device with these seeds (signing seed, box secret).
    pub fn from_seeds(signing: [u8; 32], box_secret: [u8; 32]) -> DeviceKey {
        DeviceKey {
            signing: SigningKey::from_bytes(&signing),
            box_secret: StaticSecret::from(box_secret),
        }
    }

    /// The seeds, for saving the device in a profile.
    pub fn seeds(&self) -> ([u8; 32], [u8; 32]) {
        (self.signing.to_bytes(), self.box_secret.to_bytes())
    }

    /// The device id bound to the signing key.
    pub fn id(&self) -> DeviceId {
        DeviceId::derive(&self.public_key())
    }

    /// The X25519 public key that key boxes are sealed to.
    pub fn box_key(&self) -> [u8; 32] {
        PublicKey::from(&self.box_secret).to_bytes()
    }

    /// The X25519 shared secret with `peer`, or `None` if it is all zeros (a low-order peer key).
    pub(crate) fn box_agree(&self, peer: &[u8; 32]) -> Option<[u8; 32]> {
        let shared = self.box_secret.diffie_hellman(&PublicKey::from(*peer));
        shared.was_contributory().then(|| shared.to_bytes())
    }
}

impl Signer for DeviceKey {
    fn sign_bytes(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }
    fn public_key(&self) -> [u8; 32] {
        self.signing.verifying_key().to_bytes()
    }
}

/// A random id or nonce of 16 bytes, base64url.
pub fn random_id(rng: &mut impl CryptoRngCore) -> String {
    let mut b = [0u8; 16];
    rng.fill_bytes(&mut b);
    crate::wire::base64url::encode(&b)
}
