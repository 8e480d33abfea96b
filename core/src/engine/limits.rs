//! Request rate limits held in the engine's memory, keyed by a caller's network address or account.
//!
//! The per-account `send` and `deliver` buckets are stored (a restart must not
//! refill what admits messages). These limits guard requests that otherwise
//! write little or nothing, so a stored bucket would add a commit to a read:
//! they live in memory, bounded in size, and a restart refills them. Given the
//! same inputs they decide the same, like everything in the engine.

use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};
use std::collections::HashMap;
use std::net::IpAddr;

const MINUTE: u128 = 60_000;

/// Most buckets held at once; beyond it idle ones go first, then the least recently used.
pub const MAX_BUCKETS: usize = 65_536;

/// One token bucket, in thousandths of a token.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli_tokens: u128,
    updated_at: u64,
    cap: u128,
}

impl Bucket {
    fn level(&self, now: u64) -> u128 {
        let elapsed = now.saturating_sub(self.updated_at) as u128;
        (self.milli_tokens + elapsed * self.cap / MINUTE).min(self.cap)
    }
}

/// Token buckets by key (`kind/id`), at most [`MAX_BUCKETS`] of them.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    buckets: HashMap<String, Bucket>,
}

impl Limiter {
    /// Takes a token from the bucket `kind/id` refilling `per_minute` a minute (0: unlimited).
    pub(crate) fn take(
        &mut self,
        kind: &str,
        id: &str,
        per_minute: u64,
        now: u64,
    ) -> Result<(), Error> {
        if per_minute == 0 {
            return Ok(());
        }
        let cap = per_minute as u128 * 1000;
        let key = format!("{kind}/{id}");
        if !self.buckets.contains_key(&key) && self.buckets.len() >= MAX_BUCKETS {
            self.evict(now);
        }
        let b = self.buckets.entry(key).or_insert(Bucket {
            milli_tokens: cap,
            updated_at: now,
            cap,
        });
        b.cap = cap;
        let tokens = b.level(now);
        if tokens < 1000 {
            let retry_after = ((1000 - tokens) * MINUTE).div_ceil(cap).max(1) as u64;
            return Err(rate_limited(kind, per_minute, retry_after));
        }
        b.milli_tokens = tokens - 1000;
        b.updated_at = now.max(b.updated_at);
        Ok(())
    }

    /// Makes room: drops every full bucket (forgetting it changes nothing), and if that
    /// frees less than an eighth, the least recently used eighth.
    fn evict(&mut self, now: u64) {
        self.buckets.retain(|_, b| b.level(now) < b.cap);
        let target = MAX_BUCKETS - MAX_BUCKETS / 8;
        if self.buckets.len() > target {
            let mut times: Vec<u64> = self.buckets.values().map(|b| b.updated_at).collect();
            let cut = self.buckets.len() - target;
            times.select_nth_unstable(cut);
            let threshold = times[cut];
            self.buckets.retain(|_, b| b.updated_at >= threshold);
        }
    }

    /// How many buckets are held (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

/// A `rate_limited` error carrying `data.retry_after`.
pub(crate) fn rate_limited(kind: &str, per_minute: u64, retry_after: u64) -> Error {
    let mut data = Object::new();
    data.insert("retry_after", retry_after);
    Error::new(
        ErrorCode::RateLimited,
        format!("{kind} rate limit of {per_minute} per minute reached"),
    )
    .with_data(Value::Object(data))
}

/// The key a network address is limited by: an IPv4 address, or an IPv6 address's /64
/// (one host is commonly given a whole /64); IPv4-mapped IPv6 counts as its IPv4 address.
/// Anything that is not an IP address (a host's own label) is used as it is.
pub fn origin_key(addr: &str) -> String {
    let trimmed = addr.trim().trim_start_matches('[').trim_end_matches(']');
    match trimmed.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Err(_) => trimmed.chars().take(64).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_rate_and_refills_with_time() {
        let mut l = Limiter::default();
        for _ in 0..3 {
            l.take("addr", "a", 3, 0).expect("within rate");
        }
        let e = l
            .take("addr", "a", 3, 0)
            .expect_err("fourth in the same instant");
        assert_eq!(e.code, ErrorCode::RateLimited);
        l.take("addr", "b", 3, 0)
            .expect("another key has its own bucket");
        l.take("addr", "a", 3, 20_000)
            .expect("a token refilled after 20 s");
    }

    #[test]
    fn the_bucket_table_stays_bounded() {
        let mut l = Limiter::default();
        for i in 0..(MAX_BUCKETS + 10) {
            l.take("addr", &i.to_string(), 1, i as u64)
                .expect("fresh key");
        }
        assert!(l.len() <= MAX_BUCKETS, "{}", l.len());
    }

    #[test]
    fn addresses_are_keyed_by_ipv4_or_ipv6_slash_64() {
        assert_eq!(origin_key("192.0.2.7"), "192.0.2.7");
        assert_eq!(origin_key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(origin_key("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
        assert_eq!(origin_key("[2001:db8:1:2::9]"), "2001:db8:1:2::/64");
    }
}
