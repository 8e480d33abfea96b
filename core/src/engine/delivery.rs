//! The source's delivery responsibility: tasks, attempts, outcomes, backoff, deadlines, target switching.
//!
//! Every task has its own timer in the due index, so one slow or dead
//! destination never delays another (no head-of-line blocking); each
//! destination has at most `max_in_flight_per_destination` attempts out, and
//! the rest park in arrival order until a slot frees. Each task keeps its own
//! backoff, exponential with full jitter above a floor of `retry_initial`,
//! capped at `retry_max`: another message's success never resets it, so a
//! message a destination keeps refusing stays spaced out. A destination that
//! shows it is back (it calls us, or answers a delivery) gets only the tasks
//! whose last failure was an outage (not attempted, unknown) brought
//! forward, `revive_batch` of them at once and as many every `retry_initial`,
//! still honouring any retry_after: every step's work is bounded.

use super::context::Ctx;
use super::keyspace as k;
use super::metrics::Counters;
use super::receive::Incoming;
use super::records::{ErrorRec, SendRec, TaskRec, TaskState};
use super::status::{accepted_at_if_target_accepted, Status};
use super::storage::Storage;
use super::{batch, Effect, Entropy, Outcome, PeerMethod};
use crate::wire::canonical;
use crate::wire::field::Fields;
use crate::wire::json::{self, Object, Value};
use crate::wire::route::Route;
use crate::{Error, ErrorCode};

/// One attempt of a task: its id and attempt number (a batch's items, by the reporter).
type Attempt = (String, u32);

/// How the source reacts to a destination's error code (protocol.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reaction {
    Fail,
    Retry,
    RateLimited,
    RouteError,
    Unknown,
}

/// The reaction to an error code; a code this relay does not know says nothing certain
/// about the attempt, so it is an unknown outcome (no target switch may follow it).
pub(crate) fn reaction(code: &str) -> Reaction {
    match ErrorCode::parse(code) {
        None => Reaction::Unknown,
        Some(
            ErrorCode::InvalidParams
            | ErrorCode::PayloadTooLarge
            | ErrorCode::PermissionDenied
            | ErrorCode::InvalidSignature
            | ErrorCode::InvalidCertificate
            | ErrorCode::MessageExpired
            | ErrorCode::AuthorizationInvalid
            | ErrorCode::DiscoveryDisabled
            | ErrorCode::DeviceUnknown
            | ErrorCode::StateConflict
            | ErrorCode::NotFound,
        ) => Reaction::Fail,
        Some(ErrorCode::NotHomeRelay) => Reaction::RouteError,
        Some(ErrorCode::RateLimited) => Reaction::RateLimited,
        _ => Reaction::Retry,
    }
}

fn error_rec(e: &Error) -> ErrorRec {
    ErrorRec {
        code: e.code.as_str().to_string(),
        message: e.message.clone(),
        data: e.data.as_ref().map(canonical::to_string),
    }
}

/// A valid `data.retry_after` (integer milliseconds) of a rate_limited error.
fn retry_after(data: Option<&Value>) -> Option<u64> {
    data?.as_object()?.get("retry_after")?.as_protocol_int()
}

/// A peer's `{"error": {...}}` body as it came.
/// What an operator reads beside an outage's code (no answer carried a message).
fn outage_message(code: &str) -> &'static str {
    if code == "result_unknown" {
        "no answer came back from the destination"
    } else {
        "the destination could not be reached"
    }
}

fn parse_error_body(body: &[u8]) -> Option<(ErrorRec, Option<Value>)> {
    let o = json::parse_object(body).ok()?;
    let inner = Fields::new(&o).object("error").ok()?;
    let f = Fields::new(inner);
    let data = f.get("data").cloned();
    Some((
        ErrorRec {
            code: f.str("code").ok()?.to_string(),
            message: f.str("message").unwrap_or("").to_string(),
            data: data.as_ref().map(canonical::to_string),
        },
        data,
    ))
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// A task record, or none when it cannot be decoded: work on other tasks (a destination
    /// coming back, a freed slot) goes on around a bad record, which the tick that
    /// reaches its due entry quarantines. A store fault is still the operation's failure.
    pub(crate) fn task_or_skip(&mut self, id: &str) -> Result<Option<TaskRec>, Error> {
        let Some(bytes) = self.txn.get_raw(&k::task(id))? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&bytes).ok())
    }

    pub(crate) fn save_task(&mut self, id: &str, t: &TaskRec) {
        self.txn.put(k::task(id), t);
    }

    /// Whether the task's recipient is served by this engine: this relay, and this shard
    /// of it (an account of a sibling shard is reached by relay RPC, as another relay is).
    pub(crate) fn is_local(&self, t: &TaskRec) -> bool {
        t.target == self.cfg.relay.as_str() && self.cfg.shard.owns(&t.to)
    }

    /// Takes responsibility for a new task and makes its first attempt now.
    ///
    /// The caller has read the task's record as absent, so the store holds no index entry
    /// of this id either: a local delivery that ends in this transaction writes none.
    /// `parsed` is the task body already parsed (by `message.send`), for local delivery.
    pub(crate) fn start_task(
        &mut self,
        id: &str,
        mut t: TaskRec,
        parsed: Option<Incoming>,
    ) -> Result<(), Error> {
        self.txn
            .put_new(k::by_destination(&t.target, id), Vec::new());
        if !self.is_local(&t) {
            self.count_pending(id, &t, true)?;
        }
        t.next_at = self.now;
        self.txn.put_new(k::due(t.next_at, id), Vec::new());
        self.rescheduled = true;
        if self.now < t.deadline && self.is_local(&t) {
            return self.deliver_locally(id, t, parsed);
        }
        self.launch(id, t)
    }

    /// Makes the next attempt of a task that is due, or ends it at its deadline.
    pub(crate) fn launch(&mut self, id: &str, mut t: TaskRec) -> Result<(), Error> {
        let old = self.slot(&t);
        if t.outage {
            // It leaves the waiting state: no longer one to bring forward.
            self.txn.delete(k::outage(&t.target, id));
            t.outage = false;
        }
        if self.now >= t.deadline {
            return self.deadline_exceeded(id, t);
        }
        if self.is_local(&t) {
            return self.deliver_locally(id, t, None);
        }
        let target = t.target.clone();
        let mut peer = self.peer(&target)?;
        // A destination the operator paused holds its deliveries as if it had no free slot:
        // parked until resumed, and ended by the tick at their deadline.
        if peer.paused || peer.in_flight >= self.cfg.max_in_flight_per_destination {
            peer.park_seq += 1;
            t.park_order = peer.park_seq;
            t.state = TaskState::Parked;
            t.next_at = t.deadline;
            self.txn
                .put_raw(k::parked(&target, t.park_order, id), Vec::new());
            self.txn
                .put_raw(k::parked_for(&target, &t.to, t.park_order, id), Vec::new());
            self.save_peer(&target, &peer);
            self.reindex(id, old, &t);
            self.save_task(id, &t);
            return Ok(());
        }
        peer.in_flight += 1;
        self.save_peer(&target, &peer);
        self.start_attempt(&mut t, None);
        let target_id = crate::wire::identity::RelayId::parse(&target).map_err(|e| {
            Error::new(
                ErrorCode::Internal,
                format!("stored target {target:?}: {e}"),
            )
        })?;
        // To this relay but not this engine: the host hands it to the sibling shard.
        let shard = (target_id == self.cfg.relay)
            .then(|| self.cfg.shard.sibling_of(&t.to))
            .flatten();
        let mut reporter = (id.to_string(), t.attempt);
        let mut carries = Vec::new();
        let (method, body, route_revision) = if t.want_route_get {
            let mut o = Object::new();
            o.insert("account", t.to.as_str());
            (
                PeerMethod::RouteGet,
                canonical::to_vec(&Value::Object(o)),
                None,
            )
        } else {
            let riders = match shard {
                None => self.board_riders(id, &t)?,
                Some(_) => Vec::new(),
            };
            if riders.is_empty() {
                (
                    PeerMethod::Deliver,
                    t.body.as_bytes().to_vec(),
                    Some(t.route_revision),
                )
            } else {
                let (who, body, carried) = self.form_batch(id, &mut t, riders);
                reporter = who;
                carries = carried;
                (PeerMethod::DeliverBatch, body, None)
            }
        };
        self.effects.push(Effect::Send {
            task: reporter.0,
            attempt: reporter.1,
            target: target_id,
            method,
            body,
            shard,
            route_revision,
            riders: carries,
        });
        self.reindex(id, old, &t);
        self.save_task(id, &t);
        Ok(())
    }

    /// A task's next attempt leaves now, alone or riding in `rides`'s batch: in flight until
    /// its own attempt timeout, bounded by its own deadline, as if it went alone.
    fn start_attempt(&self, t: &mut TaskRec, rides: Option<&str>) {
        t.attempt += 1;
        t.sent_at = self.now;
        t.state = TaskState::InFlight;
        t.next_at = self
            .now
            .saturating_add(self.cfg.attempt_timeout)
            .min(t.deadline);
        t.carries = Vec::new();
        t.rides = rides.map(str::to_string);
    }

    /// Rule 8 of [`batch`]: the item whose attempt times out last reports the exchange and
    /// holds its slot (`launched` on a tie), so the exchange's answer finds its reporter still
    /// waiting whenever an item is. The reporter goes first in the body, and its record
    /// lists the others in body order; the rest ride with it. The reporter, the body, and
    /// the others as (task, attempt).
    fn form_batch(
        &mut self,
        launched: &str,
        t: &mut TaskRec,
        mut riders: Vec<(String, TaskRec)>,
    ) -> (Attempt, Vec<u8>, Vec<Attempt>) {
        let later = riders
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| r.next_at > t.next_at)
            .max_by_key(|(_, (_, r))| r.next_at)
            .map(|(i, _)| i);
        let Some(i) = later else {
            let body = batch::body(
                std::iter::once((t.body.as_bytes(), t.route_revision)).chain(
                    riders
                        .iter()
                        .map(|(_, r)| (r.body.as_bytes(), r.route_revision)),
                ),
            );
            t.carries = riders
                .into_iter()
                .map(|(rid, r)| (rid, r.attempt))
                .collect();
            return ((launched.to_string(), t.attempt), body, t.carries.clone());
        };
        let (rid, mut r) = riders.remove(i);
        let body = batch::body(
            [
                (r.body.as_bytes(), r.route_revision),
                (t.body.as_bytes(), t.route_revision),
            ]
            .into_iter()
            .chain(
                riders
                    .iter()
                    .map(|(_, o)| (o.body.as_bytes(), o.route_revision)),
            ),
        );
        t.rides = Some(rid.clone());
        for (oid, o) in &mut riders {
            o.rides = Some(rid.clone());
            self.save_task(oid, o);
        }
        r.rides = None;
        r.carries = std::iter::once((launched.to_string(), t.attempt))
            .chain(riders.into_iter().map(|(oid, o)| (oid, o.attempt)))
            .collect();
        self.save_task(&rid, &r);
        let carried = r.carries.clone();
        ((rid, r.attempt), body, carried)
    }

    /// Rule 6 of [`batch`]: the deliveries parked for the same destination and recipient
    /// as `lead` (which just took a free slot) that ride with it, within the batch budget,
    /// oldest first. Each is in flight from now, under `lead`'s slot and timeout.
    fn board_riders(&mut self, lead: &str, t: &TaskRec) -> Result<Vec<(String, TaskRec)>, Error> {
        let p = &self.cfg.policies;
        let (max_items, max_bytes) = batch::budget(p.max_batch, p.max_batch_bytes);
        if max_items < 2 {
            return Ok(Vec::new());
        }
        let prefix = k::parked_for_prefix(&t.target, &t.to);
        let rows = self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), max_items - 1)?;
        let mut bytes = batch::frame_cost() + batch::item_cost(t.body.as_bytes().len());
        let mut riders = Vec::new();
        for (key, _) in rows {
            let Some((order, rid)) = k::parked_for_task(&key, &t.target, &t.to) else {
                self.txn.delete(key);
                continue;
            };
            let rid = rid.to_string();
            if rid == lead {
                continue;
            }
            let Some(mut r) = self.task_or_skip(&rid)? else {
                continue;
            };
            if r.state != TaskState::Parked || r.park_order != order || r.target != t.target {
                // A stale entry: the task left the queue another way.
                self.txn.delete(key);
                continue;
            }
            if r.want_route_get || self.now >= r.deadline {
                // A route.get goes alone; the tick ends one past its deadline.
                continue;
            }
            let cost = batch::item_cost(r.body.as_bytes().len());
            if bytes + cost > max_bytes {
                break;
            }
            bytes += cost;
            self.txn.delete(key);
            self.txn.delete(k::parked(&r.target, r.park_order, &rid));
            let old = self.slot(&r);
            self.start_attempt(&mut r, Some(lead));
            self.reindex(&rid, old, &r);
            self.save_task(&rid, &r);
            riders.push((rid, r));
        }
        Ok(riders)
    }

    /// Local delivery: the receiving rules run here, as the delivery's step.
    pub(crate) fn deliver_locally(
        &mut self,
        id: &str,
        mut t: TaskRec,
        parsed: Option<Incoming>,
    ) -> Result<(), Error> {
        t.attempt += 1;
        let inc = match parsed {
            Some(inc) => inc,
            None => Incoming::parse(json::parse_object(t.body.as_bytes())?)?,
        };
        // The body is the canonical form of the params: its hash is their params hash.
        let hash = super::idempotency::canonical_hash(t.body.as_bytes(), self.crypto);
        let limits = self.take_sender_allowance(&inc).and_then(|()| {
            self.take_token(
                "deliver_to",
                &t.to,
                self.cfg.policies.deliver_rate_per_account,
            )
        });
        let result = match limits {
            Ok(()) => self.receive(&inc, &hash).map(|r| r.accepted_at),
            Err(e) => Err(e),
        };
        match result {
            Ok(at) => self.end_task(id, t, Status::TargetAccepted, Some(at), None),
            // A storage fault is the operation's failure, not the delivery's.
            Err(e) if e.code == ErrorCode::Internal => Err(e),
            Err(e) => self.on_error(id, t, error_rec(&e), e.data.clone()),
        }
    }

    /// Ends a task; its status never changes afterwards.
    pub(crate) fn end_task(
        &mut self,
        id: &str,
        mut t: TaskRec,
        status: Status,
        target_accepted_at: Option<u64>,
        error: Option<ErrorRec>,
    ) -> Result<(), Error> {
        self.effects.push(Effect::DeliveryEnded {
            from: t.from.clone(),
            message_id: t.message_id.clone(),
            to: t.to.clone(),
            status: status.as_str(),
            error_code: error.as_ref().map(|e| e.code.clone()),
        });
        match status {
            Status::TargetAccepted => self.counts.delivered += 1,
            _ => {
                let code = error.as_ref().map_or("unknown", |e| e.code.as_str());
                Counters::bump(&mut self.counts.failed, code.to_string());
            }
        }
        let send_key = k::sent(&t.from, &t.message_id);
        if let Some(mut r) = self.txn.get::<SendRec>(&send_key)? {
            if !r.status.is_terminal() {
                r.status = status;
                r.target_accepted_at = target_accepted_at;
                r.error = error;
                self.txn.put(send_key, &r);
            }
        }
        if !self.is_local(&t) {
            self.count_pending(id, &t, false)?;
        }
        let old = self.slot(&t);
        t.state = TaskState::Done;
        self.reindex(id, old, &t);
        if status == Status::Failed {
            let mut peer = self.peer(&t.target)?;
            peer.failed = peer.failed.saturating_add(1);
            self.save_peer(&t.target, &peer);
        }
        if status == Status::TargetAccepted {
            self.txn.delete(k::by_destination(&t.target, id));
            self.txn.delete(k::task(id));
        } else {
            // Failed tasks stay listable by the operator until retention ends.
            self.save_task(id, &t);
            self.expire_at(t.retain_until, &k::task(id));
            self.expire_at(t.retain_until, &k::by_destination(&t.target, id));
        }
        Ok(())
    }

    pub(crate) fn deadline_exceeded(&mut self, id: &str, t: TaskRec) -> Result<(), Error> {
        let mut data = Object::new();
        // A task that never made an attempt saw no error and has no unknown outcome.
        let last = match &t.last_error {
            Some(code) => Some(code.clone()),
            None if t.attempt > 0 => Some("result_unknown".to_string()),
            None => None,
        };
        if let Some(last) = last {
            data.insert("last_error", last);
        }
        let e = ErrorRec {
            code: "deadline_exceeded".to_string(),
            message: "delivery did not finish before its deadline".to_string(),
            data: Some(canonical::to_string(&Value::Object(data))),
        };
        self.end_task(id, t, Status::Failed, None, Some(e))
    }

    /// Points the task at a new target designated by a route of higher revision, and attempts at once.
    pub(crate) fn switch_target(
        &mut self,
        id: &str,
        mut t: TaskRec,
        relay: &str,
        revision: u64,
    ) -> Result<(), Error> {
        self.txn.delete(k::by_destination(&t.target, id));
        if self.slot(&t).retry {
            self.txn.delete(k::retry_at(&t.target, t.next_at, id));
        }
        if !self.is_local(&t) {
            self.count_pending(id, &t, false)?;
        }
        t.target = relay.to_string();
        if !self.is_local(&t) {
            self.count_pending(id, &t, true)?;
        }
        t.route_revision = revision;
        t.uncertain = false;
        t.failures = 0;
        t.not_before = 0;
        t.want_route_get = false;
        t.route_error = None;
        self.txn
            .put_raw(k::by_destination(&t.target, id), Vec::new());
        self.launch(id, t)
    }

    /// A route of higher revision naming the relay the task already targets (rule 6 of
    /// "Home relay changes"): the same body goes again at once, aimed at the new revision.
    /// It is no switch: the target, and with it rule 3's confirmation of an unknown
    /// outcome, stay where they are, and so do the task's backoff and its uncertainty.
    fn retarget_revision(&mut self, id: &str, mut t: TaskRec, revision: u64) -> Result<(), Error> {
        t.route_revision = revision;
        t.want_route_get = false;
        t.route_error = None;
        Counters::bump(&mut self.counts.home_spans, "revision_retry");
        self.launch(id, t)
    }

    /// Follows a route of higher revision for the task's recipient: at the relay it targets
    /// already, the same body aimed at the new revision; elsewhere, a switch.
    fn follow_route(
        &mut self,
        id: &str,
        t: TaskRec,
        relay: &str,
        revision: u64,
    ) -> Result<(), Error> {
        if relay == t.target {
            return self.retarget_revision(id, t, revision);
        }
        self.switch_target(id, t, relay, revision)
    }

    /// A valid route for the task's recipient of higher revision than its target's, found in `data.route` or held.
    pub(crate) fn higher_route(
        &mut self,
        t: &TaskRec,
        candidate: Option<&Value>,
    ) -> Result<Option<(String, u64)>, Error> {
        if let Some(Value::Object(o)) = candidate {
            if let Ok(r) = Route::parse(o.clone()) {
                if r.verify_in(&self.cfg.network, self.crypto).is_ok() && r.account.as_str() == t.to
                {
                    match self.store_route(&r) {
                        // A conflicting same-revision route is simply not learned; any other
                        // failure (storage) fails the whole step, so no route is stored
                        // without the standing change it implies.
                        Err(e) if e.code != ErrorCode::StateConflict => return Err(e),
                        _ => {}
                    }
                }
            }
        }
        Ok(self
            .held_route(&t.to)?
            .filter(|h| h.revision > t.route_revision)
            .map(|h| (h.relay, h.revision)))
    }

    /// Reacts to an explicit error answer (or a local rejection).
    pub(crate) fn on_error(
        &mut self,
        id: &str,
        mut t: TaskRec,
        e: ErrorRec,
        data: Option<Value>,
    ) -> Result<(), Error> {
        t.last_error = Some(e.code.clone());
        // The destination answered: whatever it said, it was not an outage.
        t.outage = false;
        match reaction(&e.code) {
            Reaction::Fail => self.end_task(id, t, Status::Failed, None, Some(e)),
            Reaction::RouteError => {
                let route = data
                    .as_ref()
                    .and_then(|d| d.as_object())
                    .and_then(|d| d.get("route"));
                if let Some((relay, rev)) = self.higher_route(&t, route)? {
                    return self.follow_route(id, t, &relay, rev);
                }
                if route.is_none() && !t.want_route_get && !self.is_local(&t) {
                    // No route in the error: ask the old target for the route it holds.
                    t.want_route_get = true;
                    t.route_error = Some(e);
                    return self.launch(id, t);
                }
                self.end_task(id, t, Status::Failed, None, Some(e))
            }
            Reaction::RateLimited => {
                if let Some(w) = retry_after(data.as_ref()) {
                    t.not_before = self.now.saturating_add(w);
                }
                self.retry_later(id, t)
            }
            Reaction::Retry => self.retry_later(id, t),
            Reaction::Unknown => {
                // Unknown as an outcome, but the code is what was seen last.
                let code = e.code;
                if !t.want_route_get {
                    t.uncertain = true;
                }
                t.last_error = Some(code);
                self.retry_later(id, t)
            }
        }
    }

    /// Handles the outcome of attempt `attempt` of `task` (of every item of the batch it
    /// leads, rule 7 of [`batch`]); stale or duplicate outcomes change nothing.
    pub(crate) fn outcome(
        &mut self,
        id: &str,
        attempt: u32,
        outcome: Outcome,
    ) -> Result<(), Error> {
        let Some(t) = self.txn.get::<TaskRec>(&k::task(id))? else {
            return Ok(());
        };
        if t.state != TaskState::InFlight || t.attempt != attempt {
            return Ok(());
        }
        if t.carries.is_empty() {
            return self.item_outcome(id, attempt, outcome);
        }
        let items: Vec<(String, u32)> = std::iter::once((id.to_string(), attempt))
            .chain(t.carries.iter().cloned())
            .collect();
        let outcomes = batch::split(outcome, items.len());
        for ((tid, at), o) in items.into_iter().zip(outcomes) {
            self.item_outcome(&tid, at, o)?;
        }
        Ok(())
    }

    /// The outcome of one delivery's attempt (alone, or an item of a batch).
    fn item_outcome(&mut self, id: &str, attempt: u32, outcome: Outcome) -> Result<(), Error> {
        let Some(mut t) = self.txn.get::<TaskRec>(&k::task(id))? else {
            return Ok(());
        };
        if t.state != TaskState::InFlight || t.attempt != attempt {
            return Ok(());
        }
        let target = t.target.clone();
        let label = match &outcome {
            Outcome::Result(_) => "accepted",
            Outcome::Error(_) => "rejected",
            Outcome::Unknown => "unknown",
            Outcome::NotAttempted => "not_attempted",
        };
        Counters::bump(&mut self.counts.attempts, label);
        t.carries = Vec::new();
        if t.rides.take().is_none() {
            self.release_slot(&target)?;
        }
        // The slot release may have launched another task; reload ours untouched.
        let was_route_get = t.want_route_get;
        match outcome {
            Outcome::Result(body) if was_route_get => {
                let route = json::parse_object(&body)
                    .ok()
                    .and_then(|o| o.get("route").cloned());
                t.want_route_get = false;
                let err = t.route_error.take();
                if let Some((relay, rev)) = self.higher_route(&t, route.as_ref())? {
                    return self.follow_route(id, t, &relay, rev);
                }
                let e = err.unwrap_or(ErrorRec {
                    code: ErrorCode::NotHomeRelay.as_str().to_string(),
                    message: "the target is not the recipient's home relay".to_string(),
                    data: None,
                });
                self.end_task(id, t, Status::Failed, None, Some(e))
            }
            Outcome::Result(body) => {
                match accepted_at_if_target_accepted(&body, &t.from, &t.message_id, &t.to) {
                    Some(at) => {
                        self.peer_is_back(&target)?;
                        self.end_task(id, t, Status::TargetAccepted, Some(at), None)
                    }
                    None => self.unknown(id, t),
                }
            }
            Outcome::Error(body) => match parse_error_body(&body) {
                Some((e, data)) if was_route_get => {
                    // route.get failed: retry it if that may help, else fail with the route error.
                    t.last_error = Some(e.code.clone());
                    if let Some(w) = retry_after(data.as_ref()) {
                        t.not_before = self.now.saturating_add(w);
                    }
                    if matches!(
                        reaction(&e.code),
                        Reaction::Retry | Reaction::RateLimited | Reaction::Unknown
                    ) {
                        return self.retry_later(id, t);
                    }
                    let err = t.route_error.take().unwrap_or(e);
                    t.want_route_get = false;
                    self.end_task(id, t, Status::Failed, None, Some(err))
                }
                Some((e, data)) => {
                    self.note_peer_failure(&target, &e.code, &e.message)?;
                    self.on_error(id, t, e, data)
                }
                None => self.unknown(id, t),
            },
            Outcome::Unknown => self.unknown(id, t),
            Outcome::NotAttempted => {
                t.last_error = Some(ErrorCode::Unavailable.as_str().to_string());
                if !t.uncertain && !t.want_route_get {
                    // Receipt known not attempted: a higher route may be used.
                    if let Some((relay, rev)) = self.higher_route(&t, None)? {
                        return self.follow_route(id, t, &relay, rev);
                    }
                }
                self.outage_retry(id, t, ErrorCode::Unavailable.as_str())
            }
        }
    }

    /// An attempt whose outcome was never learned: retry the same target, unchanged.
    pub(crate) fn unknown(&mut self, id: &str, mut t: TaskRec) -> Result<(), Error> {
        t.last_error = Some("result_unknown".to_string());
        if !t.want_route_get {
            t.uncertain = true;
        }
        self.outage_retry(id, t, "result_unknown")
    }

    /// Retries after an outage (not attempted, or unknown). An attempt that left no later than
    /// destination was last seen coming back was lost to the outage it already recovered
    /// from: it is stale news, so it neither marks the destination down nor grows the
    /// backoff, and goes again within `retry_initial`. Otherwise the destination is counted
    /// down and the task backs off by its own count, in the outage index to come forward
    /// when the destination is back.
    pub(crate) fn outage_retry(
        &mut self,
        id: &str,
        mut t: TaskRec,
        code: &str,
    ) -> Result<(), Error> {
        let peer = self.peer(&t.target)?;
        if peer.back_at.is_some_and(|back| t.sent_at <= back) {
            t.outage = false;
            let wait = self.backoff(1)?;
            return self.retry_after(id, t, wait);
        }
        let target = t.target.clone();
        self.note_peer_failure(&target, code, outage_message(code))?;
        t.outage = true;
        self.retry_later(id, t)
    }
}
