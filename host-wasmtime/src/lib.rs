//! The wasmtime host: runs the relay core component and does the I/O it asks for.
//!
//! One thread owns the component instance and its storage; every call is a
//! job on that thread, so the core's operations are serialized exactly as
//! the engine expects. The async side (axum, tokio) moves bytes, keeps time,
//! runs timers and executes effects. No protocol logic lives here.

pub mod guest;
mod hub;
pub mod net;
pub mod ops;
mod outbound;
mod server;
pub mod settings;
pub mod store;
pub mod tls;

mod admin_client;
mod app;
mod process;
mod shard;
mod timer;

pub use admin_client::{admin_client, admin_client_trusting, AdminClient};
pub use app::{start, start_with, App, Running};
pub use outbound::Rules;
pub use process::load_or_create_secret;
pub use relay_core::transport::address::refused as refused_address;
pub use shard::{CoreHandle, ShardCore, Slot, MAX_GROUP};

use std::time::{SystemTime, UNIX_EPOCH};

/// Epoch ticks (10 ms each) a single call may run before it is interrupted.
pub const EPOCHS_PER_CALL: u64 = 1_000;

/// Milliseconds since the Unix epoch: the only clock, read by the host and passed in.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
