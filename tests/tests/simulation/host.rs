//! The simulated host of each relay: engine operations over faulty storage, what a real host
//! does after them (effects, timers, retries of `internal`), ticks, and the event loop.

use super::*;

impl Sim {
    /// Runs one engine operation on relay `n` at its clock: its result, what the storage did
    /// meanwhile, and the clock it ran at.
    pub(crate) fn engine_op<R>(
        &mut self,
        n: usize,
        op: impl FnOnce(&mut SimEngine, u64) -> R,
    ) -> (R, OpLog, u64) {
        let clock = self.w.clock(n);
        self.disks[n].borrow_mut().begin();
        let r = op(&mut self.engines[n], clock);
        let log = self.disks[n].borrow_mut().end();
        (r, log, clock)
    }

    /// What relay `n`'s host does after an operation: it executes the effects, spends the
    /// storage time, and, if its storage reported a fault (the engine drops the effects of a
    /// failed operation, landed or not), arms its timer by next_wake.
    pub(crate) fn host_after(
        &mut self,
        n: usize,
        clock: u64,
        effects: Vec<Effect>,
        log: &OpLog,
        failed_tick: bool,
    ) {
        let mut shard_calls = Vec::new();
        for e in effects {
            match e {
                Effect::Send {
                    task,
                    attempt,
                    target,
                    method,
                    body,
                    shard,
                    route_revision,
                    riders,
                } => self.outbox.push((
                    InFlight {
                        source: n,
                        task,
                        attempt,
                        target,
                        method,
                        body,
                        shard,
                        route_revision,
                        riders,
                    },
                    clock,
                )),
                Effect::WakeAt(t) => self.w.nodes[n].wake = Some(t),
                Effect::Notify {
                    account,
                    latest_seq,
                } => self.w.nodes[n].notifications.push((account, latest_seq)),
                Effect::EndDeviceSessions { account, device_id } => {
                    self.w.nodes[n].ended.push((account, device_id))
                }
                Effect::Accepted(_) | Effect::DeliveryEnded { .. } => {}
                Effect::OperatorAction(a) => self.w.nodes[n].audit.push(a),
                Effect::ShardCall { shard, path, body } => shard_calls.push((shard, path, body)),
            }
        }
        // A shard shares a route with its account's shard: the host hands it over (across
        // whatever joins the shards) and drops the answer.
        for (shard, path, body) in shard_calls {
            self.shard_call(n, shard, path, body);
        }
        self.w.now += log.latency;
        if log.faulted() {
            self.stats.faulted_ops += 1;
            self.trace(|| format!("r{n} storage: {}", log.describe()));
            self.rearm(n, failed_tick);
        }
    }

    /// The host asks the engine when to tick next. A failed tick, or a next_wake that met
    /// `busy`, is retried shortly (the real hosts wait at least a millisecond); a tick the
    /// host armed by itself so is followed by next_wake (it may have nothing to do, and then
    /// no WakeAt comes).
    pub(crate) fn rearm(&mut self, n: usize, failed_tick: bool) {
        let (r, log, clock) = self.engine_op(n, |e, _| e.next_wake());
        self.w.now += log.latency;
        self.stats.rearms += 1;
        let before = self.w.nodes[n].wake;
        let soon = clock + self.rng.gen_range(1..=250);
        let wake = match r {
            Ok(w) if failed_tick => {
                self.probe[n] = true;
                w.map(|w| w.max(soon))
            }
            Ok(w) => w,
            Err(_) => {
                self.probe[n] = true;
                Some(before.map_or(soon, |b| b.min(soon)))
            }
        };
        if wake != before {
            self.stats.rearms_changed += 1;
        }
        self.trace(|| format!("r{n} re-arms: wake {before:?} -> {wake:?}"));
        self.w.nodes[n].wake = wake;
    }

    /// A call to relay `n` through its host: the answer, what the storage did, the clock.
    pub(crate) fn call_op(
        &mut self,
        n: usize,
        caller: &Caller,
        method: &str,
        params: &[u8],
    ) -> (Response, OpLog, u64) {
        self.check_placement(n, caller, method, params);
        let mut asked = 0;
        let (r, log, clock) = loop {
            let (mut r, log, clock) =
                self.engine_op(n, |e, now| e.call(caller, method, params, now));
            let effects = std::mem::take(&mut r.effects);
            let wanted = self.engines[n].wanted_route();
            self.host_after(n, clock, effects, &log, false);
            let Some(account) = wanted else {
                break (r, log, clock);
            };
            // A sharded host's FetchRoute step: the sibling's route.get, reported, and the
            // same call submitted again (which takes the answer, so asks no more).
            if asked > 0 || !matches!(&r.result, Err(e) if e.code == ErrorCode::Unavailable) {
                self.fail(format!(
                    "r{n} asked for the route of {account} again, or with {}: {method}",
                    String::from_utf8_lossy(&r.body())
                ));
            }
            asked += 1;
            let answer = self.fetch_sibling_route(n, &account);
            self.engines[n].sibling_route(&account, answer);
        };
        match &r.result {
            Err(e) if e.code == ErrorCode::Internal => {
                self.stats.internal_answers += 1;
                if !log.faulted() {
                    self.fail(format!(
                        "r{n} answered {method} with internal without a storage fault: {e:?}"
                    ));
                }
            }
            // A batch's items are operations of their own: one whose commit failed answers
            // `internal` in its place, and the others stand.
            Ok(v)
                if log.commit_failed()
                    && !(method == "message.deliver.batch" && has_internal_item(v)) =>
            {
                self.fail(format!(
                    "r{n} answered {method} with success although its commit failed"
                ))
            }
            Ok(_) if log.busy > 0 => self.stats.ok_despite_busy += 1,
            _ => {}
        }
        (r, log, clock)
    }

    /// What sibling shard of node `n` answers to `route.get` of `account`, as a sharded host
    /// fetches it for a call that waits for it: through the sibling's host (its storage
    /// faults), and across whatever joins the shards (lost requests, outages).
    pub(crate) fn fetch_sibling_route(&mut self, n: usize, account: &str) -> SiblingRoute {
        self.stats.sibling_route_fetches += 1;
        let id = self.w.nodes[n].id.clone();
        let shard = self.w.nodes[n].config.shard;
        let k = Shard::of_account(account, shard.count);
        let Some(sib) = self.w.shard_node(&id, k).filter(|_| k != shard.index) else {
            self.fail(format!(
                "r{n} (shard {}/{}) asked for the route of {account}, which is its own or no \
                 shard's (shard {k})",
                shard.index, shard.count
            ));
        };
        let answer = if self.outage(sib).is_some() || self.permille(self.faults.lost_request) {
            SiblingRoute::Failed
        } else {
            let mut p = Object::new();
            p.insert("account", account);
            let bytes = canonical::object_to_vec(&p);
            let (r, _, _) = self.call_op(sib, &Caller::Anonymous, "route.get", &bytes);
            match r.result {
                Ok(v) => match field(&v, "route") {
                    Some(Value::Object(o)) => SiblingRoute::Route(o.clone()),
                    _ => self.fail(format!("r{sib} answered route.get without a route")),
                },
                Err(e) if e.code == ErrorCode::NotFound => SiblingRoute::Absent,
                Err(e) if e.code == ErrorCode::Internal => SiblingRoute::Failed,
                Err(e) => self.fail(format!("r{sib} answered route.get of {account}: {e:?}")),
            }
        };
        match answer {
            SiblingRoute::Failed => self.stats.sibling_route_failures += 1,
            SiblingRoute::Absent => self.stats.sibling_route_absent += 1,
            SiblingRoute::Route(_) => {}
        }
        self.trace(|| {
            let what = match &answer {
                SiblingRoute::Route(r) => format!(
                    "a route to {} (revision {})",
                    r.get("relay").and_then(Value::as_str).unwrap_or("?"),
                    r.get("revision")
                        .and_then(Value::as_protocol_int)
                        .unwrap_or(0)
                ),
                other => format!("{other:?}"),
            };
            format!("r{n} fetches the route of {account} from r{sib}: {what}")
        });
        answer
    }

    /// A call to node `n` of a sharded relay is one its router would hand to `n`: a
    /// session's token names `n`'s shard, other calls name an account `n` serves.
    pub(crate) fn check_placement(&self, n: usize, caller: &Caller, method: &str, params: &[u8]) {
        let shard = self.w.nodes[n].config.shard;
        // The operator names the shard it asks (`?shard=N`): no router places its calls.
        if shard.count <= 1 || *caller == Caller::Operator {
            return;
        }
        let (path, headers) = match caller {
            Caller::Relay { .. } => (format!("/relay/v1/{method}"), Vec::new()),
            Caller::Session(t) => (
                format!("/v1/{method}"),
                vec![("authorization".to_string(), format!("Bearer {t}"))],
            ),
            _ => (format!("/v1/{method}"), Vec::new()),
        };
        let req = Request {
            listener: Listener::Public,
            method: "POST".into(),
            path,
            query: String::new(),
            headers,
            body: params.to_vec(),
            origin: None,
        };
        let k = placement::shard_of(&req, shard.count);
        if k != shard.index {
            self.fail(format!(
                "{method} went to r{n} (shard {}/{}), but the router places it on shard {k}",
                shard.index, shard.count
            ));
        }
    }

    pub(crate) fn call(
        &mut self,
        n: usize,
        caller: &Caller,
        method: &str,
        params: &Object,
    ) -> Response {
        self.call_op(n, caller, method, &canonical::object_to_vec(params))
            .0
    }

    /// A client's call: answered `internal` (or not at all), the client retries its identical
    /// request after a moment.
    pub(crate) fn client_call(
        &mut self,
        n: usize,
        caller: &Caller,
        method: &str,
        params: &Object,
    ) -> Response {
        let bytes = canonical::object_to_vec(params);
        for _ in 0..100 {
            let r = self.call_op(n, caller, method, &bytes).0;
            if !is_internal(&r.result) {
                return r;
            }
            self.stats.client_retries += 1;
            self.w.now += self.rng.gen_range(10..500);
        }
        self.fail(format!("{method} at r{n} answered internal 100 times"))
    }

    /// Opens a session for device `dev` of `acct` at `relay` (a new session.open each try).
    pub(crate) fn open_session(&mut self, acct: usize, relay: usize, dev: usize) -> String {
        match self.try_open_session(acct, relay, dev) {
            Ok(token) => token,
            Err(e) => self.fail(format!("session.open of a{acct} at r{relay}: {e:?}")),
        }
    }

    /// session.open for device `dev` of `acct` at `relay`, retried while answered `internal`:
    /// the token, or the error it was refused with.
    pub(crate) fn try_open_session(
        &mut self,
        acct: usize,
        relay: usize,
        dev: usize,
    ) -> Result<String, Error> {
        for _ in 0..100 {
            let nonce = random_id(&mut self.w.rng);
            let a = &self.accts[acct];
            let so = draft::session_open(
                NET,
                &self.relay_str(relay),
                &a.key.id(),
                &a.devices[dev].id(),
                self.w.clock(relay),
                &nonce,
            )
            .sign(&a.devices[dev]);
            let r = self.call(relay, &Caller::Anonymous, "session.open", &so);
            match r.result {
                Ok(v) => {
                    let token = field(&v, "session")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    self.check_token(relay, &token);
                    return Ok(token);
                }
                Err(e) if e.code == ErrorCode::Internal => {
                    self.stats.client_retries += 1;
                    self.w.now += self.rng.gen_range(10..500);
                }
                Err(e) => return Err(e),
            }
        }
        self.fail(format!(
            "session.open at r{relay} answered internal 100 times"
        ))
    }

    /// The host's timer fires for relay `n`.
    pub(crate) fn tick(&mut self, n: usize) {
        self.w.nodes[n].wake = None;
        let probe = std::mem::take(&mut self.probe[n]);
        let (mut r, log, clock) = self.engine_op(n, |e, now| e.try_tick(now));
        let effects = std::mem::take(&mut r.effects);
        let failed = r.result.is_err();
        self.host_after(n, clock, effects, &log, failed);
        if probe && !log.faulted() {
            self.rearm(n, false);
        }
        self.trace(|| {
            format!(
                "tick r{n} at {clock}{}; wake {:?}",
                if failed { " failed" } else { "" },
                self.w.nodes[n].wake
            )
        });
        match &r.result {
            Err(e) => {
                self.stats.failed_ticks += 1;
                if !log.faulted() {
                    self.fail(format!(
                        "a tick of r{n} failed without a storage fault: {e:?}"
                    ));
                }
            }
            Ok(v) if field(v, "quarantined").is_some() => self.fail(format!(
                "a tick of r{n} quarantined entries (storage: {}): {}",
                log.describe(),
                canonical::to_string(v)
            )),
            Ok(_) if log.commit_failed() => self.fail(format!(
                "a tick of r{n} succeeded although its commit failed"
            )),
            Ok(_) if log.busy > 0 => self.stats.ok_despite_busy += 1,
            Ok(_) => {}
        }
        if !failed || log.landed() {
            if clock == self.last_tick[n] {
                self.same_clock_ticks[n] += 1;
                if self.same_clock_ticks[n] > 10_000 {
                    self.fail(format!("relay {n} asks for ticks at {clock} forever"));
                }
            } else {
                self.same_clock_ticks[n] = 0;
            }
            self.last_tick[n] = clock;
            self.swept[n] = true;
        }
    }

    /// Reports an outcome to relay `n`; whether its engine applied it (a report whose
    /// commit failed is lost, and the attempt times out as unknown).
    pub(crate) fn outcome(&mut self, n: usize, task: &str, attempt: u32, outcome: Outcome) -> bool {
        let (effects, log, clock) =
            self.engine_op(n, |e, now| e.outcome(task, attempt, outcome, now));
        self.host_after(n, clock, effects, &log, false);
        if !log.applied() {
            self.stats.lost_outcomes += 1;
        } else if log.busy > 0 {
            self.stats.ok_despite_busy += 1;
        }
        log.applied()
    }

    // ---- The event loop ----

    pub(crate) fn run(&mut self) {
        let mut iterations = 0u64;
        loop {
            iterations += 1;
            if iterations > 3_000_000 {
                self.fail("the event loop does not settle (livelock)".into());
            }
            let queued = self.queue.first_key_value().map(|(k, _)| k.0);
            let wake = (0..self.w.nodes.len())
                .filter_map(|n| self.w.nodes[n].wake.map(|t| (self.world_time(n, t), n)))
                .min();
            if self.essential == 0 {
                break;
            }
            match (queued, wake) {
                (_, Some((t, n))) if queued.is_none_or(|q| t <= q) => {
                    self.w.now = self.w.now.max(t);
                    self.tick(n);
                }
                (Some(_), _) => {
                    let ((t, _), ev) = self.queue.pop_first().expect("queued event");
                    if ev.essential() {
                        self.essential -= 1;
                    }
                    self.w.now = self.w.now.max(t);
                    self.stats.events += 1;
                    self.handle(ev);
                }
                (None, None) => break,
                (None, Some(_)) => unreachable!(),
            }
            self.after_event();
        }
    }

    /// Takes the requests the engines emitted and the notifications they pushed.
    pub(crate) fn after_event(&mut self) {
        loop {
            let mut out = std::mem::take(&mut self.outbox);
            // (World's own engines emit nothing once the world is set up.)
            for req in std::mem::take(&mut self.w.outbox) {
                let clock = self.w.clock(req.source);
                out.push((req, clock));
            }
            if out.is_empty() {
                break;
            }
            for (req, clock) in out {
                self.dispatch(req, clock);
            }
        }
        for n in 0..self.w.nodes.len() {
            while self.notified[n] < self.w.nodes[n].notifications.len() {
                let (account, latest_seq) = self.w.nodes[n].notifications[self.notified[n]].clone();
                self.notified[n] += 1;
                let Some(&a) = self.acct_by_id.get(&account) else {
                    self.fail(format!("relay {n} notified an unknown account {account}"));
                };
                let last = self.notified_seq.insert((n, a), latest_seq).unwrap_or(0);
                if latest_seq <= last {
                    self.fail(format!(
                        "r{n} notified a{a} of latest_seq {latest_seq} after {last} (a duplicate?)"
                    ));
                }
                if self.sync_pending.insert((a, n)) {
                    let at = self.w.now + self.rng.gen_range(10..3_000);
                    self.schedule(
                        at,
                        Ev::Sync {
                            acct: a,
                            relay: n,
                            periodic: false,
                        },
                    );
                }
            }
        }
    }

    pub(crate) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive { req, dup, twinned } => self.arrive(req, dup, twinned),
            Ev::Report {
                req,
                epoch,
                fragile,
                outcome,
            } => {
                if fragile && epoch != self.epoch[req.source] {
                    self.stats.dropped_by_restart += 1;
                    self.trace(|| {
                        format!(
                            "report for {} #{} lost with the restart",
                            req.task, req.attempt
                        )
                    });
                } else {
                    self.feed(&req, outcome);
                }
            }
            Ev::ClientSend => self.client_send(),
            Ev::Resend(k) => {
                self.stats.resends += 1;
                self.msgs[k].resends += 1;
                self.submit(k);
            }
            Ev::SendRetry(k) => {
                self.stats.client_retries += 1;
                self.msgs[k].retrying = false;
                self.submit(k);
            }
            Ev::Poll(k) => {
                self.poll(k);
                self.schedule_poll(k);
            }
            Ev::FormerPoll(k) => {
                self.poll(k);
            }
            Ev::FormerResend(k) => {
                self.stats.resends += 1;
                self.msgs[k].resends += 1;
                self.submit(k);
            }
            Ev::TerminalCheck(k) => {
                let answered = self.poll(k);
                let m = &self.msgs[k];
                let (_, deadline) = m.accepted.expect("accepted");
                let n = m.source;
                // Invariant 6 holds once the source has run a tick at or after the deadline
                // with nothing due left: failed ticks (storage faults) may postpone that, and
                // the poll itself may have been answered `internal`.
                let caught_up = self.last_tick[n] >= deadline
                    && self.w.nodes[n].wake.is_none_or(|w| w > self.w.clock(n));
                if m.terminal.is_none() && !(answered && caught_up) {
                    if m.terminal_waits >= 120 {
                        if self.verbose {
                            self.dump(n, &m.task);
                        }
                        self.fail(format!(
                            "message {} is still delivering 2 minutes after its deadline {deadline}: \
                             r{n} did not manage to tick past it (last tick {}) or to answer",
                            m.task, self.last_tick[n]
                        ));
                    }
                    self.msgs[k].terminal_waits += 1;
                    self.stats.terminal_check_waits += 1;
                    let at = self.w.now + SEC;
                    self.schedule(at, Ev::TerminalCheck(k));
                    return;
                }
                self.msgs[k].terminal_checked = true;
                if self.msgs[k].terminal.is_none() {
                    let m = &self.msgs[k];
                    if self.verbose {
                        self.dump(m.source, &m.task);
                    }
                    self.fail(format!(
                        "message {} is still delivering after its deadline {} (source r{} clock {})",
                        m.task,
                        m.accepted.map_or(0, |a| a.1),
                        m.source,
                        self.w.clock(m.source)
                    ));
                }
            }
            Ev::Sync {
                acct,
                relay,
                periodic,
            } => {
                if !periodic {
                    self.sync_pending.remove(&(acct, relay));
                }
                if !self.sync(acct, relay) {
                    // A former home forgot the account (everything it promised expired).
                    if periodic {
                        self.sync_chains.remove(&(acct, relay));
                        self.stats.former_forgotten += 1;
                    }
                    return;
                }
                if periodic {
                    let at = self.w.now + self.rng.gen_range(45 * SEC..120 * SEC);
                    self.schedule(
                        at,
                        Ev::Sync {
                            acct,
                            relay,
                            periodic,
                        },
                    );
                }
            }
            Ev::Restart(relay) => {
                let nodes = self.nodes_of[relay].clone();
                if nodes.len() == 1 {
                    return self.restart(nodes[0]);
                }
                // A sharded relay: the whole host, one shard (a Durable Object evicted, a
                // thread replaced), or each shard in turn (a rolling upgrade).
                match self.rng.gen_range(0..3) {
                    0 => {
                        for n in nodes {
                            self.restart(n);
                        }
                    }
                    1 => {
                        let n = nodes[self.rng.gen_range(0..nodes.len())];
                        self.stats.shard_restarts += 1;
                        self.restart(n);
                    }
                    _ => {
                        let mut at = self.w.now;
                        for n in nodes {
                            self.schedule(at, Ev::RestartShard(n));
                            at += self.rng.gen_range(0..20 * SEC);
                        }
                    }
                }
            }
            Ev::RestartShard(n) => {
                self.stats.shard_restarts += 1;
                self.restart(n);
            }
            Ev::ShardCall {
                from,
                node,
                path,
                body,
            } => self.arrive_shard_call(from, node, path, &body),
            Ev::Migrate { acct, to, more } => self.migrate(acct, to, more),
            Ev::Publish { acct, relay } => {
                self.trace(|| format!("publish route of a{acct} at relay {relay}"));
                self.publish(acct, relay);
                // A relay the account was registered at holds a route naming another one
                // from now on at the latest: it is a former home (invariant 10).
                let n = self.serving(relay, acct);
                if self.accts[acct].home != n && self.regs[acct].contains(&n) {
                    let clock = self.w.clock(n);
                    let spans = self.former_spans.entry((acct, n)).or_default();
                    if spans.last().is_none_or(|s| s.1 != u64::MAX) {
                        spans.push((clock, u64::MAX));
                    }
                }
            }
            Ev::Revoke => self.revoke(),
            Ev::OperatorRetry => self.operator_retry(),
            Ev::OperatorPause => self.operator_pause(),
            Ev::OperatorResume { node, destination } => {
                self.operator_hold(node, &destination, "admin.destination.resume")
            }
        }
    }

    /// Adds node `n`'s engine's home span counts to the run's (before a restart replaces
    /// the engine, and at the end).
    pub(crate) fn harvest_span_counts(&mut self, n: usize) {
        let spans = &self.engines[n].counters().home_spans;
        let count = |event: &str| spans.get(event).copied().unwrap_or(0);
        self.stats.stale_deliveries_refused += count("stale_delivery");
        self.stats.revision_retries += count("revision_retry");
        self.stats.old_sessions_refused += count("old_session");
    }

    /// Node `n`'s engine restarts over its storage.
    pub(crate) fn restart(&mut self, n: usize) {
        self.harvest_span_counts(n);
        let seed = self.rng.gen();
        // As every host does: attempts in flight before now were carried by the old process.
        self.w.nodes[n].config.started_at = Some(self.w.clock(n));
        self.started[n] = self.w.clock(n);
        self.swept[n] = false;
        self.w.nodes[n].restart(seed);
        let disk = self.disks[n].clone();
        self.engines[n] = self.engine_over(n, &disk);
        // A host starts by asking when to tick.
        self.w.nodes[n].wake = None;
        self.rearm(n, false);
        self.epoch[n] += 1;
        self.stats.restarts += 1;
        self.trace(|| format!("restart r{n}; wake {:?}", self.w.nodes[n].wake));
    }

    // ---- The network ----

    pub(crate) fn latency(&mut self) -> u64 {
        if self.permille(self.faults.slow) {
            self.stats.delayed += 1;
            return self.rng.gen_range(20 * SEC..90 * SEC);
        }
        if self.rng.gen_bool(0.1) {
            self.rng.gen_range(300..5_000)
        } else {
            self.rng.gen_range(1..300)
        }
    }

    pub(crate) fn report(&mut self, at: u64, req: InFlight, outcome: Outcome) {
        let epoch = self.epoch[req.source];
        let fragile = self.rng.gen_bool(0.5);
        self.schedule(
            at,
            Ev::Report {
                req,
                epoch,
                fragile,
                outcome,
            },
        );
    }

    /// A request emitted at source clock `clock` leaves its source: decide its fate.
    pub(crate) fn dispatch(&mut self, req: InFlight, clock: u64) {
        for item in checks::items_of(&req) {
            self.on_emit(&item, clock);
        }
        match req.method {
            PeerMethod::Deliver => self.stats.deliver_requests += 1,
            PeerMethod::DeliverBatch => {
                self.stats.batches += 1;
                self.stats.batch_items += 1 + req.riders.len() as u64;
            }
            PeerMethod::RouteGet => self.stats.route_gets += 1,
        }
        if req.shard.is_some() {
            self.stats.sibling_requests += 1;
            if req.method == PeerMethod::RouteGet {
                self.stats.sibling_route_gets += 1;
            }
        }
        let now = self.w.now;
        let f = &self.faults;
        let (na, lost, s429, s503, dup) = (
            f.not_attempted,
            f.lost_request,
            f.synthetic_429,
            f.synthetic_503,
            f.duplicate,
        );
        self.trace(|| {
            format!(
                "r{} emits {} #{} {} -> {}{}",
                req.source,
                req.method.as_str(),
                req.attempt,
                req.task,
                req.target.as_str(),
                req.shard.map_or(String::new(), |k| format!(" shard {k}"))
            )
        });
        // A sibling shard the request names, or the shard of its target the router picks.
        let target = self.w.target_node(&req);
        let down = target.and_then(|t| self.outage(t));
        if target.is_none() || down == Some(true) || self.permille(na) {
            self.refused(req);
        } else if down == Some(false) || self.permille(lost) {
            self.lost(req);
        } else if self.permille(if req.method == PeerMethod::RouteGet {
            s429.max(250)
        } else {
            s429
        }) {
            self.stats.synthetic_429 += 1;
            let wait = self.rng.gen_range(SEC..20 * SEC);
            let body = format!(
                r#"{{"error":{{"code":"rate_limited","message":"x","data":{{"retry_after":{wait}}}}}}}"#
            );
            let at = now + self.latency();
            self.report(at, req, Outcome::Error(body.into_bytes()));
        } else if self.permille(s503) {
            self.stats.synthetic_503 += 1;
            let body = br#"{"error":{"code":"unavailable","message":"x"}}"#.to_vec();
            let at = now + self.latency();
            self.report(at, req, Outcome::Error(body));
        } else {
            let twinned = self.permille(dup);
            if twinned {
                self.stats.duplicates += 1;
                let at = now + self.latency();
                self.schedule(
                    at,
                    Ev::Arrive {
                        req: req.clone(),
                        dup: true,
                        twinned,
                    },
                );
            }
            let mut at = now + self.latency();
            // Rule 6: a delivery held in the network past a move away and a move back (the
            // world of seed 1637), within the clock tolerance of its signature.
            if self.span_faults
                && matches!(req.method, PeerMethod::Deliver | PeerMethod::DeliverBatch)
                && req.shard.is_none()
                && self.spans_rng.gen_bool(0.03)
            {
                self.stats.held_past_moves += 1;
                at = now + self.spans_rng.gen_range(90 * SEC..280 * SEC);
                self.trace(|| format!("{} #{} held until t+{}", req.task, req.attempt, at - T0));
            }
            self.schedule(
                at,
                Ev::Arrive {
                    req,
                    dup: false,
                    twinned,
                },
            );
        }
    }
}

/// Whether a `message.deliver.batch` answer has an item answered `internal`.
fn has_internal_item(v: &Value) -> bool {
    matches!(field(v, "results"), Some(Value::Array(items)) if items.iter().any(|i| {
        field(i, "error").and_then(|e| field(e, "code")).and_then(Value::as_str) == Some("internal")
    }))
}
