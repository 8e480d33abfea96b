//! `canonicalize` and `verify`: the tools for a person debugging canonical form and signatures.

use relay_core::wire::authorization::{ContactGrant, ContactInvite};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::field::Fields;
use relay_core::wire::json::{self, Object};
use relay_core::wire::route::Route;
use relay_core::wire::session_open::{DeviceRevocation, SessionOpen};
use relay_core::wire::signature::SignedObject;
use relay_core::Error;

/// What `verify` checks against.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// A file with the device certificate that signed a message_envelope or session_open.
    pub certificate: Option<String>,
    /// The network to check against (default: the object's own).
    pub network: Option<String>,
    /// Also check the certificate's validity at this time.
    pub at: Option<u64>,
}

/// The RFC 8785 form of strict I-JSON `input`.
pub fn canonicalize(input: &[u8]) -> Result<Vec<u8>, Error> {
    Ok(canonical::to_vec(&json::parse(input)?))
}

fn load_certificate(opts: &VerifyOptions, network: &str) -> Result<DeviceCertificate, Error> {
    let path = opts.certificate.as_deref().ok_or_else(|| {
        Error::new(
            relay_core::ErrorCode::InvalidParams,
            "this object is signed by a device key: pass --certificate FILE",
        )
    })?;
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(relay_core::ErrorCode::InvalidParams, format!("{path}: {e}")))?;
    let cert = DeviceCertificate::parse(json::parse_object(&bytes)?)
        .map_err(|e| e.within("certificate"))?;
    cert.verify(network)?;
    Ok(cert)
}

/// Runs every stateless check of the object's type; says who signed it.
pub fn check(object: Object, opts: &VerifyOptions) -> Result<String, Error> {
    let f = Fields::new(&object);
    let type_ = f.str("type")?.to_string();
    let network = match &opts.network {
        Some(n) => n.clone(),
        None => f.str("network")?.to_string(),
    };
    match type_.as_str() {
        "device_certificate" => {
            let c = DeviceCertificate::parse(object)?;
            c.verify(&network)?;
            if let Some(at) = opts.at {
                c.check_current(at, 0)?;
            }
            Ok(format!(
                "device_certificate for device {} signed by account {}",
                c.device_id, c.account
            ))
        }
        "message_envelope" => {
            let e = MessageEnvelope::parse(object)?;
            if e.network != network {
                return Err(Error::new(
                    relay_core::ErrorCode::InvalidParams,
                    "envelope is for another network",
                ));
            }
            let cert = load_certificate(opts, &network)?;
            e.verify_with(&cert)?;
            cert.check_valid_at(e.created_at, 0)?;
            Ok(format!(
                "message_envelope {} signed by device {} of account {}",
                e.message_id, e.from_device_id, e.from
            ))
        }
        "route" => {
            let r = Route::parse(object)?;
            r.verify(&network)?;
            Ok(format!(
                "route revision {} to {} signed by account {}",
                r.revision, r.relay, r.account
            ))
        }
        "contact_grant" => {
            let g = ContactGrant::parse(object)?;
            g.verify_signature(g.grantor.key())?;
            if let Some(r) = &g.route {
                r.verify(&network)?;
            }
            Ok(format!(
                "contact_grant {} signed by account {} for {}",
                g.grant_id, g.grantor, g.grantee
            ))
        }
        "contact_invite" => {
            let i = ContactInvite::parse(object)?;
            i.verify_signature(i.issuer.key())?;
            if let Some(r) = &i.route {
                r.verify(&network)?;
            }
            Ok(format!(
                "contact_invite {} signed by account {}",
                i.invite_id, i.issuer
            ))
        }
        "session_open" => {
            let s = SessionOpen::parse(object)?;
            let cert = load_certificate(opts, &network)?;
            if cert.device_id != s.device_id || cert.account != s.account {
                return Err(Error::new(
                    relay_core::ErrorCode::InvalidCertificate,
                    "certificate is not for this device",
                ));
            }
            s.verify_signature(&cert.device_key)?;
            Ok(format!("session_open signed by device {}", s.device_id))
        }
        "device_revocation" => {
            let r = DeviceRevocation::parse(object)?;
            r.verify_signature(r.account.key())?;
            Ok(format!(
                "device_revocation of {} signed by account {}",
                r.device_id, r.account
            ))
        }
        other => Err(Error::new(
            relay_core::ErrorCode::InvalidParams,
            format!("unknown object type {other:?}"),
        )),
    }
}
