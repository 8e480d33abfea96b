//! The delivery scheduler: the due index, each task's own backoff (exponential with full
//! jitter, floored and capped by policy), and the tick that runs what is due.

use super::context::Ctx;
use super::keyspace as k;
use super::metrics::Counters;
use super::records::{PeerRec, SweepRec, TaskRec, TaskState};
use super::storage::Storage;
use super::{Effect, Entropy};
use crate::wire::canonical;
use crate::wire::json::{Object, Value};
use crate::Error;

/// A task's place in the time indexes before a change: its due time, and whether it was
/// in its destination's retry index.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub next_at: u64,
    pub retry: bool,
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// Where a task stands in the indexes, taken before it changes (for [`Self::reindex`]).
    pub(crate) fn slot(&self, t: &TaskRec) -> Slot {
        Slot {
            next_at: t.next_at,
            retry: self.waits_for_retry(t),
        }
    }

    /// Whether the task waits for a retry at another relay (or a sibling shard): it is in
    /// that destination's retry index, whose first entry is the destination's next attempt.
    fn waits_for_retry(&self, t: &TaskRec) -> bool {
        t.state == TaskState::Waiting && t.attempt > 0 && !self.is_local(t)
    }

    /// Moves the task's due entry (and its destination's retry entry) from where `old` was
    /// to `t.next_at`, or removes them when it is done.
    pub(crate) fn reindex(&mut self, id: &str, old: Slot, t: &TaskRec) {
        self.txn.delete(k::due(old.next_at, id));
        if t.state != TaskState::Done {
            self.txn.put_raw(k::due(t.next_at, id), Vec::new());
        }
        if old.retry {
            self.txn.delete(k::retry_at(&t.target, old.next_at, id));
        }
        if self.waits_for_retry(t) {
            self.txn
                .put_raw(k::retry_at(&t.target, t.next_at, id), Vec::new());
        }
        self.rescheduled = true;
    }

    /// Backoff after the `failures`-th failure: full jitter in [retry_initial, min(retry_max, retry_initial * 2^(failures-1))].
    pub(crate) fn backoff(&mut self, failures: u32) -> Result<u64, Error> {
        let p = &self.cfg.policies;
        let (initial, max) = (
            p.retry_initial.max(1),
            p.retry_max.max(p.retry_initial.max(1)),
        );
        let window = initial
            .saturating_mul(1u64 << failures.saturating_sub(1).min(40))
            .min(max);
        let span = window - initial;
        let r = self.jitter()?;
        Ok(initial + if span == 0 { 0 } else { r % (span + 1) })
    }

    /// The next value of the seeded jitter generator kept in storage (SplitMix64).
    pub(crate) fn jitter(&mut self) -> Result<u64, Error> {
        let state: u64 = match self.txn.get::<u64>(&k::rng())? {
            Some(s) => s,
            None => u64::from_le_bytes(self.random::<8>()),
        };
        let next = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.txn.put(k::rng(), &next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    /// Schedules a retry after a failure, no earlier than `not_before`, never past the deadline.
    pub(crate) fn retry_later(&mut self, id: &str, mut t: TaskRec) -> Result<(), Error> {
        t.failures += 1;
        let wait = self.backoff(t.failures)?;
        self.retry_after(id, t, wait)
    }

    /// Schedules a retry `wait` from now, no earlier than `not_before`, never past the deadline.
    pub(crate) fn retry_after(&mut self, id: &str, mut t: TaskRec, wait: u64) -> Result<(), Error> {
        let old = self.slot(&t);
        let at = self
            .now
            .saturating_add(wait)
            .max(t.not_before)
            .min(t.deadline);
        t.state = TaskState::Waiting;
        t.next_at = at;
        if t.outage {
            self.txn.put_raw(k::outage(&t.target, id), Vec::new());
        }
        self.reindex(id, old, &t);
        self.save_task(id, &t);
        Ok(())
    }

    /// Runs what is due: expiry, attempts, attempt timeouts, deadlines.
    pub(crate) fn tick(&mut self) -> Result<(), Error> {
        let gc = self
            .txn
            .scan(&k::gc_prefix(), &k::gc_until(self.now), self.cfg.tick_batch)?;
        let route_prefix = k::route("");
        let account_prefix = k::account("");
        for (key, _) in gc {
            let target = k::gc_target(&key).map(<[u8]>::to_vec);
            self.txn.delete(key);
            self.rescheduled = true;
            let Some(target) = target else {
                continue;
            };
            if target.starts_with(&route_prefix) {
                self.expire_route(&target)?;
            } else if target.starts_with(&account_prefix) {
                // An account row is never simply deleted: this is a former home's check.
                self.forget_former(&target)?;
            } else if let Some((relay, _)) = k::by_destination_parts(&target) {
                // Only a failed delivery's listing expires: its destination keeps one fewer.
                let relay = relay.to_string();
                if let Some(mut peer) = self.txn.get::<PeerRec>(&k::destination(&relay))? {
                    peer.failed = peer.failed.saturating_sub(1);
                    self.save_peer(&relay, &peer);
                }
                self.txn.delete(target);
            } else {
                self.txn.delete(target);
            }
        }
        let revive = self.txn.scan(
            &k::revive_prefix(),
            &k::revive_until(self.now),
            self.cfg.tick_batch,
        )?;
        for (key, _) in revive {
            self.tick_entry = Some(key.clone());
            let relay = k::revive_relay(&key).map(str::to_string);
            self.txn.delete(key);
            self.rescheduled = true;
            if let Some(relay) = relay {
                self.revive_step(&relay)?;
            }
        }
        let due = self.txn.scan(
            &k::due_prefix(),
            &k::due_until(self.now),
            self.cfg.tick_batch,
        )?;
        for (key, _) in due {
            self.tick_entry = Some(key.clone());
            let id = k::due_task(&key).unwrap_or("").to_string();
            let Some(t) = self.txn.get::<TaskRec>(&k::task(&id))? else {
                self.txn.delete(key);
                self.rescheduled = true;
                continue;
            };
            if k::tail_number(&key[..key.len() - id.len() - 1]) != Some(t.next_at) {
                // A stale index entry (the task moved); drop it.
                self.txn.delete(key);
                self.rescheduled = true;
                continue;
            }
            match t.state {
                TaskState::Done => {}
                TaskState::InFlight => self.attempt_lost(&id, t, "timeout")?,
                TaskState::Parked => {
                    if self.now >= t.deadline {
                        self.txn.delete(k::parked(&t.target, t.park_order, &id));
                        self.txn
                            .delete(k::parked_for(&t.target, &t.to, t.park_order, &id));
                        self.deadline_exceeded(&id, t)?;
                    }
                }
                TaskState::Waiting => self.launch(&id, t)?,
            }
        }
        self.tick_entry = None;
        self.sweep_orphans()
    }

    /// An attempt in flight whose answer will not come: its timeout passed (counted as
    /// `timeout`), or the process that carried it is gone (`orphaned`). An unknown outcome,
    /// or the end if the deadline has passed.
    fn attempt_lost(&mut self, id: &str, t: TaskRec, counted: &'static str) -> Result<(), Error> {
        Counters::bump(&mut self.counts.attempts, counted);
        let target = t.target.clone();
        // An item riding in another's batch holds no slot of its own.
        if t.rides.is_none() {
            self.release_slot(&target)?;
        }
        let mut t = self.txn.get::<TaskRec>(&k::task(id))?.unwrap_or(t);
        t.carries = Vec::new();
        t.rides = None;
        if self.now >= t.deadline {
            t.last_error = Some("result_unknown".to_string());
            self.deadline_exceeded(id, t)
        } else {
            self.unknown(id, t)
        }
    }

    /// Attempts in flight that left before this process started (`Config::started_at`)
    /// were carried by a process that is gone, so no answer will come: each is an unknown
    /// outcome now, retried unchanged to the same target, rather than when its attempt
    /// timeout passes. Their due entries lie in (now, started_at + attempt_timeout]; each
    /// tick looks at one page of that window past a stored cursor (asking for another tick
    /// at once while some is left), so the work per tick stays bounded and the sweep ends.
    fn sweep_orphans(&mut self) -> Result<(), Error> {
        if self.orphans_swept {
            return Ok(());
        }
        let Some(started) = self.cfg.started_at else {
            self.orphans_swept = true;
            return Ok(());
        };
        let until = started.saturating_add(self.cfg.attempt_timeout);
        if self.now >= until {
            // Every such attempt's timeout has passed: the due entries above took them.
            self.orphans_swept = true;
            return Ok(());
        }
        let rec = self
            .txn
            .get::<SweepRec>(&k::orphan_sweep())?
            .filter(|r| r.started_at == started);
        if rec.as_ref().is_some_and(|r| r.done) {
            self.orphans_swept = true;
            return Ok(());
        }
        let mut from = k::due_until(self.now);
        if let Some(mut after) = rec.and_then(|r| r.after) {
            after.push(0);
            from = from.max(after);
        }
        let page = self
            .txn
            .scan(&from, &k::due_until(until), self.cfg.tick_batch)?;
        let done = page.len() < self.cfg.tick_batch;
        let after = page.last().map(|(key, _)| key.clone());
        for (key, _) in page {
            let Some(id) = k::due_task(&key).map(str::to_string) else {
                continue;
            };
            let Some(t) = self.txn.get::<TaskRec>(&k::task(&id))? else {
                continue;
            };
            if t.state == TaskState::InFlight
                && t.sent_at < started
                && k::index_time(&key) == Some(t.next_at)
            {
                self.tick_entry = Some(key);
                self.attempt_lost(&id, t, "orphaned")?;
            }
        }
        self.tick_entry = None;
        self.txn.put(
            k::orphan_sweep(),
            &SweepRec {
                started_at: started,
                after,
                done,
            },
        );
        if done {
            self.orphans_swept = true;
        } else {
            self.effects.push(Effect::WakeAt(self.now));
        }
        Ok(())
    }

    /// Sets aside an index entry a tick could not process: the entry leaves its index (so
    /// later ticks go on), and a quarantine record keeps it, with the error, for the operator.
    pub(crate) fn quarantine(&mut self, entry: &[u8], error: &Error) -> Result<Value, Error> {
        self.txn.delete(entry.to_vec());
        let mut rec = Object::new();
        rec.insert("entry", String::from_utf8_lossy(entry).into_owned());
        rec.insert("code", error.code.as_str());
        rec.insert("message", error.message.as_str());
        rec.insert("at", self.now);
        let value = Value::Object(rec);
        self.txn
            .put_raw(k::quarantine(entry), canonical::to_vec(&value));
        self.rescheduled = true;
        Ok(value)
    }
}
