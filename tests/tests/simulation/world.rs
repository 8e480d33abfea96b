//! The simulated world: relays, accounts and their keys, the event queue and its clock, and
//! what each seed draws when it sets the world up.

use super::*;

impl Sim {
    pub(crate) fn new(seed: u64, verbose: bool) -> Sim {
        let mut rng = ChaCha20Rng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5151);
        let f = [0, 0, 1, 1, 2, 3, 5][rng.gen_range(0..7)];
        let faults = Faults {
            not_attempted: 15 * f,
            lost_request: 15 * f,
            synthetic_429: 10 * f,
            synthetic_503: 10 * f,
            duplicate: 25 * f,
            lost_response: 15 * f,
            slow: 8 * f,
            strip_route: 500,
        };
        let mut sim = Sim {
            seed,
            verbose,
            w: World::new(seed),
            rng,
            faults,
            outages: Vec::new(),
            relay_of: Vec::new(),
            nodes_of: Vec::new(),
            age_limit: Vec::new(),
            retention: Vec::new(),
            accts: Vec::new(),
            acct_by_id: BTreeMap::new(),
            discoverable: Vec::new(),
            regs: Vec::new(),
            sessions: BTreeMap::new(),
            routes: Vec::new(),
            moves_rng: ChaCha20Rng::seed_from_u64(
                seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x30e5,
            ),
            ops_rng: ChaCha20Rng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0b5),
            span_faults: seed % 2 == 1 && span_faults_on(),
            spans_rng: ChaCha20Rng::seed_from_u64(seed.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ 0x5a5),
            old_sessions: BTreeMap::new(),
            sync_chains: BTreeSet::new(),
            former_spans: BTreeMap::new(),
            grants: BTreeMap::new(),
            queue: BTreeMap::new(),
            next_seq: 0,
            essential: 0,
            sync_pending: BTreeSet::new(),
            msgs: Vec::new(),
            msg_by_id: BTreeMap::new(),
            task_msg: BTreeMap::new(),
            tasks: BTreeMap::new(),
            last_tick: Vec::new(),
            same_clock_ticks: Vec::new(),
            epoch: Vec::new(),
            started: Vec::new(),
            swept: Vec::new(),
            notified: Vec::new(),
            timelines: BTreeMap::new(),
            seen_by: BTreeMap::new(),
            notified_seq: BTreeMap::new(),
            cursors: BTreeMap::new(),
            engines: Vec::new(),
            disks: Vec::new(),
            probe: Vec::new(),
            outbox: Vec::new(),
            stats: Stats {
                seeds: 1,
                ..Stats::default()
            },
        };
        sim.setup();
        sim
    }

    /// Panics with the seed: an invariant does not hold.
    pub(crate) fn fail(&self, what: String) -> ! {
        panic!(
            "simulation seed {} violated an invariant at t+{} ms: {what}\n  replay: RELAY_SIM_SEED={} \
             cargo test --release -p relay-tests --test simulation simulation_1000_seeds -- --nocapture",
            self.seed,
            self.w.now - T0,
            self.seed
        )
    }

    pub(crate) fn trace(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            println!("[t+{:>8}] {}", self.w.now - T0, what());
        }
    }

    pub(crate) fn schedule(&mut self, at: u64, ev: Ev) {
        if ev.essential() {
            self.essential += 1;
        }
        let at = at.max(self.w.now);
        self.queue.insert((at, self.next_seq), ev);
        self.next_seq += 1;
    }

    /// Schedules a move of `acct` to relay `to` at `at`, followed by up to three more moves
    /// (drawn from `moves_rng`, so the other draws of a seed stay as they were).
    pub(crate) fn schedule_move(&mut self, at: u64, acct: usize, to: usize) {
        let more = self.moves_rng.gen_range(0..=3);
        self.schedule(
            at,
            Ev::Migrate {
                acct,
                to: Some(to),
                more,
            },
        );
    }

    pub(crate) fn permille(&mut self, p: u32) -> bool {
        p > 0 && self.rng.gen_range(0..1000) < p
    }

    /// Whether node `n` is unreachable now, and if so whether connections are refused.
    pub(crate) fn outage(&self, n: usize) -> Option<bool> {
        let now = self.w.now;
        let relay = self.relay_of[n];
        self.outages
            .iter()
            .find(|o| {
                o.relay == relay && o.node.is_none_or(|m| m == n) && o.from <= now && now < o.until
            })
            .map(|o| o.refused)
    }

    pub(crate) fn relay_str(&self, n: usize) -> String {
        self.w.nodes[n].id.as_str().to_string()
    }

    /// A world time in relay `n`'s clock.
    pub(crate) fn world_time(&self, n: usize, clock: u64) -> u64 {
        (clock as i64 - self.w.nodes[n].skew) as u64
    }

    pub(crate) fn setup(&mut self) {
        let relays = self.rng.gen_range(3..=4usize);
        let layout = shard_layout(self.seed, relays);
        for (i, &count) in layout.iter().enumerate() {
            let age_limit = self.rng.gen_range(3..=8) * MIN;
            let retention = self.rng.gen_range(10..=14) * MIN;
            let retry_max = self.rng.gen_range(5..=60) * SEC;
            let small_deliver = self.rng.gen_bool(0.35);
            let deliver_rate = self.rng.gen_range(4..=20);
            let per_account = self.rng.gen_range(2..=8);
            let send_rate = if self.rng.gen_bool(0.2) {
                self.rng.gen_range(2..=6)
            } else {
                600
            };
            let in_flight = if self.rng.gen_bool(0.2) {
                self.rng.gen_range(1..=3)
            } else {
                16
            };
            let timeout = if self.rng.gen_bool(0.25) {
                15 * SEC
            } else {
                30 * SEC
            };
            let tune = |c: &mut relay_core::engine::Config| {
                let p = &mut c.policies;
                p.message_delivery_age_limit = age_limit;
                p.message_retention = retention;
                p.retry_initial = SEC;
                p.retry_max = retry_max;
                p.send_rate = send_rate;
                if small_deliver {
                    p.deliver_rate = deliver_rate;
                    p.deliver_rate_per_account = per_account;
                }
                c.max_in_flight_per_destination = in_flight;
                c.attempt_timeout = timeout;
            };
            // Named after its first node (relay i's, when no relay is sharded).
            let name = format!("r{}", self.w.nodes.len());
            let first = if count == 1 {
                self.w.relay_with(&name, tune)
            } else {
                self.stats.sharded_relays += 1;
                self.stats.shard_engines += u64::from(count);
                self.w.sharded_relay_with(&name, count, tune)
            };
            let nodes: Vec<usize> = (first..first + count as usize).collect();
            for &n in &nodes {
                self.w.nodes[n].skew = if n == first {
                    self.rng.gen_range(-5_000..=5_000)
                } else {
                    // The shards of one relay run on machines of their own (Durable
                    // Objects), whose clocks agree closely but not exactly.
                    self.w.nodes[first].skew + self.rng.gen_range(-300..=300)
                };
                self.relay_of.push(i);
                self.age_limit.push(age_limit);
                self.retention.push(retention);
                self.last_tick.push(0);
                self.same_clock_ticks.push(0);
                self.epoch.push(0);
                self.started.push(0);
                self.swept.push(false);
                self.notified.push(0);
                if n == first {
                    self.stats.relays += 1;
                }
                // Storage faults: none on a third of the stores, level 1 to 3 on the others.
                let level = [0, 0, 1, 1, 2, 3][self.rng.gen_range(0..6)];
                let level = if storage_faults() { level } else { 0 };
                let disk = Rc::new(RefCell::new(Disk::new(
                    DiskRates::level(level),
                    self.rng.gen(),
                )));
                let engine = self.engine_over(n, &disk);
                self.engines.push(engine);
                self.disks.push(disk);
                self.probe.push(false);
            }
            self.nodes_of.push(nodes);
        }
        if self.verbose {
            for (r, nodes) in self.nodes_of.iter().enumerate() {
                let shards: Vec<String> = nodes
                    .iter()
                    .map(|&n| {
                        let s = self.w.nodes[n].config.shard;
                        format!("r{n} = shard {}/{}", s.index, s.count)
                    })
                    .collect();
                println!(
                    "relay {r}: {} on {}",
                    self.relay_str(nodes[0]),
                    shards.join(", ")
                );
            }
        }
        let mut accounts = self.rng.gen_range(relays + 1..=relays + 4);
        for i in 0..accounts {
            let home = if i < relays {
                i
            } else {
                self.rng.gen_range(0..relays)
            };
            self.add_account(home);
        }
        // A sharded relay gets as many accounts again as it has shards, so that its shards
        // send to each other.
        for (r, &count) in layout.iter().enumerate() {
            if count > 1 {
                for _ in 0..count {
                    self.add_account(r);
                }
                accounts += count as usize;
            }
        }
        for a in 0..accounts {
            for r in 0..relays {
                if r != self.relay_of[self.accts[a].home] && self.rng.gen_bool(0.85) {
                    self.publish(a, r);
                }
            }
        }
        // Client actions.
        let start = T0 + 30 * SEC;
        let window = self.rng.gen_range(4..=12) * MIN;
        let sends = self.rng.gen_range(8..=24);
        for _ in 0..sends {
            let at = start + self.rng.gen_range(0..window);
            self.schedule(at, Ev::ClientSend);
        }
        let migrations = match self.rng.gen_range(0..20) {
            0..=8 => 0,
            9..=16 => 1,
            _ => 2,
        };
        for _ in 0..migrations {
            let at = start + self.rng.gen_range(0..window);
            let acct = self.rng.gen_range(0..accounts);
            let to = self.rng.gen_range(0..relays);
            self.schedule_move(at, acct, to);
        }
        // An account of each sharded relay moves off it, late enough that its neighbours
        // hold its route by then (they meet its old shard's not_home_relay).
        for (r, &count) in layout.iter().enumerate() {
            if count == 1 {
                continue;
            }
            let on: Vec<usize> = (0..accounts)
                .filter(|&a| self.relay_of[self.accts[a].home] == r)
                .collect();
            let acct = on[self.rng.gen_range(0..on.len())];
            let to = (r + self.rng.gen_range(1..relays)) % relays;
            let at = start + self.rng.gen_range(window / 3..window);
            self.schedule_move(at, acct, to);
        }
        for _ in 0..self.rng.gen_range(0..=4) {
            let at = start + self.rng.gen_range(0..window + 8 * MIN);
            let n = self.rng.gen_range(0..relays);
            self.schedule(at, Ev::Restart(n));
        }
        if self.rng.gen_bool(0.3) {
            let at = start + self.rng.gen_range(0..window);
            self.schedule(at, Ev::Revoke);
        }
        for _ in 0..self.ops_rng.gen_range(0..=4) {
            let at = start + self.ops_rng.gen_range(0..window + 4 * MIN);
            self.schedule(at, Ev::OperatorRetry);
        }
        for _ in 0..self.ops_rng.gen_range(0..=2) {
            let at = start + self.ops_rng.gen_range(0..window + 4 * MIN);
            self.schedule(at, Ev::OperatorPause);
        }
        if self.rng.gen_bool(0.35) {
            for _ in 0..self.rng.gen_range(1..=2) {
                let from = start + self.rng.gen_range(0..window);
                let until = from + self.rng.gen_range(20 * SEC..10 * MIN);
                let relay = self.rng.gen_range(0..relays);
                let refused = self.rng.gen_bool(0.5);
                // A sharded relay may lose one shard only (one Durable Object unreachable).
                let shards = self.nodes_of[relay].len();
                let node = (shards > 1 && self.rng.gen_bool(0.5))
                    .then(|| self.nodes_of[relay][self.rng.gen_range(0..shards)]);
                self.outages.push(Outage {
                    relay,
                    node,
                    from,
                    until,
                    refused,
                });
            }
        }
        for a in 0..accounts {
            let at = start + self.rng.gen_range(0..60 * SEC);
            let relay = self.accts[a].home;
            self.sync_chains.insert((a, relay));
            self.schedule(
                at,
                Ev::Sync {
                    acct: a,
                    relay,
                    periodic: true,
                },
            );
        }
        self.arm(true);
    }

    /// Turns every relay's storage faults on or off.
    pub(crate) fn arm(&mut self, on: bool) {
        for d in &self.disks {
            d.borrow_mut().armed = on;
        }
    }

    /// A new engine for relay `n` over its store, behind `disk` (at start, and at each restart).
    pub(crate) fn engine_over(&mut self, n: usize, disk: &Rc<RefCell<Disk>>) -> SimEngine {
        let store = FaultyStore {
            inner: self.w.nodes[n].store.clone(),
            disk: disk.clone(),
        };
        let entropy = TestEntropy(ChaCha20Rng::seed_from_u64(self.rng.gen()));
        Engine::new(self.w.nodes[n].config.clone(), store, entropy)
    }

    /// Prints what relay `n` stores about `task`, its schedule and its peers.
    pub(crate) fn dump(&self, n: usize, task: &str) {
        println!(
            "relay r{n} (wake {:?}, clock {}):",
            self.w.nodes[n].wake,
            self.w.clock(n)
        );
        for (k, v) in self.w.nodes[n].store.snapshot() {
            let key = String::from_utf8_lossy(&k);
            if key.contains(task)
                || key.starts_with("due/")
                || key.starts_with("peer/")
                || key.starts_with("park/")
            {
                println!("  {key} = {}", String::from_utf8_lossy(&v));
            }
        }
    }

    /// Registers an account at relay `relay` (on the shard serving it, if sharded).
    pub(crate) fn add_account(&mut self, relay: usize) {
        let i = self.accts.len();
        let devices = if self.rng.gen_bool(0.3) { 2 } else { 1 };
        let discoverable = self.rng.gen_bool(0.5);
        let acct = self
            .w
            .account(self.nodes_of[relay][0], devices, discoverable);
        let home = acct.home;
        if self.relay_of[home] != relay {
            self.fail(format!("a{i} registered at r{home}, not at relay {relay}"));
        }
        for token in &acct.sessions {
            self.check_token(home, token);
        }
        // The same route World::account registered (same time, deterministic signature).
        let route = draft::route(
            NET,
            &acct.key.id(),
            &self.relay_str(home),
            1,
            self.w.clock(home),
        )
        .sign(&acct.key);
        self.acct_by_id.insert(acct.id(), i);
        self.sessions.insert((i, home), acct.sessions.clone());
        self.accts.push(acct);
        self.discoverable.push(discoverable);
        self.regs.push(vec![home]);
        self.routes.push(route);
        self.stats.accounts += 1;
    }

    /// The node of relay `relay` that serves account `acct` (the relay's own, unsharded).
    pub(crate) fn serving(&self, relay: usize, acct: usize) -> usize {
        let nodes = &self.nodes_of[relay];
        if nodes.len() == 1 {
            return nodes[0];
        }
        let id = self.w.nodes[nodes[0]].id.clone();
        match self.w.node_serving(&id, &self.accts[acct].id()) {
            Some(n) => n,
            None => self.fail(format!("no shard of relay {relay} serves a{acct}")),
        }
    }

    /// A session token of node `n` names its shard (a sharded relay's router reads it).
    pub(crate) fn check_token(&self, n: usize, token: &str) {
        let shard = self.w.nodes[n].config.shard;
        if shard.count > 1 && Shard::of_token(token, shard.count) != shard.index {
            self.fail(format!(
                "r{n} (shard {}/{}) gave the session token {token}, which names another shard",
                shard.index, shard.count
            ));
        }
    }

    /// route.publish of account `acct`'s highest route at relay `relay` (at the shard that
    /// serves the account, where a sharded relay's router sends it).
    pub(crate) fn publish(&mut self, acct: usize, relay: usize) {
        let n = self.serving(relay, acct);
        let mut p = Object::new();
        p.insert("route", self.routes[acct].clone());
        let r = self.client_call(n, &Caller::Anonymous, "route.publish", &p);
        if let Err(e) = r.result {
            self.fail(format!(
                "route.publish of account {acct} at relay {relay} (r{n}): {e:?}"
            ));
        }
    }

    /// A grant from `grantor` (the recipient) to `grantee` (the sender), made once.
    pub(crate) fn grant(&mut self, grantor: usize, grantee: usize) -> Object {
        if let Some(g) = self.grants.get(&(grantor, grantee)) {
            return g.clone();
        }
        let g = self.w.grant(&self.accts[grantor], &self.accts[grantee]);
        self.grants.insert((grantor, grantee), g.clone());
        g
    }

    // ---- The hosts ----
}
