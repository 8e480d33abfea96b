//! The relay's transports (protocol.md §6), sans-IO: what arrived in, what to write out.
//!
//! A host reads requests and WebSocket messages off its sockets and hands them to a
//! [`Relay`]; the relay answers with the bytes to write and [`Event`]s to execute. It owns
//! routing, which door reaches which method ([`Method`]), the operator gate, relay
//! authentication with its key book, the error-to-status mapping, `Retry-After`, WebSocket
//! answer frames, notifications and closes, and outbound relay requests, signed, with the
//! classification of what became of them. The host keeps sockets, TLS, body limits and
//! timeouts, timers, storage and process life.
//!
//! A request that needs what the core does not hold (a relay's key; on a sharded relay, an
//! account's route from a sibling shard) is parked in the core under the host's ticket
//! ([`Step::Parked`], [`parking`]): the host starts the fetch the core names, reports it, and
//! gets the request's answer back from that report ([`Resumed`]).

pub mod address;
pub mod ahead;
pub mod alarm;
pub mod health;
pub mod host_metrics;
pub mod http;
pub mod keys;
pub mod limits;
pub mod method;
pub mod outbound;
pub mod parking;
pub mod placement;
pub mod socket;
pub mod typed;

pub use http::{Listener, Refusal, Request, Response, Route};
pub use method::{Door, Method};
pub use outbound::{Fetch, PeerRequest};
pub use parking::{Need, Parked};
pub use socket::{Answer, Upgrade};

use crate::engine::shard::{Shard, SiblingRoute};
use crate::engine::{self, Caller, Effect, Engine, Entropy, Storage};
use crate::wire::canonical;
use crate::wire::digest;
use crate::wire::frame;
use crate::wire::identity::RelayId;
use crate::wire::json::{self, Object, Value};
use crate::wire::relay_request;
use crate::{Error, ErrorCode};
use ed25519_dalek::SigningKey;
use keys::{KeyBook, Lookup};
use parking::{Awaited, Entry, Parking, Waiter};

/// The longest a host waits for a peer's answer, whatever the attempt timeout.
pub const MAX_EXCHANGE_MS: u64 = 20_000;

/// How long a host waits for a peer's answer (an attempt or a key fetch): two thirds of the
/// engine's attempt timeout, so the host's verdict reaches the core before the core's own
/// timer decides, and at most [`MAX_EXCHANGE_MS`].
pub fn exchange_timeout(attempt_timeout: u64) -> u64 {
    (attempt_timeout * 2 / 3).clamp(1, MAX_EXCHANGE_MS)
}

/// What the host must do after a call, beside writing its answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Carry this request to another relay, then report with [`Relay::fetched`].
    Send(PeerRequest),
    /// Call [`Relay::tick`] at (or after) this time; replaces any earlier wake-up.
    WakeAt(u64),
    /// Send `frame` (a `message.timeline.changed` notification) to every WebSocket of `account`.
    Notify {
        /// The account whose timeline changed.
        account: String,
        /// Its latest sequence number.
        latest_seq: u64,
        /// The notification frame, ready to send.
        frame: String,
    },
    /// Close every WebSocket of this device with `code` and `reason`.
    Close {
        /// The device's account.
        account: String,
        /// The device.
        device_id: String,
        /// The close code.
        code: u16,
        /// The close reason.
        reason: &'static str,
    },
    /// A message was accepted for the first time (for the host's log: ids only).
    Accepted(crate::engine::Acceptance),
    /// A delivery this relay was responsible for ended (for the host's log and metrics):
    /// `status` is `target_accepted` or `failed`, `error_code` the failure's code.
    DeliveryEnded {
        /// The sender's account.
        from: String,
        /// The message.
        message_id: String,
        /// The recipient's account.
        to: String,
        /// `target_accepted` or `failed`.
        status: &'static str,
        /// The failure's code.
        error_code: Option<String>,
    },
    /// An operator action took effect: the host writes one audit log line for it, always.
    OperatorAction(crate::engine::OperatorAction),
    /// Hand `body` to sibling shard `shard` as a public `POST {path}` (its own events run
    /// as any call's), and drop the answer: a sharded relay's shards sharing a route.
    ShardCall {
        /// The sibling shard.
        shard: u32,
        /// The path, `/v1/{method}`.
        path: &'static str,
        /// The request body.
        body: Vec<u8>,
    },
}

/// How many times a request or frame waits (for a key, for a sibling shard's route) before
/// the core answers it [`Response::busy`] (a frame, [`socket::busy_frame`]) rather than
/// park it again: nothing was accepted, retry in a second. The core's books bound the
/// fetches; this bounds a request that keeps needing another.
pub const ROUNDS: usize = 3;

/// What the core makes of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Write this answer.
    Respond(Response),
    /// The request waits in the core under its ticket: start [`Parked::start`] if there is
    /// one, report it, and the report ([`Relay::key_fetched`], [`Relay::route_fetched`])
    /// hands back this request's step as a [`Resumed`].
    Parked(Parked),
    /// Accept the WebSocket upgrade; the socket belongs to this session.
    Upgrade(Upgrade),
    /// The operator asked for a backup: write a consistent copy of the storage to `path`
    /// (absolute), then answer `{"path", "bytes"}` (or an `internal` error).
    Backup {
        /// Where to write it.
        path: String,
    },
}

/// A parked request's step, handed back by the report of what it waited for.
#[derive(Clone, Debug, PartialEq)]
pub struct Resumed {
    /// The ticket the host parked it under.
    pub ticket: u32,
    /// Its step: an HTTP request's, or a WebSocket frame's answer.
    pub resumption: Resumption,
}

/// What a parked request comes back as.
#[derive(Clone, Debug, PartialEq)]
pub enum Resumption {
    /// An HTTP request's step (a [`Step::Parked`] again when it waits once more: the same
    /// ticket, and maybe another fetch to start).
    Step(Step),
    /// A WebSocket frame's answer (with [`Answer::parked`] when it waits once more).
    Frame(Answer),
}

/// Where a request stands after the core looked at it: answered, or waiting for a fetch.
enum Flow<T> {
    Done(T),
    Wait(Awaited, Option<Need>),
}

impl<T> Flow<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Flow<U> {
        match self {
            Flow::Done(t) => Flow::Done(f(t)),
            Flow::Wait(a, start) => Flow::Wait(a, start),
        }
    }
}

/// A route a call waits for: `account`'s, held by sibling shard `shard`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteWanted {
    /// The account whose route is needed.
    pub account: String,
    /// The shard of this relay that serves it.
    pub shard: u32,
}

impl RouteWanted {
    /// The request that asks shard `shard` for the route: a public `POST /v1/route.get` of
    /// `{"account"}`, from no address, for the host to hand to that shard's core.
    pub fn request(&self) -> Request {
        let mut body = Vec::with_capacity(self.account.len() + 16);
        body.extend_from_slice(b"{\"account\":");
        canonical::write_string(&self.account, &mut body);
        body.push(b'}');
        Request {
            listener: Listener::Public,
            method: "POST".into(),
            path: "/v1/route.get".into(),
            query: String::new(),
            headers: Vec::new(),
            body,
            origin: None,
        }
    }
}

/// What a tick did.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// What the host must do; ends with the next wake-up when there is one.
    pub events: Vec<Event>,
    /// Entries the tick set aside (canonical JSON each): log them.
    pub quarantined: Vec<String>,
    /// Why the tick failed, if it did: tick again soon.
    pub error: Option<String>,
}

/// The relay: the engine behind its transports.
pub struct Relay<S: Storage, E: Entropy> {
    engine: Engine<S, E>,
    key: SigningKey,
    public: [u8; 32],
    /// SHA-256 of the operator token; `None`: no operator API.
    operator: Option<[u8; 32]>,
    keys: KeyBook,
    parking: Parking,
}

impl<S: Storage, E: Entropy> Relay<S, E> {
    /// A relay over `engine`, signing with the key of `seed`; `operator_token` opens the
    /// admin listener's API to its holder.
    pub fn new(engine: Engine<S, E>, seed: &[u8; 32], operator_token: Option<&str>) -> Self {
        let key = SigningKey::from_bytes(seed);
        let public = key.verifying_key().to_bytes();
        Relay {
            engine,
            key,
            public,
            operator: operator_token.map(|t| digest::sha256(t.as_bytes())),
            keys: KeyBook::default(),
            parking: Parking::default(),
        }
    }

    /// The engine, for what the transports do not cover (embedding, tests, metrics).
    pub fn engine(&mut self) -> &mut Engine<S, E> {
        &mut self.engine
    }

    /// This relay's public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.public
    }

    /// Key fetches started so far.
    pub fn key_fetches(&self) -> u64 {
        self.keys.fetches()
    }

    /// Requests and frames parked now, waiting for a fetch.
    pub fn parked(&self) -> usize {
        self.parking.len()
    }

    /// This relay's `/.well-known/relay` document.
    pub fn well_known(&self) -> Vec<u8> {
        canonical::to_vec(&self.engine.well_known(&self.public))
    }

    /// Handles one request read whole. `ticket` is the host's name for it, unique among
    /// its requests still waiting: if the request must wait for a fetch, it is parked under
    /// it ([`Step::Parked`]) and its step comes back, named so, from the fetch's report.
    pub fn handle(&mut self, req: &Request, ticket: u32, now: u64) -> Step {
        let may_wait = self.parking.has_room(ticket, parking::http_bytes(req));
        match self.route_request(req, may_wait, now) {
            Flow::Done(step) => step,
            Flow::Wait(awaited, start) => {
                self.park(ticket, Waiter::Http(req.clone()), awaited, 0, now);
                Step::Parked(Parked { start })
            }
        }
    }

    fn park(&mut self, ticket: u32, waiter: Waiter, awaited: Awaited, round: u32, now: u64) {
        self.parking.park(Entry {
            ticket,
            waiter,
            awaited,
            round,
            since: now,
        });
    }

    /// A request's way through the transport; `may_wait`: it may be parked (else what it
    /// would wait for is answered busy, and no fetch is started for it).
    fn route_request(&mut self, req: &Request, may_wait: bool, now: u64) -> Flow<Step> {
        let (door, name) = match req.route() {
            Route::Call(door, name) => (door, name),
            Route::WellKnown => {
                return Flow::Done(Step::Respond(Response::json(
                    200,
                    self.well_known(),
                    Vec::new(),
                )))
            }
            Route::Upgrade => return Flow::Done(self.upgrade(req, now)),
            Route::NotFound => {
                return Flow::Done(Step::Respond(Response::fail(
                    ErrorCode::NotFound,
                    "no such endpoint",
                )))
            }
        };
        // A batch of deliveries has a limit of its own (`max_batch_bytes`).
        let params = match self.params_within(&req.path, &req.body) {
            Ok(p) => p,
            Err(r) => return Flow::Done(Step::Respond(r)),
        };
        match door {
            Door::Client => match Method::through(name, door) {
                Ok(m) => {
                    let caller = match req.bearer() {
                        Some(t) => Caller::Session(t.to_string()),
                        None => Caller::Anonymous,
                    };
                    self.call_step(&caller, req, m, params, may_wait, now)
                }
                Err(e) => Flow::Done(Step::Respond(Response::error(&e))),
            },
            Door::Relay => self.relay_call(req, name, params, may_wait, now),
            Door::Operator => Flow::Done(self.operator_call(req, name, params, now)),
        }
    }

    /// Answers, at `now`, the parked requests waiting for `awaited` and those no report
    /// reached in time (busy), in the order they were parked.
    fn resume(&mut self, awaited: &Awaited, now: u64) -> Vec<Resumed> {
        let mut out = Vec::new();
        for e in self.parking.take_abandoned(now) {
            let resumption = match &e.waiter {
                Waiter::Http(_) => Resumption::Step(Step::Respond(Response::busy())),
                Waiter::Frame { text, .. } => Resumption::Frame(busy_answer(text)),
            };
            out.push(Resumed {
                ticket: e.ticket,
                resumption,
            });
        }
        for e in self.parking.take(awaited) {
            let round = e.round + 1;
            // Past its rounds a request may not wait again: what it would wait for is busy.
            let may_wait =
                (round as usize) < ROUNDS && self.parking.has_room(e.ticket, e.waiter.bytes());
            let flow = match &e.waiter {
                Waiter::Http(req) => self.route_request(req, may_wait, now).map(Resumption::Step),
                Waiter::Frame {
                    token,
                    origin,
                    text,
                } => self
                    .frame(token, origin.as_deref(), text, may_wait, now)
                    .map(Resumption::Frame),
            };
            let resumption = match flow {
                Flow::Done(r) => r,
                // Parked again under the same ticket, as the kind of request it is.
                Flow::Wait(awaited, start) => {
                    let parked = Parked { start };
                    let r = match &e.waiter {
                        Waiter::Http(_) => Resumption::Step(Step::Parked(parked)),
                        Waiter::Frame { .. } => Resumption::Frame(waiting_answer(parked)),
                    };
                    self.park(e.ticket, e.waiter, awaited, round, now);
                    r
                }
            };
            out.push(Resumed {
                ticket: e.ticket,
                resumption,
            });
        }
        out
    }

    /// A call's body as its params: judged by the strict parser before anything else looks
    /// at the call, within the size limit first (the call then takes them parsed once).
    fn params(&self, body: &[u8]) -> Result<Object, Response> {
        self.params_within("", body)
    }

    /// [`Relay::params`] of a request to `path`, within that path's body limit.
    fn params_within(&self, path: &str, body: &[u8]) -> Result<Object, Response> {
        let policies = &self.engine.config().policies;
        if let Some(e) = policies.body_too_large(path, body.len()) {
            return Err(Response::error(&e));
        }
        json::parse_object(body).map_err(|e| Response::error(&e.into()))
    }

    fn is_operator(&self, req: &Request) -> bool {
        use subtle::ConstantTimeEq;
        match (self.operator, req.bearer()) {
            (Some(want), Some(t)) => bool::from(digest::sha256(t.as_bytes()).ct_eq(&want)),
            _ => false,
        }
    }

    fn operator_call(&mut self, req: &Request, name: &str, params: Object, now: u64) -> Step {
        if !self.is_operator(req) {
            return Step::Respond(Response::fail(
                ErrorCode::Unauthenticated,
                "operator token required",
            ));
        }
        if name == "backup" {
            return match params.get("path").and_then(Value::as_str) {
                Some(p) if p.starts_with('/') => Step::Backup {
                    path: p.to_string(),
                },
                _ => Step::Respond(Response::fail(
                    ErrorCode::InvalidParams,
                    "backup takes {\"path\": an absolute file name}",
                )),
            };
        }
        match Method::through(&format!("admin.{name}"), Door::Operator) {
            Ok(m) => Step::Respond(self.call_parsed(&Caller::Operator, req, m, params, now)),
            Err(e) => Step::Respond(Response::error(&e)),
        }
    }

    fn relay_call(
        &mut self,
        req: &Request,
        name: &str,
        params: Object,
        may_wait: bool,
        now: u64,
    ) -> Flow<Step> {
        let respond = |r| Flow::Done(Step::Respond(r));
        let method = match Method::through(name, Door::Relay) {
            Ok(m) => m,
            Err(e) => return respond(Response::error(&e)),
        };
        let headers = req.relay_headers();
        let Some(headers) = headers else {
            return respond(Response::fail(
                ErrorCode::Unauthenticated,
                "relay authentication headers are missing",
            ));
        };
        // to, method and ts first; only then the source's key.
        let (c, crypto) = self.engine.config_and_crypto();
        let checked = relay_request::precheck_with(
            &headers,
            &c.network,
            &c.relay,
            method.as_str(),
            &req.body,
            now,
            c.policies.clock_tolerance,
            |b| crypto.sha256(b),
        );
        let checked = match checked {
            Ok(p) => p,
            Err(e) => return respond(Response::error(&e)),
        };
        let source = checked.source.clone();
        let mut refused: Option<Error> = None;
        // A sibling shard of this relay signs with this relay's key: nothing to fetch.
        let own = source == self.engine.config().relay;
        loop {
            let lookup = if own {
                match refused {
                    None => Lookup::Key(self.public),
                    Some(_) => Lookup::None,
                }
            } else {
                self.keys
                    .lookup(source.as_str(), refused.is_some(), may_wait, now)
            };
            match lookup {
                Lookup::Key(key) => match self.engine.authenticate_relay(&checked, &key, now) {
                    Ok(source) => {
                        return self.call_step(
                            &Caller::relay_at(source, checked.route_revision),
                            req,
                            method,
                            params,
                            may_wait,
                            now,
                        )
                    }
                    // Under the cached key it failed: a newer key may have been published.
                    Err(e) if refused.is_none() => refused = Some(e),
                    Err(e) => return respond(Response::error(&e)),
                },
                Lookup::Fetch => {
                    let need = Need::Key {
                        url: outbound::well_known_url(&source),
                        relay: source.as_str().to_string(),
                        timeout_ms: exchange_timeout(self.engine.config().attempt_timeout),
                    };
                    return Flow::Wait(Awaited::Key(source.as_str().to_string()), Some(need));
                }
                Lookup::Wait => {
                    return Flow::Wait(Awaited::Key(source.as_str().to_string()), None);
                }
                Lookup::None => {
                    let e = refused.unwrap_or_else(|| {
                        Error::new(
                            ErrorCode::Unauthenticated,
                            "could not fetch the source relay's key",
                        )
                    });
                    return respond(Response::error(&e));
                }
                // It may not wait (again): nothing was accepted, retry in a second.
                Lookup::Exhausted => return respond(Response::busy()),
                Lookup::Busy => {
                    let mut d = Object::new();
                    d.insert("retry_after", 1000u64);
                    let e = Error::new(
                        ErrorCode::Unavailable,
                        "too many key fetches in flight; retry",
                    )
                    .with_data(Value::Object(d));
                    return respond(Response::error(&e));
                }
            }
        }
    }

    /// Runs a request a sibling shard of this relay emitted for this shard
    /// ([`PeerRequest::shard`], its `url` and `body`) as that relay's own call: the shards
    /// share the relay's key and its host carries the request between them, so there is no
    /// relay authentication to check, no nonce to remember, and the receiving rules do not
    /// verify again the signatures the sibling verified when it accepted the message. A host
    /// calls this only with what a sibling's [`Event::Send`] carried; the answer is reported
    /// to the sibling with [`Relay::fetched`], as a peer's would be.
    pub fn sibling(&mut self, url: &str, body: &[u8], now: u64) -> Response {
        let own = self.engine.config().relay.clone();
        let name = url
            .strip_prefix(own.as_str())
            .and_then(|path| path.strip_prefix("/relay/v1/"));
        let method = match name.map(|n| Method::through(n, Door::Relay)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Response::error(&e),
            None => {
                return Response::fail(
                    ErrorCode::NotFound,
                    "a sibling shard's request names another relay",
                )
            }
        };
        let params = match self.params(body) {
            Ok(p) => p,
            Err(r) => return r,
        };
        let r = self.engine.call_parsed(
            &Caller::relay(own),
            None,
            method.as_str(),
            params,
            body.len(),
            now,
        );
        // A relay method never waits for a sibling's route; should one ever ask, nothing
        // was accepted and the sibling retries.
        if self.wanted().is_some() {
            return Response::busy();
        }
        self.answer(r, now)
    }

    /// Reports what became of a [`Need::Key`] fetch (every one the host started): the
    /// requests that waited for it, answered (or parked again), and those no report reached
    /// in time, answered busy.
    pub fn key_fetched(&mut self, relay: &str, fetch: Fetch, now: u64) -> Vec<Resumed> {
        let network = self.engine.config().network.clone();
        let key = match (RelayId::parse(relay), fetch) {
            (Ok(id), Fetch::Answered(200, body)) => {
                relay_request::parse_well_known(&body, &id, &network).ok()
            }
            _ => None,
        };
        self.keys.fetched(relay, key, now);
        self.resume(&Awaited::Key(relay.to_string()), now)
    }

    /// Reports what became of a [`Need::Route`] fetch for `account` (every one the host
    /// started): the sibling's `route.get` answer, or that it could not be asked. Returns
    /// the parked requests' steps as [`Relay::key_fetched`] does.
    pub fn route_fetched(&mut self, account: &str, fetch: Fetch, now: u64) -> Vec<Resumed> {
        let route = match fetch {
            Fetch::Answered(200, body) => match json::parse_object(&body) {
                Ok(mut o) => match o.remove("route") {
                    Some(Value::Object(r)) => SiblingRoute::Route(r),
                    _ => SiblingRoute::Failed,
                },
                Err(_) => SiblingRoute::Failed,
            },
            Fetch::Answered(404, _) => SiblingRoute::Absent,
            _ => SiblingRoute::Failed,
        };
        self.engine.sibling_route(account, route);
        self.resume(&Awaited::Route(account.to_string()), now)
    }

    /// A call whose answer may have to wait for a sibling shard's route.
    fn call_step(
        &mut self,
        caller: &Caller,
        req: &Request,
        method: Method,
        params: Object,
        may_wait: bool,
        now: u64,
    ) -> Flow<Step> {
        let r = self.call_parsed(caller, req, method, params, now);
        match self.wanted() {
            // It may not wait (again): nothing was accepted, retry in a second.
            Some(_) if !may_wait => Flow::Done(Step::Respond(Response::busy())),
            Some(w) => self.wait_for_route(w),
            None => Flow::Done(Step::Respond(r)),
        }
    }

    /// Waits for `w`'s route: one fetch per account, however many requests wait for it.
    fn wait_for_route<T>(&mut self, w: RouteWanted) -> Flow<T> {
        let awaited = Awaited::Route(w.account.clone());
        let start = (!self.parking.waits_for(&awaited)).then_some(Need::Route(w));
        Flow::Wait(awaited, start)
    }

    /// The route the last call waits for, if it waits for one.
    fn wanted(&mut self) -> Option<RouteWanted> {
        let account = self.engine.wanted_route()?;
        let count = self.engine.config().shard.count;
        Some(RouteWanted {
            shard: Shard::of_account(&account, count),
            account,
        })
    }

    fn upgrade(&mut self, req: &Request, now: u64) -> Step {
        let Some(token) = req.bearer().or_else(|| req.query_param("session")) else {
            return Step::Respond(Response::fail(
                ErrorCode::Unauthenticated,
                "a session is required",
            ));
        };
        match self.engine.session_info(token, now) {
            Ok(i) => Step::Upgrade(Upgrade {
                token: token.to_string(),
                account: i.account,
                device_id: i.device_id,
                expires_at: i.expires_at,
            }),
            Err(e) => Step::Respond(Response::error(&e)),
        }
    }

    /// Handles one text message of a WebSocket opened with [`Step::Upgrade`] for `token`;
    /// `ticket` as for [`Relay::handle`]: a frame that must wait is parked under it (an
    /// answer with [`Answer::parked`], nothing to send yet).
    pub fn message(
        &mut self,
        token: &str,
        origin: Option<&str>,
        text: &str,
        ticket: u32,
        now: u64,
    ) -> Answer {
        let may_wait = self
            .parking
            .has_room(ticket, parking::frame_bytes(token, text));
        match self.frame(token, origin, text, may_wait, now) {
            Flow::Done(a) => a,
            Flow::Wait(awaited, start) => {
                let waiter = Waiter::Frame {
                    token: token.to_string(),
                    origin: origin.map(str::to_string),
                    text: text.to_string(),
                };
                self.park(ticket, waiter, awaited, 0, now);
                waiting_answer(Parked { start })
            }
        }
    }

    /// A frame's way through the core; `may_wait` as for [`Relay::route_request`].
    fn frame(
        &mut self,
        token: &str,
        origin: Option<&str>,
        text: &str,
        may_wait: bool,
        now: u64,
    ) -> Flow<Answer> {
        let f = match frame::parse(text.as_bytes()) {
            Ok(f) => f,
            Err((id, e)) => {
                return Flow::Done(Answer {
                    text: socket::answer_frame(id, e.code.http_status(), &error_bytes(&e)),
                    close: None,
                    effects: Vec::new(),
                    parked: None,
                })
            }
        };
        let m = match Method::through(&f.method, Door::Client) {
            Ok(m) => m,
            Err(e) => {
                return Flow::Done(Answer {
                    text: socket::answer_frame(f.id, e.code.http_status(), &error_bytes(&e)),
                    close: None,
                    effects: Vec::new(),
                    parked: None,
                })
            }
        };
        // The frame's params as the strict parser read them are what the method works on.
        let r = self.engine.call_parsed(
            &Caller::Session(token.to_string()),
            origin,
            m.as_str(),
            f.params,
            text.len(),
            now,
        );
        if let Some(w) = self.wanted() {
            // It may not wait (again): nothing was accepted, retry in a second.
            if !may_wait {
                return Flow::Done(busy_answer(text));
            }
            return self.wait_for_route(w);
        }
        let closed = r.http_status() == 401;
        Flow::Done(Answer {
            text: socket::answer_of(f.id, &r.result),
            close: closed.then_some((socket::SESSION_CLOSED, socket::ENDED)),
            effects: self.events(r.effects, now),
            parked: None,
        })
    }

    /// Reports what became of an [`Event::Send`].
    pub fn fetched(&mut self, task: &str, attempt: u32, fetch: Fetch, now: u64) -> Vec<Event> {
        let effects = self
            .engine
            .outcome(task, attempt, outbound::classify(fetch), now);
        self.events(effects, now)
    }

    /// Runs what is due at `now`; the events end with the next wake-up, if any.
    pub fn tick(&mut self, now: u64) -> Tick {
        let r = self.engine.try_tick(now);
        let mut error = None;
        let mut quarantined = Vec::new();
        match &r.result {
            Err(e) => error = Some(e.to_string()),
            Ok(v) => {
                if let Some(Value::Array(a)) = v.as_object().and_then(|o| o.get("quarantined")) {
                    quarantined = a.iter().map(canonical::to_string).collect();
                }
            }
        }
        let mut events = self.events(r.effects, now);
        if !events.iter().any(|e| matches!(e, Event::WakeAt(_))) {
            match self.engine.next_wake() {
                Ok(Some(at)) => events.push(Event::WakeAt(at)),
                Ok(None) => {}
                Err(e) => {
                    error.get_or_insert_with(|| format!("the next wake-up could not be read: {e}"));
                }
            }
        }
        Tick {
            events,
            quarantined,
            error,
        }
    }

    /// Calls a method for a caller the transport authenticated.
    pub fn call(
        &mut self,
        caller: &Caller,
        origin: Option<&str>,
        method: Method,
        params: &[u8],
        now: u64,
    ) -> Response {
        let r = self
            .engine
            .call_from(caller, origin, method.as_str(), params, now);
        self.answer(r, now)
    }

    /// An engine answer as the host writes it: status, canonical body, events.
    fn answer(&mut self, r: engine::Response, now: u64) -> Response {
        let (status, body) = (r.http_status(), r.body());
        let events = self.events(r.effects, now);
        Response::json(status, body, events)
    }

    /// [`Relay::call`] with `req`'s body already parsed into `params`.
    fn call_parsed(
        &mut self,
        caller: &Caller,
        req: &Request,
        method: Method,
        params: Object,
        now: u64,
    ) -> Response {
        let r = self.engine.call_parsed(
            caller,
            req.origin.as_deref(),
            method.as_str(),
            params,
            req.body.len(),
            now,
        );
        self.answer(r, now)
    }

    /// The host-facing form of engine effects: sends are signed here.
    pub fn events(&mut self, effects: Vec<Effect>, now: u64) -> Vec<Event> {
        effects
            .into_iter()
            .map(|e| match e {
                Effect::Send {
                    task,
                    attempt,
                    target,
                    method,
                    body,
                    shard,
                    route_revision,
                    riders: _,
                } => {
                    let timeout_ms = exchange_timeout(self.engine.config().attempt_timeout);
                    // A sibling shard takes the request through `Relay::sibling`, with no
                    // relay authentication: nothing to sign, no nonce to spend.
                    let headers = match shard {
                        Some(_) => Vec::new(),
                        None => {
                            let mut nonce = [0u8; 16];
                            self.engine.random(&mut nonce);
                            let (c, crypto) = self.engine.config_and_crypto();
                            let hash = crypto.sha256(&body);
                            let h = outbound::sign(
                                &self.key,
                                &c.network,
                                &c.relay,
                                &target,
                                method,
                                &hash,
                                now,
                                &nonce,
                                route_revision,
                            );
                            outbound::headers(&h)
                        }
                    };
                    Event::Send(PeerRequest {
                        task,
                        attempt,
                        url: outbound::url(&target, method),
                        target: target.as_str().to_string(),
                        headers,
                        body,
                        timeout_ms,
                        shard,
                    })
                }
                Effect::WakeAt(at) => Event::WakeAt(at),
                Effect::Notify {
                    account,
                    latest_seq,
                } => Event::Notify {
                    frame: socket::notification(&account, latest_seq),
                    account,
                    latest_seq,
                },
                Effect::EndDeviceSessions { account, device_id } => Event::Close {
                    account,
                    device_id,
                    code: socket::SESSION_CLOSED,
                    reason: socket::REVOKED,
                },
                Effect::Accepted(a) => Event::Accepted(a),
                Effect::DeliveryEnded {
                    from,
                    message_id,
                    to,
                    status,
                    error_code,
                } => Event::DeliveryEnded {
                    from,
                    message_id,
                    to,
                    status,
                    error_code,
                },
                Effect::OperatorAction(a) => Event::OperatorAction(a),
                Effect::ShardCall { shard, path, body } => Event::ShardCall { shard, path, body },
            })
            .collect()
    }
}

/// The answer to a frame that may not wait: busy, nothing was accepted.
fn busy_answer(text: &str) -> Answer {
    Answer {
        text: socket::busy_frame(text),
        close: None,
        effects: Vec::new(),
        parked: None,
    }
}

/// The answer to a frame parked in the core: nothing to send yet.
fn waiting_answer(parked: Parked) -> Answer {
    Answer {
        text: String::new(),
        close: None,
        effects: Vec::new(),
        parked: Some(parked),
    }
}

fn error_bytes(e: &Error) -> Vec<u8> {
    canonical::to_vec(&engine::error_body(e))
}

#[cfg(test)]
mod tests;
