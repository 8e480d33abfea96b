//! Object drafts: valid protocol objects by default, any single defect on request.
//!
//! Each builder returns a [`Draft`] holding every required member with a
//! valid value. Tests change one member (`set`, `remove`), then `sign` with
//! the right key, the wrong key, or not at all, so every rejection path can
//! be reached by one deliberate defect.

use super::keys::{AccountKey, DeviceKey, Signer};
use crate::wire::base64url;
use crate::wire::identity::{AccountId, DeviceId};
use crate::wire::json::{Object, Value};
use crate::wire::signature::signing_input;

/// An unsigned object under construction.
#[derive(Clone, Debug)]
pub struct Draft {
    fields: Object,
}

impl Draft {
    /// A draft with only `type`.
    pub fn new(type_: &str) -> Draft {
        let mut fields = Object::new();
        fields.insert("type", type_);
        Draft { fields }
    }

    /// Sets a member (replacing it).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Draft {
        self.fields.insert(key, value);
        self
    }

    /// Removes a member.
    pub fn remove(mut self, key: &str) -> Draft {
        self.fields.remove(key);
        self
    }

    /// The members so far.
    pub fn fields(&self) -> &Object {
        &self.fields
    }

    /// Signs by the signing rule (the domain uses the draft's own `type`) and adds `sig`.
    pub fn sign(self, signer: &impl Signer) -> Object {
        let t = self
            .fields
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.sign_as(&t, signer)
    }

    /// Signs with `type_` in the domain, whatever the draft's `type` says (a defect on purpose).
    pub fn sign_as(mut self, type_: &str, signer: &impl Signer) -> Object {
        self.fields.remove("sig");
        let sig = signer.sign_bytes(&signing_input(type_, &self.fields));
        self.fields.insert("sig", base64url::encode(&sig));
        self.fields
    }

    /// The object without a signature.
    pub fn unsigned(self) -> Object {
        self.fields
    }
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(base64url::encode(bytes))
}

/// A `device_certificate` for `device` under `account`.
pub fn certificate(
    network: &str,
    account: &AccountKey,
    device: &DeviceKey,
    permissions: &[&str],
    issued_at: u64,
) -> Draft {
    Draft::new("device_certificate")
        .set("network", network)
        .set("account", account.id().as_str())
        .set("device_id", device.id().as_str())
        .set("device_key", b64(&device.public_key()))
        .set("box_key", b64(&device.box_key()))
        .set(
            "permissions",
            Value::Array(permissions.iter().map(|p| Value::from(*p)).collect()),
        )
        .set("issued_at", issued_at)
}

/// A `message_envelope` from `device` of account `from` to `to`.
pub fn envelope(
    network: &str,
    message_id: &str,
    from: &AccountId,
    device: &DeviceId,
    to: &AccountId,
    created_at: u64,
    body: Object,
) -> Draft {
    Draft::new("message_envelope")
        .set("network", network)
        .set("message_id", message_id)
        .set("from", from.as_str())
        .set("from_device_id", device.as_str())
        .set("to", to.as_str())
        .set("created_at", created_at)
        .set("body", body)
}

/// For tests: an envelope with `body` from account 1's phone to account 2, signed, with its
/// fixed keys (accounts from seeds 1 and 2, the phone from seeds 3 and 4).
#[cfg(test)]
pub(crate) fn signed_test_envelope(
    body: Object,
    created_at: u64,
) -> (AccountKey, AccountKey, DeviceKey, Object) {
    let (alice, bob) = (
        AccountKey::from_seed([1; 32]),
        AccountKey::from_seed([2; 32]),
    );
    let phone = DeviceKey::from_seeds([3; 32], [4; 32]);
    let env = envelope(
        "dev",
        "AAAAAAAAAAAAAAAAAAAAAA",
        &alice.id(),
        &phone.id(),
        &bob.id(),
        created_at,
        body,
    )
    .sign(&phone);
    (alice, bob, phone, env)
}

/// A `route` naming `relay` as the account's home.
pub fn route(
    network: &str,
    account: &AccountId,
    relay: &str,
    revision: u64,
    issued_at: u64,
) -> Draft {
    Draft::new("route")
        .set("network", network)
        .set("account", account.as_str())
        .set("relay", relay)
        .set("revision", revision)
        .set("issued_at", issued_at)
}

/// A `contact_grant` from `grantor` (the recipient) to `grantee` (the sender).
pub fn grant(
    network: &str,
    grant_id: &str,
    grantor: &AccountId,
    grantee: &AccountId,
    issued_at: u64,
) -> Draft {
    Draft::new("contact_grant")
        .set("network", network)
        .set("grant_id", grant_id)
        .set("grantor", grantor.as_str())
        .set("grantee", grantee.as_str())
        .set("issued_at", issued_at)
}

/// A `contact_invite` by `issuer`, valid until `expires_at`.
pub fn invite(
    network: &str,
    invite_id: &str,
    issuer: &AccountId,
    issued_at: u64,
    expires_at: u64,
) -> Draft {
    Draft::new("contact_invite")
        .set("network", network)
        .set("invite_id", invite_id)
        .set("issuer", issuer.as_str())
        .set("issued_at", issued_at)
        .set("expires_at", expires_at)
}

/// A `session_open` for `device` of `account` at `relay`.
pub fn session_open(
    network: &str,
    relay: &str,
    account: &AccountId,
    device: &DeviceId,
    ts: u64,
    nonce: &str,
) -> Draft {
    Draft::new("session_open")
        .set("network", network)
        .set("relay", relay)
        .set("account", account.as_str())
        .set("device_id", device.as_str())
        .set("ts", ts)
        .set("nonce", nonce)
}

/// A `device_revocation` of `device` by `account`.
pub fn revocation(network: &str, account: &AccountId, device: &DeviceId, revoked_at: u64) -> Draft {
    Draft::new("device_revocation")
        .set("network", network)
        .set("account", account.as_str())
        .set("device_id", device.as_str())
        .set("revoked_at", revoked_at)
}
