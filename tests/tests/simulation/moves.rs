//! Account moves (issue 31): chains of moves to other relays and back to former homes, and
//! device revocations.

use super::*;

impl Sim {
    /// A move of a chain (see "Moves" in the module doc): account `x` moves to relay
    /// `to_relay` (drawn now if `None`), and the next move of the chain is scheduled.
    pub(crate) fn migrate(&mut self, x: usize, to_relay: Option<usize>, more: u32) {
        let here = self.relay_of[self.accts[x].home];
        let to_relay = to_relay.unwrap_or_else(|| {
            // Back to a former home six times in ten, when there is one; else elsewhere.
            let mut former: Vec<usize> = self.regs[x]
                .iter()
                .map(|&n| self.relay_of[n])
                .filter(|&r| r != here)
                .collect();
            former.dedup();
            if !former.is_empty() && self.moves_rng.gen_bool(0.6) {
                former[self.moves_rng.gen_range(0..former.len())]
            } else {
                let relays = self.nodes_of.len();
                (here + self.moves_rng.gen_range(1..relays)) % relays
            }
        });
        if to_relay != here {
            self.move_account(x, to_relay);
        }
        if more > 0 {
            let at = self.w.now + self.moves_rng.gen_range(20 * SEC..4 * MIN);
            self.schedule(
                at,
                Ev::Migrate {
                    acct: x,
                    to: None,
                    more: more - 1,
                },
            );
        }
    }

    /// Account `x` moves to relay `to_relay` (the shard serving it there, if sharded), with
    /// a route of the next revision: registered there (again, if it is a former home: rule
    /// 4), its devices registered, sessions opened, the route published where it was.
    pub(crate) fn move_account(&mut self, x: usize, to_relay: usize) {
        let old = self.accts[x].home;
        let old_relay = self.relay_of[old];
        let to = self.serving(to_relay, x);
        let back = self.regs[x].contains(&to);
        if let Some(span) = self
            .former_spans
            .get_mut(&(x, to))
            .and_then(|spans| spans.last_mut())
            .filter(|s| s.1 == u64::MAX)
        {
            span.1 = self.w.clock(to);
        }
        let revision = self.accts[x].route_revision + 1;
        self.accts[x].route_revision = revision;
        self.stats.moves += 1;
        if back {
            self.stats.moves_back += 1;
        }
        self.trace(|| {
            format!(
                "a{x} moves r{old} -> r{to} (route revision {revision}{})",
                if back { ", back to a former home" } else { "" }
            )
        });
        let key = &self.accts[x].key;
        let route = draft::route(
            NET,
            &key.id(),
            &self.relay_str(to),
            revision,
            self.w.clock(to),
        )
        .sign(key);
        let mut p = Object::new();
        p.insert("route", route.clone());
        p.insert("certificate", self.accts[x].certs[0].clone());
        p.insert("discoverable", self.discoverable[x]);
        if let Err(e) = self
            .client_call(to, &Caller::Anonymous, "account.register", &p)
            .result
        {
            self.fail(format!(
                "account.register of a{x} at r{to} (revision {revision}{}): {e:?}",
                if back { ", a move back: rule 4" } else { "" }
            ));
        }
        self.accts[x].home = to;
        let mut tokens = vec![self.open_session(x, to, 0)];
        for dev in 1..self.accts[x].devices.len() {
            // At a former home the device is held already: registered again all the same.
            let mut p = Object::new();
            p.insert("certificate", self.accts[x].certs[dev].clone());
            let caller = Caller::Session(tokens[0].clone());
            if let Err(e) = self.client_call(to, &caller, "device.register", &p).result {
                self.fail(format!("device.register of a{x} at r{to}: {e:?}"));
            }
            tokens.push(self.open_session(x, to, dev));
        }
        self.accts[x].sessions = tokens.clone();
        if let Some(old) = self.sessions.insert((x, to), tokens) {
            // A move back: the sessions of the earlier span stay with their clients.
            self.old_sessions.entry((x, to)).or_default().push(old);
        }
        if !back {
            self.regs[x].push(to);
        }
        self.routes[x] = route;
        // The old home learns of the move a little later; others maybe.
        let at = self.w.now + self.rng.gen_range(0..30 * SEC);
        self.schedule(
            at,
            Ev::Publish {
                acct: x,
                relay: old_relay,
            },
        );
        for r in 0..self.nodes_of.len() {
            if r != old_relay && r != to_relay && self.rng.gen_bool(0.5) {
                let at = self.w.now + self.rng.gen_range(0..120 * SEC);
                self.schedule(at, Ev::Publish { acct: x, relay: r });
            }
        }
        if self.sync_chains.insert((x, to)) {
            let at = self.w.now + self.rng.gen_range(SEC..30 * SEC);
            self.schedule(
                at,
                Ev::Sync {
                    acct: x,
                    relay: to,
                    periodic: true,
                },
            );
        }
        // The results the sender left behind: polled (invariant 7) and retried unchanged
        // (invariant 9) at the homes that accepted them, at random points within retention.
        for k in 0..self.msgs.len() {
            if self.msgs[k].from != x || !self.former(k) || self.msgs[k].accepted.is_none() {
                continue;
            }
            let source = self.msgs[k].source;
            let Some(until) = self.retained_until(k) else {
                continue;
            };
            let end = self.world_time(source, until);
            if end <= self.w.now + 2 * SEC {
                continue;
            }
            let span = end - self.w.now - SEC;
            if self.moves_rng.gen_bool(0.5) {
                let at = self.w.now + self.moves_rng.gen_range(0..span);
                self.schedule(at, Ev::FormerPoll(k));
            }
            if self.moves_rng.gen_bool(0.25) {
                let at = self.w.now + self.moves_rng.gen_range(0..span.min(5 * MIN));
                self.schedule(at, Ev::FormerResend(k));
            }
        }
        // A crash near the move: the home left, or the new one.
        if self.moves_rng.gen_bool(0.2) {
            let relay = if self.moves_rng.gen_bool(0.5) {
                old_relay
            } else {
                to_relay
            };
            let at = self.w.now + self.moves_rng.gen_range(0..60 * SEC);
            self.schedule(at, Ev::Restart(relay));
        }
    }

    /// The recipient revokes a grant it gave (deliveries not yet accepted then fail).
    pub(crate) fn revoke(&mut self) {
        let keys: Vec<(usize, usize)> = self.grants.keys().copied().collect();
        if keys.is_empty() {
            return;
        }
        let (grantor, grantee) = keys[self.rng.gen_range(0..keys.len())];
        let grant_id = self.grants[&(grantor, grantee)]
            .get("grant_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let home = self.accts[grantor].home;
        let caller = self.session(grantor, home, 0);
        let mut p = Object::new();
        p.insert("grant_id", grant_id);
        if let Err(e) = self.client_call(home, &caller, "contact.revoke", &p).result {
            self.fail(format!("contact.revoke by a{grantor}: {e:?}"));
        }
        self.stats.grant_revocations += 1;
        self.trace(|| format!("a{grantor} revokes its grant to a{grantee} at r{home}"));
    }

    // ---- The end ----
}
