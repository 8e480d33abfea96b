//! The storage key layout: one prefix per record kind, times and sequences zero-padded so key order is time order.
//!
//! Ids in keys are base64url (no `/`), so `/` separates components safely.

/// Fixed-width decimal, so lexicographic order is numeric order.
fn pad(n: u64) -> [u8; 20] {
    let mut digits = [b'0'; 20];
    let mut n = n;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    digits
}

/// A key of `parts` laid end to end, allocated once at its exact size.
///
/// Keys are built several dozen times per operation; `format!` cost about a
/// twelfth of a send's wasm time.
fn key(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

/// The text after `prefix`, when `key` starts with it and the rest is UTF-8.
fn rest<'k>(key: &'k [u8], prefix: &[u8]) -> Option<&'k str> {
    std::str::from_utf8(key.strip_prefix(prefix)?).ok()
}

/// The text after a fixed-width time component (`{prefix}{20 digits}/`).
fn after_time<'k>(key: &'k [u8], prefix: &[u8]) -> Option<&'k str> {
    let r = key.strip_prefix(prefix)?;
    let (digits, r) = r.split_at_checked(20)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(r.strip_prefix(b"/")?).ok()
}

/// Parses a padded number from the end of a key.
pub(crate) fn tail_number(key: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(key).ok()?;
    s.rsplit('/').next()?.parse().ok()
}

/// The end of a prefix range (every key that starts with `prefix` is below it).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    end.push(0xff);
    end
}

/// Engine metadata: the stored data's schema version.
pub(crate) fn schema() -> Vec<u8> {
    b"meta/schema".to_vec()
}
/// Engine metadata: which shard of how many this store is (`"index/count"`).
pub(crate) fn shard() -> Vec<u8> {
    b"meta/shard".to_vec()
}
/// Engine metadata: the jitter generator's state.
pub(crate) fn rng() -> Vec<u8> {
    b"meta/rng".to_vec()
}
/// Engine metadata: how far the sweep of attempts orphaned by a restart got ([`super::records::SweepRec`]).
pub(crate) fn orphan_sweep() -> Vec<u8> {
    b"meta/orphans".to_vec()
}
/// How many accounts were ever registered here (for `max_accounts`).
pub(crate) fn account_count() -> Vec<u8> {
    b"meta/accounts".to_vec()
}
/// An account registered here (served, or kept as a former home).
pub(crate) fn account(account: &str) -> Vec<u8> {
    key(&[b"acct/", account.as_bytes()])
}
/// The account of an [`account`] key.
pub(crate) fn account_of(key: &[u8]) -> Option<&str> {
    rest(key, b"acct/")
}
/// The highest route held for any account.
/// The account of a [`route`] key.
pub(crate) fn route_account(key: &[u8]) -> Option<&str> {
    rest(key, b"route/")
}
pub(crate) fn route(account: &str) -> Vec<u8> {
    key(&[b"route/", account.as_bytes()])
}
/// A registered or revoked device.
pub(crate) fn device(account: &str, device: &str) -> Vec<u8> {
    key(&[b"dev/", account.as_bytes(), b"/", device.as_bytes()])
}
/// The device of a [`device`] key of `account`.
pub(crate) fn device_of<'k>(key: &'k [u8], account: &str) -> Option<&'k str> {
    rest(key, &devices(account))
}
pub(crate) fn devices(account: &str) -> Vec<u8> {
    key(&[b"dev/", account.as_bytes(), b"/"])
}
/// A session, by the hash of its token.
pub(crate) fn session(token_hash: &str) -> Vec<u8> {
    key(&[b"sess/", token_hash.as_bytes()])
}
/// A session.open nonce seen.
pub(crate) fn nonce(account: &str, device: &str, nonce: &str) -> Vec<u8> {
    key(&[
        b"nonce/",
        account.as_bytes(),
        b"/",
        device.as_bytes(),
        b"/",
        nonce.as_bytes(),
    ])
}
/// A timeline record.
pub(crate) fn record(account: &str, seq: u64) -> Vec<u8> {
    key(&[b"tl/", account.as_bytes(), b"/", &pad(seq)])
}
pub(crate) fn timeline(account: &str) -> Vec<u8> {
    key(&[b"tl/", account.as_bytes(), b"/"])
}
/// The source's message.send result.
pub(crate) fn sent(from: &str, message_id: &str) -> Vec<u8> {
    key(&[b"send/", from.as_bytes(), b"/", message_id.as_bytes()])
}
/// Every message.send result of one sender.
pub(crate) fn sent_by(from: &str) -> Vec<u8> {
    key(&[b"send/", from.as_bytes(), b"/"])
}
/// The destination's message.deliver result.
pub(crate) fn received(from: &str, message_id: &str) -> Vec<u8> {
    key(&[b"recv/", from.as_bytes(), b"/", message_id.as_bytes()])
}
/// A delivery task.
pub(crate) fn task(task: &str) -> Vec<u8> {
    key(&[b"task/", task.as_bytes()])
}
/// The due index: tasks by next attempt time.
pub(crate) fn due(at: u64, task: &str) -> Vec<u8> {
    key(&[b"due/", &pad(at), b"/", task.as_bytes()])
}
/// The task of a [`due`] key.
pub(crate) fn due_task(key: &[u8]) -> Option<&str> {
    after_time(key, b"due/")
}
/// The time of an index key that starts with a fixed-width time (`due/`, `gc/`, `revive/`).
pub(crate) fn index_time(key: &[u8]) -> Option<u64> {
    let r = key.get(key.iter().position(|b| *b == b'/')? + 1..)?;
    let digits = r.get(..20)?;
    if !digits.iter().all(u8::is_ascii_digit) || r.get(20) != Some(&b'/') {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}
pub(crate) fn due_prefix() -> Vec<u8> {
    b"due/".to_vec()
}
pub(crate) fn due_until(at: u64) -> Vec<u8> {
    key(&[b"due/", &pad(at.saturating_add(1)), b"/"])
}
/// Per-destination index of unfinished and failed tasks.
pub(crate) fn by_destination(relay: &str, task: &str) -> Vec<u8> {
    key(&[b"dest/", relay.as_bytes(), b"\n", task.as_bytes()])
}
/// The destination and task of a [`by_destination`] key.
pub(crate) fn by_destination_parts(key: &[u8]) -> Option<(&str, &str)> {
    rest(key, b"dest/")?.split_once('\n')
}
pub(crate) fn destination_tasks(relay: &str) -> Vec<u8> {
    key(&[b"dest/", relay.as_bytes(), b"\n"])
}
pub(crate) fn all_destinations() -> Vec<u8> {
    b"dest/".to_vec()
}
/// Tasks waiting for an in-flight slot at a destination, in arrival order.
pub(crate) fn parked(relay: &str, order: u64, task: &str) -> Vec<u8> {
    key(&[
        b"park/",
        relay.as_bytes(),
        b"\n",
        &pad(order),
        b"/",
        task.as_bytes(),
    ])
}
/// The task of a [`parked`] key of `relay`.
pub(crate) fn parked_task<'k>(key: &'k [u8], relay: &str) -> Option<&'k str> {
    let r = key.strip_prefix(parked_at(relay).as_slice())?;
    let (digits, r) = r.split_at_checked(20)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(r.strip_prefix(b"/")?).ok()
}
pub(crate) fn parked_at(relay: &str) -> Vec<u8> {
    key(&[b"park/", relay.as_bytes(), b"\n"])
}
/// A parked task of `relay` for recipient `to`, in the same order as its [`parked`] entry:
/// what may ride behind another delivery to `to` in one batch.
pub(crate) fn parked_for(relay: &str, to: &str, order: u64, task: &str) -> Vec<u8> {
    key(&[
        b"parkto/",
        relay.as_bytes(),
        b"\n",
        to.as_bytes(),
        b"\n",
        &pad(order),
        b"/",
        task.as_bytes(),
    ])
}
/// The prefix of [`parked_for`] keys of `relay` and `to`.
pub(crate) fn parked_for_prefix(relay: &str, to: &str) -> Vec<u8> {
    key(&[b"parkto/", relay.as_bytes(), b"\n", to.as_bytes(), b"\n"])
}
/// The order and task of a [`parked_for`] key of `relay` and `to`.
pub(crate) fn parked_for_task<'k>(key: &'k [u8], relay: &str, to: &str) -> Option<(u64, &'k str)> {
    let r = key.strip_prefix(parked_for_prefix(relay, to).as_slice())?;
    let (digits, r) = r.split_at_checked(20)?;
    let order = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((order, std::str::from_utf8(r.strip_prefix(b"/")?).ok()?))
}
/// A task of `relay` waiting for its retry at `at` (for the destination's next attempt).
pub(crate) fn retry_at(relay: &str, at: u64, task: &str) -> Vec<u8> {
    key(&[
        b"retry/",
        relay.as_bytes(),
        b"\n",
        &pad(at),
        b"/",
        task.as_bytes(),
    ])
}
/// Every [`retry_at`] key of `relay`, earliest first.
pub(crate) fn retries_of(relay: &str) -> Vec<u8> {
    key(&[b"retry/", relay.as_bytes(), b"\n"])
}
/// A task of `relay` not yet ended, accepted at `at` (for the age of its oldest).
pub(crate) fn pending_since(relay: &str, at: u64, task: &str) -> Vec<u8> {
    key(&[
        b"since/",
        relay.as_bytes(),
        b"\n",
        &pad(at),
        b"/",
        task.as_bytes(),
    ])
}
/// Every [`pending_since`] key of `relay`, oldest first.
pub(crate) fn pending_of(relay: &str) -> Vec<u8> {
    key(&[b"since/", relay.as_bytes(), b"\n"])
}
/// The time of a [`retry_at`] or [`pending_since`] key under `prefix` (its relay's).
pub(crate) fn time_under(key: &[u8], prefix: &[u8]) -> Option<u64> {
    let digits = key.strip_prefix(prefix)?.get(..20)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}
/// A waiting task whose last failure was an outage (not attempted, unknown) at `relay`:
/// the tasks brought forward when the destination is back.
pub(crate) fn outage(relay: &str, task: &str) -> Vec<u8> {
    key(&[b"outage/", relay.as_bytes(), b"\n", task.as_bytes()])
}
/// The task of an [`outage`] key of `relay`.
pub(crate) fn outage_task<'k>(key: &'k [u8], relay: &str) -> Option<&'k str> {
    rest(key, &outages_at(relay))
}
pub(crate) fn outages_at(relay: &str) -> Vec<u8> {
    key(&[b"outage/", relay.as_bytes(), b"\n"])
}
/// The next step of bringing a destination's outage tasks forward, at `at`.
pub(crate) fn revive(at: u64, relay: &str) -> Vec<u8> {
    key(&[b"revive/", &pad(at), b"/", relay.as_bytes()])
}
/// The relay of a [`revive`] key.
pub(crate) fn revive_relay(key: &[u8]) -> Option<&str> {
    after_time(key, b"revive/")
}
pub(crate) fn revive_prefix() -> Vec<u8> {
    b"revive/".to_vec()
}
pub(crate) fn revive_until(at: u64) -> Vec<u8> {
    key(&[b"revive/", &pad(at.saturating_add(1)), b"/"])
}
/// An index entry a tick could not process, set aside for the operator.
pub(crate) fn quarantine(entry: &[u8]) -> Vec<u8> {
    key(&[b"quarantine/", entry])
}
pub(crate) fn quarantine_prefix() -> Vec<u8> {
    b"quarantine/".to_vec()
}
/// A destination's health.
pub(crate) fn destination(relay: &str) -> Vec<u8> {
    key(&[b"peer/", relay.as_bytes()])
}
/// The relay of a [`destination`] key.
pub(crate) fn destination_relay(key: &[u8]) -> Option<&str> {
    rest(key, b"peer/")
}
/// Every destination's health.
pub(crate) fn all_peers() -> Vec<u8> {
    b"peer/".to_vec()
}
/// Garbage-collection index: what to delete at `at`.
pub(crate) fn gc(at: u64, key: &[u8]) -> Vec<u8> {
    self::key(&[b"gc/", &pad(at), b"/", key])
}
/// The key a [`gc`] entry deletes.
pub(crate) fn gc_target(key: &[u8]) -> Option<&[u8]> {
    let r = key.strip_prefix(b"gc/")?;
    let (digits, r) = r.split_at_checked(20)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    r.strip_prefix(b"/")
}
pub(crate) fn gc_prefix() -> Vec<u8> {
    b"gc/".to_vec()
}
pub(crate) fn gc_until(at: u64) -> Vec<u8> {
    key(&[b"gc/", &pad(at.saturating_add(1)), b"/"])
}
/// A revoked grant or invite of an account.
pub(crate) fn contact_revoked(account: &str, id: &str) -> Vec<u8> {
    key(&[b"crev/", account.as_bytes(), b"/", id.as_bytes()])
}
/// A distinct sender account that used an invite.
pub(crate) fn invite_use(issuer: &str, invite: &str, sender: &str) -> Vec<u8> {
    key(&[
        b"iuse/",
        issuer.as_bytes(),
        b"/",
        invite.as_bytes(),
        b"/",
        sender.as_bytes(),
    ])
}
pub(crate) fn invite_uses(issuer: &str, invite: &str) -> Vec<u8> {
    key(&[b"iuse/", issuer.as_bytes(), b"/", invite.as_bytes(), b"/"])
}
/// A rate-limit bucket.
pub(crate) fn bucket(kind: &str, id: &str) -> Vec<u8> {
    key(&[b"rate/", kind.as_bytes(), b"/", id.as_bytes()])
}
/// A relay request nonce seen (replay protection).
pub(crate) fn relay_nonce(relay: &str, nonce: &str) -> Vec<u8> {
    key(&[b"rnonce/", relay.as_bytes(), b"\n", nonce.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decoder_reads_what_its_encoder_wrote_and_nothing_else() {
        let (acc, dev, relay, task) = ("acc", "dev", "https://r.example:8443", "task-1");
        assert_eq!(route_account(&route(acc)), Some(acc));
        assert_eq!(device_of(&device(acc, dev), acc), Some(dev));
        assert_eq!(device_of(&device(acc, dev), "other"), None);
        assert_eq!(
            by_destination_parts(&by_destination(relay, task)),
            Some((relay, task))
        );
        assert_eq!(outage_task(&outage(relay, task), relay), Some(task));
        assert_eq!(revive_relay(&revive(1_700_000_000_000, relay)), Some(relay));
        assert_eq!(destination_relay(&destination(relay)), Some(relay));
        let target = route(acc);
        assert_eq!(gc_target(&gc(42, &target)), Some(target.as_slice()));
        // Keys of another kind, or cut short, decode to nothing.
        assert_eq!(route_account(&destination(relay)), None);
        assert_eq!(revive_relay(b"revive/123/x"), None);
        assert_eq!(gc_target(b"gc/0000"), None);
        assert_eq!(by_destination_parts(b"dest/no-separator"), None);
    }

    #[test]
    fn pad_is_twenty_digit_decimal() {
        for n in [0, 1, 9, 10, 1_700_000_000_000, u64::MAX / 3, u64::MAX] {
            assert_eq!(pad(n).as_slice(), format!("{n:020}").as_bytes());
        }
    }

    #[test]
    fn keys_keep_the_stored_layout() {
        // Stores written before keys were built without `format!` must still be read.
        assert_eq!(account("a"), b"acct/a");
        assert_eq!(device("a", "d"), b"dev/a/d");
        assert_eq!(record("a", 7), b"tl/a/00000000000000000007");
        assert_eq!(due(12, "t.m"), b"due/00000000000000000012/t.m");
        assert_eq!(due_until(12), b"due/00000000000000000013/");
        assert_eq!(by_destination("http://r", "t"), b"dest/http://r\nt");
        assert_eq!(
            parked("http://r", 3, "t"),
            b"park/http://r\n00000000000000000003/t"
        );
        assert_eq!(gc(5, b"send/a/m"), b"gc/00000000000000000005/send/a/m");
        assert_eq!(gc_until(5), b"gc/00000000000000000006/");
        assert_eq!(relay_nonce("http://r", "n"), b"rnonce/http://r\nn");
        assert_eq!(outage("http://r", "t"), b"outage/http://r\nt");
        assert_eq!(
            revive(5, "http://r"),
            b"revive/00000000000000000005/http://r"
        );
        assert_eq!(invite_use("i", "v", "s"), b"iuse/i/v/s");
        assert_eq!(tail_number(&record("a", 42)), Some(42));
    }
}
