//! `message_envelope`: the immutable, device-signed message.

use super::certificate::DeviceCertificate;
use super::crypto::Crypto;
use super::field::{FieldError, Fields};
use super::identity::{AccountId, DeviceId};
use super::json::Object;
use super::signature::{SignatureError, SignedObject};
use std::cell::{Cell, OnceCell};

/// A parsed `message_envelope`.
///
/// It is immutable once parsed, so what is derived from it is computed once
/// per instance: its canonical text, and the device key it verified under
/// (local delivery checks the envelope that `message.send` just checked).
#[derive(Clone, Debug)]
pub struct MessageEnvelope {
    raw: Object,
    sig: [u8; 64],
    text: OnceCell<String>,
    verified_under: Cell<Option<[u8; 32]>>,
    /// The network the message travels on.
    pub network: String,
    /// Base64url random id (16 to 32 bytes); with `from` it is the idempotency key.
    pub message_id: String,
    /// The sending account.
    pub from: AccountId,
    /// The sending device, whose key signs the envelope.
    pub from_device_id: DeviceId,
    /// The recipient account.
    pub to: AccountId,
    /// Creation time, Unix ms; bounds clock skew, the delivery age limit and the certificate check at the destination.
    pub created_at: u64,
    /// Unix ms after which sync hides the entry (the stored envelope is unchanged); absent means never.
    pub body_expires_at: Option<u64>,
}

/// Why an envelope does not match the certificate offered for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvelopeError {
    /// The certificate is not for `from` / `from_device_id`.
    CertificateMismatch,
    /// The device signature does not verify.
    Signature(SignatureError),
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::CertificateMismatch => f.write_str(
                "the device certificate does not match the envelope's from and from_device_id",
            ),
            EnvelopeError::Signature(e) => write!(f, "envelope signature: {e}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

impl From<EnvelopeError> for crate::Error {
    fn from(e: EnvelopeError) -> crate::Error {
        let code = match e {
            EnvelopeError::CertificateMismatch => crate::ErrorCode::InvalidCertificate,
            EnvelopeError::Signature(_) => crate::ErrorCode::InvalidSignature,
        };
        crate::Error::new(code, e.to_string())
    }
}

impl MessageEnvelope {
    /// Parses the object constraints; no signature check.
    pub fn parse(raw: Object) -> Result<MessageEnvelope, FieldError> {
        let f = Fields::new(&raw);
        f.embeddable()?;
        f.expect_type(Self::TYPE)?;
        f.object("body")?;
        Ok(MessageEnvelope {
            network: f.network()?,
            message_id: f.random_id("message_id")?,
            from: f.account("from")?,
            from_device_id: f.device_id("from_device_id")?,
            to: f.account("to")?,
            created_at: f.int("created_at")?,
            body_expires_at: f.opt_int("body_expires_at")?,
            sig: f.sig()?,
            raw,
            text: OnceCell::new(),
            verified_under: Cell::new(None),
        })
    }

    /// The canonical form as text, computed once.
    pub fn canonical_text(&self) -> &str {
        self.text
            .get_or_init(|| super::canonical::object_to_string(&self.raw))
    }

    /// Checks the certificate names this envelope's sender and verifies the device signature
    /// (by the core itself: clients and tests).
    pub fn verify_with(&self, cert: &DeviceCertificate) -> Result<(), EnvelopeError> {
        self.verify_with_in(cert, &mut Crypto::new())
    }

    /// Whether `cert` is the certificate of this envelope's sender device (the part of
    /// [`MessageEnvelope::verify_with`] that needs no signature).
    pub fn names_sender_of(&self, cert: &DeviceCertificate) -> Result<(), EnvelopeError> {
        if cert.account != self.from || cert.device_id != self.from_device_id {
            return Err(EnvelopeError::CertificateMismatch);
        }
        Ok(())
    }

    /// [`MessageEnvelope::verify_with`] with an engine's crypto.
    pub fn verify_with_in(
        &self,
        cert: &DeviceCertificate,
        crypto: &mut Crypto,
    ) -> Result<(), EnvelopeError> {
        self.names_sender_of(cert)?;
        if self.verified_under.get() == Some(cert.device_key) {
            return Ok(());
        }
        // Not through the memory of verified signatures: an envelope is
        // verified once per acceptance (a repeated delivery is answered from
        // its receipt first), so remembering it would only cost a hash.
        crypto
            .verify_fresh(&cert.device_key, &self.signing_input(), &self.sig)
            .map_err(EnvelopeError::Signature)?;
        self.verified_under.set(Some(cert.device_key));
        Ok(())
    }
}

impl PartialEq for MessageEnvelope {
    fn eq(&self, other: &MessageEnvelope) -> bool {
        // What was derived is not part of the value.
        self.raw == other.raw
    }
}

impl SignedObject for MessageEnvelope {
    const TYPE: &'static str = "message_envelope";
    fn raw(&self) -> &Object {
        &self.raw
    }
    fn sig(&self) -> &[u8; 64] {
        &self.sig
    }
    fn canonical_string(&self) -> String {
        self.canonical_text().to_string()
    }
}
