//! The source side: `message.send` and `message.delivery.status`.
//!
//! Processing order (protocol.md §4): shape; session; the logical key
//! (from, message_id) with its stored result; only then the method's checks
//! and acceptance, all in one transaction.

use super::context::Ctx;
use super::idempotency::{params_hash, take_envelope};
use super::keyspace as k;
use super::metrics::Counters;
use super::receive::Incoming;
use super::records::{AccountRec, Canon, RouteRec, SendRec, TaskRec, TaskState};
use super::session::{Need, Session};
use super::shard::SiblingRoute;
use super::status::{self, Status};
use super::storage::Storage;
use super::timeline::Kind;
use super::{Caller, Entropy};
use crate::wire::authorization::Authorization;
use crate::wire::canonical;
use crate::wire::certificate::DeviceCertificate;
use crate::wire::envelope::MessageEnvelope;
use crate::wire::field::{FieldError, Fields};
use crate::wire::json::{self, Object, Value};
use crate::wire::key_box::{parse_boxes, KeyBox};
use crate::wire::signature::SignedObject;
use crate::{Error, ErrorCode};

/// The task id of a message: its logical key.
pub(crate) fn task_id(from: &str, message_id: &str) -> String {
    format!("{from}.{message_id}")
}

/// A `message.send` that passed every check, ready to be accepted.
struct Checked {
    /// The sender's account record (self-delivery appends to it).
    from_acct: AccountRec,
    /// The sending device's registered certificate, and its canonical text.
    cert: DeviceCertificate,
    cert_text: String,
    recipient_boxes: Vec<KeyBox>,
    sender_boxes: Option<Vec<KeyBox>>,
    /// The recipient's route (cross-account delivery only).
    route: Option<RouteRec>,
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `message.send` (`send`): shape, session, the logical key, the checks, acceptance.
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
        let hash = params_hash(&p, &env, self.crypto);
        if let Some(answer) = self.sent_before(env.from.as_str(), &env.message_id, &hash)? {
            return Ok(answer);
        }
        // 4. The method's checks, then acceptance.
        let checked = self.send_checks(&s, &p, &env)?;
        self.take_token("send", env.from.as_str(), self.cfg.policies.send_rate)?;
        let p_ = &self.cfg.policies;
        let retain_until = self.now.saturating_add(p_.message_retention);
        let deadline = env
            .created_at
            .saturating_add(p_.message_delivery_age_limit)
            .min(retain_until);
        let rec = SendRec {
            hash,
            to: env.to.as_str().to_string(),
            status: Status::Delivering,
            accepted_at: self.now,
            deadline,
            retain_until,
            target_accepted_at: None,
            error: None,
        };
        if env.from == env.to {
            return self.accept_self_delivery(&env, checked, rec);
        }
        if deadline <= self.now {
            // Accepted now, it would fail at once without an attempt.
            return Err(Error::new(
                ErrorCode::MessageExpired,
                "no time is left before the delivery deadline (created_at + age limit)",
            ));
        }
        self.accept_cross_delivery(&p, env, checked, rec)
    }

    /// The checks of `message.send` after its logical key, the sending device's first: a
    /// recognized request was answered before whichever device of the account repeats it.
    fn send_checks(
        &mut self,
        s: &Session,
        p: &Object,
        env: &MessageEnvelope,
    ) -> Result<Checked, Error> {
        let f = Fields::new(p);
        if s.device_id != env.from_device_id.as_str() {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "the session's device must be the envelope's from_device_id",
            ));
        }
        let from = env.from.as_str();
        let Some(from_acct) = self.home_account(from)? else {
            return Err(self.not_home(from));
        };
        self.in_span(s, &from_acct)?;
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
        let route = self.recipient_route(&f, env)?;
        Ok(Checked {
            from_acct,
            cert,
            // The registered certificate is stored in canonical form.
            cert_text: s.device.cert.as_str().to_string(),
            recipient_boxes,
            sender_boxes,
            route,
        })
    }

    /// The route a cross-account send goes by: `recipient_route` is learned when newer
    /// than the held one, then the held route is used (none for self-delivery, where
    /// the cross-account members must be absent).
    fn recipient_route(
        &mut self,
        f: &Fields<'_>,
        env: &MessageEnvelope,
    ) -> Result<Option<RouteRec>, Error> {
        let to = env.to.as_str();
        if env.from == env.to {
            for member in ["sender_boxes", "authorization", "recipient_route"] {
                if f.get(member).is_some() {
                    return Err(
                        FieldError::invalid(member, "must be absent for self-delivery").into(),
                    );
                }
            }
            return Ok(None);
        }
        if let Some(r) = f.opt_object("recipient_route")? {
            let route = self.verified_route(r.clone(), "recipient_route")?;
            if route.account != env.to {
                return Err(FieldError::invalid(
                    "recipient_route.account",
                    "must be the envelope's to",
                )
                .into());
            }
            let held = self.held_route(to)?.map_or(0, |h| h.revision);
            if route.revision > held || self.held_route(to)?.is_none() {
                self.store_route(&route)?;
            }
        }
        if self.held_route(to)?.is_none() && self.cfg.shard.sibling_of(to).is_some() {
            self.learn_sibling_route(to)?;
        }
        let held = self.held_route(to)?.ok_or_else(|| {
            Error::new(
                ErrorCode::NotFound,
                "no route is known for the recipient account",
            )
        })?;
        self.touch_route(to, held.clone());
        Ok(Some(held))
    }

    /// A recipient of a sibling shard whose route this shard does not hold: the route that
    /// shard holds is learned as a `recipient_route` would be, so a sharded relay knows every
    /// route a relay of one shard would. Without the sibling's answer yet, the call asks for
    /// it (and changes nothing); the transport fetches it and submits the call again.
    fn learn_sibling_route(&mut self, to: &str) -> Result<(), Error> {
        match self.siblings.take(to, self.now) {
            None => {
                self.siblings.want(to, self.now);
                Err(Error::new(
                    ErrorCode::Unavailable,
                    "the recipient's route is held by another shard of this relay; retry",
                ))
            }
            Some(SiblingRoute::Route(r)) => {
                let route = self.verified_route(r, "route")?;
                if route.account.as_str() == to {
                    self.store_route(&route)?;
                }
                Ok(())
            }
            // The shard that would hold it holds none: not found, as in one shard.
            Some(SiblingRoute::Absent) => Ok(()),
            Some(SiblingRoute::Failed) => {
                let mut d = Object::new();
                d.insert("retry_after", 1000u64);
                Err(Error::new(
                    ErrorCode::Unavailable,
                    "the shard holding the recipient's route did not answer; retry",
                )
                .with_data(Value::Object(d)))
            }
        }
    }

    /// Self-delivery: the receiving rules at once (1: home, checked; 2 and 3: checked; 5),
    /// the record appended, and the send accepted as `target_accepted`.
    fn accept_self_delivery(
        &mut self,
        env: &MessageEnvelope,
        c: Checked,
        mut rec: SendRec,
    ) -> Result<Value, Error> {
        let (from, id) = (env.from.as_str(), env.message_id.as_str());
        let send_key = k::sent(from, id);
        self.expire_at(rec.retain_until, &send_key);
        // Receiving rule 2 as for any delivery (its signature checks ran in the source's
        // checks): the sending certificate was valid at the envelope's created_at.
        c.cert
            .check_valid_at(env.created_at, self.cfg.policies.clock_tolerance)?;
        let visible = self.visible_devices(from, &c.recipient_boxes)?;
        if visible.is_empty() {
            return Err(Error::new(
                ErrorCode::DeviceUnknown,
                "no recipient box names a valid device of the account",
            ));
        }
        // `to` is `from`, whose record was read in the checks and is not written in between.
        self.append(
            from,
            Kind::SelfDelivery,
            env.canonical_text(),
            env.body_expires_at,
            &c.cert_text,
            &c.recipient_boxes,
            Some((c.from_acct, visible)),
        )?;
        rec.status = Status::TargetAccepted;
        rec.target_accepted_at = Some(self.now);
        Counters::bump(&mut self.counts.accepted, "self");
        self.txn.put(send_key, &rec);
        self.accepted("message.send", from, id, &rec.to, rec.status);
        Ok(status::from_send(from, id, &rec))
    }

    /// Cross-account delivery: the sent record (with `sender_boxes`), the deliver params
    /// built once (every attempt sends these exact bytes), and the delivery task started.
    fn accept_cross_delivery(
        &mut self,
        p: &Object,
        env: MessageEnvelope,
        c: Checked,
        rec: SendRec,
    ) -> Result<Value, Error> {
        let f = Fields::new(p);
        let from = env.from.as_str().to_string();
        let id = env.message_id.clone();
        let send_key = k::sent(&from, &id);
        self.expire_at(rec.retain_until, &send_key);
        if let Some(boxes) = &c.sender_boxes {
            self.append(
                &from,
                Kind::Sent,
                env.canonical_text(),
                env.body_expires_at,
                &c.cert_text,
                boxes,
                None,
            )?;
        }
        let boxes_value = f.get("recipient_boxes").cloned().unwrap_or(Value::Null);
        let boxes_text = canonical::to_string(&boxes_value);
        let auth_text = f.get("authorization").map(canonical::to_string);
        let mut members: Vec<(&str, &str)> = vec![
            ("envelope", env.canonical_text()),
            ("recipient_boxes", &boxes_text),
            ("device_certificate", &c.cert_text),
        ];
        if let Some(a) = &auth_text {
            members.push(("authorization", a));
        }
        let body = canonical::object_of_canonical(&mut members);
        let Some(route) = c.route else {
            return Err(Error::new(
                ErrorCode::Internal,
                "cross-account delivery without a route",
            ));
        };
        self.txn.put(send_key.clone(), &rec);
        let task_rec = TaskRec {
            from: from.clone(),
            message_id: id.clone(),
            to: rec.to.clone(),
            target: route.relay,
            route_revision: route.revision,
            body: Canon::new(body),
            attempt: 0,
            failures: 0,
            state: TaskState::Waiting,
            next_at: self.now,
            deadline: rec.deadline,
            not_before: 0,
            last_error: None,
            uncertain: false,
            retain_until: rec.retain_until,
            park_order: 0,
            want_route_get: false,
            route_error: None,
            outage: false,
            sent_at: 0,
            accepted_at: self.now,
            carries: Vec::new(),
            rides: None,
        };
        // For local delivery the parsed deliver params go along, so it neither
        // re-parses them nor verifies the envelope again (it just verified).
        let parsed = (task_rec.target == self.cfg.relay.as_str()).then(|| {
            let mut deliver = Object::new();
            deliver.insert("recipient_boxes", boxes_value);
            deliver.insert("device_certificate", Value::Object(c.cert.raw().clone()));
            if let Some(a) = f.get("authorization") {
                deliver.insert("authorization", a.clone());
            }
            Incoming {
                params: deliver,
                envelope: env,
                certificate: Some((c.cert, c.cert_text)),
                routed_here: true,
                vouched: false,
            }
        });
        let kind = if parsed.is_some() { "local" } else { "cross" };
        Counters::bump(&mut self.counts.accepted, kind);
        self.start_task(&task_id(&from, &id), task_rec, parsed)?;
        let rec: SendRec = self.txn.get(&send_key)?.unwrap_or(rec);
        self.accepted("message.send", &from, &id, &rec.to, rec.status);
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
