//! One operation in progress: its transaction, its time, its effects; and the helpers every method shares.

use super::keyspace as k;
use super::limits::Limiter;
use super::records::{AccountRec, DeviceRec, RouteRec};
use super::storage::{Storage, StorageError};
use super::txn::Txn;
use super::{Caller, Config, Effect, Entropy};
use crate::wire::crypto::Crypto;
use crate::wire::json::{self, Object, Value};
use crate::{Error, ErrorCode};

/// The state of one operation.
pub(crate) struct Ctx<'a, S: Storage, E: Entropy> {
    pub cfg: &'a Config,
    pub txn: Txn<'a, S>,
    pub entropy: &'a mut E,
    /// In-memory request limits (by address, by account).
    pub limiter: &'a mut Limiter,
    /// The engine's hashing and verification, with their memories.
    pub crypto: &'a mut Crypto,
    /// Routes fetched from sibling shards, and the one this operation may ask for.
    pub siblings: &'a mut super::shard::Siblings,
    /// The caller's network address as the limits key it ([`super::limits::origin_key`]).
    pub origin: Option<String>,
    pub now: u64,
    pub effects: Vec<Effect>,
    /// Whether the due or gc index changed (then a new wake-up time is reported).
    pub rescheduled: bool,
    /// The index entry a tick is working on, to set aside if it cannot be processed.
    pub tick_entry: Option<Vec<u8>>,
    /// What this operation did, counted if it commits.
    pub counts: super::metrics::Counters,
    /// The sweep of attempts orphaned by a restart is over (kept by the engine if this commits).
    pub orphans_swept: bool,
}

impl<'a, S: Storage, E: Entropy> Ctx<'a, S, E> {
    pub(crate) fn new(
        cfg: &'a Config,
        store: &'a mut S,
        entropy: &'a mut E,
        limiter: &'a mut Limiter,
        crypto: &'a mut Crypto,
        siblings: &'a mut super::shard::Siblings,
        now: u64,
    ) -> Self {
        Ctx {
            cfg,
            txn: Txn::new(store),
            entropy,
            limiter,
            crypto,
            siblings,
            origin: None,
            now,
            effects: Vec::new(),
            rescheduled: false,
            tick_entry: None,
            counts: Default::default(),
            orphans_swept: false,
        }
    }

    /// Commits on success; on any error (or a failed commit) nothing is written and no effect escapes.
    pub(crate) fn finish(
        self,
        result: Result<Value, Error>,
    ) -> (Result<Value, Error>, Vec<Effect>) {
        let Ctx {
            txn,
            mut effects,
            rescheduled,
            now,
            ..
        } = self;
        let value = match result {
            Ok(v) => v,
            Err(e) => return (Err(e), Vec::new()),
        };
        let store = match txn.commit_returning_store() {
            Ok(store) => store,
            Err(e) => return (Err(e.into()), Vec::new()),
        };
        if rescheduled {
            match next_wake(store) {
                Ok(Some(at)) => effects.push(Effect::WakeAt(at)),
                Ok(None) => {}
                // The operation committed but its next wake-up could not be read: ask for a
                // tick now rather than none, so no timer is lost (the tick reads it again).
                Err(_) => effects.push(Effect::WakeAt(now)),
            }
        }
        (Ok(value), effects)
    }

    /// Tells the host a message was accepted (ids only, for its log).
    pub(crate) fn accepted(
        &mut self,
        method: &'static str,
        from: &str,
        message_id: &str,
        to: &str,
        status: super::status::Status,
    ) {
        self.effects.push(Effect::Accepted(super::Acceptance {
            method,
            from: from.to_string(),
            message_id: message_id.to_string(),
            to: to.to_string(),
            status: status.as_str(),
        }));
    }

    /// Routes a call to its method.
    pub(crate) fn dispatch(
        &mut self,
        caller: &Caller,
        method: &str,
        p: Object,
    ) -> Result<Value, Error> {
        if let (Caller::Anonymous, Some(origin)) = (caller, self.origin.as_deref()) {
            let rate = self.cfg.policies.anonymous_rate;
            self.limiter.take("address", origin, rate, self.now)?;
        }
        // The operator's methods, one gate for all (the transports reach them only through
        // the admin listener; an in-process caller is checked here).
        if method.starts_with("admin.") && *caller != Caller::Operator {
            return Err(Error::new(ErrorCode::PermissionDenied, "operator only"));
        }
        use crate::transport::method::Method as M;
        let Some(m) = M::parse(method) else {
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("unknown method {method:?}"),
            ));
        };
        // Exhaustive over the one typed list: a method added there must be dispatched here.
        match m {
            M::SessionOpen => self.session_open(p),
            M::AccountRegister => self.account_register(caller, p),
            M::AccountUpdate => self.account_update(caller, p),
            M::DeviceRegister => self.device_register(caller, p),
            M::DeviceRevoke => self.device_revoke(caller, p),
            M::DeviceList => self.device_list(caller, p),
            M::RouteGet => self.route_get(p),
            M::RoutePublish => self.route_publish(caller, p),
            M::ContactRevoke => self.contact_revoke(caller, p),
            M::MessageSend => self.message_send(caller, p),
            M::MessageDeliver => self.message_deliver(caller, p),
            // Each item is an operation of its own: `Engine::call_with` runs them, never
            // inside one transaction.
            M::MessageDeliverBatch => Err(Error::new(
                ErrorCode::Internal,
                "message.deliver.batch runs item by item, outside any one operation",
            )),
            M::DeliveryStatus => self.delivery_status(caller, p),
            M::TimelineSync => self.timeline_sync(caller, p),
            M::AdminDeliveries => self.admin_deliveries(p),
            M::AdminDestinations => self.admin_destinations(p),
            M::AdminDestinationRetry => self.admin_destination_retry(p),
            M::AdminDeliveryRetry => self.admin_delivery_retry(p),
            M::AdminDestinationPause => self.admin_destination_hold(p, true),
            M::AdminDestinationResume => self.admin_destination_hold(p, false),
            M::AdminQuarantine => self.admin_quarantine(p),
            M::AdminQuarantineDrop => self.admin_quarantine_act(p, false),
            M::AdminQuarantineRequeue => self.admin_quarantine_act(p, true),
        }
    }

    /// The highest route held for `account`.
    pub(crate) fn held_route(&mut self, account: &str) -> Result<Option<RouteRec>, StorageError> {
        self.txn.get(&k::route(account))
    }

    /// Whether this relay is the home designated by the account's current route, and serves it.
    pub(crate) fn serves(&mut self, account: &str) -> Result<bool, StorageError> {
        Ok(self.routes_here(account)? && self.txn.get_raw(&k::account(account))?.is_some())
    }

    /// The account's record when this relay serves it (as [`Ctx::serves`] decides), for
    /// callers that go on to use the record.
    pub(crate) fn home_account(
        &mut self,
        account: &str,
    ) -> Result<Option<AccountRec>, StorageError> {
        if !self.routes_here(account)? {
            return Ok(None);
        }
        self.txn.get(&k::account(account))
    }

    /// Whether the account's current route designates this relay.
    fn routes_here(&mut self, account: &str) -> Result<bool, StorageError> {
        let route = self.held_route(account)?;
        Ok(route.is_some_and(|r| r.relay == self.cfg.relay.as_str()))
    }

    /// `not_home_relay`, carrying the highest route held in `data.route`; the storage's
    /// error when that route cannot be read (a route error without its route would send a
    /// client or a source the wrong way).
    pub(crate) fn not_home(&mut self, account: &str) -> Error {
        let mut e = Error::new(
            ErrorCode::NotHomeRelay,
            format!("this relay is not the home relay of {account}"),
        );
        match self.held_route(account) {
            Ok(Some(r)) => {
                if let Ok(route) = json::parse(r.route.as_bytes()) {
                    let mut data = Object::new();
                    data.insert("route", route);
                    e = e.with_data(Value::Object(data));
                }
            }
            Ok(None) => {}
            Err(fault) => return fault.into(),
        }
        e
    }

    /// A device that is valid now: registered, not revoked, its certificate passing the home checks.
    pub(crate) fn valid_device(
        &mut self,
        account: &str,
        device: &str,
    ) -> Result<Option<DeviceRec>, StorageError> {
        let rec: Option<DeviceRec> = self.txn.get(&k::device(account, device))?;
        let tol = self.cfg.policies.clock_tolerance;
        Ok(rec.filter(|d| {
            !d.revoked
                && !d.cert.is_empty()
                && d.issued_at <= self.now.saturating_add(tol)
                && d.expires_at.is_none_or(|e| self.now < e)
        }))
    }

    /// Schedules deletion of `key` at `at`.
    pub(crate) fn expire_at(&mut self, at: u64, key: &[u8]) {
        self.txn.put_raw(k::gc(at, key), Vec::new());
        self.rescheduled = true;
    }

    /// Random bytes from the host.
    pub(crate) fn random<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.entropy.fill(&mut b);
        b
    }
}

/// The earliest due attempt or expiry in `store`.
pub(crate) fn next_wake<S: Storage>(store: &mut S) -> Result<Option<u64>, StorageError> {
    let mut best: Option<u64> = None;
    for prefix in [k::due_prefix(), k::gc_prefix(), k::revive_prefix()] {
        if let Some((key, _)) = store
            .scan(&prefix, &k::prefix_end(&prefix), 1)?
            .into_iter()
            .next()
        {
            if let Some(at) = k::index_time(&key) {
                best = Some(best.map_or(at, |b| b.min(at)));
            }
        }
    }
    Ok(best)
}

/// The destinations' gauges, summed over every destination's record: failing, paused,
/// pending, in flight, and the oldest pending delivery's age (from the first entry of
/// each busy destination's age index) at `now`.
pub(crate) fn destinations_summary<S: Storage>(
    store: &mut S,
    now: u64,
) -> Result<super::metrics::Destinations, StorageError> {
    let prefix = k::all_peers();
    let mut sums = super::metrics::Destinations::default();
    let mut oldest: Option<u64> = None;
    // Peers are the relays this one delivers to; the walk is bounded all the same.
    for (key, v) in store.scan(&prefix, &k::prefix_end(&prefix), 100_000)? {
        let Ok(p) = serde_json::from_slice::<super::records::PeerRec>(&v) else {
            continue;
        };
        sums.failing += u64::from(p.consecutive_failures > 0);
        sums.paused += u64::from(p.paused);
        sums.pending += p.pending;
        sums.in_flight += u64::from(p.in_flight);
        let Some(relay) = k::destination_relay(&key).filter(|_| p.pending > 0) else {
            continue;
        };
        let since = k::pending_of(relay);
        if let Some((first, _)) = store
            .scan(&since, &k::prefix_end(&since), 1)?
            .into_iter()
            .next()
        {
            if let Some(at) = k::time_under(&first, &since) {
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
            }
        }
    }
    sums.oldest_pending_age_ms = oldest.map_or(0, |at| now.saturating_sub(at));
    let q = k::quarantine_prefix();
    sums.quarantined = store
        .scan(&q, &k::prefix_end(&q), super::admin::MAX_LISTED)?
        .len() as u64;
    Ok(sums)
}

/// Checks a caller's session and returns it.
pub(crate) fn require_relay(caller: &Caller) -> Result<&crate::wire::identity::RelayId, Error> {
    match caller {
        Caller::Relay { relay, .. } => Ok(relay),
        _ => Err(Error::new(
            ErrorCode::Unauthenticated,
            "this method needs relay authentication",
        )),
    }
}
