//! relay-core: the relay protocol core, written once and run by every host.
//!
//! `wire` is the wire format (strict I-JSON, RFC 8785 canonical form,
//! objects and their signatures); `client` builds valid (or deliberately
//! defective) objects for clients and tests; `engine` is the protocol's rules;
//! `transport` is HTTP, WebSocket and relay RPC over the engine, sans-IO. The core performs no I/O and
//! reads no global clock or random source: time and entropy are inputs.

pub mod error;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

pub use error::{Error, ErrorCode};
pub mod engine;
pub mod transport;
