//! The invariants: each emission and answer checked as it happens, and the final checks read
//! from every relay's storage with faults off.

use super::*;

impl Sim {
    /// Checks an emitted request against invariants 4 and 5 and the attempt discipline.
    pub(crate) fn on_emit(&mut self, req: &InFlight, clock: u64) {
        let Some(&k) = self.task_msg.get(&req.task) else {
            self.fail(format!(
                "r{} emitted a request for an unknown task {}",
                req.source, req.task
            ));
        };
        let (source, accepted, terminal, landed_at) = {
            let m = &self.msgs[k];
            (m.source, m.accepted, m.terminal.clone(), m.landed_at)
        };
        if req.source != source {
            self.fail(format!(
                "task {} emitted by r{} but accepted by r{source}",
                req.task, req.source
            ));
        }
        // A request to the source's own relay goes to another shard of it, the recipient's.
        let own = self.w.nodes[source].id == req.target;
        let shard = self.w.nodes[source].config.shard;
        let to = self.accts[self.msgs[k].to].id();
        let right = match req.shard {
            None => !own,
            Some(i) => own && i != shard.index && i == Shard::of_account(&to, shard.count),
        };
        if !right {
            self.fail(format!(
                "r{source} (shard {}/{}) emitted {} #{} of {} to {} with shard {:?}",
                shard.index,
                shard.count,
                req.method.as_str(),
                req.attempt,
                req.task,
                req.target.as_str(),
                req.shard
            ));
        }
        let deadline = match accepted {
            Some((_, deadline)) => deadline,
            // Accepted by a commit whose answer was lost; the client has not learned it yet.
            None if landed_at.is_some() => {
                self.msgs[k]
                    .early_emits
                    .push((clock, req.attempt, req.method));
                u64::MAX
            }
            None => self.fail(format!(
                "r{} emitted {} #{} for {}, which no commit accepted",
                req.source,
                req.method.as_str(),
                req.attempt,
                req.task
            )),
        };
        if clock >= deadline {
            self.fail(format!(
                "invariant 4: {} #{} of {} emitted at source clock {clock}, deadline {deadline}",
                req.method.as_str(),
                req.attempt,
                req.task
            ));
        }
        if let Some(t) = terminal {
            self.fail(format!(
                "attempt #{} of {} after the terminal status {t:?}",
                req.attempt, req.task
            ));
        }
        self.settle(&req.task, req.source);
        let timeout = self.w.nodes[req.source].config.attempt_timeout;
        let tm = self.tasks.entry(req.task.clone()).or_default();
        let mut problem = None;
        let mut switched = false;
        if tm.done {
            problem = Some("an attempt after a target_accepted answer".to_string());
        } else if req.attempt <= tm.latest {
            problem = Some(format!("attempt #{} after #{}", req.attempt, tm.latest));
        } else if tm.latest > 0 && !tm.resolved {
            problem = Some(format!(
                "attempt #{} while #{} is still in flight (times out at {})",
                req.attempt, tm.latest, tm.timeout_at
            ));
        }
        let target = req.target.as_str().to_string();
        match &tm.target {
            Some(old) if *old != target => {
                let allowed = tm.route_error || (tm.last_not_attempted && !tm.uncertain);
                if !allowed {
                    problem = Some(format!(
                        "invariant 5: target changed {old} -> {target} without a route error \
                         (uncertain: {}, last outcome not attempted: {})",
                        tm.uncertain, tm.last_not_attempted
                    ));
                }
                if !tm.route_error && tm.rejected {
                    self.stats.switches_after_rejections += 1;
                }
                tm.uncertain = false;
                tm.route_error = false;
                tm.rejected = false;
                tm.not_before = 0;
                switched = true;
            }
            Some(_) if clock < tm.not_before => {
                problem = Some(format!(
                    "{} attempt #{} at clock {clock} before the retry_after of a rate_limited \
                     answer ends at {}",
                    req.method.as_str(),
                    req.attempt,
                    tm.not_before
                ));
            }
            _ => {}
        }
        tm.target = Some(target);
        tm.latest = req.attempt;
        tm.method = Some(req.method);
        tm.resolved = false;
        tm.last_not_attempted = false;
        // (Before the client learned the deadline: the engine bounds the timeout by it anyway.)
        tm.timeout_at = clock.saturating_add(timeout).min(deadline);
        tm.sent_clock = clock;
        tm.attempts += 1;
        if tm.attempts > 5_000 {
            problem = Some("more than 5000 attempts: a request loop".to_string());
        }
        if switched {
            self.stats.target_switches += 1;
        }
        if let Some(p) = problem {
            self.fail(format!("task {}: {p}", req.task));
        }
    }

    /// Feeds an outcome to the source, updating the model if the source still awaits it.
    pub(crate) fn feed(&mut self, req: &InFlight, outcome: Outcome) {
        let items = items_of(req);
        for item in &items {
            self.settle(&item.task, item.source);
        }
        let clock = self.w.clock(req.source);
        // The engine first: a report whose commit failed is lost, and the model stays as it
        // was (the attempt will time out as unknown).
        let applied = self.outcome(req.source, &req.task, req.attempt, outcome.clone());
        if req.method != PeerMethod::DeliverBatch {
            return self.learn(req, outcome, applied, clock);
        }
        // A batch: what became of it is what became of each item (protocol.md §6).
        let outcomes = match &outcome {
            Outcome::Result(body) => match batch_results(body, items.len()) {
                Some(each) => each,
                None => vec![Outcome::Unknown; items.len()],
            },
            Outcome::Error(_) => {
                self.stats.batches_refused_whole += 1;
                vec![outcome.clone(); items.len()]
            }
            _ => {
                self.stats.batches_unknown += 1;
                vec![outcome.clone(); items.len()]
            }
        };
        for (item, o) in items.iter().zip(outcomes) {
            if let Outcome::Result(_) = &outcome {
                match &o {
                    Outcome::Error(_) => self.stats.batch_items_refused += 1,
                    _ => self.stats.batch_items_accepted += 1,
                }
            }
            self.learn(item, o, applied, clock);
        }
    }

    /// The model learns what became of one delivery's attempt (alone, or a batch's item).
    fn learn(&mut self, req: &InFlight, outcome: Outcome, applied: bool, clock: u64) {
        let (from, to) = match self.task_msg.get(&req.task) {
            Some(&k) => (
                self.accts[self.msgs[k].from].id(),
                self.accts[self.msgs[k].to].id(),
            ),
            None => (String::new(), String::new()),
        };
        let message_id = req
            .task
            .split_once('.')
            .map_or("", |(_, id)| id)
            .to_string();
        let tm = self.tasks.entry(req.task.clone()).or_default();
        let current = req.attempt == tm.latest && !tm.resolved && !tm.done;
        if current && !applied {
            // Lost with its commit.
        } else if current {
            tm.resolved = true;
            tm.last_not_attempted = false;
            let deliver = req.method == PeerMethod::Deliver;
            match &outcome {
                Outcome::NotAttempted => tm.last_not_attempted = true,
                Outcome::Unknown => tm.uncertain |= deliver,
                Outcome::Error(body) => match error_parts(body) {
                    Some((code, data)) => {
                        if code == "not_home_relay" && deliver {
                            tm.route_error = true;
                        } else if deliver {
                            tm.rejected = true;
                        }
                        if code == "rate_limited" {
                            if let Some(wait) = data
                                .as_ref()
                                .and_then(|d| field(d, "retry_after"))
                                .and_then(Value::as_protocol_int)
                            {
                                tm.not_before = clock.saturating_add(wait);
                            }
                        }
                    }
                    None => tm.uncertain |= deliver,
                },
                Outcome::Result(body) if deliver => {
                    let v = json::parse(body).unwrap_or(Value::Null);
                    let ok = status_of(&v) == "target_accepted"
                        && field(&v, "message_id").and_then(Value::as_str) == Some(&message_id)
                        && field(&v, "from").and_then(Value::as_str) == Some(&from)
                        && field(&v, "to").and_then(Value::as_str) == Some(&to);
                    if ok {
                        tm.done = true;
                    } else {
                        tm.uncertain = true;
                    }
                }
                Outcome::Result(_) => {}
            }
        } else {
            self.stats.stale_outcomes += 1;
        }
        self.trace(|| {
            let what = match &outcome {
                Outcome::Result(b) => format!("result {}", String::from_utf8_lossy(b)),
                Outcome::Error(b) => format!("error {}", String::from_utf8_lossy(b)),
                Outcome::Unknown => "unknown".to_string(),
                Outcome::NotAttempted => "not attempted".to_string(),
            };
            format!(
                "r{} learns {} #{} {}: {what}",
                req.source,
                req.task,
                req.attempt,
                if !applied {
                    "(lost: its commit failed)"
                } else if current {
                    ""
                } else {
                    "(stale)"
                }
            )
        });
    }

    // ---- Clients ----

    /// Records a DeliveryStatus seen for message `k`; invariant 3 and the deadline rule.
    /// `clock` is the source clock of the operation that answered.
    pub(crate) fn observe(&mut self, k: usize, v: &Value, ctx: &str, clock: u64) {
        let o = Observed::of(v);
        let m = &self.msgs[k];
        let from = self.accts[m.from].id();
        let to = self.accts[m.to].id();
        let source = m.source;
        let mut problems = Vec::new();
        if field(v, "message_id").and_then(Value::as_str) != Some(m.id.as_str())
            || field(v, "from").and_then(Value::as_str) != Some(from.as_str())
            || field(v, "to").and_then(Value::as_str) != Some(to.as_str())
        {
            problems.push("message_id, from or to differ from the message".to_string());
        }
        let shape_ok = match o.status.as_str() {
            "delivering" => o.error.is_none() && o.target_accepted_at.is_none(),
            "target_accepted" => o.error.is_none() && o.target_accepted_at.is_some(),
            "failed" => o.error_code.is_some() && o.target_accepted_at.is_none(),
            _ => false,
        };
        if !shape_ok || o.accepted_at.is_none() || o.deadline.is_none() {
            problems.push(format!("malformed status {o:?}"));
        }
        if m.from == m.to && o.status != "target_accepted" {
            problems.push(format!("self-delivery answered {}", o.status));
        }
        let (accepted_at, deadline) = (o.accepted_at.unwrap_or(0), o.deadline.unwrap_or(0));
        let mut first = false;
        match m.accepted {
            None => {
                first = true;
                // Accepted now, or by the earlier submission whose commit landed.
                let expect = m.landed_at.unwrap_or(clock);
                if accepted_at != expect {
                    problems.push(format!(
                        "first acceptance has accepted_at {accepted_at}, expected {expect} \
                         (source clock {clock}, landed at {:?})",
                        m.landed_at
                    ));
                }
                for &(at, attempt, method) in &m.early_emits {
                    if at >= deadline {
                        problems.push(format!(
                            "invariant 4: {} #{attempt} emitted at source clock {at}, deadline \
                             {deadline}",
                            method.as_str()
                        ));
                    }
                }
                let expect = (m.created_at + self.age_limit[source])
                    .min(accepted_at + self.retention[source]);
                if deadline != expect {
                    problems.push(format!("deadline {deadline}, expected {expect}"));
                }
            }
            Some((a, d)) => {
                if a != accepted_at || d != deadline {
                    problems.push(format!(
                        "invariant 3: accepted_at/deadline changed from {a}/{d} to \
                         {accepted_at}/{deadline}"
                    ));
                }
            }
        }
        if let Some(t) = &m.terminal {
            if *t != o {
                problems.push(format!(
                    "invariant 3: terminal status changed from {t:?} to {o:?}"
                ));
            }
        }
        if !problems.is_empty() {
            self.fail(format!("{ctx} of {}: {}", m.task, problems.join("; ")));
        }
        if o.terminal() && self.msgs[k].terminal.is_none() {
            self.trace(|| format!("{} is {o:?}", self.msgs[k].task));
            self.msgs[k].terminal = Some(o);
        }
        if first {
            self.msgs[k].accepted = Some((accepted_at, deadline));
            self.msgs[k].early_emits.clear();
            self.stats.accepted += 1;
            if self.msgs[k].landed_at.is_some() {
                self.stats.accepted_unanswered += 1;
            }
            if let Some(tm) = self.tasks.get_mut(&self.msgs[k].task) {
                // Attempts emitted before the deadline was known time out by it at the latest.
                tm.timeout_at = tm.timeout_at.min(deadline);
            }
            self.schedule_poll(k);
            let at = self.world_time(source, deadline + SEC);
            self.schedule(at, Ev::TerminalCheck(k));
        }
    }

    pub(crate) fn saw(&mut self, relay: usize, acct: usize, dev: usize, e: &Value) {
        let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        let env = field(e, "envelope");
        let seq = field(e, "seq")
            .and_then(Value::as_protocol_int)
            .unwrap_or(0);
        let box_device = s(field(e, "key_box").and_then(|b| field(b, "device_id")));
        if box_device != self.accts[acct].devices[dev].id().as_str() {
            self.fail(format!(
                "seq {seq} of a{acct} at r{relay} gave device {dev} the key box of {box_device}"
            ));
        }
        self.seen_by
            .entry((relay, acct, seq))
            .or_default()
            .insert(dev);
        let seen = Seen {
            kind: s(field(e, "kind")),
            message_id: s(env.and_then(|v| field(v, "message_id"))),
            from: s(env.and_then(|v| field(v, "from"))),
            to: s(env.and_then(|v| field(v, "to"))),
            accepted_at: field(e, "accepted_at")
                .and_then(Value::as_protocol_int)
                .unwrap_or(0),
            expires_at: field(e, "expires_at")
                .and_then(Value::as_protocol_int)
                .unwrap_or(0),
        };
        let tl = self.timelines.entry((relay, acct)).or_default();
        match tl.get(&seq) {
            Some(old) if *old != seen => {
                let old = old.clone();
                self.fail(format!(
                    "seq {seq} of a{acct} at r{relay} shows {seen:?}, earlier {old:?}"
                ));
            }
            Some(_) => {}
            None => {
                tl.insert(seq, seen);
            }
        }
    }

    /// Invariant 10: a former home accepts no new message for the account: no message.send
    /// of it (an unrecognized retry after `internal`, say) and no record in its timeline
    /// (a message.deliver, or a local delivery) with an accepted_at within a span during
    /// which the relay surely held a route naming another relay.
    pub(crate) fn check_former_accepts_nothing(&mut self) {
        let within = |spans: Option<&Vec<(u64, u64)>>, at: u64| {
            spans.and_then(|v| v.iter().find(|s| s.0 < at && at < s.1).copied())
        };
        for ((node, acct), tl) in &self.timelines {
            let spans = self.former_spans.get(&(*acct, *node));
            for (seq, seen) in tl {
                if let Some(span) = within(spans, seen.accepted_at) {
                    self.fail(format!(
                        "invariant 10: r{node} accepted seq {seq} of a{acct} ({seen:?}) at \
                         {}, while a former home of a{acct} (since {}, until {})",
                        seen.accepted_at, span.0, span.1
                    ));
                }
            }
        }
        for m in &self.msgs {
            let Some((accepted_at, _)) = m.accepted else {
                continue;
            };
            if let Some(span) = within(self.former_spans.get(&(m.from, m.source)), accepted_at) {
                self.fail(format!(
                    "invariant 10: r{} accepted message.send of {} at {accepted_at}, while a \
                     former home of a{} (since {}, until {})",
                    m.source, m.task, m.from, span.0, span.1
                ));
            }
        }
    }

    /// Invariant 8, read from every relay's storage: no (from, message_id) accepted at two
    /// homes (or twice at one).
    pub(crate) fn check_one_home(&mut self) {
        // (from, message_id) -> nodes holding a message.send result, a message.deliver
        // result, a received or self record (one entry per record).
        let mut sends: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
        let mut receipts: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
        let mut records: BTreeMap<(String, String), Vec<StoredRecord>> = BTreeMap::new();
        for n in 0..self.w.nodes.len() {
            for (key, value) in self.w.nodes[n].store.snapshot() {
                let key = String::from_utf8_lossy(&key).to_string();
                let mut parts = key.splitn(3, '/');
                let (Some(kind), Some(a), Some(b)) = (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                match kind {
                    "send" => sends
                        .entry((a.to_string(), b.to_string()))
                        .or_default()
                        .push(n),
                    "recv" => receipts
                        .entry((a.to_string(), b.to_string()))
                        .or_default()
                        .push(n),
                    "tl" => {
                        let v = json::parse(&value).unwrap_or(Value::Null);
                        let kind = field(&v, "kind").and_then(Value::as_str).unwrap_or("");
                        if kind != "received" && kind != "self" {
                            continue;
                        }
                        let env = field(&v, "envelope");
                        let s = |name: &str| {
                            env.and_then(|e| field(e, name))
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string()
                        };
                        let seq = b.parse().unwrap_or(0);
                        records
                            .entry((s("from"), s("message_id")))
                            .or_default()
                            .push((n, a.to_string(), seq));
                    }
                    _ => {}
                }
            }
        }
        self.stats.stored_results_checked += (sends.len() + receipts.len() + records.len()) as u64;
        let msg_of = |sim: &Sim, from: &str, id: &str| {
            sim.msg_by_id
                .get(id)
                .copied()
                .filter(|&k| sim.accts[sim.msgs[k].from].id() == from)
        };
        for ((from, id), places) in &records {
            if places.len() > 1 {
                self.fail(format!(
                    "invariant 8: message {id} of {from} is stored as received (or self) more \
                     than once (node, account, seq): {places:?}"
                ));
            }
            if msg_of(self, from, id).is_none_or(|k| self.msgs[k].accepted.is_none()) {
                self.fail(format!(
                    "invariant 8: a stored record of message {id} of {from}, which no \
                     message.send accepted as far as the client knows: {places:?}"
                ));
            }
        }
        for ((from, id), nodes) in &receipts {
            if nodes.len() > 1 {
                self.fail(format!(
                    "invariant 8: message {id} of {from} has message.deliver results at \
                     r{nodes:?}"
                ));
            }
        }
        for ((from, id), nodes) in &sends {
            let Some(k) = msg_of(self, from, id) else {
                self.fail(format!(
                    "invariant 8: a message.send result of unknown message {id} of {from} at \
                     r{nodes:?}"
                ));
            };
            let m = &self.msgs[k];
            if nodes.len() > 1 || nodes[0] != m.source || m.accepted.is_none() {
                self.fail(format!(
                    "invariant 8: {} (submitted at r{}, accepted as the client knows: {:?}) has \
                     message.send results at r{nodes:?}",
                    m.task, m.source, m.accepted
                ));
            }
        }
        for k in 0..self.msgs.len() {
            let m = &self.msgs[k];
            let key = (self.accts[m.from].id(), m.id.clone());
            let retained = self
                .retained_until(k)
                .is_some_and(|until| self.w.clock(m.source) < until);
            if m.accepted.is_some() && retained && !sends.contains_key(&key) {
                self.fail(format!(
                    "invariant 8: {}, accepted at r{} and retained there, has no stored \
                     message.send result",
                    m.task, m.source
                ));
            }
        }
    }

    /// Every page of an operator listing (`admin.destinations`, `admin.deliveries`) of
    /// node `n`: the rows under `list`, following `next`.
    pub(crate) fn every_row(
        &mut self,
        n: usize,
        method: &str,
        base: &Object,
        list: &str,
    ) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut p = base.clone();
            p.insert("limit", 1000u64);
            if let Some(a) = &after {
                p.insert("after", a.as_str());
            }
            let bytes = canonical::object_to_vec(&p);
            let (r, _, _) = self.call_op(n, &Caller::Operator, method, &bytes);
            let v = r
                .result
                .unwrap_or_else(|e| self.fail(format!("{method} at r{n} with faults off: {e:?}")));
            rows.extend(field(&v, list).and_then(array).unwrap_or_default());
            match field(&v, "next").and_then(Value::as_str) {
                Some(next) => after = Some(next.to_string()),
                None => return rows,
            }
        }
    }

    /// Issue 32: each destination's row agrees with the deliveries themselves, whatever
    /// the run did (operator actions, restarts, storage faults, moves): its `pending` is
    /// the number of pending deliveries listed to it, it has an oldest pending time exactly
    /// when something is pending, and a next attempt only then.
    pub(crate) fn check_destination_rows(&mut self) {
        for n in 0..self.w.nodes.len() {
            let mut pending: BTreeMap<String, u64> = BTreeMap::new();
            let mut only = Object::new();
            only.insert("state", "pending");
            for d in self.every_row(n, "admin.deliveries", &only, "deliveries") {
                if let Some(dest) = field(&d, "destination").and_then(Value::as_str) {
                    *pending.entry(dest.to_string()).or_default() += 1;
                }
            }
            for row in self.every_row(n, "admin.destinations", &Object::new(), "destinations") {
                let Some(dest) = field(&row, "destination").and_then(Value::as_str) else {
                    continue;
                };
                let int = |name: &str| field(&row, name).and_then(Value::as_protocol_int);
                let want = pending.remove(dest).unwrap_or(0);
                let oldest = int("oldest_pending_at");
                if int("pending") != Some(want)
                    || oldest.is_some() != (want > 0)
                    || (int("next_attempt_at").is_some() && want == 0)
                {
                    self.fail(format!(
                        "r{n}'s row for {dest} disagrees with its {want} pending deliveries: {row:?}"
                    ));
                }
            }
            if !pending.is_empty() {
                self.fail(format!(
                    "r{n} has pending deliveries to destinations it does not list: {pending:?}"
                ));
            }
        }
    }

    pub(crate) fn final_checks(&mut self) {
        // The oracle reads with faults off.
        self.arm(false);
        for a in 0..self.accts.len() {
            for relay in self.regs[a].clone() {
                // (A former home that forgot the account was checked to be allowed to.)
                self.sync(a, relay);
            }
        }
        // Invariant 7 at the end: every result still retained answers where it was accepted.
        for k in 0..self.msgs.len() {
            let m = &self.msgs[k];
            if m.accepted.is_none() {
                continue;
            }
            if self
                .retained_until(k)
                .is_some_and(|until| self.w.clock(m.source) < until)
            {
                self.poll(k);
            }
        }
        self.check_one_home();
        self.check_former_accepts_nothing();
        self.check_destination_rows();
        // Where each message is: (relay, account, seq, record).
        let mut found: BTreeMap<String, Vec<(usize, usize, u64, Seen)>> = BTreeMap::new();
        for (&(relay, acct), tl) in &self.timelines {
            for (&seq, seen) in tl {
                found.entry(seen.message_id.clone()).or_default().push((
                    relay,
                    acct,
                    seq,
                    seen.clone(),
                ));
            }
        }
        // Invariant 2: every record comes from an accepted message.send, in the right timeline.
        for (id, places) in &found {
            let Some(&k) = self.msg_by_id.get(id) else {
                self.fail(format!(
                    "invariant 2: a record of unknown message {id}: {places:?}"
                ));
            };
            let m = &self.msgs[k];
            if m.accepted.is_none() {
                self.fail(format!(
                    "invariant 2: a record of {} which the source never accepted: {places:?}",
                    m.task
                ));
            }
            let (from, to) = (self.accts[m.from].id(), self.accts[m.to].id());
            for (relay, acct, seq, seen) in places {
                let devices = self
                    .seen_by
                    .get(&(*relay, *acct, *seq))
                    .cloned()
                    .unwrap_or_default();
                let want: BTreeSet<usize> = if seen.kind == "sent" {
                    (0..self.accts[m.from].devices.len()).collect()
                } else {
                    m.boxed.iter().copied().collect()
                };
                if devices != want {
                    self.fail(format!(
                        "record {seen:?} of {} at r{relay} was synced by devices {devices:?}, \
                         expected {want:?}",
                        m.task
                    ));
                }
                let right = match seen.kind.as_str() {
                    "received" => m.from != m.to && *acct == m.to,
                    "sent" => m.from != m.to && *acct == m.from && *relay == m.source,
                    "self" => m.from == m.to && *acct == m.to && *relay == m.source,
                    _ => false,
                };
                if !right || seen.from != from || seen.to != to {
                    self.fail(format!(
                        "invariant 2: record {seen:?} of {} in the timeline of a{acct} at r{relay}",
                        m.task
                    ));
                }
            }
        }
        for k in 0..self.msgs.len() {
            let m = &self.msgs[k];
            let places = found.get(&m.id).cloned().unwrap_or_default();
            let of_kind = |kind: &str| -> Vec<(usize, usize, u64, Seen)> {
                places
                    .iter()
                    .filter(|p| p.3.kind == kind)
                    .cloned()
                    .collect()
            };
            let self_delivery = m.from == m.to;
            let delivered = of_kind(if self_delivery { "self" } else { "received" });
            let sent = of_kind("sent");
            if m.accepted.is_none() {
                if let Some(at) = m.landed_at {
                    self.fail(format!(
                        "{} was accepted at {at} by a commit whose answer was lost, and the \
                         client never learned it",
                        m.task
                    ));
                }
                continue;
            }
            // Invariant 1: never under two seqs (or two relays).
            if delivered.len() > 1 {
                self.fail(format!(
                    "invariant 1: {} is in the recipient's timelines more than once: {delivered:?}",
                    m.task
                ));
            }
            let want_sent = usize::from(m.sender_boxes);
            if sent.len() != want_sent {
                self.fail(format!(
                    "{} has {} sent records, expected {want_sent}: {sent:?}",
                    m.task,
                    sent.len()
                ));
            }
            if !m.terminal_checked {
                self.fail(format!("{}: the terminal check never ran", m.task));
            }
            let Some(t) = m.terminal.clone() else {
                self.fail(format!("invariant 6: {} never became terminal", m.task));
            };
            match t.status.as_str() {
                "target_accepted" => {
                    let Some(place) = delivered.first() else {
                        self.fail(format!(
                            "invariant 1: {} is target_accepted but not in the recipient's timeline",
                            m.task
                        ));
                    };
                    if Some(place.3.accepted_at) != t.target_accepted_at {
                        self.fail(format!(
                            "{}: target_accepted_at {:?} but the record's accepted_at is {}",
                            m.task, t.target_accepted_at, place.3.accepted_at
                        ));
                    }
                    self.stats.deliveries_checked += 1;
                    let (src, dst) = (self.relay_of[m.source], self.relay_of[place.0]);
                    let sharded = |r: usize| self.nodes_of[r].len() > 1;
                    if self_delivery {
                        self.stats.self_checked += 1;
                    } else if src != dst {
                        self.stats.cross_relay_checked += 1;
                        if sharded(src) || sharded(dst) {
                            self.stats.sharded_cross_relay_checked += 1;
                        }
                    } else if place.0 != m.source {
                        self.stats.cross_shard_checked += 1;
                    }
                }
                _ if t.error_code.as_deref() == Some("deadline_exceeded") => {
                    self.stats.failed_deadline += 1;
                    if !delivered.is_empty() {
                        self.stats.failed_deadline_but_delivered += 1;
                    }
                }
                _ => {
                    self.stats.failed_other += 1;
                    if !delivered.is_empty() {
                        self.fail(format!(
                            "invariant 6: {} failed with {:?} but is in the recipient's timeline: \
                             {delivered:?}",
                            m.task, t.error
                        ));
                    }
                }
            }
        }
    }
}

/// The deliveries a request carries, each as the model tracks a request: a batch's items
/// (its lead's task and each rider's) as deliveries of their own, any other request as is.
pub(crate) fn items_of(req: &InFlight) -> Vec<InFlight> {
    if req.method != PeerMethod::DeliverBatch {
        return vec![req.clone()];
    }
    std::iter::once((req.task.clone(), req.attempt))
        .chain(req.riders.iter().cloned())
        .map(|(task, attempt)| InFlight {
            source: req.source,
            task,
            attempt,
            target: req.target.clone(),
            method: PeerMethod::Deliver,
            body: Vec::new(),
            shard: req.shard,
            route_revision: None,
            riders: Vec::new(),
        })
        .collect()
}

/// Each item's answer in a 200 batch answer, read here as protocol.md §6 states it (a
/// `results` list of one object per item, an error being `{"error"}`), or none when the
/// answer is not that.
fn batch_results(body: &[u8], n: usize) -> Option<Vec<Outcome>> {
    let v = json::parse(body).ok()?;
    let Some(Value::Array(list)) = field(&v, "results") else {
        return None;
    };
    if list.len() != n {
        return None;
    }
    list.iter()
        .map(|item| {
            let bytes = canonical::to_vec(item);
            match item {
                Value::Object(o) if o.get("error").is_some() => Some(Outcome::Error(bytes)),
                Value::Object(_) => Some(Outcome::Result(bytes)),
                _ => None,
            }
        })
        .collect()
}
