//! Identities (protocol.md §2): accounts, devices, relays and networks.

use super::base64url;
use super::field::{FieldError, Fields, Problem};
use std::fmt;

/// An account: base64url of its 32-byte Ed25519 public key (43 characters).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccountId {
    text: String,
    key: [u8; 32],
}

impl AccountId {
    /// The account whose key is `key`.
    pub fn from_key(key: [u8; 32]) -> AccountId {
        AccountId {
            text: base64url::encode(&key),
            key,
        }
    }

    /// Parses the 43-character form.
    pub fn parse(s: &str) -> Option<AccountId> {
        let key = base64url::decode_array::<32>(s)?;
        Some(AccountId {
            text: s.to_string(),
            key,
        })
    }

    /// The account's public key, which verifies everything the account signs.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    /// The wire form.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A device: base64url of the first 16 bytes of sha256(device_key) (22 characters).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    text: String,
    bytes: [u8; 16],
}

impl DeviceId {
    /// The id bound to a device signing key (identity binding).
    pub fn derive(device_key: &[u8; 32]) -> DeviceId {
        let digest = super::digest::sha256(device_key);
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        DeviceId {
            text: base64url::encode(&bytes),
            bytes,
        }
    }

    /// Parses the 22-character form.
    pub fn parse(s: &str) -> Option<DeviceId> {
        let bytes = base64url::decode_array::<16>(s)?;
        Some(DeviceId {
            text: s.to_string(),
            bytes,
        })
    }

    /// The wire form.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A relay id: its origin URL, compared byte for byte.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelayId(String);

impl RelayId {
    /// Parses an origin: `http(s)://` + lowercase host + optional non-default port, nothing else.
    pub fn parse(s: &str) -> Result<RelayId, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| "must be an origin URL such as https://relay.example".to_string())?;
        let default_port = match scheme {
            "https" => "443",
            "http" => "80",
            _ => return Err(format!("scheme must be https or http, not {scheme:?}")),
        };
        if rest.is_empty() {
            return Err("host is missing".into());
        }
        if rest.contains(['/', '?', '#', '@']) {
            return Err("must have no path, query, fragment or user info".into());
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (inner, after) = v6
                .split_once(']')
                .ok_or_else(|| "unterminated IPv6 literal".to_string())?;
            if inner.is_empty()
                || !inner
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
            {
                return Err("invalid IPv6 literal".into());
            }
            if inner.chars().any(|c| c.is_ascii_uppercase()) {
                return Err("host must be lowercase".into());
            }
            match after {
                "" => (rest, None),
                p if p.starts_with(':') => (&rest[..rest.len() - p.len()], Some(&p[1..])),
                _ => return Err("garbage after IPv6 literal".into()),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if !host.starts_with('[') {
            if host.is_empty() || host.len() > 253 {
                return Err("host must be 1 to 253 characters".into());
            }
            if host.chars().any(|c| c.is_ascii_uppercase()) {
                return Err("host must be lowercase".into());
            }
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            };
            if !host.split('.').all(label_ok) {
                return Err("host must be dot-separated labels of a-z, 0-9 and -".into());
            }
        }
        if let Some(p) = port {
            let valid = !p.is_empty()
                && p.len() <= 5
                && p.bytes().all(|b| b.is_ascii_digit())
                && !p.starts_with('0')
                && p.parse::<u32>().is_ok_and(|n| (1..=65535).contains(&n));
            if !valid {
                return Err("port must be 1 to 65535 without leading zeros".into());
            }
            if p == default_port {
                return Err(format!("the default port {p} must be omitted"));
            }
        }
        Ok(RelayId(s.to_string()))
    }

    /// Whether this relay id may be used on `network` (https everywhere but `dev`).
    pub fn allowed_on(&self, network: &str) -> bool {
        network == "dev" || self.0.starts_with("https://")
    }

    /// The wire form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! text_debug {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self.as_str())
            }
        }
    )*};
}
text_debug!(AccountId, DeviceId, RelayId);

/// Checks a network name: 1 to 32 characters of a-z, 0-9 and -.
pub fn valid_network(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl<'a> Fields<'a> {
    /// A required account id.
    pub fn account(&self, key: &str) -> Result<AccountId, FieldError> {
        AccountId::parse(self.str(key)?).ok_or_else(|| {
            FieldError::invalid(key, "must be an account id (base64url of 32 bytes)")
        })
    }

    /// A required device id.
    pub fn device_id(&self, key: &str) -> Result<DeviceId, FieldError> {
        DeviceId::parse(self.str(key)?)
            .ok_or_else(|| FieldError::invalid(key, "must be a device id (base64url of 16 bytes)"))
    }

    /// A required relay id.
    pub fn relay(&self, key: &str) -> Result<RelayId, FieldError> {
        RelayId::parse(self.str(key)?).map_err(|why| FieldError::invalid(key, why))
    }

    /// A required network name.
    pub fn network(&self) -> Result<String, FieldError> {
        let n = self.str("network")?;
        if !valid_network(n) {
            return Err(FieldError::new(
                "network",
                Problem::Invalid("must be 1 to 32 characters of a-z, 0-9 and -".into()),
            ));
        }
        Ok(n.to_string())
    }

    /// A random id or nonce: 16 to 32 bytes.
    pub fn random_id(&self, key: &str) -> Result<String, FieldError> {
        self.bytes(key, 16, 32)?;
        Ok(self.str(key)?.to_string())
    }
}
