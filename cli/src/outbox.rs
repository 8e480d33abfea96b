//! The outbox: every `message.send` request kept as the exact bytes sent, and the seed's retry rule.
//!
//! A timeout, disconnection or lost response does not prove rejection, so
//! the only retry is the unchanged request to the same relay: the stored
//! body is re-sent byte for byte, and the relay's idempotency on
//! `(from, message_id)` answers the stored result instead of accepting it
//! twice. Nothing here ever makes a new message id.

use crate::client::Client;
use crate::error::{CallError, CliError, TransportError};
use rand::Rng;
use relay_core::wire::canonical;
use relay_core::wire::json::Object;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where a sent request stands, as far as this device knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Stored, not yet known to have reached the relay.
    Pending,
    /// Sent at least once without an answer: it may have been accepted.
    Unknown,
    /// The relay answered with a DeliveryStatus (see `status`).
    Answered,
    /// The relay explicitly refused it (see `error`); nothing was accepted.
    Rejected,
}

/// One `message.send` request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub to: String,
    /// The relay it was sent to: the home then, the only relay that can accept it. Retries
    /// and status go there, also after the account moved (its former home keeps answering).
    /// Empty in an entry that lacks it: the current home.
    #[serde(default)]
    pub relay: String,
    /// The exact request body.
    pub body: String,
    /// The plaintext, so a `device_unknown` rejection can be answered with a new message.
    pub text: String,
    pub created_at: u64,
    pub state: State,
    /// The latest DeliveryStatus (canonical JSON).
    #[serde(default)]
    pub status: Option<String>,
    /// The relay's error when rejected (canonical JSON of the error object).
    #[serde(default)]
    pub error: Option<String>,
    /// The message id that replaced this one after `device_unknown`.
    #[serde(default)]
    pub replaced_by: Option<String>,
}

impl OutboxEntry {
    /// The relay that accepted (or may have accepted) it; `home` for an entry without one.
    pub fn relay_or<'a>(&'a self, home: &'a str) -> &'a str {
        if self.relay.is_empty() {
            home
        } else {
            &self.relay
        }
    }
}

/// The most entries kept; the oldest finished ones go first.
const KEEP: usize = 500;

/// Adds an entry before its first attempt, so a crash still leaves the retryable bytes.
pub fn store(client: &mut Client, message_id: &str, entry: OutboxEntry) -> Result<(), CliError> {
    client.update(|p| {
        p.outbox.insert(message_id.to_string(), entry);
        if p.outbox.len() > KEEP {
            let mut finished: Vec<(u64, String)> = p
                .outbox
                .iter()
                .filter(|(_, e)| matches!(e.state, State::Answered | State::Rejected))
                .map(|(id, e)| (e.created_at, id.clone()))
                .collect();
            finished.sort();
            for (_, id) in finished.into_iter().take(p.outbox.len() - KEEP) {
                p.outbox.remove(&id);
            }
        }
    })
}

/// Records a DeliveryStatus for `message_id`.
pub fn record_status(
    client: &mut Client,
    message_id: &str,
    status: &Object,
) -> Result<(), CliError> {
    let text = String::from_utf8_lossy(&canonical::object_to_vec(status)).into_owned();
    client.update(|p| {
        if let Some(e) = p.outbox.get_mut(message_id) {
            e.state = State::Answered;
            e.status = Some(text);
        }
    })
}

/// Sends the stored request for `message_id` under the retry rule; its DeliveryStatus.
///
/// Timeouts, lost answers, `unavailable` and `internal` are retried with the
/// same bytes to the same relay, with exponential backoff and jitter, up to
/// the policy's attempts; `rate_limited` waits `data.retry_after`;
/// `unauthenticated` re-opens the session once (the body does not change).
/// Any other error is the relay's explicit refusal and is returned as is.
pub fn transmit(client: &mut Client, message_id: &str) -> Result<Object, CliError> {
    let entry = client.profile.sent(message_id)?;
    let relay = entry.relay_or(&client.profile.relay).to_string();
    let policy = client.retry;
    let mut backoff = policy.initial_backoff;
    let mut rate_waited = Duration::ZERO;
    let mut maybe_sent = entry.state == State::Unknown;
    let mut last: String;
    let mut attempt = 0;
    loop {
        attempt += 1;
        // The session first, so that a relay refusing it (a former home that forgot the account,
        // a revoked device) is not taken for a refusal of the message itself.
        let opened = match client.session_at(&relay) {
            Ok(_) => Ok(()),
            Err(CliError::Transport(t)) => Err(t.to_string()),
            Err(CliError::Relay(e))
                if matches!(e.code.as_str(), "unavailable" | "internal" | "rate_limited") =>
            {
                Err(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let answer = match opened {
            Ok(()) => client.call_at(&relay, "message.send", entry.body.as_bytes()),
            Err(why) => Err(CallError::Transport(TransportError::NotAttempted(format!(
                "session.open at {relay}: {why}"
            )))),
        };
        match answer {
            Ok(status) => {
                record_status(client, message_id, &status)?;
                return Ok(status);
            }
            Err(CallError::Relay(e)) if e.code == "rate_limited" => {
                // Not accepted; wait as the relay asks (its hint is authoritative) and try again.
                let wait = e
                    .retry_after()
                    .map(Duration::from_millis)
                    .unwrap_or(backoff)
                    .max(Duration::from_millis(1));
                rate_waited += wait;
                if rate_waited > policy.max_rate_wait {
                    return Err(CliError::Relay(e));
                }
                eprintln!("rate limited; waiting {} ms", wait.as_millis());
                std::thread::sleep(wait);
                attempt -= 1;
                continue;
            }
            Err(CallError::Relay(e)) if matches!(e.code.as_str(), "unavailable" | "internal") => {
                // Nothing was accepted (protocol.md §5), but an earlier attempt might have been.
                last = e.to_string();
            }
            Err(CallError::Relay(e)) => {
                let err = relay_error_text(&e);
                client.update(|p| {
                    if let Some(x) = p.outbox.get_mut(message_id) {
                        x.state = State::Rejected;
                        x.error = Some(err);
                    }
                })?;
                return Err(CliError::Relay(e));
            }
            Err(CallError::Transport(t)) => {
                if matches!(t, TransportError::Unknown(_)) && !maybe_sent {
                    maybe_sent = true;
                    client.update(|p| {
                        if let Some(x) = p.outbox.get_mut(message_id) {
                            x.state = State::Unknown;
                        }
                    })?;
                }
                last = t.to_string();
            }
        }
        if attempt >= policy.attempts {
            break;
        }
        let jittered = rand::thread_rng().gen_range(backoff / 2..=backoff);
        eprintln!(
            "attempt {attempt} of message {message_id}: {last}; retrying the same request in {} ms",
            jittered.as_millis()
        );
        std::thread::sleep(jittered);
        backoff = (backoff * 2).min(policy.max_backoff);
    }
    if maybe_sent {
        Err(CliError::OutcomeUnknown {
            message_id: message_id.to_string(),
            last,
        })
    } else {
        Err(CliError::NotSent {
            message_id: message_id.to_string(),
            last,
        })
    }
}

fn relay_error_text(e: &crate::error::RelayError) -> String {
    let mut o = Object::new();
    o.insert("code", e.code.as_str());
    o.insert("message", e.message.as_str());
    if let Some(d) = &e.data {
        o.insert("data", d.clone());
    }
    String::from_utf8_lossy(&canonical::object_to_vec(&o)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_without_its_relay_belongs_to_the_current_home() {
        let old = r#"{"to":"x","body":"{}","text":"hi","created_at":1,"state":"answered"}"#;
        let e: OutboxEntry = serde_json::from_str(old).unwrap();
        assert_eq!(e.relay_or("http://127.0.0.1:2"), "http://127.0.0.1:2");
        let e = OutboxEntry {
            relay: "http://127.0.0.1:1".into(),
            ..e
        };
        assert_eq!(e.relay_or("http://127.0.0.1:2"), "http://127.0.0.1:1");
    }
}
