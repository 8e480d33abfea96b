//! relay-core: the relay protocol core, written once and run by every host.
//!
//! `wire` is the wire format (strict I-JSON, RFC 8785 canonical form, objects and their
//! signatures); `client` builds valid (or deliberately defective) objects for clients and
//! tests; `engine` is the protocol's rules; `transport` is HTTP, WebSocket and relay RPC
//! over the engine. The core performs no I/O and reads no global clock or random source:
//! time and entropy are inputs, and everything it wants done comes out as data.
//!
//! # The loop a host writes
//!
//! A host owns sockets, timers and storage, and moves bytes. This is the whole of its
//! protocol work, here with the in-memory store and a request read off a socket:
//!
//! ```
//! use relay_core::engine::{Config, Engine, MemoryStore};
//! use relay_core::transport::alarm::Alarm;
//! use relay_core::transport::{Event, Fetch, Listener, Need, Relay, Request, Resumption, Step};
//! use relay_core::wire::identity::RelayId;
//!
//! let mut config = Config::new(RelayId::parse("http://relay.example").unwrap(), "dev");
//! let now = 1_700_000_000_000; // the host's clock, in ms, passed in every call
//! // When this process started: attempts in flight before it are unknown outcomes.
//! config.started_at = Some(now);
//! // The host's CSPRNG; a fixed fill here so the example replays.
//! let entropy = |buf: &mut [u8]| buf.fill(7);
//! let mut engine = Engine::new(config, MemoryStore::default(), entropy);
//! engine.open_store().unwrap();
//! let mut relay = Relay::new(engine, &[1; 32], Some("operator token"));
//!
//! // The one timer: tick at start; each tick's events say when to tick next. The host
//! // sleeps `alarm.delay(now)`, then calls `alarm.fire()` and ticks again.
//! let mut alarm = Alarm::new();
//! let tick = relay.tick(now);
//! match tick.error {
//!     None => alarm.succeeded(),
//!     Some(_) => _ = alarm.failed(now), // retried after a backoff, never in a tight loop
//! }
//! for e in tick.events {
//!     if let Event::WakeAt(at) = e {
//!         alarm.wake_at(at);
//!     }
//! }
//!
//! // A request read whole off a socket (the host enforces the size and time limits).
//! let request = Request {
//!     listener: Listener::Public,
//!     method: "POST".into(),
//!     path: "/v1/route.get".into(),
//!     query: String::new(),
//!     headers: Vec::new(),
//!     body: br#"{"account":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#.to_vec(),
//!     origin: Some("192.0.2.7".into()),
//! };
//! // The host names each request with a ticket of its own; a request that must wait for a
//! // fetch is parked in the core under it, and the fetch's report hands its answer back.
//! let ticket = 1;
//! let answer = match relay.handle(&request, ticket, now) {
//!     Step::Respond(r) => r,
//!     // A relay request from a relay whose key is not known yet, or (a sharded relay) a call
//!     // that needs a sibling shard's route: start the fetch if the core names one (GET
//!     // the key document; ask shard `w.shard` with `w.request()`), report what came back,
//!     // and the report answers this ticket (and any other waiting for the same fetch).
//!     Step::Parked(p) => {
//!         let resumed = match p.start {
//!             Some(Need::Key { relay: peer, .. }) => relay.key_fetched(&peer, Fetch::NotSent, now),
//!             Some(Need::Route(w)) => relay.route_fetched(&w.account, Fetch::NotSent, now),
//!             None => unreachable!("no fetch is under way yet"),
//!         };
//!         match resumed.into_iter().find(|r| r.ticket == ticket).map(|r| r.resumption) {
//!             Some(Resumption::Step(Step::Respond(r))) => r,
//!             _ => unreachable!("a relay request waits once"),
//!         }
//!     }
//!     Step::Upgrade(_) => unreachable!("only GET /v1/ws upgrades"),
//!     Step::Backup { .. } => unreachable!("only the operator asks for backups"),
//! };
//! assert_eq!(answer.status, 404); // no route is held for that account
//!
//! // Write `answer.status`, `answer.headers` and `answer.body` as they are, then run its events.
//! for e in answer.effects {
//!     match e {
//!         // POST p.body to p.url with p.headers within p.timeout_ms (or, with p.shard, hand
//!         // it to that sibling shard's relay); report what was seen.
//!         Event::Send(p) => {
//!             let _later = relay.fetched(&p.task, p.attempt, Fetch::Unknown, now);
//!         }
//!         Event::WakeAt(at) => _ = alarm.wake_at(at), // the earliest wins
//!         // Push the frame to the account's WebSockets; close a revoked device's.
//!         Event::Notify { .. } | Event::Close { .. } => {}
//!         // For the log: a message accepted, a delivery ended (ids only).
//!         Event::Accepted(_) | Event::DeliveryEnded { .. } => {}
//!         // The audit log: one line per operator action, always.
//!         Event::OperatorAction(_) => {}
//!         // A sharded relay only: hand it to that shard, drop the answer.
//!         Event::ShardCall { .. } => {}
//!     }
//! }
//! let _sleep_ms = alarm.delay(now);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod error;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

pub use error::{Error, ErrorCode};
pub mod engine;
pub mod transport;
