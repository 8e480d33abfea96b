//! The destination side: receiving validation rules 1 to 5 and `message.deliver`.
//!
//! The same rules run for cross-relay delivery (a peer calls
//! `message.deliver`) and local delivery (the source serves the recipient
//! too), over the same deliver params, so both leave the same receipt.

use super::context::{require_relay, Ctx};
use super::idempotency::{params_hash, take_envelope};
use super::keyspace as k;
use super::records::RecvRec;
use super::storage::Storage;
use super::timeline::Kind;
use super::{status, Caller, Entropy};
use crate::wire::authorization::{Authorization, AuthorizationError};
use crate::wire::certificate::DeviceCertificate;
use crate::wire::envelope::MessageEnvelope;
use crate::wire::field::{FieldError, Fields};
use crate::wire::identity::RelayId;
use crate::wire::json::{Object, Value};
use crate::wire::key_box::parse_boxes;
use crate::wire::signature::SignedObject;
use crate::{Error, ErrorCode};

/// message.deliver params, parsed to the depth needed for the logical key.
pub(crate) struct Incoming {
    /// The params without their `envelope` member (that is `envelope`).
    pub params: Object,
    pub envelope: MessageEnvelope,
    /// The certificate already parsed, with its canonical text (local delivery: the
    /// sender's registered certificate), so the receiving rules do not parse it again.
    pub certificate: Option<(DeviceCertificate, String)>,
    /// Rule 1 was checked in this transaction (local delivery straight from `message.send`,
    /// or `message.deliver` before its limits), so it need not be read again.
    pub routed_here: bool,
    /// Delivered by a sibling shard of this relay, which verified the certificate and the
    /// envelope signature when it accepted the message: rule 2 checks everything else again
    /// but not those two signatures (protocol decision, docs/protocol.md "Shards").
    pub vouched: bool,
}

impl Incoming {
    /// Parameter shape: the members' types, and the envelope's object constraints (it holds the key).
    pub(crate) fn parse(mut params: Object) -> Result<Incoming, Error> {
        let f = Fields::new(&params);
        f.array("recipient_boxes")?;
        f.object("device_certificate")?;
        f.opt_object("authorization")?;
        let envelope = take_envelope(&mut params)?;
        Ok(Incoming {
            params,
            envelope,
            certificate: None,
            routed_here: false,
            vouched: false,
        })
    }
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `message.deliver` (relay): the destination's idempotent receipt.
    pub(crate) fn message_deliver(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let mut inc = Incoming::parse(p)?;
        let peer = require_relay(caller)?.clone();
        let revision = self.targeted_revision(caller, &peer)?;
        let from = inc.envelope.from.as_str().to_string();
        let id = inc.envelope.message_id.clone();
        let hash = params_hash(&inc.params, &inc.envelope, self.crypto);
        if let Some(answer) = self.received_before(&from, &id, &hash)? {
            return Ok(answer);
        }
        if inc.envelope.from == inc.envelope.to {
            return Err(Error::new(
                ErrorCode::InvalidParams,
                "self-delivery is never delivered between relays",
            ));
        }
        // The highest route held for the recipient, read once for rule 6 and rule 1.
        let to = inc.envelope.to.as_str();
        let held = self.held_route(to)?;
        let me = self.cfg.relay.as_str();
        // Home spans (rule 6): an attempt aimed at an older revision of the recipient's route
        // than the highest held is from before a move, refused with that route even when it
        // names this relay (a move away and back), so no message is accepted at two homes.
        if let (Some(rev), Some(h)) = (revision, &held) {
            if rev < h.revision {
                // Counted where only this rule refuses it: the account is served here again.
                if h.relay == me {
                    super::metrics::Counters::bump(&mut self.counts.home_spans, "stale_delivery");
                }
                return Err(self.not_home(to));
            }
        }
        // Rule 1 before any limit is charged: a relay that does not serve the recipient (a
        // former home among them) answers with the route it holds, at no cost to anyone.
        let routed_here = held.is_some_and(|h| h.relay == me);
        if !routed_here || self.txn.get_raw(&k::account(to))?.is_none() {
            return Err(self.not_home(to));
        }
        inc.routed_here = true;
        // A sibling shard of this relay is not a foreign source: as for a local delivery,
        // only the recipient's own limits apply (the sender's shard took its send_rate), and
        // what it verified when it accepted the message is not verified again.
        inc.vouched = peer == self.cfg.relay;
        if !inc.vouched {
            self.take_token("deliver", peer.as_str(), self.cfg.policies.deliver_rate)?;
        }
        self.take_sender_allowance(&inc)?;
        self.take_token(
            "deliver_to",
            inc.envelope.to.as_str(),
            self.cfg.policies.deliver_rate_per_account,
        )?;
        self.peer_is_back(peer.as_str())?;
        let r = self.receive(&inc, &hash)?;
        super::metrics::Counters::bump(&mut self.counts.accepted, "received");
        let to = inc.envelope.to.as_str();
        self.accepted(
            "message.deliver",
            &from,
            &id,
            to,
            status::Status::TargetAccepted,
        );
        Ok(status::from_receipt(&from, &id, &r))
    }

    /// The recipient's route revision a deliver targets (its signed `Relay-Route-Revision`):
    /// required of another relay (`invalid_params` without it); none for a sibling shard of
    /// this relay, whose step carries no relay request and is never delayed in a network.
    fn targeted_revision(&self, caller: &Caller, peer: &RelayId) -> Result<Option<u64>, Error> {
        match caller {
            Caller::Relay {
                route_revision: Some(rev),
                ..
            } => Ok(Some(*rev)),
            _ if *peer == self.cfg.relay => Ok(None),
            _ => Err(Error::new(
                ErrorCode::InvalidParams,
                "message.deliver needs Relay-Route-Revision: the recipient's route revision it targets",
            )),
        }
    }

    /// One sender's share of a recipient's deliveries (`deliver_rate_per_sender`), taken
    /// before the recipient's own bucket so that no sender can keep that one empty.
    pub(crate) fn take_sender_allowance(&mut self, inc: &Incoming) -> Result<(), Error> {
        let pair = format!(
            "{}\n{}",
            inc.envelope.to.as_str(),
            inc.envelope.from.as_str()
        );
        let rate = self.cfg.policies.deliver_rate_per_sender;
        self.limiter.take("deliver_from", &pair, rate, self.now)
    }

    /// Receiving validation rules 1 to 5 in order; on success appends the received record and stores the receipt.
    pub(crate) fn receive(&mut self, inc: &Incoming, hash: &str) -> Result<RecvRec, Error> {
        let env = &inc.envelope;
        let to = env.to.as_str();
        let tol = self.cfg.policies.clock_tolerance;
        // Rule 1: this relay is the home designated by the recipient's current route
        // (the account record is kept for rule 4 and the append).
        let acct = if inc.routed_here {
            self.txn.get(&k::account(to))?
        } else {
            self.home_account(to)?
        };
        let Some(acct) = acct else {
            return Err(self.not_home(to));
        };
        // Rule 2: object constraints, the certificate, the envelope signature.
        let f = Fields::new(&inc.params);
        let boxes = parse_boxes(
            "recipient_boxes",
            f.get("recipient_boxes").unwrap_or(&Value::Null),
            self.cfg.policies.max_boxes as usize,
        )?;
        if env.network != self.cfg.network {
            return Err(FieldError::invalid("envelope.network", "is another network").into());
        }
        let parsed;
        let (cert, cert_text): (_, std::borrow::Cow<'_, str>) = match &inc.certificate {
            Some((cert, text)) => (cert, text.as_str().into()),
            None => {
                parsed = DeviceCertificate::parse(f.object("device_certificate")?.clone())
                    .map_err(|e| e.within("device_certificate"))?;
                (&parsed, parsed.canonical_string().into())
            }
        };
        if inc.vouched {
            cert.check_unsigned(&self.cfg.network)?;
            env.names_sender_of(cert)?;
        } else {
            cert.verify_in(&self.cfg.network, self.crypto)?;
            env.verify_with_in(cert, self.crypto)?;
        }
        cert.check_valid_at(env.created_at, tol)?;
        // Rule 3: this relay's clock tolerance and delivery age limit.
        self.check_created_at(env.created_at)?;
        // Rule 4: account access authorization.
        let auth = f
            .opt_object("authorization")?
            .map(|o| Authorization::parse(o.clone()).map_err(|e| e.within("authorization")))
            .transpose()?;
        match &auth {
            Some(a) => self.check_authorization(a, env)?,
            None if !acct.discoverable => {
                return Err(Error::new(
                    ErrorCode::DiscoveryDisabled,
                    "no authorization given and the recipient does not allow public discovery",
                ))
            }
            None => {}
        }
        // Rule 5: at least one box names a device valid now.
        let visible = self.visible_devices(to, &boxes)?;
        if visible.is_empty() {
            return Err(Error::new(
                ErrorCode::DeviceUnknown,
                "no recipient box names a valid device of the recipient",
            ));
        }
        if let Some(Authorization::Invite(i)) = &auth {
            self.txn.put_raw(
                k::invite_use(to, &i.invite_id, env.from.as_str()),
                Vec::new(),
            );
        }
        self.append(
            to,
            Kind::Received,
            env.canonical_text(),
            env.body_expires_at,
            &cert_text,
            &boxes,
            Some((acct, visible)),
        )?;
        let retain_until = self.now.saturating_add(self.cfg.policies.message_retention);
        let rec = RecvRec {
            hash: hash.to_string(),
            to: to.to_string(),
            accepted_at: self.now,
            retain_until,
        };
        let key = k::received(env.from.as_str(), &env.message_id);
        self.txn.put(key.clone(), &rec);
        self.expire_at(retain_until, &key);
        Ok(rec)
    }

    /// `created_at` within this relay's clock tolerance and delivery age limit.
    pub(crate) fn check_created_at(&self, created_at: u64) -> Result<(), Error> {
        let p = &self.cfg.policies;
        if created_at > self.now.saturating_add(p.clock_tolerance) {
            return Err(Error::new(
                ErrorCode::ClockSkew,
                "envelope created_at is beyond now plus clock tolerance",
            ));
        }
        if self.now > created_at.saturating_add(p.message_delivery_age_limit) {
            return Err(Error::new(
                ErrorCode::MessageExpired,
                "envelope is older than the message delivery age limit",
            ));
        }
        Ok(())
    }

    /// Rule 4 for a present authorization: stateless checks, then revocation and use counts.
    fn check_authorization(
        &mut self,
        a: &Authorization,
        env: &MessageEnvelope,
    ) -> Result<(), Error> {
        a.verify_in(
            &self.cfg.network,
            &env.from,
            &env.to,
            self.now,
            self.cfg.policies.clock_tolerance,
            self.crypto,
        )?;
        let to = env.to.as_str();
        if self.txn.get_raw(&k::contact_revoked(to, a.id()))?.is_some() {
            return Err(AuthorizationError::Revoked.into());
        }
        if let Authorization::Invite(i) = a {
            if let Some(max) = i.max_uses {
                let sender = env.from.as_str();
                if self
                    .txn
                    .get_raw(&k::invite_use(to, &i.invite_id, sender))?
                    .is_none()
                {
                    let prefix = k::invite_uses(to, &i.invite_id);
                    let used = self
                        .txn
                        .scan(&prefix, &k::prefix_end(&prefix), max as usize)?
                        .len() as u64;
                    if used >= max {
                        return Err(AuthorizationError::UsedUp.into());
                    }
                }
            }
        }
        Ok(())
    }
}
