//! The floor: what any host must spend per message.send natively (parse, JCS, SHA-256, one verify).

use crate::fixture::Fixture;
use crate::report::Sample;
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::json::{self, Value};
use sha2::{Digest, Sha256};
use std::time::Instant;

/// The sender certificates of the fixture, parsed once (the floor assumes a cached certificate).
fn certificates(fx: &Fixture) -> anyhow::Result<Vec<DeviceCertificate>> {
    fx.accounts
        .iter()
        .map(|a| {
            let p = json::parse_object(&a.register)?;
            let c = match p.get("certificate") {
                Some(Value::Object(o)) => o.clone(),
                _ => anyhow::bail!("no certificate"),
            };
            Ok(DeviceCertificate::parse(c)?)
        })
        .collect()
}

/// Parse + canonicalize + SHA-256 + verify_strict of every send in `fx`.
pub fn run(fx: &Fixture) -> anyhow::Result<Sample> {
    let certs = certificates(fx)?;
    let mut lat = Vec::with_capacity(fx.sends.len());
    let started = Instant::now();
    for (s, params) in &fx.sends {
        let t = Instant::now();
        let p = json::parse_object(params)?;
        let hash = Sha256::digest(canonical::object_to_vec(&p));
        std::hint::black_box(hash);
        let env = match p.get("envelope") {
            Some(Value::Object(o)) => MessageEnvelope::parse(o.clone())?,
            _ => anyhow::bail!("no envelope"),
        };
        env.verify_with(&certs[*s])?;
        lat.push(t.elapsed());
    }
    Ok(Sample::new(
        "parse+JCS+SHA-256+verify",
        lat,
        started.elapsed(),
    ))
}
