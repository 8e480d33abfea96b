//! A relay's identity and policies (protocol.md §7), plus the engine's own tunables.

use crate::wire::identity::RelayId;
use serde::{Deserialize, Serialize};

/// The protocol's default `max_batch`: a source's batches never carry more items, whatever
/// its own policy, since a destination's may be no larger (docs/protocol.md "Batches").
pub const MAX_BATCH: u64 = 64;
/// The protocol's default `max_batch_bytes`, likewise the most a source's batch body holds.
pub const MAX_BATCH_BYTES: u64 = 1_048_576;
/// The path of relay RPC in batches.
pub const BATCH_PATH: &str = "/relay/v1/message.deliver.batch";

/// Policies published in `/.well-known/relay`; durations in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policies {
    /// Allowed clock difference, in ms: how far a `ts`, `created_at` or `issued_at` may lie beyond now (and a `ts` behind it).
    pub clock_tolerance: u64,
    /// How long after `created_at` a message may still be accepted or delivered, in ms.
    pub message_delivery_age_limit: u64,
    /// How long timeline records and results are kept, and an unused route of an account served elsewhere, in ms.
    pub message_retention: u64,
    /// Largest request body or WebSocket message, in bytes.
    pub max_request_bytes: u64,
    /// Most key boxes in one box list (`recipient_boxes`, `sender_boxes`); more is `invalid_params`.
    pub max_boxes: u64,
    /// Most active devices per account (`payload_too_large` beyond).
    pub max_devices: u64,
    /// Delivery backoff's floor and first step, in ms; also the revival step's period.
    pub retry_initial: u64,
    /// Delivery backoff's ceiling, in ms.
    pub retry_max: u64,
    /// Per account per minute.
    pub send_rate: u64,
    /// Per source relay per minute.
    pub deliver_rate: u64,
    /// Per recipient account per minute.
    pub deliver_rate_per_account: u64,
    /// Session lifetime from the open's `ts`, in ms (cut short by the certificate's expiry).
    pub session_ttl: u64,
    /// Per caller network address per minute, for every call without credentials
    /// (`account.register`, `session.open`, `route.get`, `route.publish`); in memory.
    pub anonymous_rate: u64,
    /// Per account per minute, for every other method a session calls (`message.send`
    /// has `send_rate`) and for `session.open` naming the account; in memory.
    pub account_request_rate: u64,
    /// Per (recipient, sender) per minute: what one sender may take of a recipient's
    /// `deliver_rate_per_account`, so no sender starves the others.
    pub deliver_rate_per_sender: u64,
    /// Accounts this relay serves, at most.
    pub max_accounts: u64,
    /// Device records (registered and revoked) per account, at most.
    pub max_device_records: u64,
    /// Bytes of entries in one sync page, at most (a page always carries at least one entry).
    pub max_sync_bytes: u64,
    /// Items in one `message.deliver.batch`, at most (taken and sent).
    pub max_batch: u64,
    /// Bytes of one `message.deliver.batch` body, at most (taken and sent).
    pub max_batch_bytes: u64,
}

impl Default for Policies {
    fn default() -> Policies {
        Policies {
            clock_tolerance: 300_000,
            message_delivery_age_limit: 604_800_000,
            message_retention: 2_592_000_000,
            max_request_bytes: 262_144,
            max_boxes: 64,
            max_devices: 64,
            retry_initial: 1_000,
            retry_max: 600_000,
            send_rate: 600,
            deliver_rate: 60_000,
            deliver_rate_per_account: 600,
            session_ttl: 86_400_000,
            anonymous_rate: 600,
            account_request_rate: 1_200,
            deliver_rate_per_sender: 60,
            max_accounts: 1_000_000,
            max_device_records: 256,
            max_sync_bytes: 1_048_576,
            max_batch: MAX_BATCH,
            max_batch_bytes: MAX_BATCH_BYTES,
        }
    }
}

impl Policies {
    /// Why a request body of `len` bytes is refused before it is parsed, if it is.
    pub fn too_large(&self, len: usize) -> Option<crate::Error> {
        let limit = self.max_request_bytes;
        (len as u64 > limit).then(|| {
            crate::Error::new(
                crate::ErrorCode::PayloadTooLarge,
                format!("request body of {len} bytes exceeds max_request_bytes {limit}"),
            )
        })
    }

    /// Why a `message.deliver.batch` body of `len` bytes is refused before it is parsed.
    pub fn batch_too_large(&self, len: usize) -> Option<crate::Error> {
        let limit = self.max_batch_bytes;
        (len as u64 > limit).then(|| {
            crate::Error::new(
                crate::ErrorCode::PayloadTooLarge,
                format!("batch body of {len} bytes exceeds max_batch_bytes {limit}"),
            )
        })
    }

    /// The largest body a host reads for `path` before handing it over: `max_batch_bytes`
    /// for `message.deliver.batch`, `max_request_bytes` for every other request.
    pub fn body_limit(&self, path: &str) -> u64 {
        if path == BATCH_PATH {
            self.max_batch_bytes.max(self.max_request_bytes)
        } else {
            self.max_request_bytes
        }
    }

    /// Why a body of `len` bytes to `path` is refused before it is parsed: over its
    /// [`Policies::body_limit`].
    pub fn body_too_large(&self, path: &str, len: usize) -> Option<crate::Error> {
        if path == BATCH_PATH {
            self.batch_too_large(len)
        } else {
            self.too_large(len)
        }
    }

    /// Sets one policy by its protocol name (`--policy NAME=VALUE`).
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), String> {
        let slot = match name {
            "clock_tolerance" => &mut self.clock_tolerance,
            "message_delivery_age_limit" => &mut self.message_delivery_age_limit,
            "message_retention" => &mut self.message_retention,
            "max_request_bytes" => &mut self.max_request_bytes,
            "max_boxes" => &mut self.max_boxes,
            "max_devices" => &mut self.max_devices,
            "retry_initial" => &mut self.retry_initial,
            "retry_max" => &mut self.retry_max,
            "send_rate" => &mut self.send_rate,
            "deliver_rate" => &mut self.deliver_rate,
            "deliver_rate_per_account" => &mut self.deliver_rate_per_account,
            "session_ttl" => &mut self.session_ttl,
            "anonymous_rate" => &mut self.anonymous_rate,
            "account_request_rate" => &mut self.account_request_rate,
            "deliver_rate_per_sender" => &mut self.deliver_rate_per_sender,
            "max_accounts" => &mut self.max_accounts,
            "max_device_records" => &mut self.max_device_records,
            "max_sync_bytes" => &mut self.max_sync_bytes,
            "max_batch" => &mut self.max_batch,
            "max_batch_bytes" => &mut self.max_batch_bytes,
            _ => return Err(format!("unknown policy {name:?}")),
        };
        *slot = value;
        if self.retry_initial == 0 || self.retry_max < self.retry_initial {
            return Err("retry_initial must be at least 1 and at most retry_max".into());
        }
        Ok(())
    }
}

/// Everything an engine needs to know about the relay it runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// This relay's id (its origin URL).
    pub relay: RelayId,
    /// The network it serves.
    pub network: String,
    /// The policies, as published in `/.well-known/relay`.
    pub policies: Policies,
    /// How long an attempt may stay unanswered before it counts as an unknown outcome.
    pub attempt_timeout: u64,
    /// At most this many attempts in flight to one destination; the rest wait their turn.
    pub max_in_flight_per_destination: u32,
    /// At most this many due deliveries started per tick (a further tick is requested at once).
    pub tick_batch: usize,
    /// A destination back after an outage gets this many of its outage tasks brought
    /// forward at once, and as many again every `retry_initial`.
    pub revive_batch: usize,
    /// Which shard of the relay this engine is (one shard unless the host shards accounts).
    pub shard: super::shard::Shard,
    /// When the process that carries this engine's attempts started (ms), if the host says:
    /// an attempt in flight that left before then was carried by a process that is gone, so
    /// its outcome is unknown at once rather than after `attempt_timeout`. A host sets it
    /// once per process start and keeps it over trap recoveries (their attempts live on).
    pub started_at: Option<u64>,
}

impl Config {
    /// Sets the operator's engine options (`None` keeps the default); each is at least 1.
    pub fn set_options(&mut self, attempt_timeout: Option<u64>, max_in_flight: Option<u32>) {
        if let Some(t) = attempt_timeout {
            self.attempt_timeout = t.max(1);
        }
        if let Some(m) = max_in_flight {
            self.max_in_flight_per_destination = m.max(1);
        }
    }

    /// A configuration with default policies.
    pub fn new(relay: RelayId, network: &str) -> Config {
        Config {
            relay,
            network: network.to_string(),
            policies: Policies::default(),
            attempt_timeout: 30_000,
            max_in_flight_per_destination: 16,
            tick_batch: 512,
            revive_batch: 64,
            shard: super::shard::Shard::SINGLE,
            started_at: None,
        }
    }
}

/// The configuration as JSON (what a host passes across a wasm boundary).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ConfigJson {
    relay: String,
    network: String,
    #[serde(default)]
    policies: Policies,
    #[serde(default)]
    attempt_timeout: Option<u64>,
    #[serde(default)]
    max_in_flight_per_destination: Option<u32>,
    #[serde(default)]
    tick_batch: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<super::shard::Shard>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_at: Option<u64>,
}

impl Config {
    /// Parses `{relay, network, policies?, attempt_timeout?, max_in_flight_per_destination?, tick_batch?, shard?: {index, count}, started_at?}`.
    pub fn from_json(bytes: &[u8]) -> Result<Config, String> {
        let c: ConfigJson = serde_json::from_slice(bytes).map_err(|e| format!("config: {e}"))?;
        let relay = RelayId::parse(&c.relay).map_err(|e| format!("config relay: {e}"))?;
        if !crate::wire::identity::valid_network(&c.network) {
            return Err("config network: 1 to 32 characters of a-z, 0-9 and -".into());
        }
        if !relay.allowed_on(&c.network) {
            return Err("config relay: must be https outside the dev network".into());
        }
        let mut cfg = Config::new(relay, &c.network);
        cfg.policies = c.policies;
        cfg.set_options(c.attempt_timeout, c.max_in_flight_per_destination);
        if let Some(b) = c.tick_batch {
            cfg.tick_batch = b.max(1);
        }
        if let Some(s) = c.shard {
            cfg.shard = super::shard::Shard::new(s.index, s.count)
                .map_err(|e| format!("config shard: {e}"))?;
        }
        cfg.started_at = c.started_at;
        Ok(cfg)
    }

    /// The configuration as JSON, the inverse of [`Config::from_json`].
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&ConfigJson {
            relay: self.relay.as_str().to_string(),
            network: self.network.clone(),
            policies: self.policies.clone(),
            attempt_timeout: Some(self.attempt_timeout),
            max_in_flight_per_destination: Some(self.max_in_flight_per_destination),
            tick_batch: Some(self.tick_batch),
            shard: (self.shard != super::shard::Shard::SINGLE).then_some(self.shard),
            started_at: self.started_at,
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_options_are_at_least_one_however_a_host_passes_them() {
        let json = br#"{"relay":"http://127.0.0.1:1","network":"dev","attempt_timeout":0,"max_in_flight_per_destination":0}"#;
        let c = Config::from_json(json).unwrap();
        assert_eq!((c.attempt_timeout, c.max_in_flight_per_destination), (1, 1));
        let mut n = Config::new(c.relay.clone(), "dev");
        n.set_options(Some(0), None);
        assert_eq!(
            (n.attempt_timeout, n.max_in_flight_per_destination),
            (1, 16)
        );
    }
}
