//! How a relay is configured: the settings every host shares (relay-settings: flags, TOML
//! keys, defaults and checks, written once), and where this host finds the core component.

use std::path::PathBuf;

pub use relay_core::transport::limits::{Limits, LIMITS};
pub use relay_settings::{LogFormat, Settings};

/// The component to load: `--component`, else `RELAY_COMPONENT`, else beside the binary,
/// else `target/component/` of this checkout.
pub fn component_path(settings: &Settings) -> PathBuf {
    if let Some(p) = &settings.component {
        return p.clone();
    }
    if let Some(p) = &relay_settings::tuning().component {
        return p.clone();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("../component/relay_core.wasm")));
    match beside {
        Some(p) if p.exists() => p,
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/component/relay_core.wasm"
        )),
    }
}
