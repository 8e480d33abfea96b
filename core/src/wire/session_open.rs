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
    /// The network the session is for; must be the relay's own.
    pub network: String,
    /// The relay the session is opened at; must be this relay, so a signed open cannot be replayed elsewhere.
    pub relay: RelayId,
    /// The account the device acts for.
    pub account: AccountId,
    /// The registered device whose key signs the open.
    pub device_id: DeviceId,
    /// Signing time, Unix ms; must lie within the clock tolerance of now.
    pub ts: u64,
    /// Base64url random value (16 to 32 bytes), accepted once while `ts` is within tolerance.
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
    /// The network the revocation is for; must be the relay's own.
    pub network: String,
    /// The account whose key signs the revocation; must be the session's account.
    pub account: AccountId,
    /// The device revoked, refused for good from then on.
    pub device_id: DeviceId,
    /// When the account revoked it, Unix ms; informational: revocation takes effect at commit.
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
