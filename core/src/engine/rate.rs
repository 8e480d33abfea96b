//! Token-bucket rate limits (send_rate, deliver_rate), persisted so restarts do not refill them.

use super::context::Ctx;
use super::keyspace as k;
use super::records::BucketRec;
use super::storage::Storage;
use super::Entropy;
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};

const MINUTE: u128 = 60_000;

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// Takes one token from the bucket `kind/id` that refills `per_minute` tokens a minute (0: unlimited).
    pub(crate) fn take_token(
        &mut self,
        kind: &str,
        id: &str,
        per_minute: u64,
    ) -> Result<(), Error> {
        if per_minute == 0 {
            return Ok(());
        }
        let key = k::bucket(kind, id);
        let cap = per_minute as u128 * 1000;
        let mut b: BucketRec = self.txn.get(&key)?.unwrap_or(BucketRec {
            milli_tokens: cap as u64,
            updated_at: self.now,
        });
        let elapsed = self.now.saturating_sub(b.updated_at) as u128;
        let tokens = (b.milli_tokens as u128 + elapsed * cap / MINUTE).min(cap);
        if tokens < 1000 {
            let missing = 1000 - tokens;
            let retry_after = (missing * MINUTE).div_ceil(cap).max(1) as u64;
            let mut data = Object::new();
            data.insert("retry_after", retry_after);
            return Err(Error::new(
                ErrorCode::RateLimited,
                format!("{kind} rate limit of {per_minute} per minute reached"),
            )
            .with_data(Value::Object(data)));
        }
        b.milli_tokens = (tokens - 1000) as u64;
        b.updated_at = self.now.max(b.updated_at);
        self.txn.put(key, &b);
        Ok(())
    }
}
