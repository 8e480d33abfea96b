//! The source side: `message.send` and `message.delivery.status`.
//!
//! Processing order (protocol.md §4): shape; session; the logical key
//! (from, message_id) with its stored result; only then the method's checks
//! and acceptance, all in one transaction.

use super::context::Ctx;
use super::keyspace as k;
use super::metrics::Counters;
use super::receive::{params_hash, state_conflict, take_envelope, Incoming};
use super::records::{Canon, SendRec, TaskRec, TaskState};
use super::session::Need;
use super::status::{self, Status};
use super::storage::Storage;
use super::timeline::Kind;
use super::{Caller, Entropy};
use crate::wire::authorization::Authorization;
use crate::wire::canonical;
use crate::wire::certificate::DeviceCertificate;
use crate::wire::field::{FieldError, Fields};
use crate::wire::json::{self, Object, Value};
use crate::wire::key_box::parse_boxes;
use crate::wire::signature::SignedObject;
use crate::{Error, ErrorCode};

/// The task id of a message: its logical key.
pub(crate) fn task_id(from: &str, message_id: &str) -> String {
    format!("{from}.{message_id}")
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `message.send` (`send`).
    pub(crate) fn message_send(&mut self, caller: &Caller, mut p: Object) -> Result<Value, Error> {
        // 1. Parameter shape.
        let f = Fields::new(&p);
        f.array("recipient_boxes")?;
        if f.get("sender_boxes").is_some() {
            f.array("sender_boxes")?;
        }
        f.opt_object("authorization")?;
        f.opt_object("recipient_route")?;
        // From here `p` holds the other members; `env` is the envelope.
        let env = take_envelope(&mut p)?;
        let f = Fields::new(&p);
        // 2. Session and permission, for the envelope's sender account: the logical key is
        // the account's, so no session learns another account's results.
        let s = self.session(caller, Need::Send)?;
        if s.account != env.from.as_str() {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "the session's account must be the envelope's from",
            ));
        }
        // 3. The logical key.
        let from = env.from.as_str().to_string();
        let to = env.to.as_str().to_string();
        let id = env.message_id.clone();
        let hash = params_hash(&p, &env, self.crypto);
        if let Some(r) = self.txn.get::<SendRec>(&k::sent(&from, &id))? {
            if r.hash != hash {
                return Err(state_conflict());
            }
            return Ok(status::from_send(&from, &id, &r));
        }
        // Expiry of an earlier acceptance of this key may have removed its sent record and
        // not yet its delivery (a tick expires a bounded batch). A second delivery under the
        // same task id would be erased by that expiry, so until it is cleared the key is
        // answered as the seed allows once retention has ended.
        let task = task_id(&from, &id);
        if !self.txn.is_absent(&k::task(&task))? {
            return Err(Error::new(
                ErrorCode::MessageExpired,
                "the retention of an earlier acceptance of this message_id has ended; its result is unavailable",
            ));
        }
        // 4. The method's checks, the sending device's first: a recognized request was
        // answered above whichever device of the account repeats it.
        if s.device_id != env.from_device_id.as_str() {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "the session's device must be the envelope's from_device_id",
            ));
        }
        let Some(from_acct) = self.home_account(&from)? else {
            return Err(self.not_home(&from));
        };
        if env.network != self.cfg.network {
            return Err(FieldError::invalid("envelope.network", "is another network").into());
        }
        let cert = DeviceCertificate::parse(json::parse_object(s.device.cert.as_bytes())?)?;
        env.verify_with_in(&cert, self.crypto)?;
        self.check_created_at(env.created_at)?;
        let max_boxes = self.cfg.policies.max_boxes as usize;
        let recipient_boxes = parse_boxes(
            "recipient_boxes",
            f.get("recipient_boxes").unwrap_or(&Value::Null),
            max_boxes,
        )?;
        let sender_boxes = f
            .get("sender_boxes")
            .map(|v| parse_boxes("sender_boxes", v, max_boxes))
            .transpose()?;
        let auth = f
            .opt_object("authorization")?
            .map(|o| Authorization::parse(o.clone()).map_err(|e| e.within("authorization")))
            .transpose()?;
        if let Some(a) = &auth {
            a.verify_in(
                &self.cfg.network,
                &env.from,
                &env.to,
                self.now,
                self.cfg.policies.clock_tolerance,
                self.crypto,
            )?;
        }
        let self_delivery = from == to;
        if self_delivery {
            for member in ["sender_boxes", "authorization", "recipient_route"] {
                if f.get(member).is_some() {
                    return Err(
                        FieldError::invalid(member, "must be absent for self-delivery").into(),
                    );
                }
            }
        } else if let Some(r) = f.opt_object("recipient_route")? {
            let route = self.verified_route(r.clone(), "recipient_route")?;
            if route.account != env.to {
                return Err(FieldError::invalid(
                    "recipient_route.account",
                    "must be the envelope's to",
                )
                .into());
            }
            let held = self.held_route(&to)?.map_or(0, |h| h.revision);
            if route.revision > held || self.held_route(&to)?.is_none() {
                self.store_route(&route)?;
            }
        }
        let route = if self_delivery {
            None
        } else {
            let held = self.held_route(&to)?.ok_or_else(|| {
                Error::new(
                    ErrorCode::NotFound,
                    "no route is known for the recipient account",
                )
            })?;
            self.touch_route(&to, held.clone());
            Some(held)
        };
        self.take_token("send", &from, self.cfg.policies.send_rate)?;

        // Acceptance.
        let p_ = &self.cfg.policies;
        let retain_until = self.now.saturating_add(p_.message_retention);
        let deadline = env
            .created_at
            .saturating_add(p_.message_delivery_age_limit)
            .min(retain_until);
        // The registered certificate is stored in canonical form.
        let cert_text = s.device.cert.as_str().to_string();
        let mut rec = SendRec {
            hash,
            to: to.clone(),
            status: Status::Delivering,
            accepted_at: self.now,
            deadline,
            retain_until,
            target_accepted_at: None,
            error: None,
        };
        if !self_delivery && deadline <= self.now {
            // Accepted now, it would fail at once without an attempt.
            return Err(Error::new(
                ErrorCode::MessageExpired,
                "no time is left before the delivery deadline (created_at + age limit)",
            ));
        }
        let send_key = k::sent(&from, &id);
        self.expire_at(retain_until, &send_key);

        if self_delivery {
            // Receiving rules at once: 1 (home: checked above), 2 and 3 (checked above), 5.
            let visible = self.visible_devices(&to, &recipient_boxes)?;
            if visible.is_empty() {
                return Err(Error::new(
                    ErrorCode::DeviceUnknown,
                    "no recipient box names a valid device of the account",
                ));
            }
            // `to` is `from`, whose record was read above and is not written in between.
            self.append(
                &to,
                Kind::SelfDelivery,
                env.canonical_text(),
                env.body_expires_at,
                &cert_text,
                &recipient_boxes,
                Some((from_acct, visible)),
            )?;
            rec.status = Status::TargetAccepted;
            rec.target_accepted_at = Some(self.now);
            Counters::bump(&mut self.counts.accepted, "self");
            self.txn.put(send_key, &rec);
            return Ok(status::from_send(&from, &id, &rec));
        }

        if let Some(boxes) = &sender_boxes {
            self.append(
                &from,
                Kind::Sent,
                env.canonical_text(),
                env.body_expires_at,
                &cert_text,
                boxes,
                None,
            )?;
        }
        // The deliver params, built once: every attempt sends these exact bytes.
        let boxes_value = f.get("recipient_boxes").cloned().unwrap_or(Value::Null);
        let boxes_text = canonical::to_string(&boxes_value);
        let auth_text = f.get("authorization").map(canonical::to_string);
        let mut members: Vec<(&str, &str)> = vec![
            ("envelope", env.canonical_text()),
            ("recipient_boxes", &boxes_text),
            ("device_certificate", &cert_text),
        ];
        if let Some(a) = &auth_text {
            members.push(("authorization", a));
        }
        let body = canonical::object_of_canonical(&mut members);
        let Some(route) = route else {
            return Err(Error::new(
                ErrorCode::Internal,
                "cross-account delivery without a route",
            ));
        };
        self.txn.put(send_key, &rec);
        let task_rec = TaskRec {
            from: from.clone(),
            message_id: id.clone(),
            to,
            target: route.relay,
            route_revision: route.revision,
            body: Canon::new(body),
            attempt: 0,
            failures: 0,
            state: TaskState::Waiting,
            next_at: self.now,
            deadline,
            not_before: 0,
            last_error: None,
            uncertain: false,
            retain_until,
            park_order: 0,
            want_route_get: false,
            route_error: None,
            outage: false,
            sent_at: 0,
        };
        // For local delivery the parsed deliver params go along, so it neither
        // re-parses them nor verifies the envelope again (it just verified).
        let parsed = (task_rec.target == self.cfg.relay.as_str()).then(|| {
            let mut deliver = Object::new();
            deliver.insert("recipient_boxes", boxes_value);
            deliver.insert("device_certificate", Value::Object(cert.raw().clone()));
            let certificate = Some((cert, cert_text));
            if let Some(a) = f.get("authorization") {
                deliver.insert("authorization", a.clone());
            }
            Incoming {
                params: deliver,
                envelope: env,
                certificate,
                routed_here: true,
            }
        });
        let kind = if parsed.is_some() { "local" } else { "cross" };
        Counters::bump(&mut self.counts.accepted, kind);
        self.start_task(&task, task_rec, parsed)?;
        let rec: SendRec = self.txn.get(&k::sent(&from, &id))?.unwrap_or(rec);
        Ok(status::from_send(&from, &id, &rec))
    }

    /// `message.delivery.status`: `{message_id}` of the session's account.
    pub(crate) fn delivery_status(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.session(caller, Need::Any)?;
        let id = Fields::new(&p).random_id("message_id")?;
        match self.txn.get::<SendRec>(&k::sent(&s.account, &id))? {
            Some(r) => Ok(status::from_send(&s.account, &id, &r)),
            None => Err(Error::new(
                ErrorCode::NotFound,
                "no message.send result for this message_id",
            )),
        }
    }
}
