//! The client's error type: what went wrong, typed so callers can react to each kind.

use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use std::fmt;

/// An error object a relay answered with: `{code, message, data?}`.
#[derive(Clone, Debug, PartialEq)]
pub struct RelayError {
    /// The HTTP status (0 over WebSocket).
    pub status: u16,
    pub code: String,
    pub message: String,
    pub data: Option<Value>,
}

impl RelayError {
    /// Reads `{"error": {...}}` (or the inner object itself); `None` if it is not an error object.
    pub fn from_object(status: u16, o: &Object) -> Option<RelayError> {
        let e = match o.get("error") {
            Some(Value::Object(e)) => e,
            _ => o,
        };
        let code = e.get("code").and_then(Value::as_str)?.to_string();
        Some(RelayError {
            status,
            code,
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            data: e.get("data").cloned(),
        })
    }

    /// `data.retry_after` in milliseconds, when the relay gave an integer one.
    pub fn retry_after(&self) -> Option<u64> {
        self.data
            .as_ref()
            .and_then(Value::as_object)
            .and_then(|d| d.get("retry_after"))
            .and_then(Value::as_protocol_int)
    }
}

impl fmt::Display for RelayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(d) = &self.data {
            write!(f, " {}", canonical::to_string(d))?;
        }
        Ok(())
    }
}

/// Why a call has no answer from the relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportError {
    /// The request certainly never reached the relay (refused connection, unresolvable name).
    NotAttempted(String),
    /// The request may have reached the relay: timeout, reset, lost or unreadable answer.
    Unknown(String),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::NotAttempted(m) => write!(f, "not sent: {m}"),
            TransportError::Unknown(m) => write!(f, "no answer: {m}"),
        }
    }
}

/// Every failure of a relayctl operation.
#[derive(Debug)]
pub enum CliError {
    /// Bad command line or arguments.
    Usage(String),
    /// The profile file cannot be read, written or understood.
    Profile(String),
    /// A local file (invite, card) cannot be read or is not what it should be.
    Input(String),
    /// The relay answered with an error.
    Relay(RelayError),
    /// The relay could not be reached or did not answer.
    Transport(TransportError),
    /// A message was sent but whether the relay accepted it is not known.
    OutcomeUnknown { message_id: String, last: String },
    /// A message was never delivered to the relay (it could not be reached).
    NotSent { message_id: String, last: String },
    /// Something the relay sent does not verify or make sense.
    Invalid(String),
}

impl CliError {
    /// The exit status for this error: 1 for a relay's or a verification's "no", 2 for usage and local input, 3 for an unknown outcome.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Profile(_) | CliError::Input(_) => 2,
            CliError::Relay(_) | CliError::Invalid(_) => 1,
            CliError::Transport(_) | CliError::OutcomeUnknown { .. } | CliError::NotSent { .. } => {
                3
            }
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => write!(f, "usage: {m}"),
            CliError::Profile(m) => write!(f, "profile: {m}"),
            CliError::Input(m) => write!(f, "{m}"),
            CliError::Relay(e) => write!(f, "relay error {e}"),
            CliError::Transport(e) => write!(f, "{e}"),
            CliError::OutcomeUnknown { message_id, last } => write!(
                f,
                "outcome unknown for message {message_id} ({last}); rerun `relayctl retry {message_id}`"
            ),
            CliError::NotSent { message_id, last } => write!(
                f,
                "message {message_id} was not sent ({last}); rerun `relayctl retry {message_id}`"
            ),
            CliError::Invalid(m) => write!(f, "invalid: {m}"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<RelayError> for CliError {
    fn from(e: RelayError) -> CliError {
        CliError::Relay(e)
    }
}

impl From<TransportError> for CliError {
    fn from(e: TransportError) -> CliError {
        CliError::Transport(e)
    }
}

impl From<relay_core::Error> for CliError {
    fn from(e: relay_core::Error) -> CliError {
        CliError::Invalid(e.to_string())
    }
}

/// An answer of one call: a result object, or why there is none.
#[derive(Debug)]
pub enum CallError {
    Relay(RelayError),
    Transport(TransportError),
}

impl From<CallError> for CliError {
    fn from(e: CallError) -> CliError {
        match e {
            CallError::Relay(r) => CliError::Relay(r),
            CallError::Transport(t) => CliError::Transport(t),
        }
    }
}
