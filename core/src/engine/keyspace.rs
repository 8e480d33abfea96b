//! The storage key layout: one prefix per record kind, times and sequences zero-padded so key order is time order.
//!
//! Ids in keys are base64url (no `/`), so `/` separates components safely.

/// Fixed-width decimal, so lexicographic order is numeric order.
fn pad(n: u64) -> String {
    format!("{n:020}")
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

/// Engine metadata: the jitter generator's state.
pub(crate) fn rng() -> Vec<u8> {
    b"meta/rng".to_vec()
}
/// An account served here.
pub(crate) fn account(account: &str) -> Vec<u8> {
    format!("acct/{account}").into_bytes()
}
/// The highest route held for any account.
pub(crate) fn route(account: &str) -> Vec<u8> {
    format!("route/{account}").into_bytes()
}
/// A registered or revoked device.
pub(crate) fn device(account: &str, device: &str) -> Vec<u8> {
    format!("dev/{account}/{device}").into_bytes()
}
pub(crate) fn devices(account: &str) -> Vec<u8> {
    format!("dev/{account}/").into_bytes()
}
/// A session, by the hash of its token.
pub(crate) fn session(token_hash: &str) -> Vec<u8> {
    format!("sess/{token_hash}").into_bytes()
}
/// Sessions of one device (for revocation).
pub(crate) fn device_session(account: &str, device: &str, token_hash: &str) -> Vec<u8> {
    format!("sessdev/{account}/{device}/{token_hash}").into_bytes()
}
pub(crate) fn device_sessions(account: &str, device: &str) -> Vec<u8> {
    format!("sessdev/{account}/{device}/").into_bytes()
}
/// A session.open nonce seen.
pub(crate) fn nonce(account: &str, device: &str, nonce: &str) -> Vec<u8> {
    format!("nonce/{account}/{device}/{nonce}").into_bytes()
}
/// A timeline record.
pub(crate) fn record(account: &str, seq: u64) -> Vec<u8> {
    format!("tl/{account}/{}", pad(seq)).into_bytes()
}
pub(crate) fn timeline(account: &str) -> Vec<u8> {
    format!("tl/{account}/").into_bytes()
}
/// The source's message.send result.
pub(crate) fn sent(from: &str, message_id: &str) -> Vec<u8> {
    format!("send/{from}/{message_id}").into_bytes()
}
/// The destination's message.deliver result.
pub(crate) fn received(from: &str, message_id: &str) -> Vec<u8> {
    format!("recv/{from}/{message_id}").into_bytes()
}
/// A delivery task.
pub(crate) fn task(task: &str) -> Vec<u8> {
    format!("task/{task}").into_bytes()
}
/// The due index: tasks by next attempt time.
pub(crate) fn due(at: u64, task: &str) -> Vec<u8> {
    format!("due/{}/{task}", pad(at)).into_bytes()
}
pub(crate) fn due_prefix() -> Vec<u8> {
    b"due/".to_vec()
}
pub(crate) fn due_until(at: u64) -> Vec<u8> {
    format!("due/{}/", pad(at.saturating_add(1))).into_bytes()
}
/// Per-destination index of unfinished and failed tasks.
pub(crate) fn by_destination(relay: &str, task: &str) -> Vec<u8> {
    format!("dest/{relay}\n{task}").into_bytes()
}
pub(crate) fn destination_tasks(relay: &str) -> Vec<u8> {
    format!("dest/{relay}\n").into_bytes()
}
pub(crate) fn all_destinations() -> Vec<u8> {
    b"dest/".to_vec()
}
/// Tasks waiting for an in-flight slot at a destination, in arrival order.
pub(crate) fn parked(relay: &str, order: u64, task: &str) -> Vec<u8> {
    format!("park/{relay}\n{}/{task}", pad(order)).into_bytes()
}
pub(crate) fn parked_at(relay: &str) -> Vec<u8> {
    format!("park/{relay}\n").into_bytes()
}
/// A destination's health.
pub(crate) fn destination(relay: &str) -> Vec<u8> {
    format!("peer/{relay}").into_bytes()
}
/// Garbage-collection index: what to delete at `at`.
pub(crate) fn gc(at: u64, key: &[u8]) -> Vec<u8> {
    let mut k = format!("gc/{}/", pad(at)).into_bytes();
    k.extend_from_slice(key);
    k
}
pub(crate) fn gc_prefix() -> Vec<u8> {
    b"gc/".to_vec()
}
pub(crate) fn gc_until(at: u64) -> Vec<u8> {
    format!("gc/{}/", pad(at.saturating_add(1))).into_bytes()
}
/// A revoked grant or invite of an account.
pub(crate) fn contact_revoked(account: &str, id: &str) -> Vec<u8> {
    format!("crev/{account}/{id}").into_bytes()
}
/// A distinct sender account that used an invite.
pub(crate) fn invite_use(issuer: &str, invite: &str, sender: &str) -> Vec<u8> {
    format!("iuse/{issuer}/{invite}/{sender}").into_bytes()
}
pub(crate) fn invite_uses(issuer: &str, invite: &str) -> Vec<u8> {
    format!("iuse/{issuer}/{invite}/").into_bytes()
}
/// A rate-limit bucket.
pub(crate) fn bucket(kind: &str, id: &str) -> Vec<u8> {
    format!("rate/{kind}/{id}").into_bytes()
}
/// A relay request nonce seen (replay protection).
pub(crate) fn relay_nonce(relay: &str, nonce: &str) -> Vec<u8> {
    format!("rnonce/{relay}\n{nonce}").into_bytes()
}
