//! The local profile: one device's keys, its relay, session, contacts, outbox and timeline cursor.
//!
//! After `relayctl account move` it also lists the account's former home
//! relays, each with its own session and timeline cursor: a former home keeps
//! answering for what it accepted before the move (status, retries, records).
//!
//! A JSON file (default `$RELAYCTL_PROFILE`, else `./relayctl.json`), mode
//! 0600 because it holds secret keys (base64url seeds). Protocol objects are
//! kept as their canonical JSON text, so what was signed or sent is kept
//! byte for byte. Every change goes through [`Store::update`], which holds
//! an exclusive lock and re-reads the file, so `relayctl follow` updating the
//! cursor and `relayctl send` adding to the outbox do not lose each other's
//! writes.

use crate::error::CliError;
use crate::outbox::OutboxEntry;
use relay_core::client::{AccountKey, DeviceKey};
use relay_core::wire::base64url;
use relay_core::wire::identity::{AccountId, DeviceId};
use relay_core::wire::json::{self, Object};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The profile format version written by this relayctl.
pub const VERSION: u32 = 1;

/// Everything relayctl keeps about one device of one account.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    pub version: u32,
    pub network: String,
    /// The home relay's id (also the base URL requests go to).
    pub relay: String,
    /// The account key's 32-byte seed, base64url.
    pub account_key: String,
    /// The device's Ed25519 seed, base64url.
    pub device_signing_key: String,
    /// The device's X25519 secret, base64url.
    pub device_box_key: String,
    /// This device's certificate (canonical JSON).
    pub certificate: String,
    /// The account's current route (canonical JSON).
    pub route: String,
    pub discoverable: bool,
    /// Whether `account.register` (or `device.register`) succeeded.
    pub registered: bool,
    #[serde(default)]
    pub session: Option<Session>,
    /// The highest timeline sequence already shown.
    #[serde(default)]
    pub cursor: u64,
    /// What this device knows of other accounts, by account id.
    #[serde(default)]
    pub contacts: BTreeMap<String, Contact>,
    /// Sent requests by message id, kept so a retry re-sends the very same bytes.
    #[serde(default)]
    pub outbox: BTreeMap<String, OutboxEntry>,
    /// Certificates of the account's other devices this profile knows of (canonical JSON):
    /// those it registered with `device add`; a move registers them at the new home.
    #[serde(default)]
    pub devices: Vec<String>,
    /// The relays that were the account's home before a move, oldest first.
    #[serde(default)]
    pub former_homes: Vec<FormerHome>,
}

/// A relay that was the account's home: it still answers for what it accepted before the move.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FormerHome {
    /// The relay's id.
    pub relay: String,
    /// The highest sequence of its timeline already shown.
    #[serde(default)]
    pub cursor: u64,
    /// A session there (a former home still opens sessions for the account's devices).
    #[serde(default)]
    pub session: Option<Session>,
}

/// A session token at the home relay.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    pub token: String,
    pub expires_at: u64,
}

/// What is known of another account.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Contact {
    /// Its highest known route (canonical JSON).
    #[serde(default)]
    pub route: Option<String>,
    /// Its device certificates as last fetched (canonical JSON each).
    #[serde(default)]
    pub devices: Vec<String>,
    /// A grant or invite it issued to us (canonical JSON), passed as `authorization`.
    #[serde(default)]
    pub authorization: Option<String>,
}

fn seed(s: &str, what: &str) -> Result<[u8; 32], CliError> {
    base64url::decode_array::<32>(s)
        .ok_or_else(|| CliError::Profile(format!("{what} is not 32 bytes of base64url")))
}

/// Parses canonical JSON text kept in the profile.
pub fn object(text: &str, what: &str) -> Result<Object, CliError> {
    json::parse_object(text.as_bytes()).map_err(|e| CliError::Profile(format!("{what}: {e}")))
}

impl Profile {
    /// A sent message's outbox entry, or the input error naming it.
    pub fn sent(&self, message_id: &str) -> Result<OutboxEntry, CliError> {
        self.outbox
            .get(message_id)
            .cloned()
            .ok_or_else(|| CliError::Input(format!("message {message_id} is not in the outbox")))
    }

    /// The account key pair.
    pub fn account_key(&self) -> Result<AccountKey, CliError> {
        Ok(AccountKey::from_seed(seed(
            &self.account_key,
            "account_key",
        )?))
    }

    /// The device key pair.
    pub fn device_key(&self) -> Result<DeviceKey, CliError> {
        Ok(DeviceKey::from_seeds(
            seed(&self.device_signing_key, "device_signing_key")?,
            seed(&self.device_box_key, "device_box_key")?,
        ))
    }

    /// The account id.
    pub fn account_id(&self) -> Result<AccountId, CliError> {
        Ok(self.account_key()?.id())
    }

    /// The device id.
    pub fn device_id(&self) -> Result<DeviceId, CliError> {
        Ok(self.device_key()?.id())
    }

    /// This device's certificate object.
    pub fn certificate(&self) -> Result<Object, CliError> {
        object(&self.certificate, "certificate")
    }

    /// The account's current route object.
    pub fn route(&self) -> Result<Object, CliError> {
        object(&self.route, "route")
    }

    /// The session kept for `relay` (the home or a former home), if any.
    pub fn session_at(&self, relay: &str) -> Option<&Session> {
        if relay == self.relay {
            return self.session.as_ref();
        }
        self.former(relay).and_then(|f| f.session.as_ref())
    }

    /// Keeps a session opened at `relay`; one at a relay that is neither home nor former is not kept.
    pub fn keep_session(&mut self, relay: &str, s: Session) {
        if relay == self.relay {
            self.session = Some(s);
        } else if let Some(f) = self.former_homes.iter_mut().find(|f| f.relay == relay) {
            f.session = Some(s);
        }
    }

    /// The timeline cursor of `relay` (the home's, or a former home's; 0 for any other).
    pub fn cursor_at(&self, relay: &str) -> u64 {
        if relay == self.relay {
            return self.cursor;
        }
        self.former(relay).map_or(0, |f| f.cursor)
    }

    /// Moves the timeline cursor of `relay` forward to `next` (never back).
    pub fn advance_cursor(&mut self, relay: &str, next: u64) {
        if relay == self.relay {
            self.cursor = self.cursor.max(next);
        } else if let Some(f) = self.former_homes.iter_mut().find(|f| f.relay == relay) {
            f.cursor = f.cursor.max(next);
        }
    }

    /// The former home `relay`, if it is one.
    pub fn former(&self, relay: &str) -> Option<&FormerHome> {
        self.former_homes.iter().find(|f| f.relay == relay)
    }

    /// Makes `relay` the home with `route`: the current home becomes a former one (keeping its
    /// session and cursor), and a former home that becomes the home again gets its own back.
    pub fn rehome(&mut self, relay: &str, route: String) {
        self.route = route;
        if relay == self.relay {
            return;
        }
        let back = self
            .former_homes
            .iter()
            .position(|f| f.relay == relay)
            .map(|i| self.former_homes.remove(i));
        self.former_homes.push(FormerHome {
            relay: std::mem::replace(&mut self.relay, relay.to_string()),
            cursor: self.cursor,
            session: self.session.take(),
        });
        // A timeline is per relay: the new home's starts anew unless it was ours before.
        self.cursor = back.as_ref().map_or(0, |f| f.cursor);
        self.session = back.and_then(|f| f.session);
    }

    /// The current route's revision.
    pub fn route_revision(&self) -> Result<u64, CliError> {
        self.route()?
            .get("revision")
            .and_then(json::Value::as_protocol_int)
            .ok_or_else(|| CliError::Profile("route has no revision".into()))
    }
}

/// Where a profile lives, and the only way to change it.
#[derive(Clone, Debug)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    /// The store at `path`, or at `$RELAYCTL_PROFILE`, or `./relayctl.json`.
    pub fn new(path: Option<PathBuf>) -> Store {
        let path = path
            .or_else(|| std::env::var_os("RELAYCTL_PROFILE").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("relayctl.json"));
        Store { path }
    }

    /// The profile file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a profile file exists.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// Reads the profile.
    pub fn load(&self) -> Result<Profile, CliError> {
        let bytes = std::fs::read(&self.path).map_err(|e| {
            CliError::Profile(format!(
                "{}: {e} (create one with `relayctl init --relay URL`)",
                self.path.display()
            ))
        })?;
        let p: Profile = serde_json::from_slice(&bytes)
            .map_err(|e| CliError::Profile(format!("{}: {e}", self.path.display())))?;
        if p.version != VERSION {
            return Err(CliError::Profile(format!(
                "{}: profile version {} is not supported (expected {VERSION})",
                self.path.display(),
                p.version
            )));
        }
        Ok(p)
    }

    /// Writes a new profile; refuses to overwrite an existing file.
    pub fn create(&self, p: &Profile) -> Result<(), CliError> {
        let _lock = self.lock()?;
        if self.path.exists() {
            return Err(CliError::Profile(format!(
                "{} already exists; pass another --profile",
                self.path.display()
            )));
        }
        self.write(p)
    }

    /// Changes the profile under an exclusive lock: re-reads it, applies `f`, writes it back.
    pub fn update<T>(&self, f: impl FnOnce(&mut Profile) -> T) -> Result<(T, Profile), CliError> {
        let _lock = self.lock()?;
        let mut p = self.load()?;
        let out = f(&mut p);
        self.write(&p)?;
        Ok((out, p))
    }

    fn lock(&self) -> Result<File, CliError> {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&name)
            .map_err(|e| CliError::Profile(format!("{}: {e}", PathBuf::from(&name).display())))?;
        f.lock()
            .map_err(|e| CliError::Profile(format!("locking the profile: {e}")))?;
        Ok(f)
    }

    /// Atomic replace: write a 0600 temporary file beside the profile, then rename it over.
    fn write(&self, p: &Profile) -> Result<(), CliError> {
        let text = serde_json::to_vec_pretty(p)
            .map_err(|e| CliError::Profile(format!("serializing: {e}")))?;
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let err = |e: std::io::Error| CliError::Profile(format!("{}: {e}", tmp.display()));
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(&text).map_err(err)?;
        f.write_all(b"\n").map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path)
            .map_err(|e| CliError::Profile(format!("{}: {e}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(relay: &str) -> Profile {
        Profile {
            version: VERSION,
            network: "dev".into(),
            relay: relay.into(),
            account_key: String::new(),
            device_signing_key: String::new(),
            device_box_key: String::new(),
            certificate: String::new(),
            route: "r1".into(),
            discoverable: false,
            registered: true,
            session: None,
            cursor: 0,
            contacts: BTreeMap::new(),
            outbox: BTreeMap::new(),
            devices: Vec::new(),
            former_homes: Vec::new(),
        }
    }

    fn session(token: &str) -> Session {
        Session {
            token: token.into(),
            expires_at: 1,
        }
    }

    #[test]
    fn a_move_keeps_the_old_home_with_its_cursor_and_session_and_moving_back_restores_them() {
        let (a, b) = ("http://127.0.0.1:1", "http://127.0.0.1:2");
        let mut p = profile(a);
        p.cursor = 7;
        p.session = Some(session("at-a"));
        p.rehome(b, "r2".into());
        assert_eq!((p.relay.as_str(), p.route.as_str(), p.cursor), (b, "r2", 0));
        assert!(p.session.is_none());
        assert_eq!(p.former_homes.len(), 1);
        assert_eq!(p.cursor_at(a), 7);
        assert_eq!(p.session_at(a).unwrap().token, "at-a");

        // Each relay's cursor and session are its own.
        p.advance_cursor(b, 3);
        p.advance_cursor(a, 9);
        p.advance_cursor(a, 8);
        p.keep_session(b, session("at-b"));
        p.keep_session("http://127.0.0.1:3", session("elsewhere"));
        assert_eq!((p.cursor_at(a), p.cursor_at(b)), (9, 3));
        assert_eq!(p.session_at(b).unwrap().token, "at-b");
        assert!(p.session_at("http://127.0.0.1:3").is_none());

        // Back to A: its timeline goes on where it was read; B becomes the former home.
        p.rehome(a, "r3".into());
        assert_eq!((p.relay.as_str(), p.cursor), (a, 9));
        assert_eq!(p.session.as_ref().unwrap().token, "at-a");
        let former: Vec<&str> = p.former_homes.iter().map(|f| f.relay.as_str()).collect();
        assert_eq!(former, [b]);
        assert_eq!(p.cursor_at(b), 3);

        // Finishing a move to where we already are changes only the route.
        p.rehome(a, "r3".into());
        assert_eq!(p.former_homes.len(), 1);
    }

    #[test]
    fn a_profile_without_the_newer_members_still_reads() {
        let mut v = serde_json::to_value(profile("http://127.0.0.1:1")).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("devices");
        o.remove("former_homes");
        let p: Profile = serde_json::from_value(v).unwrap();
        assert!(p.former_homes.is_empty() && p.devices.is_empty());
    }
}
