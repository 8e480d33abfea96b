//! The clients: sends and their identical retries, status polls and syncs, at the home and
//! at former homes.

use super::*;

impl Sim {
    pub(crate) fn client_send(&mut self) {
        let n = self.accts.len();
        let from = self.rng.gen_range(0..n);
        let mut to = if self.rng.gen_bool(0.08) {
            from
        } else {
            (from + self.rng.gen_range(1..n)) % n
        };
        // In a sharded world, often a neighbour: an account on another shard of the sender's
        // relay (as it is now).
        let home = self.accts[from].home;
        if self.nodes_of[self.relay_of[home]].len() > 1 && self.rng.gen_bool(0.4) {
            let neighbours: Vec<usize> = (0..n)
                .filter(|&a| {
                    let h = self.accts[a].home;
                    h != home && self.relay_of[h] == self.relay_of[home]
                })
                .collect();
            if !neighbours.is_empty() {
                to = neighbours[self.rng.gen_range(0..neighbours.len())];
            }
        }
        // Sometimes a burst to one recipient, against the rate limits.
        let count = if self.rng.gen_bool(0.15) {
            self.rng.gen_range(3..=6)
        } else {
            1
        };
        for _ in 0..count {
            self.send_message(from, to);
        }
    }

    /// Builds a message from `from` to `to` and submits it at the sender's home.
    pub(crate) fn send_message(&mut self, from: usize, to: usize) {
        let source = self.accts[from].home;
        let dev = self.rng.gen_range(0..self.accts[from].devices.len());
        let mut m = Msg::default();
        if from != to {
            m.sender_boxes = self.rng.gen_bool(0.5);
            let want_grant = if self.discoverable[to] {
                self.rng.gen_bool(0.2)
            } else {
                self.rng.gen_bool(0.92)
            };
            if want_grant {
                m.authorization = Some(self.grant(to, from));
            } else if self.rng.gen_bool(0.05) {
                // Bound to other accounts: the source rejects it.
                m.authorization = Some(self.grant(from, to));
            }
            if self.rng.gen_bool(0.3) {
                m.recipient_route = Some(self.routes[to].clone());
            }
            let devices = self.accts[to].devices.len();
            if devices > 1 && self.rng.gen_bool(0.3) {
                m.to_devices = Some(vec![self.rng.gen_range(0..devices)]);
            }
        }
        m.created_offset = if self.rng.gen_bool(0.15) {
            -(self.rng.gen_range(0..=self.age_limit[source] + 30 * SEC) as i64)
        } else {
            -(self.rng.gen_range(0..2 * SEC) as i64)
        };
        let boxed = m
            .to_devices
            .clone()
            .unwrap_or_else(|| (0..self.accts[to].devices.len()).collect());
        let k = self.msgs.len();
        let text = format!("m{k}");
        let params = self
            .w
            .message(&self.accts[from], dev, &self.accts[to], &text, &m);
        let id = message_id(&params);
        let created_at = params
            .get("envelope")
            .and_then(|e| field(e, "created_at"))
            .and_then(Value::as_protocol_int)
            .expect("created_at");
        let task = format!("{}.{id}", self.accts[from].id());
        self.msg_by_id.insert(id.clone(), k);
        // Known before any answer: a commit may accept it although its answer is lost.
        self.task_msg.insert(task.clone(), k);
        self.msgs.push(MsgRec {
            from,
            to,
            dev,
            source,
            id,
            task,
            created_at,
            params,
            sender_boxes: m.sender_boxes,
            boxed,
            accepted: None,
            terminal: None,
            resends: 0,
            polls_after_terminal: 0,
            terminal_checked: false,
            landed_at: None,
            unanswered: 0,
            retrying: false,
            early_emits: Vec::new(),
            terminal_waits: 0,
        });
        self.stats.sends += 1;
        self.submit(k);
    }

    /// Rule 6 (odd seeds): sometimes the client first tries message `k` through a session
    /// its device opened at the source in an earlier home span (before a move away and
    /// back). A new message is refused `not_home_relay` with the route naming the source
    /// itself; a recognized one is answered; the session may have expired, or a storage
    /// fault may answer `internal`. Nothing else.
    fn try_old_session(&mut self, k: usize) {
        let (from, source, dev) = (self.msgs[k].from, self.msgs[k].source, self.msgs[k].dev);
        if !self.span_faults {
            return;
        }
        let Some(spans) = self.old_sessions.get(&(from, source)) else {
            return;
        };
        let span = self.spans_rng.gen_range(0..spans.len());
        let Some(token) = spans[span].get(dev).cloned() else {
            return;
        };
        if !self.spans_rng.gen_bool(0.3) {
            return;
        }
        self.stats.old_session_probes += 1;
        let params = canonical::object_to_vec(&self.msgs[k].params);
        let (r, _, _) = self.call_op(source, &Caller::Session(token), "message.send", &params);
        self.trace(|| {
            format!(
                "a{from} message.send {} at r{source} through a session of an earlier span: {}",
                self.msgs[k].id,
                String::from_utf8_lossy(&r.body())
            )
        });
        let here = self.relay_str(source);
        match &r.result {
            Ok(_) if self.msgs[k].accepted.is_some() || self.msgs[k].landed_at.is_some() => {}
            Err(e)
                if e.code == ErrorCode::NotHomeRelay
                    && e.data
                        .as_ref()
                        .and_then(|d| field(d, "route"))
                        .and_then(|r| field(r, "relay"))
                        .and_then(Value::as_str)
                        == Some(here.as_str()) => {}
            Err(e) if matches!(e.code, ErrorCode::Unauthenticated | ErrorCode::Internal) => {}
            other => self.fail(format!(
                "rule 6: message.send of {} at r{source} through a session of an earlier home \
                 span answered {other:?}",
                self.msgs[k].task
            )),
        }
    }

    pub(crate) fn session(&self, acct: usize, relay: usize, dev: usize) -> Caller {
        Caller::Session(self.sessions[&(acct, relay)][dev].clone())
    }

    /// message.send (first submission or an identical retry) at the message's source, also
    /// once the sender moved away from it (rule 3: a retry goes unchanged to the relay that
    /// accepted it), then through a session opened there before the move or since.
    pub(crate) fn submit(&mut self, k: usize) {
        let (from, source, dev) = (self.msgs[k].from, self.msgs[k].source, self.msgs[k].dev);
        let former = self.former(k);
        let caller = if former && self.rng.gen_bool(0.5) {
            self.stats.former_session_opens += 1;
            match self.try_open_session(from, source, dev) {
                Ok(token) => Caller::Session(token),
                Err(e) => {
                    self.trace(|| {
                        format!(
                            "a{from} session.open at its former home r{source} for a retry of \
                             {}: {e:?}",
                            self.msgs[k].task
                        )
                    });
                    return self.refused_at_former_home(k, "session.open", &e);
                }
            }
        } else {
            if !former {
                self.try_old_session(k);
            }
            self.session(from, source, dev)
        };
        let params = canonical::object_to_vec(&self.msgs[k].params);
        let (r, log, clock) = self.call_op(source, &caller, "message.send", &params);
        if log.landed() && self.msgs[k].accepted.is_none() {
            // Accepted, although the client will not hear it from this answer.
            if let Some(at) = self.msgs[k].landed_at {
                self.fail(format!(
                    "a second commit of message.send landed for {} (first at {at})",
                    self.msgs[k].task
                ));
            }
            self.msgs[k].landed_at = Some(clock);
        }
        self.trace(|| {
            format!(
                "a{from} message.send {} at r{source} (a{} -> a{}): {}",
                self.msgs[k].id,
                from,
                self.msgs[k].to,
                String::from_utf8_lossy(&r.body())
            )
        });
        match r.result {
            Ok(v) => {
                if former {
                    self.stats.former_resends += 1;
                    let got = Observed::of(&v).accepted_at;
                    if let Some((accepted_at, _)) = self.msgs[k].accepted {
                        if got != Some(accepted_at) {
                            self.fail(format!(
                                "invariant 9: an identical message.send retry of {} at its \
                                 former home r{source} answered accepted_at {got:?}, stored \
                                 {accepted_at}",
                                self.msgs[k].task
                            ));
                        }
                    }
                }
                self.observe(k, &v, "message.send", clock);
                if self.msgs[k].resends > 0 || self.msgs[k].unanswered > 0 {
                    // An identical retry answers what message.delivery.status says now.
                    let retry = Observed::of(&v);
                    if let Some(now) = self.status_now(k, &caller) {
                        if now != retry {
                            self.fail(format!(
                                "identical message.send of {} answered {retry:?}, status says {now:?}",
                                self.msgs[k].task
                            ));
                        }
                    }
                }
            }
            Err(e) if e.code == ErrorCode::Internal => {
                // The host answered internal (or dropped the connection): the outcome is
                // unknown to the client, which retries the identical request a little later.
                self.msgs[k].unanswered += 1;
                if self.msgs[k].unanswered > 200 {
                    self.fail(format!(
                        "message.send of {} answered internal 200 times",
                        self.msgs[k].task
                    ));
                }
                if !self.msgs[k].retrying {
                    self.msgs[k].retrying = true;
                    let at = self.w.now + self.rng.gen_range(50..5 * SEC);
                    self.schedule(at, Ev::SendRetry(k));
                }
                return;
            }
            Err(e) => {
                if self.msgs[k].resends == 0 && self.msgs[k].accepted.is_none() {
                    // The first answer of the first submission (after any `internal` ones).
                    self.stats.rejected += 1;
                    if e.code == ErrorCode::NotFound && self.route_held_by_sibling(k) {
                        self.stats.not_found_held_by_sibling += 1;
                        self.trace(|| {
                            format!(
                                "{}: not_found at r{source}, but a sibling shard holds a route",
                                self.msgs[k].task
                            )
                        });
                    }
                }
                if let Some((accepted_at, _)) = self.msgs[k].accepted {
                    if clock < accepted_at + self.retention[source] {
                        self.fail(format!(
                            "{}an identical message.send retry of accepted {} was rejected during \
                             retention{}: {e:?}",
                            if former { "invariant 9: " } else { "" },
                            self.msgs[k].task,
                            if former {
                                format!(" at its former home r{source}")
                            } else {
                                String::new()
                            }
                        ));
                    }
                } else if matches!(e.code, ErrorCode::RateLimited | ErrorCode::Unavailable)
                    && self.msgs[k].resends < 4
                {
                    // (`unavailable`: a sibling shard's route could not be fetched.)
                    let wait = e
                        .data
                        .as_ref()
                        .and_then(|d| field(d, "retry_after"))
                        .and_then(Value::as_protocol_int)
                        .unwrap_or(SEC);
                    let at = self.w.now + wait + self.rng.gen_range(0..2 * SEC);
                    self.schedule(at, Ev::Resend(k));
                    return;
                }
            }
        }
        // A client that lost the answer retries the identical request.
        if self.msgs[k].resends < 3 && self.rng.gen_bool(0.08) {
            let at = self.w.now + self.rng.gen_range(10..60 * SEC);
            self.schedule(at, Ev::Resend(k));
        }
    }

    pub(crate) fn schedule_poll(&mut self, k: usize) {
        let m = &self.msgs[k];
        let Some((accepted_at, _)) = m.accepted else {
            return;
        };
        if self.w.clock(m.source) >= accepted_at + self.retention[m.source] {
            return;
        }
        let delay = if m.terminal.is_some() {
            if m.polls_after_terminal >= 2 {
                return;
            }
            self.msgs[k].polls_after_terminal += 1;
            self.rng.gen_range(10 * SEC..120 * SEC)
        } else {
            self.rng.gen_range(15 * SEC..90 * SEC)
        };
        let at = self.w.now + delay;
        self.schedule(at, Ev::Poll(k));
    }

    /// Whether another shard of message `k`'s source relay holds a route for its recipient
    /// (read from the stores as they are): a relay of one shard, holding what all its shards
    /// hold, would have found one where the source shard answered `not_found`.
    pub(crate) fn route_held_by_sibling(&self, k: usize) -> bool {
        let source = self.msgs[k].source;
        let key = format!("route/{}", self.accts[self.msgs[k].to].id()).into_bytes();
        self.nodes_of[self.relay_of[source]].iter().any(|&n| {
            n != source
                && self.w.nodes[n]
                    .store
                    .clone()
                    .get(&key)
                    .ok()
                    .flatten()
                    .is_some()
        })
    }

    /// message.delivery.status at the message's source (through `caller`, the session of
    /// the retry just made), without recording it.
    pub(crate) fn status_now(&mut self, k: usize, caller: &Caller) -> Option<Observed> {
        let source = self.msgs[k].source;
        let mut p = Object::new();
        p.insert("message_id", self.msgs[k].id.as_str());
        let r = self.call(source, caller, "message.delivery.status", &p);
        r.result.ok().map(|v| Observed::of(&v))
    }

    /// Whether the sender of message `k` has moved away from the relay it submitted `k` to
    /// (as the client knows: the relay may not have learned it yet).
    pub(crate) fn former(&self, k: usize) -> bool {
        self.accts[self.msgs[k].from].home != self.msgs[k].source
    }

    /// When the result of message `k` at its source expires (source clock), if a commit
    /// accepted it (known to the client, or landed unanswered).
    pub(crate) fn retained_until(&self, k: usize) -> Option<u64> {
        let m = &self.msgs[k];
        let accepted_at = m.accepted.map(|a| a.0).or(m.landed_at)?;
        Some(accepted_at + self.retention[m.source])
    }

    /// A former home refused a call about message `k` (`what`): a violation while the
    /// result of `k` is retained there (invariants 7 and 9); past that, the end of what it
    /// promised.
    pub(crate) fn refused_at_former_home(&mut self, k: usize, what: &str, e: &Error) {
        let source = self.msgs[k].source;
        let clock = self.w.clock(source);
        if let Some(until) = self.retained_until(k) {
            if clock < until {
                self.fail(format!(
                    "invariant 7 (no result stranded): {what} of a{} at its former home \
                     r{source}, which accepted {} and retains its result until {until} (clock \
                     {clock}): {e:?}",
                    self.msgs[k].from, self.msgs[k].task
                ));
            }
        }
    }

    /// message.delivery.status at the message's source; whether it was answered (not
    /// `internal`). Once the sender moved away from the source, through a session opened
    /// there after the move (invariant 7).
    pub(crate) fn poll(&mut self, k: usize) -> bool {
        self.stats.status_polls += 1;
        let (from, source) = (self.msgs[k].from, self.msgs[k].source);
        let former = self.former(k);
        let caller = if former {
            self.stats.former_status_polls += 1;
            self.stats.former_session_opens += 1;
            match self.try_open_session(from, source, 0) {
                Ok(token) => Caller::Session(token),
                Err(e) => {
                    self.trace(|| {
                        format!(
                            "a{from} session.open at its former home r{source} to poll {}: {e:?}",
                            self.msgs[k].task
                        )
                    });
                    self.refused_at_former_home(k, "session.open", &e);
                    return true;
                }
            }
        } else {
            self.session(from, source, 0)
        };
        let mut p = Object::new();
        p.insert("message_id", self.msgs[k].id.as_str());
        let bytes = canonical::object_to_vec(&p);
        let (r, _, clock) = self.call_op(source, &caller, "message.delivery.status", &bytes);
        if former {
            self.trace(|| {
                format!(
                    "a{from} polls {} at its former home r{source}: {}",
                    self.msgs[k].task,
                    String::from_utf8_lossy(&r.body())
                )
            });
        }
        match r.result {
            Ok(v) => self.observe(k, &v, "message.delivery.status", clock),
            Err(e) if e.code == ErrorCode::Internal => return false,
            Err(e) => {
                let (accepted_at, _) = self.msgs[k].accepted.expect("accepted");
                let retained = clock < accepted_at + self.retention[source];
                if retained && former {
                    self.refused_at_former_home(k, "message.delivery.status", &e);
                }
                // After retention: not_found; at a former home also what a relay that
                // forgot the account answers (rule 5).
                let forgotten = former
                    && matches!(e.code, ErrorCode::NotHomeRelay | ErrorCode::Unauthenticated);
                if retained || !(e.code == ErrorCode::NotFound || forgotten) {
                    self.fail(format!(
                        "message.delivery.status of {} {} retention: {e:?}",
                        self.msgs[k].task,
                        if retained { "during" } else { "after" }
                    ));
                }
            }
        }
        true
    }

    /// Every device of `acct` at `relay` syncs what is new; whether `relay` answered (a
    /// former home may have forgotten the account once everything it promised expired).
    pub(crate) fn sync(&mut self, acct: usize, relay: usize) -> bool {
        for dev in 0..self.accts[acct].devices.len() {
            let caller = self.session(acct, relay, dev);
            let key = (acct, relay, dev);
            loop {
                self.stats.syncs += 1;
                let after = self.cursors.get(&key).copied().unwrap_or(0);
                let mut p = Object::new();
                p.insert("after", after);
                p.insert("limit", 100u64);
                let r = self.client_call(relay, &caller, "message.timeline.sync", &p);
                let page = match r.result {
                    // As a device reads it: the answer's bytes, parsed.
                    Ok(_) => parse(&r.body()),
                    Err(e) if self.accts[acct].home != relay => {
                        self.forgotten_at_former_home(acct, relay, &e);
                        return false;
                    }
                    Err(e) => self.fail(format!("sync of a{acct} device {dev} at r{relay}: {e:?}")),
                };
                for e in field(&page, "entries").and_then(array).unwrap_or_default() {
                    self.saw(relay, acct, dev, &e);
                }
                let next = field(&page, "next")
                    .and_then(Value::as_protocol_int)
                    .unwrap_or(after);
                if next < after {
                    self.fail(format!("sync next {next} went back from {after}"));
                }
                self.cursors.insert(key, next);
                if field(&page, "has_more") != Some(&Value::Bool(true)) {
                    break;
                }
            }
        }
        true
    }

    /// A former home `relay` of `acct` refused message.timeline.sync: rule 5 allows it only
    /// once every record it showed and every message.send result it accepted of the account
    /// expired (rule 2: records until their expires_at, results during retention).
    pub(crate) fn forgotten_at_former_home(&mut self, acct: usize, relay: usize, e: &Error) {
        let clock = self.w.clock(relay);
        let records = self
            .timelines
            .get(&(relay, acct))
            .and_then(|tl| tl.values().map(|r| r.expires_at).max())
            .unwrap_or(0);
        let results = (0..self.msgs.len())
            .filter(|&k| self.msgs[k].from == acct && self.msgs[k].source == relay)
            .filter_map(|k| self.retained_until(k))
            .max()
            .unwrap_or(0);
        let forgettable = matches!(
            e.code,
            ErrorCode::NotHomeRelay | ErrorCode::Unauthenticated | ErrorCode::NotFound
        );
        if !forgettable || clock < records.max(results) {
            self.fail(format!(
                "invariant 7 (rule 2): the former home r{relay} of a{acct} refused \
                 message.timeline.sync at clock {clock}, while it keeps records until {records} \
                 and results until {results}: {e:?}"
            ));
        }
        self.trace(|| format!("r{relay} forgot a{acct} (clock {clock}): {e:?}"));
    }
}
