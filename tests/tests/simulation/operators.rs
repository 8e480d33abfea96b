//! The operator at random points: pause, hold and retry of destinations and deliveries.

use super::*;

impl Sim {
    /// One of node `n`'s destinations, drawn at random from its operator's first page of
    /// `admin.destinations` (none when it has none, or the call met a storage fault).
    pub(crate) fn some_destination(&mut self, n: usize) -> Option<String> {
        let mut p = Object::new();
        p.insert("limit", 50u64);
        let bytes = canonical::object_to_vec(&p);
        let (r, _, _) = self.call_op(n, &Caller::Operator, "admin.destinations", &bytes);
        let v = r.result.ok()?;
        let dests: Vec<String> = field(&v, "destinations")
            .and_then(array)
            .unwrap_or_default()
            .iter()
            .filter_map(|d| field(d, "destination").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        if dests.is_empty() {
            return None;
        }
        Some(dests[self.ops_rng.gen_range(0..dests.len())].clone())
    }

    /// The operator of a random node pauses one of its destinations, and resumes it 10 s to
    /// 3 min later (a peer being migrated). Deadlines run on: what is held past one fails.
    pub(crate) fn operator_pause(&mut self) {
        let n = self.ops_rng.gen_range(0..self.w.nodes.len());
        let Some(d) = self.some_destination(n) else {
            return;
        };
        self.operator_hold(n, &d, "admin.destination.pause");
        let at = self.w.now + self.ops_rng.gen_range(10 * SEC..3 * MIN);
        self.schedule(
            at,
            Ev::OperatorResume {
                node: n,
                destination: d,
            },
        );
    }

    /// `method` (pause or resume) of `destination` at node `n`; a storage fault may lose it
    /// (then a resume is tried again a little later, as an operator would).
    pub(crate) fn operator_hold(&mut self, n: usize, destination: &str, method: &str) {
        let mut p = Object::new();
        p.insert("destination", destination);
        let bytes = canonical::object_to_vec(&p);
        let (r, _, _) = self.call_op(n, &Caller::Operator, method, &bytes);
        match r.result {
            Ok(v) => {
                self.stats.operator_holds += 1;
                self.trace(|| format!("operator of r{n}: {method} {destination}: {v:?}"));
            }
            Err(e) if e.code == ErrorCode::Internal => {
                if method.ends_with("resume") {
                    let at = self.w.now + 5 * SEC;
                    self.schedule(
                        at,
                        Ev::OperatorResume {
                            node: n,
                            destination: destination.to_string(),
                        },
                    );
                }
            }
            Err(e) => self.fail(format!("{method} {destination} at r{n}: {e:?}")),
        }
    }

    /// "Retry now" by the operator of a random node, for one of its destinations or one
    /// message it accepted. The seed's rules must hold whatever it hits (the checkers see
    /// every attempt it starts); an ended delivery must be refused, never attempted again.
    pub(crate) fn operator_retry(&mut self) {
        let n = self.ops_rng.gen_range(0..self.w.nodes.len());
        if self.ops_rng.gen_bool(0.5) {
            let Some(d) = self.some_destination(n) else {
                return;
            };
            let mut p = Object::new();
            p.insert("destination", d.as_str());
            let bytes = canonical::object_to_vec(&p);
            let (r, _, _) = self.call_op(n, &Caller::Operator, "admin.destination.retry", &bytes);
            match r.result {
                Ok(v) => {
                    self.stats.operator_retries += 1;
                    self.stats.operator_brought_forward += field(&v, "brought_forward")
                        .and_then(Value::as_protocol_int)
                        .unwrap_or(0);
                    self.trace(|| format!("operator of r{n} retries {d} now: {v:?}"));
                }
                Err(e) if e.code == ErrorCode::Internal => {}
                Err(e) => self.fail(format!("admin.destination.retry {d} at r{n}: {e:?}")),
            }
            return;
        }
        let ks: Vec<usize> = (0..self.msgs.len())
            .filter(|&k| self.msgs[k].source == n && self.msgs[k].accepted.is_some())
            .collect();
        // Mostly a message not known to have ended (what an operator would retry), and
        // sometimes one that has (which must be refused).
        let open: Vec<usize> = ks
            .iter()
            .copied()
            .filter(|&k| self.msgs[k].terminal.is_none())
            .collect();
        let ks = if !open.is_empty() && self.ops_rng.gen_bool(0.8) {
            open
        } else {
            ks
        };
        if ks.is_empty() {
            return;
        }
        let k = ks[self.ops_rng.gen_range(0..ks.len())];
        let mut p = Object::new();
        p.insert("from", self.accts[self.msgs[k].from].id().as_str());
        p.insert("message_id", self.msgs[k].id.as_str());
        let bytes = canonical::object_to_vec(&p);
        let (r, _, _) = self.call_op(n, &Caller::Operator, "admin.delivery.retry", &bytes);
        let task = self.msgs[k].task.clone();
        match r.result {
            Ok(v) => {
                self.stats.operator_retries += 1;
                let moved = field(&v, "brought_forward") == Some(&Value::Bool(true));
                if moved {
                    self.stats.operator_brought_forward += 1;
                    if self.msgs[k].terminal.is_some() {
                        self.fail(format!(
                            "the operator brought forward {task}, which had ended: {v:?}"
                        ));
                    }
                }
                self.trace(|| format!("operator of r{n} retries {task} now: {v:?}"));
            }
            // Ended (its result never changes), or forgotten after retention.
            Err(e) if e.code == ErrorCode::StateConflict => {
                self.stats.operator_retries_refused += 1
            }
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Internal) => {}
            Err(e) => self.fail(format!("admin.delivery.retry {task} at r{n}: {e:?}")),
        }
    }
}
