//! relay-core as a WebAssembly component: wit-bindgen glue and nothing else.
//!
//! Built for `wasm32-unknown-unknown` and encoded as a component by
//! `xtask component`; it imports only `relay:core/host` (storage, logging,
//! entropy), never WASI, so the host grants it no ambient authority.

#[cfg(target_arch = "wasm32")]
mod guest {
    // Generated code: its shape follows the WIT, not our lints.
    #[allow(clippy::too_many_arguments)]
    mod bindings {
        wit_bindgen::generate!({ world: "relay", path: "../wit" });
    }

    use bindings::relay::core::host;
    use bindings::relay::core::types as t;
    use relay_core::engine::{
        self, Caller, Config, Effect, Engine, Entropy, Outcome, PeerMethod, Response,
    };
    use relay_core::engine::{Storage, StorageError};
    use relay_core::wire::digest;
    use relay_core::wire::identity::RelayId;
    use relay_core::wire::relay_request::{self, RelayHeaders};
    use relay_core::wire::signature::{self, SignatureError};
    use std::cell::RefCell;

    /// The host's storage, through the `host` import.
    struct HostStorage;

    impl Storage for HostStorage {
        fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            host::storage_get(key).map_err(StorageError)
        }
        fn scan(
            &mut self,
            start: &[u8],
            end: &[u8],
            limit: usize,
        ) -> Result<Vec<engine::storage::Entry>, StorageError> {
            let limit = u32::try_from(limit).unwrap_or(u32::MAX);
            host::storage_scan(start, end, limit)
                .map(|rows| rows.into_iter().map(|e| (e.key, e.value)).collect())
                .map_err(StorageError)
        }
        fn commit(&mut self, batch: Vec<engine::storage::Write>) -> Result<(), StorageError> {
            let writes: Vec<host::Write> = batch
                .into_iter()
                .map(|(key, value)| host::Write { key, value })
                .collect();
            host::storage_commit(&writes).map_err(StorageError)
        }
    }

    /// The host's native verification, through the `host` import; `None` (declined) falls back to the core's own.
    fn host_verify(
        key: &[u8; 32],
        msg: &[u8],
        sig: &[u8; 64],
    ) -> Option<Result<(), SignatureError>> {
        match host::verify_ed25519(key, msg, sig) {
            host::Verdict::Valid => Some(Ok(())),
            host::Verdict::InvalidKey => Some(Err(SignatureError::InvalidKey)),
            host::Verdict::Mismatch => Some(Err(SignatureError::Mismatch)),
            host::Verdict::Declined => None,
        }
    }

    /// The host's native SHA-256, through the `host` import; `None` (declined) falls back to the core's own.
    fn host_sha256(data: &[u8]) -> Option<[u8; 32]> {
        let (a, b, c, d) = host::sha256(data)?;
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(8).zip([a, b, c, d]) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        Some(out)
    }

    /// The host's CSPRNG, through the `host` import.
    struct HostEntropy;

    impl Entropy for HostEntropy {
        fn fill(&mut self, buf: &mut [u8]) {
            let bytes = host::entropy(buf.len() as u32);
            for (d, s) in buf.iter_mut().zip(bytes) {
                *d = s;
            }
        }
    }

    struct State {
        engine: Engine<HostStorage, HostEntropy>,
        seed: [u8; 32],
    }

    thread_local! {
        static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
    }

    fn not_ready() -> Response {
        Response {
            result: Err(relay_core::Error::new(
                relay_core::ErrorCode::Internal,
                "component not initialized",
            )),
            effects: Vec::new(),
        }
    }

    fn with<R>(f: impl FnOnce(&mut State) -> R, otherwise: impl FnOnce() -> R) -> R {
        STATE.with(|s| match s.borrow_mut().as_mut() {
            Some(state) => f(state),
            None => otherwise(),
        })
    }

    fn caller(c: t::Caller) -> Caller {
        match c {
            t::Caller::Anonymous => Caller::Anonymous,
            t::Caller::Session(s) => Caller::Session(s),
            t::Caller::Relay(r) => match RelayId::parse(&r) {
                Ok(id) => Caller::Relay(id),
                Err(_) => Caller::Anonymous,
            },
            t::Caller::Operator => Caller::Operator,
        }
    }

    fn effects(list: Vec<Effect>) -> Vec<t::Effect> {
        list.into_iter()
            .map(|e| match e {
                Effect::Send {
                    task,
                    attempt,
                    target,
                    method,
                    body,
                } => t::Effect::Send(t::PeerRequest {
                    task,
                    attempt,
                    target: target.as_str().to_string(),
                    method: match method {
                        PeerMethod::Deliver => t::PeerMethod::Deliver,
                        PeerMethod::RouteGet => t::PeerMethod::RouteGet,
                    },
                    body,
                }),
                Effect::WakeAt(at) => t::Effect::WakeAt(at),
                Effect::Notify {
                    account,
                    latest_seq,
                } => t::Effect::Notify(t::Notify {
                    account,
                    latest_seq,
                }),
                Effect::DeliveryEnded {
                    from,
                    message_id,
                    to,
                    status,
                    error_code,
                } => t::Effect::DeliveryEnded(t::DeliveryEnd {
                    from,
                    message_id,
                    to,
                    status: status.to_string(),
                    error_code,
                }),
                Effect::EndDeviceSessions { account, device_id } => {
                    t::Effect::EndDeviceSessions(t::DeviceRef { account, device_id })
                }
            })
            .collect()
    }

    fn reply(r: Response) -> t::Reply {
        t::Reply {
            status: r.http_status(),
            body: r.body(),
            effects: effects(r.effects),
        }
    }

    fn error_reply(e: relay_core::Error) -> t::Reply {
        reply(Response {
            result: Err(e),
            effects: Vec::new(),
        })
    }

    fn headers(h: t::RelayHeaders) -> RelayHeaders {
        RelayHeaders {
            relay_id: h.relay_id,
            timestamp: h.timestamp,
            nonce: h.nonce,
            signature: h.signature,
        }
    }

    fn call(
        c: t::Caller,
        origin: Option<&str>,
        method: &str,
        params: Vec<u8>,
        now: u64,
    ) -> t::Reply {
        reply(with(
            |s| s.engine.call_from(&caller(c), origin, method, &params, now),
            not_ready,
        ))
    }

    struct Component;

    impl bindings::Guest for Component {
        fn init(config: String, relay_seed: Vec<u8>) -> Result<(), String> {
            let config = Config::from_json(config.as_bytes())?;
            let seed: [u8; 32] = relay_seed
                .try_into()
                .map_err(|_| "relay seed must be 32 bytes".to_string())?;
            let mut engine = Engine::new(config, HostStorage, HostEntropy);
            // Before anything reads the store: a store written by a newer relay is refused.
            engine.open_store()?;
            signature::set_verifier(Some(host_verify));
            digest::set_hasher(Some(host_sha256));
            STATE.with(|s| *s.borrow_mut() = Some(State { engine, seed }));
            host::log(host::Level::Info, "relay core component initialized");
            Ok(())
        }
        fn send(c: t::Caller, params: Vec<u8>, now: u64) -> t::Reply {
            call(c, None, "message.send", params, now)
        }
        fn deliver(c: t::Caller, params: Vec<u8>, now: u64) -> t::Reply {
            call(c, None, "message.deliver", params, now)
        }
        fn status(c: t::Caller, params: Vec<u8>, now: u64) -> t::Reply {
            call(c, None, "message.delivery.status", params, now)
        }
        fn sync(c: t::Caller, params: Vec<u8>, now: u64) -> t::Reply {
            call(c, None, "message.timeline.sync", params, now)
        }
        fn call(
            c: t::Caller,
            origin: Option<String>,
            method: String,
            params: Vec<u8>,
            now: u64,
        ) -> t::Reply {
            call(c, origin.as_deref(), &method, params, now)
        }
        fn outcome(task: String, attempt: u32, outcome: t::Outcome, now: u64) -> Vec<t::Effect> {
            let outcome = match outcome {
                t::Outcome::Answered(b) => Outcome::Result(b),
                t::Outcome::Rejected(b) => Outcome::Error(b),
                t::Outcome::Unknown => Outcome::Unknown,
                t::Outcome::NotAttempted => Outcome::NotAttempted,
            };
            effects(with(
                |s| s.engine.outcome(&task, attempt, outcome, now),
                Vec::new,
            ))
        }
        fn tick(now: u64) -> Vec<t::Effect> {
            let r = with(|s| s.engine.try_tick(now), not_ready);
            match &r.result {
                Err(e) => host::log(host::Level::Error, &format!("tick: {e}")),
                Ok(v) => {
                    // Entries the tick had to set aside: each is logged (admin.quarantine lists them).
                    let set_aside = v
                        .as_object()
                        .and_then(|o| o.get("quarantined"))
                        .and_then(|q| match q {
                            relay_core::wire::json::Value::Array(a) => Some(a.as_slice()),
                            _ => None,
                        })
                        .unwrap_or(&[]);
                    for entry in set_aside {
                        host::log(
                            host::Level::Warn,
                            &format!(
                                "tick: an entry was quarantined: {}",
                                relay_core::wire::canonical::to_string(entry)
                            ),
                        );
                    }
                }
            }
            effects(r.effects)
        }
        fn next_wake() -> Option<u64> {
            with(|s| s.engine.next_wake().ok().flatten(), || None)
        }
        fn session(token: String, now: u64) -> Result<t::SessionInfo, t::Reply> {
            with(
                |s| s.engine.session_info(&token, now),
                || {
                    Err(relay_core::Error::new(
                        relay_core::ErrorCode::Internal,
                        "component not initialized",
                    ))
                },
            )
            .map(|i| t::SessionInfo {
                account: i.account,
                device_id: i.device_id,
                expires_at: i.expires_at,
            })
            .map_err(error_reply)
        }
        fn sign_request(
            method: String,
            target: String,
            body: Vec<u8>,
            now: u64,
        ) -> Result<t::RelayHeaders, String> {
            let to = RelayId::parse(&target)?;
            let mut nonce = [0u8; 16];
            HostEntropy.fill(&mut nonce);
            with(
                |s| {
                    let c = s.engine.config();
                    let h = relay_request::sign(
                        &s.seed, &c.network, &method, &c.relay, &to, now, &nonce, &body,
                    );
                    Ok(t::RelayHeaders {
                        relay_id: h.relay_id,
                        timestamp: h.timestamp,
                        nonce: h.nonce,
                        signature: h.signature,
                    })
                },
                || Err("component not initialized".to_string()),
            )
        }
        fn check_request(
            h: t::RelayHeaders,
            method: String,
            body: Vec<u8>,
            now: u64,
        ) -> Result<String, t::Reply> {
            with(
                |s| {
                    let c = s.engine.config();
                    relay_request::precheck(
                        &headers(h),
                        &c.network,
                        &c.relay,
                        &method,
                        &body,
                        now,
                        c.policies.clock_tolerance,
                    )
                    .map(|p| p.source.as_str().to_string())
                },
                || {
                    Err(relay_core::Error::new(
                        relay_core::ErrorCode::Internal,
                        "component not initialized",
                    ))
                },
            )
            .map_err(error_reply)
        }
        fn authenticate_request(
            h: t::RelayHeaders,
            method: String,
            body: Vec<u8>,
            now: u64,
            source_key: Vec<u8>,
        ) -> Result<String, t::Reply> {
            with(
                |s| {
                    let c = s.engine.config();
                    let p = relay_request::precheck(
                        &headers(h),
                        &c.network,
                        &c.relay,
                        &method,
                        &body,
                        now,
                        c.policies.clock_tolerance,
                    )?;
                    let key: [u8; 32] = source_key.try_into().map_err(|_| {
                        relay_core::Error::new(
                            relay_core::ErrorCode::Unauthenticated,
                            "relay key must be 32 bytes",
                        )
                    })?;
                    s.engine
                        .authenticate_relay(&p, &key, now)
                        .map(|r| r.as_str().to_string())
                },
                || {
                    Err(relay_core::Error::new(
                        relay_core::ErrorCode::Internal,
                        "component not initialized",
                    ))
                },
            )
            .map_err(error_reply)
        }
        fn metrics() -> Result<String, String> {
            with(
                |s| {
                    s.engine
                        .metrics()
                        .map(|m| m.to_prometheus())
                        .map_err(|e| format!("reading the metrics: {e}"))
                },
                || Err("component not initialized".to_string()),
            )
        }
        fn well_known() -> Vec<u8> {
            with(
                |s| {
                    let key = relay_request::public_key(&s.seed);
                    relay_core::wire::canonical::to_vec(&s.engine.well_known(&key))
                },
                Vec::new,
            )
        }
    }

    bindings::export!(Component with_types_in bindings);
}
