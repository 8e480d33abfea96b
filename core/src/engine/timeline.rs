//! Account message timelines: append at acceptance, sync per device.
//!
//! Sequences start at 1 per account and strictly increase. Who may read a
//! record is fixed when it is appended: devices with a box in it that are
//! valid at that moment. Later device changes never recompute it.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{AccountRec, BoxRec, Canon, RecordRec};
use super::session::Need;
use super::storage::Storage;
use super::{Caller, Effect, Entropy};
use crate::wire::canonical;
use crate::wire::field::{FieldError, Fields};
use crate::wire::json::{Object, Value};
use crate::wire::key_box::KeyBox;
use crate::{Error, ErrorCode};

/// Largest `limit` of one sync page.
pub(crate) const MAX_SYNC_LIMIT: u64 = 500;
/// `limit` when the request has none.
pub(crate) const DEFAULT_SYNC_LIMIT: u64 = 100;

/// The record kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Sent,
    Received,
    SelfDelivery,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Sent => "sent",
            Kind::Received => "received",
            Kind::SelfDelivery => "self",
        }
    }
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// Appends a record to `account`'s timeline and notifies its devices; returns the sequence.
    ///
    /// `known` is the account record and the boxes' valid devices when the caller has
    /// just read them (the receiving rules do), so they are not read again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        account: &str,
        kind: Kind,
        envelope: &str,
        body_expires_at: Option<u64>,
        certificate: &str,
        boxes: &[KeyBox],
        known: Option<(AccountRec, Vec<String>)>,
    ) -> Result<u64, Error> {
        let (mut acct, visible) = match known {
            Some(k) => k,
            None => {
                let acct: AccountRec = self.txn.get(&k::account(account))?.ok_or_else(|| {
                    Error::new(ErrorCode::Internal, "append to an account not served here")
                })?;
                (acct, self.visible_devices(account, boxes)?)
            }
        };
        acct.latest_seq += 1;
        let seq = acct.latest_seq;
        self.txn.put(k::account(account), &acct);
        let mut stored = Vec::with_capacity(boxes.len());
        for b in boxes {
            let id = b.device_id.as_str();
            stored.push(BoxRec {
                device_id: id.to_string(),
                key_box: Canon::new(canonical::object_to_string(b.raw())),
            });
        }
        let expires_at = self.now.saturating_add(self.cfg.policies.message_retention);
        let key = k::record(account, seq);
        self.txn.put(
            key.clone(),
            &RecordRec {
                seq,
                kind: kind.as_str().to_string(),
                accepted_at: self.now,
                expires_at,
                body_expires_at,
                envelope: Canon::new(envelope.to_string()),
                certificate: Canon::new(certificate.to_string()),
                boxes: stored,
                visible,
            },
        );
        self.expire_at(expires_at, &key);
        self.effects.push(Effect::Notify {
            account: account.to_string(),
            latest_seq: seq,
        });
        Ok(seq)
    }

    /// The devices of `boxes` valid in the account's device state now: who may read a
    /// record appended now, and (when empty) the failure of receiving rule 5.
    pub(crate) fn visible_devices(
        &mut self,
        account: &str,
        boxes: &[KeyBox],
    ) -> Result<Vec<String>, Error> {
        let mut visible = Vec::new();
        for b in boxes {
            if self.valid_device(account, b.device_id.as_str())?.is_some() {
                visible.push(b.device_id.as_str().to_string());
            }
        }
        Ok(visible)
    }

    /// `message.timeline.sync` (`sync`): `{after, limit?}`.
    pub(crate) fn timeline_sync(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        let s = self.session(caller, Need::Sync)?;
        let f = Fields::new(&p);
        let after = f.int("after")?;
        let limit = f.opt_int("limit")?.unwrap_or(DEFAULT_SYNC_LIMIT);
        if !(1..=MAX_SYNC_LIMIT).contains(&limit) {
            return Err(
                FieldError::invalid("limit", format!("must be 1 to {MAX_SYNC_LIMIT}")).into(),
            );
        }
        let acct: AccountRec = self
            .txn
            .get(&k::account(&s.account))?
            .ok_or_else(|| Error::new(ErrorCode::NotFound, "account not registered here"))?;
        let prefix = k::timeline(&s.account);
        let end = k::prefix_end(&prefix);
        let mut entries = Vec::new();
        let mut next = after;
        // Bounds of one call: `limit` entries; `max_sync_bytes` of entries (at least one, so a
        // client always advances); `10 * limit` records examined (protocol.md §4); and four
        // times the page budget of record bytes read, so pages of records the device cannot
        // read cost no more than a full page. Rows are read in chunks of a default page
        // (one scan for most pages; at most 100 records in memory at once).
        const CHUNK: u64 = DEFAULT_SYNC_LIMIT;
        let max_bytes = self.cfg.policies.max_sync_bytes.max(1) as usize;
        let read_budget = max_bytes.saturating_mul(4);
        let (mut page_bytes, mut read_bytes) = (0usize, 0usize);
        let mut examine = limit * 10;
        'chunks: while examine > 0 {
            let want = CHUNK.min(examine).min(limit * 10);
            let rows = self.txn.scan(
                &k::record(&s.account, next.saturating_add(1)),
                &end,
                want as usize,
            )?;
            let full = rows.len() as u64 == want;
            for (_, v) in rows {
                let r: RecordRec = serde_json::from_slice(&v)
                    .map_err(|e| Error::new(ErrorCode::Internal, format!("corrupt record: {e}")))?;
                let readable = self.now < r.expires_at
                    && r.body_expires_at.is_none_or(|t| self.now < t)
                    && r.visible.contains(&s.device_id);
                let own_box = if readable {
                    r.boxes.into_iter().find(|b| b.device_id == s.device_id)
                } else {
                    None
                };
                if let Some(b) = own_box {
                    let size = r.envelope.as_str().len()
                        + r.certificate.as_str().len()
                        + b.key_box.as_str().len()
                        + 128;
                    if !entries.is_empty() && page_bytes + size > max_bytes {
                        // The page is full: this record starts the next one.
                        break 'chunks;
                    }
                    page_bytes += size;
                    // The stored texts are canonical: the answer copies them as they are.
                    let mut e = Object::new();
                    e.insert("seq", r.seq);
                    e.insert("kind", r.kind);
                    e.insert("accepted_at", r.accepted_at);
                    e.insert("expires_at", r.expires_at);
                    e.insert("envelope", r.envelope.into_value());
                    e.insert("device_certificate", r.certificate.into_value());
                    e.insert("key_box", b.key_box.into_value());
                    entries.push(Value::Object(e));
                }
                next = r.seq;
                examine -= 1;
                read_bytes += v.len();
                if entries.len() as u64 == limit || read_bytes >= read_budget {
                    break 'chunks;
                }
            }
            if !full {
                break;
            }
        }
        // Whether a higher sequence still exists (records past retention are gone).
        let has_more = acct.latest_seq > next
            && !self
                .txn
                .scan(&k::record(&s.account, next.saturating_add(1)), &end, 1)?
                .is_empty();
        let mut out = Object::new();
        out.insert("entries", Value::Array(entries));
        out.insert("next", next);
        out.insert("has_more", has_more);
        Ok(Value::Object(out))
    }
}
