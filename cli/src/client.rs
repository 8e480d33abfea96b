//! A device talking to its home relay (and former homes): the profile, the HTTP transport, sessions.

use crate::error::{CallError, CliError};
use crate::profile::{Profile, Session, Store};
use crate::transport::Http;
use rand::rngs::OsRng;
use relay_core::client::{draft, random_id};
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A session is re-opened when it has less than this left (ms).
const SESSION_MARGIN: u64 = 60_000;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How persistent relayctl is when a relay does not answer.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts of one request in total (the first included).
    pub attempts: u32,
    /// The first backoff; it doubles per attempt up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// The longest `rate_limited` wait relayctl sits through before giving up.
    pub max_rate_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_rate_wait: Duration::from_secs(120),
        }
    }
}

/// One device of one account, as the profile describes it.
pub struct Client {
    pub store: Store,
    /// The profile as last read or written.
    pub profile: Profile,
    pub http: Http,
    pub retry: RetryPolicy,
}

impl Client {
    /// Loads the profile from `store`.
    pub fn open(store: Store, http: Http, retry: RetryPolicy) -> Result<Client, CliError> {
        let profile = store.load()?;
        Ok(Client {
            store,
            profile,
            http,
            retry,
        })
    }

    /// Changes the profile on disk (under its lock) and refreshes the in-memory copy.
    pub fn update<T>(&mut self, f: impl FnOnce(&mut Profile) -> T) -> Result<T, CliError> {
        let (out, p) = self.store.update(f)?;
        self.profile = p;
        Ok(out)
    }

    /// A session token at the home relay valid for at least a minute, opening one if needed.
    pub fn session(&mut self) -> Result<String, CliError> {
        let relay = self.profile.relay.clone();
        self.session_at(&relay)
    }

    /// A session token at `relay` (the home or a former home) valid for at least a minute.
    pub fn session_at(&mut self, relay: &str) -> Result<String, CliError> {
        if let Some(s) = self.profile.session_at(relay) {
            if s.expires_at > now_ms() + SESSION_MARGIN {
                return Ok(s.token.clone());
            }
        }
        self.open_session_at(relay)
    }

    /// Opens a new session at the home relay and keeps it in the profile.
    pub fn open_session(&mut self) -> Result<String, CliError> {
        let relay = self.profile.relay.clone();
        self.open_session_at(&relay)
    }

    /// Opens a new session at `relay` with a signed `session_open` naming that relay; keeps it.
    ///
    /// A former home opens sessions too (checked against the devices as they
    /// stood at the move), for the status, retries and records it still holds.
    pub fn open_session_at(&mut self, relay: &str) -> Result<String, CliError> {
        let device = self.profile.device_key()?;
        let so = draft::session_open(
            &self.profile.network,
            relay,
            &self.profile.account_id()?,
            &device.id(),
            now_ms(),
            &random_id(&mut OsRng),
        )
        .sign(&device);
        let r = self
            .http
            .call(relay, "session.open", None, &canonical::object_to_vec(&so))
            .map_err(CliError::from)?;
        let token = r
            .get("session")
            .and_then(Value::as_str)
            .ok_or_else(|| CliError::Invalid("session.open answered without a session".into()))?
            .to_string();
        let expires_at = r
            .get("expires_at")
            .and_then(Value::as_protocol_int)
            .unwrap_or(0);
        let s = Session {
            token: token.clone(),
            expires_at,
        };
        self.update(|p| p.keep_session(relay, s))?;
        Ok(token)
    }

    /// One authenticated call to the home relay; on `unauthenticated` it re-opens the session once.
    pub fn call(&mut self, method: &str, body: &[u8]) -> Result<Object, CallError> {
        let relay = self.profile.relay.clone();
        self.call_at(&relay, method, body)
    }

    /// Like [`Client::call`] at `relay`, with a session of that relay (opened there if needed).
    ///
    /// It re-opens the session once on `unauthenticated`, and once on a `not_home_relay`
    /// whose route names `relay` itself: the account moved away and back since the session
    /// was opened, so it belongs to an earlier home span and only a fresh one serves
    /// (protocol.md, "Home relay changes", rule 6).
    pub fn call_at(&mut self, relay: &str, method: &str, body: &[u8]) -> Result<Object, CallError> {
        let token = self.session_at(relay).map_err(to_call)?;
        match self.http.call(relay, method, Some(&token), body) {
            Err(CallError::Relay(e))
                if e.code == "unauthenticated"
                    || (e.code == "not_home_relay" && route_names(e.data.as_ref(), relay)) =>
            {
                let token = self.open_session_at(relay).map_err(to_call)?;
                self.http.call(relay, method, Some(&token), body)
            }
            other => other,
        }
    }

    /// [`Client::call`] with params built from an object.
    pub fn call_object(&mut self, method: &str, params: &Object) -> Result<Object, CliError> {
        Ok(self.call(method, &canonical::object_to_vec(params))?)
    }
}

/// Whether a route error's `data.route` names `relay` (the relay that refused).
fn route_names(data: Option<&Value>, relay: &str) -> bool {
    data.and_then(Value::as_object)
        .and_then(|d| d.get("route"))
        .and_then(Value::as_object)
        .and_then(|r| r.get("relay"))
        .and_then(Value::as_str)
        == Some(relay)
}

/// Folds a client error into a call error (sessions fail as calls do).
fn to_call(e: CliError) -> CallError {
    match e {
        CliError::Relay(r) => CallError::Relay(r),
        CliError::Transport(t) => CallError::Transport(t),
        other => CallError::Transport(crate::error::TransportError::NotAttempted(
            other.to_string(),
        )),
    }
}
