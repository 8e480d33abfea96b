//! Device sessions: `session.open`, and authenticating the bearer of a session token.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{AccountRec, DeviceRec, SessionRec};
use super::storage::Storage;
use super::{Caller, Entropy};
use crate::wire::base64url;
use crate::wire::json::{Object, Value};
use crate::wire::session_open::SessionOpen;
use crate::wire::signature::SignedObject;
use crate::{Error, ErrorCode};

/// An authenticated session: the device and the permissions of its registered certificate.
pub(crate) struct Session {
    pub account: String,
    pub device_id: String,
    pub device: DeviceRec,
    /// The account's home span when the session was opened (rule 6).
    pub span: u64,
}

/// Which permission a method needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Any,
    Send,
    Sync,
    Manage,
}

fn token_hash(token: &str) -> String {
    base64url::encode(&crate::wire::digest::sha256(token.as_bytes()))
}

fn unauthenticated(why: &str) -> Error {
    Error::new(ErrorCode::Unauthenticated, why)
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `session.open`: a signed `session_open` by a registered, valid device.
    pub(crate) fn session_open(&mut self, p: Object) -> Result<Value, Error> {
        let s = SessionOpen::parse(p)?;
        let tol = self.cfg.policies.clock_tolerance;
        if s.network != self.cfg.network {
            return Err(Error::new(
                ErrorCode::InvalidParams,
                "session_open is for another network",
            ));
        }
        if s.relay != self.cfg.relay {
            return Err(unauthenticated("session_open names another relay"));
        }
        if s.ts > self.now.saturating_add(tol) {
            return Err(Error::new(
                ErrorCode::ClockSkew,
                "session_open ts is beyond now plus clock tolerance",
            ));
        }
        if s.ts.saturating_add(tol) < self.now {
            return Err(unauthenticated(
                "session_open ts is older than the clock tolerance",
            ));
        }
        let account = s.account.as_str().to_string();
        let device_id = s.device_id.as_str().to_string();
        // A former home opens sessions too (against its frozen device state), for what it
        // keeps: status, sync and recognized retries (see `migration`).
        let Some(acct) = self.txn.get::<AccountRec>(&k::account(&account))? else {
            return Err(self.not_home(&account));
        };
        let Some(device) = self.valid_device(&account, &device_id)? else {
            return Err(unauthenticated(
                "device is not registered and valid at this relay",
            ));
        };
        let key: [u8; 32] = crate::wire::certificate::DeviceCertificate::parse(
            crate::wire::json::parse_object(device.cert.as_bytes())?,
        )?
        .device_key;
        s.verify_signature_in(&key, self.crypto)?;
        // Counted only once signed by the device: a stranger cannot spend the account's share.
        let rate = self.cfg.policies.account_request_rate;
        self.limiter.take("account", &account, rate, self.now)?;
        let nonce_key = k::nonce(&account, &device_id, &s.nonce);
        if self.txn.get_raw(&nonce_key)?.is_some() {
            return Err(unauthenticated("session_open nonce was already used"));
        }
        // A nonce only needs remembering while its ts is still acceptable.
        self.txn.put_raw(nonce_key.clone(), Vec::new());
        self.expire_at(s.ts.saturating_add(tol).saturating_add(1), &nonce_key);

        // A sharded relay's tokens name their shard, so its router needs no lookup.
        let mut token = self.cfg.shard.token_prefix().unwrap_or_default();
        token.push_str(&base64url::encode(&self.random::<32>()));
        let hash = token_hash(&token);
        let mut expires_at = s.ts.saturating_add(self.cfg.policies.session_ttl);
        if let Some(e) = device.expires_at {
            expires_at = expires_at.min(e);
        }
        self.txn.put(
            k::session(&hash),
            &SessionRec {
                account: account.clone(),
                device_id: device_id.clone(),
                expires_at,
                // A session opened at a former home stays a former account's session: the
                // span it names ended with the move (a move back begins a new one).
                span: acct.span,
            },
        );
        // No per-device index: a revoked device's sessions fail the device check at once
        // and expire with their time, so revocation never walks them.
        self.expire_at(expires_at, &k::session(&hash));
        let mut out = Object::new();
        out.insert("session", token);
        out.insert("expires_at", expires_at);
        Ok(Value::Object(out))
    }

    /// The caller's session, checked for expiry, device validity and the permission `need`.
    pub(crate) fn session(&mut self, caller: &Caller, need: Need) -> Result<Session, Error> {
        let Caller::Session(token) = caller else {
            return Err(unauthenticated("this method needs a device session"));
        };
        let rec: Option<SessionRec> = self.txn.get(&k::session(&token_hash(token)))?;
        let Some(rec) = rec.filter(|r| self.now < r.expires_at) else {
            return Err(unauthenticated("no such session, or it has expired"));
        };
        let Some(device) = self.valid_device(&rec.account, &rec.device_id)? else {
            return Err(unauthenticated("the session's device is no longer valid"));
        };
        if need != Need::Send {
            // message.send has its own limit (send_rate), taken only when it accepts.
            let rate = self.cfg.policies.account_request_rate;
            self.limiter.take("account", &rec.account, rate, self.now)?;
        }
        let allowed = match need {
            Need::Any => true,
            Need::Send => device.send,
            Need::Sync => device.sync,
            Need::Manage => device.manage,
        };
        if !allowed {
            let name = match need {
                Need::Send => "send",
                Need::Sync => "sync",
                _ => "manage",
            };
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                format!("the device's certificate lacks the {name:?} permission"),
            ));
        }
        Ok(Session {
            account: rec.account,
            device_id: rec.device_id,
            device,
            span: rec.span,
        })
    }

    /// The session's holder, as a value (for `Engine::session_info`).
    pub(crate) fn session_info(&mut self, caller: &Caller) -> Result<Value, Error> {
        let Caller::Session(token) = caller else {
            return Err(unauthenticated("no session"));
        };
        let s = self.session(caller, Need::Any)?;
        let rec: Option<SessionRec> = self.txn.get(&k::session(&token_hash(token)))?;
        let mut out = Object::new();
        out.insert("account", s.account);
        out.insert("device_id", s.device_id);
        out.insert("expires_at", rec.map_or(0, |r| r.expires_at));
        Ok(Value::Object(out))
    }

    /// Records a relay request nonce, refusing one already seen within twice the clock tolerance.
    pub(crate) fn consume_relay_nonce(
        &mut self,
        request: &crate::wire::relay_request::Prechecked,
    ) -> Result<(), Error> {
        let key = k::relay_nonce(request.source.as_str(), &request.nonce);
        if self.txn.get_raw(&key)?.is_some() {
            return Err(unauthenticated("relay authentication: nonce already used"));
        }
        self.txn.put_raw(key.clone(), Vec::new());
        let tol = self.cfg.policies.clock_tolerance;
        self.expire_at(request.ts.saturating_add(2 * tol).saturating_add(1), &key);
        Ok(())
    }

    /// Ends every session of a revoked device: the device check refuses them from this
    /// commit on, they expire with their time, and the host closes their WebSockets.
    /// Nothing is scanned, so revoking a device with any number of sessions costs the same.
    pub(crate) fn end_device_sessions(&mut self, account: &str, device: &str) {
        self.effects.push(super::Effect::EndDeviceSessions {
            account: account.to_string(),
            device_id: device.to_string(),
        });
    }
}
