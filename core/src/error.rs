//! Protocol error codes (protocol.md §5) and the one error type every operation returns.
//!
//! Each typed error of the core (`JsonError`, `FieldError`, `SignatureError`,
//! `CertificateError`, ...) is mapped to an [`ErrorCode`] exactly once, in its
//! `From` impl here or beside its definition, so codes cannot drift.

use crate::wire::json::Value;
use std::fmt;

/// A protocol error code, as written on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    /// `invalid_params` (400): malformed request, bad encoding, object constraints or wrong network.
    InvalidParams,
    /// `payload_too_large` (413): over the relay's size limits (request bytes, devices or device records per account).
    PayloadTooLarge,
    /// `unauthenticated` (401): no or expired session, a failed session open, or bad relay authentication.
    Unauthenticated,
    /// `permission_denied` (403): the device lacks the permission, or acts for another account.
    PermissionDenied,
    /// `invalid_signature` (400): an envelope, certificate or other object signature does not verify.
    InvalidSignature,
    /// `invalid_certificate` (400): a certificate's binding, validity window or network is wrong.
    InvalidCertificate,
    /// `clock_skew` (400): `created_at` or `ts` is beyond now + clock tolerance; sources retry it.
    ClockSkew,
    /// `message_expired` (410): beyond the delivery age limit, or the result's retention ended.
    MessageExpired,
    /// `authorization_invalid` (403): a bad, expired, revoked, used-up or mis-bound grant or invite.
    AuthorizationInvalid,
    /// `discovery_disabled` (403): no authorization and the recipient is not discoverable.
    DiscoveryDisabled,
    /// `device_unknown` (409): no recipient box names a valid device of the recipient.
    DeviceUnknown,
    /// `not_home_relay` (421): the account is not served here; `data.route` carries the highest route known.
    NotHomeRelay,
    /// `state_conflict` (409): same `(from, message_id)` with other content, or a conflicting route or certificate.
    StateConflict,
    /// `rate_limited` (429): a rate limit refused the call; `data.retry_after` (ms) says when to try again.
    RateLimited,
    /// `not_found` (404): unknown message, account, route, method or endpoint.
    NotFound,
    /// `unavailable` (503): temporarily unable (relay full, too many key fetches, a redirect); retry later.
    Unavailable,
    /// `internal` (500): a bug or storage fault; the operation was not committed.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of protocol.md §5.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InvalidParams,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::InvalidSignature,
        ErrorCode::InvalidCertificate,
        ErrorCode::ClockSkew,
        ErrorCode::MessageExpired,
        ErrorCode::AuthorizationInvalid,
        ErrorCode::DiscoveryDisabled,
        ErrorCode::DeviceUnknown,
        ErrorCode::NotHomeRelay,
        ErrorCode::StateConflict,
        ErrorCode::RateLimited,
        ErrorCode::NotFound,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The code's wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidParams => "invalid_params",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::InvalidSignature => "invalid_signature",
            ErrorCode::InvalidCertificate => "invalid_certificate",
            ErrorCode::ClockSkew => "clock_skew",
            ErrorCode::MessageExpired => "message_expired",
            ErrorCode::AuthorizationInvalid => "authorization_invalid",
            ErrorCode::DiscoveryDisabled => "discovery_disabled",
            ErrorCode::DeviceUnknown => "device_unknown",
            ErrorCode::NotHomeRelay => "not_home_relay",
            ErrorCode::StateConflict => "state_conflict",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses a wire spelling; unknown codes are `None` (a source treats them as unknown outcomes).
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status that carries this code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidParams => 400,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::InvalidSignature => 400,
            ErrorCode::InvalidCertificate => 400,
            ErrorCode::ClockSkew => 400,
            ErrorCode::MessageExpired => 410,
            ErrorCode::AuthorizationInvalid => 403,
            ErrorCode::DiscoveryDisabled => 403,
            ErrorCode::DeviceUnknown => 409,
            ErrorCode::NotHomeRelay => 421,
            ErrorCode::StateConflict => 409,
            ErrorCode::RateLimited => 429,
            ErrorCode::NotFound => 404,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A protocol error: `{code, message, data?}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    /// The machine-readable code, which decides the HTTP status and a source's reaction.
    pub code: ErrorCode,
    /// A human-readable explanation, saying what is wrong and where.
    pub message: String,
    /// Structured details when the code defines them (`route`, `retry_after`, `last_error`).
    pub data: Option<Value>,
}

impl Error {
    /// An error with a code and a human-readable message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Attaches `data` (for example `route` or `retry_after`).
    pub fn with_data(mut self, data: Value) -> Error {
        self.data = Some(data);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}
