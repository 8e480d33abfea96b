//! What a host thread does with a request before the core's thread takes it.
//!
//! A host that reads requests on threads other than the core's (the wasmtime host's HTTP
//! workers, a Node relay's transports thread) hands each request to [`Ahead`] first. It
//! answers what the core would answer without its state (no such endpoint, an oversize or
//! malformed body: the core's own strict parser, natively), and verifies the envelope of a
//! client's `message.send` or a relay's `message.deliver` into the pre-verification
//! [`Memory`] so the core's thread finds the verdict waiting. The choice of what is judged
//! and verified ahead is made here, once, for every host: a host only says which of its
//! threads runs it.

use super::http::{Request, Response, Route};
use super::method::Door;
use crate::engine::{Config, Policies};
use crate::wire::identity::RelayId;
use crate::wire::json::{self, Value};
use crate::wire::preverify::Memory;
use crate::wire::relay_request;
use crate::ErrorCode;
use std::sync::Arc;

/// What to do with a request once [`Ahead::request`] has seen it.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Write this answer: it is the one the core would give, and the core need not be called.
    Answer(Response),
    /// Hand the request to the core. `sending` is the session whose `message.send` envelope
    /// may have been verified ahead: the host tells the core's verifier for the span of this
    /// call, so a miss teaches the memory that session's device key.
    Core {
        /// The session token of a `message.send` (when pre-verifying).
        sending: Option<String>,
    },
}

/// The part of a relay's rules a host thread applies, and the memory it verifies into.
pub struct Ahead {
    relay: RelayId,
    network: String,
    policies: Policies,
    memory: Option<Arc<Memory>>,
}

impl Ahead {
    /// The rules of the relay `config` describes; `memory`, when the host pre-verifies (it
    /// also gives the core's verifier the same memory).
    pub fn new(config: &Config, memory: Option<Arc<Memory>>) -> Ahead {
        Ahead {
            relay: config.relay.clone(),
            network: config.network.clone(),
            policies: config.policies.clone(),
            memory,
        }
    }

    /// The memory verified into, if any.
    pub fn memory(&self) -> Option<&Arc<Memory>> {
        self.memory.as_ref()
    }

    /// Sees `req` at `now` (ms) on a host thread: answers it here, or says how to hand it on.
    pub fn request(&self, req: &Request, now: u64) -> Verdict {
        let go = Verdict::Core { sending: None };
        let (door, name) = match req.route() {
            Route::Call(door, name) => (door, name),
            Route::NotFound => {
                return Verdict::Answer(Response::fail(ErrorCode::NotFound, "no such endpoint"))
            }
            Route::WellKnown | Route::Upgrade => return go,
        };
        // The order is the core's (`Relay::handle`): the size, then the strict parse.
        if let Some(e) = self.policies.body_too_large(&req.path, req.body.len()) {
            return Verdict::Answer(Response::error(&e));
        }
        let params = match json::parse_object(&req.body) {
            Ok(p) => p,
            Err(e) => return Verdict::Answer(Response::error(&e.into())),
        };
        let Some(memory) = &self.memory else {
            return go;
        };
        match (door, name) {
            (Door::Client, "message.send") => match req.bearer() {
                Some(token) => {
                    memory.send(token, &params);
                    Verdict::Core {
                        sending: Some(token.to_string()),
                    }
                }
                None => go,
            },
            // Only a request whose headers pass the core's cheap checks (their forms, the
            // source's scheme, the clock) costs a verification here: a flood of stale or
            // malformed ones costs nothing.
            (Door::Relay, "message.deliver" | "message.deliver.batch") => {
                let checked = req.relay_headers().is_some_and(|h| {
                    relay_request::precheck(
                        &h,
                        &self.network,
                        &self.relay,
                        name,
                        &req.body,
                        now,
                        self.policies.clock_tolerance,
                    )
                    .is_ok()
                });
                if checked && name == "message.deliver" {
                    memory.deliver(&params);
                } else if checked {
                    // A batch: each item's envelope, as a deliver of its own would be.
                    if let Some(Value::Array(items)) = params.get("items") {
                        for item in items.iter().take(self.policies.max_batch as usize) {
                            if let Some(Value::Object(p)) =
                                item.as_object().and_then(|i| i.get("params"))
                            {
                                memory.deliver(p);
                            }
                        }
                    }
                }
                go
            }
            _ => go,
        }
    }

    /// Sees WebSocket text message `text` of session `token` on a host thread; whether it is
    /// a `message.send` whose session the host tells the core's verifier for its call.
    pub fn frame(&self, token: &str, text: &str) -> bool {
        let Some(memory) = &self.memory else {
            return false;
        };
        match crate::wire::frame::parse(text.as_bytes()) {
            Ok(f) if f.method == "message.send" => {
                memory.send(token, &f.params);
                true
            }
            _ => false,
        }
    }
}
