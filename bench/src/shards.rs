//! Accounts sharded over cores (issue 20): the wasmtime host with `--shards N` (a core per
//! thread) and the edge host (a Durable Object per shard) at 1, 2 and 4 shards, in one run.
//!
//! Two workloads over HTTP at c=32, each from 64 accounts: `self` (every send a
//! self-delivery: the shard that accepts it ends it, no shard talks to another) and `mesh`
//! (every send to another account drawn at random: with k shards, (k - 1) / k of them go
//! between shards, accepted by one core and received by another). A row's rate is
//! message.send accepted per second; for `mesh` the note gives the deliveries' rate too,
//! up to the last one ended (the operator API's pending list, polled on every shard).

use crate::fixture;
use crate::hosts::Host;
use crate::loadgen;
use crate::report::Report;
use relay_host_wasmtime::admin_client;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accounts that send to each other in one workload.
const ACCOUNTS: usize = 64;
/// Sends of the unmeasured warm-up before the workloads.
const WARM_UP: usize = 500;
/// Clients at once.
const CONCURRENCY: usize = 32;
/// Shard counts measured.
pub const COUNTS: [u32; 3] = [1, 2, 4];

/// The setup name of a row.
pub fn setup(host: &str, shards: u32, workload: &str) -> String {
    let s = if shards == 1 { "shard" } else { "shards" };
    format!("{host} host, HTTP, {shards} {s}, {workload}")
}

/// Runs both hosts (unless skipped) at every count of [`COUNTS`].
pub async fn run(
    rep: &mut Report,
    root: &Path,
    exe: &Path,
    scratch: &Path,
    skip: &[String],
    sends: usize,
) -> anyhow::Result<()> {
    for host in ["wasmtime", "edge"] {
        if skip.iter().any(|s| s == host) {
            continue;
        }
        let mut base: Vec<(String, f64, f64)> = Vec::new();
        for shards in COUNTS {
            let dir = scratch.join(format!("shards-{host}-{shards}"));
            let h = match host {
                "wasmtime" => Host::wasmtime_sharded(exe, &dir, shards).await?,
                _ => Host::edge(root, &dir, shards).await?,
            };
            let measured = workloads(rep, &h, host, shards, sends).await;
            h.stop();
            for (workload, per_s, delivered) in measured? {
                match base.iter().find(|(w, _, _)| *w == workload) {
                    None => base.push((workload.clone(), per_s, delivered)),
                    Some((_, b, bd)) => {
                        let row = rep
                            .rows
                            .iter_mut()
                            .rev()
                            .find(|r| r.setup == setup(host, shards, &workload))
                            .expect("row");
                        row.note.push_str(&format!(
                            "{}x accepted/s, {}x delivered/s of 1 shard",
                            round2(per_s / b),
                            round2(delivered / bd)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Both workloads against one running host: (workload, accepted/s, delivered/s).
async fn workloads(
    rep: &mut Report,
    h: &Host,
    host: &str,
    shards: u32,
    sends: usize,
) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let http = Arc::new(admin_client());
    // Unmeasured first: every shard's core loaded, its JIT and caches warm.
    let warm = fixture::mesh(&h.url, ACCOUNTS, WARM_UP, false, 30);
    let tokens = Arc::new(loadgen::sessions(&warm, &h.url).await?);
    loadgen::level(&http, warm.sends.clone(), &tokens, &h.url, CONCURRENCY).await?;
    drained(h, shards).await?;
    let mut out = Vec::new();
    for (seed, workload, to_self) in [(31, "self", true), (32, "mesh", false)] {
        eprintln!("{}", setup(host, shards, workload));
        let fx = fixture::mesh(&h.url, ACCOUNTS, sends, to_self, seed);
        let tokens = Arc::new(loadgen::sessions(&fx, &h.url).await?);
        let started = Instant::now();
        let l = loadgen::level(&http, fx.sends.clone(), &tokens, &h.url, CONCURRENCY).await?;
        anyhow::ensure!(
            l.failed == 0,
            "{}: {} failed, first: {:?}",
            setup(host, shards, workload),
            l.failed,
            l.first_failure
        );
        drained(h, shards).await?;
        let delivered = sends as f64 / started.elapsed().as_secs_f64();
        let per_s = l.sample.per_s;
        rep.add(
            &setup(host, shards, workload),
            "sqlite",
            Some(CONCURRENCY),
            l.sample,
        );
        if let Some(row) = rep.rows.last_mut() {
            row.note = format!("delivered {delivered:.0}/s; ");
        }
        out.push((workload.to_string(), per_s, delivered));
    }
    Ok(out)
}

/// Waits until no shard of the relay has a delivery pending (at most two minutes).
async fn drained(h: &Host, shards: u32) -> anyhow::Result<()> {
    let admin = std::fs::read_to_string(h.dir().join("admin.url"))?;
    let token = std::fs::read_to_string(h.dir().join("admin.token"))?;
    let bearer = format!("Bearer {}", token.trim());
    let http = admin_client();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let mut pending = 0;
        for k in 0..shards {
            let url = format!("{}/admin/v1/deliveries?shard={k}", admin.trim());
            let (s, b) = http
                .post(
                    &url,
                    &[("authorization", bearer.as_str())],
                    br#"{"state":"pending"}"#.to_vec(),
                )
                .await?;
            anyhow::ensure!(s == 200, "{url}: {s} {}", String::from_utf8_lossy(&b));
            let v = relay_core::wire::json::parse(&b).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            pending += v
                .as_object()
                .and_then(|o| o.get("deliveries"))
                .and_then(|d| match d {
                    relay_core::wire::json::Value::Array(a) => Some(a.len()),
                    _ => None,
                })
                .unwrap_or(0);
        }
        if pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < until, "{pending} deliveries still pending");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
