//! Account access authorization: `contact_grant` and `contact_invite`.
//!
//! Stateless checks live here (signature, network, binding, validity
//! window); revocation and use counts are the engine's state.

use super::crypto::Crypto;
use super::field::{FieldError, Fields};
use super::identity::AccountId;
use super::json::Object;
use super::route::Route;
use super::signature::{SignatureError, SignedObject};

/// A parsed `contact_grant`: the grantor (recipient) lets the grantee (sender) deliver.
#[derive(Clone, Debug, PartialEq)]
pub struct ContactGrant {
    raw: Object,
    sig: [u8; 64],
    /// The network the grant is valid on; must be the relay's own.
    pub network: String,
    /// Base64url random id (16 to 32 bytes), the handle `contact.revoke` names.
    pub grant_id: String,
    /// The account that grants (the recipient); its key signs the grant.
    pub grantor: AccountId,
    /// The account allowed to send to the grantor.
    pub grantee: AccountId,
    /// Issuance time, Unix ms; refused if beyond now + clock tolerance.
    pub issued_at: u64,
    /// End of validity, Unix ms (exclusive); absent means the grant never expires.
    pub expires_at: Option<u64>,
    /// The grantor's signed route, so a sender can pass it on as `recipient_route`.
    pub route: Option<Route>,
}

/// A parsed `contact_invite`: anyone holding it may deliver to the issuer.
#[derive(Clone, Debug, PartialEq)]
pub struct ContactInvite {
    raw: Object,
    sig: [u8; 64],
    /// The network the invite is valid on; must be the relay's own.
    pub network: String,
    /// Base64url random id (16 to 32 bytes), the handle `contact.revoke` and use counts name.
    pub invite_id: String,
    /// The account that invites (the recipient); its key signs the invite.
    pub issuer: AccountId,
    /// Issuance time, Unix ms; refused if beyond now + clock tolerance.
    pub issued_at: u64,
    /// End of validity, Unix ms (exclusive); required, so an invite cannot be open-ended.
    pub expires_at: u64,
    /// How many distinct sender accounts may use it (at least 1); absent means unlimited.
    pub max_uses: Option<u64>,
    /// The issuer's signed route, so a sender can pass it on as `recipient_route`.
    pub route: Option<Route>,
}

/// The `authorization` member of message.send and message.deliver.
#[derive(Clone, Debug, PartialEq)]
pub enum Authorization {
    /// A `contact_grant`: one named sender may deliver.
    Grant(ContactGrant),
    /// A `contact_invite`: any holder may deliver, within `max_uses`.
    Invite(ContactInvite),
}

/// Why an authorization does not let `from` deliver to `to`; `authorization_invalid` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationError {
    /// Issued for another network than this relay's.
    WrongNetwork,
    /// Not issued by the recipient, or (a grant) not to the sender.
    Binding,
    /// The issuer's signature does not verify.
    Signature(SignatureError),
    /// The embedded route is not the issuer's valid route.
    Route,
    /// Issued beyond now + tolerance.
    NotYetValid,
    /// Now is at or past `expires_at`.
    Expired,
    /// The issuer revoked its id with `contact.revoke`.
    Revoked,
    /// An invite used by `max_uses` other sender accounts.
    UsedUp,
}

impl std::fmt::Display for AuthorizationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            AuthorizationError::WrongNetwork => "authorization is for another network",
            AuthorizationError::Binding => {
                "authorization is not from the recipient account to the sender"
            }
            AuthorizationError::Signature(_) => "authorization signature does not verify",
            AuthorizationError::Route => "authorization route is not the issuer's valid route",
            AuthorizationError::NotYetValid => "authorization issued_at is in the future",
            AuthorizationError::Expired => "authorization has expired",
            AuthorizationError::Revoked => "authorization has been revoked",
            AuthorizationError::UsedUp => "invite has been used by max_uses accounts",
        };
        f.write_str(s)
    }
}

impl std::error::Error for AuthorizationError {}

impl From<AuthorizationError> for crate::Error {
    fn from(e: AuthorizationError) -> crate::Error {
        crate::Error::new(crate::ErrorCode::AuthorizationInvalid, e.to_string())
    }
}

fn opt_route(f: &Fields<'_>) -> Result<Option<Route>, FieldError> {
    f.opt_object("route")?
        .map(|o| Route::parse(o.clone()).map_err(|e| e.within("route")))
        .transpose()
}

impl ContactGrant {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<ContactGrant, FieldError> {
        let f = Fields::new(&raw);
        f.expect_type(Self::TYPE)?;
        Ok(ContactGrant {
            network: f.network()?,
            grant_id: f.random_id("grant_id")?,
            grantor: f.account("grantor")?,
            grantee: f.account("grantee")?,
            issued_at: f.int("issued_at")?,
            expires_at: f.opt_int("expires_at")?,
            route: opt_route(&f)?,
            sig: f.sig()?,
            raw,
        })
    }
}

impl ContactInvite {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<ContactInvite, FieldError> {
        let f = Fields::new(&raw);
        f.expect_type(Self::TYPE)?;
        let max_uses = f.opt_int("max_uses")?;
        if max_uses == Some(0) {
            return Err(FieldError::invalid("max_uses", "must be at least 1"));
        }
        Ok(ContactInvite {
            network: f.network()?,
            invite_id: f.random_id("invite_id")?,
            issuer: f.account("issuer")?,
            issued_at: f.int("issued_at")?,
            expires_at: f.int("expires_at")?,
            max_uses,
            route: opt_route(&f)?,
            sig: f.sig()?,
            raw,
        })
    }
}

impl Authorization {
    /// Parses a grant or an invite, told apart by `type`.
    pub fn parse(raw: Object) -> Result<Authorization, FieldError> {
        match Fields::new(&raw).str("type")? {
            ContactGrant::TYPE => ContactGrant::parse(raw).map(Authorization::Grant),
            ContactInvite::TYPE => ContactInvite::parse(raw).map(Authorization::Invite),
            other => Err(FieldError::invalid(
                "type",
                format!("expected \"contact_grant\" or \"contact_invite\", got {other:?}"),
            )),
        }
    }

    /// The account that issued it (must be the recipient).
    pub fn issuer(&self) -> &AccountId {
        match self {
            Authorization::Grant(g) => &g.grantor,
            Authorization::Invite(i) => &i.issuer,
        }
    }

    /// `grant_id` or `invite_id`.
    pub fn id(&self) -> &str {
        match self {
            Authorization::Grant(g) => &g.grant_id,
            Authorization::Invite(i) => &i.invite_id,
        }
    }

    /// The object as received.
    pub fn raw(&self) -> &Object {
        match self {
            Authorization::Grant(g) => g.raw(),
            Authorization::Invite(i) => i.raw(),
        }
    }

    /// Stateless checks for a delivery from `from` to `to` at time `now` (by the core
    /// itself: clients and tests).
    pub fn verify(
        &self,
        network: &str,
        from: &AccountId,
        to: &AccountId,
        now: u64,
        tolerance: u64,
    ) -> Result<(), AuthorizationError> {
        self.verify_in(network, from, to, now, tolerance, &mut Crypto::new())
    }

    /// [`Authorization::verify`] with an engine's crypto.
    pub fn verify_in(
        &self,
        network: &str,
        from: &AccountId,
        to: &AccountId,
        now: u64,
        tolerance: u64,
        crypto: &mut Crypto,
    ) -> Result<(), AuthorizationError> {
        let (net, issued_at, expires_at, route) = match self {
            Authorization::Grant(g) => (&g.network, g.issued_at, g.expires_at, &g.route),
            Authorization::Invite(i) => (&i.network, i.issued_at, Some(i.expires_at), &i.route),
        };
        if net != network {
            return Err(AuthorizationError::WrongNetwork);
        }
        if self.issuer() != to {
            return Err(AuthorizationError::Binding);
        }
        if let Authorization::Grant(g) = self {
            if &g.grantee != from {
                return Err(AuthorizationError::Binding);
            }
        }
        let sig = match self {
            Authorization::Grant(g) => g.verify_signature_in(g.grantor.key(), crypto),
            Authorization::Invite(i) => i.verify_signature_in(i.issuer.key(), crypto),
        };
        sig.map_err(AuthorizationError::Signature)?;
        if let Some(r) = route {
            if &r.account != self.issuer() || r.verify_in(network, crypto).is_err() {
                return Err(AuthorizationError::Route);
            }
        }
        if issued_at > now.saturating_add(tolerance) {
            return Err(AuthorizationError::NotYetValid);
        }
        if expires_at.is_some_and(|e| now >= e) {
            return Err(AuthorizationError::Expired);
        }
        Ok(())
    }
}

macro_rules! signed {
    ($t:ty, $name:literal) => {
        impl SignedObject for $t {
            const TYPE: &'static str = $name;
            fn raw(&self) -> &Object {
                &self.raw
            }
            fn sig(&self) -> &[u8; 64] {
                &self.sig
            }
        }
    };
}
signed!(ContactGrant, "contact_grant");
signed!(ContactInvite, "contact_invite");
