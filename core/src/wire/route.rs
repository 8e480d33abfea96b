//! `route`: an account's signed statement of which relay is its home.

use super::crypto::Crypto;
use super::field::{FieldError, Fields};
use super::identity::{AccountId, RelayId};
use super::json::Object;
use super::signature::{SignatureError, SignedObject};

/// A parsed `route`.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    raw: Object,
    sig: [u8; 64],
    /// The network the route is valid on.
    pub network: String,
    /// The account whose key signs the route and whose home it names.
    pub account: AccountId,
    /// The account's home relay; must be allowed on the network (https off `dev`).
    pub relay: RelayId,
    /// Version of the route; a held route is replaced only by a higher revision.
    pub revision: u64,
    /// Issuance time, Unix ms.
    pub issued_at: u64,
}

/// Why a route is not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// Another network.
    WrongNetwork,
    /// The relay id is not allowed on this network (https is required off `dev`).
    RelayNotAllowed,
    /// The account's signature does not verify.
    Signature(SignatureError),
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::WrongNetwork => f.write_str("route is for another network"),
            RouteError::RelayNotAllowed => {
                f.write_str("route relay must be an https origin on this network")
            }
            RouteError::Signature(e) => write!(f, "route signature: {e}"),
        }
    }
}

impl std::error::Error for RouteError {}

impl From<RouteError> for crate::Error {
    fn from(e: RouteError) -> crate::Error {
        let code = match e {
            RouteError::Signature(_) => crate::ErrorCode::InvalidSignature,
            _ => crate::ErrorCode::InvalidParams,
        };
        crate::Error::new(code, e.to_string())
    }
}

impl Route {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<Route, FieldError> {
        let f = Fields::new(&raw);
        f.embeddable()?;
        f.expect_type(Self::TYPE)?;
        Ok(Route {
            network: f.network()?,
            account: f.account("account")?,
            relay: f.relay("relay")?,
            revision: f.int("revision")?,
            issued_at: f.int("issued_at")?,
            sig: f.sig()?,
            raw,
        })
    }

    /// Network, relay scheme and the account's signature (by the core itself: clients and tests).
    pub fn verify(&self, network: &str) -> Result<(), RouteError> {
        self.verify_in(network, &mut Crypto::new())
    }

    /// [`Route::verify`] with an engine's crypto.
    pub fn verify_in(&self, network: &str, crypto: &mut Crypto) -> Result<(), RouteError> {
        if self.network != network {
            return Err(RouteError::WrongNetwork);
        }
        if !self.relay.allowed_on(network) {
            return Err(RouteError::RelayNotAllowed);
        }
        self.verify_signature_in(self.account.key(), crypto)
            .map_err(RouteError::Signature)
    }
}

impl SignedObject for Route {
    const TYPE: &'static str = "route";
    fn raw(&self) -> &Object {
        &self.raw
    }
    fn sig(&self) -> &[u8; 64] {
        &self.sig
    }
}
