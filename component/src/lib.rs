//! relay-core as a WebAssembly component: wit-bindgen glue and nothing else.
//!
//! Built for `wasm32-unknown-unknown` and encoded as a component by
//! `xtask component`; it imports only `relay:core/host` (each relay's store, logging,
//! entropy), never WASI, so the host grants it no ambient authority.

#[cfg(target_arch = "wasm32")]
mod guest {
    // Generated code: its shape follows the WIT, not our lints.
    #[allow(clippy::too_many_arguments)]
    mod bindings {
        wit_bindgen::generate!({ world: "core", path: "../wit" });
    }

    use bindings::exports::relay::core::relay as exported;
    use bindings::relay::core::host;
    use bindings::relay::core::types as t;
    use relay_core::engine::{self, Caller, Config, Engine, Entropy, OpenError};
    use relay_core::engine::{Storage, StorageError};
    use relay_core::transport::{
        self, http, typed, Event, Fetch, Listener, Need, Parked, Relay, Request, Resumed,
        Resumption, Step,
    };
    use relay_core::wire::crypto::Crypto;
    use relay_core::wire::identity::RelayId;
    use relay_core::wire::signature::SignatureError;
    use relay_core::ErrorCode;
    use std::cell::RefCell;

    /// A relay's storage: the `store` resource the host opened for it.
    struct HostStorage(host::Store);

    impl Storage for HostStorage {
        fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            self.0.get(key).map_err(StorageError)
        }
        fn scan(
            &mut self,
            start: &[u8],
            end: &[u8],
            limit: usize,
        ) -> Result<Vec<engine::storage::Entry>, StorageError> {
            let limit = u32::try_from(limit).unwrap_or(u32::MAX);
            self.0
                .scan(start, end, limit)
                .map(|rows| rows.into_iter().map(|e| (e.key, e.value)).collect())
                .map_err(StorageError)
        }
        fn commit(&mut self, batch: Vec<engine::storage::Write>) -> Result<(), StorageError> {
            let writes: Vec<host::Write> = batch
                .into_iter()
                .map(|(key, value)| host::Write { key, value })
                .collect();
            self.0.commit(&writes).map_err(StorageError)
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

    fn caller(c: t::Caller) -> Caller {
        match c {
            t::Caller::Anonymous => Caller::Anonymous,
            t::Caller::Session(s) => Caller::Session(s),
            t::Caller::Relay(r) => match RelayId::parse(&r.relay) {
                Ok(id) => Caller::relay_at(id, r.route_revision),
                Err(_) => Caller::Anonymous,
            },
            t::Caller::Operator => Caller::Operator,
        }
    }

    fn pairs<K: ToString>(headers: Vec<(K, String)>) -> Vec<(String, String)> {
        headers
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn events(list: Vec<Event>) -> Vec<t::Event> {
        list.into_iter()
            .map(|e| match e {
                Event::Send(p) => t::Event::Send(t::PeerRequest {
                    task: p.task,
                    attempt: p.attempt,
                    target: p.target,
                    url: p.url,
                    headers: pairs(p.headers),
                    body: p.body,
                    timeout_ms: p.timeout_ms,
                    shard: p.shard,
                }),
                Event::WakeAt(at) => t::Event::WakeAt(at),
                Event::Notify {
                    account,
                    latest_seq,
                    frame,
                } => t::Event::Notify(t::Notify {
                    account,
                    latest_seq,
                    frame,
                }),
                Event::Close {
                    account,
                    device_id,
                    code,
                    reason,
                } => t::Event::Close(t::Close {
                    account,
                    device_id,
                    code,
                    reason: reason.to_string(),
                }),
                Event::Accepted(a) => t::Event::Accepted(t::Acceptance {
                    method: a.method.to_string(),
                    from: a.from,
                    message_id: a.message_id,
                    to: a.to,
                    status: a.status.to_string(),
                }),
                Event::DeliveryEnded {
                    from,
                    message_id,
                    to,
                    status,
                    error_code,
                } => t::Event::DeliveryEnded(t::DeliveryEnd {
                    from,
                    message_id,
                    to,
                    status: status.to_string(),
                    error_code,
                }),
                Event::OperatorAction(a) => t::Event::OperatorAction(t::OperatorAction {
                    action: a.action.to_string(),
                    subject: a.subject,
                    touched: a.touched,
                }),
                Event::ShardCall { shard, path, body } => t::Event::ShardCall(t::ShardCall {
                    shard,
                    path: path.to_string(),
                    body,
                }),
            })
            .collect()
    }

    fn response(r: http::Response) -> t::HttpResponse {
        t::HttpResponse {
            status: r.status,
            headers: pairs(r.headers),
            body: r.body,
            events: events(r.effects),
        }
    }

    fn request_of(request: t::HttpRequest) -> Request {
        Request {
            listener: match request.listener {
                t::Listener::Public => Listener::Public,
                t::Listener::Admin => Listener::Admin,
            },
            method: request.method,
            path: request.path,
            query: request.query,
            headers: request.headers,
            body: request.body,
            origin: request.origin,
        }
    }

    fn parked(p: Parked) -> t::Parked {
        t::Parked {
            start: p.start.map(|n| match n {
                Need::Key {
                    relay,
                    url,
                    timeout_ms,
                } => t::Need::Key(t::KeyFetch {
                    relay,
                    url,
                    timeout_ms,
                }),
                Need::Route(w) => t::Need::Route(route_wanted(w)),
            }),
        }
    }

    fn step(s: Step) -> t::Step {
        match s {
            Step::Respond(r) => t::Step::Respond(response(r)),
            Step::Parked(p) => t::Step::Parked(parked(p)),
            Step::Upgrade(u) => t::Step::Upgrade(t::Upgrade {
                token: u.token,
                account: u.account,
                device_id: u.device_id,
                expires_at: u.expires_at,
            }),
            Step::Backup { path } => t::Step::Backup(path),
        }
    }

    fn ws_answer(a: transport::Answer) -> t::WsAnswer {
        t::WsAnswer {
            text: a.text,
            close: a.close.map(|(code, reason)| (code, reason.to_string())),
            events: events(a.effects),
            parked: a.parked.map(parked),
        }
    }

    fn resumed(r: Vec<Resumed>) -> Vec<t::Resumed> {
        r.into_iter()
            .map(|r| t::Resumed {
                ticket: r.ticket,
                resumption: match r.resumption {
                    Resumption::Step(s) => t::Resumption::Http(step(s)),
                    Resumption::Frame(a) => t::Resumption::Frame(ws_answer(a)),
                },
            })
            .collect()
    }

    fn route_wanted(w: transport::RouteWanted) -> t::RouteWanted {
        t::RouteWanted {
            account: w.account,
            shard: w.shard,
        }
    }

    fn fetch(f: t::Fetch) -> Fetch {
        match f {
            t::Fetch::Answered((status, body)) => Fetch::Answered(status, body),
            t::Fetch::NotSent => Fetch::NotSent,
            t::Fetch::Unknown => Fetch::Unknown,
        }
    }

    /// One relay over the host's store; the component model never re-enters a guest, so the
    /// cell is never borrowed twice.
    type Core = Relay<HostStorage, HostEntropy>;

    fn call(
        relay: &mut Core,
        c: t::Caller,
        origin: Option<&str>,
        method: &str,
        params: Vec<u8>,
        now: u64,
    ) -> t::Reply {
        let r = relay
            .engine()
            .call_from(&caller(c), origin, method, &params, now);
        let (status, body) = (r.http_status(), r.body());
        let error = r.result.as_ref().err().map(|e| error_code(e.code));
        t::Reply {
            status,
            body,
            error,
            events: events(relay.events(r.effects, now)),
        }
    }

    fn error_object(e: typed::ErrorObject) -> t::ErrorObject {
        t::ErrorObject {
            code: e.code,
            message: e.message,
            data: e.data,
        }
    }

    fn failure(f: typed::Failure) -> t::Failure {
        t::Failure {
            code: error_code(f.code),
            status: f.status,
            error: error_object(f.error),
        }
    }

    fn delivery(d: typed::Outcome<typed::DeliveryStatus>) -> Result<t::Delivery, t::Failure> {
        let d = d.map_err(failure)?;
        let s = d.value;
        Ok(t::Delivery {
            status: t::DeliveryStatus {
                message_id: s.message_id,
                from: s.from,
                to: s.to,
                status: match s.status {
                    typed::DeliveryState::Delivering => t::DeliveryState::Delivering,
                    typed::DeliveryState::TargetAccepted => t::DeliveryState::TargetAccepted,
                    typed::DeliveryState::Failed => t::DeliveryState::Failed,
                },
                accepted_at: s.accepted_at,
                deadline: s.deadline,
                target_accepted_at: s.target_accepted_at,
                error: s.error.map(error_object),
            },
            events: events(d.events),
        })
    }

    fn entry(e: typed::TimelineEntry) -> t::TimelineEntry {
        t::TimelineEntry {
            seq: e.seq,
            kind: match e.kind {
                typed::EntryKind::Sent => t::EntryKind::Sent,
                typed::EntryKind::Received => t::EntryKind::Received,
                typed::EntryKind::SelfDelivery => t::EntryKind::SelfDelivery,
            },
            accepted_at: e.accepted_at,
            expires_at: e.expires_at,
            envelope: e.envelope,
            device_certificate: e.device_certificate,
            key_box: e.key_box,
        }
    }

    /// The WIT's error-code for the core's: one arm per code, so a new code fails to compile here.
    fn error_code(c: ErrorCode) -> t::ErrorCode {
        match c {
            ErrorCode::InvalidParams => t::ErrorCode::InvalidParams,
            ErrorCode::PayloadTooLarge => t::ErrorCode::PayloadTooLarge,
            ErrorCode::Unauthenticated => t::ErrorCode::Unauthenticated,
            ErrorCode::PermissionDenied => t::ErrorCode::PermissionDenied,
            ErrorCode::InvalidSignature => t::ErrorCode::InvalidSignature,
            ErrorCode::InvalidCertificate => t::ErrorCode::InvalidCertificate,
            ErrorCode::ClockSkew => t::ErrorCode::ClockSkew,
            ErrorCode::MessageExpired => t::ErrorCode::MessageExpired,
            ErrorCode::AuthorizationInvalid => t::ErrorCode::AuthorizationInvalid,
            ErrorCode::DiscoveryDisabled => t::ErrorCode::DiscoveryDisabled,
            ErrorCode::DeviceUnknown => t::ErrorCode::DeviceUnknown,
            ErrorCode::NotHomeRelay => t::ErrorCode::NotHomeRelay,
            ErrorCode::StateConflict => t::ErrorCode::StateConflict,
            ErrorCode::RateLimited => t::ErrorCode::RateLimited,
            ErrorCode::NotFound => t::ErrorCode::NotFound,
            ErrorCode::Unavailable => t::ErrorCode::Unavailable,
            ErrorCode::Internal => t::ErrorCode::Internal,
        }
    }

    /// The exported `relay` resource.
    struct RelayResource(RefCell<Core>);

    impl RelayResource {
        fn with<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
            f(&mut self.0.borrow_mut())
        }
    }

    struct Component;

    impl exported::Guest for Component {
        type Relay = RelayResource;
    }

    impl exported::GuestRelay for RelayResource {
        fn open(
            store: host::Store,
            config: String,
            relay_seed: Vec<u8>,
            operator_token: Option<String>,
        ) -> Result<exported::Relay, t::Error> {
            let config = Config::from_json(config.as_bytes()).map_err(t::Error::BadConfig)?;
            let seed: [u8; 32] = relay_seed
                .try_into()
                .map_err(|_| t::Error::BadConfig("relay seed must be 32 bytes".to_string()))?;
            let mut engine = Engine::new(config, HostStorage(store), HostEntropy);
            // Before anything reads the store: a store written by a newer relay is refused.
            engine.open_store().map_err(|e| match e {
                OpenError::Storage(m) => t::Error::Storage(m),
                refused => t::Error::RefusedStore(refused.to_string()),
            })?;
            // The engine's own crypto, through the host's native functions where it offers them.
            engine.set_crypto(Crypto::with_host(Some(host_verify), Some(host_sha256)));
            let relay = Relay::new(engine, &seed, operator_token.as_deref());
            host::log(host::Level::Info, "relay opened");
            Ok(exported::Relay::new(RelayResource(RefCell::new(relay))))
        }
        fn handle(&self, request: t::HttpRequest, ticket: u32, now: u64) -> t::Step {
            let req = request_of(request);
            step(self.with(|relay| relay.handle(&req, ticket, now)))
        }
        fn route_fetched(&self, account: String, f: t::Fetch, now: u64) -> Vec<t::Resumed> {
            resumed(self.with(|r| r.route_fetched(&account, fetch(f), now)))
        }
        fn shard_of(&self, request: t::HttpRequest, count: u32) -> u32 {
            transport::placement::shard_of(&request_of(request), count)
        }
        fn message(
            &self,
            token: String,
            origin: Option<String>,
            text: String,
            ticket: u32,
            now: u64,
        ) -> t::WsAnswer {
            ws_answer(
                self.with(|relay| relay.message(&token, origin.as_deref(), &text, ticket, now)),
            )
        }
        fn key_fetched(&self, relay: String, f: t::Fetch, now: u64) -> Vec<t::Resumed> {
            resumed(self.with(|r| r.key_fetched(&relay, fetch(f), now)))
        }
        fn sibling(&self, url: String, body: Vec<u8>, now: u64) -> t::HttpResponse {
            response(self.with(|relay| relay.sibling(&url, &body, now)))
        }
        fn fetched(&self, task: String, attempt: u32, f: t::Fetch, now: u64) -> Vec<t::Event> {
            events(self.with(|r| r.fetched(&task, attempt, fetch(f), now)))
        }
        fn tick(&self, now: u64) -> t::TickReport {
            let r = self.with(|relay| relay.tick(now));
            if let Some(e) = &r.error {
                host::log(host::Level::Error, &format!("tick: {e}"));
            }
            // Entries the tick had to set aside: each is logged (admin.quarantine lists them).
            for entry in &r.quarantined {
                host::log(
                    host::Level::Warn,
                    &format!("tick: an entry was quarantined: {entry}"),
                );
            }
            t::TickReport {
                events: events(r.events),
                quarantined: r.quarantined,
                error: r.error,
            }
        }
        fn send(&self, c: t::Caller, params: Vec<u8>, now: u64) -> Result<t::Delivery, t::Failure> {
            delivery(self.with(|r| r.send(&caller(c), &params, now)))
        }
        fn deliver(
            &self,
            c: t::Caller,
            params: Vec<u8>,
            now: u64,
        ) -> Result<t::Delivery, t::Failure> {
            delivery(self.with(|r| r.deliver(&caller(c), &params, now)))
        }
        fn status(
            &self,
            c: t::Caller,
            message_id: String,
            now: u64,
        ) -> Result<t::Delivery, t::Failure> {
            delivery(self.with(|r| r.status(&caller(c), &message_id, now)))
        }
        fn sync(
            &self,
            c: t::Caller,
            after: u64,
            limit: Option<u32>,
            now: u64,
        ) -> Result<t::TimelinePage, t::Failure> {
            let page = self.with(|r| r.sync(&caller(c), after, limit, now));
            page.map(|p| t::TimelinePage {
                entries: p.value.entries.into_iter().map(entry).collect(),
                next: p.value.next,
                has_more: p.value.has_more,
                events: events(p.events),
            })
            .map_err(failure)
        }
        fn call(
            &self,
            c: t::Caller,
            origin: Option<String>,
            method: String,
            params: Vec<u8>,
            now: u64,
        ) -> t::Reply {
            self.with(|r| call(r, c, origin.as_deref(), &method, params, now))
        }
        fn well_known(&self) -> Vec<u8> {
            self.with(|r| r.well_known())
        }
        fn metrics(&self, now: u64) -> Result<String, t::Error> {
            self.with(|r| {
                r.engine()
                    .metrics(now)
                    .map(|m| m.to_prometheus())
                    .map_err(|e| t::Error::Storage(format!("reading the metrics: {e}")))
            })
        }
    }

    bindings::export!(Component with_types_in bindings);
}
