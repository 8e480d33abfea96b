//! `session_open` and `device_revocation`: the two signed client requests.

use super::field::{FieldError, Fields};
use super::identity::{AccountId, DeviceId, RelayId};
use super::json::Object;
use super::signature::SignedObject;

/// A parsed `session_open`, signed by the registered device key.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOpen {
    raw: Object,
    sig: [u8; 64],
    pub network: String,
    pub relay: RelayId,
    pub account: AccountId,
    pub device_id: DeviceId,
    pub ts: u64,
    pub nonce: String,
}

impl SessionOpen {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<SessionOpen, FieldError> {
        let f = Fields::new(&raw);
        f.expect_type(Self::TYPE)?;
        Ok(SessionOpen {
            network: f.network()?,
            relay: f.relay("relay")?,
            account: f.account("account")?,
            device_id: f.device_id("device_id")?,
            ts: f.int("ts")?,
            nonce: f.random_id("nonce")?,
            sig: f.sig()?,
            raw,
        })
    }
}

/// A parsed `device_revocation`, signed by the account key.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceRevocation {
    raw: Object,
    sig: [u8; 64],
    pub network: String,
    pub account: AccountId,
    pub device_id: DeviceId,
    pub revoked_at: u64,
}

impl DeviceRevocation {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<DeviceRevocation, FieldError> {
        let f = Fields::new(&raw);
        f.expect_type(Self::TYPE)?;
        Ok(DeviceRevocation {
            network: f.network()?,
            account: f.account("account")?,
            device_id: f.device_id("device_id")?,
            revoked_at: f.int("revoked_at")?,
            sig: f.sig()?,
            raw,
        })
    }
}

impl SignedObject for SessionOpen {
    const TYPE: &'static str = "session_open";
    fn raw(&self) -> &Object {
        &self.raw
    }
    fn sig(&self) -> &[u8; 64] {
        &self.sig
    }
}

impl SignedObject for DeviceRevocation {
    const TYPE: &'static str = "device_revocation";
    fn raw(&self) -> &Object {
        &self.raw
    }
    fn sig(&self) -> &[u8; 64] {
        &self.sig
    }
}
