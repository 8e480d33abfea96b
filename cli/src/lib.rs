//! relayctl as a library: the profile, the HTTP/WebSocket transport, sending and the timeline.
//!
//! `main.rs` parses arguments into [`commands`]; integration tests in other
//! crates can use the same pieces (a [`client::Client`] over a profile file).

pub mod client;
pub mod commands;
pub mod directory;
pub mod error;
pub mod inspect;
pub mod outbox;
pub mod profile;
pub mod send;
pub mod timeline;
pub mod transport;

pub use client::{Client, RetryPolicy};
pub use error::{CliError, RelayError, TransportError};
pub use profile::{Profile, Store};
