//! The simulated network between relays and shards: arrivals, losses, duplicates, synthetic
//! errors, and what each source learns of its requests.

use super::*;

impl Sim {
    /// Node `n` hands `body` to its sibling shard `shard` as a public `POST {path}`, whose
    /// answer nobody needs (`Effect::ShardCall`): lost, duplicated and delayed as requests
    /// are, it arrives as `Ev::ShardCall`.
    pub(crate) fn shard_call(&mut self, n: usize, shard: u32, path: &'static str, body: Vec<u8>) {
        self.stats.shard_calls += 1;
        let id = self.w.nodes[n].id.clone();
        let Some(sib) = self.w.shard_node(&id, shard).filter(|&sib| sib != n) else {
            self.fail(format!(
                "r{n} handed {path} to shard {shard}, which is itself or none of its relay's"
            ));
        };
        if self.permille(self.faults.lost_request) {
            self.stats.lost_shard_calls += 1;
            self.trace(|| format!("r{n} hands {path} to r{sib}: lost"));
            return;
        }
        let copies = if self.permille(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.w.now + self.latency();
            let body = body.clone();
            self.schedule(
                at,
                Ev::ShardCall {
                    from: n,
                    node: sib,
                    path,
                    body,
                },
            );
        }
    }

    /// A shard call reaches its sibling (unless it is unreachable): the call runs there, and
    /// only its host's storage may fail it.
    pub(crate) fn arrive_shard_call(&mut self, from: usize, node: usize, path: &str, body: &[u8]) {
        if self.outage(node).is_some() {
            self.stats.lost_shard_calls += 1;
            self.trace(|| format!("r{from} hands {path} to r{node}: unreachable"));
            return;
        }
        let Some(method) = path.strip_prefix("/v1/") else {
            self.fail(format!("r{from} handed r{node} a call to {path}"));
        };
        let (r, _, _) = self.call_op(node, &Caller::Anonymous, method, body);
        self.trace(|| {
            format!(
                "r{node} takes {method} from r{from}: {}",
                String::from_utf8_lossy(&r.body())
            )
        });
        match &r.result {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::Internal => self.stats.lost_shard_calls += 1,
            Err(e) => self.fail(format!(
                "r{node} refused the {method} r{from} handed it: {e:?} ({})",
                String::from_utf8_lossy(body)
            )),
        }
    }

    /// Connection refused: the request never reached the target.
    pub(crate) fn refused(&mut self, req: InFlight) {
        self.stats.not_attempted += 1;
        let at = self.w.now + self.rng.gen_range(0..200);
        self.report(at, req, Outcome::NotAttempted);
    }

    /// The request is lost on the way; the source may time out by itself.
    pub(crate) fn lost(&mut self, req: InFlight) {
        self.stats.lost_requests += 1;
        if self.rng.gen_bool(0.6) {
            let at = self.w.now + self.rng.gen_range(SEC..45 * SEC);
            self.report(at, req, Outcome::Unknown);
        }
    }

    /// A request reaches its target, which answers.
    pub(crate) fn arrive(&mut self, req: InFlight, dup: bool, twinned: bool) {
        let t = self.w.target_node(&req).expect("target relay");
        match self.outage(t) {
            // A twin may have been delivered: never claim NotAttempted for a twinned request.
            Some(true) if !twinned => return self.refused(req),
            Some(_) => return self.lost(req),
            None => {}
        }
        let source = self.w.nodes[req.source].id.clone();
        let caller = Caller::relay_at(source, req.route_revision);
        let (r, log, _) = self.call_op(t, &caller, req.method.as_str(), &req.body);
        if log.indeterminate() {
            // The host cannot know whether the commit landed, so `internal` might be untrue:
            // it drops the connection, and the source learns an unknown outcome, or times out.
            self.stats.dropped_answers += 1;
            self.trace(|| {
                format!(
                    "r{t} drops the connection of {} #{} {} ({})",
                    req.method.as_str(),
                    req.attempt,
                    req.task,
                    log.describe()
                )
            });
            if self.rng.gen_bool(0.6) {
                let at = self.w.now + self.rng.gen_range(0..5 * SEC);
                self.report(at, req, Outcome::Unknown);
            }
            return;
        }
        let mut outcome = match &r.result {
            Ok(_) => Outcome::Result(r.body()),
            Err(_) => Outcome::Error(r.body()),
        };
        if let Err(e) = &r.result {
            match e.code {
                ErrorCode::RateLimited => self.stats.rate_limited += 1,
                ErrorCode::NotHomeRelay => {
                    self.stats.route_errors += 1;
                    if req.shard.is_some() {
                        self.stats.sibling_route_errors += 1;
                    }
                    if e.data.is_some() && self.permille(self.faults.strip_route) {
                        // An honest but less helpful answer: the route error without data.route.
                        self.stats.stripped_routes += 1;
                        let bare = Error::new(ErrorCode::NotHomeRelay, e.message.clone());
                        outcome = Outcome::Error(canonical::to_vec(&error_body(&bare)));
                    }
                }
                _ => {}
            }
        }
        self.trace(|| {
            format!(
                "r{t} answers {} #{} {}{}: {}",
                req.method.as_str(),
                req.attempt,
                req.task,
                if dup { " (duplicate)" } else { "" },
                String::from_utf8_lossy(&r.body())
            )
        });
        if dup && self.rng.gen_bool(0.5) {
            return;
        }
        if self.permille(self.faults.lost_response) {
            self.stats.lost_responses += 1;
            if self.rng.gen_bool(0.6) {
                let at = self.w.now + self.rng.gen_range(SEC..40 * SEC);
                self.report(at, req, Outcome::Unknown);
            }
            return;
        }
        let at = self.w.now + self.latency();
        self.report(at, req, outcome);
    }

    /// Brings the model of a task up to date with its source's ticks (an attempt that timed out).
    pub(crate) fn settle(&mut self, task: &str, source: usize) {
        let last_tick = self.last_tick[source];
        // An attempt sent before its source's process started is settled by the first tick
        // after the start (or by its timeout, whichever comes first).
        let (started, swept) = (self.started[source], self.swept[source]);
        if let Some(tm) = self.tasks.get_mut(task) {
            let orphaned = swept && tm.sent_clock < started;
            if tm.latest > 0 && !tm.resolved && (last_tick >= tm.timeout_at || orphaned) {
                tm.resolved = true;
                tm.last_not_attempted = false;
                if tm.method == Some(PeerMethod::Deliver) {
                    tm.uncertain = true;
                }
            }
        }
    }
}
