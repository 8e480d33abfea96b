//! Accounts sharded over engines: which engine of a relay serves which account, and the
//! memory of routes learned from sibling shards.
//!
//! A relay may run as `count` engines (Durable Objects on the edge, threads in the wasmtime
//! host), each with storage of its own. An account belongs to exactly one shard, chosen by
//! a stable hash of its id, so every record of an account (sessions, devices, timeline,
//! idempotency keys, grants) lives in one store and every rule that reads them runs in one
//! transaction, exactly as in a relay of one shard.
//!
//! Delivery between accounts of different shards is relay RPC to this same relay: the
//! source shard signs `message.deliver` as it would for another relay, and the host hands it
//! to the target shard's engine (an internal call, [`Effect::Send`] with a shard) instead of
//! the network. The target runs the full receiving path; idempotency, deadlines, retries and
//! exactly-once in the timeline hold because they hold between relays.
//!
//! [`Effect::Send`]: super::Effect::Send

use crate::wire::digest;
use crate::wire::json::Object;
use std::collections::HashMap;

/// Where an engine sits among the shards of its relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// This engine's shard, `0..count`.
    pub index: u32,
    /// How many shards the relay has (fixed at its first start).
    pub count: u32,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard::SINGLE
    }
}

impl Shard {
    /// The relay of one shard (every host's default).
    pub const SINGLE: Shard = Shard { index: 0, count: 1 };

    /// Most shards a relay may have.
    pub const MAX_COUNT: u32 = 1024;

    /// Shard `index` of `count`, checked.
    pub fn new(index: u32, count: u32) -> Result<Shard, String> {
        if count == 0 || count > Shard::MAX_COUNT {
            return Err(format!(
                "the shard count must be 1 to {}, not {count}",
                Shard::MAX_COUNT
            ));
        }
        if index >= count {
            return Err(format!(
                "shard index {index} is not below the count {count}"
            ));
        }
        Ok(Shard { index, count })
    }

    /// The shard serving `account` among `count`: the first 8 bytes of SHA-256 of the
    /// account id, big-endian, modulo `count` (stable across hosts, versions and restarts).
    pub fn of_account(account: &str, count: u32) -> u32 {
        if count <= 1 {
            return 0;
        }
        let h = digest::sha256(account.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&h[..8]);
        (u64::from_be_bytes(first) % u64::from(count)) as u32
    }

    /// Whether this shard serves `account`.
    pub fn owns(&self, account: &str) -> bool {
        Shard::of_account(account, self.count) == self.index
    }

    /// The sibling shard serving `account`, when it is not this one.
    pub fn sibling_of(&self, account: &str) -> Option<u32> {
        let s = Shard::of_account(account, self.count);
        (s != self.index).then_some(s)
    }

    /// A session token's shard prefix (`"{index}."`; none for a relay of one shard, whose
    /// tokens stay as they always were), so a router finds a session's shard unparsed.
    pub fn token_prefix(&self) -> Option<String> {
        (self.count > 1).then(|| format!("{}.", self.index))
    }

    /// The shard a session token names (0 when it names none or one out of range).
    pub fn of_token(token: &str, count: u32) -> u32 {
        if count <= 1 {
            return 0;
        }
        let Some((head, _)) = token.split_once('.') else {
            return 0;
        };
        match head.parse::<u32>() {
            Ok(i) if i < count && head.len() <= 4 && !head.starts_with('+') => i,
            _ => 0,
        }
    }

    /// The value kept in the store's metadata: `"{index}/{count}"`.
    pub(crate) fn to_meta(self) -> String {
        format!("{}/{}", self.index, self.count)
    }

    /// The inverse of [`Shard::to_meta`].
    pub(crate) fn from_meta(s: &str) -> Option<Shard> {
        let (i, n) = s.split_once('/')?;
        Shard::new(i.parse().ok()?, n.parse().ok()?).ok()
    }
}

/// What a sibling shard said of an account's route (`route.get` there).
#[derive(Clone, Debug, PartialEq)]
pub enum SiblingRoute {
    /// Its route object, to verify and hold as if the client had passed it.
    Route(Object),
    /// The sibling holds no route for it (`not_found`).
    Absent,
    /// The sibling could not be asked, or answered with another error.
    Failed,
}

/// Routes fetched from sibling shards for sends waiting on them, and the one the last
/// operation asked for. Each answer is taken by the operation that resubmits the request,
/// within [`Siblings::FRESH_MS`] of the ask; answers nobody asked for are dropped.
#[derive(Debug, Default)]
pub struct Siblings {
    /// Answers, with the time the operation that wanted them asked.
    fetched: HashMap<String, (SiblingRoute, u64)>,
    /// Accounts asked for and not yet answered, with the time of the ask.
    asked: HashMap<String, u64>,
    wanted: Option<String>,
}

impl Siblings {
    /// Most answers (and asks) held before the host resubmits their requests (a host that
    /// never resubmits cannot grow this past it).
    const CAP: usize = 4096;

    /// How long an answer stands for the request that asked: a resubmission comes at once,
    /// and a later send must not take an old answer (an account registered meanwhile).
    pub const FRESH_MS: u64 = 10_000;

    /// Remembers a sibling's answer for `account`, if an operation asked for it.
    pub(crate) fn put(&mut self, account: &str, route: SiblingRoute) {
        let Some(asked) = self.asked.remove(account) else {
            return;
        };
        if self.fetched.len() >= Siblings::CAP {
            self.fetched.clear();
        }
        self.fetched.insert(account.to_string(), (route, asked));
    }

    /// Takes the answer held for `account`, unless it is older than [`Siblings::FRESH_MS`].
    pub(crate) fn take(&mut self, account: &str, now: u64) -> Option<SiblingRoute> {
        let (route, asked) = self.fetched.remove(account)?;
        (now <= asked.saturating_add(Siblings::FRESH_MS)).then_some(route)
    }

    /// Records that the operation in progress (at `now`) needs `account`'s route from its shard.
    pub(crate) fn want(&mut self, account: &str, now: u64) {
        if self.asked.len() >= Siblings::CAP {
            self.asked.clear();
        }
        self.asked.insert(account.to_string(), now);
        self.wanted = Some(account.to_string());
    }

    /// The account whose route the last operation needed, once.
    pub(crate) fn take_wanted(&mut self) -> Option<String> {
        self.wanted.take()
    }

    /// Whether an operation is waiting for a route (its error is not a real rejection).
    pub(crate) fn is_wanting(&self) -> bool {
        self.wanted.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_serves_everything_and_keeps_plain_tokens() {
        assert_eq!(Shard::of_account("anything", 1), 0);
        assert!(Shard::SINGLE.owns("anything"));
        assert_eq!(Shard::SINGLE.token_prefix(), None);
        assert_eq!(Shard::of_token("3.abc", 1), 0);
    }

    #[test]
    fn the_hash_is_stable_and_spreads_accounts() {
        // Fixed values: a change of the hash would move every account of a sharded relay.
        let a = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        let h = digest::sha256(a.as_bytes());
        let want = (u64::from_be_bytes(h[..8].try_into().unwrap()) % 4) as u32;
        assert_eq!(Shard::of_account(a, 4), want);
        let mut seen = [0u32; 4];
        for i in 0..400 {
            seen[Shard::of_account(&format!("account-{i}"), 4) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "uneven spread {seen:?}");
    }

    #[test]
    fn tokens_name_their_shard_and_junk_names_shard_zero() {
        let s = Shard::new(2, 4).unwrap();
        let t = format!("{}secret", s.token_prefix().unwrap());
        assert_eq!(Shard::of_token(&t, 4), 2);
        for junk in ["secret", "9.x", "+1.x", "-1.x", ".x", "00001.x", "1x.y"] {
            assert_eq!(Shard::of_token(junk, 4), 0, "{junk}");
        }
    }

    #[test]
    fn an_answer_stands_only_for_an_ask_and_only_while_fresh() {
        let r = SiblingRoute::Absent;
        let mut s = Siblings::default();
        // Nobody asked: dropped.
        s.put("a", r.clone());
        assert_eq!(s.take("a", 0), None);
        s.want("a", 100);
        assert_eq!(s.take_wanted().as_deref(), Some("a"));
        s.put("a", r.clone());
        assert_eq!(s.take("a", 100 + Siblings::FRESH_MS), Some(r.clone()));
        assert_eq!(s.take("a", 100), None, "taken once");
        // An answer left over (its call failed before taking it) goes stale.
        s.want("b", 100);
        s.put("b", r);
        assert_eq!(s.take("b", 101 + Siblings::FRESH_MS), None);
    }

    #[test]
    fn counts_and_indexes_are_checked_and_kept() {
        assert!(Shard::new(0, 0).is_err());
        assert!(Shard::new(4, 4).is_err());
        assert!(Shard::new(0, Shard::MAX_COUNT + 1).is_err());
        let s = Shard::new(3, 8).unwrap();
        assert_eq!(Shard::from_meta(&s.to_meta()), Some(s));
        assert_eq!(Shard::from_meta("3/2"), None);
    }
}
