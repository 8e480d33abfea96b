//! The operator's view: deliveries pending or failed, per destination, with last error and next attempt;
//! and the index entries ticks set aside.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{PeerRec, TaskRec, TaskState};
use super::storage::Storage;
use super::{Caller, Entropy};
use crate::wire::field::Fields;
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};

/// Most tasks listed by one call.
pub const MAX_LISTED: usize = 1000;

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `admin.deliveries` (operator): `{destination?, state?: "pending" | "failed"}`.
    pub(crate) fn admin_deliveries(&mut self, caller: &Caller, p: Object) -> Result<Value, Error> {
        if *caller != Caller::Operator {
            return Err(Error::new(ErrorCode::PermissionDenied, "operator only"));
        }
        let f = Fields::new(&p);
        let want = f.opt_str("state")?;
        if want.is_some_and(|s| s != "pending" && s != "failed") {
            return Err(Error::new(
                ErrorCode::InvalidParams,
                "`state` must be \"pending\" or \"failed\"",
            ));
        }
        let prefix = match f.opt_str("destination")? {
            Some(d) => k::destination_tasks(d),
            None => k::all_destinations(),
        };
        let mut list = Vec::new();
        for (key, _) in self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), MAX_LISTED)?
        {
            let Some((dest, id)) = k::by_destination_parts(&key) else {
                continue;
            };
            let Some(bytes) = self.txn.get_raw(&k::task(id))? else {
                continue;
            };
            let Ok(t) = serde_json::from_slice::<TaskRec>(&bytes) else {
                // A record that cannot be decoded is shown, not allowed to hide the rest.
                if want.is_none() {
                    let mut o = Object::new();
                    o.insert("destination", dest);
                    o.insert("task", id);
                    o.insert("state", "unreadable");
                    list.push(Value::Object(o));
                }
                continue;
            };
            let state = if t.state == TaskState::Done {
                "failed"
            } else {
                "pending"
            };
            if want.is_some_and(|w| w != state) {
                continue;
            }
            let peer: PeerRec = self.txn.get(&k::destination(dest))?.unwrap_or_default();
            let mut o = Object::new();
            o.insert("destination", dest);
            o.insert("from", t.from.as_str());
            o.insert("message_id", t.message_id.as_str());
            o.insert("to", t.to.as_str());
            o.insert("state", state);
            o.insert("phase", t.state.as_str());
            o.insert("attempts", t.attempt as u64);
            o.insert("deadline", t.deadline);
            if t.state != TaskState::Done {
                o.insert("next_attempt_at", t.next_at);
            }
            if let Some(e) = &t.last_error {
                o.insert("last_error", e.as_str());
            }
            o.insert("destination_in_flight", peer.in_flight as u64);
            list.push(Value::Object(o));
        }
        // Entries ticks had to set aside (Engine::try_tick), with their errors.
        let mut quarantined = Vec::new();
        let prefix = k::quarantine_prefix();
        for (_, v) in self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), MAX_LISTED)?
        {
            quarantined.push(crate::wire::json::parse(&v)?);
        }
        let mut out = Object::new();
        out.insert("deliveries", Value::Array(list));
        out.insert("quarantined", Value::Array(quarantined));
        Ok(Value::Object(out))
    }
}
