//! The operator's view: deliveries pending or failed, per destination, with last error and
//! next attempt; each destination's health and queue; and the index entries ticks set aside.
//! Every listing is a page with a cursor (`after`, answered `next`), so each row of a relay
//! with any number of destinations or deliveries is reachable, at a bounded cost per call.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{PeerRec, SendRec, TaskRec, TaskState};
use super::storage::Storage;
use super::{Effect, Entropy};
use crate::wire::field::Fields;
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};

/// Most tasks listed by one call.
pub const MAX_LISTED: usize = 1000;

/// Deliveries one `admin.destination.retry` call brings forward at most (its `next` goes on).
pub const RETRY_BATCH: usize = 1000;

/// Destinations listed by one `admin.destinations` call unless `limit` says otherwise.
pub const DESTINATIONS_PAGE: usize = 100;

/// Most destination records one `admin.destinations` call reads, per row it may answer: a
/// filter that matches few rows answers a short page with `next` rather than read them all.
const READ_PER_ROW: usize = 4;

/// `limit` of a listing: 1 to [`MAX_LISTED`], `default` when absent.
fn page_limit(f: &Fields<'_>, default: usize) -> Result<usize, Error> {
    match f.opt_int("limit")? {
        None => Ok(default),
        Some(n) if (1..=MAX_LISTED as u64).contains(&n) => Ok(n as usize),
        Some(_) => Err(Error::new(
            ErrorCode::InvalidParams,
            format!("`limit` must be 1 to {MAX_LISTED}"),
        )),
    }
}

/// The first key after `key` (a page's scan starts there, past the cursor's own row).
fn just_after(mut key: Vec<u8>) -> Vec<u8> {
    key.push(0);
    key
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// `admin.deliveries` (operator): `{destination?, state?: "pending" | "failed"}`.
    pub(crate) fn admin_deliveries(&mut self, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let want = f.opt_str("state")?;
        if want.is_some_and(|s| s != "pending" && s != "failed") {
            return Err(Error::new(
                ErrorCode::InvalidParams,
                "`state` must be \"pending\" or \"failed\"",
            ));
        }
        let limit = page_limit(&f, MAX_LISTED)?;
        let prefix = match f.opt_str("destination")? {
            Some(d) => k::destination_tasks(d),
            None => k::all_destinations(),
        };
        // `after`: the `next` of the previous page, "{destination}\n{task}".
        let start = match f.opt_str("after")? {
            None => prefix.clone(),
            Some(c) => match c.split_once('\n') {
                Some((dest, task)) if !dest.is_empty() && !task.is_empty() => {
                    just_after(k::by_destination(dest, task)).max(prefix.clone())
                }
                _ => {
                    return Err(Error::new(
                        ErrorCode::InvalidParams,
                        "`after` must be the `next` of a previous page",
                    ))
                }
            },
        };
        let rows = self.txn.scan(&start, &k::prefix_end(&prefix), limit)?;
        let next = (rows.len() == limit)
            .then(|| {
                rows.last()
                    .and_then(|(key, _)| k::by_destination_parts(key))
            })
            .flatten()
            .map(|(dest, id)| format!("{dest}\n{id}"));
        let mut list = Vec::new();
        for (key, _) in rows {
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
        // A full page may have more after it: the scan's last row, whatever the filter kept.
        if let Some(n) = next {
            out.insert("next", n);
        }
        out.insert("quarantined", Value::Array(quarantined));
        Ok(Value::Object(out))
    }

    /// `admin.destinations` (operator): `{after?, limit?, failing?, paused?}`, one row per destination
    /// this relay has delivered to, in the order of their ids: deliveries pending and in
    /// flight, consecutive failures and since when, the last success and the last error.
    /// `failing: true` keeps those whose latest attempt failed, `paused: true` those the
    /// operator paused. Read from each destination's
    /// own record (its counters are kept as deliveries start and end), never from its
    /// deliveries.
    pub(crate) fn admin_destinations(&mut self, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let limit = page_limit(&f, DESTINATIONS_PAGE)?;
        let failing = f.opt_bool("failing")?.unwrap_or(false);
        let paused = f.opt_bool("paused")?.unwrap_or(false);
        let prefix = k::all_peers();
        let start = match f.opt_str("after")? {
            Some(d) if !d.is_empty() => just_after(k::destination(d)),
            Some(_) => {
                return Err(Error::new(
                    ErrorCode::InvalidParams,
                    "`after` must be a destination of a previous page",
                ))
            }
            None => prefix.clone(),
        };
        let budget = limit.saturating_mul(READ_PER_ROW);
        let rows = self.txn.scan(&start, &k::prefix_end(&prefix), budget)?;
        let exhausted = rows.len() < budget;
        let mut list = Vec::new();
        // The last destination read, and whether the page filled before the rows read ended.
        let mut last = None;
        let mut full = false;
        for (key, bytes) in &rows {
            if list.len() == limit {
                full = true;
                break;
            }
            let Some(dest) = k::destination_relay(key) else {
                continue;
            };
            last = Some(dest);
            let Ok(peer) = serde_json::from_slice::<PeerRec>(bytes) else {
                // A record that cannot be decoded is shown, not allowed to hide the rest.
                let mut o = Object::new();
                o.insert("destination", dest);
                o.insert("state", "unreadable");
                list.push(Value::Object(o));
                continue;
            };
            if (failing && peer.consecutive_failures == 0) || (paused && !peer.paused) {
                continue;
            }
            let mut o = Object::new();
            o.insert("destination", dest);
            o.insert("pending", peer.pending);
            o.insert("in_flight", peer.in_flight as u64);
            o.insert("failed", peer.failed);
            o.insert("consecutive_failures", peer.consecutive_failures as u64);
            if let Some(at) = peer.failing_since {
                o.insert("failing_since", at);
            }
            if let Some(at) = peer.last_success_at {
                o.insert("last_success_at", at);
            }
            if let Some(code) = &peer.last_error {
                let mut e = Object::new();
                e.insert("code", code.as_str());
                e.insert("message", peer.last_error_message.as_deref().unwrap_or(""));
                o.insert("last_error", Value::Object(e));
            }
            // The first entry of each of its time indexes: one read each, whatever it holds.
            if peer.pending > 0 {
                if let Some(at) = self.first_time(&k::retries_of(dest))? {
                    o.insert("next_attempt_at", at);
                }
                if let Some(at) = self.first_time(&k::pending_of(dest))? {
                    o.insert("oldest_pending_at", at);
                    o.insert("oldest_pending_age_ms", self.now.saturating_sub(at));
                }
            }
            o.insert("paused", peer.paused);
            list.push(Value::Object(o));
        }
        let mut out = Object::new();
        out.insert("destinations", Value::Array(list));
        // More may follow when the page filled first, or the read budget ended before the
        // destinations did (a short page under a filter): continue after the last one read.
        if full || !exhausted {
            if let Some(d) = last {
                out.insert("next", d);
            }
        }
        Ok(Value::Object(out))
    }

    /// `admin.destination.retry` (operator): `{destination, after?}`. Every delivery to the
    /// destination that waits for its next attempt becomes due now, as when a destination
    /// comes back: no earlier than a `retry_after` it asked for, never after the deadline. A
    /// delivery in flight or waiting for a slot is left as it is. At most [`RETRY_BATCH`] per
    /// call; `next` (as `after`) continues.
    pub(crate) fn admin_destination_retry(&mut self, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let dest = f.str("destination")?;
        self.known_destination(dest)?;
        let prefix = k::destination_tasks(dest);
        let start = match f.opt_str("after")? {
            Some(task) if !task.is_empty() => just_after(k::by_destination(dest, task)),
            Some(_) => {
                return Err(Error::new(
                    ErrorCode::InvalidParams,
                    "`after` must be the `next` of a previous call",
                ))
            }
            None => prefix.clone(),
        };
        let rows = self
            .txn
            .scan(&start, &k::prefix_end(&prefix), RETRY_BATCH)?;
        let next = (rows.len() == RETRY_BATCH)
            .then(|| {
                rows.last()
                    .and_then(|(key, _)| k::by_destination_parts(key))
            })
            .flatten()
            .map(|(_, id)| id.to_string());
        let mut moved = 0u64;
        for (key, _) in &rows {
            let Some((_, id)) = k::by_destination_parts(key) else {
                continue;
            };
            let id = id.to_string();
            if let Some(t) = self.task_or_skip(&id)? {
                if self.due_now(&id, t) {
                    moved += 1;
                }
            }
        }
        self.operator_action("destination.retry", dest, moved, moved > 0);
        let mut out = Object::new();
        out.insert("destination", dest);
        out.insert("brought_forward", moved);
        if let Some(n) = next {
            out.insert("next", n);
        }
        Ok(Value::Object(out))
    }

    /// `admin.delivery.retry` (operator): `{from, message_id}`. The delivery becomes due now
    /// if it waits for its next attempt (no earlier than a `retry_after`, never after the
    /// deadline); in flight or waiting for a slot it stays. A delivery that ended is
    /// `state_conflict` (its result never changes), one this relay never accepted `not_found`.
    pub(crate) fn admin_delivery_retry(&mut self, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let (from, id) = (f.str("from")?, f.random_id("message_id")?);
        let task = super::send::task_id(from, &id);
        let live = self
            .task_or_skip(&task)?
            .filter(|t| t.state != TaskState::Done);
        let Some(t) = live else {
            return match self.txn.get::<SendRec>(&k::sent(from, &id))? {
                Some(r) if r.status.is_terminal() => Err(Error::new(
                    ErrorCode::StateConflict,
                    format!("the delivery has ended: {}", r.status.as_str()),
                )),
                _ => Err(Error::new(
                    ErrorCode::NotFound,
                    "no delivery of that message is pending here",
                )),
            };
        };
        let phase = t.state.as_str();
        let moved = self.due_now(&task, t);
        self.operator_action("delivery.retry", &task, u64::from(moved), moved);
        let mut out = Object::new();
        out.insert("phase", phase);
        out.insert("brought_forward", moved);
        Ok(Value::Object(out))
    }

    /// The record of a destination this relay has delivered to; `not_found` for any other.
    fn known_destination(&mut self, dest: &str) -> Result<PeerRec, Error> {
        self.txn
            .get::<PeerRec>(&k::destination(dest))?
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::NotFound,
                    "this relay has never delivered to that destination",
                )
            })
    }

    /// The time of the first key under `prefix` (a destination's retry or age index).
    fn first_time(&mut self, prefix: &[u8]) -> Result<Option<u64>, Error> {
        let first = self.txn.scan(prefix, &k::prefix_end(prefix), 1)?;
        Ok(first
            .first()
            .and_then(|(key, _)| k::time_under(key, prefix)))
    }

    /// Records an operator action: an audit event for the host's log, always (an action
    /// that changed nothing is logged with `touched: 0`), and a count in
    /// `relay_operator_actions_total` when it changed something. Both leave with the
    /// operation's commit, or not at all.
    fn operator_action(
        &mut self,
        action: &'static str,
        subject: &str,
        touched: u64,
        changed: bool,
    ) {
        if changed {
            super::metrics::Counters::bump(&mut self.counts.operator_actions, action);
        }
        self.effects
            .push(Effect::OperatorAction(super::effect::OperatorAction {
                action,
                subject: subject.to_string(),
                touched,
            }));
    }

    /// Makes a task that waits for its next attempt due now: no earlier than its
    /// `retry_after`, no later than its deadline (the tick at the deadline ends it). Whether
    /// it moved.
    fn due_now(&mut self, id: &str, mut t: TaskRec) -> bool {
        if t.state != TaskState::Waiting {
            return false;
        }
        let at = self.now.max(t.not_before).min(t.deadline);
        if t.next_at <= at {
            return false;
        }
        let old = self.slot(&t);
        if t.outage {
            // Out of the destination's outage index: it no longer waits for the comeback.
            self.txn.delete(k::outage(&t.target, id));
            t.outage = false;
        }
        t.next_at = at;
        self.reindex(id, old, &t);
        self.save_task(id, &t);
        true
    }

    /// `admin.destination.pause` and `admin.destination.resume` (operator): `{destination}`.
    /// Paused, a destination starts no attempt: what is accepted for it, and what comes due,
    /// is parked as if it had no free slot, and the tick still ends each at its deadline
    /// (`deadline_exceeded`); attempts already out finish. Resumed, its parked deliveries
    /// start as slots allow, oldest first. The state is the destination's record, so it
    /// survives restarts. Answers the destination's state after the call.
    pub(crate) fn admin_destination_hold(
        &mut self,
        p: Object,
        paused: bool,
    ) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let dest = f.str("destination")?;
        let mut peer = self.known_destination(dest)?;
        let changed = peer.paused != paused;
        peer.paused = paused;
        self.save_peer(dest, &peer);
        let mut started = 0u64;
        if changed && !paused {
            let free = self
                .cfg
                .max_in_flight_per_destination
                .saturating_sub(peer.in_flight);
            for _ in 0..free {
                match self.launch_parked(dest)? {
                    Some(n) => started += n,
                    None => break,
                }
            }
        }
        // It holds (or releases) every delivery still pending for the destination.
        let touched = if changed { peer.pending } else { 0 };
        self.operator_action(
            if paused {
                "destination.pause"
            } else {
                "destination.resume"
            },
            dest,
            touched,
            changed,
        );
        let mut out = Object::new();
        out.insert("destination", dest);
        out.insert("paused", paused);
        out.insert("changed", changed);
        if !paused {
            out.insert("started", started);
        }
        Ok(Value::Object(out))
    }

    /// `admin.quarantine` (operator): `{after?, limit?}`, the entries ticks set aside, in
    /// key order, each with its `id` (base64url of the entry's key, what `drop` and
    /// `requeue` take), the entry as text, the error that set it aside and when.
    pub(crate) fn admin_quarantine(&mut self, p: Object) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let limit = page_limit(&f, DESTINATIONS_PAGE)?;
        let prefix = k::quarantine_prefix();
        let start = match f.opt_str("after")? {
            None => prefix.clone(),
            Some(id) => just_after(k::quarantine(&quarantine_entry(id)?)),
        };
        let rows = self.txn.scan(&start, &k::prefix_end(&prefix), limit)?;
        let mut list = Vec::new();
        let mut last = None;
        for (key, v) in &rows {
            let entry = &key[prefix.len()..];
            let id = crate::wire::base64url::encode(entry);
            let mut o = match crate::wire::json::parse(v) {
                Ok(Value::Object(o)) => o,
                _ => Object::new(),
            };
            o.insert("id", id.as_str());
            list.push(Value::Object(o));
            last = Some(id);
        }
        let mut out = Object::new();
        out.insert("quarantined", Value::Array(list));
        if rows.len() == limit {
            if let Some(id) = last {
                out.insert("next", id);
            }
        }
        Ok(Value::Object(out))
    }

    /// `admin.quarantine.drop` and `admin.quarantine.requeue` (operator): `{id}`. Drop
    /// forgets a set-aside entry for good. Requeue gives it back to the tick as it was
    /// (every tick entry is a key with an empty value), which processes it again: once the
    /// cause is fixed it goes through, else it is set aside again.
    pub(crate) fn admin_quarantine_act(
        &mut self,
        p: Object,
        requeue: bool,
    ) -> Result<Value, Error> {
        let f = Fields::new(&p);
        let id = f.str("id")?;
        let entry = quarantine_entry(id)?;
        let key = k::quarantine(&entry);
        if self.txn.get_raw(&key)?.is_none() {
            return Err(Error::new(ErrorCode::NotFound, "no such quarantined entry"));
        }
        self.txn.delete(key);
        if requeue {
            self.txn.put_raw(entry, Vec::new());
            self.rescheduled = true;
        }
        self.operator_action(
            if requeue {
                "quarantine.requeue"
            } else {
                "quarantine.drop"
            },
            id,
            1,
            true,
        );
        let mut out = Object::new();
        out.insert("id", id);
        out.insert(if requeue { "requeued" } else { "dropped" }, true);
        Ok(Value::Object(out))
    }
}

/// The entry key a quarantine `id` names.
fn quarantine_entry(id: &str) -> Result<Vec<u8>, Error> {
    crate::wire::base64url::decode(id)
        .filter(|e| !e.is_empty())
        .ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidParams,
                "`id` must be the id of a quarantined entry",
            )
        })
}
