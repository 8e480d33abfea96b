//! Home relay changes (protocol.md, "Home relay changes (account migration)"): an account
//! registered here becomes *former* when a valid route of higher revision naming another
//! relay arrives, is served again when a still higher one names this relay, and is
//! forgotten (but for its route) once every record and result promised for it expired.
//!
//! A former account keeps its account row (with [`Standing::Former`]), its device state
//! (frozen: every device change is refused), its timeline records and its `message.send`
//! results, each until its own expiry; nothing is copied or scanned at the move. What it
//! may still be asked is decided here: `session.open`, `message.delivery.status`,
//! `message.timeline.sync`, and a recognized `message.send` or `message.deliver` (answered
//! from the stored result before any of this is consulted). Everything else is
//! `not_home_relay` with the highest route held.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{AccountRec, RecordRec, RouteRec, SendRec, Standing};
use super::session::{Need, Session};
use super::storage::Storage;
use super::{Caller, Entropy};
use crate::Error;

/// Spacing of the checks of a former account that still holds something (so a tick whose
/// batch has not yet deleted an expired record does not look again at once).
const RECHECK_MS: u64 = 1_000;

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// A route of higher revision naming `relay` was stored for `account`: a registered
    /// account becomes former when it names another relay (rule 1), and is served again
    /// when it names this one (rule 4). Every route naming this relay begins a new home
    /// span at its `revision` (rule 6: the span is the revision of the route under which
    /// this relay serves the account now, so no session of an earlier span serves it again,
    /// also when this relay never learned of the move away in between).
    pub(crate) fn home_changed(
        &mut self,
        account: &str,
        relay: &str,
        revision: u64,
    ) -> Result<(), Error> {
        let Some(mut rec) = self.txn.get::<AccountRec>(&k::account(account))? else {
            return Ok(());
        };
        let here = relay == self.cfg.relay.as_str();
        let standing = match (here, rec.standing) {
            (true, _) => {
                rec.span = revision;
                Standing::Home
            }
            (false, Standing::Home) => Standing::Former { since: self.now },
            (false, Standing::Former { .. }) => return Ok(()),
        };
        rec.standing = standing;
        self.txn.put(k::account(account), &rec);
        if !here {
            // Rule 5, driven by the expiry index: nothing promised before the move outlives
            // its own expiry, and every promise is at most one retention long (a longer one
            // made under an earlier policy is found by `forget_former` and waited for).
            let at = self.now.saturating_add(self.cfg.policies.message_retention);
            self.expire_at(at, &k::account(account));
        }
        Ok(())
    }

    /// The caller's session, for a method only the account's home relay serves: a session
    /// of a former account is answered `not_home_relay` with the highest route held.
    pub(crate) fn home_session(&mut self, caller: &Caller, need: Need) -> Result<Session, Error> {
        let s = self.session(caller, need)?;
        let Some(acct) = self.home_account(&s.account)? else {
            return Err(self.not_home(&s.account));
        };
        self.in_span(&s, &acct)?;
        Ok(s)
    }

    /// Rule 6: a session belongs to the home span it was opened in. Once the account moved
    /// away it is a former account's session for good, so in a later span (a move back) its
    /// home methods are `not_home_relay` with the highest route held, as they were while
    /// the account was away; the client opens a new session.
    pub(crate) fn in_span(&mut self, s: &Session, served: &AccountRec) -> Result<(), Error> {
        if served.span != s.span {
            super::metrics::Counters::bump(&mut self.counts.home_spans, "old_session");
            return Err(self.not_home(&s.account));
        }
        Ok(())
    }

    /// The expiry entry of a former account came due (rule 5): if a timeline record or a
    /// `message.send` result of it is still kept, look again once that one expired;
    /// otherwise forget the account and its device state, keeping its highest route, which
    /// is answered with for `message_retention` more. An account served here again (rule 4)
    /// is left as it is.
    pub(crate) fn forget_former(&mut self, key: &[u8]) -> Result<(), Error> {
        let Some(account) = k::account_of(key).map(str::to_string) else {
            return Ok(());
        };
        let Some(rec) = self.txn.get::<AccountRec>(key)? else {
            return Ok(());
        };
        if rec.standing == Standing::Home {
            return Ok(());
        }
        if let Some(until) = self.still_promised(&account)? {
            let at = until
                .saturating_add(1)
                .max(self.now.saturating_add(RECHECK_MS));
            self.expire_at(at, key);
            return Ok(());
        }
        let prefix = k::devices(&account);
        for (device, _) in self
            .txn
            .scan(&prefix, &k::prefix_end(&prefix), usize::MAX)?
        {
            self.txn.delete(device);
        }
        self.txn.delete(key.to_vec());
        let count: u64 = self.txn.get(&k::account_count())?.unwrap_or(0);
        self.txn.put(k::account_count(), &count.saturating_sub(1));
        if let Some(mut route) = self.txn.get::<RouteRec>(&k::route(&account))? {
            route.touched_at = self.now;
            route.last_seq = rec.latest_seq;
            self.txn.put(k::route(&account), &route);
            let at = self.now.saturating_add(self.cfg.policies.message_retention);
            self.expire_at(at, &k::route(&account));
        }
        Ok(())
    }

    /// The expiry of one record or result still kept for `account` (the first found of
    /// each kind, one key read each), or `None` when nothing is kept.
    fn still_promised(&mut self, account: &str) -> Result<Option<u64>, Error> {
        let tl = k::timeline(account);
        if let Some((_, v)) = self.txn.scan(&tl, &k::prefix_end(&tl), 1)?.pop() {
            let until = serde_json::from_slice::<RecordRec>(&v).map_or(self.now, |r| r.expires_at);
            return Ok(Some(until));
        }
        let sent = k::sent_by(account);
        if let Some((_, v)) = self.txn.scan(&sent, &k::prefix_end(&sent), 1)?.pop() {
            let until = serde_json::from_slice::<SendRec>(&v).map_or(self.now, |r| r.retain_until);
            return Ok(Some(until));
        }
        Ok(None)
    }
}
