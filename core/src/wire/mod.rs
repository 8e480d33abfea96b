//! The wire format: strict JSON, canonical form, encodings, identities, objects, signatures.

pub mod authorization;
pub mod base64url;
pub mod canonical;
pub mod certificate;
pub mod crypto;
pub mod digest;
pub mod envelope;
pub mod field;
pub mod frame;
pub mod identity;
pub mod json;
pub mod key_box;
pub mod preverify;
pub mod relay_request;
pub mod route;
pub mod session_open;
pub mod signature;
pub mod verified;
