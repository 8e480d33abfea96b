//! The relay engine: every method of protocol.md §4 as a sans-IO state machine.
//!
//! Plain data in (a caller, a method, params bytes, the time; outcomes of
//! deliveries; ticks), plain data out (a result or a protocol error, and
//! [`Effect`]s). The host supplies [`Storage`] and [`Entropy`] and executes
//! effects; the engine decides everything else. Every operation runs in one
//! transaction: its writes commit together, before its answer or effects
//! leave the engine, or not at all.

mod accounts;
pub mod admin;
pub mod batch;
pub mod config;
mod context;
mod delivery;
pub mod effect;
pub mod group;
mod idempotency;
mod keyspace;
pub mod limits;
pub mod metrics;
mod migration;
mod peers;
mod rate;
mod receive;
mod records;
mod scheduler;
mod send;
mod session;
pub mod shard;
pub mod status;
pub mod storage;
mod timeline;
mod txn;

pub use config::{Config, Policies};
pub use effect::{Acceptance, Effect, OperatorAction, Outcome, PeerMethod};
pub use storage::{MemoryStore, Storage, StorageError};

use crate::wire::canonical;
use crate::wire::crypto::Crypto;
use crate::wire::identity::RelayId;
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};
use context::Ctx;

/// The host's source of secure randomness (session tokens, the jitter seed).
pub trait Entropy {
    /// Fills `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8]);
}

impl<F: FnMut(&mut [u8])> Entropy for F {
    fn fill(&mut self, buf: &mut [u8]) {
        self(buf)
    }
}

/// Who is calling, as the host's transport authenticated it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No credentials.
    Anonymous,
    /// A client presenting a session token (`Authorization: Bearer`).
    Session(String),
    /// Another relay whose request signature the transport verified, with the recipient's
    /// route revision its `message.deliver` targets (signed as `route_revision`; none on
    /// other methods, and on a sibling shard's step, which carries no relay request).
    Relay {
        /// The source relay.
        relay: RelayId,
        /// `Relay-Route-Revision`, signed.
        route_revision: Option<u64>,
    },
    /// The relay's operator (a local admin interface, never the public port).
    Operator,
}

impl Caller {
    /// A relay calling a method that carries no route revision (or a sibling shard).
    pub fn relay(relay: RelayId) -> Caller {
        Caller::Relay {
            relay,
            route_revision: None,
        }
    }

    /// A relay delivering a message aimed at revision `route_revision` of the recipient's
    /// route (`None` when the request carried none).
    pub fn relay_at(relay: RelayId, route_revision: Option<u64>) -> Caller {
        Caller::Relay {
            relay,
            route_revision,
        }
    }
}

/// Why a store cannot be opened: [`Engine::open_store`]'s refusal, typed so a host can tell
/// a store it must not serve (newer, unreadable) from a storage fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// The store was written by a newer relay, at this schema version.
    Newer(u64),
    /// The stored schema version is not a number.
    Unreadable,
    /// The store belongs to another shard, or to a relay of another shard count: its
    /// accounts would be served by the wrong engine. Held and asked, as `index/count`.
    Shard {
        /// What the store was made as.
        held: String,
        /// What this engine was configured as.
        asked: String,
    },
    /// The host's storage failed.
    Storage(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Newer(v) => write!(
                f,
                "this data was written by a newer relay (schema version {v}; this relay reads up to {SCHEMA_VERSION}): run that version, or restore a backup made by this one"
            ),
            OpenError::Unreadable => f.write_str("the stored schema version is unreadable"),
            OpenError::Shard { held, asked } => write!(
                f,
                "this data is shard {held} (index/count) and this relay was started as shard {asked}: the shard count is fixed at a relay's first start, since changing it would move accounts between stores; start it with the count it was made with"
            ),
            OpenError::Storage(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for OpenError {}

/// The answer to one call: a result object or a protocol error, and effects.
///
/// A result may hold stored signed objects as [`Value::Canonical`] texts (a sync page's
/// entries): read an answer through [`Response::body`], as a client does.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The result object, or the protocol error (then nothing was committed).
    pub result: Result<Value, Error>,
    /// What the host must do now that the operation committed, in order.
    pub effects: Vec<Effect>,
}

impl Response {
    /// The HTTP status that carries this answer.
    pub fn http_status(&self) -> u16 {
        match &self.result {
            Ok(_) => 200,
            Err(e) => e.code.http_status(),
        }
    }

    /// The response body: the result object, or `{"error": {...}}`; canonical JSON.
    pub fn body(&self) -> Vec<u8> {
        match &self.result {
            Ok(v) => canonical::to_vec(v),
            Err(e) => canonical::to_vec(&error_body(e)),
        }
    }
}

/// The wire form of an error: `{"error": {"code", "message", "data"?}}`.
pub fn error_body(e: &Error) -> Value {
    let mut inner = Object::new();
    inner.insert("code", e.code.as_str());
    inner.insert("message", e.message.as_str());
    if let Some(d) = &e.data {
        inner.insert("data", d.clone());
    }
    let mut outer = Object::new();
    outer.insert("error", inner);
    Value::Object(outer)
}

/// Every method the engine dispatches (protocol.md §4 and `admin.*`), in dispatch order:
/// the wire names of the one typed list, [`crate::transport::method::Method::ALL`].
pub const METHODS: [&str; crate::transport::method::Method::ALL.len()] = {
    let all = crate::transport::method::Method::ALL;
    let mut names = [""; crate::transport::method::Method::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = all[i].as_str();
        i += 1;
    }
    names
};

/// A method name as a metrics label: a method of [`METHODS`], or `other` (names come from callers).
fn known_method(method: &str) -> String {
    METHODS
        .iter()
        .find(|m| **m == method)
        .map_or("other", |m| m)
        .to_string()
}

/// Who holds a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The account the session acts for.
    pub account: String,
    /// The device that opened it.
    pub device_id: String,
    /// When it expires, Unix ms: the earlier of `ts + session_ttl` and the certificate's expiry.
    pub expires_at: u64,
}

/// The version of the stored data's layout this engine writes and reads.
///
/// Stored in `meta/schema` when a store is first opened. A store of a newer version was
/// written by a newer relay, which may have changed what keys mean: it is refused rather
/// than misread. Version 1 is the layout of docs/protocol.md "Storage".
pub const SCHEMA_VERSION: u64 = 1;

/// The relay engine over a host's storage and entropy.
pub struct Engine<S: Storage, E: Entropy> {
    config: Config,
    store: S,
    entropy: E,
    limiter: limits::Limiter,
    counters: metrics::Counters,
    crypto: Crypto,
    siblings: shard::Siblings,
    /// The sweep of attempts orphaned by a restart is over (or not needed), as committed:
    /// later ticks skip it without a read. A new engine (a trap recovery) looks once more.
    orphans_swept: bool,
}

impl<S: Storage, E: Entropy> Engine<S, E> {
    /// An engine over `store`; all state lives in the store, so a new engine resumes where an old one stopped.
    pub fn new(config: Config, store: S, entropy: E) -> Engine<S, E> {
        Engine {
            config,
            store,
            entropy,
            limiter: limits::Limiter::default(),
            counters: metrics::Counters::default(),
            crypto: Crypto::new(),
            siblings: shard::Siblings::default(),
            orphans_swept: false,
        }
    }

    /// Checks the store's schema version before anything else reads it: records the current
    /// one in a new store, and refuses a store written by a newer relay with a clear message.
    /// Then its shard: a store is made as one shard of a relay of some count (a store from
    /// before sharding is shard 0 of 1), and is refused under any other.
    pub fn open_store(&mut self) -> Result<(), OpenError> {
        let key = keyspace::schema();
        let held = self
            .store
            .get(&key)
            .map_err(|e| OpenError::Storage(format!("reading the schema version: {e}")))?;
        let asked = self.config.shard;
        let shard_key = keyspace::shard();
        let Some(bytes) = held else {
            return self
                .store
                .commit(vec![
                    (key, Some(SCHEMA_VERSION.to_string().into_bytes())),
                    (shard_key, Some(asked.to_meta().into_bytes())),
                ])
                .map_err(|e| OpenError::Storage(format!("recording the schema version: {e}")));
        };
        let v: u64 = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(OpenError::Unreadable)?;
        if v > SCHEMA_VERSION {
            return Err(OpenError::Newer(v));
        }
        let stored = self
            .store
            .get(&shard_key)
            .map_err(|e| OpenError::Storage(format!("reading the shard: {e}")))?;
        let held = match &stored {
            None => shard::Shard::SINGLE,
            Some(b) => std::str::from_utf8(b)
                .ok()
                .and_then(shard::Shard::from_meta)
                .ok_or(OpenError::Unreadable)?,
        };
        if held != asked {
            return Err(OpenError::Shard {
                held: held.to_meta(),
                asked: asked.to_meta(),
            });
        }
        if stored.is_none() {
            self.store
                .commit(vec![(shard_key, Some(asked.to_meta().into_bytes()))])
                .map_err(|e| OpenError::Storage(format!("recording the shard: {e}")))?;
        }
        Ok(())
    }

    /// The storage the engine runs over (a host's group commit opens and flushes it here).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Gives the engine the host's native hashing and verification (its memories start over).
    pub fn set_crypto(&mut self, crypto: Crypto) {
        self.crypto = crypto;
    }

    /// The engine's hashing and verification (the transport hashes and verifies with them).
    pub fn crypto(&mut self) -> &mut Crypto {
        &mut self.crypto
    }

    /// The configuration and the crypto together (both are needed to check a relay request).
    pub fn config_and_crypto(&mut self) -> (&Config, &mut Crypto) {
        (&self.config, &mut self.crypto)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes policies; promises already made (deadlines, retention) keep their values.
    pub fn set_policies(&mut self, policies: Policies) {
        self.config.policies = policies;
    }

    /// Gives the store back (to rebuild an engine over it, as a restart does).
    pub fn into_store(self) -> S {
        self.store
    }

    /// Calls `method` with raw `params` bytes at time `now`, from a caller inside the host
    /// (no network address: only the per-account limits apply).
    pub fn call(&mut self, caller: &Caller, method: &str, params: &[u8], now: u64) -> Response {
        self.call_from(caller, None, method, params, now)
    }

    /// Calls `method` for a caller that reached the host from network address `origin`
    /// (an IP address, no port): anonymous calls are limited per address as well.
    pub fn call_from(
        &mut self,
        caller: &Caller,
        origin: Option<&str>,
        method: &str,
        params: &[u8],
        now: u64,
    ) -> Response {
        let parse = || crate::wire::json::parse_object(params).map_err(Error::from);
        self.call_with(caller, origin, method, params.len(), parse, now)
    }

    /// As [`Engine::call_from`], with the `len` bytes of the body already parsed by the
    /// strict parser (the transport judges a body before routing it): parsed once, not twice.
    pub fn call_parsed(
        &mut self,
        caller: &Caller,
        origin: Option<&str>,
        method: &str,
        params: Object,
        len: usize,
        now: u64,
    ) -> Response {
        self.call_with(caller, origin, method, len, move || Ok(params), now)
    }

    /// The `payload_too_large` error for a body of `len` bytes over `max_request_bytes`
    /// (checked before any parse), or nothing when it fits.
    pub fn too_large(&self, len: usize) -> Option<Error> {
        self.config.policies.too_large(len)
    }

    fn call_with(
        &mut self,
        caller: &Caller,
        origin: Option<&str>,
        method: &str,
        len: usize,
        params: impl FnOnce() -> Result<Object, Error>,
        now: u64,
    ) -> Response {
        if method == batch::METHOD {
            // Judged whole against its own limit, then item by item, each its own operation.
            let p = self
                .config
                .policies
                .batch_too_large(len)
                .map_or_else(params, Err);
            return match p {
                Ok(p) => self.deliver_batch(caller, p, now),
                Err(e) => Response {
                    result: Err(e),
                    effects: Vec::new(),
                },
            };
        }
        if let Some(e) = self.too_large(len) {
            return Response {
                result: Err(e),
                effects: Vec::new(),
            };
        }
        let origin = origin.map(limits::origin_key);
        let r = self.run(now, |cx| {
            cx.origin = origin;
            cx.dispatch(caller, method, params()?)
        });
        if let Err(e) = &r.result {
            if self.siblings.is_wanting() {
                // Not an answer: the transport fetches the route and submits the call again.
                return r;
            }
            if matches!(method, "message.send" | "message.deliver") {
                metrics::Counters::bump(&mut self.counters.rejected, e.code.as_str());
            }
            if e.code == ErrorCode::RateLimited {
                metrics::Counters::bump(&mut self.counters.rate_limited, known_method(method));
            }
        }
        r
    }

    /// The account whose route the last call needed from a sibling shard (then that call
    /// changed nothing): fetch it with `route.get` on [`shard::Shard::of_account`]'s shard,
    /// report it with [`Engine::sibling_route`], and submit the call again.
    pub fn wanted_route(&mut self) -> Option<String> {
        self.siblings.take_wanted()
    }

    /// Makes the next call wait for `account`'s route, as a send to an account of a sibling
    /// shard does (for tests of the transports' rounds, without a sharded client).
    #[cfg(test)]
    pub(crate) fn want_route(&mut self, account: &str) {
        self.siblings.want(account, 0);
    }

    /// Reports what a sibling shard answered to `route.get` for `account`.
    pub fn sibling_route(&mut self, account: &str, route: shard::SiblingRoute) {
        self.siblings.put(account, route);
    }

    /// Reports what became of an `Effect::Send`.
    pub fn outcome(&mut self, task: &str, attempt: u32, outcome: Outcome, now: u64) -> Vec<Effect> {
        self.run(now, |cx| {
            cx.outcome(task, attempt, outcome).map(|()| Value::Null)
        })
        .effects
    }

    /// Runs what is due at `now`: attempts, timeouts, deadlines, expiry.
    pub fn tick(&mut self, now: u64) -> Vec<Effect> {
        self.try_tick(now).effects
    }

    /// Most entries one tick call sets aside before it gives up for this call.
    pub const MAX_QUARANTINED_PER_TICK: usize = 16;

    /// [`Engine::tick`], with its outcome for the host's log: an error if the tick could not
    /// commit, or `{"quarantined": [...]}` naming the entries it had to set aside.
    ///
    /// An entry whose processing fails for a reason other than a store fault (a record
    /// that cannot be decoded, a stored value the engine refuses) would fail every later
    /// tick the same way and stop all deliveries: it is quarantined (`admin.quarantine`
    /// lists it) and the tick runs again without it. A store fault is not quarantined:
    /// it may pass, and the next tick retries.
    pub fn try_tick(&mut self, now: u64) -> Response {
        let mut set_aside = Vec::new();
        loop {
            let mut failed_entry = None;
            let mut r = self.run(now, |cx| {
                let result = cx.tick();
                if result.is_err() && !cx.txn.store_failed() {
                    failed_entry = cx.tick_entry.take();
                }
                result.map(|()| Value::Null)
            });
            let (Err(e), Some(entry)) = (&r.result, failed_entry) else {
                if r.result.is_ok() && !set_aside.is_empty() {
                    let mut o = Object::new();
                    o.insert("quarantined", Value::Array(set_aside));
                    r.result = Ok(Value::Object(o));
                }
                return r;
            };
            if set_aside.len() >= Self::MAX_QUARANTINED_PER_TICK {
                return r;
            }
            let e = e.clone();
            let q = self.run(now, |cx| cx.quarantine(&entry, &e));
            match q.result {
                Ok(v) => {
                    self.counters.quarantined += 1;
                    set_aside.push(v)
                }
                Err(_) => return r,
            }
        }
    }

    /// Completes relay authentication: verifies the signature under the source's key and
    /// consumes the nonce (a `(relay, nonce)` seen within twice the clock tolerance is refused).
    pub fn authenticate_relay(
        &mut self,
        request: &crate::wire::relay_request::Prechecked,
        source_key: &[u8; 32],
        now: u64,
    ) -> Result<RelayId, Error> {
        request.verify_in(source_key, &mut self.crypto)?;
        let source = request.source.clone();
        let r = self.run(now, |cx| {
            cx.consume_relay_nonce(request).map(|()| Value::Null)
        });
        r.result.map(|_| source)
    }

    /// The account, device and expiry of a session token (for hosts that bind WebSockets to it).
    pub fn session_info(&mut self, token: &str, now: u64) -> Result<SessionInfo, Error> {
        let caller = Caller::Session(token.to_string());
        let r = self.run(now, |cx| cx.session_info(&caller));
        let v = r.result?;
        let o = v.as_object().cloned().unwrap_or_default();
        let get = |k: &str| {
            o.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Ok(SessionInfo {
            account: get("account"),
            device_id: get("device_id"),
            expires_at: o
                .get("expires_at")
                .and_then(Value::as_protocol_int)
                .unwrap_or(0),
        })
    }

    /// This relay's `/.well-known/relay` document, given its public key.
    pub fn well_known(&self, relay_key: &[u8; 32]) -> Value {
        let policies = serde_json::to_vec(&self.config.policies)
            .ok()
            .and_then(|b| crate::wire::json::parse(&b).ok())
            .unwrap_or(Value::Null);
        crate::wire::relay_request::well_known(
            &self.config.relay,
            &self.config.network,
            relay_key,
            policies,
        )
    }

    /// What the engine counted since it started (no storage read).
    pub fn counters(&self) -> &metrics::Counters {
        &self.counters
    }

    /// What the engine counted since it started, and its destinations' gauges at `now`
    /// (the host's clock, as every call takes it: the oldest pending delivery's age).
    pub fn metrics(&mut self, now: u64) -> Result<metrics::Metrics, StorageError> {
        let destinations = context::destinations_summary(&mut self.store, now)?;
        Ok(metrics::Metrics {
            counters: self.counters.clone(),
            destinations,
        })
    }

    /// Fills `buf` from the host's entropy: the one source of everything random in the core
    /// (the transport's request nonces too), so a recorded run replays exactly.
    pub fn random(&mut self, buf: &mut [u8]) {
        self.entropy.fill(buf);
    }

    /// The earliest time the engine wants a tick, if any.
    pub fn next_wake(&mut self) -> Result<Option<u64>, StorageError> {
        context::next_wake(&mut self.store)
    }

    fn run(
        &mut self,
        now: u64,
        op: impl FnOnce(&mut Ctx<'_, S, E>) -> Result<Value, Error>,
    ) -> Response {
        let mut cx = Ctx::new(
            &self.config,
            &mut self.store,
            &mut self.entropy,
            &mut self.limiter,
            &mut self.crypto,
            &mut self.siblings,
            now,
        );
        cx.orphans_swept = self.orphans_swept;
        let result = op(&mut cx);
        let counts = std::mem::take(&mut cx.counts);
        let swept = cx.orphans_swept;
        let (result, effects) = cx.finish(result);
        if result.is_ok() {
            self.counters.merge(counts);
            self.orphans_swept = swept;
        } else if matches!(&result, Err(e) if e.code == ErrorCode::NotHomeRelay) {
            // A home span's refusal is the event it counts, though nothing commits.
            self.counters.merge_home_spans(counts.home_spans);
        }
        Response { result, effects }
    }
}
