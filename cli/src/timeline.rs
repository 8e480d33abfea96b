//! Reading the account timeline: verify each entry end to end, decrypt it, print it.
//!
//! An entry is shown only after its envelope verifies under the entry's
//! device certificate, that certificate verifies under the sender's account
//! key (its account id) and was valid when the envelope was made, and the
//! entry's kind matches who sent it to whom. Anything else is printed as an
//! `UNVERIFIED` line and its content is not shown.

use crate::client::Client;
use crate::directory::CLOCK_TOLERANCE;
use crate::error::CliError;
use crate::transport::{Incoming, Ws, WsError};
use relay_core::client::{seal, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::identity::AccountId;
use relay_core::wire::json::{Object, Value};
use std::fmt;
use std::io::Write;
use std::time::Duration;

/// The page size asked for.
const PAGE: u64 = 100;

/// One timeline entry as shown.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub seq: u64,
    pub kind: String,
    /// The sender's account id (as the verified envelope says).
    pub from: String,
    /// The decrypted text, or why the entry is not shown.
    pub text: Result<String, String>,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.text {
            Ok(t) => write!(
                f,
                "{}  {}  {}  {}",
                self.seq,
                self.kind,
                self.from,
                printable(t)
            ),
            Err(why) => write!(
                f,
                "UNVERIFIED {}  {}  {}",
                self.seq,
                self.kind,
                printable(why)
            ),
        }
    }
}

/// The text with control characters escaped, so a message cannot drive the terminal.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Who is reading: enough to verify and decrypt entries.
pub struct Reader {
    pub network: String,
    pub me: AccountId,
    pub device: DeviceKey,
}

impl Reader {
    /// The reader for the client's device.
    pub fn of(client: &Client) -> Result<Reader, CliError> {
        Ok(Reader {
            network: client.profile.network.clone(),
            me: client.profile.account_id()?,
            device: client.profile.device_key()?,
        })
    }

    /// Verifies and decrypts one entry.
    pub fn open(&self, entry: &Object) -> Line {
        let seq = entry
            .get("seq")
            .and_then(Value::as_protocol_int)
            .unwrap_or(0);
        let kind = entry
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let mut from = String::from("?");
        let text = self.check(entry, &kind, &mut from);
        Line {
            seq,
            kind,
            from,
            text,
        }
    }

    fn check(&self, entry: &Object, kind: &str, from: &mut String) -> Result<String, String> {
        let member = |k: &str| {
            entry
                .get(k)
                .and_then(Value::as_object)
                .cloned()
                .ok_or_else(|| format!("entry has no {k}"))
        };
        let cert = DeviceCertificate::parse(member("device_certificate")?)
            .map_err(|e| format!("device_certificate: {e}"))?;
        cert.verify(&self.network)
            .map_err(|e| format!("device_certificate: {e}"))?;
        let env =
            MessageEnvelope::parse(member("envelope")?).map_err(|e| format!("envelope: {e}"))?;
        if env.network != self.network {
            return Err("envelope is for another network".into());
        }
        env.verify_with(&cert)
            .map_err(|e| format!("envelope: {e}"))?;
        cert.check_valid_at(env.created_at, CLOCK_TOLERANCE)
            .map_err(|e| format!("device_certificate: {e}"))?;
        *from = env.from.as_str().to_string();
        let consistent = match kind {
            "received" => env.to == self.me && env.from != self.me,
            "sent" => env.from == self.me && env.to != self.me,
            "self" => env.from == self.me && env.to == self.me,
            _ => false,
        };
        if !consistent {
            return Err(format!(
                "a {kind:?} entry from {} to {} is not for this account",
                env.from, env.to
            ));
        }
        let key = seal::open_key_box(&member("key_box")?, &self.device)
            .ok_or("the key box does not open for this device")?;
        let body = env.raw_body().ok_or("envelope has no body")?;
        let plain = seal::open_body(&body, &key).ok_or("the body does not decrypt")?;
        String::from_utf8(plain)
            .map_err(|e| format!("{} bytes that are not UTF-8 text", e.as_bytes().len()))
    }
}

/// Reads the body object of a parsed envelope.
trait RawBody {
    fn raw_body(&self) -> Option<Object>;
}

impl RawBody for MessageEnvelope {
    fn raw_body(&self) -> Option<Object> {
        use relay_core::wire::signature::SignedObject;
        self.raw().get("body").and_then(Value::as_object).cloned()
    }
}

/// One page of `message.timeline.sync`.
pub struct Page {
    pub entries: Vec<Object>,
    pub next: u64,
    pub has_more: bool,
}

impl Page {
    /// Reads a sync result.
    pub fn parse(o: &Object, after: u64) -> Result<Page, CliError> {
        let entries = match o.get("entries") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_object).cloned().collect(),
            _ => return Err(CliError::Invalid("sync answer has no entries".into())),
        };
        Ok(Page {
            entries,
            next: o
                .get("next")
                .and_then(Value::as_protocol_int)
                .unwrap_or(after)
                .max(after),
            has_more: matches!(o.get("has_more"), Some(Value::Bool(true))),
        })
    }
}

fn sync_params(after: u64) -> Vec<u8> {
    let mut p = Object::new();
    p.insert("after", after);
    p.insert("limit", PAGE);
    canonical::object_to_vec(&p)
}

/// Prints a page's lines and moves `relay`'s cursor in the profile; how many entries it had.
fn show(
    client: &mut Client,
    reader: &Reader,
    relay: &str,
    page: &Page,
    out: &mut dyn Write,
) -> Result<usize, CliError> {
    for e in &page.entries {
        let _ = writeln!(out, "{}", reader.open(e));
    }
    let _ = out.flush();
    let next = page.next;
    client.update(|p| p.advance_cursor(relay, next))?;
    Ok(page.entries.len())
}

/// Syncs the timeline `relay` holds for us over HTTP from `after` (default: that relay's
/// cursor); prints every entry, after `header` on stderr when there are any; how many.
fn sync_relay(
    client: &mut Client,
    reader: &Reader,
    relay: &str,
    after: Option<u64>,
    header: Option<&str>,
    out: &mut dyn Write,
) -> Result<usize, CliError> {
    let mut after = after.unwrap_or(client.profile.cursor_at(relay));
    let mut shown = 0;
    loop {
        let r = client.call_at(relay, "message.timeline.sync", &sync_params(after))?;
        let page = Page::parse(&r, after)?;
        if shown == 0 && !page.entries.is_empty() {
            if let Some(h) = header {
                let _ = out.flush();
                eprintln!("{h}");
            }
        }
        shown += show(client, reader, relay, &page, out)?;
        // `next` grows whenever `has_more` is set; the guard keeps a faulty relay from looping us.
        if !page.has_more || page.next <= after {
            return Ok(shown);
        }
        after = page.next;
    }
}

/// Why a former home's records were not read, for stderr.
fn former_home_problem(relay: &str, e: &CliError) -> String {
    match e {
        CliError::Relay(r) if r.code == "not_home_relay" => format!(
            "former home {relay} no longer answers for this account (not_home_relay): \
             the records it held are gone"
        ),
        CliError::Transport(t) => {
            format!("former home {relay} is unreachable ({t}); its records are skipped this time")
        }
        other => format!("former home {relay}: {other}; its records are skipped"),
    }
}

/// Reads the records each former home still holds (oldest home first, each from its own
/// cursor, or from `after`); a former home that forgot the account or cannot be reached is
/// reported on stderr and skipped. How many entries were shown.
pub fn sync_former(
    client: &mut Client,
    reader: &Reader,
    after: Option<u64>,
    out: &mut dyn Write,
) -> usize {
    let relays: Vec<String> = client
        .profile
        .former_homes
        .iter()
        .map(|f| f.relay.clone())
        .collect();
    let mut shown = 0;
    for relay in relays {
        let header = format!("records kept at former home {relay}:");
        match sync_relay(client, reader, &relay, after, Some(&header), out) {
            Ok(n) => shown += n,
            Err(e) => eprintln!("{}", former_home_problem(&relay, &e)),
        }
    }
    shown
}

/// One-shot sync over HTTP from `after` (default: each relay's cursor); prints every entry; how many.
///
/// The records still held at former homes come first, then the current home's.
pub fn sync(
    client: &mut Client,
    after: Option<u64>,
    out: &mut dyn Write,
) -> Result<usize, CliError> {
    let reader = Reader::of(client)?;
    let former = sync_former(client, &reader, after, out);
    let relay = client.profile.relay.clone();
    let header = (former > 0).then(|| format!("records at the home {relay}:"));
    Ok(former + sync_relay(client, &reader, &relay, after, header.as_deref(), out)?)
}

/// Syncs over an open socket from `after`; the new cursor and how many entries were shown.
fn sync_ws(
    client: &mut Client,
    reader: &Reader,
    relay: &str,
    ws: &mut Ws,
    mut after: u64,
    out: &mut dyn Write,
) -> Result<(u64, usize), WsError> {
    let mut shown = 0;
    loop {
        let r = ws.call("message.timeline.sync", &sync_params(after))?;
        let page = Page::parse(&r, after).map_err(|e| WsError::Closed(e.to_string()))?;
        shown +=
            show(client, reader, relay, &page, out).map_err(|e| WsError::Closed(e.to_string()))?;
        if !page.has_more || page.next <= after {
            return Ok((page.next.max(after), shown));
        }
        after = page.next;
    }
}

/// Follows the timeline over WebSocket: syncs, then syncs again on each change notification.
///
/// The records still held at former homes are read once first (over HTTP:
/// nothing new arrives there). Reconnects (with backoff) when the connection
/// drops and re-opens the session when the relay ends it (close 4401).
/// Returns after `count` entries when given, else runs until interrupted.
pub fn follow(
    client: &mut Client,
    from: Option<u64>,
    count: Option<usize>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let reader = Reader::of(client)?;
    let mut shown = sync_former(client, &reader, from, out);
    if count.is_some_and(|c| shown >= c) {
        return Ok(());
    }
    let mut after = from.unwrap_or(client.profile.cursor);
    let mut backoff = Duration::from_millis(500);
    let relay = client.profile.relay.clone();
    loop {
        let token = client.session()?;
        let mut ws = match Ws::connect(&relay, &token, Duration::from_secs(20)) {
            Ok(ws) => ws,
            Err(WsError::SessionEnded) => {
                client.open_session()?;
                continue;
            }
            Err(e) => {
                eprintln!("follow: {e:?}; reconnecting in {} ms", backoff.as_millis());
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        let mut want_sync = true;
        let ended = loop {
            if want_sync {
                match sync_ws(client, &reader, &relay, &mut ws, after, out) {
                    Ok((next, n)) => {
                        after = next;
                        shown += n;
                        want_sync = false;
                        backoff = Duration::from_millis(500);
                    }
                    Err(e) => break e,
                }
                if count.is_some_and(|c| shown >= c) {
                    ws.close();
                    return Ok(());
                }
            }
            match ws.next_incoming() {
                Ok(Incoming::Notification { method, params }) => {
                    let latest = params.get("latest_seq").and_then(Value::as_protocol_int);
                    if method == "message.timeline.changed" && latest.is_none_or(|l| l > after) {
                        want_sync = true;
                    }
                }
                Ok(Incoming::Idle) => {
                    if let Err(e) = ws.ping() {
                        break e;
                    }
                }
                Err(e) => break e,
            }
        };
        match ended {
            WsError::SessionEnded => {
                client.open_session()?;
            }
            WsError::Relay(e) if e.code == "unauthenticated" => {
                client.open_session()?;
            }
            WsError::Relay(e) => return Err(CliError::Relay(e)),
            WsError::Closed(m) => {
                eprintln!("follow: {m}; reconnecting in {} ms", backoff.as_millis());
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use relay_core::client::{draft, random_id, AccountKey};
    use relay_core::wire::json::Value;

    struct World {
        rng: rand_chacha::ChaCha20Rng,
        alice: AccountKey,
        alice_dev: DeviceKey,
        bob: AccountKey,
        bob_dev: DeviceKey,
    }

    fn world() -> World {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        World {
            alice: AccountKey::generate(&mut rng),
            alice_dev: DeviceKey::generate(&mut rng),
            bob: AccountKey::generate(&mut rng),
            bob_dev: DeviceKey::generate(&mut rng),
            rng,
        }
    }

    /// A received entry from alice to bob with `text`, as the relay would return it.
    fn entry(w: &mut World, text: &str) -> Object {
        let cert =
            draft::certificate("dev", &w.alice, &w.alice_dev, &["send"], 1_000).sign(&w.alice);
        let key = seal::message_key(&mut w.rng);
        let body = seal::seal_body(&mut w.rng, &key, text.as_bytes());
        let env = draft::envelope(
            "dev",
            &random_id(&mut w.rng),
            &w.alice.id(),
            &w.alice_dev.id(),
            &w.bob.id(),
            2_000,
            body,
        )
        .sign(&w.alice_dev);
        let kb = seal::seal_key_box(&mut w.rng, &w.bob_dev.id(), &w.bob_dev.box_key(), &key);
        let mut e = Object::new();
        e.insert("seq", 5u64);
        e.insert("kind", "received");
        e.insert("accepted_at", 2_001u64);
        e.insert("expires_at", 9_999u64);
        e.insert("envelope", env);
        e.insert("device_certificate", cert);
        e.insert("key_box", kb);
        e
    }

    fn bob_reader(w: &World) -> Reader {
        Reader {
            network: "dev".into(),
            me: w.bob.id(),
            device: w.bob_dev.clone(),
        }
    }

    fn set_in(e: &mut Object, member: &str, key: &str, v: impl Into<Value>) {
        let mut o = e.get(member).and_then(Value::as_object).cloned().unwrap();
        o.insert(key, v);
        e.insert(member, o);
    }

    #[test]
    fn a_valid_entry_is_decrypted_and_shown() {
        let mut w = world();
        let e = entry(&mut w, "hi\x1b[2J bob");
        let line = bob_reader(&w).open(&e);
        assert_eq!(line.text.as_deref(), Ok("hi\x1b[2J bob"));
        // Control characters never reach the terminal.
        assert_eq!(
            line.to_string(),
            format!("5  received  {}  hi\\u{{1b}}[2J bob", w.alice.id())
        );
    }

    #[test]
    fn a_tampered_envelope_is_unverified() {
        let mut w = world();
        let mut e = entry(&mut w, "hi");
        set_in(&mut e, "envelope", "created_at", 2_002u64);
        let line = bob_reader(&w).open(&e);
        assert!(
            line.text.as_ref().unwrap_err().contains("signature"),
            "{line}"
        );
        assert!(line.to_string().starts_with("UNVERIFIED 5  received"));
    }

    #[test]
    fn a_certificate_not_signed_by_the_sender_account_is_unverified() {
        let mut w = world();
        let mut e = entry(&mut w, "hi");
        // A certificate for alice's device, signed by someone else's account key.
        let mallory = AccountKey::generate(&mut w.rng);
        let forged =
            draft::certificate("dev", &w.alice, &w.alice_dev, &["send"], 1_000).sign(&mallory);
        e.insert("device_certificate", forged);
        let line = bob_reader(&w).open(&e);
        assert!(line.text.is_err(), "{line}");
        // A certificate of another device does not match the envelope.
        let mut e = entry(&mut w, "hi");
        let other = DeviceKey::generate(&mut w.rng);
        e.insert(
            "device_certificate",
            draft::certificate("dev", &w.alice, &other, &["send"], 1_000).sign(&w.alice),
        );
        assert!(bob_reader(&w).open(&e).text.is_err());
    }

    #[test]
    fn a_certificate_issued_after_the_envelope_is_unverified() {
        let mut w = world();
        let mut e = entry(&mut w, "hi");
        let late = draft::certificate(
            "dev",
            &w.alice,
            &w.alice_dev,
            &["send"],
            2_000 + CLOCK_TOLERANCE + 1,
        )
        .sign(&w.alice);
        e.insert("device_certificate", late);
        assert!(bob_reader(&w).open(&e).text.is_err());
    }

    #[test]
    fn an_entry_of_the_wrong_kind_or_for_someone_else_is_unverified() {
        let mut w = world();
        let mut e = entry(&mut w, "hi");
        e.insert("kind", "sent");
        assert!(bob_reader(&w).open(&e).text.is_err());
        // Alice reading bob's received entry: not for her account.
        let e = entry(&mut w, "hi");
        let alice = Reader {
            network: "dev".into(),
            me: w.alice.id(),
            device: w.alice_dev.clone(),
        };
        assert!(alice.open(&e).text.is_err());
    }

    #[test]
    fn a_key_box_for_another_device_or_a_tampered_body_is_unverified() {
        let mut w = world();
        let e = entry(&mut w, "hi");
        let other = Reader {
            network: "dev".into(),
            me: w.bob.id(),
            device: DeviceKey::generate(&mut w.rng),
        };
        assert!(other.open(&e).text.unwrap_err().contains("key box"));
        let mut e = entry(&mut w, "hi");
        set_in(
            &mut e,
            "key_box",
            "enc",
            relay_core::wire::base64url::encode(&[9u8; 32]),
        );
        assert!(bob_reader(&w).open(&e).text.is_err());
    }
}
