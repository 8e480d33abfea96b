//! `device_certificate`: an account's statement that a device key acts for it.

use super::crypto::Crypto;
use super::field::{FieldError, Fields};
use super::identity::{AccountId, DeviceId};
use super::json::Object;
use super::signature::{SignatureError, SignedObject};
use std::fmt;

/// Device permissions named in a certificate; unknown strings are ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    /// `"send"`: the device may call `message.send`.
    pub send: bool,
    /// `"sync"`: the device may call `message.timeline.sync`.
    pub sync: bool,
    /// `"manage"`: the device may manage the account (devices, contacts, settings).
    pub manage: bool,
}

/// A parsed `device_certificate`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCertificate {
    raw: Object,
    sig: [u8; 64],
    /// The network the certificate is valid on.
    pub network: String,
    /// The account whose key signs the certificate and for which the device acts.
    pub account: AccountId,
    /// The device's id; must be derived from `device_key` (identity binding).
    pub device_id: DeviceId,
    /// The device's Ed25519 public key, which signs its envelopes and session opens.
    pub device_key: [u8; 32],
    /// The device's X25519 public key, to which senders seal its key boxes.
    pub box_key: [u8; 32],
    /// What the device may do; unknown permission strings are dropped.
    pub permissions: Permissions,
    /// Issuance time, Unix ms; a later certificate replaces an earlier one of the device.
    pub issued_at: u64,
    /// End of validity, Unix ms (exclusive); absent means it never expires.
    pub expires_at: Option<u64>,
}

/// Why a certificate is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateError {
    /// Issued for another network.
    WrongNetwork,
    /// The account's signature does not verify.
    Signature(SignatureError),
    /// `device_id` is not derived from `device_key`.
    Binding,
    /// Past `expires_at`.
    Expired,
    /// `issued_at` beyond now + clock tolerance.
    IssuedInFuture,
    /// Not valid at the envelope's `created_at`.
    NotValidAtCreation,
    /// Not `expires_at > issued_at`.
    EmptyValidity,
}

impl fmt::Display for CertificateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertificateError::WrongNetwork => f.write_str("certificate is for another network"),
            CertificateError::Signature(e) => write!(f, "certificate signature: {e}"),
            CertificateError::Binding => {
                f.write_str("certificate device_id is not derived from its device_key")
            }
            CertificateError::Expired => f.write_str("certificate has expired"),
            CertificateError::IssuedInFuture => {
                f.write_str("certificate issued_at is beyond now plus clock tolerance")
            }
            CertificateError::NotValidAtCreation => {
                f.write_str("certificate was not valid at the envelope's created_at")
            }
            CertificateError::EmptyValidity => {
                f.write_str("certificate expires_at is not after issued_at")
            }
        }
    }
}

impl std::error::Error for CertificateError {}

impl From<CertificateError> for crate::Error {
    fn from(e: CertificateError) -> crate::Error {
        let code = match e {
            CertificateError::Signature(_) => crate::ErrorCode::InvalidSignature,
            _ => crate::ErrorCode::InvalidCertificate,
        };
        crate::Error::new(code, e.to_string())
    }
}

impl DeviceCertificate {
    /// Parses the object constraints (types, encodings); no signature check.
    pub fn parse(raw: Object) -> Result<DeviceCertificate, FieldError> {
        let f = Fields::new(&raw);
        f.embeddable()?;
        f.expect_type(Self::TYPE)?;
        let mut permissions = Permissions::default();
        for (i, p) in f.array("permissions")?.iter().enumerate() {
            match p.as_str() {
                Some("send") => permissions.send = true,
                Some("sync") => permissions.sync = true,
                Some("manage") => permissions.manage = true,
                Some(_) => {}
                None => {
                    return Err(FieldError::invalid(
                        format!("permissions[{i}]"),
                        "must be a string",
                    ))
                }
            }
        }
        let cert = DeviceCertificate {
            network: f.network()?,
            account: f.account("account")?,
            device_id: f.device_id("device_id")?,
            device_key: f.fixed::<32>("device_key")?,
            box_key: f.fixed::<32>("box_key")?,
            permissions,
            issued_at: f.int("issued_at")?,
            expires_at: f.opt_int("expires_at")?,
            sig: f.sig()?,
            raw,
        };
        Ok(cert)
    }

    /// Network, the account's signature, identity binding: checks valid anywhere, any time
    /// (by the core itself: clients and tests).
    pub fn verify(&self, network: &str) -> Result<(), CertificateError> {
        self.verify_in(network, &mut Crypto::new())
    }

    /// [`DeviceCertificate::verify`] with an engine's crypto.
    pub fn verify_in(&self, network: &str, crypto: &mut Crypto) -> Result<(), CertificateError> {
        self.check_unsigned(network)?;
        self.verify_signature_in(self.account.key(), crypto)
            .map_err(CertificateError::Signature)
    }

    /// [`DeviceCertificate::verify_in`] without the signature: for a certificate this relay
    /// verified already (a sibling shard's delivery of a message this relay accepted).
    pub fn check_unsigned(&self, network: &str) -> Result<(), CertificateError> {
        if self.network != network {
            return Err(CertificateError::WrongNetwork);
        }
        if self.expires_at.is_some_and(|e| e <= self.issued_at) {
            return Err(CertificateError::EmptyValidity);
        }
        if DeviceId::derive(&self.device_key) != self.device_id {
            return Err(CertificateError::Binding);
        }
        Ok(())
    }

    /// The home relay's time checks: not expired and not issued beyond now + tolerance.
    pub fn check_current(&self, now: u64, tolerance: u64) -> Result<(), CertificateError> {
        if self.issued_at > now.saturating_add(tolerance) {
            return Err(CertificateError::IssuedInFuture);
        }
        if self.expires_at.is_some_and(|e| now >= e) {
            return Err(CertificateError::Expired);
        }
        Ok(())
    }

    /// The destination's time check: `issued_at - tolerance <= created_at < expires_at`.
    pub fn check_valid_at(&self, created_at: u64, tolerance: u64) -> Result<(), CertificateError> {
        if self.issued_at.saturating_sub(tolerance) > created_at
            || self.expires_at.is_some_and(|e| created_at >= e)
        {
            return Err(CertificateError::NotValidAtCreation);
        }
        Ok(())
    }
}

impl SignedObject for DeviceCertificate {
    const TYPE: &'static str = "device_certificate";
    fn raw(&self) -> &Object {
        &self.raw
    }
    fn sig(&self) -> &[u8; 64] {
        &self.sig
    }
}
