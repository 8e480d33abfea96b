//! Accounts, devices, routes and contact revocation: the state that receiving rules consult.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{AccountRec, Canon, DeviceRec, RouteRec, Standing};
use super::session::Need;
use super::storage::Storage;
use super::Effect;
use super::{Caller, Entropy};
use crate::wire::canonical;
use crate::wire::certificate::DeviceCertificate;
use crate::wire::field::{FieldError, Fields};
use crate::wire::json::{self, Object, Value};
use crate::wire::route::Route;
use crate::wire::session_open::DeviceRevocation;
use crate::wire::signature::SignedObject;
use crate::{Error, ErrorCode};

/// What storing a route did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouteUpdate {
    /// It replaced a lower revision (or was the first).
    Replaced,
    /// The same route was already held.
    Same,
    /// A higher revision is held; nothing changed.
    Older,
}

fn obj_member(p: &Object, name: &str) -> Result<Object, Error> {
    Ok(Fields::new(p).object(name)?.clone())
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// Parses and verifies a route object found at `path`.
    pub(crate) fn verified_route(&mut self, raw: Object, path: &str) -> Result<Route, Error> {
        let r = Route::parse(raw).map_err(|e| e.within(path))?;
        r.verify_in(&self.cfg.network, self.crypto)?;
        Ok(r)
    }

    /// Holds `route` if its revision is higher than the held one; same revision, other content: `state_conflict`.
    pub(crate) fn store_route(&mut self, route: &Route) -> Result<RouteUpdate, Error> {
        let account = route.account.as_str();
        let text = route.canonical_string();
        let held = self.held_route(account)?;
        let last_seq = held.as_ref().map_or(0, |h| h.last_seq);
        if let Some(held) = held {
            if held.revision > route.revision {
                return Ok(RouteUpdate::Older);
            }
            if held.revision == route.revision {
                if held.route.as_str() == text {
                    return Ok(RouteUpdate::Same);
                }
                return Err(Error::new(
                    ErrorCode::StateConflict,
                    format!("a different route with revision {} is held", route.revision),
                ));
            }
        }
        self.txn.put(
            k::route(account),
            &RouteRec {
                revision: route.revision,
                relay: route.relay.as_str().to_string(),
                route: Canon::new(text),
                touched_at: self.now,
                last_seq,
            },
        );
        // Anyone may publish routes: one nobody uses is forgotten (see `expire_route`).
        let at = self.now.saturating_add(self.cfg.policies.message_retention);
        self.expire_at(at, &k::route(account));
        self.share_route(account, &route.canonical_string());
        self.home_changed(account, route.relay.as_str(), route.revision)?;
        Ok(RouteUpdate::Replaced)
    }

    /// Notes that a held route was used, so it is kept; written at most every half retention.
    pub(crate) fn touch_route(&mut self, account: &str, mut rec: RouteRec) {
        let half = self.cfg.policies.message_retention / 2;
        if rec.touched_at.saturating_add(half) < self.now {
            rec.touched_at = self.now;
            self.txn.put(k::route(account), &rec);
            let at = self.now.saturating_add(self.cfg.policies.message_retention);
            self.expire_at(at, &k::route(account));
            self.share_route(account, rec.route.as_str());
        }
    }

    /// On a sharded relay, a route of another shard's account that this shard learned or
    /// used goes to that shard too (as `route.publish`, which counts as a use there): every
    /// shard asks that one for routes it does not hold, so it holds every route the relay
    /// knows and keeps it as long as any shard uses it, as a relay of one shard would.
    fn share_route(&mut self, account: &str, route_text: &str) {
        if let Some(shard) = self.cfg.shard.sibling_of(account) {
            let mut body = Vec::with_capacity(route_text.len() + 10);
            body.extend_from_slice(b"{\"route\":");
            body.extend_from_slice(route_text.as_bytes());
            body.push(b'}');
            self.effects.push(Effect::ShardCall {
                shard,
                path: "/v1/route.publish",
                body,
            });
        }
    }

    /// The expiry of a route (its gc entry came due): an account served here keeps its
    /// route; another's is deleted once unused for `message_retention` (an old home keeps
    /// answering `not_home_relay` with it at least that long), else checked again later.
    pub(crate) fn expire_route(&mut self, key: &[u8]) -> Result<(), Error> {
        let Some(account) = k::route_account(key).map(str::to_string) else {
            return Ok(());
        };
        if self.txn.get_raw(&k::account(&account))?.is_some() {
            return Ok(());
        }
        let Some(rec) = self.txn.get::<RouteRec>(key)? else {
            return Ok(());
        };
        let keep_until = rec
            .touched_at
            .saturating_add(self.cfg.policies.message_retention);
        if keep_until > self.now {
            self.expire_at(keep_until, key);
        } else {
            self.txn.delete(key.to_vec());
        }
        Ok(())
    }

    /// Refuses a new device record beyond `max_device_records` (registered and revoked
    /// alike), which also bounds every scan of an account's devices.
    fn check_room_for_device_record(&mut self, account: &str) -> Result<(), Error> {
        let max = self.cfg.policies.max_device_records;
        let prefix = k::devices(account);
        let held = self
            .txn
            .scan(
                &prefix,
                &k::prefix_end(&prefix),
                max.saturating_add(1) as usize,
            )?
            .len() as u64;
        if held >= max {
            return Err(Error::new(
                ErrorCode::PayloadTooLarge,
                format!("the account already has max_device_records ({max}) device records"),
            ));
        }
        Ok(())
    }

    fn active_device_count(&mut self, account: &str) -> Result<u64, Error> {
        let prefix = k::devices(account);
        let mut n = 0;
        for (_, v) in self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), usize::MAX)?
        {
            let d: DeviceRec = serde_json::from_slice(&v).map_err(|e| {
                Error::new(ErrorCode::Internal, format!("corrupt device record: {e}"))
            })?;
            if !d.revoked {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Registers (or replaces, if newer) a verified certificate in its account's device state.
    fn put_certificate(&mut self, cert: &DeviceCertificate) -> Result<(), Error> {
        let account = cert.account.as_str();
        let device = cert.device_id.as_str();
        let text = cert.canonical_string();
        let held: Option<DeviceRec> = self.txn.get(&k::device(account, device))?;
        match held {
            Some(d) if d.revoked => {
                return Err(Error::new(
                    ErrorCode::InvalidCertificate,
                    "this device id was revoked and is refused for good",
                ))
            }
            Some(d) if d.cert.as_str() == text => return Ok(()),
            Some(d) if d.issued_at >= cert.issued_at => {
                return Err(Error::new(
                    ErrorCode::StateConflict,
                    "a certificate for this device with an equal or later issued_at is registered",
                ))
            }
            Some(_) => {}
            None => {
                self.check_room_for_device_record(account)?;
                if self.active_device_count(account)? >= self.cfg.policies.max_devices {
                    return Err(Error::new(
                        ErrorCode::PayloadTooLarge,
                        format!(
                            "the account already has max_devices ({}) devices",
                            self.cfg.policies.max_devices
                        ),
                    ));
                }
            }
        }
        self.txn.put(
            k::device(account, device),
            &DeviceRec {
                cert: Canon::new(text),
                issued_at: cert.issued_at,
                expires_at: cert.expires_at,
                send: cert.permissions.send,
                sync: cert.permissions.sync,
                manage: cert.permissions.manage,
                revoked: false,
            },
        );
        Ok(())
    }

    /// Parses and verifies a certificate for use at this (home) relay.
    fn home_certificate(&mut self, raw: Object, path: &str) -> Result<DeviceCertificate, Error> {
        let cert = DeviceCertificate::parse(raw).map_err(|e| e.within(path))?;
        cert.verify_in(&self.cfg.network, self.crypto)?;
        cert.check_current(self.now, self.cfg.policies.clock_tolerance)?;
        Ok(cert)
    }

    /// `account.register`: `{route, certificate, discoverable?}`.
    ///
    /// Its inputs are public (a route from `route.get`, a `manage` certificate from
    /// `device.list`), so for an account already registered it changes nothing a stranger
    /// could not already change: a route of higher revision is stored (as `route.publish`
    /// would), the account-signed certificate as `device.register` would, and
    /// `discoverable` only for a caller holding a `manage` session of the account.
    pub(crate) fn account_register(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let discoverable = f.opt_bool("discoverable")?;
        let route = self.verified_route(obj_member(&p, "route")?, "route")?;
        let cert_raw = obj_member(&p, "certificate")?;
        if route.relay != self.cfg.relay {
            return Err(FieldError::invalid("route.relay", "must name this relay").into());
        }
        let cert = self.home_certificate(cert_raw, "certificate")?;
        if cert.account != route.account {
            return Err(Error::new(
                ErrorCode::InvalidCertificate,
                "certificate is for another account",
            ));
        }
        if !cert.permissions.manage {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "the registering device needs the \"manage\" permission",
            ));
        }
        let account = route.account.as_str().to_string();
        if self.store_route(&route)? == RouteUpdate::Older {
            return Err(Error::new(
                ErrorCode::StateConflict,
                "a route of higher revision is held for this account",
            ));
        }
        let existing: Option<AccountRec> = self.txn.get(&k::account(&account))?;
        match existing {
            Some(mut a) => {
                if let Some(d) = discoverable.filter(|d| *d != a.discoverable) {
                    let holder = match caller {
                        Caller::Session(_) => Some(self.session(caller, Need::Manage)?.account),
                        _ => None,
                    };
                    if holder.as_deref() != Some(account.as_str()) {
                        return Err(Error::new(
                            ErrorCode::PermissionDenied,
                            "changing discoverable of a registered account needs a manage session of it (account.update)",
                        ));
                    }
                    a.discoverable = d;
                    self.txn.put(k::account(&account), &a);
                }
            }
            None => {
                let count: u64 = self.txn.get(&k::account_count())?.unwrap_or(0);
                if count >= self.cfg.policies.max_accounts {
                    return Err(Error::new(
                        ErrorCode::Unavailable,
                        format!(
                            "this relay serves its maximum of {} accounts (max_accounts)",
                            self.cfg.policies.max_accounts
                        ),
                    ));
                }
                self.txn.put(k::account_count(), &(count + 1));
                // An account this relay served and forgot continues its sequence (rule 4).
                let latest_seq = self.held_route(&account)?.map_or(0, |r| r.last_seq);
                self.txn.put(
                    k::account(&account),
                    &AccountRec {
                        registered_at: self.now,
                        discoverable: discoverable.unwrap_or(false),
                        latest_seq,
                        standing: Standing::Home,
                        span: route.revision,
                    },
                );
            }
        }
        self.put_certificate(&cert)?;
        let mut out = Object::new();
        out.insert("account", account);
        out.insert("route_revision", route.revision);
        Ok(Value::Object(out))
    }

    /// `account.update` (`manage`): `{discoverable}`.
    pub(crate) fn account_update(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.home_session(caller, Need::Manage)?;
        let discoverable = Fields::new(&p).bool("discoverable")?;
        let mut rec: AccountRec = self
            .txn
            .get(&k::account(&s.account))?
            .ok_or_else(|| Error::new(ErrorCode::NotFound, "account not registered here"))?;
        rec.discoverable = discoverable;
        self.txn.put(k::account(&s.account), &rec);
        Ok(Value::Object(Object::new()))
    }

    /// `device.register` (`manage`): `{certificate}` for the session's account.
    pub(crate) fn device_register(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.home_session(caller, Need::Manage)?;
        let cert = self.home_certificate(obj_member(&p, "certificate")?, "certificate")?;
        if cert.account.as_str() != s.account {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "certificate is for another account",
            ));
        }
        self.put_certificate(&cert)?;
        let mut out = Object::new();
        out.insert("device_id", cert.device_id.as_str());
        Ok(Value::Object(out))
    }

    /// `device.revoke` (`manage`): a `device_revocation` signed by the account key.
    pub(crate) fn device_revoke(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.home_session(caller, Need::Manage)?;
        let r = DeviceRevocation::parse(p)?;
        if r.network != self.cfg.network {
            return Err(Error::new(
                ErrorCode::InvalidParams,
                "revocation is for another network",
            ));
        }
        if r.account.as_str() != s.account {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "revocation is for another account",
            ));
        }
        r.verify_signature_in(r.account.key(), self.crypto)?;
        let device = r.device_id.as_str().to_string();
        let key = k::device(&s.account, &device);
        let mut rec: DeviceRec = match self.txn.get(&key)? {
            Some(rec) => rec,
            None => {
                self.check_room_for_device_record(&s.account)?;
                DeviceRec::revoked_unregistered()
            }
        };
        rec.revoked = true;
        self.txn.put(key, &rec);
        self.end_device_sessions(&s.account, &device);
        let mut out = Object::new();
        out.insert("device_id", device);
        Ok(Value::Object(out))
    }

    /// `device.list` (a client session or a relay): `{account}`.
    pub(crate) fn device_list(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        if !matches!(caller, Caller::Relay { .. } | Caller::Operator) {
            self.home_session(caller, Need::Any)?;
        }
        let account = Fields::new(&p).account("account")?;
        let account = account.as_str();
        if !self.serves(account)? {
            return Err(self.not_home(account));
        }
        let prefix = k::devices(account);
        let mut devices = Vec::new();
        let mut revoked = Vec::new();
        for (key, _) in self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), usize::MAX)?
        {
            let Some(id) = k::device_of(&key, account).map(str::to_string) else {
                continue;
            };
            if let Some(d) = self.valid_device(account, &id)? {
                devices.push(json::parse(d.cert.as_bytes())?);
            } else if self.txn.get::<DeviceRec>(&key)?.is_some_and(|d| d.revoked) {
                revoked.push(Value::String(id));
            }
        }
        let mut out = Object::new();
        out.insert("devices", Value::Array(devices));
        out.insert("revoked", Value::Array(revoked));
        Ok(Value::Object(out))
    }

    /// `route.get` (anyone): `{account}`.
    pub(crate) fn route_get(&mut self, p: Object) -> Result<Value, Error> {
        let account = Fields::new(&p).account("account")?;
        let held = self
            .held_route(account.as_str())?
            .ok_or_else(|| Error::new(ErrorCode::NotFound, "no route is held for this account"))?;
        let mut out = Object::new();
        out.insert("route", json::parse(held.route.as_bytes())?);
        Ok(Value::Object(out))
    }

    /// `route.publish` (anyone): `{route}`; a peer that shows it is alive gets its waiting deliveries back.
    pub(crate) fn route_publish(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let route = self.verified_route(obj_member(&p, "route")?, "route")?;
        // Publishing the held route again is a use of it: it is kept as long as a use.
        if let RouteUpdate::Same = self.store_route(&route)? {
            if let Some(held) = self.held_route(route.account.as_str())? {
                self.touch_route(route.account.as_str(), held);
            }
        }
        if let Caller::Relay { relay: peer, .. } = caller {
            self.peer_is_back(peer.as_str())?;
        }
        let held = self
            .held_route(route.account.as_str())?
            .map_or(route.revision, |r| r.revision);
        let mut out = Object::new();
        out.insert("revision", held);
        Ok(Value::Object(out))
    }

    /// `contact.revoke` (`manage`): exactly one of `{grant_id}` or `{invite_id}`.
    pub(crate) fn contact_revoke(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.home_session(caller, Need::Manage)?;
        let f = Fields::new(&p);
        let id = match (f.get("grant_id").is_some(), f.get("invite_id").is_some()) {
            (true, false) => f.random_id("grant_id")?,
            (false, true) => f.random_id("invite_id")?,
            _ => {
                return Err(FieldError::invalid(
                    "",
                    "exactly one of grant_id or invite_id is required",
                )
                .into())
            }
        };
        self.txn.put_raw(
            k::contact_revoked(&s.account, &id),
            canonical::to_vec(&Value::from(self.now)),
        );
        Ok(Value::Object(Object::new()))
    }
}
