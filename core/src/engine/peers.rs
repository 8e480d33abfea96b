//! The peer book: each destination's in-flight slots, pending count, failures and outages,
//! and the revival of its outage tasks in bounded steps when it shows it is back.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{PeerRec, TaskRec, TaskState};
use super::storage::Storage;
use super::{Effect, Entropy};
use crate::Error;

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// The book's record of destination `relay` (an empty one if it has none).
    pub(crate) fn peer(&mut self, relay: &str) -> Result<PeerRec, Error> {
        Ok(self.txn.get(&k::destination(relay))?.unwrap_or_default())
    }

    /// Writes destination `relay`'s record.
    pub(crate) fn save_peer(&mut self, relay: &str, p: &PeerRec) {
        self.txn.put(k::destination(relay), p);
    }

    /// Frees one in-flight slot at `relay` and starts the oldest parked task there.
    pub(crate) fn release_slot(&mut self, relay: &str) -> Result<(), Error> {
        let mut peer = self.peer(relay)?;
        peer.in_flight = peer.in_flight.saturating_sub(1);
        self.save_peer(relay, &peer);
        if !peer.paused {
            self.launch_parked(relay)?;
        }
        Ok(())
    }

    /// Launches the first delivery parked at `relay`, if any (it takes a free slot, with
    /// the deliveries that ride with it, or parks again): none when nothing was parked, else
    /// how many deliveries it started.
    pub(crate) fn launch_parked(&mut self, relay: &str) -> Result<Option<u64>, Error> {
        let prefix = k::parked_at(relay);
        let Some((key, _)) = self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), 1)?
            .into_iter()
            .next()
        else {
            return Ok(None);
        };
        self.txn.delete(key.clone());
        let id = k::parked_task(&key, relay).unwrap_or("").to_string();
        if let Some(t) = self.task_or_skip(&id)? {
            self.txn
                .delete(k::parked_for(relay, &t.to, t.park_order, &id));
            if t.state == TaskState::Parked {
                let before = self.effects.len();
                self.launch(&id, t)?;
                let started = self.effects[before..]
                    .iter()
                    .map(|e| match e {
                        Effect::Send { riders, .. } => 1 + riders.len() as u64,
                        _ => 0,
                    })
                    .sum();
                return Ok(Some(started));
            }
        }
        Ok(Some(0))
    }

    /// One more (or one fewer) delivery pending at the task's destination, for the operator,
    /// with its place in the destination's age index (`pending_since`).
    pub(crate) fn count_pending(&mut self, id: &str, t: &TaskRec, more: bool) -> Result<(), Error> {
        let relay = t.target.as_str();
        let mut p = self.peer(relay)?;
        let since = k::pending_since(relay, t.accepted_at, id);
        p.pending = if more {
            self.txn.put_raw(since, Vec::new());
            p.pending.saturating_add(1)
        } else {
            self.txn.delete(since);
            p.pending.saturating_sub(1)
        };
        self.save_peer(relay, &p);
        Ok(())
    }

    /// Counts a failure at a destination (for the operator, and to know when it is back).
    pub(crate) fn note_peer_failure(
        &mut self,
        relay: &str,
        code: &str,
        message: &str,
    ) -> Result<(), Error> {
        let mut p = self.peer(relay)?;
        if p.consecutive_failures == 0 {
            p.failing_since = Some(self.now);
        }
        p.consecutive_failures = p.consecutive_failures.saturating_add(1);
        p.last_error = Some(code.to_string());
        p.last_error_message = Some(message.to_string());
        self.save_peer(relay, &p);
        Ok(())
    }

    /// A destination showed it is alive: the first batch of its outage tasks comes forward.
    pub(crate) fn peer_is_back(&mut self, relay: &str) -> Result<(), Error> {
        let mut p = self.peer(relay)?;
        let was_down = p.consecutive_failures > 0;
        p.consecutive_failures = 0;
        p.failing_since = None;
        p.last_success_at = Some(self.now);
        if was_down {
            p.back_at = Some(self.now);
        }
        self.save_peer(relay, &p);
        if was_down {
            self.revive_step(relay)?;
        }
        Ok(())
    }

    /// Brings up to `revive_batch` of `relay`'s outage tasks forward to now (no earlier than
    /// their retry_after), and schedules the next step if more remain.
    pub(crate) fn revive_step(&mut self, relay: &str) -> Result<(), Error> {
        let prefix = k::outages_at(relay);
        let batch = self.cfg.revive_batch.max(1);
        let rows = self.txn.scan(&prefix, &k::prefix_end(&prefix), batch + 1)?;
        let more = rows.len() > batch;
        for (key, _) in rows.into_iter().take(batch) {
            self.txn.delete(key.clone());
            let Some(id) = k::outage_task(&key, relay).map(str::to_string) else {
                continue;
            };
            if let Some(mut t) = self.task_or_skip(&id)? {
                let at = self.now.max(t.not_before).min(t.deadline);
                if t.state == TaskState::Waiting && t.outage {
                    let old = self.slot(&t);
                    t.outage = false;
                    t.next_at = t.next_at.min(at);
                    self.reindex(&id, old, &t);
                    self.save_task(&id, &t);
                }
            }
        }
        if more {
            let at = self
                .now
                .saturating_add(self.cfg.policies.retry_initial.max(1));
            self.txn.put_raw(k::revive(at, relay), Vec::new());
            self.rescheduled = true;
        }
        Ok(())
    }
}
