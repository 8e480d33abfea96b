//! Builders that clients and tests use: keys, signed objects, encryption.

pub mod draft;
pub mod keys;
pub mod seal;

pub use draft::Draft;
pub use keys::{random_id, AccountKey, DeviceKey, Signer};
