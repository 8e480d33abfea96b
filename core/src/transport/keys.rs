//! Other relays' published keys, as relay authentication needs them (protocol.md §6).
//!
//! The book remembers keys, when each relay's key was last fetched, which fetches failed
//! lately, and which are in flight. It decides when a fetch may start: at most one per
//! claimed relay per [`FETCH_INTERVAL`], a failure remembered for [`FETCH_NEGATIVE`], at
//! most [`FETCH_CONCURRENCY`] in flight in all. Time is the caller's `now` (ms), so the
//! book replays exactly. It lives in memory: a restarted relay fetches again.

use std::collections::HashMap;

/// A relay's key is fetched at most once per this many ms (a refresh after a failed
/// verification waits for it too).
pub const FETCH_INTERVAL: u64 = 10_000;
/// A failed fetch is remembered this many ms: requests naming that relay meanwhile are
/// refused without a fetch.
pub const FETCH_NEGATIVE: u64 = 60_000;
/// At most this many fetches in flight at once; beyond, a request is answered 503.
pub const FETCH_CONCURRENCY: usize = 8;
/// A fetch not reported within this many ms no longer counts as in flight.
pub const FETCH_ABANDONED: u64 = 30_000;
/// Each map holds at most this many relays; when full, what expired goes, else all of it.
const MEMORY: usize = 65_536;

/// What the book says about a relay's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The key to verify with.
    Key([u8; 32]),
    /// Start a fetch of the key (the book marks it in flight): the request waits for it.
    Fetch,
    /// A fetch of the key is in flight already: the request waits for that one.
    Wait,
    /// No key to use: the last fetch failed lately, or a refresh is not due yet.
    None,
    /// A fetch is needed and [`FETCH_CONCURRENCY`] are in flight.
    Busy,
    /// A fetch is needed (or in flight) but the request may not wait for one: it waited
    /// every round it gets, or the core holds as many waiting requests as it keeps.
    Exhausted,
}

/// The key book.
#[derive(Debug, Default)]
pub struct KeyBook {
    keys: HashMap<String, [u8; 32]>,
    /// When each relay's last fetch started.
    last: HashMap<String, u64>,
    /// Until when each relay's failure is remembered.
    failed: HashMap<String, u64>,
    /// Fetches in flight, by relay, with when they started.
    inflight: HashMap<String, u64>,
    /// Fetches started (metrics and tests).
    started: u64,
}

fn remember<V>(m: &mut HashMap<String, V>, k: &str, v: V, live: impl Fn(&V) -> bool) {
    if m.len() >= MEMORY && !m.contains_key(k) {
        m.retain(|_, v| live(v));
        if m.len() >= MEMORY {
            m.clear();
        }
    }
    m.insert(k.to_string(), v);
}

impl KeyBook {
    /// The key of `relay` at `now`; `refresh` asks for a newer one than the cached key (a
    /// signature did not verify under it); `may_wait`: the request can wait for a fetch. A
    /// `Fetch` answer marks the fetch in flight: one per relay, however many requests wait.
    pub fn lookup(&mut self, relay: &str, refresh: bool, may_wait: bool, now: u64) -> Lookup {
        self.inflight
            .retain(|_, since| now.saturating_sub(*since) < FETCH_ABANDONED);
        let cached = self.keys.get(relay).copied();
        if let (Some(k), false) = (cached, refresh) {
            return Lookup::Key(k);
        }
        if self.inflight.contains_key(relay) {
            return if may_wait {
                Lookup::Wait
            } else {
                Lookup::Exhausted
            };
        }
        if self.failed.get(relay).is_some_and(|until| *until > now) {
            return Lookup::None;
        }
        if self
            .last
            .get(relay)
            .is_some_and(|at| now.saturating_sub(*at) < FETCH_INTERVAL)
        {
            return Lookup::None;
        }
        if self.inflight.len() >= FETCH_CONCURRENCY {
            return Lookup::Busy;
        }
        if !may_wait {
            return Lookup::Exhausted;
        }
        remember(&mut self.last, relay, now, |at| {
            now.saturating_sub(*at) < FETCH_INTERVAL
        });
        self.inflight.insert(relay.to_string(), now);
        self.started += 1;
        Lookup::Fetch
    }

    /// Records what a fetch brought: the key, or a failure to remember.
    pub fn fetched(&mut self, relay: &str, key: Option<[u8; 32]>, now: u64) {
        self.inflight.remove(relay);
        match key {
            Some(k) => {
                remember(&mut self.keys, relay, k, |_| false);
                self.failed.remove(relay);
            }
            None => remember(&mut self.failed, relay, now + FETCH_NEGATIVE, |until| {
                *until > now
            }),
        }
    }

    /// Fetches started so far.
    pub fn fetches(&self) -> u64 {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_may_not_wait_starts_no_fetch_and_waits_for_none() {
        let mut b = KeyBook::default();
        assert_eq!(b.lookup(R, false, false, 0), Lookup::Exhausted);
        assert_eq!(b.fetches(), 0, "no fetch started, none left in flight");
        assert_eq!(b.lookup(R, false, true, 0), Lookup::Fetch);
        // In flight for another request: this one does not wait for it.
        assert_eq!(b.lookup(R, false, false, 1), Lookup::Exhausted);
        b.fetched(R, Some([7; 32]), 2);
        // A key it has is used on any round.
        assert_eq!(b.lookup(R, false, false, 3), Lookup::Key([7; 32]));
    }

    const R: &str = "https://r.example";

    #[test]
    fn one_fetch_then_the_cached_key() {
        let mut b = KeyBook::default();
        assert_eq!(b.lookup(R, false, true, 0), Lookup::Fetch);
        // A second request meanwhile waits for the same fetch.
        assert_eq!(b.lookup(R, false, true, 1), Lookup::Wait);
        assert_eq!(b.fetches(), 1);
        b.fetched(R, Some([7; 32]), 5);
        assert_eq!(b.lookup(R, false, true, 6), Lookup::Key([7; 32]));
    }

    #[test]
    fn a_refresh_waits_for_the_interval() {
        let mut b = KeyBook::default();
        b.lookup(R, false, true, 0);
        b.fetched(R, Some([7; 32]), 0);
        assert_eq!(b.lookup(R, true, true, FETCH_INTERVAL - 1), Lookup::None);
        assert_eq!(b.lookup(R, true, true, FETCH_INTERVAL), Lookup::Fetch);
    }

    #[test]
    fn failures_are_remembered() {
        let mut b = KeyBook::default();
        b.lookup(R, false, true, 0);
        b.fetched(R, None, 0);
        assert_eq!(b.lookup(R, false, true, FETCH_NEGATIVE - 1), Lookup::None);
        assert_eq!(b.lookup(R, false, true, FETCH_NEGATIVE), Lookup::Fetch);
        assert_eq!(b.fetches(), 2);
    }

    #[test]
    fn fetches_in_flight_are_capped_and_abandoned_ones_expire() {
        let mut b = KeyBook::default();
        for i in 0..FETCH_CONCURRENCY {
            assert_eq!(
                b.lookup(&format!("https://r{i}.example"), false, true, 0),
                Lookup::Fetch
            );
        }
        assert_eq!(
            b.lookup("https://late.example", false, true, 1),
            Lookup::Busy
        );
        assert_eq!(
            b.lookup("https://late.example", false, true, FETCH_ABANDONED),
            Lookup::Fetch
        );
    }
}
